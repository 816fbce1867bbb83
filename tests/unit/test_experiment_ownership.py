"""An experiment's directory is its own (issue 44, point 1; the hostile probe of
2026-12-07, ``shared/reference/hostile-probe-2026-12-07.md``): D1, `experiment -o DIR`
deleted whatever was at ``DIR/arms/ARM/block-N`` and wrote through a symlinked ``arms``
outside DIR; D2, two ``--resume`` of one directory ran its schedule at once, deleting each
other's blocks; D12c, a symlinked block directory ended in an OSError traceback."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servebook.experiment import ownership, session, spec
from servebook.experiment.runner import Steps
from servebook.experiment.spec import Arm
from tests.conftest import CliResult
from tests.unit.result_runs import RESULTS

FIELD = RESULTS / "trial-mixed-spec" / "results.json"


def exp_file(tmp_path: Path) -> Path:
    f = tmp_path / "exp.yaml"
    arms = [{"name": n, "url": "http://127.0.0.1:9", "model": "m"} for n in ("a", "b")]
    f.write_text(json.dumps({"baseline": "a", "blocks": 2, "arms": arms, "load": {}}))
    return f


def steps(
    calls: list[str], stop_at: int | None = None, during: Callable[[], None] | None = None
) -> Steps:
    """Steps whose bench writes a real results file (the field trial's) into its block
    directory; the ``stop_at``-th bench is stopped (Ctrl-C) before it writes, and
    ``during()`` runs inside the first bench."""

    def bench(arm: Arm, _name: str | None, where: Path) -> dict[str, Any] | None:
        calls.append(f"{where.name}/{arm.name}")
        if during is not None and len(calls) == 1:
            during()
        if stop_at is not None and len(calls) == stop_at:
            raise KeyboardInterrupt
        shutil.copy(FIELD, where / "results.json")
        return None

    nothing: Callable[..., None] = lambda *_a: None  # noqa: E731
    return Steps(lambda _a, name: name, nothing, lambda *_a: None, bench, nothing)


def stopped_at_third(tmp_path: Path) -> tuple[spec.Experiment, Path, dict[str, Any]]:
    exp = spec.load(exp_file(tmp_path))
    out = tmp_path / "out"
    with pytest.raises(session.ExperimentStopped):
        session.execute(exp, out, steps([], stop_at=3), lambda _l: None)
    return exp, out, json.loads((out / "experiment.json").read_text())


def test_d1_a_new_experiment_refuses_a_directory_whose_arms_it_did_not_make(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """D1: ``precious.txt`` and ``thesis.tex`` under ``DIR/arms/a/block-1`` were deleted,
    exit 0."""
    f = exp_file(tmp_path)
    out = tmp_path / "x"
    theirs = out / "arms" / "a" / "block-1"
    theirs.mkdir(parents=True)
    (theirs / "thesis.tex").write_text("precious")
    r = cli("experiment", str(f), "-o", str(out))
    assert r.returncode == 2, (r.stdout, r.stderr)
    said = " ".join(r.stderr.split())
    assert f"{out / 'arms'} exists" in said and "removes nothing it did not make" in said
    assert (theirs / "thesis.tex").read_text() == "precious"
    assert sorted(p.name for p in out.iterdir()) == ["arms"]  # no experiment.json, no lock


def test_d1_resume_does_not_write_or_delete_through_a_symlinked_arms_directory(
    tmp_path: Path,
) -> None:
    """D1: with ``DIR/arms -> victim``, ``victim/a/block-1/paper.txt`` was deleted and
    results were written there."""
    exp, out, saved = stopped_at_third(tmp_path)
    pending = next(e for e in saved["schedule"] if e["outcome"] == "pending")
    victim = tmp_path / "victim"
    shutil.move(out / "arms", victim)  # what the experiment wrote, now outside DIR
    (out / "arms").symlink_to(victim)
    theirs = victim / pending["arm"] / f"block-{pending['block']}"
    shutil.rmtree(theirs, ignore_errors=True)
    theirs.mkdir(parents=True)
    (theirs / "paper.txt").write_text("mine")
    before = sorted(str(p.relative_to(victim)) for p in victim.rglob("*"))
    calls: list[str] = []
    with pytest.raises(Exception) as e:
        session.execute(exp, out, steps(calls), lambda _l: None, resume=True)
    assert getattr(e.value, "exit_code", None) == 2, e.value
    assert f"{out / 'arms'} is a symbolic link (to {victim})" in str(e.value)
    assert calls == []  # refused before anything ran
    assert sorted(str(p.relative_to(victim)) for p in victim.rglob("*")) == before
    assert (theirs / "paper.txt").read_text() == "mine"
    assert json.loads((out / "experiment.json").read_text()) == saved


def test_d1_resume_removes_only_a_block_directory_this_experiment_made(tmp_path: Path) -> None:
    """An interrupted bench's directory (made by the runner, its marker inside) starts
    over; one that someone else made at that path is refused naming it, untouched."""
    exp, out, saved = stopped_at_third(tmp_path)
    pending = [e for e in saved["schedule"] if e["outcome"] == "pending"]
    cut = out / "arms" / pending[0]["arm"] / f"block-{pending[0]['block']}"
    assert (cut / ownership.MARKER).is_file() and not (cut / "results.json").exists()
    theirs = out / "arms" / pending[1]["arm"] / f"block-{pending[1]['block']}"
    theirs.mkdir(parents=True)
    (theirs / "notes.txt").write_text("mine")
    calls: list[str] = []
    with pytest.raises(Exception) as e:
        session.execute(exp, out, steps(calls), lambda _l: None, resume=True)
    assert getattr(e.value, "exit_code", None) == 2, e.value
    assert f"{theirs} exists and was not made by this experiment" in str(e.value)
    assert calls == [] and (theirs / "notes.txt").read_text() == "mine"
    assert (cut / ownership.MARKER).is_file()  # nothing removed either

    shutil.rmtree(theirs)  # the fix the refusal gives
    done = session.execute(exp, out, steps(calls), lambda _l: None, resume=True)
    assert [e["outcome"] for e in done["schedule"]] == ["done"] * 4
    assert (cut / "results.json").is_file()


def test_d12c_a_symlinked_block_directory_is_refused_not_a_traceback(tmp_path: Path) -> None:
    exp, out, saved = stopped_at_third(tmp_path)
    pending = next(e for e in saved["schedule"] if e["outcome"] == "pending")
    cut = out / "arms" / pending["arm"] / f"block-{pending['block']}"
    shutil.rmtree(cut)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    cut.symlink_to(target)
    with pytest.raises(Exception) as e:
        session.execute(exp, out, steps([]), lambda _l: None, resume=True)
    assert getattr(e.value, "exit_code", None) == 2 and "is a symbolic link" in str(e.value)
    assert (target / "keep").read_text() == "x" and cut.is_symlink()


def test_d2_a_second_resume_of_a_running_experiment_is_refused_naming_its_pid(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """D2: a second ``--resume`` while the first ran deleted the first's block and both
    ran the schedule; now the second exits 2 naming the first's pid, and the first
    finishes alone."""
    f = exp_file(tmp_path)
    exp = spec.load(f)
    out = tmp_path / "out"
    second: list[CliResult] = []

    def during() -> None:
        second.append(cli("experiment", str(f), "-o", str(out), "--resume"))
        second.append(cli("experiment", str(f), "-o", str(out)))

    calls: list[str] = []
    done = session.execute(exp, out, steps(calls, during=during), lambda _l: None)
    for r in second:
        assert r.returncode == 2, (r.stdout, r.stderr)
        said = " ".join(r.stderr.split())
        assert f"being run by another `servebook experiment` (pid {os.getpid()}" in said, said
    assert len(calls) == 4 and [e["outcome"] for e in done["schedule"]] == ["done"] * 4
    assert not (out / ownership.LOCK_NAME).exists()  # given up when the run ended
    assert all((out / "arms" / e["arm"] / f"block-{e['block']}" / "results.json").is_file()
               for e in done["schedule"])  # fmt: skip


def test_d4_url_credentials_never_reach_experiment_json_which_is_its_owner_s_only(
    tmp_path: Path,
) -> None:
    """D4: a URL arm's ``?token=`` and ``user:pass@`` were written in clear into
    ``experiment.json`` (mode 0644), which the report is made from."""
    f = tmp_path / "sec.yaml"
    arms = [
        {"name": "a", "url": "http://127.0.0.1:9/?token=EXPTOK4567", "model": "m"},
        {"name": "b", "url": "http://admin:EXPPASS9876@127.0.0.1:9", "model": "m"},
    ]
    f.write_text(json.dumps({"baseline": "a", "blocks": 2, "arms": arms, "load": {}}))
    exp = spec.load(f)
    out = tmp_path / "out"
    done = session.execute(exp, out, steps([]), lambda _l: None)
    text = (out / "experiment.json").read_text()
    assert "EXPTOK4567" not in text and "EXPPASS9876" not in text
    assert (out / "experiment.json").stat().st_mode & 0o777 == 0o600
    saved = json.loads(text)
    what = {a["name"]: a["what"] for a in saved["arms"]}
    assert what["a"].startswith("http://127.0.0.1:9/?token=<redacted>")
    assert "<redacted>" in what["b"] and "127.0.0.1:9" in what["b"]
    # nothing else of the state changed on its way to the file
    for key in ("schedule", "comparisons", "level_orders", "load", "digest", "tag"):
        assert saved[key] == done[key], key
    # a resume still recognises its experiment (the digest holds the URLs, hashed)
    again = session.execute(exp, out, steps([]), lambda _l: None, resume=True)
    assert [e["outcome"] for e in again["schedule"]] == ["done"] * 4


@pytest.mark.parametrize("changed", ["dataset", "values", "recipe"])
def test_d6_resume_refuses_an_input_file_changed_since_the_experiment_started(
    tmp_path: Path, changed: str
) -> None:
    """D6: ``--resume`` compared the paths of the dataset, values and recipe files, not
    their content: a dataset replaced between blocks went on, exit 0, "like for like"."""
    from servebook.recipe.resolve import load_source

    files = {
        "dataset": tmp_path / "prompts.jsonl",
        "values": tmp_path / "site.yaml",
        "recipe": tmp_path / "mine.yaml",
    }
    files["dataset"].write_text(json.dumps({"prompt": "one"}) + "\n")
    files["values"].write_text("{}\n")
    files["recipe"].write_text(json.dumps(load_source("tiny-mixed").data))
    f = tmp_path / "exp.yaml"
    arms = [
        {"name": "a", "recipe": str(files["recipe"])},
        {"name": "b", "recipe": "tiny-mixed", "set": {"served_model_name": "tiny"}},
    ]
    doc = {"baseline": "a", "blocks": 2, "arms": arms, "values": "site.yaml"}
    f.write_text(json.dumps({**doc, "load": {"dataset": "prompts.jsonl"}}))
    exp = spec.load(f)
    out = tmp_path / "out"
    with pytest.raises(session.ExperimentStopped):
        session.execute(exp, out, steps([], stop_at=3), lambda _l: None)
    saved = json.loads((out / "experiment.json").read_text())
    assert set(saved["inputs"]) == {
        f"dataset {files['dataset']}",
        f"values file {files['values']}",
        f"recipe file {files['recipe']}",
        "built-in recipe tiny-mixed",
    }
    before = files[changed].read_text()
    edit = {"dataset": {"prompt": "two"}, "values": {"model_dir": "/m"}}
    edit["recipe"] = {**json.loads(before), "description": "edited"}
    files[changed].write_text(json.dumps(edit[changed]) + "\n")
    calls: list[str] = []
    with pytest.raises(Exception) as e:
        session.execute(exp, out, steps(calls), lambda _l: None, resume=True)
    assert getattr(e.value, "exit_code", None) == 2, e.value
    assert f"{files[changed]} changed since {out / 'experiment.json'} was started" in str(e.value)
    assert calls == [] and json.loads((out / "experiment.json").read_text()) == saved
    files[changed].write_text(before)  # put back as it was: it resumes
    done = session.execute(exp, out, steps(calls), lambda _l: None, resume=True)
    assert [x["outcome"] for x in done["schedule"]] == ["done"] * 4


def test_d1_variant_an_arm_s_directory_linked_out_of_dir_is_refused_too(tmp_path: Path) -> None:
    """A variant not in the probe: ``arms/ARM`` (not ``arms``) a link out of DIR."""
    exp, out, saved = stopped_at_third(tmp_path)
    pending = next(e for e in saved["schedule"] if e["outcome"] == "pending")
    victim = tmp_path / "victim"
    shutil.move(out / "arms" / pending["arm"], victim)
    (out / "arms" / pending["arm"]).symlink_to(victim)
    (victim / "paper.txt").write_text("mine")
    before = sorted(p.name for p in victim.rglob("*"))
    with pytest.raises(Exception) as e:
        session.execute(exp, out, steps([]), lambda _l: None, resume=True)
    assert getattr(e.value, "exit_code", None) == 2 and "is a symbolic link" in str(e.value)
    assert sorted(p.name for p in victim.rglob("*")) == before
