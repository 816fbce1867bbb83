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


# What `python -m vllm.entrypoints.openai.api_server` runs when the stand-in package is
# first on PYTHONPATH (``vllm_package``): the local backend starts it as it starts vLLM.
# ``scripted_engine`` runs the same program on its own, for bench.  Its faults, set by
# environment: STANDIN_ANSWER (completions after the first N are held open: a stalled
# engine), STANDIN_ANSWER_MODEL (the model every chunk names), STANDIN_NO_METRICS (no
# /metrics: a server whose points stand on the client's figures), STANDIN_TERM_LINGER
# (on SIGTERM its port closes at once and the process exits that many seconds later, as
# an engine shutting down), STANDIN_FAULT (a fault from the completion after the first
# STANDIN_FAULT_AFTER on: ``FAULTS``), STANDIN_REQUIRE_KEY (401 without ``Bearer KEY``, as
# vLLM's --api-key), STANDIN_SLOW_HEALTH (PATH:SECONDS: the first /health that finds the
# file PATH removes it and answers SECONDS late, one slow answer from a live server).
_API_SERVER = """
import http.server, json, os, sys, threading, time
from pathlib import Path

args = sys.argv[1:]
def arg(name, default):
    return args[args.index(name) + 1] if name in args else default

fix = Path(os.environ["STANDIN_FIXTURES"])
files = {
    "/metrics": fix / "vllm-0.32.0-cpu-tiny-pd-decode-after.prom",
    "/v1/models": fix / "vllm-0.32.0-v1-models.json",
    "/version": fix / "vllm-0.32.0-version.json",
}
if os.environ.get("STANDIN_NO_METRICS"):
    del files["/metrics"]
answer = int(os.environ.get("STANDIN_ANSWER", "-1"))
answer_model = os.environ.get("STANDIN_ANSWER_MODEL")
fault = os.environ.get("STANDIN_FAULT")
fault_after = int(os.environ.get("STANDIN_FAULT_AFTER", "0"))
require_key = os.environ.get("STANDIN_REQUIRE_KEY")
seen = Path(os.environ["STANDIN_SEEN"]) if os.environ.get("STANDIN_SEEN") else None
slow_health = os.environ.get("STANDIN_SLOW_HEALTH", "").rpartition(":")
tokenizer = None
if os.environ.get("STANDIN_TOKENIZER"):
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(os.environ["STANDIN_TOKENIZER"])
count = [0]
lock = threading.Lock()

def prompt_tokens(prompt):
    if isinstance(prompt, list):
        return len(prompt)
    return len(tokenizer.encode(prompt).ids) if tokenizer is not None else 5

class H(http.server.BaseHTTPRequestHandler):
    def reply(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def refused(self):
        if require_key and self.headers.get("Authorization") != "Bearer " + require_key:
            self.reply(401, b'{"error": {"message": "Unauthorized", "code": 401}}')
            return True
        return False
    def do_GET(self):
        if self.path.startswith("/v1/") and self.refused():
            return
        if self.path == "/health" and slow_health[0]:
            try:
                os.unlink(slow_health[0])
            except FileNotFoundError:
                pass
            else:
                time.sleep(float(slow_health[2]))
        path = files.get(self.path)
        ok = path is not None or self.path == "/health"
        self.reply(200 if ok else 404, path.read_bytes() if path else b"")
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        with lock:
            count[0] += 1
            n = count[0]
        if seen is not None:
            (seen / f"completion-{n}").write_text(json.dumps(req))
        if 0 <= answer < n:
            time.sleep(3600)  # busy: the request is held open
        if self.refused():
            return
        f = fault if fault and n > fault_after else None
        if f == "die":
            os._exit(1)
        if f == "500" or (f == "500half" and n % 2 == 0):
            self.reply(500, b'{"error": {"message": "internal error", "code": 500}}')
            return
        if f == "echo500":  # a gateway quoting the request's credentials in its error
            auth = self.headers.get("Authorization", "")
            said = f"invalid request: Authorization: {auth} key={auth.split(' ')[-1]}"
            self.reply(500, json.dumps({"error": {"message": said, "code": 500}}).encode())
            return
        model = answer_model or req.get("model", "tiny")
        used = {"prompt_tokens": prompt_tokens(req.get("prompt", "")),
                "completion_tokens": int(req.get("max_tokens", 8))}
        if not req.get("stream") or f == "plain200":
            body = {"choices": [{"index": 0, "text": " jumps", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 8}}
            self.reply(200, json.dumps(body).encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        def event(choices, usage=None):
            chunk = {"id": f"cmpl-{n}", "object": "text_completion", "created": 1,
                     "model": model, "choices": choices, "usage": usage}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\\n\\n")
            self.wfile.flush()
        if f == "notokens":
            self.wfile.write(b"data: [DONE]\\n\\n")
            return
        if f in ("malformed", "badjson"):
            bad = b"{not json" if f == "malformed" else b'{"choices": "x", "model": 7}'
            self.wfile.write(b"data: " + bad + b"\\n\\n" + b"data: [DONE]\\n\\n")
            return
        if f == "slowdrip":  # one SSE comment byte every 0.5 s, for ever
            while True:
                self.wfile.write(b":")
                self.wfile.flush()
                time.sleep(0.5)
        k = used["completion_tokens"]
        if f == "close":  # one token, then the connection closes
            event([{"index": 0, "text": " a", "logprobs": None, "finish_reason": None}])
            self.close_connection = True
            return
        if f == "usage_lie":
            used = {**used, "completion_tokens": 10 * k}
        if f == "moretokens":  # max_tokens ignored
            k = 3 * k
            used = {**used, "completion_tokens": k}
        for i in range(k):
            end = "length" if i == k - 1 else None
            event([{"index": 0, "text": " a", "logprobs": None, "finish_reason": end}])
        event([], used)
        self.wfile.write(b"data: [DONE]\\n\\n")
    def log_message(self, *a):
        pass

address = (arg("--host", "127.0.0.1"), int(arg("--port", "8000")))
class Server(http.server.ThreadingHTTPServer):
    if ":" in address[0]:
        import socket
        address_family = socket.AF_INET6
    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)  # a client gone is no error
server = Server(address, H)
server.daemon_threads = True
linger = float(os.environ.get("STANDIN_TERM_LINGER", "0"))
if linger:
    import signal
    def stopping(*_):  # as vLLM stops: the port closes at once, the process exits later
        server.socket.close()
        time.sleep(linger)
        os._exit(0)
    signal.signal(signal.SIGTERM, stopping)
server.serve_forever()
"""


# The scripted engine's faults (the reliability probe's fault server's modes): every
# completion a 500, every other one a 500, SSE data that is not JSON, JSON of the wrong
# shape, the connection closed after one token, a 200 of only [DONE], usage counting 10x
# the tokens sent, 3x the tokens asked for, a 200 that is not a stream, a 500 quoting the
# request's Authorization header, one comment byte every 0.5 s, the process exiting.
FAULTS = (
    "500", "500half", "malformed", "badjson", "close", "notokens", "usage_lie",
    "moretokens", "plain200", "echo500", "slowdrip", "die",
)  # fmt: skip


@contextlib.contextmanager
def scripted_engine(
    *,
    answer: int | None = None,
    answer_model: str | None = None,
    tokenizer: Path | None = None,
    seen: Path | None = None,
    fault: str | None = None,
    fault_after: int = 0,
    require_key: str | None = None,
    host: str = "127.0.0.1",
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The stand-in vLLM server on a free port of 127.0.0.1, streaming completions as
    vLLM does (one token a chunk, a usage chunk, ``[DONE]``) with no /metrics; yields its
    base URL and its process once it answers.  Faults: completions after the first
    ``answer`` are held open (a stalled engine); every chunk names ``answer_model``
    instead of the model asked for.  ``tokenizer``: a tokenizer.json that counts the
    prompt's tokens for ``usage`` as vLLM does; each completion it receives leaves a file
    in ``seen``, holding its JSON body.  ``fault`` (one of ``FAULTS``): what every
    completion after the first ``fault_after`` gets instead of its answer;
    ``require_key``: 401 for a request without ``Authorization: Bearer KEY``; ``host``:
    127.0.0.1 or ::1."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"fault {fault!r}: one of {', '.join(FAULTS)}")
    port = free_port()
    env = {**os.environ, "STANDIN_FIXTURES": str(FIX), "STANDIN_NO_METRICS": "1"}
    if fault is not None:
        env["STANDIN_FAULT"] = fault
        env["STANDIN_FAULT_AFTER"] = str(fault_after)
    if require_key is not None:
        env["STANDIN_REQUIRE_KEY"] = require_key
    env["STANDIN_ANSWER"] = str(-1 if answer is None else answer)
    if answer_model is not None:
        env["STANDIN_ANSWER_MODEL"] = answer_model
    if tokenizer is not None:
        env["STANDIN_TOKENIZER"] = str(tokenizer)
    if seen is not None:
        seen.mkdir(parents=True, exist_ok=True)
        env["STANDIN_SEEN"] = str(seen)
    proc = subprocess.Popen(
        [sys.executable, "-c", _API_SERVER, "--host", host, "--port", str(port)], env=env
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection((host, port), 0.2):
                break
            assert proc.poll() is None and time.monotonic() < deadline, "stand-in did not start"
            time.sleep(0.05)
        yield f"http://{f'[{host}]' if ':' in host else host}:{port}", proc
    finally:
        proc.kill()
        proc.wait(10)


def vllm_package(
    root: Path,
    *,
    answer: int | None = None,
    seen: Path | None = None,
    term_linger_s: float | None = None,
    slow_health: tuple[Path, float] | None = None,
) -> dict[str, str]:
    """A stand-in ``vllm`` package under ``root``; returns the environment that puts it
    first on the path of a ``servebook`` process, so the local backend's check for vLLM and
    its ``python -m vllm.entrypoints.openai.api_server ... --host H --port P`` find it.  It
    answers /health, /version, /v1/models and /metrics (a real vLLM 0.32.0 CPU server's),
    and completions: the first ``answer`` (all when ``None``) with a text, each later one
    held open, as a server still busy; each completion it receives leaves a file in
    ``seen``.  ``term_linger_s``: on SIGTERM its port closes at once and the process
    exits that much later, as an engine shutting down.  ``slow_health`` (PATH, SECONDS):
    the first /health that finds the file PATH (made by the test when it wants one slow
    answer) removes it and answers SECONDS late."""
    pkg = root / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True, exist_ok=True)
    for d in (root / "vllm", root / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").touch()
    (pkg / "api_server.py").write_text(_API_SERVER)
    env = {
        "PYTHONPATH": os.pathsep.join([str(root), *(p for p in sys.path if p)]),
        "STANDIN_FIXTURES": str(FIX),
        "STANDIN_ANSWER": str(-1 if answer is None else answer),
    }
    if seen is not None:
        seen.mkdir(parents=True, exist_ok=True)
        env["STANDIN_SEEN"] = str(seen)
    if term_linger_s is not None:
        env["STANDIN_TERM_LINGER"] = str(term_linger_s)
    if slow_health is not None:
        env["STANDIN_SLOW_HEALTH"] = f"{slow_health[0]}:{slow_health[1]}"
    return env
