"""Faults of the target and of the results directory during a real ``servebook bench``
against the scripted stand-in engine (``engine_standin.scripted_engine``): issue 33's D1,
D9, D13 and D25.  Each ends as a failure that names what happened, never as valid points
or a wait without end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from servebook.results.store import LOCK_NAME
from tests.conftest import CliResult
from tests.unit.conftest import quick_bench
from tests.unit.engine_standin import scripted_engine, vllm_package


def words(r: CliResult) -> str:
    return " ".join(r.stderr.split())


def test_a_server_answering_as_another_model_gives_invalid_points_naming_both_models(
    cli: Callable[..., CliResult], tmp_path: Path, tiny_dir: Path
) -> None:
    """D9: every chunk named "someone-else"; the points were valid and bench exited 0."""
    out = tmp_path / "out"
    with scripted_engine(answer_model="someone-else", tokenizer=tiny_dir / "tokenizer.json") as (
        url,
        _,
    ):
        r = cli(*quick_bench(url, tiny_dir, out))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["points"] and not any(p["valid"] for p in doc["points"])
    for p in doc["points"]:
        assert any("'someone-else', not 'tiny'" in why for why in p["invalid_reasons"]), p
    assert "answered as model 'someone-else', not 'tiny'" in words(r)


def test_the_same_server_answering_as_the_model_asked_for_gives_valid_points(
    cli: Callable[..., CliResult], tmp_path: Path, tiny_dir: Path
) -> None:
    out = tmp_path / "out"
    with scripted_engine(tokenizer=tiny_dir / "tokenizer.json") as (url, _):
        r = cli(*quick_bench(url, tiny_dir, out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(p["valid"] for p in json.loads((out / "results.json").read_text())["points"])


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


def test_a_target_that_stalls_mid_sweep_ends_the_sweep_with_the_points_so_far(
    tmp_path: Path, tiny_dir: Path
) -> None:
    """D13: a stopped server cost the stall deadline (120 s) for every point left, and the
    sweep never gave up.  Now its first stalled point ends the sweep: exit 1, saying so,
    with the finished point and the stalled one (invalid) in the file."""
    out = tmp_path / "out"
    args = quick_bench("URL", tiny_dir, out, "--concurrency", "1,2,3", "--stall", "2s")
    with scripted_engine(tokenizer=tiny_dir / "tokenizer.json") as (url, engine):
        args[args.index("URL")] = url
        bench = subprocess.Popen(
            [sys.executable, "-m", "servebook", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        deadline = time.monotonic() + 60
        while not (out / "results.json").exists():  # written once c=1 finished
            assert bench.poll() is None and time.monotonic() < deadline, bench.communicate()
            time.sleep(0.05)
        os.kill(engine.pid, signal.SIGSTOP)  # the server stops answering during c=2
        stdout, stderr = bench.communicate(timeout=90)
    said = " ".join(stderr.split())
    assert bench.returncode == 1, stdout + stderr
    assert "Traceback" not in stderr
    assert "the target stalled at c=2 rep 0: no request succeeded for 2 s" in said, said
    assert f"2 point(s), the stalled one included (invalid), are in {out / 'results.json'}" in said
    points = json.loads((out / "results.json").read_text())["points"]
    assert [(p["concurrency"], p["valid"]) for p in points] == [(1, True), (2, False)]
    assert not (out / "results.lock").exists()


def test_down_during_bench_stops_it_before_another_point_of_connection_errors(
    cli: Callable[..., CliResult], sb_home: Path, tmp_path: Path, tiny_dir: Path
) -> None:
    """D28: `down` during `bench` made bench measure one more point of nothing but
    connection errors: the engine was still exiting (its port already closed), so its
    process counted as running.  The stand-in engine exits 5 s after SIGTERM, as vLLM's
    shutdown takes seconds."""
    (tmp_path / "model").mkdir()
    env = vllm_package(tmp_path / "vllm", term_linger_s=5)
    up = cli("up", "tiny-mixed", "--set", f"model_dir={tmp_path / 'model'}", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    out = tmp_path / "out"
    args = quick_bench("URL", tiny_dir, out, "--concurrency", "1,2,3,4,5,6")
    at = args.index("--url")
    args[at : at + 4] = ["tiny-mixed"]  # the deployment, not --url URL --model tiny
    bench = subprocess.Popen(
        [sys.executable, "-m", "servebook", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env, "SERVEBOOK_HOME": str(sb_home), "COLUMNS": "200"},
    )
    try:
        deadline = time.monotonic() + 60
        while not (out / "results.json").exists():  # written once c=1 finished
            assert bench.poll() is None and time.monotonic() < deadline, bench.communicate()
            time.sleep(0.05)
        down = cli("down", "tiny-mixed", env=env)
        stdout, stderr = bench.communicate(timeout=90)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert down.returncode == 0, down.stdout + down.stderr
    said = " ".join(stderr.split())
    assert bench.returncode == 1, stdout + stderr
    assert "Traceback" not in stderr
    assert "role(s) mixed" in said and "rerun with --resume" in said, said
    points = json.loads((out / "results.json").read_text())["points"]
    nothing = [p["concurrency"] for p in points if p["requests_ok"] == 0]
    assert len(nothing) <= 1, points  # at most the point down cut short
    assert len(points) < 6
