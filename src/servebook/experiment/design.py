"""The order arms run in: blocks x arms, randomized and counterbalanced, from a seed.

Why: the field's tables ran each combination back to back, so whatever drifted over the
hours (a warming machine, a filling disk, a neighbour) was read as the difference between
combinations.  Here each block runs every arm once, and the blocks' orders are rows of a
Williams design (a balanced Latin square: each arm runs in each position equally often and
follows every other arm equally often), so a drift that is linear in time falls on every
arm alike.  The seed shuffles which arm takes which symbol and the order of the rows; the
same seed gives the same schedule (``--resume`` relies on it), and it is recorded.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


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


def sequential(arms: Sequence[str], blocks: int) -> list[list[str]]:
    """What the field did, for comparison only: every block of the first arm, then every
    block of the next.  Returned as blocks of one arm each, in run order."""
    return [[a] for a in arms for _ in range(blocks)]
