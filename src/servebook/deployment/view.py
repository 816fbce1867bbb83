"""The deployment view: what verify, bench, status and run see of a running deployment,
whichever backend runs it.

A backend (``servebook.backends``) opens a view for the length of a command
(``Backend.open``).  The view names every role with its kind, a base URL reachable from
this machine for its API and one for its ``/metrics`` (on the local backend the processes'
own ports; on Kubernetes the port-forwards servebook holds while the view is open), the
command line and environment as applied, a liveness check, a one-line description of its
state for messages, and its log when the backend can read it.

This module is data and small pure helpers only: it imports no backend, so ``verify`` and
``bench`` can take a view without knowing where the deployment runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from servebook.recipe.plan import Plan, engines_of, role_named
from servebook.verify.smoke import Claims, Target


def _unknown() -> bool | None:
    return None


def _nothing() -> str:
    return ""


@dataclass
class RoleView:
    """One role as a command reaches it from this machine."""

    name: str
    kind: str  # engine | router
    api_url: str  # base URL of its HTTP API (no trailing slash, no /v1)
    metrics_url: str  # base URL whose /metrics holds its counters
    argv: list[str] = field(default_factory=list)  # as applied
    env: dict[str, str] = field(default_factory=dict)  # as applied
    alive: Callable[[], bool | None] = _unknown  # None: the backend cannot tell
    describe: Callable[[], str] = _nothing  # "pid 123 running", "Pod x Ready on node y"
    log: Callable[[], str] | None = None  # its log, when the backend can read it
    # The other replicas' /metrics when the role runs several Pods behind one Service:
    # its counters are the sum over metrics_url and these (the router spreads requests).
    replica_metrics_urls: tuple[str, ...] = ()
    # Each replica's name (a Pod's, a URL), in the order of all_metrics_urls, and its
    # command line as applied where replicas may differ; empty: named by index, and each
    # runs ``argv``.  Verify and bench judge every replica on its own under these names.
    replica_names: tuple[str, ...] = ()
    replica_argv: tuple[tuple[str, ...], ...] = ()

    @property
    def all_metrics_urls(self) -> tuple[str, ...]:
        return (self.metrics_url, *self.replica_metrics_urls)

    @property
    def all_replica_names(self) -> tuple[str, ...]:
        """A name for each of ``all_metrics_urls``: given, else ``ROLE[i]`` (one replica:
        the role's own name)."""
        urls = self.all_metrics_urls
        if len(self.replica_names) == len(urls):
            return self.replica_names
        return (
            (self.name,) if len(urls) == 1 else tuple(f"{self.name}[{i}]" for i in range(len(urls)))
        )


@dataclass
class DeploymentView:
    """A deployment as one command sees it (``Backend.open`` yields it)."""

    name: str
    backend: str
    recipe: str
    plan: Plan
    served_model_name: str
    entry_url: str
    roles: list[RoleView]
    # A directory on this machine holding the model's tokenizer, or None when the weights
    # live elsewhere (a cluster's nodes): bench then tokenizes through the server.
    local_model_dir: str | None = None
    # Accelerators the deployment uses (per-accelerator figures); None when unknown.
    accelerators: int | None = None
    # What the deployment claims when no recipe says it (an attached deployment: read from
    # its engines' own command lines, ``backends.attached``); None: from the Plan.
    claimed: Claims | None = None

    def role(self, name: str) -> RoleView:
        return role_named(self.roles, name)

    @property
    def engines(self) -> list[RoleView]:
        return engines_of(self.roles)

    def dead_roles(self) -> list[str]:
        """Roles the backend knows are not running (not those it cannot tell about)."""
        return [r.name for r in self.roles if r.alive() is False]

    def claims(self) -> Claims:
        """What the deployment claims: from its recipe's Plan, not from how it runs (an
        attached deployment has no recipe: what its engines' command lines say)."""
        if self.claimed is not None:
            return self.claimed
        return Claims(
            topology=self.plan.topology,
            speculative=self.plan.speculative is not None,
            served_model_name=self.served_model_name,
            entry_url=self.entry_url,
            fabric=self.plan.params.get("fabric"),
        )

    def targets(self) -> list[Target]:
        """The roles as verify's targets."""
        return [
            Target(
                name=r.name,
                kind=r.kind,
                url=r.api_url,
                metrics_url=r.metrics_url,
                replica_metrics_urls=r.replica_metrics_urls,
                replica_names=r.all_replica_names,
                replica_argv=r.replica_argv,
                argv=list(r.argv),
                alive=r.alive,
                log=r.log,
                describe=r.describe,
            )
            for r in self.roles
        ]


__all__ = ["DeploymentView", "RoleView"]
