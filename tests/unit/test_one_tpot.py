"""One TPOT for every reader (issue 32, finding 1).

The field trial compared tiny-mixed-spec (its client read tokens in bursts, so its TPOT was
its engine's histogram) with tiny-pd-spec (its client's TPOT stood).  ``compare`` set the
engine's 0-10 ms bucket midpoint, 5.00 ms, against pd-spec's client p50 of 2.7 ms and said
PD was 46% *better*; the engines' exact means, 1.84 against 2.82 ms, say it is about 50%
*worse*.  The report's latency table showed ``5.00 ± 0 (server)`` and its TPOT plot drew
mixed-spec at 5 ms.  The runs here are that trial's shape (``result_runs.TRIAL_*``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servebook.cli import app
from servebook.metrics.scrape import snapshot_from_text
from servebook.report import reproduce as rep
from servebook.report.plots import latency_plot, pareto_plot
from servebook.report.summary import best_point
from servebook.report.tables import latency_table, load_runs
from servebook.results.evidence import tokens_role, with_server_latency
from tests.unit.result_runs import TRIAL_MIXED, TRIAL_PD, experiment_of

FIXTURES = Path(__file__).parent / "fixtures"


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def tpot_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in doc["rows"] if r["metric"].startswith("tpot_ms.")]


def test_compare_judges_both_sides_on_the_engines_exact_means_where_one_side_was_burst() -> None:
    """Before: "TPOT p50 ms (server) 5.00 ± 0 | 2.700 ± 0.050 | -46.0% ... better"."""
    r = invoke("compare", str(TRIAL_MIXED), str(TRIAL_PD), "--variable", "topology", "--json")
    assert r.exit_code == 0, r.output
    rows = tpot_rows(json.loads(r.output))
    assert [(x["level"], x["metric"]) for x in rows] == [
        ("c=1", "tpot_ms.mean"),
        ("c=4", "tpot_ms.mean"),
    ]
    for row in rows:
        assert row["a"]["mean"] == pytest.approx(1.84)  # mixed-spec's engine
        assert row["b"]["mean"] == pytest.approx(2.82)  # pd-spec's decode engine, not 2.70
        assert row["ratio"] == pytest.approx(2.82 / 1.84)
        assert row["source"] == "server" and row["verdict"] == "worse"


def test_compare_prints_no_bucket_midpoint_and_no_verdict_from_one() -> None:
    r = invoke("compare", str(TRIAL_MIXED), str(TRIAL_PD), "--variable", "topology")
    assert r.exit_code == 0, r.output
    rows = [line for line in r.output.splitlines() if line.startswith("│")]
    tpot = [line for line in rows if "TPOT" in line]
    assert tpot and all("worse" in line for line in tpot), tpot
    assert not any("5.00" in line or "9.90" in line for line in tpot), tpot
    # the per-token ITL of the same windows: the engine's interpolated 5.00 is no figure either
    itl = [line for line in rows if "ITL" in line]
    assert itl and not any("5.00" in line or "better" in line for line in itl), itl
    assert "both runs are compared on their engines' exact means" in r.output


def test_reproduce_reads_each_side_on_its_own_engines_exact_mean() -> None:
    """Before: pd-spec's side read its *client's* mean (2.835) beside mixed-spec's engine."""
    a, b = load_runs([TRIAL_MIXED, TRIAL_PD])
    got = rep.reproduce(a, b)
    for level in got.points:
        tpot = next(m for m in level.metrics if m.metric.startswith("tpot_ms."))
        assert tpot.metric == "tpot_ms.mean"
        assert (tpot.median_a, tpot.median_b) == (pytest.approx(1.84), pytest.approx(2.82))
        assert level.verdict == "does not reproduce"


def test_report_latency_table_shows_the_exact_mean_beside_the_bucket_never_its_midpoint() -> None:
    runs = load_runs([TRIAL_MIXED, TRIAL_PD])
    t = latency_table(runs)
    p50 = next(i for i, c in enumerate(t.columns) if c.title.startswith("TPOT p50"))
    p99 = next(i for i, c in enumerate(t.columns) if c.title.startswith("TPOT p99"))
    mixed = [row for row in t.rows if row[0] == "tiny-mixed-spec"]
    assert mixed
    for row in mixed:
        assert "5.00" not in row[p50] and "9.9" not in row[p99], row
        assert row[p50] == "<10 (mean 1.840 ± 0.050) (server)", row[p50]
        assert row[p99] == "<10 (server)", row[p99]
    pd = [row for row in t.rows if row[0] == "tiny-pd-spec"]
    assert pd and all(row[p50] == "2.700 ± 0.050" for row in pd), pd


def test_the_tpot_plot_and_the_pareto_view_draw_the_engines_exact_mean() -> None:
    """Before: the TPOT plot drew mixed-spec at 5 ms, and its speed per user at 200 tok/s."""
    runs = load_runs([TRIAL_MIXED, TRIAL_PD])
    left = latency_plot(runs, "concurrency", "tpot").panels[0]
    by_run = {s.label: s.y for s in left.series}
    assert by_run["tiny-mixed-spec"] == [pytest.approx(1.84)] * 2
    assert by_run["tiny-pd-spec"] == [pytest.approx(2.70)] * 2
    assert "tiny-mixed-spec" in left.note and "exact mean" in left.note
    pareto = {s.label: s.x for s in pareto_plot(runs).panels[0].series}
    assert pareto["tiny-mixed-spec"] == [pytest.approx(1000 / 1.84, rel=1e-3)] * 2


def test_the_summary_headline_reads_the_judged_tpot() -> None:
    mixed, _ = load_runs([TRIAL_MIXED, TRIAL_PD])
    said = best_point(mixed)
    assert said is not None and "TPOT mean 1.84 ms from the engine histograms" in said, said


def test_each_point_reads_the_role_that_timed_its_own_tokens() -> None:
    """tiny-pd-spec's file was written before the role was recorded: the role is the one
    whose TPOT histogram saw decode time (prefill's one token per request has none); from
    now on the measurement records it."""
    _, pd = load_runs([TRIAL_MIXED, TRIAL_PD])
    point = pd.results.points[0]
    assert "role" not in (point.latency_diagnosis or {})
    assert tokens_role(point) == "decode"

    def decode(edge: str) -> dict[str, Any]:
        text = (FIXTURES / "metrics" / f"vllm-0.32.0-cpu-pd-spec-decode-{edge}.prom").read_text()
        return {"decode": snapshot_from_text(text)}

    measured = with_server_latency(point, decode("before"), decode("after"), decode_role="decode")
    assert measured.latency_diagnosis is not None
    assert measured.latency_diagnosis["role"] == "decode"
    assert tokens_role(measured) == "decode"


def test_an_experiment_judges_tpot_as_compare_does(tmp_path: Path) -> None:
    """Issue 49: the experiment's analysis read the stored p50, which for mixed-spec is its
    histogram's 0-10 ms bucket (5.00) beside an exact mean of 1.84: pd-spec/mixed-spec read
    2.70 / 5.00 = 0.54, "better".  Its ratios, verdicts, table, Pareto view and max load
    now take TPOT as compare does: both arms on their engines' exact means."""
    arms = {"mixed": TRIAL_MIXED, "pd": TRIAL_PD}
    state = experiment_of(tmp_path, arms, blocks=3, slo="tpot=3ms")

    r = invoke("compare", str(TRIAL_MIXED), str(TRIAL_PD), "--variable", "topology", "--json")
    compared = {row["level"]: row for row in tpot_rows(json.loads(r.output))}
    tpot = [c for c in state["comparisons"] if c["metric"].startswith("tpot")]
    assert [c["concurrency"] for c in tpot] == [1.0, 4.0]
    for c in tpot:
        row = compared[f"c={c['concurrency']:g}"]
        assert c["ratio"] == pytest.approx(row["ratio"], rel=1e-4)  # 2.82 / 1.84, not 0.54
        assert c["verdict"] == row["verdict"] == "worse"
        assert c["metric"] == "tpot_ms" and c["judged_on"] == row["metric"] == "tpot_ms.mean"
    assert state["tpot_judged_on"] == {"1": "tpot_ms.mean", "4": "tpot_ms.mean"}
    table = {(r["arm"], r["level"]): r["tpot_ms"] for r in state["absolute"]}
    assert table[("mixed", 4.0)] == pytest.approx(1.84)
    assert table[("pd", 4.0)] == pytest.approx(2.82)  # its decode engine's, not its client's 2.835
    x = {(p["arm"], p["level"]): p["tokens_per_user"][0] for p in state["pareto"]["points"]}
    assert x[("mixed", 4.0)] == pytest.approx(1000 / 1.84, rel=1e-3)
    # the max load under a TPOT p99: mixed-spec's p99 is a bucket (9.9), no figure; pd-spec
    # judged on its own has its client's p99 (3.51 ms at both levels: over 3 ms)
    loads = {m["arm"]: m for m in state["max_load"]}
    assert loads["mixed"]["outcome"] == "no figure"
    assert loads["pd"]["outcome"] == "missed at the lowest level"
