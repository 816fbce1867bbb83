"""The one contract every backend implements, and how a command finds a deployment's backend.

A backend runs a Plan somewhere (``local``: processes on this machine; ``kubernetes``: the
objects rendered from it, in a cluster) and meets the rest of servebook only through
``Backend``: ``up``, ``status``, ``down``, and ``open``, which yields a
``servebook.deployment.DeploymentView`` for the length of a command.  ``verify``,
``bench``, ``status`` and ``run`` take that view and never import a particular backend;
the command modules ask ``locate`` which backend holds a deployment instead of branching
on the backend's name.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

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


class Backend(Protocol):
    """A place deployments run.  Every method is bounded in time; a failure to reach the
    place is ``UsageError`` (exit 2) naming what failed."""

    name: str
    title: str  # "the local backend", "Kubernetes": for messages
    # Which recipes it runs, for a refusal of one it does not.
    recipes_hint: str
    # What bringing a deployment up again costs, for --help and --keep messages.
    up_cost: str

    def recorded(self) -> list[str]:
        """Names of the deployments this machine has a record of on this backend."""
        ...

    def has(self, name: str) -> bool: ...

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

    # ``namespace`` below scopes where a backend looks for a deployment that this machine
    # may have no record of (a cluster's namespace); a backend without such a scope refuses
    # one as unusable input.

    def found(self, namespace: str | None = None) -> list[Found]:
        """The deployments the place itself has (a cluster: by label), whoever made them."""
        ...

    def status(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        """``{"name", "backend", "recipe", "entry", "roles": [{"name", "kind", "state",
        "ok", "summary", ...backend details}]}``; a role is ``ok`` when it can serve."""
        ...

    def down(self, name: str, namespace: str | None = None) -> Down: ...

    def open(
        self, name: str, namespace: str | None = None
    ) -> AbstractContextManager[DeploymentView]:
        """The deployment as a command reaches it, for the body of a with-block (on
        Kubernetes the port-forwards live exactly that long).  Unusable (exit 2) when the
        deployment is not up."""
        ...


def _registry() -> dict[str, Backend]:
    from servebook.backends.attached import AttachedBackend
    from servebook.backends.kubernetes import KubernetesBackend
    from servebook.backends.local import LocalBackend

    return {
        "local": LocalBackend(),
        "kubernetes": KubernetesBackend(),
        "attached": AttachedBackend(),
    }


# The places `up --backend` brings a deployment up on.  ``find`` and ``locate`` also find
# the deployments recorded by ``servebook attach`` (``backends.attached``): servebook did not
# make those, so they are no choice of ``--backend``.
NAMES = ("local", "kubernetes")


def every() -> list[Backend]:
    """Every backend, in NAMES order."""
    backends = _registry()
    return [backends[n] for n in NAMES]


def get(name: str) -> Backend:
    if name not in NAMES:
        raise UsageError(f"--backend {name}: choose one of {', '.join(NAMES)}.")
    return _registry()[name]


def find(name: str | None) -> tuple[Backend, str] | None:
    """(backend, deployment name) of the named deployment, or of the only deployment
    recorded on any backend when no name is given; None when there is none.  Several
    deployments and no name is unusable input (exit 2) listing them."""
    backends = _registry()
    if name:
        for b in backends.values():
            if b.has(name):
                return b, name
        return None
    everything = sorted((n, b.name) for b in backends.values() for n in b.recorded())
    if len(everything) > 1:
        raise UsageError(
            "several deployments are recorded: "
            + ", ".join(f"{n} ({b})" for n, b in everything)
            + ".",
            hint=f"Name one, e.g. `servebook status {everything[0][0]}`.",
        )
    if not everything:
        return None
    only, where = everything[0]
    return backends[where], only


def locate(
    name: str | None,
    hint: str = "Start one with `servebook up RECIPE`.",
    *,
    backend: str | None = None,
) -> tuple[Backend, str]:
    """``find``, or unusable input (exit 2) naming what is missing.  With ``backend``
    named, the deployment is that backend's to find (with no record on this machine: a
    cluster's deployment brought up elsewhere)."""
    if backend is not None:
        chosen = get(backend)
        if name:
            return chosen, name
        names = chosen.recorded()
        if len(names) != 1:
            raise UsageError(
                f"name the deployment: {len(names)} are recorded here on {chosen.name}.",
                hint=f"`servebook status --backend {chosen.name}` lists what it has.",
            )
        return chosen, names[0]
    found = find(name)
    if found is None:
        what = f"named {name!r} " if name else ""
        raise UsageError(f"no deployment {what}is up.", hint=hint)
    return found


__all__ = [
    "NAMES",
    "Backend",
    "Down",
    "Found",
    "Ready",
    "Say",
    "UpFailed",
    "every",
    "find",
    "get",
    "locate",
]
