"""Verdicts that need evidence (issue 49, point 3): no ``better``/``worse`` from fewer than
``analysis.MIN_BLOCKS`` valid blocks ("better" was printed from a single block), the
figures a table shows are what its title says (a table titled "median" took the mean),
and every interval is the ratios' block bootstrap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servebook.experiment import analysis, figures
from servebook.experiment import report as exp_report
from tests.unit.result_runs import TRIAL_MIXED, TRIAL_PD, experiment_of


def ratio(blocks: int, lo: float = 1.2, hi: float = 1.4, level: float = 1.0) -> analysis.Ratio:
    return analysis.Ratio("b", "a", level, "output_tokens_per_s", (lo + hi) / 2, lo, hi, blocks)


def test_no_verdict_and_no_crossover_from_fewer_blocks_than_the_minimum() -> None:
    assert analysis.MIN_BLOCKS == 3
    assert ratio(1).verdict == "not enough blocks (1 of 3 needed)"
    assert ratio(2, 0.5, 0.7).verdict == "not enough blocks (2 of 3 needed)"
    assert ratio(3).verdict == "better" and ratio(3, 0.5, 0.7).verdict == "worse"
    # intervals wholly on either side of 1, but from two blocks: no crossover is claimed
    (vague,) = analysis.crossovers([ratio(2, 1.2, 1.4, 1.0), ratio(2, 0.6, 0.8, 16.0)])
    assert vague["undetermined"] and vague["between"] is None
    assert "from 2 valid block(s), fewer than the 3 a verdict needs" in vague["why"]
    (found,) = analysis.crossovers([ratio(3, 1.2, 1.4, 1.0), ratio(3, 0.6, 0.8, 16.0)])
    assert found["between"] == [1.0, 16.0]


def experiment_state(tmp_path: Path, blocks: int) -> dict[str, Any]:
    """Field-trial results (mixed-spec against pd-spec) as every block of both arms."""
    return experiment_of(tmp_path, {"mixed": TRIAL_MIXED, "pd": TRIAL_PD}, blocks)


def test_two_blocks_give_ratios_but_no_verdict_and_the_report_says_why(tmp_path: Path) -> None:
    """pd-spec's TPOT is 53% longer in both blocks; two blocks are still no verdict."""
    state = experiment_state(tmp_path, blocks=2)
    tpot = [c for c in state["comparisons"] if c["metric"] == "tpot_ms"]
    assert tpot and all(c["ratio"] > 1.5 and c["ci95"][0] > 1 for c in tpot)
    assert {c["verdict"] for c in state["comparisons"]} == {"not enough blocks (2 of 3 needed)"}
    assert state["min_blocks"] == 3
    said = exp_report.sentences(state)
    assert "Ratios from 2 valid block(s) get no verdict: a verdict needs 3 (one block's " in (
        " ".join(said)
    )
    (table,) = [t for t in exp_report.tables(state) if t.id == "ratios"]
    assert "from at least 3 valid blocks" in (table.note or "")
    assert {row[-1] for row in table.rows} == {"not enough blocks (2 of 3 needed)"}
    three = experiment_state(tmp_path / "3", blocks=3)
    assert {c["verdict"] for c in three["comparisons"] if c["metric"] == "tpot_ms"} == {"worse"}


def test_the_table_titled_median_shows_the_median_the_ratio_divides() -> None:
    """Three blocks of 100, 110 and 400 tok/s (one disturbed): the table said "median" and
    showed their mean, 203.3; it shows 110, the figure the ratio and the Pareto view use."""
    blocks = {
        b: {1.0: {"output_tokens_per_s": [v], "tokens_per_user": [50.0]}}
        for b, v in ((1, 100.0), (2, 110.0), (3, 400.0))
    }
    (row,) = figures.absolute({"a": blocks})
    assert row["output_tokens_per_s"] == 110.0
    (point,) = figures.pareto({"a": blocks})["points"]
    assert point["tokens_per_s"][0] == 110.0 and point["blocks"] == 3
    base = {b: {1.0: {"output_tokens_per_s": [100.0]}} for b in blocks}
    (r,) = [x for x in analysis.ratios({"a": base, "b": blocks}, "a") if x.arm == "b"]
    assert r.ratio == pytest.approx(1.1)
    doc = {
        "baseline": "a",
        "arms": [{"name": "a"}],
        "schedule": [],
        "absolute": [row],
        "tpot_judged_on": {"1": "tpot_ms.p50"},
    }
    titles = {t.id: t.title for t in exp_report.tables(doc)}
    assert titles["arms"] == (
        "Every arm at every level: the median over valid blocks of each block's mean"
    )
    assert "95% block-bootstrap intervals" in titles["ratios"]


def cell(table: Any, column: str, row: int = 0) -> str:
    """The cell of ``table``'s ``row`` under the column titled ``column``."""
    titles = [c.title for c in table.columns]
    return str(table.rows[row][titles.index(column)])


def test_an_earlier_experiment_json_renders_as_what_it_computed() -> None:
    """An experiment.json written before issue 49: TPOT as the stored p50, the table's
    figure a mean, verdicts from any number of blocks; the report says so, not the rule."""
    comparison = {"arm": "b", "baseline": "a", "concurrency": 4.0, "blocks": 2,
                  "metric": "tpot_ms_p50", "ratio": 0.54, "ci95": [0.53, 0.55],
                  "verdict": "better"}  # fmt: skip
    row = {"arm": "b", "level": 4.0, "output_tokens_per_s": 240.0, "tpot_ms_p50": 5.0,
           "output_tokens_per_s_per_accelerator": None, "blocks": 2}  # fmt: skip
    doc = {"baseline": "a", "arms": [{"name": "a"}, {"name": "b"}], "schedule": [],
           "comparisons": [comparison], "absolute": [row], "blocks": 2, "design": "williams",
           "seed": 0, "variable": []}  # fmt: skip
    tables = {t.id: t for t in exp_report.tables(doc)}
    assert tables["arms"].title.endswith("the mean over valid blocks of each block's mean")
    assert cell(tables["arms"], "TPOT p50 (ms)") == "5.00"
    assert cell(tables["ratios"], "Metric") == "TPOT p50 (ms)"
    assert "valid blocks" not in tables["ratios"].note and "orders" not in tables
    assert not any("no verdict" in s for s in exp_report.sentences(doc))
    assert "TPOT p50 (ms)" in exp_report.comparison_line(comparison, "concurrency")
