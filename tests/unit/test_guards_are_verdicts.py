"""Guards are verdicts (issue 32, finding 3).

Before: ``bench --duration 1s --warmup 0s --repetitions 1 --min-requests 1`` exited 0
with its point "valid" and drawn as a figure; ``--order ascending`` was accepted silently;
and ``bench`` had no precision target unless asked, so three repetitions gave ±30-70%
intervals with no warning.  Now such a level is "not a measurement" (shown, never drawn),
the choices that bias a run are named in its headline, and ``bench`` repeats a level to
run's kind of precision target by default.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servebook.report.plots import plot_specs
from servebook.report.summary import summary
from servebook.report.tables import load_runs
from servebook.results.measurement import MIN_WINDOW_REQUESTS, not_a_measurement
from servebook.results.store import load_results
from tests.unit.conftest import a_point
from tests.unit.engine_standin import scripted_engine


def bench(cli: Callable[..., Any], url: str, tiny_dir: Path, out: Path, *extra: str) -> Any:
    return cli(
        "bench", "--url", url, "--model", "tiny", "--tokenizer", str(tiny_dir),
        "--concurrency", "1", "--input-len", "16", "--output-len", "2",
        "--max-client-lag-ms", "1000", "--min-achieved-concurrency", "0.5",
        "-o", str(out), *extra,
    )  # fmt: skip


def test_the_trials_short_unwarmed_single_point_is_not_a_measurement_and_is_not_drawn(
    cli: Callable[..., Any], tiny_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "short"
    with scripted_engine(tokenizer=tiny_dir / "tokenizer.json") as (url, _):
        r = bench(
            cli, url, tiny_dir, out,
            "--duration", "1s", "--warmup", "0s", "--repetitions", "1", "--min-requests", "1",
            "--precision", "off", "--order", "ascending",
        )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    text = " ".join(r.stdout.split())
    assert "c=1: not a measurement: no warm-up (--warmup 0)" in text
    assert "1 valid repetition (an interval needs 2" in text
    assert "a choice that biases these figures: points ran low to high" in text
    runs = load_runs([out])
    head = summary(runs)
    assert "choices that bias it: points ran low to high (--order ascending)" in head
    assert "no level is a measurement: no figure to report" in head
    assert "best valid point" not in head
    drawn = [s for spec in plot_specs(runs) for panel in spec.panels for s in panel.series]
    assert drawn and all(math.isnan(y) for s in drawn for y in s.y)  # gaps, no figure


def test_a_window_of_few_requests_or_one_repetition_is_not_a_measurement() -> None:
    full, thin = a_point(4, 0), a_point(4, 1).model_copy(update={"requests_ok": 3})
    assert thin.requests_ok < MIN_WINDOW_REQUESTS <= full.requests_ok
    assert not_a_measurement([full, a_point(4, 1)], {"warmup": "10s"}) == []
    (why,) = not_a_measurement([full, thin], {"warmup": "10s"})
    assert why.startswith("3 requests in a window (a measurement needs at least 10")
    (why,) = not_a_measurement([full], {"warmup": "default"})
    assert why.startswith("1 valid repetition")
    # A replay has no warm-up by design: its window is the whole trace.
    assert not_a_measurement([full, a_point(4, 1)], {"warmup": "0", "replay_speed": 1.0}) == []


def test_bench_repeats_to_a_precision_target_unless_told_off(
    cli: Callable[..., Any], tiny_dir: Path, tmp_path: Path
) -> None:
    with scripted_engine(tokenizer=tiny_dir / "tokenizer.json") as (url, _):
        r = bench(
            cli, url, tiny_dir, tmp_path / "default",
            "--duration", "1s", "--warmup", "2r", "--repetitions", "1", "--max-repetitions", "2",
        )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    res = load_results(tmp_path / "default" / "results.json")
    assert res.provenance.protocol["precision"] == 0.05
    assert len(res.points) == 2  # a precision target's least: 2 repetitions
