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
An arm's own figure at a level (the report's table, the Pareto view) is the same median
with the same bootstrap's interval (:func:`bootstrap_median`).

A verdict (``better``/``worse``) needs :data:`MIN_BLOCKS` valid blocks: below that the
interval is not evidence of a difference, and the verdict says how many blocks it had.

TPOT is judged as every reader of servebook judges it (``results.tpot``): the points of one
level, of every arm and block, are judged together (``judge_together``), on the client's
p50 or, where any engine's histogram leads, on each engine's exact mean; the comparisons
record which (``judged_on``).  Measured in a four-arm experiment (issue 49): pd-spec's p50
was a histogram bucket's value (14.64, 5.00, 6.14 ms where the exact means were 33.9,
7.85, 8.91), and the stored p50 made pd-spec/mixed at c=4 1.217, "not distinguishable",
where the exact means give 1.748 [1.05, 3.16].

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
from servebook.results.tpot import figure, judge_together

BOOTSTRAP_DRAWS = 2000

# The fewest valid blocks a verdict is given from.  One block's interval is over its
# repetitions alone: the scatter between blocks (fresh deployments in other slots of the
# machine's time, the largest in the field trials) is not in it.  Two blocks give a
# bootstrap three distinct draws, and its interval is at most the range between two
# values, which holds the middle of the blocks' spread only half the time (n blocks' range
# holds it with 1 - 2 x 0.5^n: 75% for 3, 94% for 5).  Three is the least from which the
# interval reflects block scatter at all, and the experiment file's default; more blocks
# make a verdict firmer.
MIN_BLOCKS = 3

# The p99 of each latency an SLO may bound (``bench --slo``'s keys), per valid point: the
# figures ``experiment.slo`` locates each arm's max load with.  Not compared between arms.
SLO_FIGURES = {
    "ttft": "ttft_ms_p99",
    "tpot": "tpot_ms_p99",
    "itl": "itl_ms_p99",
    "e2e": "e2e_ms_p99",
}

# metric -> (what it is, whether higher is better).  TPOT: the judged one (``results.tpot``).
METRICS: dict[str, tuple[str, bool]] = {
    "output_tokens_per_s": ("output tok/s", True),
    "output_tokens_per_s_per_accelerator": ("output tok/s per accelerator", True),
    "tpot_ms": ("TPOT (ms)", False),
}

# Each arm's own figures at a level beside the compared ones (the report's table, not
# compared): TTFT's p50 (``point_values``) and the p99s an SLO bounds (``SLO_FIGURES``).
SHOWN = ("ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p99")

# arm -> block -> level -> metric -> one value per valid repetition
Samples = dict[str, dict[int, dict[float, dict[str, list[float]]]]]


def point_values(p: Point, accelerators: int | None, tpot: str) -> dict[str, float]:
    """The compared figures of one valid point (``METRICS``), the tokens/s one user sees
    (1000 / TPOT, the Pareto view's x) and its TTFT p50 (``SHOWN``), TPOT as its level is
    judged (``tpot``: ``tpot_ms.p50`` or ``tpot_ms.mean``, :func:`samples_of`); per
    accelerator from the point itself (a recipe arm's provenance counts them) or from the
    arm's declared ``accelerators``."""
    out: dict[str, float] = {}
    if p.output_tokens_per_s is not None:
        out["output_tokens_per_s"] = p.output_tokens_per_s
        per = p.output_tokens_per_s_per_accelerator
        if per is None and accelerators:
            per = p.output_tokens_per_s / accelerators
        if per is not None:
            out["output_tokens_per_s_per_accelerator"] = per
    value = figure(p, tpot)
    if value:
        out["tpot_ms"] = value
        out["tokens_per_user"] = 1000.0 / value
    if p.ttft_ms.p50 is not None:
        out["ttft_ms_p50"] = p.ttft_ms.p50
    return out


def slo_values(points: list[Point]) -> list[dict[str, float]]:
    """Each point's p99 of every latency an SLO may bound (``SLO_FIGURES``), the points
    (one arm at one level) judged together: where an engine's histogram leads a per-token
    figure, its percentiles are a bucket, no figure (``results.tpot``)."""
    _, same = judge_together(points)  # TPOT and ITL alike from one source (one_source)
    out = []
    for p in same:
        values = {}
        for key, name in SLO_FIGURES.items():
            v = figure(p, f"{key}_ms.p99")
            if v is not None:
                values[name] = v
        out.append(values)
    return out


def level_label(value: float, mode: str) -> str:
    """``c=4`` or ``rate=2.5/s``: a level as every table and sentence of an experiment
    names it."""
    return f"c={value:g}" if mode == "concurrency" else f"rate={value:g}/s"


def level_of(p: Point) -> float:
    return float(p.concurrency if p.concurrency is not None else p.rate or 0.0)


def samples_of(
    results: Mapping[tuple[str, int], Results],
    accelerators: Mapping[str, int | None],
    invalid_levels: Collection[tuple[str, float]] = (),
) -> tuple[Samples, dict[float, str]]:
    """Every valid point's figures, by arm, block and level, and what TPOT is judged on at
    each level (``tpot_ms.p50`` or ``tpot_ms.mean``): a level's points of every arm and
    block judged together (``results.tpot.judge_together``), so one arm's TPOT is the same
    figure in every ratio, table and plot; none of a level invalid for its arm as a whole
    (``invalid_levels``: its PD handoff failed open there, ``experiment.evidence``)."""
    out: Samples = {}
    by_level: dict[float, list[tuple[str, int, Point]]] = {}
    for (arm, block), res in results.items():
        out.setdefault(arm, {}).setdefault(block, {})
        for p in res.points:
            if (arm, level_of(p)) not in invalid_levels:
                by_level.setdefault(level_of(p), []).append((arm, block, p))
    judged_on: dict[float, str] = {}
    for level, entries in sorted(by_level.items()):
        key, same = judge_together([p for _, _, p in entries])
        judged_on[level] = key
        for (arm, block, _), p in zip(entries, same, strict=True):
            if p.valid:
                figures = point_values(p, accelerators.get(arm), key)
                _add(out[arm][block], level, figures)
        for arm in {a for a, _, _ in entries}:
            mine = [(b, p) for a, b, p in entries if a == arm]
            for (block, p), figures in zip(mine, slo_values([p for _, p in mine]), strict=True):
                if p.valid:
                    _add(out[arm][block], level, figures)
    return out, judged_on


def _add(
    block: dict[float, dict[str, list[float]]], level: float, figures: dict[str, float]
) -> None:
    for metric, v in figures.items():
        block.setdefault(level, {}).setdefault(metric, []).append(v)


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
    judged_on: str | None = None  # TPOT: ``tpot_ms.p50`` or ``tpot_ms.mean``

    @property
    def decided(self) -> bool:
        """Enough valid blocks for a verdict (:data:`MIN_BLOCKS`)."""
        return self.blocks >= MIN_BLOCKS

    @property
    def verdict(self) -> str:
        higher_better = METRICS[self.metric][1]
        if not self.decided:
            return f"not enough blocks ({self.blocks} of {MIN_BLOCKS} needed)"
        if self.lo > 1:
            return "better" if higher_better else "worse"
        if self.hi < 1:
            return "worse" if higher_better else "better"
        return "not distinguishable"

    def to_dict(self, mode: str) -> dict[str, Any]:
        out = {
            "arm": self.arm,
            "baseline": self.baseline,
            mode: self.level,
            "metric": self.metric,
            "ratio": round(self.ratio, 5),
            "ci95": [round(self.lo, 5), round(self.hi, 5)],
            "blocks": self.blocks,
            "verdict": self.verdict,
        }
        if self.judged_on is not None:
            out["judged_on"] = self.judged_on
        return out


def bootstrap_ratio(
    arm: Sequence[Sequence[float]], base: Sequence[Sequence[float]], seed: int
) -> tuple[float, float, float]:
    """(ratio of medians over blocks, 2.5th and 97.5th percentiles) for paired blocks:
    ``arm[i]`` and ``base[i]`` are block i's repetitions.  One block: the interval is over
    its repetitions alone."""
    rng = np.random.default_rng(seed)
    est = median_of_means(arm) / median_of_means(base)
    picks = rng.integers(0, len(arm), size=(BOOTSTRAP_DRAWS, len(arm)))
    draws = block_medians(arm, picks, rng) / block_medians(base, picks, rng)
    lo, hi = np.nanpercentile(draws, [2.5, 97.5])
    return est, float(lo), float(hi)


def bootstrap_median(blocks: Sequence[Sequence[float]], seed: int) -> tuple[float, float, float]:
    """(median over blocks of each block's mean, 2.5th and 97.5th percentiles): one arm's
    figure at a level with the ratios' own bootstrap (:func:`bootstrap_ratio`'s
    numerator), ``blocks[i]`` block i's repetitions."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(blocks), size=(BOOTSTRAP_DRAWS, len(blocks)))
    lo, hi = np.nanpercentile(block_medians(blocks, picks, rng), [2.5, 97.5])
    return median_of_means(blocks), float(lo), float(hi)


def median_of_means(blocks: Sequence[Sequence[float]]) -> float:
    """The median over blocks of each block's mean over its repetitions (blocks with
    none left out)."""
    return float(np.median([np.mean(b) for b in blocks if len(b)]))


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


def ratios(
    samples: Samples, baseline: str, seed: int = 0, judged_on: Mapping[float, str] | None = None
) -> list[Ratio]:
    """Every arm against the baseline, per level both have and metric, over the blocks in
    which both have valid points there; ``judged_on``: what TPOT is judged on per level
    (:func:`samples_of`), recorded with its ratios."""
    arms = sorted(a for a in samples if a != baseline)
    return pair_ratios(samples, [(arm, baseline) for arm in arms], seed, judged_on)


def pair_ratios(
    samples: Samples,
    pairs: Sequence[tuple[str, str]],
    seed: int = 0,
    judged_on: Mapping[float, str] | None = None,
) -> list[Ratio]:
    """Each ``(arm, over)`` pair's ratios, as :func:`ratios` gives an arm's to the baseline
    (``over`` in the baseline's place): ``experiment --pair pd-spec:pd`` is speculation's
    own effect inside PD, which no ratio to a third arm shows."""
    judged_on = judged_on or {}
    out: list[Ratio] = []
    for arm, over in pairs:
        mine, base = samples.get(arm, {}), samples.get(over, {})
        levels = sorted({lv for blk in mine.values() for lv in blk})
        for level in levels:
            for metric in METRICS:
                both = [
                    (mine[b][level][metric], base[b][level][metric])
                    for b in sorted(mine)
                    if b in base
                    and metric in mine[b].get(level, {})
                    and metric in base[b].get(level, {})
                ]
                if not both:
                    continue
                est, lo, hi = bootstrap_ratio([a for a, _ in both], [b for _, b in both], seed)
                on = judged_on.get(level) if metric == "tpot_ms" else None
                out.append(Ratio(arm, over, level, metric, est, lo, hi, len(both), on))
    return out


def _side(r: Ratio) -> int:
    """+1: the interval is wholly above 1; -1: wholly below; 0: it holds 1, or too few
    blocks for a verdict."""
    if not r.decided:
        return 0
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
            few = min(r.blocks for r in series)
            why = (
                f"the ratio's estimate crosses 1, but from {few} valid block(s), fewer than "
                f"the {MIN_BLOCKS} a verdict needs"
                if few < MIN_BLOCKS
                else "the ratio's estimate crosses 1 but its intervals hold 1 there; more "
                "blocks would narrow them"
            )
            out.append(
                {
                    "arm": arm,
                    "baseline": series[0].baseline,
                    "metric": metric,
                    "between": None,
                    "undetermined": True,
                    "why": why,
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
