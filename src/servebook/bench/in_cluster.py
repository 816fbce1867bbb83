"""What a Pod of the in-cluster load Job runs (``kube/load_job.py`` says why the protocol
runs in the cluster): ``python3 -m servebook.bench.in_cluster --settings bench.json``, with
``SERVEBOOK_AGENT_INDEX`` (the Pod's completion index) and ``SERVEBOOK_AGENT_TOKEN``.

* **Index 0** runs the whole sweep (``servebook.bench.sweep.run_bench``: windows, validity,
  each point's scrapes of every engine at its Pod IP) against the deployment as the cluster
  reaches it: the entry Service's DNS name and the engine Pods' addresses, all written into
  ``bench.json`` by the bench machine.  Its agents are agent 0, a process beside it, and
  the Pods 1..N-1, which dial it; it listens on ``AGENT_PORT``.  When the sweep ends (or
  fails) it writes ``status.json`` beside the results and serves that directory on
  ``RESULTS_PORT`` (``GET /files``, ``GET /f/PATH``, ``POST /done``, with the Job's token;
  ``GET /ready`` for the readiness probe) until the bench machine has read it, then ends:
  exit 0 when the sweep ran to its end, else 1.
* **Index i > 0** is an agent (``bench/agent.py``'s conversation) that dials Pod 0 at
  ``JOB-0.SERVICE:AGENT_PORT`` for each point it takes part in, until Pod 0 answers
  ``("done",)``: then it ends with exit 0.  A point with fewer agents than the Job has
  (``--agents 4`` at concurrency 2) leaves the others dialing: they are turned away at the
  barrier and dial again for the next point.

It imports only what vLLM's image has and never the Kubernetes API: numpy, pydantic,
prometheus_client and rich (all in vLLM's declared requirements; rich through typer and
transformers), orjson and uvloop when present.  ``tests/unit/test_load_job.py`` checks
this process's imports against vLLM's requirements, and ``tests/unit/test_kube_bench_job.py``
every module each process of a whole in-cluster run imported.

**Addresses.**  ``SERVEBOOK_RESOLVE`` (``HOST:PORT=ADDR:PORT,...``, as curl's ``--resolve``)
maps an address this Pod dials or binds (``localhost:PORT`` for its own ports) to another.
The real cluster needs none (its DNS and Pod network do it); a kubelet without a cluster
network, such as the unit tests' (``tests/unit/test_kube_bench_job.py``), which runs the
Pod's command as a local process, sets it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from servebook.bench.agent import TOKEN_BYTES, TOKEN_ENV, frame, recv_exactly, recv_message
from servebook.bench.coordinator import AgentProcess, LocalLauncher

RESOLVE_ENV = "SERVEBOOK_RESOLVE"
INDEX_ENV = "SERVEBOOK_AGENT_INDEX"
OUT_ENV = "SERVEBOOK_OUT"
STATUS_NAME = "status.json"
READY_PATH = "/ready"
SERVE_S = 900.0  # how long Pod 0 waits for the bench machine to read its results
DIAL_PAUSE_S = 0.1
TELL_S = 10.0  # after the results were read: how long the other agents may take to hear


def parse_resolve(text: str) -> dict[str, tuple[str, int]]:
    """``HOST:PORT=ADDR:PORT,...`` -> {"HOST:PORT": (ADDR, PORT)}."""
    out: dict[str, tuple[str, int]] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, to = item.partition("=")
        host, _, port = to.rpartition(":")
        out[name.strip()] = (host, int(port))
    return out


@dataclass
class Net:
    """How this Pod reaches an address (the identity in a cluster; ``SERVEBOOK_RESOLVE``
    elsewhere)."""

    table: dict[str, tuple[str, int]] = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> Net:
        return cls(parse_resolve(os.environ.get(RESOLVE_ENV, "")))

    def address(self, host: str, port: int) -> tuple[str, int]:
        return self.table.get(f"{host}:{port}", (host, port))

    def url(self, url: str) -> str:
        parts = urlsplit(url)
        if parts.hostname is None:
            return url
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host, to = self.address(parts.hostname, port)
        if (host, to) == (parts.hostname, port):
            return url
        return urlunsplit(parts._replace(netloc=f"{host}:{to}"))

    def own_port(self, port: int) -> int:
        """The port this Pod binds for its container port ``port``."""
        return self.address("localhost", port)[1]


class RemoteAgent:
    """An agent in another Pod of the Job: it is already running and dials by itself; what
    becomes of its Pod the bench machine watches (a Pod that fails ends the bench there)."""

    wait_s = 0.0

    def __init__(self, index: int, pod: str) -> None:
        self.index, self.pod = index, pod

    def poll(self) -> int | None:
        return None

    def stop(self) -> None:
        pass

    def describe_end(self) -> str:
        return f"the agent in the Job's Pod of index {self.index} (hostname {self.pod})"


@dataclass
class JobLauncher:
    """Agent 0 as a process in this Pod, agents 1..N-1 in the Job's other Pods."""

    job: str
    namespace: str
    port: int  # the port this Pod listens on for its agents
    secret_token: str
    where: str = ""
    local: LocalLauncher = field(default_factory=LocalLauncher)

    def __post_init__(self) -> None:
        self.where = self.where or f"Job {self.job} in namespace {self.namespace}"

    def bind_host(self) -> str:
        return "127.0.0.1"  # where agent 0, beside the coordinator, dials

    def bind_address(self) -> tuple[str, int]:
        return ("0.0.0.0", self.port)

    def token(self) -> str:
        return self.secret_token

    def __call__(self, index: int, address: tuple[str, int], token: str) -> AgentProcess:
        if index == 0:
            return self.local(0, ("127.0.0.1", address[1]), token)
        return RemoteAgent(index, f"{self.job}-{index}")


def _write_status(out: Path, status: dict[str, Any]) -> None:
    from servebook.files import write_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / STATUS_NAME, json.dumps(status, indent=1) + "\n")


def coordinate(settings: dict[str, Any], token: str, net: Net, out: Path) -> int:
    """Pod 0: the sweep, then its files served until read (module docstring)."""
    import servebook
    from servebook import auth
    from servebook.bench import target as tgt
    from servebook.bench.sweep import BenchArgs, run_bench
    from servebook.errors import ServebookError

    # The zip on PYTHONPATH has no distribution metadata: the results name the version
    # of the servebook that made the Job (and the zip).
    servebook.__version__ = settings.get("servebook_version") or servebook.__version__
    status: dict[str, Any] = {"ok": False, "exit_code": 2, "message": ""}
    try:
        from servebook.deployment.view import DeploymentView

        view = DeploymentView.from_doc(settings["view"], net.url)
        bench = settings["bench"]
        args = BenchArgs(**{f.name: bench[f.name] for f in fields(BenchArgs) if f.name in bench})
        subject = tgt.from_deployment(
            view,
            api=args.api,
            request_timeout_s=args.request_timeout,
            api_key=auth.from_environment(),
        )
        subject.cluster = tgt.InCluster(
            namespace=settings["namespace"],
            job=settings["job"],
            entry_url=settings["view"]["entry_url"],
        )
        launcher = JobLauncher(
            settings["job"], settings["namespace"], net.own_port(settings["agent_port"]), token
        )
        results, _ = run_bench(
            subject, args, out, resume=False, tokenizer=None, resumable=False, launcher=launcher
        )
        status = {"ok": True, "exit_code": 0, "message": "", "points": len(results.points)}
    except ServebookError as e:
        status = {"ok": False, "exit_code": e.exit_code, "message": str(e), "hint": e.hint}
        print(f"servebook bench (in the cluster): {e}", file=sys.stderr)
    except Exception as e:  # the bench machine reads why, not only the log
        status["message"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    _write_status(out, status)
    done = threading.Event()
    told: set[int] = set()
    turn_away = threading.Thread(
        target=_turn_agents_away,
        args=(net.own_port(settings["agent_port"]), token, done, told),
        daemon=True,
    )
    turn_away.start()
    served = serve_results(out, net.own_port(settings["results_port"]), SERVE_S, token)
    others = set(range(1, int(settings["agents"])))
    t = time.monotonic() + TELL_S
    while not others <= told and time.monotonic() < t:  # every agent hears it is over
        time.sleep(0.05)
    done.set()
    if not served:
        print(
            f"servebook bench (in the cluster): nobody read the results within {SERVE_S:g} s",
            file=sys.stderr,
        )
    return 0 if status["ok"] else 1


def _turn_agents_away(port: int, token: str, done: threading.Event, told: set[int]) -> None:
    """After the sweep: answer every agent that dials ``("done",)``, so the Job's other
    Pods end with exit 0; ``told`` collects their indexes."""
    try:
        server = socket.create_server(("0.0.0.0", port), backlog=64)
    except OSError:
        return
    server.settimeout(0.2)
    with server:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError, EOFError):
                conn.settimeout(5)
                if recv_exactly(conn, TOKEN_BYTES) == token.encode("ascii"):
                    hello = recv_message(conn)
                    conn.sendall(frame(("done",)))
                    told.add(int(hello[1]))


def serve_results(out: Path, port: int, timeout_s: float, token: str) -> bool:
    """Serve ``out``'s files until ``POST /done`` (True) or ``timeout_s`` (False); every
    request but the readiness probe's needs ``Authorization: Bearer TOKEN`` (the Job's
    token: another Pod of the cluster reads nothing and ends nothing)."""
    finished = threading.Event()
    root = out.resolve()
    want = f"Bearer {token}"

    class Files(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _allowed(self) -> bool:
            if secrets.compare_digest(self.headers.get("Authorization", ""), want):
                return True
            self._send(401, b'{"error": "the Job\'s token is required"}')
            return False

        def do_GET(self) -> None:
            if self.path == READY_PATH:  # the readiness probe: the results are served
                self._send(200, b"{}")
                return
            if not self._allowed():
                return
            if self.path == "/files":
                listed = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
                self._send(200, json.dumps(listed).encode())
                return
            if self.path.startswith("/f/"):
                p = (root / self.path[3:]).resolve()
                if p.is_relative_to(root) and p.is_file():
                    self._send(200, p.read_bytes(), "application/octet-stream")
                    return
            self._send(404, b'{"error": "no such file"}')

        def do_POST(self) -> None:
            if not self._allowed():
                return
            if self.path == "/done":
                self._send(200, b"{}")
                finished.set()
            else:
                self._send(404, b"{}")

    httpd = ThreadingHTTPServer(("0.0.0.0", port), Files)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        return finished.wait(timeout_s)
    finally:
        time.sleep(0.1)  # the answer to /done on its way
        httpd.shutdown()
        httpd.server_close()


def agent_loop(settings: dict[str, Any], index: int, token: str, net: Net) -> int:
    """Pods 1..N-1: one agent conversation per point, until Pod 0 says done."""
    from servebook.bench.agent import run_agent
    from servebook.bench.client import install_uvloop

    install_uvloop()
    host, port = net.address(f"{settings['job']}-0.{settings['service']}", settings["agent_port"])
    while True:
        try:
            if asyncio.run(run_agent(host, port, index, token)) == "done":
                return 0
        except (OSError, EOFError, asyncio.IncompleteReadError):
            pass  # Pod 0 between points, not up yet, or turning this agent away
        time.sleep(DIAL_PAUSE_S)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m servebook.bench.in_cluster", description=__doc__)
    p.add_argument("--settings", required=True, help="bench.json, from the Job's ConfigMap")
    args = p.parse_args(argv)
    token = os.environ.get(TOKEN_ENV, "")
    if len(token) != TOKEN_BYTES:
        print(f"servebook: {TOKEN_ENV} must hold the Job's token", file=sys.stderr)
        return 2
    settings = json.loads(Path(args.settings).read_text(encoding="utf-8"))
    index = int(os.environ.get(INDEX_ENV, "0"))
    net = Net.from_env()
    if index == 0:
        out = Path(os.environ.get(OUT_ENV) or "/scratch/out")
        return coordinate(settings, token, net, out)
    return agent_loop(settings, index, token, net)


if __name__ == "__main__":
    sys.exit(main())
