"""`servebook experiment FILE.yaml -o DIR [--dry-run] [--resume [--retry BLOCK/ARM]]`:
several arms measured in blocks, interleaved, with ratios to a baseline
(``servebook.experiment``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from servebook.commands import KubeconfigOpt, app, print_json, say
from servebook.commands.verify import ApiKeyOpt
from servebook.console import err, out

HELP = (
    "Compare several arms (recipes brought up fresh per block, attached deployments, or "
    "URLs) in blocks: each block runs every arm once, in a randomized, counterbalanced "
    "order (seeded, recorded), each recipe arm up -> warm-up -> verify -> bench -> down. "
    "Arms may differ only in the file's variable: (topology, engine_args, packages, ...); "
    "any other difference (an image, the model) is refused before anything starts, as "
    "`servebook compare` refuses it. DIR/experiment.json is rewritten atomically after every "
    "bench (--resume continues it with the same schedule; a stop prints the command that "
    "does) and holds the schedule, each "
    "arm's results directories, the ratios to the baseline per level (output tok/s, per "
    "accelerator, TPOT p50) with 95% intervals that resample blocks, the crossovers and "
    "the baseline's drift. `servebook report DIR` renders it.\n\n"
    "The file's load: takes bench's flags by their long names; a key it leaves out takes "
    "bench's default (the 5% precision target included), and the plan (--dry-run, and on "
    "stderr when it starts) prints every setting, how long a window may stretch included.\n\n"
    "Each deployment an experiment makes is its own, named ARM-bBLOCK-TAG (TAG: the "
    "experiment's, from its directory), with its own logs and KV storage.\n\n"
    "Exit 0 when every block is valid, 1 when a block is invalid (an arm did not come up, "
    "failed verify, or its bench stopped or measured no valid point: listed with the reason "
    "and the --retry that runs it again) or nothing could be compared, 2 on unusable input.\n\n"
    "Examples: servebook experiment spec.yaml -o out/spec-vs-mixed --dry-run\n\n"
    "servebook experiment spec.yaml -o out/spec-vs-mixed --resume --retry 2/spec"
)


@app.command(help=HELP)
def experiment(
    file: Path = typer.Argument(..., metavar="FILE.yaml", help="The experiment file."),
    out_dir: Path = typer.Option(..., "-o", "--output", help="Directory for experiment.json."),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the schedule, every load setting, the time and what is deployed; run nothing.",
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue DIR/experiment.json from the last finished bench."
    ),
    retry: list[str] = typer.Option(
        [],
        "--retry",
        metavar="BLOCK/ARM",
        help="With --resume: run this invalid entry of the schedule again, in its place "
        "(e.g. --retry 2/pd-spec: block 2's entry of arm pd-spec; repeat for more). Its "
        "earlier attempt stays in the entry's 'retried' in experiment.json.",
    ),
    as_json: bool = typer.Option(False, "--json", help="The plan (--dry-run) or figures as JSON."),
    api_key: str | None = ApiKeyOpt,
    kubeconfig: str | None = KubeconfigOpt,
) -> None:
    from servebook.experiment import session, spec, steps

    exp = spec.load(file)
    session.prepare(exp)
    order = session.order_of(exp)
    plan = dry_run_plan(exp, order, session.tag_of(exp, out_dir))
    if dry_run:
        if as_json:
            print_json(plan)
        else:
            for line in dry_run_lines(plan):
                out.print(line, highlight=False, markup=False, soft_wrap=True)
        return
    for line in dry_run_lines(plan):  # the plan it runs, before it runs (progress: stderr)
        err.print(line, highlight=False, markup=False, soft_wrap=True)
    again = ["--kubeconfig", kubeconfig] if kubeconfig else []
    if api_key:  # never printed: the resume command names the option, not the key
        again += ["--api-key", "KEY"]
    state = session.execute(
        exp,
        out_dir,
        steps.servebook_steps(exp, say, api_key),
        say,
        resume=resume,
        retry=retry,
        extra_args=again,
    )
    if as_json:
        print_json(state)
    else:
        for line in summary_lines(state):
            out.print(line, highlight=False, markup=False, soft_wrap=True)
        out.print(f"experiment: {out_dir / 'experiment.json'}", highlight=False, soft_wrap=True)
        invalid = session.invalid_entries(state)
        if invalid:
            retry_cmd = session.command(exp, out_dir, *again, *session.retry_args(invalid))
            out.print(
                f"run the invalid entries again, each in its place: {retry_cmd}",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
    if state.get("invalid_blocks") or state.get("no_comparison"):
        raise typer.Exit(1)


def dry_run_plan(exp: Any, order: list[tuple[int, str]], tag: str) -> dict[str, Any]:
    from servebook.experiment import load_settings, runner, steps

    low, high = steps.estimated_s(exp)
    ups = sum(1 for _b, a in order if exp.arm(a).kind == "recipe")
    base = steps.bench_args(exp, exp.arm(exp.baseline))
    blocks = sorted({b for b, _a in order})
    return {
        "experiment": exp.path,
        "seed": exp.seed,
        "baseline": exp.baseline,
        "variable": list(exp.variable),
        "schedule": [{"block": b, "arm": a} for b, a in order],
        "arms": [{"name": a.name, "what": a.describe()} for a in exp.arms],
        "deployments": [
            {"block": b, "arm": a, "name": runner.deployment_name(tag, a, b)}
            for b, a in order
            if exp.arm(a).kind == "recipe"
        ],
        # every setting each arm's bench runs with, the file's or bench's default
        "load": load_settings.rows(exp),
        # each block's benches' level orders, round by round (``design.level_orders``)
        "level_orders": [
            {"block": b, "rounds": [list(r) for r in steps.level_orders(exp, base, b)]}
            for b in blocks
        ],
        "estimated_bench_s": [round(low), round(high)],
        "fresh_deployments": ups,
    }


def dry_run_lines(plan: dict[str, Any]) -> list[str]:
    lo, hi = plan["estimated_bench_s"]
    lines = [f"experiment {plan['experiment']} (seed {plan['seed']}), baseline {plan['baseline']}"]
    lines += [f"  arm {a['name']}: {a['what']}" for a in plan["arms"]]
    lines.append("schedule (run order):")
    blocks: dict[int, list[str]] = {}
    for e in plan["schedule"]:
        blocks.setdefault(e["block"], []).append(e["arm"])
    lines += [f"  block {b}: {' -> '.join(arms)}" for b, arms in blocks.items()]
    orders = plan.get("level_orders") or []
    if any(o["rounds"] for o in orders):
        lines.append("levels (every arm of a block in its order; each round the next row):")
        lines += [
            f"  block {o['block']}: " + ", then ".join(" -> ".join(r) for r in o["rounds"])
            for o in orders
        ]
    lines.append("load (every arm's bench; a key the file leaves out takes bench's default):")
    lines += [
        f"  {r['key']}: {r['value']}" + ("" if r["from"] == "file" else f" [{r['from']}]")
        for r in plan["load"]
    ]
    span = (f"{lo / 60:.0f}", f"{hi / 60:.0f}", "min") if hi >= 120 else (f"{lo}", f"{hi}", "s")
    took = (
        f"about {span[0]} {span[2]}"
        if span[0] == span[1]
        else f"about {span[0]} to {span[1]} {span[2]}"
    )
    ups = plan["fresh_deployments"]
    extra = f", plus {ups} fresh deployment(s) (up, warm-up, verify, down each)" if ups else ""
    lines.append(f"time: benches {took}{extra}; more where windows stretch (load's window)")
    if plan["deployments"]:
        lines.append("deployed (one at a time, each taken down after its bench):")
        lines += [
            f"  {d['name']} (arm {d['arm']}, block {d['block']})" for d in plan["deployments"]
        ]
    else:
        lines.append("deployed: nothing (attached and URL arms are only benched)")
    return lines


def summary_lines(state: dict[str, Any]) -> list[str]:
    from servebook.experiment.report import (
        comparison_line,
        crossover_line,
        drift_line,
        invalid_level_line,
        max_load_line,
    )

    mode = state.get("level_mode", "concurrency")
    lines = (
        [f"  NO VALID COMPARISON: {state['no_comparison']}"] if state.get("no_comparison") else []
    )
    lines += [
        f"  block {b['block']} INVALID: {b['reason']}" for b in state.get("invalid_blocks", [])
    ]
    lines += [
        f"  {invalid_level_line(r, mode)}" for r in state.get("evidence", []) if not r["valid"]
    ]
    lines += [
        f"  block {e['block']}, arm {e['arm']}: retried; before: "
        + "; then ".join(str(r["outcome"]) for r in e["retried"])
        for e in state["schedule"]
        if e.get("retried")
    ]
    lines += [comparison_line(c, mode) for c in state["comparisons"]]
    lines += [comparison_line(c, mode) for c in state.get("pair_comparisons", [])]
    lines += [crossover_line(c) for c in state["crossovers"]]
    if state.get("drift"):
        lines.append(drift_line(state["drift"]))
    lines += [max_load_line(m, mode) for m in state.get("max_load", [])]
    return lines
