"""`servebook compare A B --reproduce`: does run B reproduce run A?  One verdict.

Field notes ("Benchmarks"): a published sweep could not be reproduced (166 and 270 tok/s
against a published 242); what did reproduce within a few percent was median TPOT.  An
independent re-run is the check that makes a number trustworthy, so it is a command.

Per common load level, on the *median over valid repetitions* of output tokens/s and of
TPOT p50 (:data:`METRICS`; where an engine's histogram leads TPOT on either side, on each
side's engine's exact TPOT mean instead, ``results.tpot``: vLLM's buckets are 33-100% wide,
its first ends at 10 ms, and interpolation there gives 5.00 ms for any CPU engine):

* **within tolerance**: ``|median_B / median_A - 1| <= tolerance`` (default 5%);
* **interval cover**: whether A's 95% interval (Student t over its valid repetitions, the
  report's intervals) contains B's median, and B's contains A's; ``None`` with fewer than
  two valid repetitions (no interval).

A level's verdict: **reproduces** when every metric is within tolerance; otherwise
**inconclusive** when, for each metric outside it, both intervals cover the other run's
median (the difference is inside the noise: the runs are too imprecise to tell; repeat
them with more repetitions or longer windows), or when a side has no valid repetition or
no figure; otherwise **does not reproduce**.  The run's verdict: *reproduces* when every
common level does; *does not reproduce* when any level does not; else *inconclusive*.
Levels only one run has are listed, not judged; no common level is unusable input.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from servebook.errors import UsageError
from servebook.report.tables import (
    METRICS,
    NA,
    Column,
    Level,
    Run,
    Table,
    fmt_num,
    levels,
    same_source,
)
from servebook.results import stats
from servebook.results.evidence import bucket_words, unplaced_tpot_bucket
from servebook.results.tpot import judged_key
from servebook.values import parse_share

DEFAULT_TOLERANCE = 0.05
REPRODUCE_METRICS = ("output_tokens_per_s", "tpot_ms.p50")

PointVerdict = Literal["reproduces", "does not reproduce", "inconclusive"]

RULE = (
    "B reproduces A at a level when the median over valid repetitions of output tokens/s "
    "and of TPOT p50 are each within the tolerance of A's. Outside it: inconclusive when "
    "each run's 95% interval covers the other's median (the difference is inside the "
    "noise), or a side has no valid repetition; else does not reproduce. Where an engine's "
    "histogram gives TPOT on either side (the client's per-token timing was wrong there), "
    "both sides' TPOT is judged on their engines' exact means: a percentile inside a bucket "
    "is an interpolation between its bounds, not a latency."
)


def parse_tolerance(text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05; a share strictly between 0 and 1."""
    return parse_share(text, flag="--tolerance", what="a share of A's median")


@dataclass(frozen=True)
class MetricCheck:
    metric: str
    median_a: float | None
    median_b: float | None
    ci_a: stats.Interval
    ci_b: stats.Interval
    tolerance: float

    @property
    def relative(self) -> float | None:
        """B / A - 1; ``None`` without a positive median on both sides."""
        if self.median_a is None or self.median_b is None or not self.median_a > 0:
            return None
        return self.median_b / self.median_a - 1

    @property
    def within(self) -> bool | None:
        r = self.relative
        return None if r is None else abs(r) <= self.tolerance + 1e-12

    @staticmethod
    def _covers(iv: stats.Interval, x: float | None) -> bool | None:
        if iv.low is None or iv.high is None or x is None:
            return None
        return iv.low <= x <= iv.high

    @property
    def a_covers_b(self) -> bool | None:
        return self._covers(self.ci_a, self.median_b)

    @property
    def b_covers_a(self) -> bool | None:
        return self._covers(self.ci_b, self.median_a)

    @property
    def in_noise(self) -> bool:
        return self.a_covers_b is True and self.b_covers_a is True

    def to_dict(self) -> dict[str, Any]:
        def ci(iv: stats.Interval) -> list[float] | None:
            return [iv.low, iv.high] if iv.low is not None and iv.high is not None else None

        return {
            "metric": self.metric,
            "median_a": self.median_a,
            "median_b": self.median_b,
            "n_a": self.ci_a.n,
            "n_b": self.ci_b.n,
            "relative": self.relative,
            "within_tolerance": self.within,
            "ci95_a": ci(self.ci_a),
            "ci95_b": ci(self.ci_b),
            "a_interval_covers_b_median": self.a_covers_b,
            "b_interval_covers_a_median": self.b_covers_a,
        }


@dataclass(frozen=True)
class PointCheck:
    level: str
    metrics: list[MetricCheck]
    verdict: PointVerdict
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "verdict": self.verdict,
            "reason": self.reason,
            "metrics": [m.to_dict() for m in self.metrics],
        }


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def check_metric(la: Level, lb: Level, metric: str, tolerance: float) -> MetricCheck:
    va, vb = la.values(metric), lb.values(metric)
    return MetricCheck(
        metric, _median(va), _median(vb), stats.mean_ci(va), stats.mean_ci(vb), tolerance
    )


def check_level(la: Level, lb: Level, tolerance: float) -> PointCheck:
    la, lb = same_source(la, lb)
    top = unplaced_tpot_bucket([*la.valid, *lb.valid])
    tpot = judged_key([*la.valid, *lb.valid])
    metrics = [tpot if m == "tpot_ms.p50" else m for m in REPRODUCE_METRICS]
    checks = [check_metric(la, lb, m, tolerance) for m in metrics]
    verdict, reason = _verdict(la, lb, checks, tolerance)
    if tpot == "tpot_ms.mean":
        reason += " (TPOT judged on each engine's exact mean: an engine's histogram leads it"
        if top is not None:
            reason += (
                f"; its histogram places the p50 only {bucket_words(top)}, in buckets too "
                "coarse to judge it"
            )
        reason += ")"
    return PointCheck(la.label, checks, verdict, reason)


def _verdict(
    la: Level, lb: Level, checks: list[MetricCheck], tolerance: float
) -> tuple[PointVerdict, str]:
    if not la.valid or not lb.valid:
        side = "A" if not la.valid else "B"
        return "inconclusive", f"no valid repetition in {side}"
    unknown = [c for c in checks if c.within is None]
    if unknown:
        names = ", ".join(METRICS[c.metric].title for c in unknown)
        return "inconclusive", f"{names}: not measured on a side"
    outside = [c for c in checks if not c.within]
    if not outside:
        return "reproduces", f"every median within {tolerance:.0%}"
    desc = "; ".join(f"{METRICS[c.metric].title} {100 * (c.relative or 0):+.1f}%" for c in outside)
    if all(c.in_noise for c in outside):
        return (
            "inconclusive",
            f"{desc}, but each run's interval covers the other's median: too imprecise to tell",
        )
    return "does not reproduce", desc


@dataclass
class Reproduction:
    a: Run
    b: Run
    tolerance: float
    points: list[PointCheck] = field(default_factory=list)
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> PointVerdict:
        vs = {p.verdict for p in self.points}
        if "does not reproduce" in vs:
            return "does not reproduce"
        if vs == {"reproduces"}:
            return "reproduces"
        return "inconclusive"

    @property
    def reproduces(self) -> bool:
        return self.verdict == "reproduces"

    def sentence(self) -> str:
        n = len(self.points)
        ok = sum(p.verdict == "reproduces" for p in self.points)
        tol = f"{100 * self.tolerance:g}%"
        if self.verdict == "reproduces":
            return f"B reproduces A within {tol} at all {n} common load level(s)."
        bad = [p.level for p in self.points if p.verdict == "does not reproduce"]
        unsure = [p.level for p in self.points if p.verdict == "inconclusive"]
        parts = [f"B does not reproduce A within {tol}: {ok} of {n} level(s) reproduce"]
        if bad:
            parts.append(f"not reproduced at {', '.join(bad)}")
        if unsure:
            parts.append(f"inconclusive at {', '.join(unsure)}")
        return "; ".join(parts) + "."


def same_measurements(a: Run, b: Run) -> list[str]:
    """What shows that B is not a run of its own but A's measurements again (a copy of A's
    directory, or A's file edited): the run's start time, or a point's, is A's to the
    microsecond.  Two runs of a sweep never start at the same instant."""
    shown: list[str] = []
    start = a.results.provenance.started_at
    if start and start == b.results.provenance.started_at:
        shown.append(f"the run's start ({start})")
    stamps_a = {p.started_at for p in a.results.points if p.started_at}
    same = [p for p in b.results.points if p.started_at and p.started_at in stamps_a]
    if same:
        shown.append(
            f"{len(same)} of B's {len(b.results.points)} point(s) started when one of A's did "
            f"(first: {same[0].started_at})"
        )
    return shown


def reproduce(a: Run, b: Run, tolerance: float = DEFAULT_TOLERANCE) -> Reproduction:
    """The check per common load level; ``UsageError`` when the runs share none, or when
    B is not an independent run (``same_measurements``): a copy of A reproduces A
    trivially, and saying so would vouch for numbers nobody measured twice."""
    shown = same_measurements(a, b)
    if shown:
        raise UsageError(
            f"{b.path} is not an independent run of {a.path}: it has A's timestamps "
            f"({'; '.join(shown)}), so it holds A's measurements (a copy of A, or A edited), "
            "and a copy reproduces its original by construction",
            hint=f"run the same sweep again into a new -o DIR and compare {a.path.parent} "
            "with that",
        )
    la = {(lv.mode, lv.value): lv for lv in levels(a)}
    lb = {(lv.mode, lv.value): lv for lv in levels(b)}
    common = [k for k in la if k in lb]
    if not common:
        raise UsageError(
            f"{a.path} and {b.path} have no load level in common "
            f"(A: {', '.join(lv.label for lv in la.values()) or 'none'}; "
            f"B: {', '.join(lv.label for lv in lb.values()) or 'none'}): nothing to reproduce"
        )
    return Reproduction(
        a,
        b,
        tolerance,
        [check_level(la[k], lb[k], tolerance) for k in common],
        only_a=[la[k].label for k in la if k not in lb],
        only_b=[lb[k].label for k in lb if k not in la],
    )


def _yes(v: bool | None) -> str:
    return NA if v is None else ("yes" if v else "no")


def table(r: Reproduction) -> Table:
    rows = []
    for p in r.points:
        for c in p.metrics:
            rel = c.relative
            rows.append(
                [
                    p.level,
                    METRICS[c.metric].label,
                    f"{fmt_num(c.median_a)} (n={c.ci_a.n})",
                    f"{fmt_num(c.median_b)} (n={c.ci_b.n})",
                    NA if rel is None else f"{100 * rel:+.1f}%",
                    _yes(c.a_covers_b),
                    _yes(c.b_covers_a),
                    p.verdict,
                ]
            )
    return Table(
        "reproduce",
        f"Does B ({r.b.label}) reproduce A ({r.a.label}) within {100 * r.tolerance:g}%?",
        [
            Column("Load"),
            Column("Metric"),
            Column("A median", True),
            Column("B median", True),
            Column("B vs A", True),
            Column("A's CI covers B"),
            Column("B's CI covers A"),
            Column("Level verdict"),
        ],
        rows,
        note=RULE,
    )


def to_json(r: Reproduction, stamp: str | None = None) -> dict[str, Any]:
    return {
        "mode": "reproduce",
        "verdict": r.verdict,
        "reproduces": r.reproduces,
        "summary": r.sentence(),
        "tolerance": r.tolerance,
        "metrics": list(REPRODUCE_METRICS),
        "rule": RULE,
        "stamp": stamp,
        "a": {"label": r.a.label, "path": str(r.a.path)},
        "b": {"label": r.b.label, "path": str(r.b.path)},
        "levels_only_in_a": r.only_a,
        "levels_only_in_b": r.only_b,
        "points": [p.to_dict() for p in r.points],
    }
