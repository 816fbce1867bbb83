"""Stand-in engines behind a Kubernetes deployment's forwarded ports (the stand-in API
server's ``forward_to``): what verify, bench and status read of a vLLM engine (/health,
/version, /metrics with counters captured from vLLM 0.32.0, streaming /v1/completions),
and, for the in-cluster load, vLLM's /tokenize and /detokenize.  The fixtures that put them
behind the stand-in are ``kube_cluster`` and ``job_cluster`` (conftest.py)."""

from __future__ import annotations

import asyncio
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from servebook.models.tiny import make_tiny_model
from tests.conftest import CliResult
from tests.unit.served_app import stream_tokens

Cli = Callable[..., CliResult]
VALUES = Path(__file__).parent / "fixtures" / "render" / "vllm-pd" / "values.yaml"
METRICS = Path(__file__).parent / "fixtures" / "metrics"
NS = "moe-pd"
UP = ["up", "vllm-pd", "--backend", "kubernetes", "-f", str(VALUES), "--timeout", "60"]


class Engine:
    """A stand-in engine behind a Pod's forwarded port (see the module docstring)."""

    def __init__(self, role: str) -> None:
        name = "decode" if role == "decode" else "prefill"
        self.metrics = (METRICS / f"vllm-0.32.0-cpu-pd-spec-{name}-after.prom").read_text()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> Engine:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def _routes(self, app: web.Application) -> None:
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.scrape)
        app.router.add_post("/v1/completions", self.complete)

    async def _start(self) -> None:
        app = web.Application()
        self._routes(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    async def scrape(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics, content_type="text/plain")

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body.get("max_tokens") or 1)
        if not body.get("stream"):
            return web.json_response(
                {
                    "choices": [{"index": 0, "text": "ab" * n, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": n},
                }
            )
        return await stream_tokens(request, n, 0.002)


class TokenizingEngine(Engine):
    """The stand-in engine, with vLLM 0.32's ``/tokenize`` and ``/detokenize``
    (vllm/entrypoints/serve/tokenize/protocol.py's shapes) over the tiny model's real
    tokenizer: the Pods build their prompts on the server, as they do in a cluster."""

    tokenizer: Any = None

    def __init__(self, role: str) -> None:
        super().__init__(role)
        self.authorizations: set[str] = set()  # what each completion request carried

    async def _start(self) -> None:
        from tokenizers import Tokenizer

        d = Path(tempfile.mkdtemp(prefix="tiny-tok-"))
        make_tiny_model(d)
        self.tokenizer = Tokenizer.from_file(str(d / "tokenizer.json"))
        await super()._start()

    def _routes(self, app: web.Application) -> None:  # the parent's routes, and these two
        super()._routes(app)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)

    async def complete(self, request: web.Request) -> web.StreamResponse:
        self.authorizations.add(request.headers.get("Authorization", ""))
        return await super().complete(request)

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        ids = self.tokenizer.encode(
            body["prompt"], add_special_tokens=body.get("add_special_tokens", True)
        ).ids
        return web.json_response({"count": len(ids), "max_model_len": 2048, "tokens": ids})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": self.tokenizer.decode(body["tokens"])})
