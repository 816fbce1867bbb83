"""Failure is never a measurement (issue 44, point 4; hostile probe D5 of
``shared/reference/hostile-probe-2026-12-07.md``): an arm whose every request was refused
made a valid block, exit 0, and a report that led with "No crossover"; and (point 3, D10) a
deployment a killed run left up is taken down before its block runs again."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CliResult
from tests.unit.conftest import QUICK_LOAD
from tests.unit.engine_standin import scripted_engine


def test_d5_an_arm_whose_every_request_fails_invalidates_its_block_and_the_experiment(
    tmp_path: Path, tiny_dir: Path, cli: Callable[..., CliResult]
) -> None:
    tokenizer = tiny_dir / "tokenizer.json"
    with (
        scripted_engine(tokenizer=tokenizer) as (good, _),
        scripted_engine(tokenizer=tokenizer, fault="500") as (bad, _),
    ):
        f = tmp_path / "die.yaml"
        arms = [
            {"name": "a", "url": good, "model": "tiny"},
            {"name": "c", "url": bad, "model": "tiny"},
        ]
        load = {**QUICK_LOAD, "input-len": 16, "tokenizer": str(tiny_dir), "stall": "1s"}
        f.write_text(json.dumps({"baseline": "a", "blocks": 1, "arms": arms, "load": load}))
        out = tmp_path / "out"
        r = cli("experiment", str(f), "-o", str(out))
    said = " ".join(r.stdout.split())
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert said.startswith("NO VALID COMPARISON: every block is invalid (block 1: arm c bench"), (
        said
    )
    assert "block 1 INVALID: arm c bench" in said
    state = json.loads((out / "experiment.json").read_text())
    entry = next(e for e in state["schedule"] if e["arm"] == "c")
    assert entry["outcome"].startswith("bench measured nothing: no successful request ("), entry
    assert state["comparisons"] == [] and state["no_comparison"].startswith("every block")
    assert "--retry 1/c" in said  # the way to run it again
    r = cli("report", str(out))
    assert r.returncode == 0, r.stderr
    md = (out / "report.md").read_text()
    first = md.split("\n\n")[1]
    assert first.startswith("No valid comparison: every block is invalid"), md[:400]
    assert "No crossover" not in md


def test_d10_a_deployment_left_up_by_a_killed_run_is_taken_down_before_its_block_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_place: Callable[..., Any]
) -> None:
    """D10: ``--resume`` after a killed run found the run's deployment still up, failed the
    block for good ("already up") and left the engine running."""
    from servebook.backends import registry
    from servebook.experiment import runner, session, spec
    from servebook.experiment.steps import arm_plan, servebook_steps

    place = fake_place()
    monkeypatch.setitem(registry._PLACES, "local", lambda: place)
    f = tmp_path / "exp.yaml"
    arms = [{"name": n, "recipe": "tiny-mixed", "set": {"model_dir": str(tmp_path)}} for n in "ab"]
    f.write_text(json.dumps({"baseline": "a", "blocks": 1, "arms": arms}))
    exp = spec.load(f)
    out = tmp_path / "out"
    block, arm = session.order_of(exp)[0]
    name = runner.deployment_name(session.tag_of(exp, out), arm, block)
    place.up(arm_plan(exp, exp.arm(arm), name), name=name, timeout_s=None, say=print)
    said: list[str] = []
    steps = servebook_steps(exp, said.append, None)
    assert steps.up(exp.arm(arm), name) == name
    assert place.calls[-2:] == [f"down {name}", f"up {name}"]
    assert f"{name} is left up by an earlier run of this experiment: taking it down first" in said
    steps.down(exp.arm(arm), name)
    assert not place.has(name)
