"""Port handling of the local backend: held ports and the port-clash retry's trigger."""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from servebook import http
from servebook.backends.local.deployer import port_clash
from servebook.errors import ServebookError


def test_a_held_port_is_not_handed_out_and_cannot_be_bound_until_released() -> None:
    held = http.hold_port("127.0.0.1", 0)
    port = held.getsockname()[1]
    try:
        with pytest.raises(OSError):
            _bind_plain(port)
        others = [http.hold_port("127.0.0.1", 0) for _ in range(50)]
        assert port not in {s.getsockname()[1] for s in others}
        for s in others:
            s.close()
    finally:
        held.close()
    _bind_plain(port).close()  # released: a server can now bind it


def _bind_plain(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        raise
    return s


def test_a_port_a_server_listens_on_cannot_be_held() -> None:
    server = _bind_plain(0)
    server.listen()
    try:
        with pytest.raises(OSError):
            http.hold_port("127.0.0.1", server.getsockname()[1])
    finally:
        server.close()


@pytest.mark.parametrize(
    "line",
    [
        # vllm-router 0.1.x, from a CI run where another process took its port
        "Error starting router: Address already in use (os error 98)",
        # uvicorn under `vllm serve`
        "ERROR: [Errno 98] error while attempting to bind on address ('127.0.0.1', 41000): "
        "address already in use",
    ],
)
def test_a_port_clash_is_recognised_in_a_role_log(line: str) -> None:
    assert port_clash("INFO starting\n" + line + "\nTraceback ...")


def test_other_deaths_are_not_port_clashes() -> None:
    assert not port_clash("RuntimeError: CUDA out of memory\nKilled")


def test_engines_on_one_machine_get_cores_of_their_own() -> None:
    from servebook.backends.local.deployer import engine_cores

    none: dict[str, str] = {}
    assert engine_cores(["prefill", "decode"], lambda n: none, [0, 1]) == {
        "prefill": "0",
        "decode": "1",
    }
    assert engine_cores(["prefill", "decode"], lambda n: none, [0, 1, 2, 3, 4]) == {
        "prefill": "0,1",
        "decode": "2,3,4",
    }
    assert engine_cores(["mixed"], lambda n: none, [0, 1]) == {}  # one engine: vLLM's auto
    assert engine_cores(["prefill", "decode"], lambda n: none, [3]) == {}  # too few cores
    own = {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    assert (
        engine_cores(["prefill", "decode"], lambda n: own if n == "decode" else none, [0, 1]) == {}
    )


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="confining a role to some cores needs at least two",
)
def test_a_role_and_every_process_it_starts_run_only_on_its_cores(tmp_path: Path) -> None:
    """vLLM's API server starts its engine core, which starts its worker: all three must
    stay on the engine's cores, or they busy-wait on the other engine's (tiny-pd's c=4
    tok/s ranged 440-812 with only the OpenMP threads bound, 1046-1064 with the whole tree
    confined)."""
    from servebook.backends.local.processes import spawn

    mine = sorted(os.sched_getaffinity(0))
    core = mine[-1]
    child = "import time; print('ready', flush=True); time.sleep(60)"
    parent = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
        "print('child', p.pid, flush=True); time.sleep(60)"
    )
    log = tmp_path / "role.log"
    proc = spawn([sys.executable, "-c", parent], {}, log, cpus=[core])
    try:
        # The launcher's own thread may run where it could before.
        assert sorted(os.sched_getaffinity(0)) == mine
        deadline = time.monotonic() + 30
        text = ""
        # Both lines, in either order: the child may print before its parent does.
        while not ("ready" in text and re.search(r"^child \d+$", text, re.M)):
            assert time.monotonic() < deadline, text
            time.sleep(0.05)
            text = log.read_text()
        kid = int(re.findall(r"^child (\d+)$", text, re.M)[0])
        assert os.sched_getaffinity(proc.pid) == {core}
        assert os.sched_getaffinity(kid) == {core}
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_role_without_cores_may_run_anywhere_the_launcher_may(tmp_path: Path) -> None:
    from servebook.backends.local.processes import spawn

    proc = spawn([sys.executable, "-c", "import time; time.sleep(60)"], {}, tmp_path / "r.log")
    try:
        assert os.sched_getaffinity(proc.pid) == os.sched_getaffinity(0)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_failed_bind_to_any_port_is_retried_and_in_the_end_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 33, D25: `up` crashed with `OSError: Address already in use` from
    hold_port(host, 0) while retrying a role whose port had been taken."""
    real = http.hold_port
    failures = [3]

    def busy_then_real(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
        if failures[0]:
            failures[0] -= 1
            raise OSError(98, "Address already in use")  # what the kernel answered
        return real(host, port)

    monkeypatch.setattr(http, "hold_port", busy_then_real)
    s = http.hold_free_port("127.0.0.1")
    try:
        assert s.getsockname()[1] > 0 and failures == [0]
    finally:
        s.close()
    failures[0] = 10**6  # the kernel never gives one
    with pytest.raises(ServebookError, match=r"no free port .* 127\.0\.0\.1.*Address already"):
        http.hold_free_port("127.0.0.1", tries=5)


def test_a_free_port_is_none_of_those_to_avoid() -> None:
    first = http.hold_free_port("127.0.0.1")
    taken = first.getsockname()[1]
    first.close()
    others = [http.hold_free_port("127.0.0.1", avoid={taken}) for _ in range(20)]
    try:
        assert taken not in {s.getsockname()[1] for s in others}
    finally:
        for s in others:
            s.close()
