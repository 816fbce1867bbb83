"""Ctrl-C, sent as the terminal sends it (SIGINT to the whole process group) to a real
``servebook bench`` process measuring a real HTTP server: it ends without a traceback,
exit 130, saying what it stopped, what it saved and that --resume continues; --resume
then finishes the sweep.  And the main job's report of what it has when Ctrl-C stops
its sweep (``pipeline.interrupted_bench``).

SIGTERM (what CI runners, `timeout` and systemd send) and SIGHUP (a closed terminal or SSH
session) get exactly what Ctrl-C gets, exit 128 + the signal (issue 32, finding 5: a
`timeout 600 servebook run` left tiny-pd's three processes running and `status` called them
healthy).  ``up`` and ``run`` are stopped the same way on the local backend, with a
stand-in vLLM that holds a completion open (``engine_standin.vllm_package``): nothing they
started is left running and no record is left for `status`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from servebook.bench.sweep import Interrupted
from servebook.pipeline import interrupted_bench
from servebook.results.schema import RESULTS_NAME
from tests.conftest import CliResult
from tests.unit.conftest import START
from tests.unit.engine_standin import vllm_package
from tests.unit.result_runs import CPU
from tests.unit.served_app import StreamingServer

STOPS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
SAID = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
#: bench's warm-up: the signal is sent within a fraction of a second of the second point's
#: first requests (``stopped_in_a_warm_up``), so this is its margin on a loaded machine.
WARMUP_S = 5.0


def servebook(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`servebook ARGS` in a process group of its own, as a shell starts a command."""
    return subprocess.Popen(
        [sys.executable, "-c", START, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def bench(url: str, out: Path, tiny_dir: Path, *extra: str) -> subprocess.Popen[str]:
    args = [
        "bench", "--url", url, "--model", "tiny", "--tokenizer", str(tiny_dir),
        "--concurrency", "2,3", "--repetitions", "1", "--precision", "off", "--duration", "1s",
        "--warmup", f"{WARMUP_S:g}s", "--input-len", "16", "--output-len", "4", "--workers", "2",
        "--max-client-lag-ms", "1000", "--min-achieved-concurrency", "0.5", "-o", str(out),
        *extra,
    ]  # fmt: skip
    return servebook(*args)


def stopped_in_a_warm_up(
    sig: signal.Signals, url: str, out: Path, tiny_dir: Path, srv: StreamingServer
) -> subprocess.Popen[str]:
    """bench, signalled in its second point's warm-up, after what it said was checked."""
    p = bench(url, out, tiny_dir)
    deadline = time.monotonic() + 90
    while not (out / RESULTS_NAME).exists():  # written once the first point finished
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.1)
    # Inside the second point's warm-up, its workers started and sending: the server has
    # seen more requests than its c=3 holds at once since the first point was saved.  (A
    # fixed 3 s wait in a 10 s warm-up assumed so, and spent 14 s of load per case.)
    first = len(srv.bodies)
    while len(srv.bodies) < first + 2 * 3:
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.05)
    os.killpg(p.pid, sig)  # the whole group, as a terminal, `timeout` and systemd do
    stdout, stderr = p.communicate(timeout=60)
    said = " ".join(stderr.split())
    assert p.returncode == 128 + sig, stdout + stderr
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    assert f"{SAID[sig]}: stopping" in said
    assert "interrupted: stopped at c=" in said and "partial measurements are discarded" in said
    assert f"1 finished point(s) are in {out / RESULTS_NAME}" in said, said
    assert "rerun the same command with --resume" in said
    assert len(json.loads((out / RESULTS_NAME).read_text())["points"]) == 1
    return p


def test_ctrl_c_during_a_warm_up_says_what_it_stopped_and_saved_and_resume_finishes(
    server: tuple[str, StreamingServer],
    tmp_path: Path,
    tiny_dir: Path,
) -> None:
    url, srv = server
    srv.down = False
    out = tmp_path / "out"
    stopped_in_a_warm_up(signal.SIGINT, url, out, tiny_dir, srv)
    # --resume, added to the same command as the message says, finishes the sweep
    p = bench(url, out, tiny_dir, "--resume")
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode in (0, 1), stdout + stderr
    assert len(json.loads((out / RESULTS_NAME).read_text())["points"]) == 2


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_sigterm_and_sighup_during_a_warm_up_stop_bench_as_ctrl_c_does(
    sig: signal.Signals,
    server: tuple[str, StreamingServer],
    tmp_path: Path,
    tiny_dir: Path,
) -> None:
    """Before: killed at once, exit -15 / -1, the point in progress never said, its
    workers left to the signal."""
    url, srv = server
    srv.down = False
    stopped_in_a_warm_up(sig, url, tmp_path / "out", tiny_dir, srv)


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


def gone(pid: int) -> bool:
    """No such process, or only its zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def stopped_mid_way(
    sig: signal.Signals, args: list[str], home: Path, tmp_path: Path, answered: int
) -> tuple[subprocess.Popen[str], str, list[int]]:
    """`servebook ARGS` on the stand-in vLLM, signalled once the stand-in holds open the
    completion after the first ``answered``: (the process, its stderr, the pids it had
    started)."""
    seen = tmp_path / "seen"
    env = {**vllm_package(tmp_path / "vllm", answer=answered, seen=seen)}
    p = servebook(*args, env={**env, "SERVEBOOK_HOME": str(home)})
    deadline = time.monotonic() + 60
    while not (seen / f"completion-{answered + 1}").exists():
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.1)
    records = list((home / "deployments").glob("*/state.json"))
    assert len(records) == 1
    pids = [r["pid"] for r in json.loads(records[0].read_text())["roles"]]
    assert pids and not any(gone(pid) for pid in pids)
    os.killpg(p.pid, sig)
    _, stderr = p.communicate(timeout=60)
    return p, " ".join(stderr.split()), pids


def assert_nothing_left(cli: Callable[..., CliResult], pids: list[int]) -> None:
    deadline = time.monotonic() + 5
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(gone(pid) for pid in pids), pids
    st = cli("status")
    assert st.returncode == 2 and "no deployment" in st.stderr.lower(), st


@pytest.mark.parametrize("sig", STOPS, ids=lambda s: s.name)
def test_a_stop_signal_while_up_waits_stops_every_role_it_started_and_leaves_no_record(
    sig: signal.Signals, sb_home: Path, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    """Before: SIGTERM and SIGHUP killed `up` at once; its engine ran on, recorded healthy."""
    (tmp_path / "model").mkdir()
    args = ["up", "tiny-mixed", "--set", f"model_dir={tmp_path / 'model'}"]
    p, said, pids = stopped_mid_way(sig, args, sb_home, tmp_path, answered=0)
    assert p.returncode == 128 + sig, said
    assert "Traceback" not in said and f"{SAID[sig]}: stopping" in said, said
    assert f"interrupted: stopped by {SAID[sig]} before it finished" in said, said
    assert_nothing_left(cli, pids)


@pytest.mark.parametrize("sig", STOPS, ids=lambda s: s.name)
def test_a_stop_signal_during_runs_verify_takes_the_deployment_down(
    sig: signal.Signals, sb_home: Path, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    """The main job brought the stand-in up (one completion answered) and was verifying it
    (the next held open) when the signal came: down ran, as after Ctrl-C."""
    (tmp_path / "model").mkdir()
    out = tmp_path / "run"
    args = ["run", "tiny-mixed", "--set", f"model_dir={tmp_path / 'model'}", "-o", str(out)]
    p, said, pids = stopped_mid_way(sig, args, sb_home, tmp_path, answered=1)
    assert p.returncode == 128 + sig, said
    assert "Traceback" not in said and f"{SAID[sig]}: stopping" in said, said
    assert "stopped during verify: nothing was measured; tiny-mixed was taken down" in said
    assert_nothing_left(cli, pids)
