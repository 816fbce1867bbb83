"""Credentials that expire mid-run, and a reset among a role's port-forward streams, on
the stand-in API server (issue 23 points 7 and 6).

An exec plugin's token (EKS: about 15 minutes) expires under a command that has many
requests in flight: the API server answers each 401; kr8s re-authenticates on each and,
before this fix, replaced its shared HTTP client by closing it under the other calls.
The kubelet reports ordinary connection resets on a port-forward's error channel
(containerd#9875): one must fail that stream alone, not every forward of the role."""

from __future__ import annotations

import sys
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from servebook.kube import client as kube_client
from servebook.kube.kr8s_dialer import Kr8sDialer, kr8s_pod_identity
from servebook.kube.portforward import REPORTED_IN_A_ROW, Forwards
from tests.unit.kube_standin import Server, exec_kubeconfig, serve

NS = "ns"


@pytest.fixture
def server() -> Iterator[Server]:
    s = serve()
    yield s
    s.stop()


def test_a_token_that_expires_under_concurrent_calls_is_renewed_once_and_none_fails(
    server: Server, tmp_path: Path
) -> None:
    cfg, runs = exec_kubeconfig(server.standin.url, tmp_path, sys.executable)
    server.standin.life.tokens = {"t1"}
    api = kube_client.connect(str(cfg))
    assert runs.read_text() == "1"
    server.standin.life.tokens = {"t2"}  # t1 expired: the plugin's next run gives t2

    def one(i: int) -> str:
        try:
            kube_client.send(api, "GET", "/api/v1/namespaces", f"listing {i}")
            return "ok"
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(64)))
    assert [r for r in results if r != "ok"] == []
    assert runs.read_text() == "2", "the plugin ran once for the expired token"
    assert kube_client.send(api, "GET", "/api/v1/namespaces", "after").code == 200


class _Engine(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = b"engine " + self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _get(url: str) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as r:
        return bytes(r.read())


def test_one_reset_stream_fails_that_request_alone_not_the_roles_forwards(
    server: Server, tmp_path: Path
) -> None:
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    st = server.standin
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "x-decode-0",
            "namespace": NS,
            "labels": {"app.kubernetes.io/component": "decode"},
        },
        "spec": {"containers": [{"name": "engine", "image": "e"}]},
        "status": {"phase": "Running"},
    }
    server.call(lambda s: s.put(pod))
    st.forward_to["decode:8000"] = ("127.0.0.1", engine.server_address[1])
    st.life.forward_resets["decode"] = 1
    api = kube_client.connect(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        with Forwards(
            Kr8sDialer(api, timeout_s=2), pod_identity=kr8s_pod_identity(api), timeout_s=4
        ) as fw:
            url = fw.open(role="decode", pod="x-decode-0", namespace=NS, remote_port=8000)
            with pytest.raises(OSError):
                _get(url + "/first")  # the reset one
            assert _get(url + "/second") == b"engine /second"
            assert fw.problems() == {} and fw.alive("decode")
            fw.check()
            # Resets on every stream are the Pod's problem: the forward fails then.
            st.life.forward_resets["decode"] = REPORTED_IN_A_ROW
            for _ in range(REPORTED_IN_A_ROW):
                with pytest.raises(OSError):
                    _get(url + "/again")
            assert "connection reset by peer" in fw.problems()["decode"]
    finally:
        engine.shutdown()
