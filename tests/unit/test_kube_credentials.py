"""A reset among a role's port-forward streams, on the stand-in API server (issue 23 point
6): the kubelet reports ordinary connection resets on a port-forward's error channel
(containerd#9875); one must fail that stream alone, not every forward of the role.

Credentials that expire under many calls in flight (issue 23 point 7) run on the test plane:
tests/cluster/test_cluster_faults.py."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from servebook.kube import client as kube_client
from servebook.kube.kr8s_dialer import Kr8sDialer, kr8s_pod_identity
from servebook.kube.portforward import REPORTED_IN_A_ROW, Forwards
from tests.unit.kube_standin import Server, serve

NS = "ns"


@pytest.fixture
def server() -> Iterator[Server]:
    s = serve()
    yield s
    s.stop()


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
