"""Run an experiment's schedule: for each (block, arm) in run order, a recipe arm is a
fresh deployment (up -> warm-up -> verify -> bench -> down); an attached or URL arm is
only benched.  The state (``DIR/experiment.json``) is rewritten atomically after every
finished bench, so ``--resume`` continues from the last finished one with the same
schedule, and ``--retry BLOCK/ARM`` runs an invalid entry again in its place
(:func:`retry`; the attempt it replaces is kept in the entry's ``retried``).

Each deployment an experiment makes is its own: its name (:func:`deployment_name`) holds
the arm, the block and the experiment's tag (:func:`new_tag`, kept in the state), so its
state directory, logs and KV storage under ``SERVEBOOK_HOME/deployments/NAME`` are no
other deployment's, whether a plain `servebook up`'s or another experiment's in the same
home.

The steps are injected (:class:`Steps`): the command passes servebook's own (up through
the backend, verify from counters, bench's sweep), tests pass the same shapes against
scripted servers.  An arm that fails to come up or fails verify makes its block invalid,
with the reason; it is never dropped.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servebook import inputs, redact
from servebook.errors import ServebookError, UsageError
from servebook.experiment import input_files, ownership
from servebook.experiment.spec import Arm, Experiment
from servebook.files import PRIVATE, write_atomic
from servebook.results.provenance import utc_now

STATE_NAME = "experiment.json"
DONE = "done"
PENDING = "pending"


class StepFailed(ServebookError):
    """A step of one arm in one block failed: the block is invalid with this reason; the
    experiment goes on with the next entry.  ``facts``: what the step saw on its way there,
    recorded in the entry (``health_misses``)."""

    def __init__(self, message: str, *, facts: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.facts = facts or {}


@dataclass
class Steps:
    """What one entry of the schedule does.  ``up`` brings the arm up under the name it is
    given (:func:`deployment_name`) and returns a handle (the deployment's name) that
    ``verify``, ``bench`` and ``down`` take; attached and URL arms get ``None``.
    ``verify`` returns None when it passed, else the reason.  ``bench`` writes
    ``results.json`` into the directory it is given and may return facts for the entry
    (``health_misses``: the roles' /health asks that missed during the sweep)."""

    up: Callable[[Arm, str], str]
    warm: Callable[[Arm, str], None]
    verify: Callable[[Arm, str], str | None]
    bench: Callable[[Arm, str | None, Path], dict[str, Any] | None]
    down: Callable[[Arm, str], None]


Say = Callable[[str], None]


def results_dir(out_dir: Path, arm: str, block: int) -> Path:
    return out_dir / "arms" / arm / f"block-{block}"


# A deployment's name is a Kubernetes name too (``servebook.names``), and the objects the
# Kubernetes backend derives from it add up to 26 characters (a LeaderWorkerSet's worker
# StatefulSet NAME-prefill-lws-10 and its revision-hash label, ``kube.names``): at most 36.
NAME_MAX = 36
TAG_LENGTH = 6


def new_tag(exp: Experiment, out_dir: Path) -> str:
    """The experiment's tag, which every deployment it makes carries: hex of a hash of
    its directory (one experiment per directory), the first whose names no deployment of
    this home holds (one left by an experiment whose directory was removed and made
    again keeps its logs).  Kept in the state, so a resumed experiment keeps its names."""
    from servebook.backends.state import deployments_dir

    taken = deployments_dir()
    where = str(out_dir.resolve())
    for n in range(1000):
        tag = hashlib.sha256(f"{where}\n{n}".encode()).hexdigest()[:TAG_LENGTH]
        names = [
            deployment_name(tag, a.name, b) for a in exp.arms for b in range(1, 1 + exp.blocks)
        ]
        if not any((taken / name).exists() for name in names):
            return tag
    raise UsageError(f"{taken}: every name tried for {out_dir}'s deployments is taken")


def deployment_name(tag: str, arm: str, block: int) -> str:
    """ARM-bBLOCK-TAG, the arm cut short (with a hash of its whole name) where the name
    would pass ``NAME_MAX``; it starts with a letter (a Kubernetes Service's name must)."""
    suffix = f"-b{block}-{tag}"
    head = arm if arm[0].isalpha() else f"arm-{arm}"
    room = NAME_MAX - len(suffix)
    if len(head) > room:
        cut = hashlib.sha256(arm.encode()).hexdigest()[:4]
        head = f"{head[: room - 5].rstrip('-')}-{cut}"
    return head + suffix


def entry_id(entry: dict[str, Any]) -> str:
    """How ``--retry`` names an entry of the schedule: BLOCK/ARM."""
    return f"{entry['block']}/{entry['arm']}"


_ENTRY = re.compile(r"^(\d+)/([a-z0-9-]+)$")


def retry(state: dict[str, Any], wanted: list[str], path: Path) -> list[dict[str, Any]]:
    """Each entry named BLOCK/ARM in ``wanted`` is pending again, to run in its place in
    the schedule; the attempt it replaces is appended to its ``retried`` (its times,
    outcome, deployment, verify's verdict and health misses, and when it was retried).
    Refused (exit 2, naming the entry and those that may be retried) unless every one is
    an invalid entry of this state."""
    by_id = {entry_id(e): e for e in state["schedule"]}
    invalid = [k for k, e in by_id.items() if e["outcome"] not in (DONE, PENDING)]
    may = f"its invalid entries: {', '.join(invalid)}" if invalid else "no entry of it is invalid"
    chosen = []
    for text in wanted:
        m = _ENTRY.match(text.strip())
        if m is None:
            raise UsageError(
                f"--retry {text!r}: name an entry of the schedule as BLOCK/ARM, e.g. "
                f"--retry 2/{state['baseline']} (block 2's entry of arm {state['baseline']})",
                hint=f"{path}: {may}",
            )
        key = f"{int(m.group(1))}/{m.group(2)}"
        entry = by_id.get(key)
        if entry is None:
            raise UsageError(
                f"--retry {text}: {path} has no entry {key} (block {int(m.group(1))}, arm "
                f"{m.group(2)})",
                hint=f"{path}: {may}",
            )
        if entry["outcome"] in (DONE, PENDING):
            said = "finished" if entry["outcome"] == DONE else "has not run yet (--resume runs it)"
            raise UsageError(
                f"--retry {key}: that entry {said}; only an invalid entry is run again",
                hint=f"{path}: {may}",
            )
        chosen.append(entry)
    for entry in chosen:
        kept = {k: entry[k] for k in _ATTEMPT if k in entry}
        entry.setdefault("retried", []).append({**kept, "retried_at": utc_now()})
        for k in _ATTEMPT[3:]:
            entry.pop(k, None)
        entry.update(started_at=None, ended_at=None, outcome=PENDING)
    return chosen


# What one attempt at an entry recorded: moved into ``retried`` when it is run again.
_ATTEMPT = ("started_at", "ended_at", "outcome", "deployment", "verify", "health_misses")


def analysis_settings(state: dict[str, Any], exp: Experiment) -> None:
    """The file's analysis-only keys (``slo``, ``pairs``) into ``state``: a resumed
    experiment is judged as its file says now, from the same benches."""
    state["slo"] = exp.slo
    state["pairs"] = [list(p) for p in exp.pairs]


def new_state(
    exp: Experiment, order: list[tuple[int, str]], design: str, tag: str
) -> dict[str, Any]:
    return {
        "kind": "servebook-experiment",
        "experiment": exp.path,
        "digest": exp.digest(),
        # what it reads besides its file, by content: a --resume compares them
        "inputs": input_files.digests(exp),
        # every deployment this experiment makes is named ARM-bBLOCK-TAG (deployment_name)
        "tag": tag,
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
    schedule = doc.get("schedule")
    for i, e in enumerate(schedule if isinstance(schedule, list) else [None]):
        if not (
            isinstance(e, dict)
            and isinstance(e.get("block"), int)
            and isinstance(e.get("arm"), str)
            and isinstance(e.get("outcome"), str)
        ):  # hostile probe D12d: a KeyError traceback
            raise UsageError(
                f"--resume: {path}: schedule[{i}] is not an entry (block, arm, outcome)",
                hint="it was edited or cut short: restore it, or start over in a new -o DIR",
            )
    if doc.get("digest") != exp.digest():
        raise UsageError(
            f"--resume: {path} was written by another experiment (arms, load, blocks or "
            f"seed differ from {exp.path})",
            hint="resume with the file it was started with, or start over in a new -o DIR",
        )
    input_files.check_unchanged(doc.get("inputs"), exp, path)
    return doc


def check_blocks(out_dir: Path, state: dict[str, Any]) -> None:
    """Every pending entry's block directory may be made: refused before anything runs
    when one is not this experiment's (``ownership``)."""
    for e in state["schedule"]:
        if e["outcome"] == PENDING:
            where = results_dir(out_dir, e["arm"], e["block"])
            ownership.check(out_dir, where, state["tag"], e["arm"], e["block"])


def save(out_dir: Path, state: dict[str, Any]) -> None:
    """``experiment.json``, atomically, readable by its owner only and redacted at the
    source (``redact.scrub``: a URL arm's ``user:pass@`` or ``?token=``, a secret in a
    step's message), as servebook's other records are (hostile probe D4)."""
    doc, _ = redact.scrub(state)
    write_atomic(out_dir / STATE_NAME, json.dumps(doc, indent=2) + "\n", mode=PRIVATE)


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
        # a bench interrupted before it finished starts over in a directory made anew
        # (removed only when this experiment made it: ``ownership``)
        ownership.fresh_block(out_dir, where, state["tag"], arm.name, entry["block"])
        entry["started_at"] = utc_now()
        entry["outcome"] = _one(arm, entry, where, steps, say, state["tag"])
        entry["ended_at"] = utc_now()
        if entry["outcome"] != DONE:
            say(f"block {entry['block']} is invalid: arm {arm.name} {entry['outcome']}")
        if after is not None:
            after(state)
        save(out_dir, state)
    return state


def _one(arm: Arm, entry: dict[str, Any], where: Path, steps: Steps, say: Say, tag: str) -> str:
    """One arm in one block; its outcome (``done``, or what failed and why).  A recipe
    arm's entry records the deployment brought up for it (``deployment``, fresh in every
    block, named for the experiment, the arm and the block) and verify's verdict on it
    (``verify``: ``passed``, or why not)."""
    if arm.kind != "recipe":
        return _bench(arm, None, where, steps, entry)
    # named before it comes up: a deployment that fails to leaves its logs under that name
    entry["deployment"] = deployment_name(tag, arm.name, entry["block"])
    try:
        handle = steps.up(arm, entry["deployment"])
    except BaseException as e:
        # What a failed or stopped up applied goes with it (down is idempotent): a
        # Kubernetes up leaves its objects for the user to read, which in an experiment
        # would hold the next arm's resources, and a Ctrl-C mid-up left them running.
        say(f"taking {entry['deployment']} down (its up did not finish)")
        try:
            steps.down(arm, entry["deployment"])
        except ServebookError as gone:  # the up's own failure is the one to report
            say(f"{entry['deployment']} did not go down: {gone}")
        if isinstance(e, StepFailed):
            return f"failed to come up: {e}"
        raise
    entry["deployment"] = handle
    try:
        steps.warm(arm, handle)
        reason = steps.verify(arm, handle)
        entry["verify"] = "passed" if reason is None else reason
        if reason is not None:
            return f"failed verify: {reason}"
        return _bench(arm, handle, where, steps, entry)
    except StepFailed as e:
        return f"failed: {e}"
    finally:
        say(f"taking {handle} down")
        steps.down(arm, handle)


def _bench(arm: Arm, handle: str | None, where: Path, steps: Steps, entry: dict[str, Any]) -> str:
    try:
        facts = steps.bench(arm, handle, where)
    except StepFailed as e:
        entry.update(e.facts)
        return f"bench failed: {e}"
    entry.update(facts or {})
    failed = measured_nothing(where)
    return DONE if failed is None else f"bench measured nothing: {failed}"


def measured_nothing(where: Path) -> str | None:
    """Why the bench that returned into ``where`` is no measurement (no results file, or
    not one successful request: every request refused, another model answering, the
    server gone), else None.  Such a bench makes its block invalid (hostile probe D5: it
    was a valid block, exit 0, "No crossover").  Points invalid for other reasons (server
    evidence, lag) are judged per level by the experiment's evidence, as before."""
    from servebook.results.schema import RESULTS_NAME
    from servebook.results.store import load_results

    path = where / RESULTS_NAME
    if not path.is_file():
        return f"it wrote no {RESULTS_NAME}"
    points = load_results(path).points
    if not points:
        return "no point finished"
    if any(p.requests_ok for p in points):
        return None
    failed = sum(p.errors for p in points)
    why = next((r for p in points for r in p.invalid_reasons), "")
    sample = next((x for p in points for x in p.error_samples), "")
    return (
        f"no successful request ({failed} failed over {len(points)} point(s))"
        + (f"; {why}" if why else "")
        + (f"; e.g. {sample}" if sample else "")
    )
