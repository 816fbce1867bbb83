"""A precision target over whole sweeps: rounds of the shuffled levels, each adding one
repetition to the levels not yet precise; a level that converges leaves early, a noisy one
runs to the cap and is marked imprecise with the interval it reached; --resume takes the
same decisions; and the report, plots and compare say which levels are imprecise.

The points are made by a stand-in for ``run_point`` with figures chosen per level, so the
rules are tested without a server (``test_bench_sweep.py`` runs real HTTP sweeps)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any, cast

import pytest

from servebook.bench import protocol
from servebook.bench.endpoint import Endpoint
from servebook.bench.flags import (
    parse_precision,
)
from servebook.bench.protocol import (
    PointOutcome,
    PointSpec,
    ProtocolSettings,
    Target,
    point_order,
    round_order,
    run_sweep,
)
from servebook.bench.records import LoadResult
from servebook.bench.workload import DatasetPrompts, Prompt
from servebook.errors import UsageError
from servebook.report.compare import compare, rows_table, to_json
from servebook.report.plots import IMPRECISE, plot_specs
from servebook.report.render import build_report
from servebook.report.summary import describe_protocol
from servebook.report.tables import load_runs, validity_table
from servebook.results.provenance import resume_mismatches
from servebook.results.schema import (
    Latency,
    ModelInfo,
    Point,
    Provenance,
    WindowInfo,
)
from servebook.results.store import ResultsWriter, load_results
from tests.unit.conftest import a_point

SETTINGS = ProtocolSettings(
    concurrencies=(1, 2, 4),
    repetitions=3,
    seed=7,
    precision=0.05,
    max_repetitions=6,
)

# tok/s per repetition: c=1 and c=2 steady (their 95% half-width is ~1% after 3), c=4
# swinging +-40% for ever.
STEADY = [100.0, 101.0, 99.0, 100.0, 100.5, 99.5]
NOISY = [60.0, 140.0, 70.0, 130.0, 65.0, 135.0]


def figure(conc: int, rep: int) -> float:
    base = STEADY[rep] if conc in (1, 2) else NOISY[rep]
    return base * conc


def make_point(conc: int, rep: int, *, valid: bool = True) -> Point:
    """A point of ``figure(conc, rep)`` tok/s, 40 requests in a 10 s window, whose TPOT
    p50 moves a little with the repetition."""
    tpot = Latency(p50=20.0 + 0.01 * rep, p90=21.0, p99=22.0, mean=20.0, n=40)
    return a_point(
        conc,
        rep,
        figure(conc, rep),
        valid=valid,
        requests_ok=40,
        ttft_ms=tpot,
        itl_ms=tpot,
        tpot_ms=tpot,
        e2e_ms=tpot,
        window=WindowInfo(warmup_s=1, duration_s=10, requests_scheduled=40, requests_unfinished=0),
    )


class FakePoints:
    """Stands in for ``protocol.run_point``: records what was run, where in the sweep."""

    def __init__(self) -> None:
        self.ran: list[tuple[int, int, int]] = []  # (concurrency, repetition, position)

    def __call__(
        self, target: Target, spec: PointSpec, settings: ProtocolSettings, prompts: Any, **kw: Any
    ) -> PointOutcome:
        conc = spec.level.concurrency
        assert conc is not None
        self.ran.append((conc, spec.repetition, kw["position"]))
        return PointOutcome(make_point(conc, spec.repetition), [], cast(LoadResult, None), None)


def provenance(settings: ProtocolSettings = SETTINGS) -> Provenance:
    return Provenance(
        servebook_version="test",
        model=ModelInfo(name="tiny"),
        seed=settings.seed,
        protocol=settings.to_dict(),
        started_at="2026-01-01T00:00:00+00:00",
    )


TARGET = Target(endpoint=Endpoint("http://127.0.0.1:9", "tiny"))
PROMPTS = DatasetPrompts([Prompt("x", 4)], "memory", "0")


def sweep(
    monkeypatch: pytest.MonkeyPatch,
    out: Path,
    settings: ProtocolSettings = SETTINGS,
    *,
    resume: bool = False,
    stop_after: int | None = None,
) -> FakePoints:
    fake = FakePoints()
    monkeypatch.setattr(protocol, "run_point", fake)

    class Interrupted(Exception):
        pass

    def on_point(_spec: PointSpec, outcome: PointOutcome | None) -> None:
        if outcome is not None and stop_after is not None and len(fake.ran) >= stop_after:
            raise Interrupted

    with contextlib.suppress(Interrupted):
        run_sweep(
            TARGET,
            settings,
            PROMPTS,
            ResultsWriter(out, provenance(settings), resume=resume),
            on_point=on_point,
        )
    return fake


def expected_run() -> list[tuple[int, int, int]]:
    """Three full shuffled rounds, then rounds 3-5 of c=4 alone, each at its place in the
    full round (position = round x 3 + its index in that round's shuffle)."""
    out = [
        (lv.concurrency or 0, rnd, rnd * 3 + i)
        for rnd in range(3)
        for i, lv in enumerate(round_order(SETTINGS, rnd))
    ]
    for rnd in range(3, 6):
        i = [lv.concurrency for lv in round_order(SETTINGS, rnd)].index(4)
        out.append((4, rnd, rnd * 3 + i))
    return out


def test_rounds_add_repetitions_only_to_levels_not_yet_precise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = sweep(monkeypatch, tmp_path)
    assert fake.ran == expected_run()
    # the first rounds are the fixed plan, each round in its own seeded shuffle
    assert [(c, r) for c, r, _ in fake.ran[:9]] == [
        (ps.level.concurrency, ps.repetition) for ps in point_order(SETTINGS)
    ]
    assert len({tuple(lv.concurrency for lv in round_order(SETTINGS, r)) for r in range(3)}) > 1

    res = load_results(tmp_path / "results.json")
    by_level: dict[int, list[Point]] = {}
    for p in res.points:
        by_level.setdefault(p.concurrency or 0, []).append(p)
    for conc in (1, 2):
        assert len(by_level[conc]) == 3
        for p in by_level[conc]:
            assert not p.imprecise and p.precision is not None
            assert p.precision.status == "precise"
    noisy = by_level[4]
    assert len(noisy) == 6
    for p in noisy:
        assert p.imprecise and p.valid  # a verdict apart from validity
        assert p.precision is not None and p.precision.status == "imprecise"
        assert p.precision.repetitions == 6 and p.precision.target == 0.05
    reached = noisy[0].precision.figures["output_tokens_per_s"]  # type: ignore[union-attr]
    assert reached.n == 6 and reached.mean == pytest.approx(400.0)
    assert reached.ci95 is not None and reached.half_width_share is not None
    assert reached.half_width_share > 0.3  # the interval it reached, stated
    aggs = {a.concurrency: a for a in res.aggregates}
    assert aggs[4].precision is not None and aggs[4].precision.status == "imprecise"
    assert aggs[1].precision is not None and aggs[1].precision.status == "precise"
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["provenance"]["protocol"]["precision"] == 0.05
    assert doc["provenance"]["protocol"]["max_repetitions"] == 6


def test_an_interrupted_precision_sweep_resumes_with_the_same_decisions(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first = sweep(monkeypatch, tmp_path, stop_after=10)
    assert first.ran == expected_run()[:10]
    mid = load_results(tmp_path / "results.json")
    assert {p.precision.status for p in mid.points if p.precision} <= {"precise", "pending"}
    assert not any(p.imprecise for p in mid.points)  # not decided yet: not imprecise
    rest = sweep(monkeypatch, tmp_path, resume=True)
    assert rest.ran == expected_run()[10:]
    final = load_results(tmp_path / "results.json")
    assert sorted((p.concurrency, p.repetition) for p in final.points if p.imprecise) == [
        (4, r) for r in range(6)
    ]


def test_an_invalid_repetition_counts_toward_the_cap_and_is_rerun_on_resume(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = dataclasses.replace(SETTINGS, concurrencies=(1,), max_repetitions=4)
    fake = FakePoints()

    def one_invalid(
        target: Target, spec: PointSpec, s: ProtocolSettings, p: Any, **kw: Any
    ) -> PointOutcome:
        out = fake(target, spec, s, p, **kw)
        if spec.repetition == 1:
            return dataclasses.replace(out, point=make_point(1, 1, valid=False))
        return out

    monkeypatch.setattr(protocol, "run_point", one_invalid)
    run_sweep(TARGET, settings, PROMPTS, ResultsWriter(tmp_path, provenance(settings)))
    # reps 0 and 2 are valid and agree, but the minimum is 3 repetitions *run*, and the
    # interval over 2 valid ones (t = 12.7) is wide: a 4th round runs
    assert [(c, r) for c, r, _ in fake.ran] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    res = load_results(tmp_path / "results.json")
    pr = res.points[0].precision
    assert pr is not None and pr.repetitions == 4
    assert pr.figures["output_tokens_per_s"].n == 3  # over the valid ones only


def test_without_a_target_the_sweep_is_the_fixed_plan_and_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fixed = dataclasses.replace(SETTINGS, precision=None, max_repetitions=None)
    fake = sweep(monkeypatch, tmp_path, fixed)
    assert [(c, r) for c, r, _ in fake.ran] == [
        (ps.level.concurrency, ps.repetition) for ps in point_order(fixed)
    ]
    assert [pos for _, _, pos in fake.ran] == list(range(9))
    res = load_results(tmp_path / "results.json")
    assert all(p.precision is None and not p.imprecise for p in res.points)
    assert all(a.precision is None for a in res.aggregates)
    # recorded either way: null is "no target"
    assert res.provenance.protocol["precision"] is None
    assert res.provenance.protocol["max_repetitions"] is None


def test_a_results_file_from_before_the_precision_setting_resumes() -> None:
    fixed = dataclasses.replace(SETTINGS, precision=None, max_repetitions=None)
    new = provenance(fixed)
    old_protocol = {
        k: v for k, v in new.protocol.items() if k not in ("precision", "max_repetitions")
    }
    old = new.model_copy(update={"protocol": old_protocol})
    assert resume_mismatches(old, new) == []
    assert resume_mismatches(old, provenance(SETTINGS)) == ["protocol"]


@pytest.mark.parametrize(("text", "share"), [("5%", 0.05), ("0.05", 0.05), ("2.5%", 0.025)])
def test_precision_parses_as_a_share(text: str, share: float) -> None:
    assert parse_precision(text) == pytest.approx(share)


@pytest.mark.parametrize("text", ["off", "none", "0"])
def test_precision_off(text: str) -> None:
    assert parse_precision(text) is None


@pytest.mark.parametrize("text", ["150%", "1", "-5%", "five"])
def test_a_bad_precision_says_what_is_accepted(text: str) -> None:
    with pytest.raises(UsageError, match=r"e\.g\. 5%"):
        parse_precision(text)


def test_settings_refuse_a_cap_without_a_target_or_below_the_minimum() -> None:
    with pytest.raises(UsageError, match="without a target"):
        ProtocolSettings(concurrencies=(1,), max_repetitions=5)
    with pytest.raises(UsageError, match="below the minimum 3"):
        ProtocolSettings(concurrencies=(1,), precision=0.05, max_repetitions=2)
    one = ProtocolSettings(concurrencies=(1,), repetitions=1, precision=0.05)
    assert (one.min_repetitions, one.repetition_cap) == (2, 10)  # an interval needs two


# --- what the report says about it ---------------------------------------------------------


def test_the_report_tables_plots_and_compare_show_imprecise_levels(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sweep(monkeypatch, tmp_path / "a")
    sweep(monkeypatch, tmp_path / "b")
    runs = load_runs([tmp_path / "a", tmp_path / "b"])
    report = build_report(runs)

    assert "imprecise (interval wider than the precision target) at c=4" in report.summary
    assert "tok/s ±" in report.summary and "TPOT p50 ±0.1%, target ±5.0%)" in report.summary
    rows = {(r[0], r[1]): r for r in report.throughput.rows}
    assert rows[("a", "c=4")][2] == "6/6 imprecise"
    assert rows[("a", "c=1")][2] == "3/3"
    v = validity_table(runs)
    col = [c.title for c in v.columns].index("Precision (95% half-width / mean)")
    vrows = {(r[0], r[1]): r for r in v.rows}
    assert vrows[("a", "c=4")][col].startswith("imprecise: tok/s ±")
    assert vrows[("a", "c=1")][col].startswith("precise: tok/s ±")

    tp = next(p for p in plot_specs(runs) if p.id == "throughput")
    s = tp.panels[0].series[0]
    assert s.x == [1, 2, 4] and s.imprecise == [False, False, True]
    assert IMPRECISE in tp.caption

    plan = report.provenance[0].plan
    assert "within ±5% of the mean, at most 6 repetitions" in plan
    # What precision judges when vLLM's histogram cannot place TPOT's p50 (a CPU engine).
    assert "the engine's exact TPOT mean where its histogram leads TPOT" in plan
    assert "within" not in describe_protocol(
        dataclasses.replace(SETTINGS, precision=None, max_repetitions=None).to_dict()
    )

    c = compare(runs[0], runs[1])  # like for like: same settings, same points
    verdicts = {(r[0], r[1]): r[6] for r in rows_table(c).rows}
    assert verdicts[("c=4", "tok/s")].endswith("(A and B imprecise)")
    assert "imprecise" not in verdicts[("c=1", "tok/s")]
    row = next(r for r in to_json(c)["rows"] if r["level"] == "c=4")
    assert row["imprecise"] == {"a": True, "b": True}


def test_a_fixed_run_and_a_precision_run_compare_like_for_like(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sweep(monkeypatch, tmp_path / "a")
    sweep(
        monkeypatch,
        tmp_path / "b",
        dataclasses.replace(SETTINGS, precision=None, max_repetitions=None),
    )
    a, b = load_runs([tmp_path / "a", tmp_path / "b"])
    assert compare(a, b).comparability.like_for_like
