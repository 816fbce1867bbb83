"""Max load under an SLO, per arm: the highest concurrency (or rate) at which the arm's p99
of every latency the SLO bounds (``bench --slo``'s keys: ``ttft``, ``tpot``, ``itl``,
``e2e``) is at or under its limit, with a 95% interval.

How it is located.  A level's figure for each objective is the median over blocks of the
block's mean p99 over its repetitions: the estimator the ratios use
(``analysis.bootstrap_ratio``), so a block disturbed by a neighbour moves it as little.
Going up the swept levels, the arm meets the SLO until the first level where some
objective's figure exceeds its limit; between that level and the one below, each missed
objective's figure is interpolated linearly in the level, and the max load is where the
first of them reaches its limit.  The issue asked for bisection between the swept levels;
bisection would run more levels inside the bracket, in every block, which an experiment's
fixed schedule of benches does not do, so the crossing is interpolated on the measured
levels instead, and ``between`` says which two measured levels hold it.  A latency that
bends sharply inside the bracket (a queue forming) makes the straight line optimistic or
pessimistic by up to the bracket's width: a level between them, swept in a new
experiment, narrows it.

A TPOT or ITL p99 is the client's, where no engine's histogram leads that figure among
the arm's points at the level (judged together, ``results.tpot.judge_together``, as
everywhere else); where one leads, the histogram places the p99 only within a bucket, and
the level has no figure for that objective.

The interval is the same block bootstrap the comparisons use: each draw resamples blocks
(the same ones at every level: a block is one slot of the machine's time) and, inside each,
its repetitions, and locates the crossing again.  A draw in which the arm meets the SLO at
every level counts as the highest level, and one in which it misses at the lowest as the
lowest: the interval is clipped to the swept range, and ``outcome`` says when the estimate
itself lies outside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from servebook.experiment.analysis import BOOTSTRAP_DRAWS, SLO_FIGURES, Samples, block_medians

CROSSED = "crossed"
MET_EVERYWHERE = "met at every level"
MISSED_EVERYWHERE = "missed at the lowest level"
NO_FIGURE = "no figure"


def crossing(
    levels: Sequence[float], figures: Mapping[str, Sequence[float]], slo: Mapping[str, float]
) -> tuple[str, float | None, list[float | None], str | None]:
    """(outcome, max load, the two measured levels that hold it, the objective that binds)
    from each objective's figure per level (``figures[key][i]`` at ``levels[i]``, NaN:
    none).  Pure: the estimate and every bootstrap draw go through here."""
    met = [
        all(np.isfinite(figures[k][i]) and figures[k][i] <= limit for k, limit in slo.items())
        for i in range(len(levels))
    ]
    if not met[0]:
        return MISSED_EVERYWHERE, None, [None, levels[0]], None
    miss = next((i for i, ok in enumerate(met) if not ok), None)
    if miss is None:
        return MET_EVERYWHERE, None, [levels[-1], None], None
    lo, hi = levels[miss - 1], levels[miss]
    best: tuple[float, str] | None = None
    for key, limit in slo.items():
        a, b = figures[key][miss - 1], figures[key][miss]
        if not np.isfinite(b) or b <= limit:
            continue  # met at the upper level too, or not measured there
        at = lo + (limit - a) / (b - a) * (hi - lo)  # a <= limit < b
        if best is None or at < best[0]:
            best = (at, key)
    if best is None:  # missed only for want of a figure at the upper level
        return CROSSED, hi, [lo, hi], None
    return CROSSED, float(best[0]), [lo, hi], best[1]


def _clipped(outcome: str, level: float | None, levels: Sequence[float]) -> float:
    if outcome == MET_EVERYWHERE:
        return float(levels[-1])
    if outcome == MISSED_EVERYWHERE:
        return float(levels[0])
    return float(level) if level is not None else float("nan")


def max_load(
    blocks: Mapping[int, Mapping[float, Mapping[str, list[float]]]],
    slo: Mapping[str, float],
    seed: int = 0,
) -> dict[str, Any]:
    """One arm's max load under ``slo`` (ms per key) from its samples (block -> level ->
    figure -> one value per valid repetition)."""
    names = {k: SLO_FIGURES[k] for k in slo}
    levels = sorted({lv for blk in blocks.values() for lv in blk})
    order = sorted(blocks)
    reps = {
        (lv, k): [list(blocks[b].get(lv, {}).get(name, [])) for b in order]
        for lv in levels
        for k, name in names.items()
    }
    usable = [lv for lv in levels if all(any(r) for r in (reps[(lv, k)] for k in names))]
    if not usable:
        return {"outcome": NO_FIGURE, "level": None, "ci95": None, "between": None,
                "binding": None, "blocks": len(order),
                "why": "no valid point has a p99 of every latency the SLO bounds"}  # fmt: skip
    est = {
        k: [float(np.median([np.mean(r) for r in reps[(lv, k)] if r])) for lv in usable]
        for k in names
    }
    outcome, level, between, binding = crossing(usable, est, slo)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(order), size=(BOOTSTRAP_DRAWS, len(order)))
    drawn = {k: [block_medians(reps[(lv, k)], picks, rng) for lv in usable] for k in names}
    found = []
    for d in range(BOOTSTRAP_DRAWS):
        fig = {k: [float(drawn[k][i][d]) for i in range(len(usable))] for k in names}
        o, x, _, _ = crossing(usable, fig, slo)
        found.append(_clipped(o, x, usable))
    lo, hi = np.nanpercentile(found, [2.5, 97.5])
    return {
        "outcome": outcome,
        "level": None if level is None else round(level, 4),
        "ci95": [round(float(lo), 4), round(float(hi), 4)],
        "between": between,
        "binding": binding,
        "blocks": len(order),
    }


def max_loads(samples: Samples, slo: Mapping[str, float], seed: int = 0) -> list[dict[str, Any]]:
    """Every arm's max load under ``slo``: ``[{arm, slo, level, ci95, between, outcome,
    binding, blocks}]``."""
    return [
        {"arm": arm, "slo": dict(slo), **max_load(samples[arm], slo, seed)}
        for arm in sorted(samples)
    ]
