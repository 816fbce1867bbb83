"""Engine tests start real vLLM CPU servers with the tiny model: one deployment at a time
(the machines have 2 cores), and every test proves afterwards that nothing it started is
still alive.

A test that only reads a tiny recipe's deployment as the recipe makes it (sends requests,
scrapes counters, benches it) takes it from ``shared`` instead of bringing up its own:
``@pytest.mark.shares("tiny-pd")`` and ``shared.get("tiny-pd")``. The engine tests are
ordered so the tests sharing one recipe run one after another, and one deployment serves
them all: a tiny deployment's start-up (20-60 s on 2 cores) is most of such a test's time.
A test that breaks it (kills or freezes a role) may: the next ``get`` finds it unhealthy
and brings it up again. Before any other test the shared deployment is taken down, so
there is still one deployment at a time, and taking it down proves nothing is left, as
``deployed`` does."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from servebook.backends.local import deployer as local
from servebook.backends.local.processes import group_members
from servebook.deployment.view import Claims, RoleView
from servebook.recipe.plan import Plan
from servebook.recipe.resolve import resolve

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
        _down_leaving_nothing(dep, members | group_members([r.pid for r in dep.roles]))


def seen(dep: local.Deployment) -> tuple[list[RoleView], Claims]:
    """What verify sees of a local deployment: the backend's view's targets and claims."""
    view = local.view(dep)
    return view.roles, view.claims()


# The order the shared groups run in: a test sharing two recipes (a comparison) runs last
# in its first recipe's group and leaves its second up for the group after.
SHARED_ORDER = ("tiny-mixed", "tiny-mixed-spec", "tiny-pd-spec", "tiny-pd")


def _shares(item: pytest.Item) -> tuple[str, ...]:
    mark = item.get_closest_marker("shares")
    return tuple(mark.args) if mark is not None else ()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "shares(*recipes): takes these tiny recipes' deployments from `shared`"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The engine tests sharing a recipe one after another (SHARED_ORDER), then the rest in
    their own order; tests outside tests/engine keep their places."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if here in item.path.parents]

    def key(i: int) -> tuple[int, int, int]:
        recipes = _shares(items[i])
        if not recipes:
            return (len(SHARED_ORDER), 0, i)
        return (SHARED_ORDER.index(recipes[0]), len(recipes), i)

    ordered = [items[i] for i in sorted(slots, key=key)]
    for slot, item in zip(slots, ordered, strict=True):
        items[slot] = item


class Shared:
    """At most one deployment of a tiny recipe, as the recipe makes it, kept up across the
    tests that share it."""

    def __init__(self) -> None:
        self.recipe: str | None = None
        self.dep: local.Deployment | None = None
        self.members: set[int] = set()

    @staticmethod
    def name(recipe: str) -> str:
        return f"s-{recipe}"

    def get(self, recipe: str) -> local.Deployment:
        if self.recipe == recipe and self.dep is not None and self._healthy(self.dep):
            return self.dep
        self.release()
        name = self.name(recipe)
        plan = resolve(recipe, state_dir=local.state_dir_for(name))
        self.dep = local.up(plan, name=name, timeout_s=480, say=print)
        self.recipe = recipe
        self.members = group_members([r.pid for r in self.dep.roles])
        assert self.members, "no process found for a deployment that is up"
        return self.dep

    @staticmethod
    def _healthy(dep: local.Deployment) -> bool:
        return all(local.is_ours_alive(r) and local._health(r.url) for r in dep.roles)

    def release(self) -> None:
        dep, self.dep, self.recipe = self.dep, None, None
        if dep is None:
            return
        members = self.members | group_members([r.pid for r in dep.roles])
        _down_leaving_nothing(dep, members)


def _down_leaving_nothing(dep: local.Deployment, members: set[int]) -> None:
    stopped, result = local.down(dep.name)
    assert stopped is not None
    assert all(v in ("stopped", "killed", "not running") for v in result.values()), result
    assert_all_stopped(dep, members)
    for kv in dep.kv_storage:
        assert not Path(kv).exists(), f"connector storage {kv} left behind"


@pytest.fixture(scope="session")
def _shared_deployments() -> Iterator[Shared]:
    keep = Shared()
    yield keep
    keep.release()


@pytest.fixture(autouse=True)
def shared(request: pytest.FixtureRequest, _shared_deployments: Shared) -> Iterator[Shared]:
    """The shared deployments; taken down before a test that does not share them."""
    wanted: Sequence[str] = _shares(request.node)
    if _shared_deployments.recipe not in wanted:
        _shared_deployments.release()
    yield _shared_deployments


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
