"""The state store: each deployment's record on this machine.

A deployment has a directory of its own under ``$SERVEBOOK_HOME/deployments/NAME``: the
local backend keeps its processes' record there (``state.json``: PIDs with their kernel
start times, ports, logs), the Kubernetes backend the objects it applied
(``kube-state.json``, ``backends.kubernetes.deployer``).  A record is written atomically as
soon as there is something to stop, so ``down`` works from another shell and after an
interrupted ``up``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from servebook import names
from servebook.errors import UsageError
from servebook.files import exclusive, read_model, write_record
from servebook.recipe.plan import role_named
from servebook.recipe.resolve import servebook_home

STATE_FILE = "state.json"
# Held (flock) by the one `up` or `run` bringing a deployment up; it holds that one's pid.
UP_LOCK = "up.lock"
# A Kubernetes deployment's record, beside where a local one's would be
# (backends.kubernetes.deployer).
KUBE_STATE_FILE = "kube-state.json"


class RoleProcess(BaseModel):
    name: str
    kind: str
    pid: int
    start_ticks: int | None
    port: int
    url: str
    log: str
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    # A port of its own for /metrics (the router's Prometheus port); None: the API port.
    metrics_port: int | None = None


class Deployment(BaseModel):
    name: str
    backend: str = "local"
    recipe: str
    state_dir: str
    created: str
    served_model_name: str
    entry_role: str
    entry_url: str = ""
    roles: list[RoleProcess] = Field(default_factory=list)
    kv_storage: list[str] = Field(default_factory=list)
    ready: bool = False
    plan: dict[str, Any] = Field(default_factory=dict)

    def role(self, name: str) -> RoleProcess:
        return role_named(self.roles, name)


def deployments_dir() -> Path:
    return servebook_home() / "deployments"


def state_dir_for(name: str) -> Path:
    """The deployment's own directory, always directly under ``deployments_dir()``: the
    commands take only deployment names (``servebook.names``), and whoever else calls
    this gets no path out of it either (``up --name ../../x`` once emptied ``x/kv``).
    Names recorded before that rule (``my_dep``) are still found."""
    root = deployments_dir()
    path = root / name
    if not name or name in (".", "..") or "\0" in name or path.parent != root:
        raise UsageError(
            f"deployment name {name!r} is not a name but a path; {names.RULE}, e.g. "
            f"{names.EXAMPLE}."
        )
    return path


@contextlib.contextmanager
def bringing_up(name: str) -> Iterator[None]:
    """Held while one ``up`` (or ``run``) brings deployment ``name`` up; a second one at the
    same time is refused (exit 2) naming the first's pid, instead of racing it for the
    state file, the ports and the model directory.  The kernel drops the lock when its
    holder exits, however it exits; one that finishes removes the file (and the
    deployment's directory when nothing else is in it), so a refused ``up`` leaves nothing."""
    path = state_dir_for(name) / UP_LOCK

    def refused(holder: str) -> UsageError:
        pid = f" (pid {holder})" if holder else ""
        return UsageError(
            f"another `servebook up` (or `run`) of deployment {name!r} is running{pid}; "
            "it is not up yet, and two would race for its processes and files.",
            hint=f"Wait for that one to finish (then `servebook status {name}`), or stop "
            f"it (Ctrl-C in its shell, or `kill {holder or 'PID'}`); or choose another --name.",
        )

    def emptied() -> None:
        with contextlib.suppress(OSError):  # only when empty: nothing was recorded
            path.parent.rmdir()
            path.parent.parent.rmdir()

    with exclusive(path, refused, after=emptied):
        yield


def write_state(dep: Deployment) -> None:
    """Atomically (a reader never sees half a state file), redacted and private
    (``files.write_record``)."""
    write_record(Path(dep.state_dir) / STATE_FILE, dep)


def read_state(name: str) -> Deployment | None:
    return read_model(
        state_dir_for(name) / STATE_FILE,
        Deployment,
        "a servebook state file",
        "Remove it if no processes of that deployment are running.",
    )


def remove_state(dep: Deployment) -> None:
    (Path(dep.state_dir) / STATE_FILE).unlink(missing_ok=True)


def list_deployments() -> list[Deployment]:
    root = deployments_dir()
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.iterdir()):
        dep = read_state(d.name) if (d / STATE_FILE).is_file() else None
        if dep is not None:
            out.append(dep)
    return out


def pick_deployment(name: str | None) -> Deployment | None:
    """The named deployment, or the only one there is."""
    if name:
        return read_state(name)
    deps = list_deployments()
    if len(deps) > 1:
        raise UsageError(
            "several deployments are recorded: " + ", ".join(d.name for d in deps) + ".",
            hint=f"Name one, e.g. `servebook down {deps[0].name}`.",
        )
    return deps[0] if deps else None
