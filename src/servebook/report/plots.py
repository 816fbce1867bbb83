"""A report's plots: first as plain data (:class:`PlotSpec`, what is drawn where, testable
without drawing), then drawn with matplotlib into PNG and SVG bytes.

* lines and CI bands are the means and 95% intervals over each level's *valid*
  repetitions; a level with none leaves a gap in the line, never a point;
* every invalid point is drawn apart, as a red cross labelled with its run, repetition and
  the checks it failed (``SB403``), so it can be seen and never be read as a measurement;
* the Pareto view plots output tokens/s per accelerator against output tokens/s per user
  (1000 / median TPOT): moving right is a faster experience for each user, moving up is
  more work from each accelerator.  When a run's accelerator count is unknown (a CPU
  deployment) the view uses absolute tokens/s for every run and says so on its axis.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from servebook.report.tables import (
    METRICS,
    Level,
    Metric,
    Mode,
    Run,
    any_accelerators,
    levels,
    tokens_per_user,
)
from servebook.results import stats
from servebook.results.schema import Point
from servebook.results.tpot import PER_TOKEN

NAN = float("nan")


@dataclass
class Series:
    """One run's line: ``y`` is NaN at a level without valid repetitions (a gap)."""

    label: str
    color: int  # index into the colour cycle: a run keeps its colour in every plot
    x: list[float]
    y: list[float]
    low: list[float]  # CI band (NaN: no interval, fewer than 2 valid repetitions)
    high: list[float]
    x_low: list[float] = field(default_factory=list)  # Pareto only: CI of x
    x_high: list[float] = field(default_factory=list)
    point_labels: list[str] = field(default_factory=list)
    # Per x: the level is imprecise (a precision target it did not reach): drawn hollow.
    imprecise: list[bool] = field(default_factory=list)


@dataclass(frozen=True)
class InvalidMark:
    run: str
    color: int
    level: str
    repetition: int
    x: float
    y: float
    checks: str  # "SB401,SB403"
    reasons: tuple[str, ...]


@dataclass
class Panel:
    title: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    invalid: list[InvalidMark] = field(default_factory=list)
    note: str = ""


@dataclass
class PlotSpec:
    id: str
    title: str
    xlabel: str
    panels: list[Panel]
    caption: str
    logx: bool = False
    ncols: int = 2
    xticks: list[float] = field(default_factory=list)  # log axes: only the measured levels


def check_ids(p: Point) -> str:
    return ",".join(r.split(":", 1)[0].strip() for r in p.invalid_reasons) or "invalid"


def _nan(v: float | None) -> float:
    return NAN if v is None else float(v)


def _invalid_marks(
    run: Run,
    color: int,
    lvs: Sequence[Level],
    fx: Callable[[Level, Point], float | None],
    fy: Callable[[Point], float | None],
) -> list[InvalidMark]:
    out = []
    for lv in lvs:
        for p in sorted(lv.invalid, key=lambda p: p.repetition):
            x, y = fx(lv, p), fy(p)
            if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)):
                continue  # nothing measurable to mark (listed in the invalid table)
            out.append(
                InvalidMark(
                    run.label,
                    color,
                    lv.label,
                    p.repetition,
                    x,
                    y,
                    check_ids(p),
                    tuple(p.invalid_reasons),
                )
            )
    return out


NO_FIGURE = stats.Interval(None, None, None, 0)


def _of(m: Metric, run: Run) -> Callable[[Point], float | None]:
    return lambda p: m.value(p, run)


def _metric_panel(runs: Sequence[Run], mode: Mode, metric: str) -> Panel:
    m = METRICS[metric]
    panel = Panel(m.title, f"{m.title} ({m.unit})" if m.unit else m.title)
    missing: list[str] = []
    unmeasured: list[str] = []
    for i, run in enumerate(runs):
        lvs = [lv for lv in levels(run) if lv.mode == mode]
        if not lvs:
            continue
        if not any(m.value(p, run) is not None for lv in lvs for p in lv.points):
            missing.append(run.label)
            continue
        # A level that is not a measurement (``results.measurement``) is a gap, never a figure.
        figs = [lv.figure(metric) if not lv.not_measured else NO_FIGURE for lv in lvs]
        unmeasured += [f"{run.label} {lv.label}" for lv in lvs if lv.not_measured]
        panel.series.append(
            Series(
                run.label,
                i,
                [lv.value for lv in lvs],
                [_nan(f.mean) for f in figs],
                [_nan(f.low) for f in figs],
                [_nan(f.high) for f in figs],
                imprecise=[lv.imprecise for lv in lvs],
            )
        )
        panel.invalid += _invalid_marks(run, i, lvs, lambda lv, _p: lv.value, _of(m, run))
    if missing:
        why = "accelerator count unknown" if metric.endswith("_per_accelerator") else "not recorded"
        if metric.partition(".")[0] in PER_TOKEN:
            why = "its engine's histogram leads, and places a percentile only within a bucket"
        panel.note = f"n/a for {', '.join(missing)}: {why}"
    if unmeasured:
        gap = f"not a measurement, left as gaps: {', '.join(unmeasured)}"
        panel.note = f"{panel.note}; {gap}" if panel.note else gap
    return panel


_XLABEL = {"concurrency": "Concurrency (requests in flight)", "rate": "Offered rate (requests/s)"}
_BAND = "Lines: mean over valid repetitions; bands: 95% CI (Student t)."
_INVALID = (
    "Red crosses: invalid points, labelled with the checks they failed, excluded from lines "
    "and bands."
)
IMPRECISE = (
    "Hollow markers: imprecise levels (repeated up to the cap, their 95% interval still "
    "wider than the precision target)."
)


def _with_imprecise(spec: PlotSpec) -> PlotSpec:
    """Say in the caption what hollow markers mean, when the plot has any."""
    if any(any(s.imprecise) for p in spec.panels for s in p.series):
        spec.caption = f"{spec.caption} {IMPRECISE}"
    return spec


def measured_levels(runs: Sequence[Run], mode: Mode) -> list[float]:
    """Every load level of ``mode`` any run measured (valid or not), ascending."""
    return sorted({lv.value for r in runs for lv in levels(r) if lv.mode == mode})


def _logx(runs: Sequence[Run], mode: Mode) -> bool:
    """Concurrency levels are powers of two in practice and their effect is
    multiplicative: always a log2 axis (when every level is positive).  Rates only when
    they span a factor of 8."""
    xs = measured_levels(runs, mode)
    if not xs or min(xs) <= 0 or len(xs) < 2:
        return False
    return mode == "concurrency" or max(xs) / min(xs) >= 8


def _axis(runs: Sequence[Run], mode: Mode) -> dict[str, Any]:
    logx = _logx(runs, mode)
    return {"logx": logx, "xticks": measured_levels(runs, mode) if logx else []}


def throughput_plot(runs: Sequence[Run], mode: Mode) -> PlotSpec:
    """Absolute and per-accelerator panels; the per-accelerator ones only when some run
    knows its accelerator count (the report says once why they are absent)."""
    per_acc = any_accelerators(runs)
    keys: tuple[str, ...] = ("output_tokens_per_s", "requests_per_s")
    if per_acc:
        keys = (
            "output_tokens_per_s",
            "output_tokens_per_s_per_accelerator",
            "requests_per_s",
            "requests_per_s_per_accelerator",
        )
    return PlotSpec(
        "throughput" + ("" if mode == "concurrency" else "-rate"),
        f"Throughput vs {mode}: absolute (left) and per accelerator (right)"
        if per_acc
        else f"Throughput vs {mode}",
        _XLABEL[mode],
        [_metric_panel(runs, mode, k) for k in keys],
        f"{_BAND} {_INVALID}"
        + (" Per accelerator = absolute / accelerators the deployment uses." if per_acc else ""),
        **_axis(runs, mode),
    )


def latency_plot(runs: Sequence[Run], mode: Mode, name: str) -> PlotSpec:
    """p50 left, p99 right; TPOT's left panel draws each level's judged TPOT
    (``results.tpot``): the engine's exact mean where its histogram leads, never a p50
    interpolated inside a bucket, and the note names those runs."""
    title = {"tpot": "TPOT", "ttft": "TTFT"}[name]
    panels = [_metric_panel(runs, mode, f"{name}_ms.{q}") for q in ("p50", "p99")]
    if name == "tpot":
        panels[0] = _metric_panel(runs, mode, "tpot")
        panels[0].title = panels[0].ylabel = "TPOT p50 (ms)"
        led = [r.label for r in runs if any(lv.key("tpot") != "tpot_ms.p50" for lv in levels(r))]
        if led:
            panels[0].note = (
                f"{', '.join(led)}: the engine's exact mean (its histogram led TPOT: the "
                "client's per-token timing was wrong), not a p50"
            )
    return PlotSpec(
        name + ("" if mode == "concurrency" else "-rate"),
        f"{title} vs {mode} (p50 left, p99 right)",
        _XLABEL[mode],
        panels,
        f"{_BAND} {_INVALID}",
        **_axis(runs, mode),
    )


def pareto_view(
    series: Sequence[Series],
    *,
    per_accelerator: bool,
    left_out: Sequence[str] = (),
    invalid: Sequence[InvalidMark] = (),
    caption: str = "Each point is a load level (mean over valid repetitions, 95% CI bars); "
    f"up and to the right is better on both. {_INVALID}",
) -> PlotSpec:
    """The Pareto view (a report's, an experiment's): output tokens/s per accelerator, or
    absolute where no series has an accelerator count (the panel's title and axis say so),
    against output tokens/s per user; ``left_out`` names the series without a count when
    others have one (never divided by something else)."""
    panel = Panel(
        "Throughput per accelerator vs speed per user"
        if per_accelerator
        else "Throughput vs speed per user (absolute: no accelerator counts)",
        "Output tokens/s per accelerator" if per_accelerator else "Output tokens/s (absolute)",
        list(series),
        list(invalid),
    )
    if left_out:
        panel.note = f"n/a for {', '.join(left_out)}: accelerator count unknown"
    return PlotSpec(
        "pareto",
        "Pareto view: output tokens/s per accelerator vs per user",
        "Output tokens/s per user (1000 / median TPOT in ms)",
        [panel],
        caption,
        ncols=1,
    )


def pareto_plot(runs: Sequence[Run]) -> PlotSpec:
    """Per-accelerator throughput for every run whose accelerator count is known (the
    others are named in a note, never divided by something else); absolute throughput
    only when no run has one (CPU deployments)."""
    known = [r for r in runs if r.accelerators]
    per_acc = bool(known)
    metric = "output_tokens_per_s_per_accelerator" if per_acc else "output_tokens_per_s"
    m = METRICS[metric]
    left_out = [r.label for r in runs if per_acc and not r.accelerators]
    series: list[Series] = []
    invalid: list[InvalidMark] = []
    for i, run in enumerate(runs):
        if run.label in left_out:
            continue
        lvs = levels(run)
        fy = [lv.figure(metric) for lv in lvs]
        fx = [lv.figure(tokens_per_user) for lv in lvs]
        keep = [
            j
            for j in range(len(lvs))
            if fy[j].mean is not None and fx[j].mean is not None and not lvs[j].not_measured
        ]
        series.append(
            Series(
                run.label,
                i,
                [_nan(fx[j].mean) for j in keep],
                [_nan(fy[j].mean) for j in keep],
                [_nan(fy[j].low) for j in keep],
                [_nan(fy[j].high) for j in keep],
                [_nan(fx[j].low) for j in keep],
                [_nan(fx[j].high) for j in keep],
                [lvs[j].label for j in keep],
                imprecise=[lvs[j].imprecise for j in keep],
            )
        )
        invalid += _invalid_marks(run, i, lvs, lambda _lv, p: tokens_per_user(p), _of(m, run))
    return pareto_view(series, per_accelerator=per_acc, left_out=left_out, invalid=invalid)


def plot_specs(runs: Sequence[Run]) -> list[PlotSpec]:
    """Every plot of a report, in the order it shows them."""
    modes: list[Mode] = [
        m for m in ("concurrency", "rate") if any(lv.mode == m for r in runs for lv in levels(r))
    ]
    out: list[PlotSpec] = []
    for mode in modes:
        out += [
            throughput_plot(runs, mode),
            latency_plot(runs, mode, "tpot"),
            latency_plot(runs, mode, "ttft"),
        ]
    if runs:
        out.append(pareto_plot(runs))
    return [_with_imprecise(p) for p in out]


# --- drawing -------------------------------------------------------------------------------

COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
)
INVALID_COLOR = "#d62728"


def _color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def draw(spec: PlotSpec) -> tuple[bytes, bytes]:
    """The plot as (PNG, SVG) bytes.  Uses matplotlib's object API (no pyplot state) and
    strips dates and versions from the files so the same data gives the same bytes."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    n = len(spec.panels)
    ncols = min(spec.ncols, n)
    nrows = math.ceil(n / ncols)
    with matplotlib.rc_context({"svg.hashsalt": "servebook", "svg.fonttype": "none"}):
        width = 5.6 * ncols if ncols > 1 else 9.0
        fig = Figure(figsize=(width, 3.9 * nrows + 0.7), layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        for ax, panel in zip(axes, spec.panels, strict=False):
            _draw_panel(ax, spec, panel)
        for ax in axes[n:]:
            ax.set_visible(False)
        fig.suptitle(spec.title, fontsize=12)
        footer = invalid_footer(spec)
        if footer:
            handle = Line2D([], [], color=INVALID_COLOR, marker="x", linestyle="none", markersize=8)
            fig.legend(
                [handle],
                ["invalid, excluded (triangle: off scale):\n" + "\n".join(_capped(footer))],
                loc="outside lower left",
                fontsize=8,
                frameon=False,
            )
        png, svg = io.BytesIO(), io.BytesIO()
        fig.savefig(png, format="png", dpi=100, metadata={"Software": None})
        fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": "servebook"})
    return png.getvalue(), svg.getvalue()


def _draw_panel(ax: object, spec: PlotSpec, panel: Panel) -> None:
    from matplotlib.axes import Axes

    assert isinstance(ax, Axes)
    pareto = spec.id == "pareto"
    for s in panel.series:
        c = _color(s.color)
        if pareto:
            yerr = [
                [y - lo if math.isfinite(lo) else 0.0 for y, lo in zip(s.y, s.low, strict=True)],
                [hi - y if math.isfinite(hi) else 0.0 for y, hi in zip(s.y, s.high, strict=True)],
            ]
            xerr = [
                [x - lo if math.isfinite(lo) else 0.0 for x, lo in zip(s.x, s.x_low, strict=True)],
                [hi - x if math.isfinite(hi) else 0.0 for x, hi in zip(s.x, s.x_high, strict=True)],
            ]
            ax.errorbar(
                s.x, s.y, yerr=yerr, xerr=xerr, color=c, marker="o", capsize=3, label=s.label
            )
            for x, y, t in zip(s.x, s.y, s.point_labels, strict=True):
                ax.annotate(t, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
            _draw_imprecise(ax, s, c)
        else:
            ax.plot(s.x, s.y, color=c, marker="o", label=s.label)
            _draw_imprecise(ax, s, c)
            ax.fill_between(s.x, s.low, s.high, color=c, alpha=0.2, linewidth=0)
            # Bars as well as the band: a level alone (or between gaps) has no band to show.
            bars = [
                [y - lo if math.isfinite(lo) else NAN for y, lo in zip(s.y, s.low, strict=True)],
                [hi - y if math.isfinite(hi) else NAN for y, hi in zip(s.y, s.high, strict=True)],
            ]
            ax.errorbar(s.x, s.y, yerr=bars, fmt="none", ecolor=c, capsize=3, alpha=0.8)
    _draw_invalid(ax, panel, bottom_zero=not pareto)
    if spec.logx:
        from matplotlib.ticker import NullLocator

        ax.set_xscale("log", base=2)
        xs = spec.xticks or sorted({x for s in panel.series for x in s.x})
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.xaxis.set_minor_locator(NullLocator())  # ticks only at the measured levels
    title = panel.title + (f"\n{panel.note}" if panel.note and panel.series else "")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(spec.xlabel, fontsize=9)
    ax.set_ylabel(panel.ylabel, fontsize=9)
    ax.grid(True, alpha=0.3)
    if not pareto:
        ax.set_ylim(bottom=0)
    if panel.series:
        ax.legend(fontsize=8)
    if not panel.series:
        ax.text(0.5, 0.5, panel.note or "no data", transform=ax.transAxes, ha="center")


def _draw_imprecise(ax: Any, s: Series, color: str) -> None:
    """Imprecise levels as hollow markers over the line's filled ones."""
    pts = [(x, y) for x, y, bad in zip(s.x, s.y, s.imprecise, strict=False) if bad]
    if pts:
        ax.plot(
            [x for x, _ in pts],
            [y for _, y in pts],
            linestyle="none",
            marker="o",
            markersize=9,
            markerfacecolor="white",
            markeredgecolor=color,
            markeredgewidth=2,
        )


def _draw_invalid(ax: Any, panel: Panel, *, bottom_zero: bool) -> None:
    """Red crosses for invalid points, each labelled with the checks it failed (the
    figure's footer lists them in full).  The axis is scaled to the valid data: an invalid
    point far above it (a broken window's absurd figure) sits at the top edge as a
    triangle, so it cannot squash the lines."""
    ys = [v for s in panel.series for v in (*s.y, *s.high) if math.isfinite(v)]
    top = max(ys) * 1.15 if ys and max(ys) > 0 else None
    labelled: set[tuple[float, float]] = set()
    for mk in panel.invalid:
        y = mk.y
        if top is not None and mk.y > top:
            y = top
            ax.plot([mk.x], [y], marker="^", markersize=9, color=INVALID_COLOR)
        else:
            ax.plot([mk.x], [y], marker="x", markersize=9, mew=2, color=INVALID_COLOR)
        if (mk.x, y) not in labelled:
            labelled.add((mk.x, y))
            ax.annotate(
                mk.checks,
                (mk.x, y),
                textcoords="offset points",
                xytext=(6, 4),
                fontsize=7,
                color=INVALID_COLOR,
            )
    if top is not None:
        ax.set_ylim(bottom=0 if bottom_zero else None, top=top * 1.05)


def _capped(lines: list[str], n: int = 6) -> list[str]:
    if len(lines) <= n:
        return lines
    return [*lines[:n], f"... and {len(lines) - n} more (see the invalid points table)"]


def invalid_footer(spec: PlotSpec) -> list[str]:
    """One line per invalid point in the figure: run, level, repetition, checks, value."""
    seen: dict[tuple[str, str, int], str] = {}
    for panel in spec.panels:
        for mk in panel.invalid:
            key = (mk.run, mk.level, mk.repetition)
            if key not in seen:
                seen[key] = f"{mk.run} {mk.level} rep {mk.repetition}: {mk.checks}"
    return list(seen.values())
