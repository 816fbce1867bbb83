"""A load agent: a process of its own that runs its share of one point with servebook's load
generator and returns every request's raw record, for a coordinator
(``bench/coordinator.py``) that started it and merges what all its agents measured.

Run as ``python -m servebook.bench.agent --connect HOST:PORT --index I`` with the
coordinator's one-time token in ``SERVEBOOK_AGENT_TOKEN``.  It needs only what the load
generator needs: numpy, and orjson and uvloop when present (each has a standard-library
fallback); a tokenizer library only when its prompts are built while the load runs
(``tests/unit/test_bench_agents.py`` pins that, and runs agents without orjson and
uvloop).  vLLM's own image has all of them.  It runs no server: it dials the coordinator.

**The conversation** (messages: a 4-byte little-endian length, then a pickle; the agent
first sends the token, so the coordinator unpickles nothing from a stranger):

1. agent -> ``("hello", index, pid, host)``;
2. coordinator -> ``("sync", t0)`` a few times, agent -> ``("sync", t0, t_agent)``: the
   coordinator keeps the round trip that took least and takes the agent's clock offset
   from it (``offset = t_agent - (t0 + t1) / 2``, within half that round trip);
3. coordinator -> ``("assign", endpoint, spec, prompts, offset_ns)``; the agent warms its
   connections, starts its prompt producer and answers ``("ready",)``;
4. coordinator -> ``("start", t)``, ``("window", t)``, ``("stop", t)`` in the
   coordinator's clock, which the agent reads in its own (``t + offset``); it answers the
   start with ``("started", late_ns)`` (how long after the instant the start reached it)
   and sends its counters every ``PROGRESS_S`` (``("progress", counters)``);
5. when its share ends, agent -> ``("result", records, stats)`` in its own clock, or
   ``("error", message)``; it then answers ``sync`` until ``("bye",)`` or the end of the
   connection.

An in-cluster coordinator whose sweep has ended answers a hello with ``("done",)``
(``bench/in_cluster.py``): the agent then ends.

The coordinator corrects the records into its clock with the offset; a duration measured
within one agent (TTFT, ITL, E2E) does not depend on it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pickle
import socket
import sys
from array import array
from typing import Any

from servebook.bench.client import Worker, install_uvloop, now_ns, pin
from servebook.bench.control import G_N, G_START, W_N, W_READY, Control
from servebook.bench.prompt_feed import start_producers

TOKEN_ENV = "SERVEBOOK_AGENT_TOKEN"
TOKEN_BYTES = 32  # the token, as sent: 32 ASCII hex digits
PROGRESS_S = 0.025
MAX_MESSAGE = 1 << 31


def frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(4, "little") + data


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from a blocking socket; ``EOFError`` when it closes first."""
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(min(n - len(buf), 1 << 20))
        if not part:
            raise EOFError("the connection closed")
        buf += part
    return bytes(buf)


def recv_message(sock: socket.socket) -> Any:
    n = int.from_bytes(recv_exactly(sock, 4), "little")
    return pickle.loads(recv_exactly(sock, n))


async def _read(reader: asyncio.StreamReader) -> Any:
    n = int.from_bytes(await reader.readexactly(4), "little")
    return pickle.loads(await reader.readexactly(n))


class _Agent:
    def __init__(self, index: int, writer: asyncio.StreamWriter) -> None:
        self.index = index
        self.writer = writer
        self.offset = 0
        self.control: Control | None = None
        self.bye = asyncio.Event()

    def send(self, obj: Any) -> None:
        self.writer.write(frame(obj))

    def on_message(self, msg: Any) -> None:
        kind, c = msg[0], self.control
        if kind == "sync":
            self.send(("sync", msg[1], now_ns()))
        elif kind == "bye":
            self.bye.set()
        elif c is None:
            return
        elif kind == "start":
            local = int(msg[1]) + self.offset
            c.arr[G_START] = local
            self.send(("started", max(0, now_ns() - local)))
        elif kind == "window":
            c.open_window(int(msg[1]) + self.offset)
        elif kind == "stop":
            c.stop(int(msg[1]) + self.offset)

    async def listen(self, reader: asyncio.StreamReader) -> None:
        """Every message until the coordinator says bye; its end of the connection stops
        the load (a coordinator that is gone decides nothing more)."""
        try:
            while not self.bye.is_set():
                self.on_message(await _read(reader))
        except (asyncio.IncompleteReadError, ConnectionError):
            if self.control is not None:
                self.control.stop(now_ns())
            self.bye.set()

    async def progress(self) -> None:
        c = self.control
        assert c is not None
        lo = G_N + W_N * self.index
        while True:
            self.send(("progress", tuple(c.arr[lo : lo + W_N])))
            await asyncio.sleep(PROGRESS_S)


async def run_agent(host: str, port: int, index: int, token: str) -> str | None:
    """One point's conversation; ``"done"`` when the coordinator answers the hello with
    ``("done",)`` (an in-cluster sweep that ended: ``bench/in_cluster.py``)."""
    reader, writer = await asyncio.open_connection(host, port)
    agent = _Agent(index, writer)
    writer.write(token.encode("ascii"))
    agent.send(("hello", index, os.getpid(), socket.gethostname()))
    while True:  # clock sync, then the assignment
        msg = await _read(reader)
        if msg[0] == "assign":
            break
        if msg[0] == "done":
            writer.close()
            return "done"
        agent.on_message(msg)
        if agent.bye.is_set():  # the point failed before it was assigned (a late agent)
            writer.close()
            return None
    _, endpoint, spec, prompts, agent.offset = msg
    pin(spec, index)
    control = Control(spec.workers, array("q", bytes(8 * (G_N + W_N * spec.workers))))
    agent.control = control
    listen = asyncio.create_task(agent.listen(reader))
    (producer,) = start_producers(prompts, spec, only=index)
    progress: asyncio.Task[None] | None = None
    try:
        worker = Worker(index, endpoint, spec, prompts, control, producer and producer.conn)
        task = asyncio.create_task(worker.run())
        while not control.get(index, W_READY) and not task.done():
            await asyncio.sleep(0.001)
        agent.send(("ready",))
        progress = asyncio.create_task(agent.progress())
        try:
            stats = await task
        except Exception as e:
            agent.send(("error", f"{type(e).__name__}: {e}"))
        else:
            lo = G_N + W_N * index
            agent.send(("progress", tuple(control.arr[lo : lo + W_N])))
            agent.send(("result", worker.records, stats))
        progress.cancel()
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(agent.bye.wait(), 60)
    finally:
        if progress is not None:
            progress.cancel()
        listen.cancel()
        if producer is not None:
            producer.stop()
        writer.close()
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m servebook.bench.agent", description=__doc__)
    p.add_argument("--connect", required=True, help="the coordinator's HOST:PORT")
    p.add_argument("--index", type=int, required=True, help="this agent's index, from 0")
    args = p.parse_args(argv)
    token = os.environ.get(TOKEN_ENV, "")
    if len(token) != TOKEN_BYTES:
        print(f"servebook agent: {TOKEN_ENV} must hold the coordinator's token", file=sys.stderr)
        return 2
    host, _, port = args.connect.rpartition(":")
    install_uvloop()
    asyncio.run(run_agent(host, int(port), args.index, token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
