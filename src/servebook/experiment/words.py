"""The experiment's figures in sentences, for the terminal and the report."""

from __future__ import annotations

from typing import Any

from servebook.experiment.analysis import METRICS


def _level(value: float, mode: str) -> str:
    return f"c={value:g}" if mode == "concurrency" else f"rate={value:g}/s"


def comparison_line(c: dict[str, Any], mode: str) -> str:
    lo, hi = c["ci95"]
    what = METRICS[c["metric"]][0]
    return (
        f"  {c['arm']} / {c['baseline']} at {_level(c[mode], mode)}, {what}: "
        f"{c['ratio']:.3f} [{lo:.3f}, {hi:.3f}] over {c['blocks']} block(s): {c['verdict']}"
    )


def crossover_line(c: dict[str, Any]) -> str:
    what = METRICS[c["metric"]][0]
    if c.get("undetermined"):
        return f"  crossover of {c['arm']} vs {c['baseline']} in {what}: undetermined ({c['why']})"
    lo, hi = c["between"]
    better = METRICS[c["metric"]][1]
    above = "ahead" if better else "behind"
    below = "behind" if better else "ahead"
    first, then = (above, below) if c["direction"] == "above to below 1" else (below, above)
    return (
        f"  crossover: {c['arm']} is {first} of {c['baseline']} in {what} up to {lo:g} and "
        f"{then} from {hi:g} on; the crossover lies between {lo:g} and {hi:g} (95% intervals "
        "wholly on either side of 1)"
    )


def drift_line(d: dict[str, Any]) -> str:
    return (
        f"  drift: the baseline {d['arm']} changed {d['change']:+.1%} in output tok/s from "
        f"block {d['first_block']} to block {d['last_block']} (the machine moved during the "
        "experiment; interleaving spreads that over every arm)"
    )
