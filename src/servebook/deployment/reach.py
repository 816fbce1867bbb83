"""How a deployment is reached, and the one function that makes its view.

A place knows two things about a deployment, and keeps them apart:

* its ``Record``: the roles, each role's replicas in order (named by the place: a Pod's
  name, a URL; or left to the naming rule), the command line and environment each
  replica runs, the plan, the served model, which role requests enter by;
* its ``Reach`` for this process: where this process addresses each replica's API and
  ``/metrics`` (a process's own port, a port-forward servebook holds, a Pod's address from
  inside the cluster), how it tells whether a replica is alive and what state it is in,
  and the route that is (``view.ROUTES``).

``build(record, reach)`` is the only code that turns the two into a ``DeploymentView``:
every place (local processes, Kubernetes through forwards or from inside the cluster, an
attached deployment by URL or on Kubernetes) calls it, so a view has one shape and its
replicas one naming rule by every road.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from servebook.deployment.view import Claims, DeploymentView, RoleView
from servebook.errors import UsageError
from servebook.recipe.plan import Plan, role_named


def _unknown() -> bool | None:
    return None


def _nothing() -> str:
    return ""


@dataclass(frozen=True)
class ReplicaRecord:
    """One replica as its place records it: its name ("" where the place has none: the
    naming rule names it), its command line and environment as applied."""

    name: str = ""
    argv: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    image: str = ""  # the container image it runs, where it runs one ("": a process)


@dataclass(frozen=True)
class RoleRecord:
    name: str
    kind: str  # engine | router
    replicas: Sequence[ReplicaRecord]


@dataclass(frozen=True)
class Record:
    """What a place knows of a deployment, wherever it is reached from."""

    name: str
    backend: str  # the place's words for where it runs (messages, provenance)
    recipe: str
    plan: Plan
    served_model_name: str
    roles: Sequence[RoleRecord]
    # The role requests enter by; None: the entry is the reach's ``entry_url``, and when
    # that is no role's own server it is the deployment's router (an attached deployment).
    entry_role: str | None = None
    local_model_dir: str | None = None
    accelerators: int | None = None
    # What the deployment claims where no recipe says it (its entry URL is the view's).
    claimed: Claims | None = None


@dataclass(frozen=True)
class Address:
    """Where this process reaches one replica (or one role), and what it can tell of it."""

    api_url: str
    metrics_url: str = ""  # "": the API's
    alive: Callable[[], bool | None] = _unknown  # None: cannot tell
    describe: Callable[[], str] = _nothing
    log: Callable[[], str] | None = None

    @property
    def counters_url(self) -> str:
        return (self.metrics_url or self.api_url).rstrip("/")


@dataclass(frozen=True)
class Reach:
    """How this process reaches a deployment: each role's replicas in the record's order,
    and the route that is.  ``roles`` holds a role's own liveness, description and log
    where the place tells them per role (a forward per role, a process); elsewhere they
    are the replicas' together.  ``entry_url``: where requests enter (None: the entry
    role's first replica); ``router``: the entry's own server where the record names no
    entry role and it is no role's (None: ``entry_url``)."""

    route: str  # view.ROUTES
    replicas: Mapping[str, Sequence[Address]]
    roles: Mapping[str, Address] = field(default_factory=dict)
    entry_url: str | None = None
    router: Address | None = None
    detail: str | None = None  # how the route goes, for provenance (not direct)


def _together(role: RoleRecord, addresses: Sequence[Address]) -> Address:
    """A role's liveness and description from its replicas': dead when one is, alive when
    all are; each replica's description under its name."""
    pairs = list(zip(role.replicas, addresses, strict=True))

    def alive() -> bool | None:
        states = [a.alive() for a in addresses]
        return False if False in states else (True if all(states) else None)

    def describe() -> str:
        return "; ".join(f"{r.name}: {a.describe() or 'no more known'}" for r, a in pairs)

    return Address(addresses[0].api_url, alive=alive, describe=describe)


def role_view(deployment: str, role: RoleRecord, reach: Reach) -> RoleView:
    addresses = list(reach.replicas.get(role.name) or ())
    if not role.replicas or len(addresses) != len(role.replicas):
        raise UsageError(f"deployment {deployment}: role {role.name} has no replica reached.")
    first, a0 = role.replicas[0], addresses[0]
    state = reach.roles.get(role.name) or _together(role, addresses)
    several = len(role.replicas) > 1
    names = [r.name for r in role.replicas]
    return RoleView(
        name=role.name,
        kind=role.kind,
        api_url=a0.api_url.rstrip("/"),
        metrics_url=a0.counters_url,
        argv=list(first.argv),
        env=dict(first.env),
        image=first.image,
        alive=state.alive,
        describe=state.describe,
        log=state.log,
        replica_metrics_urls=tuple(a.counters_url for a in addresses[1:]),
        replica_names=tuple(names) if several and all(names) else (),
        replica_argv=tuple(tuple(r.argv) for r in role.replicas) if several else (),
    )


def build(record: Record, reach: Reach) -> DeploymentView:
    """THE view builder (module docstring)."""
    roles = [role_view(record.name, r, reach) for r in record.roles]
    if record.entry_role is not None:
        entry = reach.entry_url or role_named(roles, record.entry_role).api_url
    elif reach.entry_url is None:
        raise UsageError(f"deployment {record.name}: no entry to send requests to.")
    else:
        entry = reach.entry_url
        router = reach.router or Address(entry)
        if router.api_url.rstrip("/") not in {r.api_url for r in roles}:
            url = router.api_url.rstrip("/")
            roles.append(RoleView("router", "router", url, router.counters_url))
    entry = entry.rstrip("/")
    return DeploymentView(
        name=record.name,
        backend=record.backend,
        recipe=record.recipe,
        plan=record.plan,
        served_model_name=record.served_model_name,
        entry_url=entry,
        roles=roles,
        local_model_dir=record.local_model_dir,
        accelerators=record.accelerators,
        claimed=None if record.claimed is None else replace(record.claimed, entry_url=entry),
        route=reach.route,
        route_detail=reach.detail,
    )


# The forwarded route's words in provenance (servebook's own forwards, and an attached
# deployment's on Kubernetes).
FORWARDED = "each role's Pod through a port-forward servebook opened via the API server"
# The in-cluster route's words in a view (the results' provenance says the Job's own).
IN_CLUSTER = "from the load Job's Pods to the entry Service's cluster address"

__all__ = [
    "FORWARDED",
    "IN_CLUSTER",
    "Address",
    "Reach",
    "Record",
    "ReplicaRecord",
    "RoleRecord",
    "build",
]
