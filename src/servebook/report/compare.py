"""`servebook compare A B`: B relative to A, point by point, only when that ratio means
something.

Compare first asks whether the runs are like for like (``report.comparability``: their
provenance, field by field, against the variables under test) and refuses when they
differ in more; ``--force`` compares anyway and stamps every output
:data:`CROSS_PROVENANCE`.

**The verdict per point and metric** (:data:`TEST`): Welch's two-sided t-test at 5% over
the per-repetition values of the valid repetitions.  A repetition is the unit that was
actually replicated (requests inside one repetition share server state, so a test over
requests would overstate the sample size), and Welch's test does not assume two topologies
vary alike.  The interval shown is Welch's 95% interval of B - A relative to A's mean, so
it excludes zero exactly when the verdict is *better* or *worse*; it is the same t
machinery as every CI in a report (``results.stats``).  With fewer than two valid
repetitions on a side there is no test: *not distinguishable (too few repetitions)*.
Direction is per metric: throughput higher is better, latency and error rate lower is
better.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from servebook.report.comparability import Comparability, comparability
from servebook.report.tables import (
    COMPARED,
    METRICS,
    NA,
    SERVER_MARK,
    SERVER_NOTE,
    Column,
    Level,
    Run,
    Table,
    fmt_interval,
    levels,
    same_source,
)
from servebook.results import stats
from servebook.results.tpot import PER_TOKEN, judged_key

CROSS_PROVENANCE = "cross-provenance: not a like-for-like comparison"
ALPHA = 0.05

TEST = (
    "Welch's two-sided t-test at 5% over the per-repetition values of the valid "
    "repetitions (one value per repetition; invalid points excluded). The interval is "
    "Welch's 95% CI of B - A relative to A's mean: it excludes 0 exactly when the verdict "
    "is better or worse. Fewer than 2 valid repetitions on a side: not distinguishable "
    "(too few repetitions). Throughput: higher is better; latency and error rate: lower "
    "is better."
)
ENGINE_MEANS = (
    " Where either run's engine histogram leads TPOT or ITL at a level, both runs are "
    "compared on their engines' exact means there (each run its own engine), and p99 is not "
    "compared: a histogram places it only within a bucket."
)
MULTIPLE_TESTS = (
    "Each verdict is its own test at 5%: among many points and metrics that do not truly "
    "differ, about 1 in 20 reads better or worse by chance. Trust a pattern across points "
    "more than one verdict."
)


# --- the verdict ---------------------------------------------------------------------------


Verdict = Literal[
    "better",
    "worse",
    "not distinguishable",
    "not distinguishable (too few repetitions)",
    "no valid repetitions",
    "not measured on one side",
]


def verdict_of(w: stats.Welch | None, better: Literal["higher", "lower"]) -> Verdict:
    """better / worse at 5% in the metric's direction, else not distinguishable."""
    if w is None:
        return "not distinguishable (too few repetitions)"
    if w.p >= ALPHA or w.diff == 0:
        return "not distinguishable"
    up = w.diff > 0
    return "better" if up == (better == "higher") else "worse"


@dataclass(frozen=True)
class Row:
    level: str
    metric: str
    a: stats.Interval
    b: stats.Interval
    test: stats.Welch | None
    verdict: Verdict
    # Whether A's and B's level is imprecise (its precision target not reached): a verdict
    # on it rests on an interval wider than that run asked for.
    imprecise: tuple[bool, bool] = (False, False)
    source: str | None = None  # "server": a side's figure is the engine's (Level.source)

    @property
    def difference_ci(self) -> tuple[float, float] | None:
        """Welch's interval of B - A, cut to what the metric allows: B is not negative, so
        B - A is not below -A (a change below -100%); a share is at most 1."""
        if self.test is None:
            return None
        low, high = self.test.low, self.test.high
        if self.a.mean is not None:
            low = max(low, -self.a.mean)
            if METRICS[self.metric].percent:
                high = min(high, 1.0 - self.a.mean)
        return (low, high)

    @property
    def imprecise_note(self) -> str:
        sides = [n for n, bad in zip("AB", self.imprecise, strict=True) if bad]
        return f"{' and '.join(sides)} imprecise" if sides else ""

    @property
    def ratio(self) -> float | None:
        """B / A; ``None`` when A's mean is not positive (an error rate of 0)."""
        if self.a.mean is None or self.b.mean is None or not self.a.mean > 0:
            return None
        return self.b.mean / self.a.mean

    @property
    def ratio_ci(self) -> tuple[float, float] | None:
        """Welch's interval of B - A over A's mean, plus one: excludes 1 exactly when the
        verdict is better or worse."""
        d = self.difference_ci
        if d is None or self.a.mean is None or not self.a.mean > 0:
            return None
        return (1 + d[0] / self.a.mean, 1 + d[1] / self.a.mean)

    def to_dict(self) -> dict[str, Any]:
        def side(iv: stats.Interval) -> dict[str, Any]:
            ci = [iv.low, iv.high] if iv.low is not None else None
            return {"mean": iv.mean, "ci95": ci, "n": iv.n}

        t = self.test
        return {
            "level": self.level,
            "metric": self.metric,
            "better": METRICS[self.metric].better,
            "a": side(self.a),
            "b": side(self.b),
            "ratio": self.ratio,
            "ratio_ci95": list(self.ratio_ci) if self.ratio_ci else None,
            "difference": t.diff if t else None,
            "difference_ci95": list(self.difference_ci) if self.difference_ci else None,
            "source": self.source or "client",
            "welch_t": t.t if t else None,
            "welch_df": t.df if t else None,
            "p": t.p if t else None,
            "verdict": self.verdict,
            "imprecise": {"a": self.imprecise[0], "b": self.imprecise[1]},
        }


def compare_level(la: Level, lb: Level, metric: str) -> Row | None:
    """One metric at one load level; ``None`` when neither run has the metric at all
    (per-accelerator figures of two CPU runs)."""
    m = METRICS[metric]
    assert m.better is not None
    va, vb = la.values(metric), lb.values(metric)
    if not va and not vb and la.valid and lb.valid:
        return None
    w = stats.welch(va, vb)
    verdict: Verdict
    if not la.valid or not lb.valid:
        verdict = "no valid repetitions"
    elif not va or not vb:
        verdict = "not measured on one side"
    else:
        verdict = verdict_of(w, m.better)
    return Row(
        la.label,
        metric,
        la.figure(metric),
        lb.figure(metric),
        w,
        verdict,
        (la.imprecise, lb.imprecise),
        la.source(metric) or lb.source(metric),
    )


def judged_metric(la: Level, lb: Level, metric: str) -> str | None:
    """What ``metric`` is compared on at this level of both runs (``results.tpot``): a
    per-token p50 is both sides' engines' exact means where either side's histogram leads
    (never one side's engine against the other's client), and a per-token p99 is then not
    compared (the histogram places it only within a bucket); ``None``: not compared."""
    name, _, q = metric.partition(".")
    if name not in PER_TOKEN or judged_key([*la.valid, *lb.valid], name) == f"{name}.p50":
        return metric
    return f"{name}.mean" if q == "p50" else None


@dataclass
class Comparison:
    a: Run
    b: Run
    comparability: Comparability
    forced: bool
    rows: list[Row] = field(default_factory=list)
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)

    @property
    def stamp(self) -> str | None:
        return None if self.comparability.like_for_like else CROSS_PROVENANCE


class Refused(Exception):
    """The runs differ in more than the variable under test (exit 1)."""

    def __init__(self, comparability: Comparability) -> None:
        super().__init__("provenance differs beyond the variable under test")
        self.comparability = comparability


def compare(a: Run, b: Run, variables: Sequence[str] = (), *, force: bool = False) -> Comparison:
    """B relative to A per common load level and metric; raises :class:`Refused` when the
    provenance differs in an undeclared kind and ``force`` is not set."""
    c = comparability(a.results.provenance, b.results.provenance, variables)
    if not c.like_for_like and not force:
        raise Refused(c)
    la = {(lv.mode, lv.value): lv for lv in levels(a)}
    lb = {(lv.mode, lv.value): lv for lv in levels(b)}
    rows = []
    for key in [k for k in la if k in lb]:
        level_a, level_b = same_source(la[key], lb[key])
        for metric in COMPARED:
            judged = judged_metric(level_a, level_b, metric)
            row = compare_level(level_a, level_b, judged) if judged else None
            if row is not None:
                rows.append(row)
    return Comparison(
        a,
        b,
        c,
        force,
        rows,
        only_a=[la[k].label for k in la if k not in lb],
        only_b=[lb[k].label for k in lb if k not in la],
    )


# --- output --------------------------------------------------------------------------------


def fmt_relative(row: Row) -> str:
    """``+12.3% [+5.1%, +19.5%]`` for B vs A; percentage points for percent metrics."""
    m = METRICS[row.metric]
    if m.percent:
        if row.a.mean is None or row.b.mean is None:
            return NA
        d = 100 * (row.b.mean - row.a.mean)
        t = row.difference_ci
        band = f" [{100 * t[0]:+.2f}, {100 * t[1]:+.2f}]" if t else ""
        return f"{d:+.2f} pp{band}"
    r = row.ratio
    if r is None:
        return NA
    ci = row.ratio_ci
    band = f" [{100 * (ci[0] - 1):+.1f}%, {100 * (ci[1] - 1):+.1f}%]" if ci else ""
    return f"{100 * (r - 1):+.1f}%{band}"


def rows_table(c: Comparison) -> Table:
    return Table(
        "compare",
        f"B ({c.b.label}) relative to A ({c.a.label})",
        [
            Column("Load"),
            Column("Metric"),
            Column("A", True),
            Column("B", True),
            Column("B vs A (95% CI)", True),
            Column("p", True),
            Column("Verdict"),
        ],
        [
            [
                r.level,
                METRICS[r.metric].label + (SERVER_MARK if r.source else ""),
                fmt_interval(r.a, percent=METRICS[r.metric].percent),
                fmt_interval(r.b, percent=METRICS[r.metric].percent),
                fmt_relative(r),
                f"{r.test.p:.3g}" if r.test else NA,
                r.verdict + (f" ({r.imprecise_note})" if r.imprecise_note else ""),
            ]
            for r in c.rows
        ],
        note=TEST
        + (SERVER_NOTE if any(r.source for r in c.rows) else "")
        + (ENGINE_MEANS if any(r.metric.endswith(".mean") for r in c.rows) else "")
        + (
            " 'imprecise': that run's level stopped at its repetition cap with an interval "
            "wider than its precision target."
            if any(r.imprecise_note for r in c.rows)
            else ""
        ),
    )


def differences_lines(c: Comparability) -> list[str]:
    out = []
    for d in c.differences:
        tag = "under test" if d.kind in c.allowed_kinds else "NOT under test"
        out.append(f"[{d.kind}] {d.describe()} ({tag})")
    return out


def refusal_message(c: Comparability) -> str:
    lines = [
        "compare refused: A and B differ in more than the variable under test, so a ratio of "
        "their numbers would mix that variable with the differences below.",
    ]
    lines += [f"  [{d.kind}] {d.describe()}" for d in c.unexplained]
    if c.route_reason():
        lines.append(str(c.route_reason()))
    sugg = " ".join(f"--variable {k}" for k in c.suggestion())
    lines.append(
        f"If these differences are what you are testing, declare them ({sugg}); otherwise "
        "re-run one side so they match, or pass --force to compare anyway (every output is "
        f'then stamped "{CROSS_PROVENANCE}").'
    )
    return "\n".join(lines)


def to_json(c: Comparison) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "stamp": c.stamp,
        "like_for_like": c.comparability.like_for_like,
        "forced": c.forced,
        "a": {"label": c.a.label, "path": str(c.a.path)},
        "b": {"label": c.b.label, "path": str(c.b.path)},
        "variables": list(c.comparability.variables),
        "differences": [
            {**d.to_dict(), "under_test": d.kind in c.comparability.allowed_kinds}
            for d in c.comparability.differences
        ],
        "test": TEST,
        "alpha": ALPHA,
        "levels_only_in_a": c.only_a,
        "levels_only_in_b": c.only_b,
        "rows": [r.to_dict() for r in c.rows],
    }
    if c.stamp:
        for r in doc["rows"]:
            r["stamp"] = c.stamp
    return doc


def refusal_json(c: Comparability) -> dict[str, Any]:
    return {
        "refused": True,
        "reason": "provenance differs beyond the variable under test",
        "variables": list(c.variables),
        "differences": [
            {**d.to_dict(), "under_test": d.kind in c.allowed_kinds} for d in c.differences
        ],
        "suggested_variables": c.suggestion(),
    }


__all__ = [
    "CROSS_PROVENANCE",
    "TEST",
    "Comparison",
    "Refused",
    "compare",
]
