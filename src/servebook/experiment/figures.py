"""``DIR/experiment.json``'s figures from the state and the arms' results files: which
blocks are valid (and why not), the server evidence per arm and level (and the levels an
arm's handoff failed open at), the comparisons, the crossovers and the drift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servebook.experiment import analysis, evidence, slo
from servebook.experiment.runner import DONE, PENDING
from servebook.results import stats
from servebook.results.schema import RESULTS_NAME, Results
from servebook.results.store import load_results


def invalid_blocks(state: dict[str, Any]) -> dict[int, str]:
    """Block -> why it is invalid: the first of its entries that did not finish."""
    out: dict[int, str] = {}
    for e in state["schedule"]:
        if e["outcome"] not in (DONE, PENDING) and e["block"] not in out:
            out[e["block"]] = f"arm {e['arm']} {e['outcome']}"
    return out


def finished_results(state: dict[str, Any], out_dir: Path) -> dict[tuple[str, int], Results]:
    """The results of every finished entry of a valid block."""
    bad = invalid_blocks(state)
    out = {}
    for e in state["schedule"]:
        if e["outcome"] == DONE and e["block"] not in bad:
            arm, block = e["arm"], e["block"]
            out[(arm, block)] = load_results(
                out_dir / "arms" / arm / f"block-{block}" / RESULTS_NAME
            )
    return out


def mode_of(results: dict[tuple[str, int], Results]) -> str:
    for res in results.values():
        for p in res.points:
            return "concurrency" if p.concurrency is not None else "rate"
    return "concurrency"


def update(state: dict[str, Any], out_dir: Path) -> None:
    """Recompute the figures into ``state`` from what has finished so far."""
    results = finished_results(state, out_dir)
    acc = {a["name"]: a.get("accelerators") for a in state["arms"]}
    state["evidence"] = evidence.per_level(results)
    samples = analysis.samples_of(results, acc, evidence.invalid_levels(state["evidence"]))
    rs = analysis.ratios(samples, state["baseline"], seed=state["seed"])
    mode = mode_of(results)
    order: list[int] = []
    for e in state["schedule"]:
        if e["arm"] == state["baseline"] and e["outcome"] == DONE and e["block"] not in order:
            order.append(e["block"])
    state["level_mode"] = mode
    state["invalid_blocks"] = [
        {"block": b, "reason": why} for b, why in sorted(invalid_blocks(state).items())
    ]
    state["comparisons"] = [r.to_dict(mode) for r in rs]
    state["crossovers"] = analysis.crossovers(rs)
    state["drift"] = analysis.drift(samples, state["baseline"], order)
    state["absolute"] = absolute(samples)
    state["pareto"] = pareto(samples)
    if state.get("slo"):
        state["max_load"] = slo.max_loads(samples, state["slo"], seed=state["seed"])
    else:
        state.pop("max_load", None)
    state["provenance"] = measured_differences(state, results)


def measured_differences(
    state: dict[str, Any], results: dict[tuple[str, int], Results]
) -> list[dict[str, Any]]:
    """Each arm's measured provenance (its first finished block's results) against the
    baseline's, by ``compare``'s own comparison: what the servers said (``/version``, each
    role's command line and image) may differ from what was declared before the start.  A
    difference outside ``variable:`` is listed here, and the report says so."""
    from servebook.report.comparability import comparability

    first: dict[str, Results] = {}
    for (arm, _block), res in sorted(results.items(), key=lambda kv: kv[0][1]):
        first.setdefault(arm, res)
    base = first.get(state["baseline"])
    if base is None:
        return []
    out = []
    for arm, res in sorted(first.items()):
        if arm == state["baseline"]:
            continue
        c = comparability(base.provenance, res.provenance, state["variable"])
        out.append(
            {
                "arm": arm,
                "like_for_like": c.like_for_like,
                "differences": [d.to_dict() | {"under_test": d.kind in c.allowed_kinds}
                                for d in c.differences],
            }
        )  # fmt: skip
    return out


def absolute(samples: analysis.Samples) -> list[dict[str, Any]]:
    """Each arm's mean per level and metric over its valid blocks (the report's table)."""
    out = []
    for arm, blocks in sorted(samples.items()):
        levels = sorted({lv for blk in blocks.values() for lv in blk})
        for level in levels:
            row: dict[str, Any] = {"arm": arm, "level": level}
            for metric in analysis.METRICS:
                means = [
                    sum(v) / len(v)
                    for blk in blocks.values()
                    if (v := blk.get(level, {}).get(metric))
                ]
                row[metric] = round(sum(means) / len(means), 4) if means else None
            row["blocks"] = sum(1 for blk in blocks.values() if level in blk)
            out.append(row)
    return out


def _block_means(blocks: dict[int, Any], level: float, metric: str) -> list[float]:
    return [sum(v) / len(v) for blk in blocks.values() if (v := blk.get(level, {}).get(metric))]


def _figure(values: list[float]) -> list[float | None]:
    """[mean, low, high] over blocks (a t interval; no interval from one block), cut at 0:
    neither axis can go below it, and two blocks' t interval (t = 12.7 on one degree of
    freedom) reached -1,300 tok/s in a real run's Pareto view."""
    f = stats.mean_ci(values).within(0.0, None)
    return [None if x is None else round(x, 4) for x in (f.mean, f.low, f.high)]


def pareto(samples: analysis.Samples) -> dict[str, Any]:
    """Each arm's levels as the Pareto view draws them: output tokens/s per user (1000 / the
    judged TPOT) against output tokens/s per accelerator, or absolute where no arm has an
    accelerator count; each the mean over valid blocks of the block's mean, with a 95%
    interval over blocks.  An arm without a count beside arms with one is left out, named."""
    per_acc = "output_tokens_per_s_per_accelerator"
    known = {
        arm
        for arm, blocks in samples.items()
        if any(per_acc in m for blk in blocks.values() for m in blk.values())
    }
    y = per_acc if known else "output_tokens_per_s"
    points = []
    for arm, blocks in sorted(samples.items()):
        if known and arm not in known:
            continue
        for level in sorted({lv for blk in blocks.values() for lv in blk}):
            xs, ys = _block_means(blocks, level, "tokens_per_user"), _block_means(blocks, level, y)
            if xs and ys:
                points.append(
                    {"arm": arm, "level": level, "tokens_per_user": _figure(xs),
                     "tokens_per_s": _figure(ys)}
                )  # fmt: skip
    return {
        "per_accelerator": bool(known),
        "left_out": sorted(set(samples) - known) if known else [],
        "points": points,
    }
