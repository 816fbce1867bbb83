"""One run owns a results directory (issue 33, D1 and D25): two runs given one ``-o``
replaced each other's results.json point by point and both named it as theirs.  A writer
takes ``DIR/results.lock`` naming its pid before anything else, and reads it again before
each write; a directory that cannot be written is refused before any load."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from servebook.errors import UsageError
from servebook.results.store import LOCK_NAME, ResultsTaken, ResultsWriter
from tests.unit.conftest import a_point, a_provenance


def test_a_second_run_in_a_directory_another_run_holds_is_refused_naming_its_pid(
    tmp_path: Path, other_process: subprocess.Popen[bytes]
) -> None:
    (tmp_path / LOCK_NAME).write_text(f"{other_process.pid}\n")
    with pytest.raises(UsageError, match=f"another run \\(pid {other_process.pid}"):
        ResultsWriter(tmp_path, a_provenance())
    assert not (tmp_path / "results.json").exists()
    assert (tmp_path / LOCK_NAME).read_text().split() == [str(other_process.pid)]


def test_a_run_whose_directory_was_taken_does_not_overwrite_the_other_runs_file(
    tmp_path: Path, other_process: subprocess.Popen[bytes]
) -> None:
    mine = ResultsWriter(tmp_path, a_provenance(seed=1))
    mine.add(a_point(1, 0))
    # The other run took the directory (its lock, its file) while this one measured.
    (tmp_path / LOCK_NAME).write_text(f"{other_process.pid}\n")
    theirs = a_provenance(seed=2).model_dump_json()
    (tmp_path / "results.json").write_text(json.dumps({"theirs": json.loads(theirs)}))
    with pytest.raises(ResultsTaken, match=f"pid {other_process.pid}"):
        mine.add(a_point(4, 0))
    assert "theirs" in json.loads((tmp_path / "results.json").read_text())
    mine.close()  # not this run's lock: left to its owner
    assert (tmp_path / LOCK_NAME).read_text().split() == [str(other_process.pid)]


def test_a_lock_left_by_a_run_that_ended_is_taken_over_and_released(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no running process now
    (tmp_path / LOCK_NAME).write_text(f"{gone.pid}\n")
    with ResultsWriter(tmp_path, a_provenance()) as w:
        w.add(a_point(1, 0))
        assert (tmp_path / LOCK_NAME).exists()
    assert not (tmp_path / LOCK_NAME).exists()
    assert len(json.loads((tmp_path / "results.json").read_text())["points"]) == 1
