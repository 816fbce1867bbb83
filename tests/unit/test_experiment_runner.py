"""bench's check before each point (issue 49, point 4): a role is called silent only after
``bench.health.TRIES`` asks of /health in a row missed, and each miss is kept and told."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from aiohttp import web

from servebook.bench import health
from servebook.deployment.view import DeploymentView, RoleView
from servebook.recipe.resolve import resolve
from tests.unit.result_runs import RESULTS
from tests.unit.served_app import served

FIELD_RUNS = {"mixed": RESULTS / "trial-mixed-spec", "pd": RESULTS / "trial-pd-spec"}


# --- a role is called silent only within a stated bound ----------------------------------


@pytest.fixture
def slow_once() -> Iterator[tuple[str, list[float]]]:
    """A server whose first /health answers after 0.6 s and every later one at once;
    yields its URL and when each ask came."""
    asked: list[float] = []

    async def health_page(_r: web.Request) -> web.Response:
        asked.append(time.monotonic())
        if len(asked) == 1:
            await _sleep(0.6)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health_page)
    with served(app) as url:
        yield url, asked


async def _sleep(s: float) -> None:
    import asyncio

    await asyncio.sleep(s)


def view_of(url: str, alive: Callable[[], bool | None] = lambda: True) -> DeploymentView:
    plan = resolve("tiny-mixed", [], [])
    role = RoleView("mixed", "engine", url, alive=alive)
    return DeploymentView("d", "local", "tiny-mixed", plan, "tiny", url, [role])


def test_one_slow_health_answer_is_a_recorded_miss_not_a_silent_role(
    slow_once: tuple[str, list[float]],
) -> None:
    url, asked = slow_once
    said: list[str] = []
    check = health.not_serving(view_of(url), timeout_s=0.3, pause_s=0.1, tell=said.append)
    assert check() == []  # answered at the second ask: it can serve
    (miss,) = check.misses
    assert miss["role"] == "mixed" and miss["ask"] == 1 and miss["tries"] == health.TRIES
    assert miss["then"] == "answered at ask 2" and miss["url"] == f"{url}/health"
    assert "timed out" in miss["error"] or "0.3" in miss["error"], miss
    assert len(asked) == 2 and asked[1] - asked[0] >= 0.3 + 0.1 - 0.05
    # told as it happened, and what came of it
    assert said[0].startswith("mixed missed /health (ask 1 of 3") and "again in 0.1 s" in said[0]
    assert said[1] == "mixed answered /health at ask 2 of 3"
    assert check() == [] and len(check.misses) == 1  # the next point's check: no miss


def test_a_role_is_called_silent_after_every_ask_missed_within_the_bound() -> None:
    from tests.unit.engine_standin import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    check = health.not_serving(view_of(url), timeout_s=0.2, pause_s=0.1, tell=lambda _l: None)
    t0 = time.monotonic()
    (silent,) = check()
    took = time.monotonic() - t0
    assert silent.startswith(f"mixed (nothing answers at {url}/health: 3 asks in a row missed")
    assert took <= health.bound_s(3, 0.2, 0.1) + 0.5
    assert [m["ask"] for m in check.misses] == [1, 2, 3]
    assert {m["then"] for m in check.misses} == {"called silent"}
    # the default bound, stated: 3 asks of 2 s, 2 s apart
    assert health.bound_s() == 10.0
    # a role whose process is gone is dead at once, with no ask
    gone = health.not_serving(view_of(url, alive=lambda: False))
    assert gone() == ["mixed (not running)"] and gone.misses == []
