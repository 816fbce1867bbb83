"""The load generator: sends streaming OpenAI requests and times every chunk.

This module sends and times; it does not decide when a measurement window opens or closes
(``protocol.py`` does, through a ``Controller``) and it does not compute figures
(``bench/figures.py`` and ``results/`` do).

**Clock.**  Every timestamp is ``time.monotonic_ns()`` (CLOCK_MONOTONIC on Linux, the same
clock ``perf_counter_ns`` reads there), which is system-wide, so timestamps from worker
processes and from a reference server on the same host are comparable.  Body bytes are
stamped inside the connection's ``data_received``, as the event loop reads them
(``http1.py``: servebook's own HTTP/1.1 for the load, and why); every SSE event of one
read shares its timestamp (they arrived together).

**Latency origin.**  Open loop (``rate``): arrivals follow a seeded Poisson process and
TTFT and E2E are measured from a request's *scheduled* time, so a request that went out
late is charged its lateness (field notes: a late client must not hide server latency).
Closed loop: there is no schedule, and latency is measured from when the request's bytes
were written to the socket (``http1.Connection.start``); the client's own delay
between a slot coming free and its request going out is *send lag*, recorded per request
and reported, instead of being added to the server's latency; what it costs the load shows
in the achieved concurrency (time-weighted requests in flight), which SB404 judges.  The
event loop's own lag is sampled too, and reported.

**Errors are records.**  A non-200 status, an ``{"error": ...}`` event, a stream that
closes before ``data: [DONE]``, a stream with no tokens, a timeout or a connection error:
each gives a ``RequestRecord`` with ``error`` set; nothing is dropped.

**The rest of the load generator.**  ``http1.py`` (the connections), ``endpoint.py`` (the
server asked), ``openai_stream.py`` (the request and how its stream folds into its record),
``sse.py``, ``records.py`` (what is recorded, and the token and ITL rules), ``control.py``
(the load's spec, and the counters the controller and the workers share),
``prompt_feed.py`` (prompts ready before they are needed).

**Load agents.**  One process runs one event loop (uvloop when importable); with
``workers > 1`` the load is made by that many *load agents* (``bench/agent.py``), each a
process of its own with its share of the load (``control.LoadSpec.share``), which a
coordinator (``bench/coordinator.py``) starts together at one instant and whose raw
records it merges.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import numpy as np

from servebook import auth, stopping
from servebook.bench import http1
from servebook.bench.control import (
    G_N,
    G_START,
    W_AUTH,
    W_DONE,
    W_ERR,
    W_N,
    W_OK,
    W_READY,
    W_SENT,
    W_TOKENS,
    W_WIN_ERR,
    W_WIN_OK,
    ClientError,
    Control,
    Controller,
    LoadSpec,
    Progress,
    WindowEdge,
    WindowHook,
    decide,
    next_gap_ns,
)
from servebook.bench.endpoint import Endpoint
from servebook.bench.openai_stream import (
    StreamSink,
    dumps,
    finish_record,
    fold_chunks,
    reply_text,
    request_body,
)
from servebook.bench.prompt_feed import PromptFeed, start_producers
from servebook.bench.records import LoadResult, RequestRecord, WorkerStats
from servebook.bench.sessions import Message, Sessions, turn_index
from servebook.bench.workload import Prompt, PromptSource

now_ns = time.monotonic_ns


_LAG_TICK_NS = 10_000_000
#: Requests a closed loop starts per event-loop turn at most (``Worker._admitter``).
ADMIT_PER_TURN = 4


def _request_head(endpoint: Endpoint) -> tuple[bytes, bytes]:
    """The bytes every request of this endpoint starts with (request line and fixed
    headers; each request adds its length, its id and its body), and the id prefix."""
    u = urlsplit(endpoint.url)
    target = (u.path or "/") + (f"?{u.query}" if u.query else "")
    lines = [
        f"POST {target} HTTP/1.1",
        f"Host: {http1.origin(endpoint.url).host_header}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
    ]
    if endpoint.api_key:
        lines.append(f"Authorization: Bearer {endpoint.api_key}")
    head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
    return head, endpoint.request_id_prefix.encode("latin-1")


def _time_out(conn: http1.Connection, after_s: float) -> None:
    conn.fail(f"timed out after {after_s:g} s")


@dataclass(frozen=True)
class Turn:
    """A conversation's request (``bench/sessions.py``): the messages before its prompt,
    its number from 0, and how long its slot waited between the reply before it and its
    start (``--turn-delay``, as the event loop kept it)."""

    history: list[Message]
    number: int
    delay_ns: int


class Worker:
    def __init__(
        self,
        worker: int,
        endpoint: Endpoint,
        spec: LoadSpec,
        prompts: PromptSource,
        control: Control,
        prompt_conn: Any = None,
    ) -> None:
        self.worker = worker
        self.endpoint = endpoint
        self.spec = spec
        self.prompts = prompts
        self.feed = PromptFeed(prompts, prompt_conn)
        self.control = control
        self.records: list[RequestRecord] = []
        self.lag = array("q")
        self.ticks = array("q")
        self.tick_cpu = array("q")
        self.chat = endpoint.api == "chat"
        self._next = spec.index_offset + worker
        self._end = spec.index_offset + spec.num_requests if spec.num_requests is not None else None
        self._head, self._id_prefix = _request_head(endpoint)
        self.sessions = prompts if isinstance(prompts, Sessions) else None
        self._conversations = 0  # this worker's conversations taken so far

    def _take(self) -> int | None:
        """The next request's index; None when this worker sends no more: its share is
        sent, its prompts ran out, or the server refused the API key (the load ends with
        the key error: no request after a refusal is sent, not even until the
        controller's next poll)."""
        i = self._next
        if (
            (self._end is not None and i >= self._end)
            or self.feed.ran_out
            or self.control.get(self.worker, W_AUTH)
        ):
            return None
        self._next += self.spec.workers
        return i

    def _take_conversation(self) -> int | None:
        """The number ``j`` of this worker's next conversation (its turns' indices:
        ``sessions.turn_index``); None as ``_take``."""
        assert self.sessions is not None
        j = self._conversations
        s, spec = self.sessions, self.spec
        first = turn_index(spec.index_offset, self.worker, spec.workers, s.stride, j, 0)
        if (
            (self._end is not None and first >= self._end)
            or self.feed.ran_out
            or self.control.get(self.worker, W_AUTH)
        ):
            return None
        self._conversations += 1
        return j

    async def _converse(
        self,
        pool: http1.Pool,
        j: int,
        scheduled_ns: int,
        admit: asyncio.Queue[asyncio.Future[None]] | None = None,
    ) -> bool:
        """Send this worker's ``j``-th conversation turn by turn, each turn with the
        messages so far and the replies the server gave; False when a turn had no prompt
        (the slot ends), True otherwise (a failed turn ends only its conversation)."""
        s, spec, w = self.sessions, self.spec, self.worker
        assert s is not None
        g = spec.index_offset + w + j * spec.workers  # the conversation, for a dataset
        history = s.opening(g)
        waited, replied_ns = 0, 0
        for t in range(s.turns_of(g)):
            i = turn_index(spec.index_offset, w, spec.workers, s.stride, j, t)
            if self._end is not None and i >= self._end:
                return True
            if t > 0:
                if s.turn_delay_s:
                    await asyncio.sleep(s.turn_delay_s)
                scheduled_ns = now_ns()
                waited = scheduled_ns - replied_ns
                if admit is not None:
                    await self._admitted(admit)
            if self.control.stopped:
                return True
            prompt = s.turn(g, t) or await self.feed.get(i)
            if prompt is None:
                return False
            rec = await self._send(pool, i, scheduled_ns, prompt, Turn(history, t, waited))
            if rec is None or not rec.ok:
                return rec is not None
            replied_ns = rec.end_ns
            reply = reply_text(rec.body or (), self.chat)
            rec.body = None
            history = [
                *history,
                {"role": "user", "content": prompt.text},
                {"role": "assistant", "content": reply},
            ]
        return True

    async def _send(
        self,
        pool: http1.Pool,
        index: int,
        scheduled_ns: int,
        prompt: Prompt | None = None,
        turn: Turn | None = None,
    ) -> RequestRecord | None:
        """Send request ``index`` (its prompt from the feed unless given) and read its
        stream; None when there was no prompt for it (the prompts built before the load
        ran out), so nothing was sent."""
        ep, c, w = self.endpoint, self.control, self.worker
        if prompt is None:
            prompt = await self.feed.get(index)
            if prompt is None:
                return None
        # A later turn's length depends on the replies before it: not stated, not checked.
        stated = turn is None or (turn.number == 0 and not turn.history)
        rec = RequestRecord(
            index,
            w,
            scheduled_ns,
            latency_from="sent" if self.spec.concurrency is not None else "scheduled",
            expected_output_tokens=prompt.output_len,
            expected_prompt_tokens=prompt.prompt_tokens if stated else None,
        )
        if turn is not None:
            rec.turn, rec.turn_delay_ns, rec.body = turn.number, turn.delay_ns, []
        self.records.append(rec)
        sent: str | list[int] = prompt.token_ids if prompt.token_ids is not None else prompt.text
        history = turn.history if turn is not None else ()
        body = dumps(request_body(ep, sent, prompt.output_len, history, index))
        request = b"".join(
            (
                self._head,
                b"Content-Length: %d\r\nX-Request-Id: %s%d\r\n\r\n"
                % (len(body), self._id_prefix, index),
                body,
            )
        )
        sink = StreamSink(rec, self.chat)
        c.add(w, W_SENT)
        rec.sent_ns = now_ns()  # replaced by the send's own stamp once connected
        conn: http1.Connection | None = None
        timer: asyncio.TimerHandle | None = None
        try:
            conn = await pool.get()
            exchange = http1.Exchange(sink, sink.take)
            timer = asyncio.get_running_loop().call_later(
                ep.request_timeout_s, _time_out, conn, ep.request_timeout_s
            )
            rec.sent_ns = conn.start(request, exchange)
            await exchange.done
            pool.flush()
            rec.status = exchange.status
            if exchange.status != 200:
                text = bytes(exchange.error_body).decode("utf-8", "replace")
                rec.error = f"HTTP {exchange.status}: {text.strip()[:500]}"
                rec.end_ns = now_ns()
                if auth.is_rejection(exchange.status):
                    c.add(w, W_AUTH)
            else:
                finish_record(rec, now_ns(), ep.model)
        except asyncio.CancelledError:
            if conn is not None:
                conn.close()
            rec.cancelled = True
            rec.end_ns = now_ns()
            raise
        except http1.ExchangeFailed as e:
            pool.flush()
            rec.error = str(e)[:500]
            rec.end_ns = now_ns()
        finally:
            if timer is not None:
                timer.cancel()
        if rec.error is not None:
            c.add(w, W_ERR)
        else:
            c.add(w, W_OK)
            c.add(w, W_TOKENS, rec.output_tokens)
        ws = c.window_start_ns
        if ws and rec.start_ns >= ws:
            c.add(w, W_WIN_ERR if rec.error is not None else W_WIN_OK)
        return rec

    async def _admitted(self, admit: asyncio.Queue[asyncio.Future[None]]) -> None:
        """Wait for the admitter's go (``_admitter``)."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        admit.put_nowait(turn)
        await turn

    async def _closed_slot(
        self, pool: http1.Pool, admit: asyncio.Queue[asyncio.Future[None]]
    ) -> None:
        while not self.control.stopped:
            i = self._take() if self.sessions is None else self._take_conversation()
            if i is None:
                return
            scheduled = now_ns()
            await self._admitted(admit)
            if self.sessions is not None:
                if not await self._converse(pool, i, scheduled, admit):
                    return
            elif await self._send(pool, i, scheduled) is None:
                return

    async def _admitter(self, admit: asyncio.Queue[asyncio.Future[None]]) -> None:
        """Let at most ``ADMIT_PER_TURN`` requests start per event-loop turn.  When
        hundreds of streams end together (a closed loop against a server whose requests
        all take the same time), starting all their successors in one turn held the loop
        for ~75 ms at 512 streams (with aiohttp), and every token that arrived meanwhile
        was stamped that late.  Spread over turns, the loop reads sockets between starts;
        the wait is recorded as send lag.  With aiohttp a start cost ~150 us, and one per
        turn was best (benchmarks/client_capacity.py at 512 streams, ITL 20 ms: the p99
        delay from the server's token write to the client's stamp was 1.5 ms with eight
        per turn, 0.7 ms with two and 0.3 ms with one).  A start now costs a few times
        less, and one per turn capped a fast server's closed loop at one start per loop
        turn: slots waited their turn and the achieved concurrency fell below the level."""
        while True:
            turn = await admit.get()
            if not turn.done():
                turn.set_result(None)
            for _ in range(min(ADMIT_PER_TURN - 1, admit.qsize())):
                turn = admit.get_nowait()
                if not turn.done():
                    turn.set_result(None)
            await asyncio.sleep(0)

    async def _closed_loop(self, pool: http1.Pool, slots: int) -> None:
        admit: asyncio.Queue[asyncio.Future[None]] = asyncio.Queue()
        admitter = asyncio.create_task(self._admitter(admit))
        try:
            await asyncio.gather(*(self._closed_slot(pool, admit) for _ in range(slots)))
        finally:
            admitter.cancel()

    async def _open_loop(self, pool: http1.Pool, rate: float, cap: int | None) -> None:
        rng = np.random.default_rng([self.spec.seed, self.worker, 0x5EED])
        sem = asyncio.Semaphore(cap) if cap is not None else None
        tasks: set[asyncio.Task[None]] = set()
        t_next = self.control.start_ns
        arrivals = self.spec.arrivals_ns

        async def one(i: int, t: int) -> None:
            send = self._send(pool, i, t) if self.sessions is None else self._converse(pool, i, t)
            if sem is None:
                await send
                return
            async with sem:
                await send

        try:
            while not self.control.stopped:
                i = self._take() if self.sessions is None else self._take_conversation()
                if i is None:
                    break
                if arrivals is not None:
                    t_next = self.control.start_ns + arrivals[i - self.spec.index_offset]
                else:
                    t_next += next_gap_ns(rng, rate, self.spec.burstiness)
                delay = (t_next - now_ns()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
                if self.control.stopped:
                    break
                task = asyncio.create_task(one(i, t_next))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            # Stopped mid-schedule: end what is in flight here, before the session closes.
            pending = list(tasks)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def _lag_probe(self) -> None:
        tick = _LAG_TICK_NS / 1e9
        cpu = time.process_time_ns
        while True:
            t0 = now_ns()
            await asyncio.sleep(tick)
            t1 = now_ns()
            self.lag.append(t1 - t0 - _LAG_TICK_NS)
            self.ticks.append(t1)
            self.tick_cpu.append(cpu())

    async def _stop_watch(self, main: asyncio.Task[None]) -> None:
        while not self.control.stopped:
            await asyncio.sleep(0.01)
        main.cancel()

    async def run(self) -> WorkerStats:
        slots, rate, cap = self.spec.share(self.worker)
        c = self.control
        pool = http1.Pool(self.endpoint.url, self.endpoint.request_timeout_s, fold_chunks)
        try:
            # Connections open before the load starts: otherwise every request of the
            # first wave also opens its TCP connection, and at 512 streams that burst of
            # connection set-up held the loop for ~15 ms while the first tokens arrived.
            # Failures are left for the load's own requests to report.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pool.warm(slots if slots is not None else cap or 16), 30)
            self.feed.start()
            await self.feed.primed()
            # The collection before the load (below) runs before this worker says it is
            # ready: it took 0.2-0.5 s on a loaded 2-core machine, and after the start it
            # made a replay's first rows leave that late.
            gc.collect()
            c.add(self.worker, W_READY)
            while not c.start_ns and not c.stopped:  # stopped first: Ctrl-C at the start
                await asyncio.sleep(0.001)
            delay = (c.start_ns - now_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            # No automatic garbage collection during the load: a collection pauses the
            # loop, and every token in flight would be stamped that much late (seen as
            # multi-ms ITL outliers at 512 streams).  A request leaves no reference
            # cycles behind (measured: 0 unreachable objects after 5000 requests with
            # the collector off), so nothing accumulates; collection resumes after.
            gc.freeze()
            gc_was_enabled = gc.isenabled()
            gc.disable()
            cpu0, wall0 = time.process_time_ns(), now_ns()
            lag = asyncio.create_task(self._lag_probe())
            if slots is not None:
                body = self._closed_loop(pool, slots)
            else:
                assert rate is not None
                body = self._open_loop(pool, rate, cap)
            main = asyncio.create_task(body)
            watch = asyncio.create_task(self._stop_watch(main))
            try:
                with contextlib.suppress(asyncio.CancelledError):
                    await main
            finally:
                watch.cancel()
                lag.cancel()
                self.feed.stop()
                cpu, wall = time.process_time_ns() - cpu0, now_ns() - wall0
                gc.unfreeze()
                if gc_was_enabled:
                    gc.enable()
        finally:
            pool.close()
        c.add(self.worker, W_DONE)
        self.records.sort(key=lambda r: r.index)
        return WorkerStats(
            self.worker,
            os.getpid(),
            cpu,
            wall,
            self.lag,
            self.ticks,
            self.tick_cpu,
            self.spec.cpus,
            prompt_waits=self.feed.waits,
            prompts_ran_out=self.feed.ran_out,
            producer_cpu_s=self.feed.producer_cpu_s,
        )


def install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is optional
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def pin(spec: LoadSpec, worker: int) -> None:
    if spec.cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {spec.cpus[worker % len(spec.cpus)]})


def _refused(records: Iterable[RequestRecord], endpoint: Endpoint) -> None:
    """A load the server refused for want of the key (401/403) measured nothing: it ends
    with ``auth.ApiKeyError`` (exit 2), never as a point of failed requests."""
    for r in records:
        if auth.is_rejection(r.status):
            raise auth.rejected(r.status or 401, endpoint.url, endpoint.api_key)


@dataclass(frozen=True)
class Hooks:
    """What the caller of ``coordinator.run_load`` sees and decides at each poll."""

    controller: Controller | None
    on_progress: Callable[[Progress], None] | None
    poll_s: float
    on_window: WindowHook | None

    def poll(self, control: Control, spec: LoadSpec) -> tuple[list[WindowEdge], int | None]:
        """One poll: the window edges to report now, in order, and when the load stops
        (None: it goes on). A stop signal is raised here (``servebook.stopping``), where
        no transport callback can swallow it."""
        stopping.raise_if_requested()
        opened, stop = decide(control, self.controller, spec, self.on_progress)
        edges: list[WindowEdge] = []
        if self.on_window is not None:
            if opened:
                edges.append("open")
            if stop is not None and control.window_start_ns:
                edges.append("close")
        return edges, stop


def load_result(
    endpoint: Endpoint,
    spec: LoadSpec,
    records: list[RequestRecord],
    stats: list[WorkerStats],
    span: tuple[int, int],
    control: Control,
) -> LoadResult:
    _refused(records, endpoint)
    return LoadResult(
        spec,
        endpoint,
        records,
        stats,
        span[0],
        span[1],
        control.window_start_ns or None,
        control.stop_ns or None,
    )


async def _load_here(
    endpoint: Endpoint, spec: LoadSpec, prompts: PromptSource, hooks: Hooks
) -> LoadResult:
    """One worker, in this process's running event loop."""
    control = Control(1, array("q", bytes(8 * (G_N + W_N))))
    (producer,) = start_producers(prompts, spec)
    try:
        w = Worker(0, endpoint, spec, prompts, control, producer.conn if producer else None)
        task = asyncio.create_task(w.run())
        while not control.get(0, W_READY) and not task.done():
            stopping.raise_if_requested()  # the handler left it to this loop's polls
            await asyncio.sleep(0.001)
        start = now_ns()
        control.arr[G_START] = start
        while not task.done():
            await asyncio.sleep(hooks.poll_s)
            edges, stop = hooks.poll(control, spec)
            # Hooks do blocking I/O (scraping /metrics): in a thread, so this loop keeps
            # reading streams and stamping tokens meanwhile.
            for edge in edges:
                await asyncio.to_thread(cast(WindowHook, hooks.on_window), edge)
            if stop is not None:
                control.stop(stop)
        try:
            stats = task.result()
        except Exception as e:
            raise ClientError(f"the bench client failed: {type(e).__name__}: {e}") from e
    finally:
        if producer is not None:
            producer.stop()
    return load_result(endpoint, spec, w.records, [stats], (start, now_ns()), control)


def run_here(endpoint: Endpoint, spec: LoadSpec, prompts: PromptSource, hooks: Hooks) -> LoadResult:
    """The load made by one worker in this process, under uvloop (the caller must not be
    inside a running event loop); ``coordinator.run_load`` says when."""
    pin(spec, 0)
    install_uvloop()
    with stopping.polled():  # a stop is raised at a poll, not in a transport callback
        result = asyncio.run(_load_here(endpoint, spec, prompts, hooks))
    stopping.raise_if_requested()  # one that came as the load ended
    return result
