"""The report shows TTFT per conversation turn (issue 36: "TTFT is reported per turn"):
before, ``ttft_ms_by_turn`` was in results.json only."""

from __future__ import annotations

from pathlib import Path

import pytest

from servebook.console import print_points
from servebook.report.render import build_report, to_markdown
from servebook.report.tables import load_runs
from servebook.results.schema import Latency
from servebook.results.store import ResultsWriter, load_results
from tests.unit.conftest import a_point, a_provenance


def conversation_point(rep: int, first: float, later: float) -> object:
    by = {"1": Latency.of([first] * 10), "2": Latency.of([later] * 10)}
    return a_point(2, rep).model_copy(update={"ttft_ms_by_turn": by})


def test_a_run_of_conversations_gets_a_ttft_table_by_turn(tmp_path: Path) -> None:
    with ResultsWriter(tmp_path / "conv", a_provenance(workload={"multi_turn": True})) as w:
        w.add(conversation_point(0, 40.0, 12.0))  # type: ignore[arg-type]
        w.add(conversation_point(1, 44.0, 14.0))  # type: ignore[arg-type]
    report = build_report(load_runs([tmp_path / "conv"]))
    assert report.turns is not None and report.turns in report.tables
    rows = [(r[1], r[2], r[3].split(" ")[0], r[5]) for r in report.turns.rows]
    assert rows == [("c=2", "1", "42", "20"), ("c=2", "2", "13", "20")]
    assert "Turn 1 is a conversation's first request" in to_markdown(report)


def test_a_run_without_conversations_has_no_turn_table(tmp_path: Path) -> None:
    with ResultsWriter(tmp_path / "plain", a_provenance()) as w:
        w.add(a_point(2, 0))
    assert build_report(load_runs([tmp_path / "plain"])).turns is None


def test_the_bench_table_shows_each_points_speculative_acceptance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 36: acceptance reported per point next to throughput (it was in the report's
    validity table per level only)."""
    spec = a_point(1, 0).model_copy(update={"server": {"spec_acceptance": 0.85}})
    with ResultsWriter(tmp_path / "spec", a_provenance()) as w:
        w.add(spec)
        w.add(a_point(2, 0))
    print_points(load_results(tmp_path / "spec" / "results.json"), tmp_path / "spec")
    rows = [line for line in capsys.readouterr().out.splitlines() if "c=" in line]
    assert "85%" in rows[0] and "85%" not in rows[1], rows
