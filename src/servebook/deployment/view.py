"""The deployment view: what verify, bench, status and run see of a running deployment,
whichever place runs it.

A place (``servebook.backends``) opens a view for the length of a command
(``Place.open``), made by the one builder ``deployment.reach.build``.  The view names
every role with its kind, a base URL this process reaches its API at and one for its
``/metrics`` (on the local backend the processes' own ports; on Kubernetes the
port-forwards servebook holds while the view is open, or the Pods' addresses from inside
the cluster), each replica of the role, the command line and environment as applied, a
liveness check, a one-line description of its state for messages, and its log when the
place can read it; the route this process takes to the servers; and what the deployment
claims (``Claims``).

It serialises (``to_doc``/``from_doc``) for a load agent that runs elsewhere (the
in-cluster load Job): everything but the callables, which are this process's own.

This module is data and small pure helpers only: it imports no backend, so ``verify`` and
``bench`` take a view without knowing where the deployment runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servebook.recipe.plan import Plan, engines_of, role_named

# How this process reaches the servers: their own addresses, through port-forwards
# servebook holds via the API server, or from inside the cluster by its Service and Pod
# addresses.  Recorded with every result as the load's route.
ROUTES = ("direct", "port-forward", "cluster-service")


def replica_names(role: str, given: Sequence[str], n: int) -> tuple[str, ...]:
    """THE replica-naming rule: a role of one replica is named by the role; replicas of a
    role of several by the names their place gives (a Pod's, a URL), else ``ROLE[i]``."""
    if n == 1:
        return (role,)
    if len(given) == n:
        return tuple(given)
    return tuple(f"{role}[{i}]" for i in range(n))


def replica_subject(role: str, name: str) -> str:
    """What a finding about one replica is about: its name where that already says the role
    (``decode``, ``decode[1]``), else ``ROLE NAME`` (``decode pod-a``)."""
    return name if name == role or name.startswith(f"{role}[") else f"{role} {name}"


@dataclass
class Claims:
    """What the deployment claims, from its recipe (not from how it was started)."""

    topology: str  # mixed | pd
    speculative: bool
    served_model_name: str
    entry_url: str
    fabric: str | None = None  # the KV transport fabric the recipe states (PD on a cluster)
    # Replicas whose own command line could not be read (an attached deployment on another
    # machine or of another user): "ROLE REPLICA" -> why.  Their claims are not determined.
    argv_unread: Mapping[str, str] = field(default_factory=dict)


def _unknown() -> bool | None:
    return None


def _nothing() -> str:
    return ""


@dataclass(frozen=True)
class Replica:
    """One replica of a role: its name (``replica_names``), what a finding about it is
    about, where its counters are, and its command line as applied."""

    name: str
    subject: str
    metrics_url: str
    argv: tuple[str, ...]


@dataclass
class RoleView:
    """One role as a command reaches it from this process."""

    name: str
    kind: str  # engine | router
    api_url: str  # base URL of its HTTP API (no trailing slash, no /v1)
    metrics_url: str = ""  # base URL whose /metrics holds its counters ("": api_url's)
    argv: Sequence[str] = field(default_factory=list)  # as applied
    env: dict[str, str] = field(default_factory=dict)  # as applied
    image: str = ""  # the container image as applied ("": a process of this machine)
    alive: Callable[[], bool | None] = _unknown  # None: the place cannot tell
    describe: Callable[[], str] = _nothing  # "pid 123 running", "Pod x Ready on node y"
    log: Callable[[], str] | None = None  # its log, when the place can read it
    # The other replicas' /metrics when the role runs several Pods behind one Service:
    # its counters are the sum over metrics_url and these (the router spreads requests).
    replica_metrics_urls: Sequence[str] = ()
    # Each replica's name (a Pod's, a URL), in the order of all_metrics_urls, and its
    # command line as applied where replicas may differ; empty: named by the rule
    # (``replica_names``), and each runs ``argv``.
    replica_names: Sequence[str] = ()
    replica_argv: Sequence[Sequence[str]] = ()

    @property
    def counters_url(self) -> str:
        return self.metrics_url or self.api_url

    @property
    def all_metrics_urls(self) -> tuple[str, ...]:
        """Every replica's /metrics base URL, in the order their counters are tagged."""
        return (self.counters_url, *self.replica_metrics_urls)

    @property
    def all_replica_names(self) -> tuple[str, ...]:
        """A name for each of ``all_metrics_urls`` (``replica_names``, the one rule)."""
        return replica_names(self.name, self.replica_names, len(self.all_metrics_urls))

    def replicas(self) -> list[Replica]:
        names = self.all_replica_names
        argv = list(self.replica_argv) if len(self.replica_argv) == len(names) else []
        return [
            Replica(n, replica_subject(self.name, n), url, tuple(argv[i] if argv else self.argv))
            for i, (n, url) in enumerate(zip(names, self.all_metrics_urls, strict=True))
        ]

    def replica_commands(self) -> list[tuple[str, Sequence[str]]]:
        """``(subject, argv)`` per replica (``replica_subject``)."""
        return [(r.subject, r.argv) for r in self.replicas()]

    def to_doc(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "api_url": self.api_url,
            "metrics_url": self.metrics_url,
            "argv": list(self.argv),
            "env": dict(self.env),
            "image": self.image,
            "replica_metrics_urls": list(self.replica_metrics_urls),
            "replica_names": list(self.replica_names),
            "replica_argv": [list(a) for a in self.replica_argv],
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], address: Callable[[str], str]) -> RoleView:
        return cls(
            name=doc["name"],
            kind=doc["kind"],
            api_url=address(doc["api_url"]),
            metrics_url=address(doc["metrics_url"]) if doc.get("metrics_url") else "",
            argv=list(doc.get("argv") or ()),
            env=dict(doc.get("env") or {}),
            image=str(doc.get("image") or ""),
            replica_metrics_urls=tuple(address(u) for u in doc.get("replica_metrics_urls") or ()),
            replica_names=tuple(doc.get("replica_names") or ()),
            replica_argv=tuple(tuple(a) for a in doc.get("replica_argv") or ()),
        )


def _same(url: str) -> str:
    return url


@dataclass
class DeploymentView:
    """A deployment as one command sees it (``Place.open`` yields it)."""

    name: str
    backend: str  # the place's words for where it runs, for messages and provenance
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
    # its engines' own command lines, ``backends.attached.record``); None: from the Plan.
    claimed: Claims | None = None
    # The route this process takes to the servers (``ROUTES``) and, where it is not
    # direct, how, for the results' provenance.
    route: str = "direct"
    route_detail: str | None = None

    def role(self, name: str) -> RoleView:
        return role_named(self.roles, name)

    @property
    def engines(self) -> list[RoleView]:
        return engines_of(self.roles)

    def dead_roles(self) -> list[str]:
        """Roles the place knows are not running (not those it cannot tell about)."""
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

    def to_doc(self) -> dict[str, Any]:
        """The view as JSON-able data, for a process that reaches the deployment from
        elsewhere (``from_doc``); liveness, descriptions and logs stay this process's."""
        c = self.claimed
        return {
            "name": self.name,
            "backend": self.backend,
            "recipe": self.recipe,
            "plan": self.plan.model_dump(mode="json"),
            "served_model_name": self.served_model_name,
            "entry_url": self.entry_url,
            "roles": [r.to_doc() for r in self.roles],
            "local_model_dir": self.local_model_dir,
            "accelerators": self.accelerators,
            "claimed": None if c is None else {**vars(c), "argv_unread": dict(c.argv_unread)},
            "route": self.route,
            "route_detail": self.route_detail,
        }

    @classmethod
    def from_doc(
        cls, doc: Mapping[str, Any], address: Callable[[str], str] = _same
    ) -> DeploymentView:
        """The view ``to_doc`` wrote, each URL passed through ``address`` (where the reader
        dials it: ``bench.in_cluster``'s ``Net.url``)."""
        claimed = doc.get("claimed")
        return cls(
            name=doc["name"],
            backend=doc["backend"],
            recipe=doc["recipe"],
            plan=Plan.model_validate(doc["plan"]),
            served_model_name=doc["served_model_name"],
            entry_url=address(doc["entry_url"]),
            roles=[RoleView.from_doc(r, address) for r in doc["roles"]],
            local_model_dir=doc.get("local_model_dir"),
            accelerators=doc.get("accelerators"),
            claimed=None
            if claimed is None
            else Claims(**{**claimed, "entry_url": address(claimed["entry_url"])}),
            route=doc.get("route") or "direct",
            route_detail=doc.get("route_detail"),
        )


__all__ = [
    "ROUTES",
    "Claims",
    "DeploymentView",
    "Replica",
    "RoleView",
    "replica_names",
    "replica_subject",
]
