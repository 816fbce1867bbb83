"""Engine tests start real vLLM CPU servers with the tiny model: one deployment at a time
(the machines have 2 cores), and every test proves afterwards that nothing it started is
still alive."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from servebook.backends import local
from servebook.backends.processes import group_members
from servebook.recipe.plan import Plan
from servebook.verify.smoke import Claims, Target

pytestmark = pytest.mark.engine


@pytest.fixture(scope="session", autouse=True)
def engine_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One SERVEBOOK_HOME for the session, so the tiny models are made once."""
    home = tmp_path_factory.mktemp("sbhome-engine")
    old = os.environ.get("SERVEBOOK_HOME")
    os.environ["SERVEBOOK_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("SERVEBOOK_HOME", None)
    else:
        os.environ["SERVEBOOK_HOME"] = old


def assert_all_stopped(dep: local.Deployment, members: set[int]) -> None:
    still = group_members([r.pid for r in dep.roles]) | {
        pid for pid in members if Path(f"/proc/{pid}").exists() and _not_zombie(pid)
    }
    assert not still, f"processes still alive after down: {sorted(still)}"


def _not_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


@contextlib.contextmanager
def deployed(
    plan: Plan, name: str, timeout_s: float = 480, entry_port: int | None = None
) -> Iterator[local.Deployment]:
    """Up for the body of the with-block; down afterwards, proving nothing is left."""
    dep = local.up(plan, name=name, timeout_s=timeout_s, entry_port=entry_port, say=print)
    members: set[int] = set()
    try:
        members = group_members([r.pid for r in dep.roles])
        assert members, "no process found for a deployment that is up"
        yield dep
    finally:
        members |= group_members([r.pid for r in dep.roles])
        stopped, result = local.down(name)
        assert stopped is not None
        assert all(v in ("stopped", "killed", "not running") for v in result.values()), result
        assert_all_stopped(dep, members)
        for kv in dep.kv_storage:
            assert not Path(kv).exists(), f"connector storage {kv} left behind"


def seen(dep: local.Deployment) -> tuple[list[Target], Claims]:
    """What verify sees of a local deployment: the backend's view's targets and claims."""
    view = local.view(dep)
    return view.targets(), view.claims()


# Short windows for a 2-core machine that also runs both servers; the client lag bound is
# raised for the same reason, and both are recorded in the results' provenance.
SWEEP = [
    "--duration",
    "6s",
    "--warmup",
    "2s",
    "--min-requests",
    "4",
    "--input-len",
    "512",
    "--output-len",
    "32",
    "--order",
    "ascending",
    "--max-client-lag-ms",
    "250",
    "--min-achieved-concurrency",
    "0.5",
]


def sb(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m servebook ARGS` in a child with exactly ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "servebook", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
