"""kube/client.py over real HTTP against the stand-in API server: the kubeconfig and
context given are the ones used, and a failed request is exit 2 naming the request."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from servebook.findings import EXIT_UNUSABLE
from servebook.kube.client import ClusterUnreachable, RequestFailed, call, connect, server_of
from tests.unit.kube_standin import Server, serve


@pytest.fixture
def server() -> Iterator[Server]:
    s = serve()
    try:
        yield s
    finally:
        s.stop()


def test_the_kubeconfig_given_beats_kubeconfig_in_the_environment(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    cfg = server.write_kubeconfig(tmp_path / "kubeconfig")
    api = connect(str(cfg), request_timeout_s=5, connect_timeout_s=5)
    assert server_of(api) == f"cluster {server.standin.url} (context c)"


def test_an_unknown_context_is_unreachable_naming_it(server: Server, tmp_path: Path) -> None:
    cfg = server.write_kubeconfig(tmp_path / "kubeconfig")
    with pytest.raises(ClusterUnreachable, match="nope") as e:
        connect(str(cfg), "nope", connect_timeout_s=5)
    assert e.value.exit_code == EXIT_UNUSABLE


def test_a_refused_request_names_the_request_and_carries_its_code(
    server: Server, tmp_path: Path
) -> None:
    api = connect(str(server.write_kubeconfig(tmp_path / "kubeconfig")), connect_timeout_s=5)
    assert call(api, "GET", "/api/v1/namespaces/x", "reading x", missing_ok=True) is None
    server.standin.forbidden.append(("GET", "/api/v1/namespaces/y"))
    with pytest.raises(RequestFailed) as e:
        call(api, "GET", "/api/v1/namespaces/y", "reading namespace y")
    assert e.value.code == 403 and e.value.request == "GET /api/v1/namespaces/y"
    assert str(e.value).startswith("the API server refused reading namespace y (403 Forbidden")
    assert "GET /api/v1/namespaces/y" in str(e.value)
    assert e.value.exit_code == EXIT_UNUSABLE


def test_a_release_newer_than_kr8s_lists_prints_no_warning(server: Server, tmp_path: Path) -> None:
    """The test plane runs Kubernetes v1.37: kr8s 0.20.15 warned "Kubernetes version
    v1.37.2 is not supported" on the terminal of every command that reached it."""
    server.standin.minor = 37
    cfg = server.write_kubeconfig(tmp_path / "kubeconfig")
    r = subprocess.run(
        [sys.executable, "-m", "servebook", "status", "--backend", "kubernetes", "-n", "x"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "KUBECONFIG": str(cfg)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "not supported" not in r.stderr, r.stderr
