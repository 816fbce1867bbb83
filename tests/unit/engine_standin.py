"""A process that stands in for a vLLM server where ``servebook attach`` depends on one: it
listens on a port of 127.0.0.1 with a vLLM engine's command line as its own argv (what
attach reads from /proc), and answers ``/health``, ``/v1/models`` and ``/metrics`` with
text captured from a real vLLM 0.32.0 CPU server (tests/unit/fixtures/metrics)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

FIX = Path(__file__).parent / "fixtures" / "metrics"
ENGINE = ("-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny")

# Serves the files named by its environment; its argv after `-c CODE` is never read by it.
_CODE = """
import http.server, os
files = {"/metrics": os.environ["STANDIN_METRICS"], "/v1/models": os.environ["STANDIN_MODELS"]}
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        path = files.get(self.path)
        body = open(path, "rb").read() if path else b"{}"
        self.send_response(200 if path or self.path == "/health" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["STANDIN_PORT"])), H).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def engine(
    flags: Sequence[str] = (),
    metrics: str = "vllm-0.32.0-cpu-tiny-pd-decode-after.prom",
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """A stand-in engine started as ``python -c CODE -m vllm...api_server --model M FLAGS``;
    yields its base URL once it answers, and stops it afterwards."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _CODE, *ENGINE, *flags],
        env={
            **os.environ,
            **(env or {}),
            "STANDIN_PORT": str(port),
            "STANDIN_METRICS": str(FIX / metrics),
            "STANDIN_MODELS": str(FIX / "vllm-0.32.0-v1-models.json"),
        },
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            assert proc.poll() is None and time.monotonic() < deadline, "stand-in did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
