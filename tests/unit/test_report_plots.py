"""A report's plots as data: lines and bands from valid repetitions only, invalid points
drawn apart with their checks, per-accelerator panels that never divide by a guess, and a
Pareto view; drawing gives the same bytes for the same data."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from servebook.report.plots import PlotSpec, Series, draw, pareto_plot, plot_specs
from servebook.report.tables import load_runs
from tests.unit.result_runs import CPU, RERUN, A, B, invalid_level, variant


def spec(specs: list[PlotSpec], id: str) -> PlotSpec:
    return next(s for s in specs if s.id == id)


def series(s: PlotSpec, panel: int, label: str) -> Series:
    return next(x for x in s.panels[panel].series if x.label == label)


def test_invalid_points_are_not_on_lines_but_marked_with_their_checks() -> None:
    specs = plot_specs(load_runs([A, B]))
    tp = spec(specs, "throughput")
    pd = series(tp, 0, "vllm-pd")
    assert pd.x == [1.0, 4.0, 16.0]
    assert pd.y[2] == pytest.approx(1520.0)  # mean of the valid 1500 and 1540
    assert 9999.0 not in pd.y and all(h < 9999.0 for h in pd.high)
    (mark,) = tp.panels[0].invalid
    assert (mark.run, mark.level, mark.repetition) == ("vllm-pd", "c=16", 2)
    assert (mark.x, mark.y, mark.checks) == (16.0, 9999.0, "SB403")
    # The same point in the latency plots: 30 ms TPOT, off the line, marked.
    tpot = spec(specs, "tpot")
    assert series(tpot, 0, "vllm-pd").y[2] == pytest.approx(10.1)
    assert [m.y for m in tpot.panels[0].invalid] == [30.0]
    # And in the Pareto view.
    par = spec(specs, "pareto")
    assert all(y < 9999 / 4 for s in par.panels[0].series for y in s.y)
    assert [m.checks for m in par.panels[0].invalid] == ["SB403"]


def test_a_level_without_valid_repetitions_is_a_gap(tmp_path: Path) -> None:
    d = variant(tmp_path, A, "a", invalid_level(4, "SB402: 3 requests, 40 required"))
    tp = spec(plot_specs(load_runs([d])), "throughput")
    s = tp.panels[0].series[0]
    assert s.x == [1.0, 4.0, 16.0] and math.isnan(s.y[1])  # a break in the line
    assert [(m.level, m.checks) for m in tp.panels[0].invalid] == [("c=4", "SB402")] * 3


def test_one_valid_repetition_is_not_a_measurement_so_a_gap_not_a_point() -> None:
    """Before: one valid repetition was drawn as a point without a band (issue 32,
    finding 3: it is not a measurement, shown as such and never drawn as a figure)."""
    tp = spec(plot_specs(load_runs([RERUN])), "throughput")
    s = tp.panels[0].series[0]
    assert math.isnan(s.y[0]) and math.isnan(s.low[0]) and math.isnan(s.high[0])
    assert "not a measurement, left as gaps" in tp.panels[0].note
    assert [m.repetition for m in tp.panels[0].invalid] == [1, 2]


def test_per_accelerator_panels_leave_out_runs_without_a_count() -> None:
    tp = spec(plot_specs(load_runs([B, CPU])), "throughput")
    absolute, per_acc = tp.panels[0], tp.panels[1]
    assert [s.label for s in absolute.series] == ["vllm-pd", "tiny-pd-spec"]
    assert [s.label for s in per_acc.series] == ["vllm-pd"]
    assert "tiny-pd-spec" in per_acc.note and "accelerator count unknown" in per_acc.note
    pd_abs, pd_acc = absolute.series[0], per_acc.series[0]
    assert pd_acc.y == pytest.approx([y / 4 for y in pd_abs.y])


def test_pareto_is_per_accelerator_against_per_user_speed() -> None:
    par = pareto_plot(load_runs([A, B, CPU]))
    panel = par.panels[0]
    assert panel.ylabel == "Output tokens/s per accelerator"
    assert "tiny-pd-spec" in panel.note  # left out, said so
    a = next(s for s in panel.series if s.label.startswith("vllm-mixed"))
    assert a.point_labels == ["c=1", "c=4", "c=16"]
    assert a.y == pytest.approx([50.0, 190.0, 600.0])
    # Per user: 1000 / median TPOT, averaged over repetitions (TPOT 8.0, 8.1, 7.9 at c=1).
    assert a.x[0] == pytest.approx((1000 / 8.0 + 1000 / 8.1 + 1000 / 7.9) / 3)
    cpu_only = pareto_plot(load_runs([CPU])).panels[0]
    assert cpu_only.ylabel == "Output tokens/s (absolute)"
    assert cpu_only.series[0].point_labels == ["c=1", "c=2", "rate=0.5/s"]


def test_rate_levels_get_their_own_plots() -> None:
    ids = [s.id for s in plot_specs(load_runs([CPU]))]
    assert ids == [
        "throughput",
        "tpot",
        "ttft",
        "throughput-rate",
        "tpot-rate",
        "ttft-rate",
        "pareto",
    ]
    assert "throughput-rate" not in [s.id for s in plot_specs(load_runs([A]))]


def test_drawing_gives_png_and_svg_and_the_same_bytes_twice() -> None:
    par = pareto_plot(load_runs([A, B]))
    png, svg = draw(par)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    text = svg.decode()
    assert "<svg" in text and "Pareto view" in text and "SB403" in text
    assert draw(par) == (png, svg)


def test_concurrency_is_a_log2_axis_with_ticks_only_at_the_measured_levels() -> None:
    specs = plot_specs(load_runs([A, CPU]))
    for id in ("throughput", "tpot", "ttft"):
        s = spec(specs, id)
        # Every level any run measured, and nothing in between: 1, 2 (CPU), 4, 16 (A).
        assert s.logx and s.xticks == [1.0, 2.0, 4.0, 16.0], id
    # Two levels a factor 2 apart are still on a log2 axis; rates keep a linear one.
    cpu = plot_specs(load_runs([CPU]))
    assert spec(cpu, "throughput").xticks == [1.0, 2.0]
    assert not spec(cpu, "throughput-rate").logx


def test_drawn_axis_has_no_ticks_but_the_levels() -> None:
    from matplotlib.figure import Figure

    from servebook.report.plots import _draw_panel

    s = spec(plot_specs(load_runs([A])), "throughput")
    ax = Figure().subplots()
    _draw_panel(ax, s, s.panels[0])
    assert ax.get_xscale() == "log"
    assert list(ax.get_xticks()) == [1.0, 4.0, 16.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "16"]
    assert list(ax.get_xticks(minor=True)) == []


def test_per_accelerator_panels_are_absent_when_no_run_knows_its_count() -> None:
    tp = spec(plot_specs(load_runs([CPU])), "throughput")
    assert [p.title for p in tp.panels] == ["Output tokens/s", "Requests/s"]
    assert "per accelerator" not in tp.title and "per accelerator" not in tp.caption.lower()
