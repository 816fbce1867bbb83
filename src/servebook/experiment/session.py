"""An experiment from its file to ``DIR/experiment.json``: checked, scheduled, run (or
resumed) and its figures computed.  The command calls :func:`execute` with servebook's
own steps; tests call it with the same shapes against scripted servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servebook.errors import ServebookError, UsageError
from servebook.experiment import declared, design, figures, runner
from servebook.experiment.runner import STATE_NAME, Say, Steps
from servebook.experiment.spec import Experiment


class ExperimentStopped(ServebookError):
    """A stop signal during the experiment: what was saved and how to go on."""

    exit_code = 130
    label = "interrupted"


def prepare(exp: Experiment) -> None:
    """Everything refused before anything starts: the load's settings, values no recipe of
    the experiment declares (``values.check``), and arms that differ in more than the
    declared variable (``declared.check``)."""
    from servebook.experiment.steps import check_load
    from servebook.experiment.values import check as check_values

    check_load(exp)
    check_values(exp)
    declared.check(exp, {a.name: declared.provenance(exp, a) for a in exp.arms})


def order_of(exp: Experiment) -> list[tuple[int, str]]:
    """The run order: (block, arm), blocks in turn, each in its counterbalanced order."""
    blocks = design.schedule([a.name for a in exp.arms], exp.blocks, exp.seed)
    return [(b, arm) for b, row in enumerate(blocks, 1) for arm in row]


def execute(
    exp: Experiment,
    out_dir: Path,
    steps: Steps,
    say: Say,
    *,
    resume: bool = False,
    order: list[tuple[int, str]] | None = None,
    design_name: str = "williams",
) -> dict[str, Any]:
    """Run (or continue) the experiment; returns the final state (experiment.json).
    ``order``: another run order (tests compare the field's sequential one)."""
    order = order if order is not None else order_of(exp)
    if resume:
        state = runner.load_state(out_dir, exp)
        planned = [(e["block"], e["arm"]) for e in state["schedule"]]
        if planned != order:
            raise UsageError(
                f"--resume: {out_dir / STATE_NAME} holds another schedule than this "
                "experiment's seed gives"
            )
        left = sum(e["outcome"] == runner.PENDING for e in state["schedule"])
        say(f"resuming: {len(order) - left} of {len(order)} benches finished, {left} to go")
    else:
        if (out_dir / STATE_NAME).exists():
            raise UsageError(
                f"{out_dir / STATE_NAME} exists: this directory holds an experiment",
                hint="continue it with --resume, or give another -o DIR",
            )
        state = runner.new_state(exp, order, design_name)
    # The SLO is analysis only: a resumed experiment is judged against the file's SLO now.
    state["slo"] = exp.slo
    if not resume:
        runner.save(out_dir, state)
    try:
        state = runner.run(
            exp, state, out_dir, steps, say, after=lambda s: figures.update(s, out_dir)
        )
    except KeyboardInterrupt:
        done = sum(e["outcome"] != runner.PENDING for e in state["schedule"])
        raise ExperimentStopped(
            f"stopped; what this entry brought up was taken down. {done} of {len(order)} "
            f"benches are in {out_dir / STATE_NAME}; rerun the same command with --resume "
            "to continue from the next one (same schedule)."
        ) from None
    figures.update(state, out_dir)
    runner.save(out_dir, state)
    return state
