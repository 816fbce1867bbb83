"""Which place holds a deployment, and the places ``up --backend`` can deploy to.

Nothing registers itself by being imported: this module names every place and imports
each one's module only when it is asked for, so a command that needs none of them (lint,
render, report) imports none, and no import order decides what exists.
"""

from __future__ import annotations

from collections.abc import Callable

from servebook.backends.base import Deployer, Place
from servebook.errors import UsageError


def _local() -> Place:
    from servebook.backends.local.deployer import LocalBackend

    return LocalBackend()


def _kubernetes() -> Place:
    from servebook.backends.kubernetes.deployer import KubernetesBackend

    return KubernetesBackend()


def _attached() -> Place:
    from servebook.backends.attached.place import AttachedBackend

    return AttachedBackend()


# Every place, by name.  ``find`` and ``locate`` also find the deployments recorded by
# ``servebook attach`` (``backends.attached``): servebook did not make those, so they are
# no choice of ``--backend``.
_PLACES: dict[str, Callable[[], Place]] = {
    "local": _local,
    "kubernetes": _kubernetes,
    "attached": _attached,
}
# The places `up --backend` brings a deployment up on.
NAMES = ("local", "kubernetes")


def every() -> list[Deployer]:
    """Every Deployer, in NAMES order."""
    return [get(n) for n in NAMES]


def get(name: str) -> Deployer:
    if name not in NAMES:
        raise UsageError(f"--backend {name}: choose one of {', '.join(NAMES)}.")
    place = _PLACES[name]()
    assert isinstance(place, Deployer)
    return place


def places() -> list[Place]:
    return [make() for make in _PLACES.values()]


def deployer(place: Place, name: str, verb: str) -> Deployer:
    """``place`` as a Deployer, to ``verb`` (start, stop) deployment ``name``; a place
    that is not one refuses (exit 2) saying servebook did not make it."""
    if isinstance(place, Deployer):
        return place
    raise UsageError(
        f"{name} is {place.title}: servebook did not make it and never {verb}s it.",
        hint=f"`servebook detach {name}` forgets it (and touches nothing on it).",
    )


def find(name: str | None) -> tuple[Place, str] | None:
    """(place, deployment name) of the named deployment, or of the only deployment
    recorded in any place when no name is given; None when there is none.  Several
    deployments and no name is unusable input (exit 2) listing them."""
    every_place = places()
    if name:
        for p in every_place:
            if p.has(name):
                return p, name
        return None
    by_name = {p.name: p for p in every_place}
    everything = sorted((n, p.name) for p in every_place for n in p.recorded())
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
    return by_name[where], only


def locate(
    name: str | None,
    hint: str = "Start one with `servebook up RECIPE`.",
    *,
    backend: str | None = None,
) -> tuple[Place, str]:
    """``find``, or unusable input (exit 2) naming what is missing.  With ``backend``
    named, the deployment is that place's to find (with no record on this machine: a
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


__all__ = ["NAMES", "deployer", "every", "find", "get", "locate", "places"]
