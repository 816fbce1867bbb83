"""A report's figures per run and load level: per-accelerator division, invalid points
kept out of every figure, honest formatting of intervals, and input that names the bad
file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servebook.errors import UsageError
from servebook.report.tables import (
    NA,
    Level,
    fmt_interval,
    invalid_table,
    levels,
    load_runs,
    throughput_table,
    validity_table,
)
from servebook.results.stats import Interval, mean_ci
from tests.unit.result_runs import CPU, RERUN, A, B


def level(run_dir: Path, label: str) -> Level:
    (run,) = load_runs([run_dir])
    return next(lv for lv in levels(run) if lv.label == label)


def test_per_accelerator_figures_divide_by_the_deployments_accelerators() -> None:
    # B is PD on 4 of the host's 8 GPUs: per accelerator = absolute / 4, not / 8.
    lv = level(B, "c=1")
    assert lv.run.accelerators == 4
    assert lv.values("output_tokens_per_s") == [110.0, 112.0, 108.0]
    assert lv.values("output_tokens_per_s_per_accelerator") == [27.5, 28.0, 27.0]
    req = lv.figure("requests_per_s")
    per = lv.figure("requests_per_s_per_accelerator")
    assert req.mean is not None and req.half_width is not None
    assert per.mean == pytest.approx(req.mean / 4)
    assert per.half_width == pytest.approx(req.half_width / 4)
    a = level(A, "c=1")
    assert a.figure("output_tokens_per_s_per_accelerator").mean == pytest.approx(50.0)


def test_per_accelerator_is_na_when_the_count_is_unknown() -> None:
    runs = load_runs([A, CPU])
    assert runs[1].accelerators is None
    t = throughput_table(runs)
    rows = [r for r in t.rows if r[0] == runs[1].label]
    assert rows and all(r[4] == NA and r[6] == NA for r in rows)
    assert all(r[3] != NA and r[5] != NA for r in rows)  # absolute figures are there


def test_invalid_points_are_listed_and_never_averaged_in() -> None:
    lv = level(B, "c=16")
    assert [p.repetition for p in lv.invalid] == [2]
    assert lv.values("output_tokens_per_s") == [1500.0, 1540.0]  # not 9999
    assert lv.figure("output_tokens_per_s").mean == pytest.approx(1520.0)
    runs = load_runs([B])
    v = validity_table(runs)
    row16 = next(r for r in v.rows if r[1] == "c=16")
    assert row16[2] == "2/3" and row16[3] == "1 invalid (excluded)"
    inv = invalid_table(runs)
    assert len(inv.rows) == 1
    assert inv.rows[0][:3] == ["vllm-pd", "c=16", "2"]
    assert inv.rows[0][3].startswith("SB403: 300 of 4987 requests failed")


def test_server_evidence_is_shown_per_level() -> None:
    runs = load_runs([B, CPU])
    v = validity_table(runs)
    pd = next(r for r in v.rows if r[0] == "vllm-pd" and r[1] == "c=1")
    assert pd[5].startswith("97.00%") and pd[6] == NA  # handoff share, no speculation
    cpu = next(r for r in v.rows if r[0] == "tiny-pd-spec" and r[1] == "c=1")
    assert cpu[5].startswith("90.0%") and cpu[6].startswith("42.0")


def test_an_interval_is_never_shown_with_one_repetition() -> None:
    assert fmt_interval(mean_ci([101.0])) == "101.0 (n=1, no CI)"
    assert fmt_interval(mean_ci([])) == NA
    assert fmt_interval(Interval(None, None, None, 0)) == NA
    # Half-width to two significant digits, mean to the same decimal place.
    assert fmt_interval(mean_ci([100, 102, 98])) == "100.0 ± 5.0"
    assert fmt_interval(mean_ci([1200, 1230, 1170])) == "1,200 ± 75"
    assert fmt_interval(mean_ci([0.5, 0.6]), percent=True) == "55% ± 64%"
    rerun_c1 = level(RERUN, "c=1")
    assert len(rerun_c1.valid) == 1
    assert "no CI" in throughput_table(load_runs([RERUN])).rows[0][5]


def test_levels_are_ordered_concurrency_then_rate() -> None:
    (run,) = load_runs([CPU])
    assert [lv.label for lv in levels(run)] == ["c=1", "c=2", "rate=0.5/s"]


def test_runs_are_labelled_by_recipe_and_told_apart_by_directory() -> None:
    labels = [r.label for r in load_runs([A, B, RERUN])]
    assert labels == ["vllm-mixed (mixed-tp2)", "vllm-pd", "vllm-mixed (mixed-tp2-rerun)"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no results.json in this directory"),
        ('{"schema": "servebook.bench/1", "provenance": ', "not JSON (line 1)"),
        ('{"schema": "guidellm/2", "points": []}', "not a servebook results file"),
        ('{"schema": "servebook.bench/1", "provenance": {}}', "invalid results at provenance"),
    ],
    ids=["no-results-json", "malformed-json", "other-schema", "wrong-shape"],
)
def test_bad_input_names_the_file_and_the_problem(
    tmp_path: Path, content: str | None, message: str
) -> None:
    d = tmp_path / "run"
    d.mkdir()
    if content is not None:
        (d / "results.json").write_text(content)
    with pytest.raises(UsageError) as e:
        load_runs([A, d])
    assert str(d) in str(e.value) and message in str(e.value)


def test_a_results_file_may_be_given_by_its_path() -> None:
    (run,) = load_runs([A / "results.json"])
    assert run.path == A / "results.json"
    doc = json.loads((A / "results.json").read_text())
    assert len(run.results.points) == len(doc["points"])
