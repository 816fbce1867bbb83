"""The experiment's figures from its arms' results: ratios to the baseline per level and
metric with 95% intervals, crossovers, and the baseline's drift.

The ratio is of the two arms' medians over blocks (a block's value: the mean of its
repetitions).  The median, because a block is one slot of hours on a shared machine: one
disturbed by a neighbour's burst (seen on the 2-core test machine: one block's c=1 at half
its neighbours' throughput) should not move the ratio; with two blocks it is their mean.
The interval is a percentile bootstrap of that ratio that resamples blocks (each a
replicate: a fresh deployment in its own slot of the schedule) and, within each drawn
block, its repetitions.  Blocks are paired: a draw takes the same blocks for the arm and
the baseline, so what a block shares between them (the machine at that hour) stays shared.

A block in which any arm failed (did not come up, failed verify, its bench failed) is
invalid as a whole and counts for no comparison (the schedule lists it with the reason);
in a valid block, a level counts for a pair of arms when both have a valid point there.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from servebook.results.schema import Point, Results
from servebook.results.tpot import engine_led, judged

BOOTSTRAP_DRAWS = 2000

# The p99 of each latency an SLO may bound (``bench --slo``'s keys), per valid point: the
# figures ``experiment.slo`` locates each arm's max load with.  Not compared between arms.
SLO_FIGURES = {
    "ttft": "ttft_ms_p99",
    "tpot": "tpot_ms_p99",
    "itl": "itl_ms_p99",
    "e2e": "e2e_ms_p99",
}

# metric -> (what it is, whether higher is better)
METRICS: dict[str, tuple[str, bool]] = {
    "output_tokens_per_s": ("output tok/s", True),
    "output_tokens_per_s_per_accelerator": ("output tok/s per accelerator", True),
    "tpot_ms_p50": ("TPOT p50 (ms)", False),
}

# arm -> block -> level -> metric -> one value per valid repetition
Samples = dict[str, dict[int, dict[float, dict[str, list[float]]]]]


def point_values(p: Point, accelerators: int | None) -> dict[str, float]:
    """The figures of one valid point: those compared (``METRICS``), each latency's p99 an
    SLO may bound (``SLO_FIGURES``) and the tokens/s one user sees (1000 / the judged
    TPOT, the Pareto view's x); per accelerator from the point itself (a recipe arm's
    provenance counts them) or from the arm's declared ``accelerators``."""
    out: dict[str, float] = {}
    if p.output_tokens_per_s is not None:
        out["output_tokens_per_s"] = p.output_tokens_per_s
        per = p.output_tokens_per_s_per_accelerator
        if per is None and accelerators:
            per = p.output_tokens_per_s / accelerators
        if per is not None:
            out["output_tokens_per_s_per_accelerator"] = per
    if p.tpot_ms.p50 is not None:
        out["tpot_ms_p50"] = p.tpot_ms.p50
    for key, name in SLO_FIGURES.items():
        latency = getattr(p, f"{key}_ms")
        # Where the engine's histogram leads a per-token figure (the client timed it
        # wrong), its percentiles are bucket midpoints, no figure (``results.tpot``).
        if latency.p99 is not None and not engine_led(p, f"{key}_ms"):
            out[name] = latency.p99
    per_user = judged(p).value
    if per_user:
        out["tokens_per_user"] = 1000.0 / per_user
    return out


def level_of(p: Point) -> float:
    return float(p.concurrency if p.concurrency is not None else p.rate or 0.0)


def samples_of(
    results: Mapping[tuple[str, int], Results],
    accelerators: Mapping[str, int | None],
    invalid_levels: Collection[tuple[str, float]] = (),
) -> Samples:
    """Every valid point's figures, by arm, block and level; none of a level invalid for
    its arm as a whole (``invalid_levels``: its PD handoff failed open there,
    ``experiment.evidence``)."""
    out: Samples = {}
    for (arm, block), res in results.items():
        by_level = out.setdefault(arm, {}).setdefault(block, {})
        for p in res.points:
            if not p.valid or (arm, level_of(p)) in invalid_levels:
                continue
            for metric, v in point_values(p, accelerators.get(arm)).items():
                by_level.setdefault(level_of(p), {}).setdefault(metric, []).append(v)
    return out


@dataclass(frozen=True)
class Ratio:
    arm: str
    baseline: str
    level: float
    metric: str
    ratio: float
    lo: float
    hi: float
    blocks: int

    @property
    def verdict(self) -> str:
        higher_better = METRICS[self.metric][1]
        if self.lo > 1:
            return "better" if higher_better else "worse"
        if self.hi < 1:
            return "worse" if higher_better else "better"
        return "not distinguishable"

    def to_dict(self, mode: str) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "baseline": self.baseline,
            mode: self.level,
            "metric": self.metric,
            "ratio": round(self.ratio, 5),
            "ci95": [round(self.lo, 5), round(self.hi, 5)],
            "blocks": self.blocks,
            "verdict": self.verdict,
        }


def bootstrap_ratio(
    arm: Sequence[Sequence[float]], base: Sequence[Sequence[float]], seed: int
) -> tuple[float, float, float]:
    """(ratio of medians over blocks, 2.5th and 97.5th percentiles) for paired blocks:
    ``arm[i]`` and ``base[i]`` are block i's repetitions.  One block: the interval is over
    its repetitions alone."""
    rng = np.random.default_rng(seed)
    n = len(arm)
    est = float(np.median([np.mean(b) for b in arm]) / np.median([np.mean(b) for b in base]))
    picks = rng.integers(0, n, size=(BOOTSTRAP_DRAWS, n))
    draws = block_medians(arm, picks, rng) / block_medians(base, picks, rng)
    lo, hi = np.nanpercentile(draws, [2.5, 97.5])
    return est, float(lo), float(hi)


def block_medians(
    blocks: Sequence[Sequence[float]], picks: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """For each draw (a row of ``picks``: the blocks drawn), the median over the drawn
    blocks of each one's mean over its repetitions drawn with replacement.  A block with no
    repetitions (no valid point at that level) counts for nothing in a draw that picks it;
    a draw that picks only such blocks is NaN."""
    draws, n = picks.shape
    means = np.empty((draws, n))
    for i, reps in enumerate(blocks):
        a = np.asarray(reps, dtype=float)
        if len(a) == 0:
            means[:, i] = np.nan
        elif len(a) == 1:
            means[:, i] = a[0]
        else:
            means[:, i] = a[rng.integers(0, len(a), size=(draws, len(a)))].mean(axis=1)
    # means[:, i] is block i's resampled mean in each draw; take each draw's picked blocks
    picked = np.take_along_axis(means, picks, axis=1)
    out = np.full(draws, np.nan)
    some = ~np.all(np.isnan(picked), axis=1)
    out[some] = np.nanmedian(picked[some], axis=1)
    return out


def ratios(samples: Samples, baseline: str, seed: int = 0) -> list[Ratio]:
    """Every arm against the baseline, per level both have and metric, over the blocks in
    which both have valid points there."""
    out: list[Ratio] = []
    base = samples.get(baseline, {})
    for arm in sorted(a for a in samples if a != baseline):
        levels = sorted({lv for blk in samples[arm].values() for lv in blk})
        for level in levels:
            for metric in METRICS:
                pairs = [
                    (samples[arm][b][level][metric], base[b][level][metric])
                    for b in sorted(samples[arm])
                    if b in base
                    and metric in samples[arm][b].get(level, {})
                    and metric in base[b].get(level, {})
                ]
                if not pairs:
                    continue
                est, lo, hi = bootstrap_ratio([a for a, _ in pairs], [b for _, b in pairs], seed)
                out.append(Ratio(arm, baseline, level, metric, est, lo, hi, len(pairs)))
    return out


def _side(r: Ratio) -> int:
    """+1: the interval is wholly above 1; -1: wholly below; 0: it holds 1."""
    return 1 if r.lo > 1 else -1 if r.hi < 1 else 0


def crossovers(rs: Sequence[Ratio]) -> list[dict[str, Any]]:
    """Per arm and metric, each place where the ratio's interval goes from wholly above 1
    to wholly below (or back) between two levels: ``between: [c_lo, c_hi]``, the last level
    on one side and the first on the other.  Where the ratio's estimate crosses 1 but the
    intervals hold 1 there, the crossover is ``undetermined`` (``between: null``)."""
    out: list[dict[str, Any]] = []
    keys = sorted({(r.arm, r.metric) for r in rs})
    for arm, metric in keys:
        series = sorted(
            (r for r in rs if r.arm == arm and r.metric == metric), key=lambda r: r.level
        )
        last: Ratio | None = None
        found = False
        for r in series:
            side = _side(r)
            if side == 0:
                continue
            if last is not None and side != _side(last):
                out.append(_crossing(r, metric, [last.level, r.level], side))
                found = True
            last = r
        estimates = [np.sign(r.ratio - 1) for r in series]
        if not found and len(set(estimates) - {0}) > 1:
            out.append(
                {
                    "arm": arm,
                    "baseline": series[0].baseline,
                    "metric": metric,
                    "between": None,
                    "undetermined": True,
                    "why": "the ratio's estimate crosses 1 but its intervals hold 1 there; "
                    "more blocks would narrow them",
                }
            )
    return out


def _crossing(r: Ratio, metric: str, between: list[float], side: int) -> dict[str, Any]:
    return {
        "arm": r.arm,
        "baseline": r.baseline,
        "metric": metric,
        "between": between,
        "direction": "above to below 1" if side < 0 else "below to above 1",
        "undetermined": False,
    }


def drift(samples: Samples, baseline: str, block_order: Sequence[int]) -> dict[str, Any] | None:
    """The baseline's own change in output tok/s from its first block to its last (in run
    order), per level and on average: a large one says the machine moved during the
    experiment (what interleaving protects the ratios from)."""
    base = samples.get(baseline, {})
    blocks = [b for b in block_order if b in base]
    if len(blocks) < 2:
        return None
    first, last = base[blocks[0]], base[blocks[-1]]
    per_level = {}
    for level in sorted(set(first) & set(last)):
        a = first[level].get("output_tokens_per_s")
        b = last[level].get("output_tokens_per_s")
        if a and b:
            per_level[f"{level:g}"] = round(float(np.mean(b) / np.mean(a)) - 1, 5)
    if not per_level:
        return None
    return {
        "arm": baseline,
        "metric": "output_tokens_per_s",
        "first_block": blocks[0],
        "last_block": blocks[-1],
        "change": round(float(np.mean(list(per_level.values()))), 5),
        "change_per_level": per_level,
    }
