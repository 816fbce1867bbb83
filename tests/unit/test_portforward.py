"""Port-forwards servebook owns (servebook.kube.portforward), over real sockets.

The Pod is a real HTTP server on 127.0.0.1.  Forwards is exercised with a stand-in dialer
that opens a plain TCP connection to it (no cluster here), and Kr8sDialer over real HTTP
against a stand-in API server (aiohttp) that speaks the v4.channel.k8s.io port-forward
protocol and relays to that Pod, reached through a kr8s Api built from a kubeconfig.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from servebook.errors import UsageError
from servebook.kube.kr8s_dialer import PORTFORWARD_PROTOCOL, Kr8sDialer, kr8s_pod_identity
from servebook.kube.portforward import (
    REPORTED_IN_A_ROW,
    ForwardFailed,
    Forwards,
    ForwardUnavailable,
    Stream,
)
from tests.unit.kube_standin import kubeconfig, relay_port

pytestmark = pytest.mark.timeout(30)

NS = "ns"
POD = "tiny-pd-decode-abc"
TIMEOUT_S = 2.0
PERIOD_S = 0.1
# What a client of a broken forward sees: a reset, or an answer cut short.
CLIENT_FAILS = (OSError, http.client.HTTPException, urllib.error.URLError)


# -- the stand-in Pod: a real HTTP server --------------------------------------------------


class PodServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), PodHandler)
        self.release = threading.Event()  # lets /stall requests end
        self.together = threading.Barrier(2, timeout=5)  # /together needs two at once

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class PodHandler(BaseHTTPRequestHandler):
    server: PodServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/together":
            self.server.together.wait()
        if self.path in ("/die", "/stall"):
            # Promise 100000 bytes, send 1000; then reset (a dying Pod) or wait.
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"x" * 1000)
            self.wfile.flush()
            if self.path == "/die":
                linger = struct.pack("ii", 1, 0)
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                self.connection.close()
            else:
                self.server.release.wait(20)
            return
        body = f"pod-answer {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def pod() -> Iterator[PodServer]:
    server = PodServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def get(url: str, timeout: float = 5.0) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as r:
        return bytes(r.read())


def eventually(cond: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the stand-in dialer: a plain TCP connection to the Pod server -------------------------


class TcpStream:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def read(self) -> bytes:
        return await self.reader.read(65536)

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()


class TcpDialer:
    def __init__(self, port: int) -> None:
        self.port = port
        self.dials: list[tuple[str, str, int]] = []

    @contextlib.asynccontextmanager
    async def connect(self, namespace: str, pod: str, port: int) -> AsyncIterator[Stream]:
        self.dials.append((namespace, pod, port))
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            yield TcpStream(reader, writer)
        finally:
            writer.close()

    async def aclose(self) -> None:
        pass


class Identities:
    """pod_identity: a Pod's current UID per name, changed by the test."""

    def __init__(self) -> None:
        self.uids: dict[str, str | None] = {POD: "uid-1"}
        self.hang = threading.Event()
        self.hanging = False

    def __call__(self, namespace: str, pod: str) -> str | None:
        assert namespace == NS
        if self.hanging:
            self.hang.wait(20)
        return self.uids.get(pod)


def forwards(dialer: Any, ids: Identities | None = None) -> Forwards:
    return Forwards(
        dialer, pod_identity=ids or Identities(), timeout_s=TIMEOUT_S, watch_period_s=PERIOD_S
    )


# -- Forwards with the TCP dialer ----------------------------------------------------------


def test_a_request_through_the_forward_gets_the_pods_answer(pod: PodServer) -> None:
    dialer = TcpDialer(pod.port)
    with forwards(dialer) as fw:
        url = fw.open(role="decode", pod=POD, namespace=NS, remote_port=8000)
        assert url.startswith("http://127.0.0.1:")
        assert get(url + "/v1/models") == b"pod-answer /v1/models"
        assert get(url + "/metrics") == b"pod-answer /metrics"
        # The server closed each connection after its answer: a clean end, not a failure.
        assert fw.problems() == {}
        assert fw.alive("decode")
        fw.check()
        assert dialer.dials == [(NS, POD, 8000), (NS, POD, 8000)]
        # The same (pod, port) again is the same forward; another role for it is refused.
        assert fw.open(role="decode", pod=POD, namespace=NS, remote_port=8000) == url
        with pytest.raises(ValueError, match="'decode'"):
            fw.open(role="prefill", pod=POD, namespace=NS, remote_port=8000)
        other = fw.open(role="decode", pod=POD, namespace=NS, remote_port=29000)
        assert other != url and dialer.dials[-1] != (NS, POD, 29000)
        assert get(other + "/x") == b"pod-answer /x" and dialer.dials[-1] == (NS, POD, 29000)
        with pytest.raises(KeyError):
            fw.alive("router")


def test_two_concurrent_connections_are_served_at_once(pod: PodServer) -> None:
    # /together answers only while two requests are in the Pod at the same time.
    with forwards(TcpDialer(pod.port)) as fw:
        url = fw.open(role="decode", pod=POD, namespace=NS, remote_port=8000)
        got: list[bytes] = []
        threads = [
            threading.Thread(target=lambda: got.append(get(url + "/together"))) for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert got == [b"pod-answer /together"] * 2
        assert fw.problems() == {}


def test_a_refusing_dialer_fails_the_request_and_names_the_role() -> None:
    with forwards(TcpDialer(closed_port())) as fw:
        url = fw.open(role="decode", pod=POD, namespace=NS, remote_port=8000)
        started = time.monotonic()
        with pytest.raises(CLIENT_FAILS):
            get(url + "/v1/models")
        assert time.monotonic() - started < TIMEOUT_S + 1
        assert eventually(lambda: "decode" in fw.problems(), TIMEOUT_S)
        reason = fw.problems()["decode"]
        assert POD in reason and "8000" in reason and "Refused" in reason
        assert not fw.alive("decode")
        with pytest.raises(ForwardFailed) as e:
            fw.check()
        assert e.value.role == "decode" and POD in e.value.reason
        assert "'decode'" in str(e.value)


class HangingDialer(TcpDialer):
    @contextlib.asynccontextmanager
    async def connect(self, namespace: str, pod: str, port: int) -> AsyncIterator[Stream]:
        await asyncio.Event().wait()  # never answers
        yield TcpStream(asyncio.StreamReader(), None)  # type: ignore[arg-type]  # unreachable


def test_a_dialer_that_never_answers_is_a_failure_within_the_timeout() -> None:
    with forwards(HangingDialer(0)) as fw:
        url = fw.open(role="prefill", pod=POD, namespace=NS, remote_port=8000)
        started = time.monotonic()
        with pytest.raises(CLIENT_FAILS):
            get(url + "/health", timeout=10)
        assert time.monotonic() - started < TIMEOUT_S + 1
        assert "within 2 s" in fw.problems()["prefill"]


def test_a_stream_that_dies_mid_response_is_reported_naming_the_role(pod: PodServer) -> None:
    with forwards(TcpDialer(pod.port)) as fw:
        url = fw.open(role="decode", pod=POD, namespace=NS, remote_port=8000)
        with pytest.raises(CLIENT_FAILS):
            get(url + "/die")
        assert eventually(lambda: "decode" in fw.problems(), TIMEOUT_S)
        assert "broke" in fw.problems()["decode"] and POD in fw.problems()["decode"]
        assert not fw.alive("decode")
        # A dead forward stays dead: the next request fails at once instead of reaching a
        # Pod whose state may no longer be what was measured.
        with pytest.raises(CLIENT_FAILS):
            get(url + "/v1/models")
        with pytest.raises(ForwardFailed):
            fw.check()


@pytest.mark.parametrize("listening", [True, False])
def test_a_taken_local_port_is_a_clear_error_at_open(pod: PodServer, listening: bool) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        if listening:
            taken.listen()
        port = int(taken.getsockname()[1])
        with forwards(TcpDialer(pod.port)) as fw:
            with pytest.raises(ForwardUnavailable) as e:
                fw.open(role="router", pod=POD, namespace=NS, remote_port=8000, local_port=port)
            assert isinstance(e.value, UsageError) and e.value.exit_code == 2
            assert e.value.role == "router" and e.value.port == port
            assert "'router'" in str(e.value) and str(port) in str(e.value)
            assert "already in use" in str(e.value)
            # A free port asked for by number is used as asked.
            free = closed_port()
            url = fw.open(role="router", pod=POD, namespace=NS, remote_port=8000, local_port=free)
            assert url == f"http://127.0.0.1:{free}"
            assert get(url + "/") == b"pod-answer /"


def test_a_pod_that_is_not_there_at_open_is_a_clear_error() -> None:
    with forwards(TcpDialer(closed_port())) as fw:
        with pytest.raises(ForwardUnavailable) as e:
            fw.open(role="decode", pod="gone-pod", namespace=NS, remote_port=8000)
        assert "'decode'" in str(e.value) and "gone-pod" in str(e.value)


@pytest.mark.parametrize(("now", "words"), [("uid-2", "was replaced"), (None, "being deleted")])
def test_a_replaced_pod_is_reported_within_the_watch_period(
    pod: PodServer, now: str | None, words: str
) -> None:
    ids = Identities()
    with forwards(TcpDialer(pod.port), ids) as fw:
        url = fw.open(role="decode", pod=POD, namespace=NS, remote_port=8000)
        metrics = fw.open(role="decode", pod=POD, namespace=NS, remote_port=29000)
        assert get(url + "/") == b"pod-answer /"
        time.sleep(PERIOD_S * 3)
        assert fw.problems() == {}  # the watcher runs, and an unchanged Pod is fine
        ids.uids[POD] = now
        assert eventually(lambda: "decode" in fw.problems(), PERIOD_S + TIMEOUT_S)
        reason = fw.problems()["decode"]
        assert words in reason and POD in reason
        assert not fw.alive("decode")
        for u in (url, metrics):
            with pytest.raises(CLIENT_FAILS):
                get(u + "/")
        with pytest.raises(ForwardFailed, match="decode"):
            fw.check()


def test_check_notices_a_replaced_pod_without_waiting_for_the_watcher(pod: PodServer) -> None:
    ids = Identities()
    fw = Forwards(TcpDialer(pod.port), pod_identity=ids, timeout_s=TIMEOUT_S, watch_period_s=60)
    with fw:
        fw.open(role="decode", pod=POD, namespace=NS, remote_port=8000)
        fw.check()
        ids.uids[POD] = "uid-2"
        with pytest.raises(ForwardFailed) as e:
            fw.check()
        assert e.value.role == "decode" and "uid-1 -> uid-2" in e.value.reason


def test_a_hung_identity_check_is_reported_not_waited_for(pod: PodServer) -> None:
    ids = Identities()
    with forwards(TcpDialer(pod.port), ids) as fw:
        fw.open(role="decode", pod=POD, namespace=NS, remote_port=8000)
        ids.hanging = True
        assert eventually(lambda: "decode" in fw.problems(), PERIOD_S + TIMEOUT_S + 1)
        assert "timed out" in fw.problems()["decode"]
        started = time.monotonic()
    assert time.monotonic() - started < TIMEOUT_S * 1.5
    ids.hang.set()


def close_with_a_stream_in_flight(fw: Forwards, bound_s: float) -> None:
    """Open, start an answer that stalls, close: within the bound, the client is cut off
    (an error, not a clean short answer) and nothing of the forward is left."""
    before = {t for t in threading.enumerate() if t.name == "servebook-portforward"}
    fw.start()
    url = fw.open(role="decode", pod=POD, namespace=NS, remote_port=8000)
    port = int(url.rsplit(":", 1)[1])
    client_error: list[BaseException] = []

    def read_forever() -> None:
        try:
            get(url + "/stall", timeout=15)
        except BaseException as e:
            client_error.append(e)

    reader = threading.Thread(target=read_forever)
    reader.start()
    time.sleep(0.3)  # the answer has started and stalls
    started = time.monotonic()
    fw.close()
    assert time.monotonic() - started < bound_s
    reader.join(5)
    assert not reader.is_alive() and client_error
    assert fw.problems() == {}  # closing is not a failure of the forward
    now = {t for t in threading.enumerate() if t.name == "servebook-portforward"}
    assert now <= before
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass


def test_close_is_bounded_with_a_stream_in_flight(pod: PodServer) -> None:
    close_with_a_stream_in_flight(forwards(TcpDialer(pod.port)), TIMEOUT_S * 1.5)


# -- Kr8sDialer against a stand-in API server --------------------------------------------

TOKEN = "sb-test-token"
ERROR_POD = "tiny-pd-prefill-err"
FORBIDDEN_POD = "tiny-pd-router-rbac"
PORT_ERROR = (
    "error forwarding port 8000 to pod 1f2e, uid : failed to execute portforward in network "
    'namespace "/var/run/netns/cni-1": failed to connect to localhost:8000 inside namespace: '
    "connect: connection refused"
)


# The kubelet's error-channel text for a connection the container reset (containerd#9875).
RESET_ERROR = (
    "error forwarding port 8000 to pod uid-1, uid : failed to execute portforward in network "
    'namespace "/var/run/netns/cni-1": read tcp4 127.0.0.1:41234->127.0.0.1:8000: read: '
    "connection reset by peer"
)


class StandInApiServer:
    """A small Kubernetes API server: /version, pods list, and pods/portforward over the
    v4.channel.k8s.io WebSocket protocol, relaying to the stand-in Pod."""

    def __init__(self, pod_port: int) -> None:
        self.pod_port = pod_port
        self.seen: list[dict[str, str]] = []
        self.pods: dict[str, dict[str, Any]] = {
            POD: {"uid": "uid-1", "restarts": 0},
            ERROR_POD: {"uid": "uid-e", "restarts": 0},
            FORBIDDEN_POD: {"uid": "uid-f", "restarts": 0},
        }
        self.resets = 0  # streams to answer as the kubelet answers a reset connection
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _start(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/version", self.version)
        app.router.add_get("/version/", self.version)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self.list_pods)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}/portforward", self.portforward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def version(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"major": "1", "minor": "33", "gitVersion": "v1.33.1"})

    def _status(self, code: int, reason: str, message: str) -> Any:
        from aiohttp import web

        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
        return web.json_response({**body, "reason": reason, "code": code}, status=code)

    async def list_pods(self, request: Any) -> Any:
        from aiohttp import web

        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._status(401, "Unauthorized", "Unauthorized")
        want = request.query.get("fieldSelector", "").removeprefix("metadata.name=")
        items = []
        for name, p in self.pods.items():
            if name != want:
                continue
            meta = {"name": name, "namespace": request.match_info["ns"], "uid": p["uid"]}
            if p.get("deleting"):
                meta["deletionTimestamp"] = p["deleting"]
            restarts = [{"name": "engine", "restartCount": p["restarts"]}]
            status = {"phase": "Running", "containerStatuses": restarts}
            items.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status})
        return web.json_response(
            {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
        )

    async def portforward(self, request: Any) -> Any:
        from aiohttp import web

        ns, name = request.match_info["ns"], request.match_info["pod"]
        self.seen.append(
            {
                "pod": name,
                "authorization": request.headers.get("Authorization", ""),
                "protocols": request.headers.get("Sec-WebSocket-Protocol", ""),
                "ports": request.query.get("ports", ""),
            }
        )
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._status(401, "Unauthorized", "Unauthorized")
        if name == FORBIDDEN_POD:
            return self._status(
                403,
                "Forbidden",
                f'pods "{name}" is forbidden: User "u" cannot create resource '
                f'"pods/portforward" in API group "" in the namespace "{ns}"',
            )
        if name not in self.pods:
            return self._status(404, "NotFound", f'pods "{name}" not found')
        ws = web.WebSocketResponse(protocols=(PORTFORWARD_PROTOCOL,))
        await ws.prepare(request)
        if ws.ws_protocol != PORTFORWARD_PROTOCOL:
            await ws.close(code=1002)
            return ws
        prefix = int(request.query["ports"]).to_bytes(2, "little")
        await ws.send_bytes(b"\x00" + prefix)
        await ws.send_bytes(b"\x01" + prefix)
        if name == ERROR_POD or self.resets > 0:
            reset = name != ERROR_POD
            self.resets -= reset
            await ws.send_bytes(b"\x01" + (RESET_ERROR if reset else PORT_ERROR).encode())
            await ws.close()
            return ws
        reader, writer = await asyncio.open_connection("127.0.0.1", self.pod_port)

        await relay_port(ws, reader, writer)
        return ws


@pytest.fixture
def apiserver(pod: PodServer) -> Iterator[StandInApiServer]:
    server = StandInApiServer(pod.port)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def kube_api(apiserver: StandInApiServer, tmp_path: Path) -> Any:
    import kr8s

    cfg = tmp_path / "kubeconfig"
    cfg.write_text(kubeconfig(f"http://127.0.0.1:{apiserver.port}", TOKEN, NS))
    return kr8s.api(kubeconfig=str(cfg))


def kube_forwards(api: Any) -> Forwards:
    return Forwards(
        Kr8sDialer(api, timeout_s=TIMEOUT_S),
        pod_identity=kr8s_pod_identity(api),
        timeout_s=TIMEOUT_S * 2,
        watch_period_s=0.2,
    )


def test_kr8s_dialer_carries_a_large_answer_and_a_large_request(
    kube_api: Any, apiserver: StandInApiServer
) -> None:
    with kube_forwards(kube_api) as fw:
        url = fw.open(role="decode", pod=POD, namespace=NS, remote_port=8000)
        path = "/" + "p" * 6000
        assert get(url + path) == f"pod-answer {path}".encode()
        assert fw.problems() == {}


def test_an_error_on_the_error_channel_is_a_failure_naming_the_role(
    kube_api: Any, apiserver: StandInApiServer
) -> None:
    with kube_forwards(kube_api) as fw:
        url = fw.open(role="prefill", pod=ERROR_POD, namespace=NS, remote_port=8000)
        with pytest.raises(CLIENT_FAILS):
            get(url + "/health")
        assert eventually(lambda: "prefill" in fw.problems(), TIMEOUT_S)
        reason = fw.problems()["prefill"]
        assert ERROR_POD in reason and "connection refused" in reason
        with pytest.raises(ForwardFailed) as e:
            fw.check()
        assert e.value.role == "prefill"


def test_one_reset_stream_fails_that_request_alone_not_the_roles_forwards(
    kube_api: Any, apiserver: StandInApiServer
) -> None:
    """Issue 23 point 6: the kubelet reports ordinary connection resets on a port-forward's
    error channel (containerd#9875); one fails that stream alone, not every forward of the
    role; resets on every stream are the Pod's problem, and the forward fails then.  (The
    test plane's node agent does not report a reset on the error channel.)"""
    apiserver.resets = 1
    with kube_forwards(kube_api) as fw:
        url = fw.open(role="decode", pod=POD, namespace=NS, remote_port=8000)
        with pytest.raises(CLIENT_FAILS):
            get(url + "/first")  # the reset one
        assert get(url + "/second") == b"pod-answer /second"
        assert fw.problems() == {} and fw.alive("decode")
        fw.check()
        apiserver.resets = REPORTED_IN_A_ROW
        for _ in range(REPORTED_IN_A_ROW):
            with pytest.raises(CLIENT_FAILS):
                get(url + "/again")
        assert "connection reset by peer" in fw.problems()["decode"]


# A 403 on the upgrade (RBAC), with the words servebook adds, is a scenario run against the
# stand-in API server and the test plane (tests/cluster/test_scenarios.py).
@pytest.mark.parametrize(("pod_name", "words"), [("deleted-pod", "404")])
def test_a_refused_port_forward_upgrade_is_a_failure_naming_the_role(
    kube_api: Any, apiserver: StandInApiServer, pod_name: str, words: str
) -> None:
    # The Pod list still shows the Pod: the upgrade itself is what fails.
    apiserver.pods.setdefault(pod_name, {"uid": "uid-x", "restarts": 0})
    with kube_forwards(kube_api) as fw:
        url = fw.open(role="router", pod=pod_name, namespace=NS, remote_port=29000)
        apiserver.pods.pop("deleted-pod", None)
        with pytest.raises(CLIENT_FAILS):
            get(url + "/metrics")
        assert eventually(lambda: "router" in fw.problems(), TIMEOUT_S)
        reason = fw.problems()["router"]
        assert words in reason and pod_name in reason and "29000" in reason


def test_close_is_bounded_with_a_kubernetes_stream_in_flight(
    kube_api: Any, apiserver: StandInApiServer
) -> None:
    close_with_a_stream_in_flight(kube_forwards(kube_api), TIMEOUT_S * 2 * 1.5)
