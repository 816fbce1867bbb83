"""The contracts every backend implements: ``Place`` and ``Deployer``.

A ``Place`` is where deployments live and how they are reached: ``recorded``, ``has``,
``found``, ``status``, ``open`` (which yields a ``servebook.deployment.DeploymentView``
for the length of a command) and ``load_site`` (where bench's load runs,
``deployment.site``).  A ``Deployer`` is a Place that can also ``preflight``, ``up`` and
``down`` from a Plan: ``local`` (processes on this machine) and ``kubernetes`` (the objects
rendered from it, in a cluster).  ``attached`` is a Place only: servebook never starts or
stops what it did not make.  ``verify``, ``bench``, ``status`` and ``run`` take the view and
the site and never import a particular backend; ``backends.registry`` says which place
holds a deployment, so no command branches on a backend's name.

This module imports no implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from servebook.deployment.site import LoadSite
from servebook.deployment.view import DeploymentView
from servebook.errors import ServebookError, UsageError
from servebook.findings import Finding
from servebook.recipe.plan import Plan

Say = Callable[[str], None]


class UpFailed(ServebookError):
    """The deployment did not become ready (exit 1): the message carries the evidence, a
    role's last log lines or the cluster's own words.  ``role`` names the role that failed
    first, where one did; ``log_tail`` is its log's end (the local backend reads it to tell
    a lost port from a real failure)."""

    exit_code = 1
    label = "up failed"

    def __init__(
        self,
        message: str,
        role: str | None = None,
        log_tail: str = "",
        *,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.role = role
        self.log_tail = log_tail


@dataclass
class Ready:
    """What ``up`` hands back: the deployment's name and one line on where it is."""

    name: str
    where: str  # "ready at http://127.0.0.1:8000 (model 'tiny'); state in ..."


@dataclass
class Down:
    """What ``down`` did, per role or object; ``complete`` is False when something is left
    running (the record is then kept for another try)."""

    name: str | None
    done: dict[str, str] = field(default_factory=dict)
    complete: bool = True


@dataclass(frozen=True)
class Found:
    """A deployment as its place lists it (``Backend.found``)."""

    name: str
    namespace: str  # "" where the place has no namespaces
    recipe: str
    roles: tuple[str, ...]


@runtime_checkable
class Place(Protocol):
    """Where deployments live and how they are reached.  Every method is bounded in time; a
    failure to reach the place is ``UsageError`` (exit 2) naming what failed."""

    name: str
    title: str  # "the local backend", "Kubernetes", "an attached deployment": for messages

    def recorded(self) -> list[str]:
        """Names of the deployments this machine has a record of in this place."""
        ...

    def has(self, name: str) -> bool: ...

    # ``namespace`` below scopes where a place looks for a deployment that this machine
    # may have no record of (a cluster's namespace); a place without such a scope refuses
    # one as unusable input.

    def found(self, namespace: str | None = None) -> list[Found]:
        """The deployments the place itself has (a cluster: by label), whoever made them."""
        ...

    def status(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        """``{"name", "backend", "recipe", "entry", "roles": [{"name", "kind", "state",
        "ok", "summary", ...details}]}``; a role is ``ok`` when it can serve."""
        ...

    def open(
        self, name: str, namespace: str | None = None
    ) -> AbstractContextManager[DeploymentView]:
        """The deployment as a command reaches it, for the body of a with-block (on
        Kubernetes the port-forwards live exactly that long).  Unusable (exit 2) when the
        deployment is not up."""
        ...

    def load_site(self, name: str, namespace: str | None = None) -> LoadSite:
        """Where bench's load runs by default for this deployment (``deployment.site``):
        nothing is reached until the site is used."""
        ...


@runtime_checkable
class Deployer(Place, Protocol):
    """A Place that also brings deployments up from a Plan and takes them down."""

    # Which recipes it runs, for a refusal of one it does not.
    recipes_hint: str
    # What bringing a deployment up again costs, for --help and --keep messages.
    up_cost: str
    # Whether its deployments' load runs in this process by default (False: at a site
    # beside them, which refuses what only this machine has, such as a dataset file).
    loads_here: bool

    def preflight(self, plan: Plan) -> list[Finding]:
        """Checks worth their time before ``up`` (a cluster's; none for processes)."""
        ...

    def up(
        self,
        plan: Plan,
        *,
        name: str,
        timeout_s: float | None,
        say: Say,
        port: int | None = None,
    ) -> Ready: ...

    def down(self, name: str, namespace: str | None = None) -> Down: ...


__all__ = [
    "Deployer",
    "Down",
    "Found",
    "Place",
    "Ready",
    "Say",
    "UpFailed",
]


def refuse_unfit(plan: Plan, backend: Deployer) -> None:
    """Refuses (exit 2, nothing started) a Plan ``backend`` cannot bring up: its recipe is
    for another backend, or a parameter that backend needs is unset."""
    if backend.name not in plan.backends:
        raise UsageError(
            f"recipe {plan.recipe} is for {', '.join(plan.backends)}, not {backend.title}.",
            hint=backend.recipes_hint,
        )
    plan.refuse_unset_on(backend.name)
