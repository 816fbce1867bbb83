"""One source per load level for TPOT and ITL: where a repetition's diagnosis made the
engine's histogram lead (issue 24 point 1), the level's other repetitions, and the other
run's in ``compare``, read the engine's too, so no median or interval mixes the client's
estimate with the engine's (tiny-pd on 2 cores: 5 of 12 points engine-led, 7 client-led,
TPOT p50's interval still +-73% after six repetitions)."""

from __future__ import annotations

from typing import Any

from servebook.report.tables import Level, same_source
from servebook.results.evidence import (
    one_source,
    one_source_per_level,
    stored_figure,
    unplaced_p50,
)
from servebook.results.schema import Latency, Point
from servebook.results.tpot import judged, judged_key
from tests.unit.conftest import a_measured_point


def histogram(mean: float, p50: float, count: float = 40) -> dict[str, Any]:
    """A window's histogram as results.json stores it (``HistogramWindow.to_dict(1000)``:
    vLLM's TPOT buckets, 0-10 ms holding the median)."""

    def est(v: float) -> dict[str, Any]:
        return {"value": v, "bucket": [0.0, 10.0], "above_range": False}

    return {
        "metric": "vllm:request_time_per_output_token_seconds",
        "status": "ok",
        "count": count,
        "mean": mean,
        "p50": est(p50),
        "p90": est(9.0),
        "p99": est(9.9),
    }


def point(rep: int, client_p50: float, *, led: bool, concurrency: int = 1) -> Point:
    client = Latency(p50=client_p50, p90=client_p50, p99=client_p50, mean=client_p50, n=40)
    server = Latency(p50=5.0, p90=9.0, p99=9.9, mean=5.2, n=40)
    stored = {"decode": {"tpot": histogram(5.2, 5.0), "itl": histogram(5.1, 5.0)}}
    return a_measured_point(
        concurrency=concurrency,
        repetition=rep,
        tpot_ms=server if led else client,
        server_latency=stored,
        latency_source={"tpot_ms": "server:decode"} if led else {},
        client_latency={"tpot_ms": client} if led else {},
    )


def test_a_level_with_one_engine_led_repetition_reads_the_engine_on_every_one() -> None:
    led, plain = point(0, 2.0, led=True), point(1, 3.0, led=False)
    a, b = one_source([led, plain])
    assert a == led  # already the engine's
    assert b.tpot_ms.p50 == 5.0 and b.latency_source == {"tpot_ms": "server:decode"}
    assert b.client_latency["tpot_ms"].p50 == 3.0  # the client's own figure, kept
    assert b.itl_ms == plain.itl_ms  # only what some repetition's diagnosis led


def test_no_engine_led_repetition_leaves_the_clients_figures() -> None:
    pts = [point(0, 2.0, led=False), point(1, 3.0, led=False)]
    assert one_source(pts) == pts


def test_a_repetition_whose_histogram_saw_nothing_keeps_the_client_figure() -> None:
    empty = point(1, 3.0, led=False)
    empty = empty.model_copy(
        update={"server_latency": {"decode": {"tpot": {"status": "empty", "count": 0}}}}
    )
    assert stored_figure({"status": "empty", "count": 0}) is None
    _, kept = one_source([point(0, 2.0, led=True), empty])
    assert kept == empty


def test_levels_are_unified_each_on_its_own() -> None:
    pts = [
        point(0, 2.0, led=True, concurrency=1),
        point(0, 3.0, led=False, concurrency=4),
        point(1, 3.0, led=False, concurrency=1),
    ]
    out = one_source_per_level(pts)
    assert [p.concurrency for p in out] == [1, 4, 1]
    assert out[1] == pts[1]  # c=4 had no engine-led repetition
    assert out[2].latency_source == {"tpot_ms": "server:decode"}


def test_compare_reads_both_runs_from_the_same_source() -> None:
    run_a = Level(run=None, mode="concurrency", value=1, points=[point(0, 2.0, led=True)])  # type: ignore[arg-type]
    run_b = Level(run=None, mode="concurrency", value=1, points=[point(0, 3.0, led=False)])  # type: ignore[arg-type]
    a, b = same_source(run_a, run_b)
    assert a.points[0].tpot_ms.p50 == b.points[0].tpot_ms.p50 == 5.0
    assert b.points[0].client_latency["tpot_ms"].p50 == 3.0


def engine_led(rep: int, mean: float, *, bucket: tuple[float, float] = (0.0, 10.0)) -> Point:
    """An engine-led repetition whose TPOT p50 the histogram estimates inside ``bucket``
    (vLLM's first TPOT bucket is 0-10 ms: interpolation gives 5.00 for any CPU engine)."""
    p50 = (bucket[0] + bucket[1]) / 2
    stored = histogram(mean, p50)
    stored["p50"]["bucket"] = list(bucket)
    return a_measured_point(
        concurrency=1,
        repetition=rep,
        tpot_ms=Latency(p50=p50, p90=9.0, p99=9.9, mean=mean, n=40),
        server_latency={"decode": {"tpot": stored}},
        latency_source={"tpot_ms": "server:decode"},
        client_latency={"tpot_ms": Latency(p50=0.0, mean=0.0, n=40)},
    )


def _level(points: list[Point]) -> Level:
    return Level(run=None, mode="concurrency", value=1, points=points)  # type: ignore[arg-type]


def test_an_unplaced_engine_p50_is_not_a_reproduction_the_exact_mean_is_judged() -> None:
    """Both runs' TPOT p50 read 5.00 (the first bucket's midpoint) while the engine's exact
    means differ by a third: TPOT p50 "reproduced" before; the mean is judged now."""
    from servebook.report.reproduce import check_level

    a = _level([engine_led(i, m) for i, m in enumerate((2.20, 2.30, 2.25))])
    b = _level([engine_led(i, m) for i, m in enumerate((3.00, 3.10, 3.05))])
    assert judged_key(a.points) == "tpot_ms.mean"
    assert unplaced_p50(a.points[0], "tpot_ms") == (0.0, 10.0)
    got = check_level(a, b, 0.05)
    assert [c.metric for c in got.metrics] == ["output_tokens_per_s", "tpot_ms.mean"]
    assert got.verdict == "does not reproduce", got
    assert "TPOT mean +35.6%" in got.reason
    assert "its histogram places the p50 only below 10 ms" in got.reason
    same = _level([engine_led(i, m) for i, m in enumerate((2.21, 2.29, 2.26))])
    assert check_level(a, same, 0.05).verdict == "reproduces"


def test_an_engine_led_p50_is_never_judged_even_in_a_fine_bucket_the_clients_p50_is() -> None:
    """A histogram with 1 ms buckets around 15 ms places its p50 to 6%, but that is still an
    interpolation: where the engine leads, its exact mean is the figure (issue 32: one
    rule for every reader). Before, this p50 was judged."""
    placed = [engine_led(i, 15.0, bucket=(15.0, 16.0)) for i in range(2)]
    assert unplaced_p50(placed[0], "tpot_ms") is None
    assert judged_key(placed) == "tpot_ms.mean"
    assert judged(placed[0]).value == 15.0 and judged(placed[0]).source == "server:decode"
    client = [point(i, 2.0, led=False) for i in range(2)]
    assert judged_key(client) == "tpot_ms.p50"
    assert judged(client[0]).value == 2.0 and judged(client[0]).source == "client"


def test_a_p50_inside_vllms_10_to_25_ms_bucket_is_unplaced_and_the_mean_is_judged() -> None:
    """Measured on tiny-pd (2 cores, 12 repetitions): the engine's p50, interpolated inside
    vLLM's 10-25 ms TPOT bucket, read 6.3-17.0 ms while its exact means were 9.3-11.7 ms;
    two runs whose means agreed to 2% disagreed by 14% on that p50.  Before, only the first
    bucket counted as unplaced and this p50 was judged."""
    from servebook.report.reproduce import check_level

    def at(rep: int, mean: float, p50: float) -> Point:
        pt = engine_led(rep, mean, bucket=(10.0, 25.0))
        pt.server_latency["decode"]["tpot"]["p50"]["value"] = p50  # type: ignore[index]
        return pt.model_copy(update={"tpot_ms": pt.tpot_ms.model_copy(update={"p50": p50})})

    coarse = [at(0, 10.5, 10.8), at(1, 10.8, 14.4), at(2, 11.1, 15.6)]
    assert unplaced_p50(coarse[0], "tpot_ms") == (10.0, 25.0)
    assert judged_key(coarse) == "tpot_ms.mean"
    other = _level([at(0, 10.6, 16.4), at(1, 10.9, 17.0), at(2, 11.0, 16.2)])
    got = check_level(_level(coarse), other, 0.05)
    assert [c.metric for c in got.metrics] == ["output_tokens_per_s", "tpot_ms.mean"]
    assert got.verdict == "reproduces", got  # the p50s differ by 14%, the means by 1%
    assert "places the p50 only within 10-25 ms" in got.reason


def test_precision_is_judged_on_the_exact_mean_where_the_p50_is_unplaced() -> None:
    """Before: TPOT p50 +-0.0% at once (every repetition the same midpoint), a precision
    no measurement had."""
    from servebook.results.aggregate import PrecisionTarget

    target = PrecisionTarget(0.05, 3, 6)
    pts = [engine_led(i, m) for i, m in enumerate((2.0, 2.6, 3.2))]
    decision = target.decide(pts)
    assert set(decision.intervals) == {"output_tokens_per_s", "tpot_ms.mean"}
    spread = decision.relative["tpot_ms.mean"]
    assert spread is not None and spread > 0.05 and decision.status == "continue"


def test_bench_table_shows_an_engine_led_tpot_as_its_bucket_and_the_exact_mean() -> None:
    """Before: the table printed 5.00 for every engine-led point of tiny-pd, and later
    15.50 (an interpolation) for a p50 in a fine bucket."""
    assert judged(engine_led(0, 2.31)).cell() == "<10 (mean 2.31)"
    assert judged(engine_led(0, 15.0, bucket=(10.0, 25.0))).cell() == "10-25 (mean 15.00)"
    assert judged(engine_led(0, 15.0, bucket=(15.0, 16.0))).cell() == "15-16 (mean 15.00)"
    assert judged(point(0, 2.0, led=False)).cell() == "2.00"


def test_the_summary_headline_names_the_exact_mean_where_the_p50_is_unplaced() -> None:
    """Before: "TPOT p50 5.00 ms from the engine histograms" for tiny-pd."""
    from types import SimpleNamespace

    from servebook.report.summary import best_point

    pts = [engine_led(i, m) for i, m in enumerate((2.2, 2.3, 2.4))]
    run = SimpleNamespace(
        results=SimpleNamespace(points=pts, provenance=SimpleNamespace(protocol={})),
        accelerators=None,
    )
    said = best_point(run)  # type: ignore[arg-type]
    assert said is not None and "TPOT p50" not in said, said
    assert "TPOT mean 2.30 ms from the engine histograms" in said, said
    assert "its histogram places the p50 only below 10 ms" in said
    # repetitions placed in the first bucket and in the next: a span, named as no one bucket
    mixed = [engine_led(0, 9.8), engine_led(1, 10.4, bucket=(10.0, 25.0))]
    run = SimpleNamespace(
        results=SimpleNamespace(points=mixed, provenance=SimpleNamespace(protocol={})),
        accelerators=None,
    )
    said = best_point(run)  # type: ignore[arg-type]
    assert said is not None and "places the p50 only below 25 ms)" in said, said
    assert "first bucket" not in said
    # a p50 a fine bucket places is still an interpolation: the headline reads the mean
    # (before: "TPOT p50 15.50 ms")
    fine = [engine_led(i, 15.0, bucket=(15.0, 16.0)) for i in range(2)]
    run = SimpleNamespace(
        results=SimpleNamespace(points=fine, provenance=SimpleNamespace(protocol={})),
        accelerators=None,
    )
    said = best_point(run)  # type: ignore[arg-type]
    assert said is not None and "TPOT mean 15.00 ms from the engine histograms" in said, said
