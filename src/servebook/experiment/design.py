"""The order arms run in: blocks x arms, randomized and counterbalanced, from a seed.

Why: the field's tables ran each combination back to back, so whatever drifted over the
hours (a warming machine, a filling disk, a neighbour) was read as the difference between
combinations.  Here each block runs every arm once, and the blocks' orders are rows of a
Williams design (a balanced Latin square: each arm runs in each position equally often and
follows every other arm equally often), so a drift that is linear in time falls on every
arm alike.  The seed shuffles which arm takes which symbol and the order of the rows; the
same seed gives the same schedule (``--resume`` relies on it), and it is recorded.

The load levels inside each bench are ordered the same way (:func:`level_orders`): a bench
of one seed and one order ran c=1 before c=4 in all 48 benches of two experiments
(issue 49), so whatever a bench's first minutes do (a fresh deployment's cold caches) fell
on c=1 alone.  Each block's benches take their own row of a Williams design over the
levels, and each round of a bench the next row, so over the blocks every level runs in
every position equally often (exactly, over each full cycle of rows: n blocks for n levels
when n is even, 2n when odd).  Every arm of a block runs the block's order: the arms a
ratio sets side by side then met each level at the same place in their benches, so a
position effect cancels inside every block instead of only on average over blocks (where
it would widen every interval) or not at all (one block).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def williams_rows(n: int) -> list[list[int]]:
    """A Williams design for ``n`` treatments: n rows when n is even, 2n when odd (the
    square and its mirror), each row an order of 0..n-1."""
    first = [0]
    lo, hi = 1, n - 1
    for i in range(1, n):
        if i % 2:
            first.append(lo)
            lo += 1
        else:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % n for x in first] for r in range(n)]
    if n % 2:
        rows += [list(reversed(row)) for row in rows]
    return rows


def schedule(arms: Sequence[str], blocks: int, seed: int) -> list[list[str]]:
    """Each block's order of ``arms``: rows of a Williams design, a fresh random row order
    for each full pass through the rows, arm-to-symbol assignment shuffled once."""
    rng = random.Random(f"servebook-experiment-{seed}")
    symbols = list(arms)
    rng.shuffle(symbols)
    rows = williams_rows(len(symbols))
    out: list[list[str]] = []
    while len(out) < blocks:
        order = list(range(len(rows)))
        rng.shuffle(order)
        out += [[symbols[x] for x in rows[r]] for r in order]
    return out[:blocks]


def level_rows(levels: Sequence[T], seed: int) -> list[list[T]]:
    """The orders of ``levels`` an experiment's benches take turns on: the rows of a
    Williams design over them, in the design's order (each n consecutive rows from the
    first, or from the n-th, put every level in every position once), which level takes
    which symbol shuffled once by the seed."""
    rng = random.Random(f"servebook-levels-{seed}")
    symbols = list(levels)
    rng.shuffle(symbols)
    return [[symbols[x] for x in row] for row in williams_rows(len(symbols))]


def level_orders(levels: Sequence[T], block: int, seed: int) -> list[list[T]]:
    """Each round's order of ``levels`` in every bench of ``block`` (1 on): round r runs
    row ``block - 1 + r`` of :func:`level_rows`, cycling; a bench with more rounds than
    rows starts over at the first."""
    rows = level_rows(levels, seed)
    k = (block - 1) % len(rows)
    return rows[k:] + rows[:k]


def sequential(arms: Sequence[str], blocks: int) -> list[list[str]]:
    """What the field did, for comparison only: every block of the first arm, then every
    block of the next.  Returned as blocks of one arm each, in run order."""
    return [[a] for a in arms for _ in range(blocks)]
