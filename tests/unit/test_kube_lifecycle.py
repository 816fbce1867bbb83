"""What a real API server does over time, as the stand-in does it, where the test plane
cannot show it: LeaderWorkerSet's status in releases before v0.9.0 (issue 23 point 1), a
CRD not installed (point 12), the kubelet's passing FailedMount (point 4).  Pods through
their phases, LeaderWorkerSet v0.9.0's own status, foreground deletion, Terminating
namespaces and `up` waiting for one (point 2), paged lists, an unserved group and Pod
Security's refusal of a Deployment's and a LeaderWorkerSet's Pods run on the plane
(tests/cluster/test_scenarios.py, test_lws.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from servebook.backends.kubernetes import deployer as kube
from servebook.errors import UsageError
from servebook.kube import client as kube_client
from servebook.recipe.resolve import resolve
from tests.unit.kube_standin import Server, serve

Obj = dict[str, Any]
FIX = Path(__file__).parent / "fixtures" / "render"
VALUES = FIX / "vllm-pd" / "values.yaml"
WIDE = FIX / "vllm-pd-wide-ep-replicas" / "values.yaml"


@pytest.fixture
def server(tmp_path: Path, sb_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    s = serve()
    monkeypatch.setenv("KUBECONFIG", str(s.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setattr(kube, "POLL_S", 0.05)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def api(server: Server) -> Any:
    return kube_client.connect()


def _until(what: str, check: Callable[[], Any], within_s: float = 20.0) -> Any:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"not within {within_s} s: {what}")


def _get(api: Any, path: str) -> Obj | None:
    return kube_client.call(api, "GET", path, "reading", missing_ok=True)


@pytest.mark.parametrize("version", ["v0.7.0", "v0.8.1", "v0.9.0"])
def test_a_leaderworkerset_gets_its_groups_and_the_status_its_version_writes(
    server: Server, api: Any, version: str
) -> None:
    server.standin.ready_pods = True
    server.standin.life.lws_version = version
    plan = resolve("vllm-pd-wide-ep", [], [WIDE])
    dep = kube.apply_deployment(api, plan, "wide")
    lws_name = dep.roles["decode"]
    path = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{dep.namespace}/leaderworkersets/"
    lws = _until("the LWS ready", lambda: (_get(api, path + lws_name) or {}).get("status"))
    assert lws["readyReplicas"] == lws["updatedReplicas"] == lws["replicas"] == 1
    conditions = {c["type"]: c["status"] for c in lws["conditions"]}
    assert conditions == {"Available": "True", "Progressing": "False"}
    assert ("observedGeneration" in lws) == (version == "v0.9.0")


# --- the defects they showed -----------------------------------------------------------------


@pytest.mark.parametrize("version", ["v0.7.0", "v0.8.1"])
def test_a_leaderworkerset_role_becomes_ready_on_lws_before_observed_generation(
    server: Server, version: str
) -> None:
    """Issue 23 point 1: LWS before v0.9.0 writes no observedGeneration."""
    server.standin.ready_pods = True
    server.standin.life.lws_version = version
    plan = resolve("vllm-pd-wide-ep", [], [WIDE])
    dep = kube.up(plan, name="wide", timeout_s=20, poll_s=0.05)
    assert dep.ready


def test_an_apply_of_a_kind_the_cluster_does_not_serve_names_the_crd_to_install(
    server: Server, api: Any
) -> None:
    """Issue 23 point 12: the plain-text 404 of a CRD not installed."""
    server.standin.serves_lws = False
    plan = resolve("vllm-pd-wide-ep", [], [WIDE])
    with pytest.raises(UsageError) as e:
        kube.apply_deployment(api, plan, "wide")
    text = str(e.value)
    assert "does not serve leaderworkerset.x-k8s.io/v1 leaderworkersets" in text, text
    assert "Install LeaderWorkerSet's CRD and controller" in text
    assert "the cluster request failed" not in text
    assert [r for r in server.standin.requests if r.method == "PATCH"] == []  # nothing applied


# The kubelet's passing mount error (kubernetes#105204), as it words it.
ROOT_CA = (
    'MountVolume.SetUp failed for volume "kube-api-access-2kx5l" : '
    '[object "moe-pd"/"kube-root-ca.crt" not registered]'
)


def test_a_passing_failed_mount_does_not_fail_a_ready_pods_role(server: Server) -> None:
    """Issue 23 point 4: every Pod gets the kubelet's transient FailedMount, then runs."""
    server.standin.ready_pods = True
    server.standin.life.pod_events = [("FailedMount", ROOT_CA)]
    plan = resolve("vllm-pd", [], [VALUES])
    assert kube.up(plan, name="one", timeout_s=20, poll_s=0.05).ready
