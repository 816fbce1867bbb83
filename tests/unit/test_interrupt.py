"""Ctrl-C, sent as the terminal sends it (SIGINT to the whole process group) to a real
``servebook bench`` process measuring a real HTTP server: it ends without a traceback,
exit 130, saying what it stopped, what it saved and that --resume continues; --resume
then finishes the sweep.  And the main job's report of what it has when Ctrl-C stops
its sweep (``pipeline.interrupted_bench``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from servebook.pipeline import interrupted_bench
from servebook.results.schema import RESULTS_NAME
from servebook.sweep import Interrupted
from tests.unit.result_runs import CPU
from tests.unit.test_bench_client import Server, server  # noqa: F401  (the fixture)

# As a terminal's shell starts a command: SIGINT at its default (a shell's background job,
# or this test's own runner, may hand it down ignored).
START = (
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "from servebook.cli import main\nmain()"
)


def bench(url: str, out: Path, tiny_dir: Path, *extra: str) -> subprocess.Popen[str]:
    args = [
        "bench", "--url", url, "--model", "tiny", "--tokenizer", str(tiny_dir),
        "--concurrency", "2,3", "--repetitions", "1", "--duration", "1s",
        "--warmup", "10s", "--input-len", "16", "--output-len", "4", "--workers", "2",
        "--max-client-lag-ms", "1000", "--min-achieved-concurrency", "0.5", "-o", str(out),
        *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-c", START, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_ctrl_c_during_a_warm_up_says_what_it_stopped_and_saved_and_resume_finishes(
    server: tuple[str, Server],  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
    tiny_dir: Path,
) -> None:
    url, srv = server
    srv.down = False
    out = tmp_path / "out"
    p = bench(url, out, tiny_dir)
    deadline = time.monotonic() + 90
    while not (out / RESULTS_NAME).exists():  # written once the first point finished
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.1)
    time.sleep(3.0)  # inside the second point's 10 s warm-up: workers started and sending
    os.killpg(p.pid, signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    said = " ".join(stderr.split())
    assert p.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    assert "Ctrl-C: stopping" in said
    assert "interrupted: stopped at c=" in said and "partial measurements are discarded" in said
    assert f"1 finished point(s) are in {out / RESULTS_NAME}" in said, said
    assert "rerun the same command with --resume" in said
    assert len(json.loads((out / RESULTS_NAME).read_text())["points"]) == 1
    # --resume, added to the same command as the message says, finishes the sweep
    p = bench(url, out, tiny_dir, "--resume")
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode in (0, 1), stdout + stderr
    assert len(json.loads((out / RESULTS_NAME).read_text())["points"]) == 2


def test_the_main_job_writes_the_report_of_the_points_it_has(tmp_path: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(CPU, out)
    n = len(json.loads((out / RESULTS_NAME).read_text())["points"])
    e = interrupted_bench(
        Interrupted(
            "stopped at c=4 rep 1 (...); 6 finished point(s) are in X.", path=None, points=n
        ),
        out,
        "tiny-pd",
    )
    assert (out / "report.html").is_file() and (out / "report.md").is_file()
    msg = str(e)
    assert f"Their report: {out / 'report.html'}" in msg
    assert "tiny-pd was taken down" in msg and "`servebook run` starts over" in msg
    empty = tmp_path / "empty"
    empty.mkdir()
    e = interrupted_bench(Interrupted("stopped at c=1 rep 0", path=None, points=0), empty, "x")
    assert not (empty / "report.html").exists() and "report" not in str(e)
