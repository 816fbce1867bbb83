"""The coordinator of a point's load agents (``bench/agent.py``): it plans the point's
shares, starts every agent at one instant, polls the protocol's controller over the
agents' live counters, and merges their raw records into one ``LoadResult`` in its own
clock, from which the point's figures are computed as from one client's (exact
percentiles over the union of the records; inference-perf#797: N workers' histograms do
not give them).  ``run_load`` is where a load starts: one worker in this process
(``client.run_here``), or the agents.

**One load, or none.**  The point is the load it was asked for, or it fails
(``ClientError``, naming the agent and what it did): an agent that does not reach the
barrier within ``barrier_s``, that received the shared start more than ``late_s`` after
the instant (a late agent would make a smaller load at the start), or that ends without
its records (killed, crashed, its connection lost).  No merge of the agents that did
finish is offered as the point.

**Clocks.**  Each agent's clock offset is measured at the handshake (``agent`` module) and
again after its records came, and its records are corrected by the mean of the two when
it exceeds their uncertainty (half the best round trip); both, the uncertainty and the
drift between them are recorded per agent (``AgentInfo``).  On one machine
CLOCK_MONOTONIC is shared and the offset measures ~0; an agent in another clock domain
(another host, a time namespace) gets its records placed on the coordinator's clock, the
clock the window's edges and the server's scrapes are on.

**Launchers.**  ``LocalLauncher`` starts each agent as ``python -m servebook.bench.agent``
on this machine (with this interpreter and this ``sys.path``); another launcher (a
Kubernetes Job) implements ``Launcher``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np

from servebook.bench.agent import (
    TOKEN_BYTES,
    TOKEN_ENV,
    frame,
    recv_exactly,
    recv_message,
)
from servebook.bench.client import Hooks, load_result, now_ns, run_here
from servebook.bench.control import (
    G_N,
    G_START,
    W_N,
    ClientError,
    Control,
    Controller,
    LoadSpec,
    Progress,
    WindowHook,
    children_ignore_sigint,
)
from servebook.bench.endpoint import Endpoint
from servebook.bench.records import AgentInfo, LoadResult, RequestRecord, WorkerStats
from servebook.bench.workload import PromptSource

SYNC_ROUNDS = 8
START_MARGIN_S = 0.2  # the shared instant, this long after every agent is ready
LATE_S = 0.05  # an agent that hears of the start later than this after it is late
STARTED_WITHIN_S = 5.0  # ...and one that has not said it started by then, too


class AgentProcess(Protocol):
    """A started agent, as its launcher knows it.  ``wait_s``: how long to wait for it to
    end after the point before it is stopped (0 for one this machine does not run)."""

    wait_s: float

    def poll(self) -> int | None: ...  # its exit code, None while it runs

    def stop(self) -> None: ...  # end it (it is no longer needed or it failed)

    def describe_end(self) -> str: ...  # how it ended, with the tail of its output


class Launcher(Protocol):
    """Starts agent ``index`` so that it dials ``address`` with ``token``.  The coordinator
    listens on ``bind_address()`` (port 0: any free one) and hands its agents ``token()``
    (fresh for each point on this machine; the Secret's in a Job, whose agents already run)."""

    where: str  # where its agents run, as the results record it

    def bind_host(self) -> str: ...

    def bind_address(self) -> tuple[str, int]: ...

    def token(self) -> str: ...

    def __call__(self, index: int, address: tuple[str, int], token: str) -> AgentProcess: ...


def agent_command(index: int, address: tuple[str, int]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "servebook.bench.agent",
        "--connect",
        f"{address[0]}:{address[1]}",
        "--index",
        str(index),
    ]


class LocalProcess:
    wait_s = 10.0

    def __init__(self, popen: subprocess.Popen[bytes], log: Any) -> None:
        self.popen = popen
        self.log = log
        self.pid = popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self.log.close()

    def describe_end(self) -> str:
        code = self.popen.poll()
        how = "still running" if code is None else f"exit code {code}"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                how = f"killed by {signal.Signals(-code).name}"
        tail = ""
        with contextlib.suppress(OSError, ValueError):
            self.log.seek(0)
            lines = self.log.read().decode("utf-8", "replace").strip().splitlines()
            if lines:
                tail = "; its last output: " + " | ".join(lines[-5:])
        return f"pid {self.pid}, {how}{tail}"


@dataclass
class LocalLauncher:
    """Agents as processes on this machine.  ``wrap(index)`` may prefix an agent's command
    (e.g. to start it in another clock domain); the environment carries this process's
    ``sys.path`` so an agent imports what this process does (as a spawned worker did)."""

    wrap: Any = None
    where: str = "this machine"

    def bind_host(self) -> str:
        return "127.0.0.1"

    def bind_address(self) -> tuple[str, int]:
        return ("127.0.0.1", 0)

    def token(self) -> str:
        return secrets.token_hex(TOKEN_BYTES // 2)

    def __call__(self, index: int, address: tuple[str, int], token: str) -> AgentProcess:
        argv = agent_command(index, address)
        if self.wrap is not None:
            argv = [*self.wrap(index), *argv]
        env = dict(os.environ)
        env[TOKEN_ENV] = token
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        log = tempfile.TemporaryFile()  # noqa: SIM115  (closed by LocalProcess.stop)
        with children_ignore_sigint():  # a Ctrl-C is the coordinator's to handle
            popen = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        return LocalProcess(popen, log)


@dataclass
class _Link:
    """One agent's connection, read by a thread of its own."""

    index: int
    sock: socket.socket
    pid: int
    host: str
    process: AgentProcess | None = None
    offset_ns: int = 0
    uncertainty_ns: int = 0
    syncs: queue.Queue[tuple[int, int, int]] = field(default_factory=queue.Queue)
    ready: bool = False
    late_ns: int | None = None
    result: tuple[list[RequestRecord], WorkerStats] | None = None
    error: str | None = None
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, obj: Any) -> None:
        data = frame(obj)
        with self.lock:
            self.sock.sendall(data)

    def read(self, control: Control) -> None:
        lo = G_N + W_N * self.index
        try:
            while True:
                msg = recv_message(self.sock)
                kind = msg[0]
                if kind == "progress":
                    control.arr[lo : lo + W_N] = array("q", msg[1])
                elif kind == "sync":
                    self.syncs.put((int(msg[1]), int(msg[2]), now_ns()))
                elif kind == "ready":
                    self.ready = True
                elif kind == "started":
                    self.late_ns = int(msg[1])
                elif kind == "result":
                    self.result = (msg[1], msg[2])
                elif kind == "error":
                    self.error = str(msg[1])
        except (EOFError, OSError):
            pass
        finally:
            self.closed = True

    def sync(self, rounds: int = SYNC_ROUNDS) -> tuple[int, int]:
        """(offset, uncertainty) from the round trip that took least."""
        best: tuple[int, int] | None = None
        for _ in range(rounds):
            self.send(("sync", now_ns()))
            try:
                t0, ta, t1 = self.syncs.get(timeout=10)
            except queue.Empty:
                raise ClientError(
                    f"bench agent {self.index} did not answer the clock sync within 10 s"
                ) from None
            half = (t1 - t0) // 2
            if best is None or half < best[1]:
                best = (ta - (t0 + t1) // 2, half)
        assert best is not None
        return best


def _accept(server: socket.socket, token: str, deadline: float) -> tuple[socket.socket, Any] | None:
    """One agent's connection with its hello, or None when nothing came this turn."""
    server.settimeout(0.1)
    try:
        conn, _ = server.accept()
    except TimeoutError:
        return None
    conn.settimeout(max(1.0, min(10.0, deadline - time.monotonic())))
    try:
        if recv_exactly(conn, TOKEN_BYTES) != token.encode("ascii"):
            conn.close()  # not one of ours: nothing it sent is read
            return None
        hello = recv_message(conn)
    except (OSError, EOFError):
        conn.close()
        return None
    conn.settimeout(None)
    return conn, hello


def _failed(links: Sequence[_Link], procs: Sequence[AgentProcess]) -> None:
    """Raise for the first agent that failed: an error it reported, or an end without
    its records."""
    for link in links:
        if link.error is not None:
            raise ClientError(f"bench agent {link.index} failed: {link.error}")
    for link in links:
        if link.closed and link.result is None:
            p = procs[link.index]
            with contextlib.suppress(subprocess.TimeoutExpired):
                if isinstance(p, LocalProcess):
                    p.popen.wait(2)
            raise ClientError(
                f"bench agent {link.index} ended before it sent its records "
                f"({p.describe_end()}); the point is not the load it was asked for without "
                "its share, so it is not measured"
            )


def _barrier(
    server: socket.socket,
    token: str,
    spec: LoadSpec,
    procs: Sequence[AgentProcess],
    control: Control,
    barrier_s: float,
    links: dict[int, _Link],
) -> list[_Link]:
    """Every agent's link, in order, once all have said hello; ``links`` holds those that
    have, so a barrier that fails can still tell them to go."""
    deadline = time.monotonic() + barrier_s
    while len(links) < spec.workers:
        for i, p in enumerate(procs):
            if i not in links and p.poll() is not None:
                raise ClientError(f"bench agent {i} ended before it connected ({p.describe_end()})")
        if time.monotonic() > deadline:
            missing = sorted(set(range(spec.workers)) - set(links))
            raise ClientError(
                f"bench agent(s) {', '.join(map(str, missing))} did not reach the barrier "
                f"within {barrier_s:g} s: a late agent is a failure, not a smaller load"
            )
        got = _accept(server, token, deadline)
        if got is None:
            continue
        conn, hello = got
        i = int(hello[1])
        if hello[0] != "hello" or not 0 <= i < spec.workers or i in links:
            conn.close()
            continue
        link = _Link(i, conn, int(hello[2]), str(hello[3]), procs[i])
        links[i] = link
        threading.Thread(
            target=link.read, args=(control,), name=f"servebook-agent-{i}", daemon=True
        ).start()
    return [links[i] for i in range(spec.workers)]


def run_load(
    endpoint: Endpoint,
    spec: LoadSpec,
    prompts: PromptSource,
    controller: Controller | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    poll_s: float = 0.05,
    on_window: WindowHook | None = None,
    launcher: Launcher | None = None,
) -> LoadResult:
    """Run the load to its end and return every request's record.

    ``controller`` is polled every ``poll_s``; ``on_window("open")`` runs right after it
    opens the window and ``on_window("close")`` right before its stop takes effect (the
    window's end is the poll at which it decided), so a caller can read server counters at
    both edges.  ``on_progress`` sees every poll (for a progress display).

    One worker runs in this process under uvloop (``client.run_here``; the caller must not
    be inside a running event loop).  More run as load agents (``run_agents``), started
    together at one instant; the controller is polled here.  ``launcher`` starts the agents
    (default: processes on this machine)."""
    hooks = Hooks(controller, on_progress, poll_s, on_window)
    if spec.workers == 1:
        return run_here(endpoint, spec, prompts, hooks)
    return run_agents(endpoint, spec, prompts, hooks, launcher)


def run_agents(
    endpoint: Endpoint,
    spec: LoadSpec,
    prompts: PromptSource,
    hooks: Hooks,
    launcher: Launcher | None = None,
    *,
    barrier_s: float = 120.0,
    start_margin_s: float = START_MARGIN_S,
    late_s: float = LATE_S,
) -> LoadResult:
    """``spec.workers`` agents make the load; the controller is polled here (module
    docstring)."""
    launch = launcher or LocalLauncher()
    token = launch.token()
    control = Control(spec.workers, array("q", bytes(8 * (G_N + W_N * spec.workers))))
    server = socket.create_server(launch.bind_address(), backlog=max(16, spec.workers))
    address = (launch.bind_host(), server.getsockname()[1])
    procs: list[AgentProcess] = []
    linked: dict[int, _Link] = {}
    try:
        procs = [launch(i, address, token) for i in range(spec.workers)]
        links = _barrier(server, token, spec, procs, control, barrier_s, linked)
        for link in links:
            link.offset_ns, link.uncertainty_ns = link.sync()
            link.send(("assign", endpoint, spec, prompts, link.offset_ns))
        deadline = time.monotonic() + barrier_s
        while not all(link.ready for link in links):
            _failed(links, procs)
            if time.monotonic() > deadline:
                late = [str(lk.index) for lk in links if not lk.ready]
                raise ClientError(
                    f"bench agent(s) {', '.join(late)} were not ready within {barrier_s:g} s: "
                    "a late agent is a failure, not a smaller load"
                )
            time.sleep(0.005)
        start = now_ns() + int(start_margin_s * 1e9)
        control.arr[G_START] = start
        for link in links:
            link.send(("start", start))
        _coordinate(links, procs, control, spec, hooks, start, late_s)
        end = now_ns()
        infos = []
        for link in links:
            again, unc = link.sync(4)
            infos.append(_info(link, again, unc, launch.where))
    finally:
        stop = now_ns()
        for link in linked.values():
            with contextlib.suppress(OSError):
                link.send(("stop", stop))
                link.send(("bye",))
        server.close()
        for i, p in enumerate(procs):
            # An agent told to go is given time to; one that never said hello has nothing
            # to finish (the barrier it missed waited 8 s, then 10 s for each agent).
            _wait_or_stop(p, p.wait_s if i in linked else 0.0)
        for link in linked.values():
            link.sock.close()
    records: list[RequestRecord] = []
    stats: list[WorkerStats] = []
    for link, info in zip(links, infos, strict=True):
        assert link.result is not None
        recs, st = link.result
        shift = -info.correction_ns
        records += [shift_record(r, shift) for r in recs]
        stats.append(shift_stats(st, shift))
    records.sort(key=lambda r: r.index)
    res = load_result(endpoint, spec, records, stats, (start, end), control)
    res.agents = infos
    return res


def _wait_or_stop(p: AgentProcess, wait_s: float = 10.0) -> None:
    t = time.monotonic() + wait_s
    while p.poll() is None and time.monotonic() < t:
        time.sleep(0.01)
    p.stop()


def _coordinate(
    links: Sequence[_Link],
    procs: Sequence[AgentProcess],
    control: Control,
    spec: LoadSpec,
    hooks: Hooks,
    start: int,
    late_s: float,
) -> None:
    """Poll the controller over the agents' counters until every agent sent its records."""

    def broadcast(kind: str, t: int) -> None:
        for link in links:
            if not link.closed:
                with contextlib.suppress(OSError):
                    link.send((kind, t))

    told = False  # the agents know the window opened
    while not all(link.result is not None for link in links):
        time.sleep(hooks.poll_s)
        _failed(links, procs)
        now = now_ns()
        for link in links:
            if link.late_ns is not None and link.late_ns > late_s * 1e9:
                raise ClientError(
                    f"bench agent {link.index} heard of the shared start "
                    f"{link.late_ns / 1e6:.1f} ms after it (more than {late_s * 1e3:g} ms): "
                    "a late agent is a failure, not a smaller load"
                )
            if link.late_ns is None and now - start > STARTED_WITHIN_S * 1e9:
                raise ClientError(
                    f"bench agent {link.index} did not say it started within "
                    f"{STARTED_WITHIN_S:g} s of the shared start: a late agent is a failure, "
                    "not a smaller load"
                )
        edges, stop = hooks.poll(control, spec)
        if control.window_start_ns and not told:
            broadcast("window", control.window_start_ns)
            told = True
        for edge in edges:
            cast(WindowHook, hooks.on_window)(edge)
        if stop is not None:
            control.stop(stop)
            broadcast("stop", stop)


def _info(link: _Link, again_ns: int, again_unc_ns: int, where: str) -> AgentInfo:
    """The agent's record; its correction is the mean offset, or 0 when that is within
    the measurement's uncertainty (a shared clock measures a few us either way)."""
    unc = max(link.uncertainty_ns, again_unc_ns)
    mean = (link.offset_ns + again_ns) // 2
    return AgentInfo(
        index=link.index,
        pid=link.pid,
        host=link.host,
        where=where,
        offset_ns=link.offset_ns,
        offset_after_ns=again_ns,
        uncertainty_ns=unc,
        correction_ns=mean if abs(mean) > unc else 0,
        start_late_ns=link.late_ns or 0,
    )


def _shift(a: array, by: int) -> array:
    if not a or not by:
        return a
    return array("q", (np.frombuffer(a, dtype=np.int64) + by).tobytes())


def shift_record(r: RequestRecord, by: int) -> RequestRecord:
    """``r`` with every instant moved ``by`` ns (an agent's clock onto the coordinator's)."""
    if by:
        r.scheduled_ns += by
        if r.sent_ns:
            r.sent_ns += by
        if r.end_ns:
            r.end_ns += by
        r.chunk_ns = _shift(r.chunk_ns, by)
    return r


def shift_stats(s: WorkerStats, by: int) -> WorkerStats:
    if by:
        s.tick_ns = _shift(s.tick_ns, by)
    return s
