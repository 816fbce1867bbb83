"""An experiment from its file to ``DIR/experiment.json``: checked, scheduled, run (or
resumed) and its figures computed.  The command calls :func:`execute` with servebook's
own steps; tests call it with the same shapes against scripted servers."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from servebook.errors import ServebookError, UsageError
from servebook.experiment import declared, design, figures, ownership, runner
from servebook.experiment.runner import STATE_NAME, Say, Steps
from servebook.experiment.spec import Experiment


class ExperimentStopped(ServebookError):
    """A stop signal during the experiment: what was saved and how to go on."""

    exit_code = 130
    label = "interrupted"


def prepare(exp: Experiment) -> None:
    """Everything refused before anything starts: the load's settings, values no recipe of
    the experiment declares (``values.check``), a recipe arm its backend cannot bring up
    (``steps.check_backends``), and arms that differ in more than the declared variable
    (``declared.check``)."""
    from servebook.experiment.steps import check_backends, check_load
    from servebook.experiment.values import check as check_values

    check_load(exp)
    check_values(exp)
    check_backends(exp)
    declared.check(exp, {a.name: declared.provenance(exp, a) for a in exp.arms})


def order_of(exp: Experiment) -> list[tuple[int, str]]:
    """The run order: (block, arm), blocks in turn, each in its counterbalanced order."""
    blocks = design.schedule([a.name for a in exp.arms], exp.blocks, exp.seed)
    return [(b, arm) for b, row in enumerate(blocks, 1) for arm in row]


def command(exp: Experiment, out_dir: Path, *extra: str) -> str:
    """The command that continues this experiment (``extra``: more of its arguments, such
    as ``--retry 2/pd`` or the ``--kubeconfig`` it ran with), as a shell takes it."""
    args = ["servebook", "experiment", exp.path, "-o", str(out_dir), "--resume", *extra]
    return shlex.join(args)


def tag_of(exp: Experiment, out_dir: Path) -> str:
    """The tag the experiment's deployments carry: its saved state's (a resumed one's),
    else the one a run would take now (``runner.new_tag``)."""
    import json

    try:
        doc = json.loads((out_dir / STATE_NAME).read_text())
    except (OSError, ValueError):
        doc = None
    if isinstance(doc, dict) and doc.get("digest") == exp.digest() and doc.get("tag"):
        return str(doc["tag"])
    return runner.new_tag(exp, out_dir)


def invalid_entries(state: dict[str, Any]) -> list[str]:
    """The schedule's invalid entries as ``--retry`` names them (BLOCK/ARM)."""
    ended = (runner.DONE, runner.PENDING)
    return [runner.entry_id(e) for e in state["schedule"] if e["outcome"] not in ended]


def retry_args(entries: Sequence[str]) -> list[str]:
    return [a for e in entries for a in ("--retry", e)]


def execute(
    exp: Experiment,
    out_dir: Path,
    steps: Steps,
    say: Say,
    *,
    resume: bool = False,
    retry: Sequence[str] = (),
    order: list[tuple[int, str]] | None = None,
    design_name: str = "williams",
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Run (or continue) the experiment; returns the final state (experiment.json).
    ``retry``: entries (BLOCK/ARM) of a resumed experiment to run again in their place
    (``runner.retry``).  ``order``: another run order (tests compare the field's
    sequential one).  ``extra_args``: the command's arguments that a resume repeats (in
    the command printed on a stop)."""
    order = order if order is not None else order_of(exp)
    if retry and not resume:
        raise UsageError(
            "--retry runs an invalid entry of an experiment that ran: give --resume too",
            hint=f"e.g. {command(exp, out_dir, '--retry', f'2/{exp.baseline}')}",
        )
    if resume and not (out_dir / STATE_NAME).is_file():
        runner.load_state(out_dir, exp)  # refused: nothing to resume (nor a DIR made)
    with ownership.held(out_dir):  # one run of the directory at a time
        if resume:
            state = _resumed(exp, out_dir, order, retry, say)
        else:
            if (out_dir / STATE_NAME).exists():
                raise UsageError(
                    f"{out_dir / STATE_NAME} exists: this directory holds an experiment",
                    hint="continue it with --resume, or give another -o DIR",
                )
            ownership.check_new(out_dir)
            state = runner.new_state(exp, order, design_name, runner.new_tag(exp, out_dir))
        runner.check_blocks(out_dir, state)
        runner.analysis_settings(state, exp)
        runner.save(out_dir, state)
        try:
            state = runner.run(
                exp, state, out_dir, steps, say, after=lambda s: figures.update(s, out_dir)
            )
        except KeyboardInterrupt:
            raise _stopped(exp, out_dir, state, extra_args) from None
        except ServebookError as e:
            if e.exit_code < 128:
                raise
            raise _stopped(exp, out_dir, state, extra_args) from None  # bench's own stop
        figures.update(state, out_dir)
        runner.save(out_dir, state)
    return state


def _resumed(
    exp: Experiment, out_dir: Path, order: list[tuple[int, str]], retry: Sequence[str], say: Say
) -> dict[str, Any]:
    """The saved state of ``exp``, its ``retry`` entries pending again; refused when it
    holds another schedule."""
    state = runner.load_state(out_dir, exp)
    planned = [(e["block"], e["arm"]) for e in state["schedule"]]
    if planned != order:
        raise UsageError(
            f"--resume: {out_dir / STATE_NAME} holds another schedule than this "
            "experiment's seed gives"
        )
    again = runner.retry(state, list(retry), out_dir / STATE_NAME)
    for e in again:
        say(f"retrying {runner.entry_id(e)} in its place (was: {e['retried'][-1]['outcome']})")
    # A state from before deployments were named for their experiment gets its tag now.
    if "tag" not in state:
        state["tag"] = runner.new_tag(exp, out_dir)
    left = sum(e["outcome"] == runner.PENDING for e in state["schedule"])
    say(f"resuming: {len(order) - left} of {len(order)} benches finished, {left} to go")
    return state


def _stopped(
    exp: Experiment, out_dir: Path, state: dict[str, Any], extra_args: Sequence[str]
) -> ExperimentStopped:
    done = sum(e["outcome"] != runner.PENDING for e in state["schedule"])
    return ExperimentStopped(
        f"stopped; what this entry brought up was taken down. {done} of "
        f"{len(state['schedule'])} benches are in {out_dir / STATE_NAME}. To continue from "
        f"the next one (same schedule), run:\n  {command(exp, out_dir, *extra_args)}"
    )
