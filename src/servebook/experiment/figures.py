"""``DIR/experiment.json``'s figures from the state and the arms' results files: which
blocks are valid (and why not), the order every bench ran its levels in, the server
evidence per arm and level (and the levels an arm's handoff failed open at), the
comparisons, the crossovers and the drift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servebook.bench.protocol import Level
from servebook.experiment import analysis, evidence, slo
from servebook.experiment.runner import DONE, PENDING
from servebook.results.schema import RESULTS_NAME, Point, Results
from servebook.results.store import load_results


def invalid_blocks(state: dict[str, Any]) -> dict[int, str]:
    """Block -> why it is invalid: the first of its entries that did not finish."""
    out: dict[int, str] = {}
    for e in state["schedule"]:
        if e["outcome"] not in (DONE, PENDING) and e["block"] not in out:
            out[e["block"]] = f"arm {e['arm']} {e['outcome']}"
    return out


def done_results(state: dict[str, Any], out_dir: Path) -> dict[tuple[str, int], Results]:
    """The results of every finished entry, in run order (an invalid block's too)."""
    out = {}
    for e in state["schedule"]:
        if e["outcome"] == DONE:
            arm, block = e["arm"], e["block"]
            out[(arm, block)] = load_results(
                out_dir / "arms" / arm / f"block-{block}" / RESULTS_NAME
            )
    return out


def label_of(p: Point) -> str:
    return Level(concurrency=p.concurrency, rate=p.rate).label()


def level_orders(results: dict[tuple[str, int], Results]) -> list[dict[str, Any]]:
    """The order each finished bench ran its levels in, round by round (a round: one
    repetition of every level; ``experiment.design.level_orders``), from the points in its
    results file (kept in run order): ``[{block, arm, rounds: [[c=4, c=1], ...]}]``."""
    out = []
    for (arm, block), res in results.items():
        rounds: dict[int, list[str]] = {}
        for p in res.points:
            rounds.setdefault(p.repetition, []).append(label_of(p))
        out.append({"block": block, "arm": arm, "rounds": [rounds[r] for r in sorted(rounds)]})
    return out


def level_positions(orders: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """How often each level ran first and last in a round, over every round of every
    finished bench (rounds of more than one level)."""
    out: dict[str, dict[str, int]] = {}
    for entry in orders:
        for labels in entry["rounds"]:
            if len(labels) < 2:
                continue
            for label in labels:
                row = out.setdefault(label, {"first": 0, "last": 0, "rounds": 0})
                row["rounds"] += 1
                row["first"] += label == labels[0]
                row["last"] += label == labels[-1]
    return out


def mode_of(results: dict[tuple[str, int], Results]) -> str:
    for res in results.values():
        for p in res.points:
            return "concurrency" if p.concurrency is not None else "rate"
    return "concurrency"


def update(state: dict[str, Any], out_dir: Path) -> None:
    """Recompute the figures into ``state`` from what has finished so far."""
    ran = done_results(state, out_dir)
    bad = invalid_blocks(state)
    results = {k: r for k, r in ran.items() if k[1] not in bad}  # the valid blocks'
    acc = {a["name"]: a.get("accelerators") for a in state["arms"]}
    state["level_orders"] = level_orders(ran)
    state["level_positions"] = level_positions(state["level_orders"])
    state["evidence"] = evidence.per_level(results)
    samples, tpot_on = analysis.samples_of(results, acc, evidence.invalid_levels(state["evidence"]))
    rs = analysis.ratios(samples, state["baseline"], seed=state["seed"], judged_on=tpot_on)
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
    state["min_blocks"] = analysis.MIN_BLOCKS
    state["tpot_judged_on"] = {f"{lv:g}": key for lv, key in tpot_on.items()}
    state["absolute"] = absolute(samples) + without_figures(state, samples, mode)
    pairs = [(str(a), str(b)) for a, b in state.get("pairs") or []]
    state["pair_comparisons"] = [
        r.to_dict(mode)
        for r in analysis.pair_ratios(samples, pairs, seed=state["seed"], judged_on=tpot_on)
    ]
    state["arm_provenance"] = arm_provenance(state, results)
    state["measured_load"] = measured_load(state, results)
    state["pareto"] = pareto(samples, seed=state["seed"])
    if state.get("slo"):
        state["max_load"] = slo.max_loads(samples, state["slo"], seed=state["seed"])
    else:
        state.pop("max_load", None)
    state["provenance"] = measured_differences(state, results)
    state["no_comparison"] = no_comparison(state)


def no_comparison(state: dict[str, Any]) -> str | None:
    """Why a finished experiment compares nothing (no ratio to the baseline at any
    level), else None: such an experiment exits non-zero and its report says so first
    (hostile probe D5: every block invalid or empty read as "No crossover", exit 0)."""
    if state["comparisons"] or any(e["outcome"] == PENDING for e in state["schedule"]):
        return None
    bad = state["invalid_blocks"]
    if len(bad) == state["blocks"]:
        return (
            "every block is invalid ("
            + "; ".join(f"block {b['block']}: {b['reason']}" for b in bad)
            + ")"
        )
    levels = [r for r in state.get("evidence", []) if not r["valid"]]
    return (
        "no level has valid figures of the baseline and another arm in one valid block"
        + (f" ({len(bad)} block(s) invalid)" if bad else "")
        + (f"; {len(levels)} arm-level(s) invalid by their evidence" if levels else "")
    )


def first_results(results: dict[tuple[str, int], Results]) -> dict[str, Results]:
    """Each arm's results of its first valid block (the lowest block number): what its
    provenance is read from."""
    first: dict[str, Results] = {}
    for (arm, _block), res in sorted(results.items(), key=lambda kv: kv[0][1]):
        first.setdefault(arm, res)
    return first


def measured_differences(
    state: dict[str, Any], results: dict[tuple[str, int], Results]
) -> list[dict[str, Any]]:
    """Each arm's measured provenance (its first finished block's results) against the
    baseline's, by ``compare``'s own comparison: what the servers said (``/version``, each
    role's command line and image) may differ from what was declared before the start.  A
    difference outside ``variable:`` is listed here, and the report says so."""
    from servebook.report.comparability import comparability

    first = first_results(results)
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
    """Each arm per level and metric: the median over its valid blocks of each block's mean
    (the figure its ratios divide, ``analysis.median_of_means``; the report's table)."""
    out = []
    for arm, blocks in sorted(samples.items()):
        levels = sorted({lv for blk in blocks.values() for lv in blk})
        for level in levels:
            row: dict[str, Any] = {"arm": arm, "level": level}
            for metric in (*analysis.METRICS, *analysis.SHOWN):
                reps = _block_reps(blocks, level, metric)
                row[metric] = round(analysis.median_of_means(reps), 4) if reps else None
            row["blocks"] = sum(1 for blk in blocks.values() if level in blk)
            out.append(row)
    return out


def without_figures(
    state: dict[str, Any], samples: analysis.Samples, mode: str
) -> list[dict[str, Any]]:
    """A row for each arm with no figure at any level (``level: None``) and why: its
    entries' outcomes where none finished in a valid block, else the checks its points
    failed (``evidence``), so that an arm whose every point is invalid is in the table,
    not silently missing from it."""
    out = []
    for arm in (a["name"] for a in state["arms"]):
        if any(blk for blk in samples.get(arm, {}).values()):
            continue
        rows = [r for r in state.get("evidence", []) if r["arm"] == arm]
        if rows:
            why = "; ".join(
                f"{r['invalid_reason']}" if not r["valid"]
                else f"{r['points'] - r['valid_points']} of {r['points']} point(s) at "
                f"{analysis.level_label(r['level'], mode)} invalid "
                f"({', '.join(r['invalid_checks']) or 'see its results'})"
                for r in rows
            )  # fmt: skip
        else:
            ended = [e for e in state["schedule"] if e["arm"] == arm]
            why = "; ".join(f"block {e['block']}: {e['outcome']}" for e in ended) or "not run"
        out.append({"arm": arm, "level": None, "blocks": 0, "why": f"no valid point: {why}"})
    return out


def arm_provenance(
    state: dict[str, Any], results: dict[tuple[str, int], Results]
) -> list[dict[str, Any]]:
    """Each arm as a pull request states it, from its first valid block's results (what
    its servers said): the engine and its version, the images, the model, the accelerator
    count per-accelerator figures divide by (``from``: the deployment's plan, or the
    arm's ``accelerators:``), the packages and servebook's version and commit; and the
    load and workload every arm ran (the baseline's, as measured)."""
    from servebook.results.provenance import servebook_of

    first = first_results(results)
    out = []
    for a in state["arms"]:
        row: dict[str, Any] = {"arm": a["name"], "what": a["what"], "measured": False}
        declared = a.get("accelerators")
        row["accelerators"], row["accelerators_from"] = (
            (declared, "declared") if declared else (None, None)
        )
        measured = first.get(a["name"])
        if measured is not None:
            prov = measured.provenance
            images = sorted({r.image for r in prov.roles if r.image})
            row |= {
                "measured": True,
                "engine": prov.engine,
                "engine_version": prov.engine_version,
                "images": images,
                "model": prov.model.name,
                "model_config_hash": prov.model.config_hash,
                "topology": prov.target.get("topology"),
                "packages": dict(prov.packages),
                "servebook": servebook_of(prov),
            }
            if prov.accelerators_used:
                row["accelerators"], row["accelerators_from"] = prov.accelerators_used, "plan"
                if declared and declared != prov.accelerators_used:
                    row["accelerators_declared"] = declared
        out.append(row)
    return out


def measured_load(
    state: dict[str, Any], results: dict[tuple[str, int], Results]
) -> dict[str, Any] | None:
    """The load and workload as the baseline's first valid block measured them (every arm
    ran the same: ``measured_differences`` lists any arm whose differ): the protocol's
    settings, the workload and where the load came from."""
    base = first_results(results).get(state["baseline"])
    if base is None:
        return None
    prov = base.provenance
    load = prov.load
    return {
        # the rows of the design each block drew are the orders table's, not one setting
        "protocol": {k: v for k, v in prov.protocol.items() if k != "level_orders"},
        "workload": dict(prov.workload),
        "load": None if load is None else {"agents": load.agents, "where": load.where,
                                           "route": load.route},
    }  # fmt: skip


def _block_reps(blocks: dict[int, Any], level: float, metric: str) -> list[list[float]]:
    """Each block's repetitions of ``metric`` at ``level`` (blocks without any left out)."""
    return [v for blk in blocks.values() if (v := blk.get(level, {}).get(metric))]


def _figure(reps: list[list[float]], seed: int) -> list[float | None]:
    """[median over blocks of each block's mean, low, high]: the ratios' block bootstrap
    (``analysis.bootstrap_median``), which never leaves the values measured (a t interval
    on two blocks, t = 12.7 on one degree of freedom, reached -1,300 tok/s in a real run's
    Pareto view, 0-700 wide beside bootstrap intervals that said otherwise)."""
    est, lo, hi = analysis.bootstrap_median(reps, seed)
    return [round(est, 4), round(lo, 4), round(hi, 4)]


def pareto(samples: analysis.Samples, seed: int = 0) -> dict[str, Any]:
    """Each arm's levels as the Pareto view draws them: output tokens/s per user (1000 / the
    judged TPOT) against output tokens/s per accelerator, or absolute where no arm has an
    accelerator count; each the median over valid blocks of the block's mean, with the
    ratios' 95% block-bootstrap interval.  An arm without a count beside arms with one is
    left out, named."""
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
            xs, ys = _block_reps(blocks, level, "tokens_per_user"), _block_reps(blocks, level, y)
            if xs and ys:
                points.append(
                    {"arm": arm, "level": level, "tokens_per_user": _figure(xs, seed),
                     "tokens_per_s": _figure(ys, seed), "blocks": min(len(xs), len(ys))}
                )  # fmt: skip
    return {
        "per_accelerator": bool(known),
        "left_out": sorted(set(samples) - known) if known else [],
        "points": points,
    }
