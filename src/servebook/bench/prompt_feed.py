"""Prompts during a load, never built in the sending loop.

A source that builds its prompts (``workload.BuildsPrompts``) is read, never asked to
build, while the load runs: a prompt is either built before the load (``pregenerate``) or
built ahead of need by a *producer* process of the worker's own, which writes batches into
a pipe that the event loop reads without blocking (``PromptFeed``).  A slot whose prompt
is not there yet waits for it (counted, and it lowers the achieved concurrency); a source
that cannot build during the load (a server's ``/tokenize``) ends a slot when its prompts
run out (``ran_out``).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import pickle
import time
from dataclasses import dataclass
from typing import Any, cast

from servebook.bench.control import ClientError, LoadSpec, children_ignore_sigint
from servebook.bench.workload import BuildsPrompts, Prompt, PromptSource

#: Prompts per batch a producer writes; and how many a worker keeps ready before it stops
#: reading the pipe (the producer then blocks on the full pipe: memory stays bounded).
PRODUCER_BATCH = 128
READY_HIGH = 1024
#: The producer counts one prompt in this many (``workload.RandomPrompts.build_many``):
#: one per batch.  The word table prompts are sampled from was checked whole when it was
#: made; counting a 1024-token text costs ~1 ms, forty times the sampling: one count in 16
#: made the producer's CPU per prompt 81 us, one in 64 43 us, one in 128 ~35 us.
PRODUCER_CHECK_EVERY = 128
#: How long a worker waits for its producer's first batch before the load starts.  A
#: producer is a fresh interpreter (spawn) that imports numpy and the tokenizer: 0.5 s on a
#: quiet 2-core machine, several seconds while both cores serve a load.  Started late, it
#: let the point's pre-built prompts run out (the main job's first c=1 point in CI: one
#: request waited, achieved concurrency 93%, SB404), so the load waits for it instead.
PRODUCER_START_S = 120.0


def _produce(
    source: BuildsPrompts, first: int, step: int, conn: Any, avoid: tuple[int, ...] | None
) -> None:
    """Body of a producer process: build prompts ``first, first + step, ...`` in batches
    and write each batch to the pipe as a length-prefixed pickle of ``("batch", cpu_s,
    [(index, prompt)])`` (``cpu_s``: the CPU time this process has used so far, which the
    point records: the producer's work is the client's too), until the reader goes; a
    failure is written as ``("error", message)``.  It runs off
    the cores the workers are pinned to when there are others; at the same priority as the
    load it feeds (at a lower one, on a busy machine, it fell behind and requests waited
    for prompts), and it takes no more than the load consumes: it blocks on a full pipe."""
    if avoid and hasattr(os, "sched_setaffinity"):
        others = set(range(os.cpu_count() or 1)) - set(avoid)
        if others:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, others)
    fd = conn.fileno()

    def write(obj: Any) -> None:
        data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        view = memoryview(len(data).to_bytes(4, "little") + data)
        while view:
            view = view[os.write(fd, view) :]

    i = first
    try:
        while True:
            idx = [i + k * step for k in range(PRODUCER_BATCH)]
            try:
                built = source.build_many(idx, check_every=PRODUCER_CHECK_EVERY)
                batch: Any = ("batch", time.process_time(), list(zip(idx, built, strict=True)))
            except Exception as e:
                write(("error", f"{type(e).__name__}: {e}"))
                return
            write(batch)
            i += PRODUCER_BATCH * step
    except (BrokenPipeError, KeyboardInterrupt):
        return


@dataclass
class Producer:
    process: Any
    conn: Any  # the read end, for the worker

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()
        self.process.terminate()
        self.process.join(timeout=5)
        if self.process.is_alive():  # pragma: no cover - a producer that ignored SIGTERM
            self.process.kill()
            self.process.join(timeout=5)


def _first_unbuilt(prompts: PromptSource, spec: LoadSpec, worker: int) -> int | None:
    """This worker's first request index that was not built before the load; ``None`` when
    nothing is left to build (the source looks its prompts up, or every request of a
    bounded load is built)."""
    if not isinstance(prompts, BuildsPrompts):
        return None
    i = spec.index_offset + worker
    end = spec.index_offset + spec.num_requests if spec.num_requests is not None else None
    while prompts.cached(i) is not None:
        i += spec.workers
    if end is not None and i >= end:
        return None
    return i


def start_producers(
    prompts: PromptSource, spec: LoadSpec, only: int | None = None
) -> list[Producer | None]:
    """One producer process per worker whose prompts will run out, when the source can
    build during the load (``workload.BuildsPrompts.producible``); ``only``: for that
    worker alone (a load agent starts its own)."""
    out: list[Producer | None] = []
    for w in range(spec.workers) if only is None else (only,):
        first = _first_unbuilt(prompts, spec, w)
        if first is None or not isinstance(prompts, BuildsPrompts) or not prompts.producible:
            out.append(None)
            continue
        ctx = mp.get_context("spawn")
        read_end, write_end = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_produce,
            args=(prompts.detached(), first, spec.workers, write_end, spec.cpus),
            name=f"servebook-bench-prompts-{w}",
            daemon=True,
        )
        with children_ignore_sigint():
            p.start()
        write_end.close()
        out.append(Producer(p, read_end))
    return out


class PromptFeed:
    """One worker's prompts during the load, without building any: looked up (a dataset),
    built before the load (the source's cache), or read from the producer's pipe.  The pipe
    is read with non-blocking reads from the event loop, so a slow producer never holds
    the loop: a request whose prompt is not there yet waits for it instead."""

    def __init__(self, prompts: PromptSource, conn: Any = None) -> None:
        self.prompts = prompts
        self.builds = isinstance(prompts, BuildsPrompts)
        self.conn = conn
        self.ready: dict[int, Prompt] = {}
        self.waiters: dict[int, asyncio.Future[Prompt | None]] = {}
        self.buf = bytearray()
        self.reading = False
        self.closed = conn is None
        self.waits = 0
        self.ran_out = False
        self.error: str | None = None  # the producer failed: the load cannot go on
        self.producer_cpu_s = 0.0  # the producer's CPU time, as of its last batch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._first: asyncio.Future[None] | None = None  # done at the first batch or close

    def start(self) -> None:
        if self.conn is None:
            return
        self._loop = asyncio.get_running_loop()
        self._first = self._loop.create_future()
        os.set_blocking(self.conn.fileno(), False)
        self._resume()

    async def primed(self) -> None:
        """Wait until the producer has delivered its first batch (or is gone), so that a
        producer slow to start never lets the prompts built before the load run out while
        the load runs.  One that delivers nothing in ``PRODUCER_START_S`` is a failure."""
        if self._first is None:
            return
        try:
            await asyncio.wait_for(self._first, PRODUCER_START_S)
        except TimeoutError:
            raise ClientError(
                f"the prompt producer built no prompt in {PRODUCER_START_S:g} s; the load "
                "did not start (is the machine out of memory or CPU?)"
            ) from None
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise ClientError(f"building prompts failed: {self.error}")

    def _primed(self) -> None:
        if self._first is not None and not self._first.done():
            self._first.set_result(None)

    def stop(self) -> None:
        if self.reading and self._loop is not None:
            self._loop.remove_reader(self.conn.fileno())
            self.reading = False
        self._close()

    def _resume(self) -> None:
        if not self.reading and not self.closed and self._loop is not None:
            self._loop.add_reader(self.conn.fileno(), self._on_readable)
            self.reading = True

    def _close(self) -> None:
        self._primed()
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.conn.close()
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_result(None)
        self.waiters.clear()

    def _on_readable(self) -> None:
        try:
            data = os.read(self.conn.fileno(), 1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the producer is gone
            self.stop()
            return
        buf = self.buf
        buf += data
        pos = 0
        while len(buf) - pos >= 4:
            n = int.from_bytes(buf[pos : pos + 4], "little")
            if len(buf) - pos - 4 < n:
                break
            batch = pickle.loads(buf[pos + 4 : pos + 4 + n])
            pos += 4 + n
            if batch[0] != "batch":  # ("error", message)
                self.error = str(batch[1])
                self.stop()
                return
            _, self.producer_cpu_s, items = batch
            for i, p in items:
                fut = self.waiters.pop(i, None)
                if fut is not None and not fut.done():
                    fut.set_result(p)
                else:
                    self.ready[i] = p
        if pos:
            del buf[:pos]
            self._primed()
        if len(self.ready) >= READY_HIGH and self.reading and self._loop is not None:
            self._loop.remove_reader(self.conn.fileno())
            self.reading = False

    async def get(self, index: int) -> Prompt | None:
        """Prompt ``index``; ``None`` when none is left for it (the slot ends)."""
        prompts = self.prompts
        if not self.builds:
            return prompts.get(index)
        p = cast(BuildsPrompts, prompts).cached(index)
        if p is not None:
            return p
        p = self.ready.pop(index, None)
        if p is None:
            self._raise_if_failed()
            if self.closed:
                self.ran_out = True
                return None
            fut: asyncio.Future[Prompt | None] = asyncio.get_running_loop().create_future()
            self.waiters[index] = fut
            self.waits += 1
            self._resume()
            p = await fut
            if p is None:
                self._raise_if_failed()
                self.ran_out = True
                return None
        if len(self.ready) < READY_HIGH // 2:
            self._resume()
        return p
