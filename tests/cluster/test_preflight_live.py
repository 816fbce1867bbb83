"""Live `servebook preflight` against the real API server's answers (issue 31).

* A namespace that enforces Pod Security baseline: the GPU PD recipe's engine Pods mount
  hostPath volumes, which baseline forbids, and preflight says so before anything is
  applied (SB265), as the API server's own admission would refuse them.
* A Pod of another team, in another namespace, holding all eight GPUs of the target node:
  preflight counts it (SB254) and names it, as the scheduler would keep the engine Pending.

On the test plane the GPUs are the nodes' advertised `nvidia.com/gpu`, and the holding Pod is
a real Pod the scheduler bound and the node agent runs (a `sleep`).
"""

from __future__ import annotations

import json

import pytest

from tests.cluster.conftest import kubectl, sb
from tests.conftest import GPU_PD_SETS

pytestmark = pytest.mark.cluster

# The plane's nodes in place of the unit fixtures' gpu-a and gpu-b.
GPU_PD = [s.replace("gpu-a", "gpu-0").replace("gpu-b", "gpu-1") for s in GPU_PD_SETS]


def _preflight(ns: str) -> list[dict[str, object]]:
    """preflight's findings; it fails (exit 1): /models/llama is on no node of the plane."""
    sets = [a for s in (*GPU_PD, f"namespace={ns}") for a in ("--set", s)]
    r = sb("preflight", "vllm-pd", "--json", "--probe-deadline", "60", *sets, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    findings: list[dict[str, object]] = json.loads(r.stdout)["findings"]
    return findings


@pytest.fixture
def namespace(tenant_ns: str) -> str:
    """A namespace the tenant was given (preflight runs as the tenant)."""
    return tenant_ns


def test_a_namespace_enforcing_baseline_fails_before_the_apply(namespace: str) -> None:
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline")
    findings = _preflight(namespace)
    (security,) = [f for f in findings if f["check"] == "SB265"]
    assert security["severity"] == "fail", security
    assert "hostPath volumes" in str(security["message"]), security
    # The probe Pods are refused there too (a real API server's PodSecurity; preflight ended
    # with exit 2 and no verdicts before): each node's probe fails, naming the refusal.
    probes = [f for f in findings if "refused the probe Pod" in str(f["message"])]
    assert {f["subject"] for f in probes} == {"gpu-0", "gpu-1"}, findings
    assert all(f["severity"] == "fail" and "PodSecurity" in str(f["message"]) for f in probes)


@pytest.mark.admin(
    "what other teams' Pods hold of a node's GPUs is read from every namespace's Pods and "
    "the nodes, which a tenant may not list: its preflight says so (SB250 not checked)"
)
def test_a_pod_in_another_namespace_holding_every_gpu_of_the_node_fails(namespace: str) -> None:
    holder = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "all-the-gpus", "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "gpu-0"},
            "containers": [
                {
                    "name": "hold",
                    "image": "busybox:1.36",
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        },
    }
    kubectl("apply", "-f", "-", stdin=json.dumps(holder))
    kubectl("wait", "--for=condition=Ready", "pod/all-the-gpus", "-n", namespace, "--timeout=120s")
    findings = _preflight(f"{namespace}-engines")
    verdicts = {f["subject"]: f for f in findings if f["check"] == "SB254"}
    assert verdicts["node/gpu-0"]["severity"] == "fail", verdicts
    assert "held by " + namespace + "/all-the-gpus: 8 (Running)" in str(
        verdicts["node/gpu-0"]["message"]
    ), verdicts
    assert verdicts["node/gpu-1"]["severity"] == "pass", verdicts
