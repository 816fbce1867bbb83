"""What a report's tables say: runs loaded from Results files, their figures per load
level, and the tables built from them as plain data (``render.py`` writes them).

Every figure of a load level is the mean over the level's *valid* repetitions with a
Student-t 95% interval (``stats.mean_ci``, the method ``results.aggregate`` uses); an
invalid point is listed with its reasons and never averaged in (MLPerf LoadGen's VALID /
INVALID).  Per-accelerator figures divide by the accelerators the deployment uses
(``provenance.accelerators_used``, the Plan's GPUs, not the host's); where that is unknown
(a CPU deployment) they are ``n/a``, never divided by something else.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from servebook.errors import UsageError
from servebook.results import stats
from servebook.results.evidence import one_source
from servebook.results.measurement import not_a_measurement
from servebook.results.provenance import servebook_of
from servebook.results.schema import RESULTS_NAME, LevelPrecision, Point, Results
from servebook.results.store import load_results
from servebook.results.tpot import (
    PER_TOKEN,
    bucket_label,
    bucket_span,
    engine_led,
    figure,
    judged,
    judged_key,
)

Better = Literal["higher", "lower"]
Mode = Literal["concurrency", "rate"]

# --- runs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One benchmark run: a results file and the name the report gives it."""

    label: str
    path: Path  # the results.json
    results: Results

    @property
    def accelerators(self) -> int | None:
        """Accelerators the deployment uses; ``None`` when unknown or zero (CPU)."""
        n = self.results.provenance.accelerators_used
        return n if n else None

    @property
    def recipe(self) -> str | None:
        t = self.results.provenance.target
        name = t.get("recipe") or t.get("deployment")
        return str(name) if name else None

    @property
    def topology(self) -> str | None:
        t = self.results.provenance.target
        if t.get("topology"):
            return str(t["topology"])
        names = {r.name for r in self.results.provenance.roles}
        if {"prefill", "decode"} <= names:
            return "pd"
        if "mixed" in names:
            return "mixed"
        return None


def results_file(path: str | Path) -> Path:
    """``DIR`` -> ``DIR/results.json``; a path to a file is taken as is."""
    p = Path(path)
    if p.is_dir():
        f = p / RESULTS_NAME
        if not f.is_file():
            raise UsageError(
                f"{p}: no {RESULTS_NAME} in this directory; give a directory written by "
                f"`servebook bench -o DIR` (or the path of a results file)"
            )
        return f
    if not p.exists():
        raise UsageError(f"{p}: no such results directory or file")
    return p


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Load every results file (``UsageError`` naming the file on the first bad one) and
    label the runs: the recipe (or deployment) name when that tells them apart, else the
    directory name, else the whole path."""
    if not paths:
        raise UsageError("give at least one results directory")
    files = [results_file(p) for p in paths]
    # Redacted as a report shows them, also a file written before servebook redacted it.
    loaded = [(f, load_results(f).redacted()) for f in files]
    seen: set[Path] = set()
    for f, _ in loaded:
        if f.resolve() in seen:
            raise UsageError(f"{f}: given twice")
        seen.add(f.resolve())
    recipes = [
        (r.provenance.target.get("recipe") or r.provenance.target.get("deployment") or None)
        for _, r in loaded
    ]
    dirs = [f.parent.name or str(f.parent) for f, _ in loaded]
    labels: list[str] = []
    for (f, _), recipe, d in zip(loaded, recipes, dirs, strict=True):
        if recipe and recipes.count(recipe) == 1:
            labels.append(str(recipe))
        elif dirs.count(d) == 1:
            labels.append(f"{recipe} ({d})" if recipe else d)
        else:
            labels.append(str(f.parent))
    return [Run(lbl, f, r) for (f, r), lbl in zip(loaded, labels, strict=True)]


# --- metrics -------------------------------------------------------------------------------


def _server(p: Point, key: str) -> float | None:
    v = (p.server or {}).get(key)
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def _latency(name: str, q: str) -> Callable[[Point, Run], float | None]:
    return lambda p, _run: figure(p, f"{name}.{q}")


def _field(name: str) -> Callable[[Point, Run], float | None]:
    return lambda p, _run: getattr(p, name)


def _per_acc(name: str) -> Callable[[Point, Run], float | None]:
    def f(p: Point, run: Run) -> float | None:
        v = getattr(p, name)
        return v / run.accelerators if v is not None and run.accelerators else None

    return f


def error_rate(p: Point) -> float | None:
    total = p.requests_ok + p.errors
    return p.errors / total if total else None


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    unit: str
    better: Better | None  # None: evidence, not a figure of merit (never given a verdict)
    value: Callable[[Point, Run], float | None]
    percent: bool = False
    short: str = ""  # for narrow tables (a terminal): "tok/s per acc"
    compared: bool = True  # one of compare's figures (the per-token means: results.tpot)

    @property
    def label(self) -> str:
        return self.short or self.title


METRICS: dict[str, Metric] = {
    m.key: m
    for m in [
        *(
            m
            for key, title, unit in (
                ("requests_per_s", "Requests/s", "req/s"),
                ("output_tokens_per_s", "Output tokens/s", "tok/s"),
            )
            for m in (
                Metric(key, title, unit, "higher", _field(key), short=unit),
                Metric(
                    f"{key}_per_accelerator",
                    f"{title} per accelerator",
                    unit,
                    "higher",
                    _per_acc(key),
                    short=f"{unit} per acc",
                ),
            )
        ),
        *(
            Metric(
                f"{name}.{q}",
                f"{title} {q}",
                "ms",
                "lower",
                _latency(name, q),
                short=f"{title} {q} ms",
            )
            for name, title in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT"))
            for q in ("p50", "p99")
        ),
        # Per-token means are the engine's exact means where its histogram leads (and no
        # figure elsewhere): compared in place of the p50 there (``results.tpot``).
        *(
            Metric(
                f"{n}.mean",
                f"{t} mean",
                "ms",
                "lower",
                _latency(n, "mean"),
                short=f"{t} mean ms",
                compared=False,
            )
            for n, t in (("itl_ms", "ITL"), ("tpot_ms", "TPOT"))
        ),
        # The judged TPOT of a point (``results.tpot.judged``): what plots draw.
        Metric("tpot", "TPOT", "ms", "lower", lambda p, _: judged(p).value, compared=False),
        Metric("error_rate", "Error rate", "", "lower", lambda p, _: error_rate(p), percent=True),
        Metric(
            "handoff_share",
            "PD handoff share",
            "",
            None,
            lambda p, _: _server(p, "handoff_share"),
            percent=True,
        ),
        Metric(
            "spec_acceptance",
            "Speculative acceptance",
            "",
            None,
            lambda p, _: _server(p, "spec_acceptance"),
            percent=True,
        ),
        Metric("preemptions", "Preemptions", "", None, lambda p, _: _server(p, "preemptions")),
    ]
}

# What compare gives a verdict on, in this order.
COMPARED = [k for k, m in METRICS.items() if m.better is not None and m.compared]


def tokens_per_user(p: Point, _run: Run | None = None) -> float | None:
    """Output tokens/s one user sees: 1000 / the point's judged TPOT (ms; its median, or its
    engine's exact mean where the engine's histogram leads: ``results.tpot``), any level."""
    t = judged(p).value
    return 1000.0 / t if t else None


# --- load levels ---------------------------------------------------------------------------


@dataclass
class Level:
    """One load level of one run: its points, valid and invalid."""

    run: Run
    mode: Mode
    value: float
    points: list[Point] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"c={self.value:g}" if self.mode == "concurrency" else f"rate={self.value:g}/s"

    @property
    def valid(self) -> list[Point]:
        return [p for p in self.points if p.valid]

    @property
    def invalid(self) -> list[Point]:
        return [p for p in self.points if not p.valid]

    def key(self, metric: str) -> str:
        """``metric`` as this level judges it: the judged TPOT (``tpot``), or a per-token
        p50, is its engines' exact mean where any valid repetition's histogram leads
        (``results.tpot.judged_key``)."""
        name, _, q = metric.partition(".")
        if metric == "tpot" or (name in PER_TOKEN and q == "p50"):
            return judged_key(self.valid, name if q else "tpot_ms")
        return metric

    def values(self, metric: str | Callable[[Point, Run], float | None]) -> list[float]:
        """The metric's per-repetition values over the *valid* points (``None`` left out)."""
        metric = self.key(metric) if metric == "tpot" else metric
        f = METRICS[metric].value if isinstance(metric, str) else metric
        out = [f(p, self.run) for p in sorted(self.valid, key=lambda p: p.repetition)]
        return [v for v in out if v is not None and math.isfinite(v)]

    def figure(self, metric: str | Callable[[Point, Run], float | None]) -> stats.Interval:
        """Mean and 95% interval over the valid repetitions, cut to what the metric can take
        (every figure here is non-negative; a share is at most 1)."""
        percent = isinstance(metric, str) and METRICS[metric].percent
        return stats.mean_ci(self.values(metric)).within(0.0, 1.0 if percent else None)

    def source(self, metric: str) -> str | None:
        """``"server"`` when a valid repetition's figure for ``metric`` (TPOT, ITL) is the
        engine's histogram, because the client's per-token timing was wrong there
        (``Point.latency_source``); ``None``: the client's."""
        name = metric.split(".")[0]
        served = any(p.latency_source.get(name, "").startswith("server") for p in self.valid)
        return "server" if served else None

    @property
    def precision(self) -> LevelPrecision | None:
        """The level's precision verdict (a run with ``--precision``), from its points."""
        return next((p.precision for p in self.points if p.precision is not None), None)

    @property
    def imprecise(self) -> bool:
        """The level stopped at its repetition cap with an interval wider than the target."""
        return any(p.imprecise for p in self.points)

    @property
    def not_measured(self) -> list[str]:
        """Why the level is not a measurement (``results.measurement``); empty: it is.
        Such a level is shown as such and never drawn as a figure."""
        return not_a_measurement(self.points, self.run.results.provenance.protocol)


def level_key(p: Point) -> tuple[int, float]:
    return (0, float(p.concurrency)) if p.concurrency is not None else (1, float(p.rate or 0.0))


def same_source(la: Level, lb: Level) -> tuple[Level, Level]:
    """Both runs' points of a level with TPOT and ITL from one source (``one_source``):
    a median is never set against another kind of measurement."""
    both = one_source([*la.points, *lb.points])
    return replace(la, points=both[: len(la.points)]), replace(lb, points=both[len(la.points) :])


def levels(run: Run) -> list[Level]:
    """The run's load levels, concurrency levels ascending, then rate levels ascending."""
    out: dict[tuple[int, float], Level] = {}
    for p in run.results.points:
        k = level_key(p)
        if k not in out:
            out[k] = Level(run, "concurrency" if k[0] == 0 else "rate", k[1])
        out[k].points.append(p)
    return [out[k] for k in sorted(out)]


# --- formatting ----------------------------------------------------------------------------

NA = "n/a"


def fmt_num(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return NA
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    if a == 0:
        return "0"
    return f"{x:.3g}"


def fmt_pct(x: float | None, digits: int = 1) -> str:
    if x is None or not math.isfinite(x):
        return NA
    return f"{100 * x:.{digits}f}%"


def fmt_interval(iv: stats.Interval, *, percent: bool = False) -> str:
    """``mean ± half-width`` of the 95% interval, the half-width to two significant
    digits and the mean to the same decimal place; ``(n=1, no CI)`` with one repetition,
    ``n/a`` with none: never a zero-width interval.  An interval cut at a bound its metric
    cannot pass (``Interval.within``) shows both ends: ``193 (0 to 541)``."""
    if iv.mean is None:
        return NA
    if iv.low is None or iv.high is None:
        return f"{fmt_pct(iv.mean) if percent else fmt_num(iv.mean)} (n={iv.n}, no CI)"
    scale, unit = (100.0, "%") if percent else (1.0, "")
    m, lo, hi = iv.mean * scale, iv.low * scale, iv.high * scale
    h = max(hi - m, m - lo)
    if h <= 0 or not math.isfinite(h):
        return f"{fmt_pct(iv.mean) if percent else fmt_num(iv.mean)} ± 0"
    cap = 2 if percent else 6
    decimals = min(cap, max(0, 1 - math.floor(math.log10(h))))
    if round(h, decimals) == 0:
        return f"{m:,.{decimals}f}{unit} ± <{10**-decimals:g}{unit}"
    if abs((hi - m) - (m - lo)) > 1e-9 * h:
        return f"{m:,.{decimals}f}{unit} ({lo:,.{decimals}f} to {hi:,.{decimals}f}{unit})"
    return f"{m:,.{decimals}f}{unit} ± {h:,.{decimals}f}{unit}"


SERVER_MARK = " (server)"
SERVER_NOTE = (
    " '(server)': the client's per-token timing was wrong at that level (its latency "
    "diagnosis: tokens arrived in bursts, or the client was saturated), so the figure is "
    "the engine's own histogram over the window: its exact mean, beside the bucket its "
    "histogram puts the percentile in ('<10 (mean 2.31)'), never a percentile interpolated "
    "inside a bucket; the client's figures are in the server-latency table and the results."
)


def latency_cell(lv: Level, key: str) -> str:
    """A latency figure of a level; where the engine's histogram leads a per-token figure,
    the bucket its percentile lies in and, for the p50, the engine's exact mean."""
    name, _, q = key.partition(".")
    led = [p for p in lv.valid if name in PER_TOKEN and engine_led(p, name)]
    if not led or lv.key(f"{name}.p50") == f"{name}.p50":
        return fmt_interval(lv.figure(key)) + (SERVER_MARK if lv.source(key) else "")
    where = bucket_label(bucket_span(led, name, q))
    if q == "p50":
        where += f" (mean {fmt_interval(lv.figure(f'{name}.mean'))})"
    return where + SERVER_MARK


# --- tables --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    title: str
    numeric: bool = False


@dataclass(frozen=True)
class Table:
    id: str
    title: str
    columns: list[Column]
    rows: list[list[str]]
    note: str = ""
    code_columns: frozenset[int] = frozenset()  # cells shown as code (commands, paths)


def _level_rows(runs: Sequence[Run], cells: Callable[[Level], list[str]]) -> list[list[str]]:
    rows = []
    for run in runs:
        for lv in levels(run):
            label = lv.label + (" (not a measurement)" if lv.not_measured else "")
            rows.append([run.label, label, *cells(lv)])
    return rows


def _valid_cell(lv: Level) -> str:
    marks = (" imprecise" if lv.imprecise else "", " not a measurement" if lv.not_measured else "")
    return f"{len(lv.valid)}/{len(lv.points)}" + "".join(marks)


def precision_cell(lv: Level) -> str:
    """``precise: tok/s ±2.1%, TPOT p50 ±0.8% (target ±5.0%)``; n/a without a target."""
    pr = lv.precision
    if pr is None:
        return NA
    status = "not yet decided" if pr.status == "pending" else pr.status
    return f"{status}: {pr.describe()}"


def any_precision(runs: Sequence[Run]) -> bool:
    """Whether any run had a precision target (its column is shown only then)."""
    return any(p.precision is not None for r in runs for p in r.results.points)


def runs_table(runs: Sequence[Run]) -> Table:
    per_acc = any_accelerators(runs)
    rows = []
    for run in runs:
        prov = run.results.provenance
        acc = prov.accelerator
        hw = f"{acc.count} x {acc.model} ({acc.kind})" if acc else NA
        valid = sum(1 for p in run.results.points if p.valid)
        rows.append(
            [
                run.label,
                str(run.path),
                run.topology or NA,
                f"{prov.engine or 'engine'} {prov.engine_version or '(version unknown)'}",
                prov.model.name,
                hw,
                *(
                    [str(run.accelerators) if run.accelerators else f"{NA} (not recorded)"]
                    if per_acc
                    else []
                ),
                f"{valid}/{len(run.results.points)}",
            ]
        )
    return Table(
        "runs",
        "Runs",
        [
            Column("Run"),
            Column("Results file"),
            Column("Topology"),
            Column("Engine"),
            Column("Model"),
            Column("Hardware"),
            *([Column("Accelerators used", True)] if per_acc else []),
            Column("Valid points", True),
        ],
        rows,
        code_columns=frozenset({1}),
    )


def any_accelerators(runs: Sequence[Run]) -> bool:
    """Whether any run knows how many accelerators its deployment uses: per-accelerator
    columns and panels are shown only then."""
    return any(r.accelerators for r in runs)


def throughput_table(runs: Sequence[Run]) -> Table:
    per_acc = any_accelerators(runs)
    keys: tuple[str, ...] = ("requests_per_s", "output_tokens_per_s")
    cols = [Column("Requests/s", True), Column("Output tok/s", True)]
    if per_acc:
        keys = (
            "requests_per_s",
            "requests_per_s_per_accelerator",
            "output_tokens_per_s",
            "output_tokens_per_s_per_accelerator",
        )
        cols = [
            Column("Requests/s", True),
            Column("Requests/s per accelerator", True),
            Column("Output tok/s", True),
            Column("Output tok/s per accelerator", True),
        ]
    note = "Mean ± 95% CI half-width (Student t) over the valid repetitions of each level."
    if any_precision(runs):
        note += (
            " 'imprecise': the level reached its repetition cap with an interval wider than "
            "the run's precision target (see the validity table)."
        )
    if per_acc:
        note += (
            " Per accelerator = absolute / the accelerators the deployment uses; n/a where "
            "that count is unknown (CPU deployments). A topology can win on tok/s and lose "
            "on tok/s per accelerator: read both columns."
        )
    return Table(
        "throughput",
        "Throughput (absolute and per accelerator)" if per_acc else "Throughput",
        [Column("Run"), Column("Load"), Column("Valid reps", True), *cols],
        _level_rows(
            runs, lambda lv: [_valid_cell(lv), *(fmt_interval(lv.figure(k)) for k in keys)]
        ),
        note=note,
    )


LATENCY_KEYS = (
    "ttft_ms.p50",
    "ttft_ms.p99",
    "itl_ms.p50",
    "itl_ms.p99",
    "tpot_ms.p50",
    "tpot_ms.p99",
)


def latency_table(runs: Sequence[Run]) -> Table:
    served = any(lv.source(k) for r in runs for lv in levels(r) for k in LATENCY_KEYS)
    return Table(
        "latency",
        "Latency (ms)",
        [
            Column("Run"),
            Column("Load"),
            *(Column(f"{METRICS[k].title} (ms)", True) for k in LATENCY_KEYS),
        ],
        _level_rows(runs, lambda lv: [latency_cell(lv, k) for k in LATENCY_KEYS]),
        note="Each repetition's percentile over the requests scheduled and finished inside "
        "its window; mean ± 95% CI half-width of those per-repetition values."
        + (SERVER_NOTE if served else ""),
    )


def validity_table(runs: Sequence[Run]) -> Table:
    with_precision = any_precision(runs)

    def cells(lv: Level) -> list[str]:
        verdict = "valid" if not lv.invalid else f"{len(lv.invalid)} invalid (excluded)"
        if lv.points and not lv.valid:
            verdict = "all invalid: no figures"
        return [
            _valid_cell(lv),
            verdict,
            *([precision_cell(lv)] if with_precision else []),
            fmt_interval(lv.figure("error_rate"), percent=True),
            fmt_interval(lv.figure("handoff_share"), percent=True),
            fmt_interval(lv.figure("spec_acceptance"), percent=True),
            fmt_interval(lv.figure("preemptions")),
        ]

    return Table(
        "validity",
        "Errors, validity and server evidence",
        [
            Column("Run"),
            Column("Load"),
            Column("Valid reps", True),
            Column("Validity"),
            *([Column("Precision (95% half-width / mean)")] if with_precision else []),
            Column("Error rate", True),
            Column("PD handoff share", True),
            Column("Spec. acceptance", True),
            Column("Preemptions", True),
        ],
        _level_rows(runs, cells),
        note="From every role's counters, read before and after each window (server-side "
        "evidence, not client estimates); n/a where the deployment has no such counter "
        "(no PD handoff, no speculative decoding)."
        + (
            " Precision: with a precision target a level is repeated until the 95% interval "
            "of its tok/s and TPOT p50 is within the target; 'imprecise' levels stopped at "
            "the repetition cap with the interval shown (a verdict apart from validity)."
            if with_precision
            else ""
        ),
    )


def invalid_table(runs: Sequence[Run]) -> Table:
    rows = []
    for run in runs:
        for lv in levels(run):
            for p in sorted(lv.invalid, key=lambda p: p.repetition):
                rows.append(
                    [run.label, lv.label, str(p.repetition), "; ".join(p.invalid_reasons) or NA]
                )
    return Table(
        "invalid",
        "Invalid points (excluded from every figure, plot and ratio)",
        [Column("Run"), Column("Load"), Column("Repetition", True), Column("Why invalid")],
        rows,
        note="Each reason names the SB4xx check that failed (`servebook checks` explains "
        "each); such a point is reported, never averaged in or plotted as a measurement.",
    )


def show_value(v: Any) -> str:
    if v is None:
        return NA
    if isinstance(v, str):
        return v
    return json.dumps(v, sort_keys=True, default=str)


def settings_value(v: Any) -> str:
    """A setting's value for a person: lists joined with commas, mappings as
    ``key=value, ...``, no quotes, no braces."""
    if v is None:
        return "unset"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int | float):
        return f"{v:g}"
    if isinstance(v, Mapping):
        return ", ".join(f"{k}={settings_value(x)}" for k, x in v.items()) or "none"
    if isinstance(v, list | tuple):
        return ",".join(settings_value(x) for x in v) or "none"
    return str(v)


def provenance_table(run: Run, index: int) -> Table:
    prov = run.results.provenance
    acc = prov.accelerator
    hw = NA
    if acc:
        hw = f"{acc.count} x {acc.model} ({acc.kind})" + (
            f", {acc.cores} cores" if acc.cores else ""
        )
    rows: list[list[str]] = [
        ["Results file", str(run.path)],
        ["Engine", f"{prov.engine or NA} {prov.engine_version or '(version unknown)'}"],
        ["Model", prov.model.name],
        ["Model config hash", prov.model.config_hash or NA],
        ["Model path", prov.model.path or NA],
        ["Hardware", hw],
        ["Accelerators used", str(prov.accelerators_used) if prov.accelerators_used else NA],
        ["Target", settings_value(prov.target) if prov.target else NA],
        ["Seed", str(prov.seed)],
        ["servebook", servebook_of(prov)],
        ["Started / ended", f"{prov.started_at} / {prov.ended_at or NA}"],
    ]
    rows += [[f"Protocol: {k}", settings_value(v)] for k, v in sorted(prov.protocol.items())]
    rows += [[f"Workload: {k}", settings_value(v)] for k, v in sorted(prov.workload.items())]
    rows += [[f"Package: {k}", v] for k, v in sorted(prov.packages.items())]
    rows += [[f"Host: {k}", show_value(v)] for k, v in sorted(prov.host.items())]
    for role in prov.roles:
        if role.image:
            rows.append([f"Role {role.name}: image", role.image])
        if role.engine_version:
            rows.append([f"Role {role.name}: engine version", role.engine_version])
    return Table(
        f"provenance-{index}",
        f"Provenance: {run.label}",
        [Column("Field"), Column("Value")],
        rows,
        code_columns=frozenset({1}),
    )
