"""An experiment's report (``servebook report DIR`` on a directory with experiment.json):
the table of every arm x level, the ratios with their intervals, the crossover in words,
the drift, the server evidence per arm and level (a level whose handoff failed open
marked invalid for its arm), the order each bench ran its levels in, and the schedule
with each entry's outcome; and the same sentences for the terminal.  Reads
``experiment.json`` only (plain data), as report/ reads results files; it lives here,
beside the analysis whose names it prints (``METRICS``, the SLO outcomes), and draws with
report/'s plots and tables, which import no experiment."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from servebook import inputs
from servebook.errors import UsageError
from servebook.experiment import slo as slo_
from servebook.experiment.analysis import METRICS, MIN_BLOCKS
from servebook.experiment.analysis import level_label as _level
from servebook.files import write_files
from servebook.report.plots import Panel, PlotSpec, Series, draw, pareto_view
from servebook.report.render import (
    PLOTS_DIR,
    html_figure,
    html_table,
    md_table,
    md_text,
    public,
)
from servebook.report.tables import NA, Column, Table, settings_value

# A metric an experiment.json of an earlier servebook names: its TPOT was the stored p50.
_EARLIER = {"tpot_ms_p50": ("TPOT p50 (ms)", False)}

# What a comparison's TPOT was judged on (``analysis.samples_of``).
_JUDGED_ON = {
    "tpot_ms.p50": "TPOT p50 (ms)",
    "tpot_ms.mean": "TPOT mean (ms, the engines' exact means)",
}


def metric_info(name: str) -> tuple[str, bool]:
    """(what the metric is, whether higher is better)."""
    return METRICS.get(name) or _EARLIER[name]


def metric_words(c: dict[str, Any]) -> str:
    """A comparison's metric, TPOT with what it was judged on."""
    return _JUDGED_ON.get(c.get("judged_on") or "") or metric_info(c["metric"])[0]


def comparison_line(c: dict[str, Any], mode: str) -> str:
    lo, hi = c["ci95"]
    what = metric_words(c)
    return (
        f"  {c['arm']} / {c['baseline']} at {_level(c[mode], mode)}, {what}: "
        f"{c['ratio']:.3f} [{lo:.3f}, {hi:.3f}] over {c['blocks']} block(s): {c['verdict']}"
    )


def crossover_line(c: dict[str, Any]) -> str:
    what, better = metric_info(c["metric"])
    if c.get("undetermined"):
        return f"  crossover of {c['arm']} vs {c['baseline']} in {what}: undetermined ({c['why']})"
    lo, hi = c["between"]
    above = "ahead" if better else "behind"
    below = "behind" if better else "ahead"
    first, then = (above, below) if c["direction"] == "above to below 1" else (below, above)
    return (
        f"  crossover: {c['arm']} is {first} of {c['baseline']} in {what} up to {lo:g} and "
        f"{then} from {hi:g} on; the crossover lies between {lo:g} and {hi:g} (95% intervals "
        "wholly on either side of 1)"
    )


_LATENCY = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "end-to-end latency"}


def slo_words(slo: dict[str, float]) -> str:
    """``p99 TTFT <= 500 ms and p99 TPOT <= 50 ms``."""
    return " and ".join(f"p99 {_LATENCY[k]} <= {v:g} ms" for k, v in slo.items())


def max_load_line(m: dict[str, Any], mode: str) -> str:
    """One arm's max load under the SLO in words (``experiment.slo``)."""
    head = f"  max load of {m['arm']} under {slo_words(m['slo'])}:"
    lo, hi = m["between"] or (0.0, 0.0)
    if m["outcome"] == slo_.MET_EVERYWHERE:
        return (
            f"{head} met at every swept level, up to {_level(lo, mode)}; the max load is "
            "above it (sweep higher levels to locate it)"
        )
    if m["outcome"] == slo_.MISSED_EVERYWHERE:
        return (
            f"{head} missed already at the lowest level, {_level(hi, mode)}; the max load "
            "is below it (sweep lower levels to locate it)"
        )
    if m["outcome"] != slo_.CROSSED:
        return f"{head} {m.get('why', m['outcome'])}"
    first = f"p99 {_LATENCY[m['binding']]} reaches its limit first" if m["binding"] else "missed"
    clo, chi = m["ci95"]
    return (
        f"{head} about {_level(round(m['level'], 1), mode)} (95% interval {clo:g} to {chi:g} over "
        f"{m['blocks']} block(s)); it meets the SLO at {_level(lo, mode)} and misses it at "
        f"{_level(hi, mode)} ({first}); the max load is interpolated between the two"
    )


def drift_line(d: dict[str, Any]) -> str:
    return (
        f"  drift: the baseline {d['arm']} changed {d['change']:+.1%} in output tok/s from "
        f"block {d['first_block']} to block {d['last_block']} (the machine moved during the "
        "experiment; interleaving spreads that over every arm)"
    )


# --- the experiment's report (``servebook report DIR`` on an experiment's directory) -------

EXPERIMENT_NAME = "experiment.json"


def is_experiment(path: Path) -> bool:
    return (path / EXPERIMENT_NAME).is_file()


def _num(v: float | None, digits: int = 1) -> str:
    return NA if v is None else f"{v:,.{digits}f}"


def _share(f: dict[str, Any] | None) -> str:
    """A share gathered over points (``experiment.evidence``): its mean, and the range
    where the points differ."""
    if not f:
        return NA
    if f["n"] > 1 and f["max"] - f["min"] >= 0.0005:
        return f"{f['mean']:.1%} ({f['min']:.1%}-{f['max']:.1%})"
    return f"{f['mean']:.1%}"


def _count(f: dict[str, Any] | None) -> str:
    """A count per point gathered over points: the total over them."""
    return NA if not f else f"{f['mean'] * f['n']:,.0f}"


def _validity(r: dict[str, Any]) -> str:
    """A level's verdict for its arm: invalid as a whole (its handoff failed open), or
    valid with the invalid points left out one by one, named by the checks they failed."""
    if not r["valid"]:
        return f"INVALID: {r['invalid_reason']}"
    bad = r["points"] - r["valid_points"]
    if not bad:
        return "valid"
    checks = ", ".join(r.get("invalid_checks") or []) or "see the arm's results"
    if not r["valid_points"]:
        return f"no valid point ({checks})"
    return f"valid; {bad} invalid point(s) left out ({checks})"


def evidence_table(doc: dict[str, Any]) -> Table:
    """The server's evidence per arm and level over the valid blocks (every point, valid
    or not), and whether the level is valid for the arm (its PD handoff did not fail
    open)."""
    mode = doc.get("level_mode", "concurrency")
    return Table(
        "evidence",
        "Server evidence per arm and level (every point of the valid blocks)",
        [Column("Arm"), Column("Level"), Column("Valid points", True), Column("Validity"),
         Column("Client errors", True), Column("Engine errors", True),
         Column("PD handoff share", True), Column("Speculative acceptance", True),
         Column("Prefix-hit share", True), Column("Preemptions", True), Column("Blocks")],
        [
            [r["arm"], _level(r["level"], mode), f"{r['valid_points']}/{r['points']}",
             _validity(r),
             f"{r['errors']:,}" + (f" ({r['error_rate']:.1%})" if r["errors"] else ""),
             _count(r["request_errors"]), _share(r["handoff_share"]),
             _share(r["spec_acceptance"]), _share(r["prefix_hit_share"]),
             _count(r["preemptions"]), ", ".join(str(b) for b in r["blocks"])]
            for r in doc.get("evidence", [])
        ],
        note="From every role's counters, read before and after each window: the mean over "
        "the points, with the lowest and highest where they differ; n/a where the arm has no "
        "such counter (no PD handoff, no speculative decoding, no prefix caching, or a URL "
        "arm without /metrics). A level where an arm's PD handoff failed open (SB407) is "
        "invalid for that arm: its figures are left out of every ratio, table and plot.",
    )  # fmt: skip


def tables(doc: dict[str, Any]) -> list[Table]:
    """Every arm x level (absolute, per accelerator, TPOT); the ratios with intervals; the
    server evidence per arm and level; the schedule with each entry's outcome."""
    mode = doc.get("level_mode", "concurrency")
    on = doc.get("tpot_judged_on") or {}
    # An experiment.json of an earlier servebook: its table took the mean and the stored p50.
    earlier = "tpot_judged_on" not in doc
    absolute = Table(
        "arms",
        "Every arm at every level: the "
        + ("mean" if earlier else "median")
        + " over valid blocks of each block's mean",
        [Column("Arm"), Column("Level"), Column("Output tok/s", True),
         Column("Per accelerator", True), Column("TTFT p50 (ms)", True),
         Column("TTFT p99 (ms)", True), Column("TPOT p50 (ms)", True),
         Column("TPOT p99 (ms)", True), Column("Blocks", True)],
        [_absolute_row(r, on, mode) for r in doc.get("absolute", [])],
        note=""
        if earlier
        else "The figure each ratio divides. TPOT p50 is the client's p50, or the engines' "
        "exact mean (marked) at a level where an engine's histogram leads TPOT (the client "
        "timed tokens wrong there): every arm at that level is judged so, as servebook's "
        "other reports judge it. TPOT p99 is the client's where the client's per-token "
        "timing stands for that arm, and n/a where its engine's histogram leads (whose "
        "percentiles are only buckets). Per accelerator divides by the count in the "
        "provenance table (n/a where an arm has none). An arm with no valid point at any "
        "level has one row saying why.",
    )  # fmt: skip
    need = doc.get("min_blocks", MIN_BLOCKS)  # an earlier experiment.json: no rule, no note
    ratios = Table(
        "ratios",
        f"Ratios to the baseline {doc['baseline']}: arm's median over valid blocks of each "
        "block's mean over the baseline's, with 95% block-bootstrap intervals",
        _RATIO_COLUMNS,
        _ratio_rows(doc.get("comparisons", []), mode),
        note="A ratio above 1 is more throughput, or a longer TPOT (worse). The verdict is "
        "better or worse only when the whole interval is on one side of 1"
        + (
            f" and the ratio comes from at least {need} valid blocks ({_WHY_BLOCKS})."
            if "min_blocks" in doc  # an experiment.json of an earlier servebook: any number
            else "."
        ),
    )
    schedule = Table(
        "schedule",
        "Schedule, in run order, with each entry's outcome",
        [Column("#", True), Column("Block", True), Column("Arm"), Column("Deployment"),
         Column("Verify"), Column("Started"), Column("Ended"), Column("Outcome")],
        [
            [str(i), str(e["block"]), e["arm"], e.get("deployment") or NA,
             e.get("verify") or NA, e["started_at"] or "", e["ended_at"] or "", e["outcome"]]
            for i, e in enumerate(doc["schedule"], 1)
        ],
        note="A recipe arm is a fresh deployment in every block, verified before its bench; "
        "attached and URL arms are benched only (n/a).",
    )  # fmt: skip
    orders = [orders_table(doc)] if "level_orders" in doc else []  # earlier: not recorded
    pairs = [pairs_table(doc, need)] if doc.get("pair_comparisons") else []
    head = [provenance_table(doc)] if "arm_provenance" in doc else []  # earlier: none
    load = [load_table(doc["measured_load"])] if doc.get("measured_load") else []
    return [*head, *load, absolute, ratios, *pairs, evidence_table(doc), *orders, schedule]


def _ratio_rows(comps: list[dict[str, Any]], mode: str) -> list[list[str]]:
    return [
        [c["arm"], c["baseline"], _level(c[mode], mode), metric_words(c), f"{c['ratio']:.3f}",
         f"[{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}]", str(c["blocks"]), c["verdict"]]
        for c in comps
    ]  # fmt: skip


_RATIO_COLUMNS = [
    Column("Arm"), Column("Over"), Column("Level"), Column("Metric"), Column("Ratio", True),
    Column("95% interval", True), Column("Blocks", True), Column("Verdict"),
]  # fmt: skip


def pairs_table(doc: dict[str, Any], need: int) -> Table:
    """The ratios of the pairs the experiment names (``pairs:``, ``report --pair``): an
    arm over another than the baseline, as the baseline's ratios are computed."""
    mode = doc.get("level_mode", "concurrency")
    named = ", ".join(f"{a}/{b}" for a, b in doc.get("pairs") or [])
    return Table(
        "pairs",
        f"Ratios of the named pairs ({named}): the first arm's median over valid blocks of "
        "each block's mean over the second's, with 95% block-bootstrap intervals",
        _RATIO_COLUMNS,
        _ratio_rows(doc["pair_comparisons"], mode),
        note="Computed as the ratios to the baseline are, over the blocks where both arms "
        f"have valid points; a verdict needs {need} valid blocks.",
    )


def _absolute_row(r: dict[str, Any], on: dict[str, str], mode: str) -> list[str]:
    """One arm at one level; an arm without any figure (``level: None``) says why."""
    if r["level"] is None:
        return [r["arm"], r["why"], *[NA] * 6, "0"]
    return [
        r["arm"], _level(r["level"], mode), _num(r["output_tokens_per_s"]),
        _num(r["output_tokens_per_s_per_accelerator"]), _num(r.get("ttft_ms_p50"), 2),
        _num(r.get("ttft_ms_p99"), 2), _tpot_cell(r, on), _num(r.get("tpot_ms_p99"), 2),
        str(r["blocks"]),
    ]  # fmt: skip


def _accelerators(p: dict[str, Any]) -> str:
    n = p.get("accelerators")
    if not n:
        return f"{NA} (no count: declare accelerators: on the arm)"
    said = {"plan": "the deployment's plan", "declared": "declared on the arm"}
    out = f"{n} ({said[p['accelerators_from']]})"
    if p.get("accelerators_declared"):
        out += f"; {p['accelerators_declared']} declared, not used"
    return out


def provenance_table(doc: dict[str, Any]) -> Table:
    """Each arm as its servers said in its first valid block (``figures.arm_provenance``)."""
    rows = []
    for p in doc["arm_provenance"]:
        if not p["measured"]:
            rows.append([p["arm"], p["what"], "not measured (no valid block)", *[NA] * 5,
                         _accelerators(p)])  # fmt: skip
            continue
        packages = ", ".join(f"{k} {v}" for k, v in sorted(p["packages"].items()))
        engine = f"{p['engine'] or NA} {p['engine_version'] or '(version unknown)'}"
        rows.append(
            [p["arm"], p["what"], engine,
             p["topology"] or NA, p["model"] + (f" ({p['model_config_hash'][:19]})"
                                                 if p.get("model_config_hash") else ""),
             ", ".join(p["images"]) or "none (processes on the bench machine)",
             packages or NA, p["servebook"], _accelerators(p)]
        )  # fmt: skip
    return Table(
        "provenance",
        "Provenance of each arm (what its servers said, first valid block)",
        [Column("Arm"), Column("What"), Column("Engine"), Column("Topology"), Column("Model"),
         Column("Images"), Column("Packages"), Column("servebook"), Column("Accelerators")],
        rows,
        note="Engine and version from each server's /version; the model's config hash from "
        "its config.json; images from each role's Pod. Paths on the measuring machine are "
        "shown by their last component.",
    )  # fmt: skip


def load_table(m: dict[str, Any]) -> Table:
    """The load and workload every arm ran, as the baseline measured them."""
    rows = [[f"Protocol: {k}", settings_value(v)] for k, v in sorted(m["protocol"].items())]
    rows += [[f"Workload: {k}", settings_value(v)] for k, v in sorted(m["workload"].items())]
    if m.get("load"):
        rows += [[f"Load: {k}", settings_value(v)] for k, v in m["load"].items()]
    return Table(
        "load",
        "Load and workload (every arm's; as the baseline's first valid block recorded them)",
        [Column("Setting"), Column("Value")],
        rows,
        note="An arm whose recorded load or workload differs from the baseline's is named "
        "above the tables.",
    )


_WHY_BLOCKS = (
    "one block's interval holds only its own repetitions' scatter, and two blocks' at most "
    "the range between two values"
)


def _tpot_cell(r: dict[str, Any], on: dict[str, str]) -> str:
    """A row's TPOT, marked where it is the engines' exact mean (``tpot_judged_on``); an
    experiment.json of an earlier servebook has the stored p50."""
    value = r.get("tpot_ms", r.get("tpot_ms_p50"))
    cell = _num(value, 2)
    if value is not None and on.get(f"{r['level']:g}") == "tpot_ms.mean":
        cell += " (engine mean)"
    return cell


def _rounds(rounds: list[list[str]]) -> str:
    """``c=4 -> c=1, then c=1 -> c=4``."""
    return ", then ".join(" -> ".join(r) for r in rounds)


def _orders_by_block(doc: dict[str, Any]) -> list[tuple[int, list[str], list[list[str]]]]:
    """(block, its arms, the rounds they ran) for each distinct order within a block."""
    out: list[tuple[int, list[str], list[list[str]]]] = []
    for e in doc.get("level_orders") or []:
        same = next((o for o in out if o[0] == e["block"] and o[2] == e["rounds"]), None)
        if same is None:
            out.append((e["block"], [e["arm"]], e["rounds"]))
        else:
            same[1].append(e["arm"])
    return out


def orders_table(doc: dict[str, Any]) -> Table:
    """The order every finished bench ran its levels in, by block (``level_orders``)."""
    every = {a["name"] for a in doc["arms"]}
    return Table(
        "orders",
        "Order each bench ran its levels in (round by round, from its results)",
        [Column("Block", True), Column("Arms"), Column("Levels, each round in run order")],
        [
            [str(b), "every arm" if set(arms) == every else ", ".join(arms), _rounds(rounds)]
            for b, arms, rounds in _orders_by_block(doc)
        ],
        note="Each block's benches run one row of a Williams design over the levels, and "
        "each round the next row: over the blocks every level runs in every position equally "
        "often, and the arms of a block meet each level at the same place in their benches.",
    )


def order_sentences(doc: dict[str, Any]) -> list[str]:
    """How often each level ran first and last, and a warning where one always ran first."""
    pos = doc.get("level_positions") or {}
    if len(pos) < 2:
        return []
    rounds = max(row["rounds"] for row in pos.values())
    counts = "; ".join(
        f"{label} first in {row['first']} and last in {row['last']}" for label, row in pos.items()
    )
    out = [f"Levels' places over the {rounds} round(s) of the finished benches: {counts}."]
    for label, row in pos.items():
        if row["first"] == row["rounds"]:
            out.append(
                f"{label} ran first in every round: the levels' order is not balanced, so "
                f"what a bench's first minutes do falls on {label} alone (more blocks "
                "rotate the orders)."
            )
    return out


def invalid_level_line(r: dict[str, Any], mode: str) -> str:
    """A level invalid for an arm, in words, with the first point's reason."""
    first = r["handoff_failed_open"][0]
    return (
        f"{_level(r['level'], mode)} is invalid for arm {r['arm']}: {r['invalid_reason']}; "
        f"its figures there are left out of every ratio (block {first['block']}: "
        f"{first['reason']})."
    )


def sentences(doc: dict[str, Any]) -> list[str]:
    mode = doc.get("level_mode", "concurrency")
    out = [
        f"Baseline {doc['baseline']}; {doc['blocks']} block(s), design {doc['design']}, "
        f"seed {doc['seed']}; arms may differ in: {', '.join(doc['variable']) or 'nothing'}."
    ]
    if doc.get("no_comparison"):  # first: nothing below it is a finding
        out.insert(0, f"No valid comparison: {doc['no_comparison']}.")
    out += [f"Block {b['block']} is invalid: {b['reason']}." for b in doc.get("invalid_blocks", [])]
    out += order_sentences(doc)
    out += tpot_sentences(doc)
    need = doc.get("min_blocks")  # None: an earlier servebook's, whose verdicts needed none
    few = sorted({c["blocks"] for c in doc.get("comparisons", []) if c["blocks"] < (need or 0)})
    if few:
        out.append(
            f"Ratios from {' or '.join(str(n) for n in few)} valid block(s) get no verdict: "
            f"a verdict needs {need} ({_WHY_BLOCKS})."
        )
    out += [invalid_level_line(r, mode) for r in doc.get("evidence", []) if not r["valid"]]
    out += [crossover_line(c).strip() for c in doc.get("crossovers", [])]
    if not doc.get("crossovers") and not doc.get("no_comparison"):
        out.append("No crossover: no ratio's interval goes from one side of 1 to the other.")
    if doc.get("drift"):
        out.append(drift_line(doc["drift"]).strip())
    out += [max_load_line(m, mode).strip() for m in doc.get("max_load", [])]
    for p in doc.get("provenance", []):
        if not p["like_for_like"]:
            fields = ", ".join(d["field"] for d in p["differences"] if not d["under_test"])
            out.append(
                f"Arm {p['arm']}'s measured provenance differs from the baseline's beyond the "
                f"variable: {fields}. Its ratios mix that difference in."
            )
    return out


def tpot_sentences(doc: dict[str, Any]) -> list[str]:
    """Which levels' TPOT is the engines' exact mean (``tpot_judged_on``)."""
    on = doc.get("tpot_judged_on") or {}
    mode = doc.get("level_mode", "concurrency")
    means = [_level(float(lv), mode) for lv, key in on.items() if key == "tpot_ms.mean"]
    if not means:
        return []
    return [
        f"TPOT at {', '.join(means)} is each engine's exact mean, for every arm: an engine's "
        "histogram leads TPOT there (a client timed its tokens wrong), and its percentiles "
        "are only buckets. Elsewhere it is the client's p50."
    ]


def ratio_plot(doc: dict[str, Any]) -> PlotSpec | None:
    """Ratio to the baseline against the level, one panel per metric, one line per arm with
    its 95% band; the baseline's own line at 1.0, where a band crossing it is a level at
    which the arms are not distinguishable."""
    mode = doc.get("level_mode", "concurrency")
    comps = doc.get("comparisons", [])
    if not comps:
        return None
    arms = sorted({c["arm"] for c in comps})
    panels = []
    for metric, (what, higher) in {**METRICS, **_EARLIER}.items():
        rows = [c for c in comps if c["metric"] == metric]
        if not rows:
            continue
        levels = sorted({float(c[mode]) for c in rows})
        ones = [1.0] * len(levels)
        nan = [float("nan")] * len(levels)
        series = [Series(f"{doc['baseline']} (baseline)", 0, levels, ones, nan, nan)]
        for i, arm in enumerate(arms, 1):
            mine = sorted((c for c in rows if c["arm"] == arm), key=lambda c: c[mode])
            series.append(
                Series(
                    arm,
                    i,
                    [float(c[mode]) for c in mine],
                    [c["ratio"] for c in mine],
                    [c["ci95"][0] for c in mine],
                    [c["ci95"][1] for c in mine],
                )
            )
        note = "above 1: more" if higher else "above 1: longer (worse)"
        panels.append(Panel(what, f"ratio to {doc['baseline']}", series, note=note))
    all_levels = sorted({float(c[mode]) for c in comps})
    return PlotSpec(
        "ratios",
        f"Ratio to {doc['baseline']} by {mode}, with 95% intervals over blocks",
        "concurrency" if mode == "concurrency" else "rate (req/s)",
        panels,
        caption="A band wholly above or below the baseline's line at 1.0 is a difference; "
        "where the bands move from one side to the other lies the crossover.",
        logx=len(all_levels) > 1 and min(all_levels) > 0,
        xticks=all_levels,
    )


def _nan(v: float | None) -> float:
    return float("nan") if v is None else float(v)


def pareto_plot(doc: dict[str, Any]) -> PlotSpec | None:
    """The Pareto view of the arms (``report.plots.pareto_view``, as a report of runs draws
    it): one series per arm, a point per level, each the median over valid blocks of each
    block's mean with the ratios' 95% block-bootstrap interval on both axes."""
    view = doc.get("pareto") or {}
    points = view.get("points") or []
    if not points:
        return None
    mode = doc.get("level_mode", "concurrency")
    arms = [a["name"] for a in doc["arms"]]
    series = []
    for arm in arms:
        mine = sorted((p for p in points if p["arm"] == arm), key=lambda p: p["level"])
        if not mine:
            continue
        x = [[_nan(v) for v in p["tokens_per_user"]] for p in mine]
        y = [[_nan(v) for v in p["tokens_per_s"]] for p in mine]
        series.append(
            Series(arm, arms.index(arm), [v[0] for v in x], [v[0] for v in y],
                   [v[1] for v in y], [v[2] for v in y], [v[1] for v in x], [v[2] for v in x],
                   [_level(p["level"], mode) for p in mine])
        )  # fmt: skip
    return pareto_view(
        series,
        per_accelerator=bool(view.get("per_accelerator")),
        left_out=view.get("left_out") or [],
        caption="Each point is an arm at a load level (median over valid blocks of each "
        "block's mean, with the ratios' 95% block-bootstrap intervals on both axes); up and "
        "to the right is better on both.",
    )


def with_pairs(doc: dict[str, Any], exp_dir: Path, pairs: Sequence[str]) -> dict[str, Any]:
    """``doc`` with the ratios of ``pairs`` (``ARM:OVER``, ``report --pair``) beside those
    the file names, its figures recomputed from the arms' results in ``exp_dir`` (as
    ``experiment`` computes them)."""
    from servebook.experiment import figures, spec

    names = [a["name"] for a in doc["arms"]]
    named = [tuple(p) for p in doc.get("pairs") or []]
    asked = [spec.parse_pair(p, names, f"--pair {p}") for p in pairs]
    state = {**doc, "pairs": [list(p) for p in dict.fromkeys([*named, *asked])]}
    figures.update(state, exp_dir)
    return state


def _public_table(t: Table) -> Table:
    return replace(
        t,
        title=public(t.title),
        rows=[[public(c) for c in row] for row in t.rows],
    )


def write(
    exp_dir: Path, out_dir: Path, html_name: str = "report.html", pairs: Sequence[str] = ()
) -> Path:
    """``report.md`` and ``report.html`` of an experiment's directory, with the ratios of
    ``pairs`` too (:func:`with_pairs`).  Neither shows a path of this machine (``public``):
    report.md is written to be pasted into a pull request as it is, its plots named at
    the end rather than embedded (a pasted page cannot reach files beside it)."""
    doc = inputs.load_json(exp_dir / EXPERIMENT_NAME, "experiment")
    if not isinstance(doc, dict) or doc.get("kind") != "servebook-experiment":
        raise UsageError(f"{exp_dir / EXPERIMENT_NAME}: not an experiment's figures")
    if pairs:
        doc = with_pairs(doc, exp_dir, pairs)
    ts = [_public_table(t) for t in tables(doc)]
    words = [public(w) for w in sentences(doc)]
    name = Path(str(doc["experiment"])).name
    files: dict[str, str | bytes] = {}
    figures = []
    plots = []
    for plot in (ratio_plot(doc), pareto_plot(doc)):
        if plot is None:
            continue
        png, svg = draw(plot)
        files[f"{PLOTS_DIR}/{plot.id}.png"], files[f"{PLOTS_DIR}/{plot.id}.svg"] = png, svg
        figures.append(html_figure(plot, png))
        plots.append(f"- {md_text(plot.title)}: `{PLOTS_DIR}/{plot.id}.png` (and .svg)")
    md = [f"# servebook experiment: {md_text(name)}", ""]
    md += [md_text(w) + "\n" for w in words]
    for t in ts:
        md += [f"## {md_text(t.title)}", "", md_table(t), ""]
    if plots:
        md += ["## Plots", "", "Beside this file (attach them where it is pasted):", "", *plots, ""]
    e = html.escape
    page = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f"<title>servebook experiment: {e(name)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>servebook experiment: {e(name)}</h1>",
        '<section id="summary">',
        *[f"<p>{e(w)}</p>" for w in words],
        "</section>",
        *figures,
        *[f'<section id="{t.id}"><h2>{e(t.title)}</h2>{html_table(t)}</section>' for t in ts],
        "</body></html>",
    ]
    files[Path(html_name).with_suffix(".md").name] = "\n".join(md)
    files[html_name] = "\n".join(page)
    write_files(out_dir, files)
    return out_dir / html_name


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.2em .5em}"
    ".num{text-align:right}.note{color:#555}.bad{color:#b00020;font-weight:600}"
)
