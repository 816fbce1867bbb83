"""tiny-pd's whole life on a real control plane (issue 31): `up`, `status`, `verify`, `bench`
in the cluster and through port-forwards, `down`, and `up` again straight after `down`.

On the test plane the prefill and decode engines are real vLLM CPU servers in Pods of their
own (own network namespaces, the node directory they share for ExampleConnector's KV), the
router is vllm-router, the Deployments, ReplicaSets, Jobs and scheduling are Kubernetes'
own, and every request from this machine goes through the API server's port-forward.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import UP_S, sb

pytestmark = pytest.mark.cluster

# A CPU engine on a shared 2-core machine: the verdicts on the client are not what this is
# about, the handoff per point and the route are.
LOAD = [
    *("--concurrency", "2", "--repetitions", "1", "--duration", "8s", "--warmup", "2s"),
    *("--input-len", "512", "--output-len", "16"),
    *("--min-achieved-concurrency", "0.3", "--max-client-lag-ms", "5000"),
]


def _bench(out: Path, *extra: str) -> dict[str, Any]:
    r = sb("bench", "lifecycle", *LOAD, *extra, "-o", str(out), timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return results


def test_up_status_verify_bench_down_and_up_again(where: list[str], tmp_path: Path) -> None:
    up = ["up", "tiny-pd", "--backend", "kubernetes", *where, "--name", "lifecycle"]
    r = sb(*up, timeout=UP_S)
    assert r.returncode == 0, r.stdout + r.stderr

    status = json.loads(sb("status", "lifecycle", "--json", timeout=120).stdout)
    assert {role["name"]: role["ready"] for role in status["roles"]} == {
        "prefill": True,
        "decode": True,
        "router": True,
    }, status

    r = sb("verify", "lifecycle", "--json", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    handoff = [f for f in json.loads(r.stdout)["findings"] if f["check"] == "SB302"]
    assert {f["subject"]: f["severity"] for f in handoff}["decode"] == "pass", handoff

    inside = _bench(tmp_path / "in-cluster", "--seed", "1")
    load = inside["provenance"]["load"]
    assert load["route"] == "cluster-service" and load["job"], load
    (point,) = inside["points"]
    assert point["valid"] and point["server"]["handoff_share"] > 0.5, point

    # Another seed: the same prompts again would be served from decode's prefix cache.
    forwarded = _bench(tmp_path / "forwarded", "--via", "port-forward", "--seed", "2")
    assert forwarded["provenance"]["load"]["route"] == "port-forward"
    (point,) = forwarded["points"]
    assert point["valid"] and point["server"]["handoff_share"] > 0.5, point

    down = sb("down", "lifecycle", timeout=600)
    assert down.returncode == 0, down.stdout + down.stderr
    again = sb(*up, timeout=UP_S)  # at once: down waited until its objects were gone
    assert again.returncode == 0, again.stdout + again.stderr
    assert sb("verify", "lifecycle", timeout=600).returncode == 0
    assert sb("down", "lifecycle", timeout=600).returncode == 0
    assert sb("status", "lifecycle", timeout=120).returncode == 2
