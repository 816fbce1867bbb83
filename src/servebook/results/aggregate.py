"""Per load level: the aggregates over its repetitions, and a precision target's verdict.

Aggregates are over the *valid* repetitions of a load level only (invalid points are
reported, never averaged in); ``ci95`` is ``null`` with fewer than two (``stats.mean_ci``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servebook.results import stats
from servebook.results.schema import (
    PRECISION_FIGURES,
    Aggregate,
    Figure,
    LevelPrecision,
    Point,
    PrecisionFigure,
)
from servebook.results.tpot import figure, judged_key

# --- aggregates ----------------------------------------------------------------------------

AGGREGATED = ("output_tokens_per_s", "output_tokens_per_s_per_accelerator", "requests_per_s")
AGGREGATED_LATENCY = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")


def _figure(values: Iterable[float | None]) -> Figure:
    ci = stats.mean_ci(values)
    band = (ci.low, ci.high) if ci.low is not None and ci.high is not None else None
    return Figure(mean=ci.mean, ci95=band, n=ci.n)


def aggregate(points: Sequence[Point], precision: PrecisionTarget | None = None) -> list[Aggregate]:
    """Per load level, the mean and 95% CI over valid repetitions of each figure (and the
    level's precision verdict, with a target)."""
    levels: dict[tuple[str, float], list[Point]] = {}
    for p in points:
        levels.setdefault(p.key[:2], []).append(p)
    out = []
    for (_mode, _value), pts in sorted(levels.items()):
        valid = [p for p in pts if p.valid]
        figs: dict[str, Figure] = {}
        for name in AGGREGATED:
            figs[name] = _figure(getattr(p, name) for p in valid)
        for name in AGGREGATED_LATENCY:
            for q in ("p50", "p90", "p99", "mean"):
                figs[f"{name}.{q}"] = _figure(getattr(getattr(p, name), q) for p in valid)
        if any(p.goodput is not None for p in valid):
            figs["goodput.requests_per_s"] = _figure(
                p.goodput.requests_per_s if p.goodput else None for p in valid
            )
        out.append(
            Aggregate(
                concurrency=pts[0].concurrency,
                rate=pts[0].rate,
                repetitions=len(pts),
                valid_repetitions=len(valid),
                figures=figs,
                precision=precision.verdict(pts) if precision is not None else None,
            )
        )
    return out


# --- the precision target ------------------------------------------------------------------


def _precision_value(p: Point, key: str) -> float | None:
    if key.startswith("tpot_ms."):
        return figure(p, key)
    v = getattr(p, key)
    return float(v) if v is not None else None


@dataclass(frozen=True)
class PrecisionTarget:
    """A precision target as the protocol states it (``ProtocolSettings.precision_target``
    builds it; a results file's own ``provenance.protocol`` gives it back, so the file
    judges its levels by the rule it was run with)."""

    target: float
    min_repetitions: int
    max_repetitions: int

    @classmethod
    def from_protocol(cls, protocol: Mapping[str, Any]) -> PrecisionTarget | None:
        target = protocol.get("precision")
        if not isinstance(target, int | float) or isinstance(target, bool):
            return None
        reps = int(protocol.get("repetitions") or 2)
        minimum = max(2, reps)
        cap = protocol.get("max_repetitions")
        return cls(float(target), minimum, max(minimum, int(cap) if cap else minimum))

    def decide(self, points: Sequence[Point]) -> stats.PrecisionDecision:
        """The stopping rule over one level's points (every repetition counts toward the
        cap; the intervals are over the valid ones)."""
        valid = [p for p in sorted(points, key=lambda p: p.repetition) if p.valid]
        keys = [judged_key(valid) if k == "tpot_ms.p50" else k for k in PRECISION_FIGURES]
        series = {k: [v for p in valid if (v := _precision_value(p, k)) is not None] for k in keys}
        return stats.precision_decision(
            series,
            target=self.target,
            repetitions=len(points),
            min_repetitions=self.min_repetitions,
            max_repetitions=self.max_repetitions,
        )

    def verdict(self, points: Sequence[Point]) -> LevelPrecision:
        d = self.decide(points)
        figures = {}
        for k, iv in d.intervals.items():
            band = (iv.low, iv.high) if iv.low is not None and iv.high is not None else None
            figures[k] = PrecisionFigure(
                mean=iv.mean, ci95=band, n=iv.n, half_width_share=d.relative[k]
            )
        return LevelPrecision(
            target=self.target,
            status="pending" if d.status == "continue" else d.status,
            repetitions=d.repetitions,
            min_repetitions=self.min_repetitions,
            max_repetitions=self.max_repetitions,
            figures=figures,
        )


def mark_precision(points: Sequence[Point], precision: PrecisionTarget | None) -> list[Point]:
    """Every point carries its level's precision verdict (``imprecise`` and ``precision``);
    without a target, none."""
    by_level: dict[tuple[str, float], list[Point]] = {}
    for p in points:
        by_level.setdefault(p.key[:2], []).append(p)
    verdicts = {
        k: precision.verdict(pts) if precision is not None else None for k, pts in by_level.items()
    }
    out = []
    for p in points:
        v = verdicts[p.key[:2]]
        out.append(
            p.model_copy(
                update={"precision": v, "imprecise": v is not None and v.status == "imprecise"}
            )
        )
    return out
