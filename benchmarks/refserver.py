"""A scripted OpenAI-compatible streaming server that records its own ground truth.

It answers ``POST /v1/completions`` and ``POST /v1/chat/completions`` with ``stream:
true``: it waits ``--ttft-ms`` after the request arrives, then sends ``max_tokens`` tokens
one SSE event each, ``--itl-ms`` apart on an absolute schedule (a late token does not push
the later ones back), then a usage-only chunk and ``data: [DONE]``, as vLLM does.  With
both delays 0 it streams as fast as it can, yielding to the event loop after every token
so that concurrent streams interleave the way a batching engine's do (one token per
stream per step).

Ground truth, per request, in the server's clock (``time.monotonic_ns``, the same
system-wide clock the servebook client stamps with): when the handler received the
request and when each token's event was handed to the socket.  ``GET /truth`` returns the
requests since the last ``POST /truth/reset`` as JSON ``{"requests": [{"id", "recv_ns",
"token_ns": [...]}], "first_recv_ns", "last_end_ns"}``; the request id is the
``X-Request-Id`` header (servebook's client and ``vllm bench serve`` both send one).
``POST /config {"ttft_ms", "itl_ms", "record"}`` changes the script (and resets the truth)
without a restart.

Run: ``python benchmarks/refserver.py --port 8011 --ttft-ms 100 --itl-ms 20 [--cpu 0]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import heapq
import json
import os
import time
from array import array
from collections import deque
from typing import Any

from aiohttp import web, web_protocol, web_server

now_ns = time.monotonic_ns


class Truth:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests: list[tuple[str, int, array]] = []
        self.first_recv_ns = 0
        self.last_end_ns = 0

    def doc(self) -> dict[str, Any]:
        return {
            "requests": [
                {"id": rid, "recv_ns": recv, "token_ns": list(toks)}
                for rid, recv, toks in self.requests
            ],
            "first_recv_ns": self.first_recv_ns,
            "last_end_ns": self.last_end_ns,
        }


def _chunk(model: str, chat: bool, text: str, finish: str | None) -> bytes:
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": text},
            "logprobs": None,
            "finish_reason": finish,
        }
        obj = "chat.completion.chunk"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        obj = "text_completion"
    doc = {
        "id": "cmpl-ref",
        "object": obj,
        "created": 0,
        "model": model,
        "choices": [choice],
        "usage": None,
    }
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


WRITE_HIGH_WATER = 1 << 16
YIELD_EVERY = 16  # token writes between two turns of the event loop (Paced)


def _frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n" % len(payload) + payload + b"\r\n"


class StampingHandler(web_protocol.RequestHandler):
    """aiohttp's connection handler, noting when bytes last arrived on the connection (a
    keep-alive client sends its next request only after the previous response ended).

    Parsing is deferred to the next loop turn: when hundreds of requests arrive in one
    burst, every connection's bytes are then stamped within microseconds of each other,
    instead of each stamp waiting for all the parsing before it."""

    sb_rx_ns = 0

    def data_received(self, data: bytes) -> None:
        self.sb_rx_ns = now_ns()
        GATE.call(self._sb_parse, data)

    def _sb_parse(self, data: bytes) -> None:
        if self.transport is not None:
            super().data_received(data)


class Gate:
    """At most ``per_turn`` pieces of request work (parsing a request, starting or ending
    its handler) between two polls of the sockets.  Without it, a wave of hundreds of
    requests (a closed loop's next wave arrives as the previous one ends) is parsed and
    answered in one long turn of the event loop, and requests arriving meanwhile are
    stamped only when it ends: the server's own queueing would be charged to the client
    as TTFT error.  A serving engine reads requests in its API server while it steps."""

    def __init__(self, per_turn: int = 4) -> None:
        self.per_turn = per_turn
        self.queue: deque[tuple[Any, tuple[Any, ...]]] = deque()
        self.task: asyncio.Task[None] | None = None

    def call(self, fn: Any, *args: Any) -> None:
        self.queue.append((fn, args))
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.run())

    async def turn(self) -> None:
        """Wait for this coroutine's turn (it then runs in the next loop turn)."""
        fut = asyncio.get_running_loop().create_future()
        self.call(fut.set_result, None)
        await fut

    async def run(self) -> None:
        q = self.queue
        while q:
            for _ in range(min(self.per_turn, len(q))):
                fn, args = q.popleft()
                fn(*args)
            await asyncio.sleep(0)


GATE = Gate()

# aiohttp's web.Server builds RequestHandler by its module-level name.
web_server.RequestHandler = StampingHandler  # type: ignore[misc]


class _Stream:
    __slots__ = ("done", "due", "itl", "last", "left", "mid", "toks", "transport")

    def __init__(
        self, transport: Any, n: int, mid: bytes, last: bytes, toks: array, done: Any
    ) -> None:
        self.transport, self.left, self.mid, self.last = transport, n, mid, last
        self.toks, self.done = toks, done
        self.due = self.itl = 0

    def emit(self) -> bool:
        """Write the next token; True when the stream is finished."""
        tr = self.transport
        if tr.is_closing():
            self.done.set_result(None)
            return True
        self.left -= 1
        self.toks.append(now_ns())
        tr.write(self.last if self.left == 0 else self.mid)
        if self.left == 0:
            self.done.set_result(None)
            return True
        return False


class Paced:
    """Scripted delays for every stream from one task: a heap of due times, one timer
    for the earliest, every due token written when it fires.  Hundreds of streams then
    cost one wake-up per tick instead of one timer each, so the server stays on schedule
    (and quick to read new requests) at 512 streams; the truth records the real write
    times either way."""

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, _Stream]] = []
        self.seq = 0
        self.wake: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None

    def add(self, s: _Stream) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (s.due, self.seq, s))
        if self.wake is None:
            self.wake = asyncio.Event()
        self.wake.set()
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        assert self.wake is not None
        while True:
            if not self.heap:
                self.wake.clear()
                await self.wake.wait()
                continue
            wait = self.heap[0][0] - now_ns()
            if wait > 0:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), wait / 1e9)
                continue
            t = now_ns()
            written = 0
            while self.heap and self.heap[0][0] <= t:
                _, _, s = heapq.heappop(self.heap)
                if not s.emit():
                    s.due += s.itl
                    self.seq += 1
                    heapq.heappush(self.heap, (s.due, self.seq, s))
                written += 1
                if written % YIELD_EVERY == 0:
                    # Let the loop read (and stamp) requests that arrived meanwhile: a
                    # serving engine's API server reads requests while its engine steps,
                    # so a request must not wait behind hundreds of token writes here.
                    await asyncio.sleep(0)


class Engine:
    """Zero-delay streaming, the way a batching engine emits: one step writes one token
    to every active stream, then yields to the event loop once (to read new requests).
    One task and one write per token keep the server cheaper per token than any client,
    so a capacity measurement measures the client.  A stream whose socket buffer is full
    (its client is behind) skips steps until it drains."""

    def __init__(self) -> None:
        self.streams: list[_Stream] = []
        self.task: asyncio.Task[None] | None = None

    def add(self, s: _Stream) -> None:
        self.streams.append(s)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        while self.streams:
            keep = []
            for s in self.streams:
                tr = s.transport
                if tr.is_closing():
                    s.done.set_result(None)
                    continue
                if tr.get_write_buffer_size() <= WRITE_HIGH_WATER and s.emit():
                    continue
                keep.append(s)
            self.streams = keep
            await asyncio.sleep(0)


def make_app(ttft_ms: float, itl_ms: float, record: bool = True) -> web.Application:
    truth = Truth()
    engine = Engine()
    paced = Paced()
    cfg = {"ttft_ns": int(ttft_ms * 1e6), "itl_ns": int(itl_ms * 1e6), "record": record}

    async def stream(request: web.Request) -> web.StreamResponse:
        # Arrival is when the request's bytes were read off the socket, not when this
        # handler got its turn: in a burst of hundreds of requests the difference is the
        # server's own queueing, which no client can see.
        recv = getattr(request.protocol, "sb_rx_ns", 0) or now_ns()
        ttft_ns, itl_ns, record = cfg["ttft_ns"], cfg["itl_ns"], cfg["record"]
        if not truth.first_recv_ns:
            truth.first_recv_ns = recv
        await GATE.turn()  # let the rest of a burst be stamped before doing work
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        model = str(body.get("model", "ref"))
        n = int(body.get("max_tokens") or 16)
        rid = request.headers.get("X-Request-Id", "")
        mid = _frame(_chunk(model, chat, " tok", None))
        last = _frame(_chunk(model, chat, " tok", "length"))
        usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
        tail = {
            "id": "cmpl-ref",
            "object": "x",
            "created": 0,
            "model": model,
            "choices": [],
            "usage": usage,
        }
        tail_frame = _frame(
            b"data: " + json.dumps(tail, separators=(",", ":")).encode() + b"\n\ndata: [DONE]\n\n"
        )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        # Token frames go straight to the transport (one write, one HTTP chunk, one SSE
        # event per token, as vLLM sends them): aiohttp's StreamResponse.write costs more
        # per call than a client spends reading, and the server must not be what limits a
        # capacity measurement.  aiohttp still writes the headers and the final chunk.
        transport = request.transport
        assert transport is not None
        toks = array("q")
        s = _Stream(transport, n, mid, last, toks, asyncio.get_running_loop().create_future())
        if ttft_ns > 0 or itl_ns > 0:
            s.due, s.itl = recv + ttft_ns, itl_ns
            paced.add(s)
        else:
            engine.add(s)
        await s.done
        await GATE.turn()
        if not transport.is_closing():
            transport.write(tail_frame)
            await resp.write_eof()
        end = now_ns()
        truth.last_end_ns = max(truth.last_end_ns, end)
        if record:
            truth.requests.append((rid, recv, toks))
        return resp

    async def get_truth(request: web.Request) -> web.Response:
        return web.json_response(truth.doc())

    async def reset(request: web.Request) -> web.Response:
        truth.reset()
        return web.json_response({"ok": True})

    async def configure(request: web.Request) -> web.Response:
        body = await request.json()
        cfg["ttft_ns"] = int(float(body.get("ttft_ms", 0)) * 1e6)
        cfg["itl_ns"] = int(float(body.get("itl_ms", 0)) * 1e6)
        cfg["record"] = bool(body.get("record", True))
        truth.reset()
        return web.json_response({"ok": True})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "ref", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", stream)
    app.router.add_post("/v1/chat/completions", stream)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/truth", get_truth)
    app.router.add_post("/truth/reset", reset)
    app.router.add_post("/config", configure)
    app["truth"] = truth
    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--cpu", type=int, default=None, help="pin the server to this core")
    ap.add_argument("--no-truth", action="store_true", help="do not record ground truth")
    args = ap.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    # A collection pause would delay every token write and arrival stamp behind it; a
    # benchmark server lives minutes, so the collector stays off.
    gc.freeze()
    gc.disable()
    web.run_app(
        make_app(args.ttft_ms, args.itl_ms, record=not args.no_truth),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
