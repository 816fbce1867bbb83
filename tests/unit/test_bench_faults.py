"""Faults of the target and of the results directory during a real ``servebook bench``
against the scripted stand-in engine (``engine_standin.scripted_engine``): issue 33's D1,
D9, D13 and D25.  Each ends as a failure that names what happened, never as valid points
or a wait without end."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from servebook.results.store import LOCK_NAME
from tests.conftest import CliResult
from tests.unit.conftest import quick_bench
from tests.unit.engine_standin import scripted_engine


def words(r: CliResult) -> str:
    return " ".join(r.stderr.split())


def test_bench_into_a_directory_another_run_writes_is_refused_before_any_load(
    cli: Callable[..., CliResult],
    tmp_path: Path,
    tiny_dir: Path,
    other_process: subprocess.Popen[bytes],
) -> None:
    """D1: both runs passed the "already exists" check, then replaced each other's file."""
    out, seen = tmp_path / "same", tmp_path / "seen"
    out.mkdir()
    (out / LOCK_NAME).write_text(f"{other_process.pid}\n")
    with scripted_engine(tokenizer=tiny_dir / "tokenizer.json", seen=seen) as (url, _):
        r = cli(*quick_bench(url, tiny_dir, out))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"being written by another run (pid {other_process.pid}" in words(r)
    assert "Traceback" not in r.stderr
    assert not list(seen.iterdir())  # nothing was sent
    assert sorted(f.name for f in out.iterdir()) == [LOCK_NAME]


def test_an_output_directory_that_cannot_be_made_is_refused_before_any_load(
    cli: Callable[..., CliResult], tmp_path: Path, tiny_dir: Path
) -> None:
    """D25: the whole first point was measured, then a PermissionError traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    seen = tmp_path / "seen"
    with scripted_engine(tokenizer=tiny_dir / "tokenizer.json", seen=seen) as (url, _):
        r = cli(*quick_bench(url, tiny_dir, blocker / "out"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"-o {blocker / 'out'}: cannot write there" in words(r)
    assert "nothing was measured" in words(r)
    assert "Traceback" not in r.stderr
    assert not list(seen.iterdir())
