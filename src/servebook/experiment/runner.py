"""Run an experiment's schedule: for each (block, arm) in run order, a recipe arm is a
fresh deployment (up -> warm-up -> verify -> bench -> down); an attached or URL arm is
only benched.  The state (``DIR/experiment.json``) is rewritten atomically after every
finished bench, so ``--resume`` continues from the last finished one with the same
schedule.

The steps are injected (:class:`Steps`): the command passes servebook's own (up through
the backend, verify from counters, bench's sweep), tests pass the same shapes against
scripted servers.  An arm that fails to come up or fails verify makes its block invalid,
with the reason; it is never dropped.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servebook import inputs
from servebook.errors import ServebookError, UsageError
from servebook.experiment.spec import Arm, Experiment
from servebook.files import write_atomic
from servebook.results.provenance import utc_now

STATE_NAME = "experiment.json"
DONE = "done"
PENDING = "pending"


class StepFailed(ServebookError):
    """A step of one arm in one block failed: the block is invalid with this reason; the
    experiment goes on with the next entry."""


@dataclass
class Steps:
    """What one entry of the schedule does.  ``up`` returns a handle (the deployment's
    name) that ``verify``, ``bench`` and ``down`` take; attached and URL arms get ``None``.
    ``verify`` returns None when it passed, else the reason.  ``bench`` writes
    ``results.json`` into the directory it is given."""

    up: Callable[[Arm, int], str]
    warm: Callable[[Arm, str], None]
    verify: Callable[[Arm, str], str | None]
    bench: Callable[[Arm, str | None, Path], None]
    down: Callable[[Arm, str], None]


Say = Callable[[str], None]


def results_dir(out_dir: Path, arm: str, block: int) -> Path:
    return out_dir / "arms" / arm / f"block-{block}"


def new_state(exp: Experiment, order: list[tuple[int, str]], design: str) -> dict[str, Any]:
    return {
        "kind": "servebook-experiment",
        "experiment": exp.path,
        "digest": exp.digest(),
        "seed": exp.seed,
        "design": design,
        "baseline": exp.baseline,
        "variable": list(exp.variable),
        "blocks": exp.blocks,
        "load": exp.load,
        "arms": [
            {
                "name": a.name,
                "kind": a.kind,
                "what": a.describe(),
                "accelerators": a.accelerators,
                "blocks": [
                    {"block": b, "results": f"arms/{a.name}/block-{b}"}
                    for b in range(1, exp.blocks + 1)
                ],
            }
            for a in exp.arms
        ],
        "schedule": [
            {"block": b, "arm": a, "started_at": None, "ended_at": None, "outcome": PENDING}
            for b, a in order
        ],
    }


def load_state(out_dir: Path, exp: Experiment) -> dict[str, Any]:
    """The state of an experiment to resume; refused when it is another experiment."""
    path = out_dir / STATE_NAME
    if not path.is_file():
        raise UsageError(
            f"--resume: {path} does not exist", hint="run the experiment without --resume first"
        )
    doc = inputs.load_json(path, "experiment state")
    if not isinstance(doc, dict) or doc.get("kind") != "servebook-experiment":
        raise UsageError(f"--resume: {path} is not an experiment's state")
    if doc.get("digest") != exp.digest():
        raise UsageError(
            f"--resume: {path} was written by another experiment (arms, load, blocks or "
            f"seed differ from {exp.path})",
            hint="resume with the file it was started with, or start over in a new -o DIR",
        )
    return doc


def save(out_dir: Path, state: dict[str, Any]) -> None:
    write_atomic(out_dir / STATE_NAME, json.dumps(state, indent=2) + "\n")


def run(
    exp: Experiment,
    state: dict[str, Any],
    out_dir: Path,
    steps: Steps,
    say: Say,
    after: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every pending entry of ``state['schedule']`` in order; ``after(state)`` runs after
    each finished entry (the figures are recomputed there), before the state is saved."""
    entries = state["schedule"]
    todo = [e for e in entries if e["outcome"] == PENDING]
    for i, entry in enumerate(todo, 1):
        arm = exp.arm(entry["arm"])
        n = len(entries) - len(todo) + i
        say(f"[{n}/{len(entries)}] block {entry['block']}, arm {arm.name}: {arm.describe()}")
        where = results_dir(out_dir, arm.name, entry["block"])
        if where.exists():  # a bench interrupted before it finished: it starts over
            shutil.rmtree(where)
        entry["started_at"] = utc_now()
        entry["outcome"] = _one(arm, entry, where, steps, say)
        entry["ended_at"] = utc_now()
        if entry["outcome"] != DONE:
            say(f"block {entry['block']} is invalid: arm {arm.name} {entry['outcome']}")
        if after is not None:
            after(state)
        save(out_dir, state)
    return state


def _one(arm: Arm, entry: dict[str, Any], where: Path, steps: Steps, say: Say) -> str:
    """One arm in one block; its outcome (``done``, or what failed and why).  A recipe
    arm's entry records the deployment brought up for it (``deployment``, fresh in every
    block) and verify's verdict on it (``verify``: ``passed``, or why not)."""
    if arm.kind != "recipe":
        return _bench(arm, None, where, steps)
    try:
        handle = steps.up(arm, entry["block"])
    except StepFailed as e:
        return f"failed to come up: {e}"
    entry["deployment"] = handle
    try:
        steps.warm(arm, handle)
        reason = steps.verify(arm, handle)
        entry["verify"] = "passed" if reason is None else reason
        if reason is not None:
            return f"failed verify: {reason}"
        return _bench(arm, handle, where, steps)
    except StepFailed as e:
        return f"failed: {e}"
    finally:
        say(f"taking {handle} down")
        steps.down(arm, handle)


def _bench(arm: Arm, handle: str | None, where: Path, steps: Steps) -> str:
    try:
        steps.bench(arm, handle, where)
    except StepFailed as e:
        return f"bench failed: {e}"
    return DONE
