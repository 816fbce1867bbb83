"""An aiohttp application served on 127.0.0.1 from a thread of its own, for tests that
need a real HTTP server beside synchronous code (the CLI, urllib, worker processes)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator

from aiohttp import web


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
