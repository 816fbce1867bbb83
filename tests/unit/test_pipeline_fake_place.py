"""``servebook run``'s steps (``pipeline.run``) over a fake place (``conftest.FakePlace``,
the scripted engine): what is brought up is verified, and taken down whatever verify says,
unless kept; no vLLM, no cluster, about a second."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servebook import pipeline
from servebook.recipe.resolve import resolve
from servebook.verify.smoke import Options


def job(place: Any, out: Path, *, keep: bool = False) -> pipeline.Job:
    return pipeline.Job(
        backend=place,
        name="fake-1",
        plan=resolve("tiny-mixed", [], []),
        recipe="tiny-mixed",
        opts=Options(health_timeout_s=2.0, request_timeout_s=5.0, max_tokens=8),
        timeout_s=None,
        keep=keep,
        out_dir=out,
        say=lambda line: None,
    )


def test_a_failing_verify_skips_the_sweep_and_takes_the_deployment_down(
    fake_place: Callable[..., Any], tmp_path: Path
) -> None:
    """The scripted engine's counters never move: verify fails, nothing is measured, and
    what was brought up goes down."""
    place = fake_place()
    t0 = time.monotonic()
    assert pipeline.run(job(place, tmp_path / "out")) == 1
    assert time.monotonic() - t0 < 20
    assert place.calls == ["preflight", "up fake-1", "open fake-1", "down fake-1"]
    assert not (tmp_path / "out").exists() and place.recorded() == []


def test_keep_leaves_the_deployment_up(fake_place: Callable[..., Any], tmp_path: Path) -> None:
    place = fake_place()
    assert pipeline.run(job(place, tmp_path / "out", keep=True)) == 1
    assert place.calls[-1] == "open fake-1" and place.recorded() == ["fake-1"]
