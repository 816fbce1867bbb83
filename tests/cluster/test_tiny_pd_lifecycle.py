"""tiny-pd's whole life on a real control plane (issue 31), in one deployment, since each
bring-up costs minutes on 2 cores: `servebook run --keep` (preflight, up, verify, the sweep
in a load Job beside the servers, report), then `status`, `verify` and `bench` through
port-forwards by name, a re-up with a change (new Pods, waited for), and `down`.  (An `up`
of the same name straight after its deployment was taken down is the experiment's
`--resume` after a Ctrl-C, tests/cluster/test_experiment_on_plane.py.)

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
    *(
        "--concurrency",
        "2",
        "--repetitions",
        "1",
        "--precision",
        "off",
        "--duration",
        "8s",
        "--warmup",
        "2s",
    ),
    *("--input-len", "512", "--output-len", "16"),
    *("--min-achieved-concurrency", "0.3", "--max-client-lag-ms", "5000"),
]


def _bench(out: Path, *extra: str) -> dict[str, Any]:
    r = sb("bench", "lifecycle", *LOAD, *extra, "-o", str(out), timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return results


def _roles(name: str) -> dict[str, dict[str, Any]]:
    status = json.loads(sb("status", name, "--json", timeout=120).stdout)
    return {role["name"]: role for role in status["roles"]}


@pytest.mark.timeout(2400)  # several bring-ups of two vLLM engines on a shared 2-core machine
def test_run_keep_status_verify_bench_reup_and_down(where: list[str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = sb(
        "run", "tiny-pd", "--backend", "kubernetes", *where, "--name", "lifecycle",
        "-o", str(out), "--keep",
        "--max-repetitions", "3",  # the chain, not the precision, is what this test is about
        timeout=UP_S + 900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / "report.html").is_file() and (out / "results.json").is_file()
    results = json.loads((out / "results.json").read_text())
    assert results["provenance"]["target"]["backend"] == "kubernetes"
    load = results["provenance"]["load"]
    assert load["route"] == "cluster-service" and load["job"], load
    assert all(p["server"].get("handoff_share") for p in results["points"])
    assert "down:" not in r.stdout  # --keep
    assert "SB263" in r.stdout and "SB264" in r.stdout  # preflight ran live first

    roles = _roles("lifecycle")
    assert {n: role["ready"] for n, role in roles.items()} == {
        "prefill": True,
        "decode": True,
        "router": True,
    }, roles

    r = sb("verify", "lifecycle", "--json", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    handoff = [f for f in json.loads(r.stdout)["findings"] if f["check"] == "SB302"]
    assert {f["subject"]: f["severity"] for f in handoff}["decode"] == "pass", handoff

    # Another seed than run's: the same prompts again would be served from the prefix cache.
    forwarded = _bench(tmp_path / "forwarded", "--via", "port-forward", "--seed", "2")
    assert forwarded["provenance"]["load"]["route"] == "port-forward"
    (point,) = forwarded["points"]
    assert point["valid"] and point["server"]["handoff_share"] > 0.5, point
    # No model directory on this machine for a cluster deployment: the server tokenized,
    # through its forward; and the command lines are the Pods', as applied.
    workload = forwarded["provenance"]["workload"]
    assert workload["tokenizer"].startswith("server /tokenize at http://127.0.0.1"), workload
    assert point["prompt_tokens_mismatch"] == 0, point
    decode = next(r for r in forwarded["provenance"]["roles"] if r["name"] == "decode")
    assert any("/models/model" in a for a in decode["command"]), decode["command"]

    # A re-up after a change waits for the new Pods, and status shows them.
    up = ["up", "tiny-pd", "--backend", "kubernetes", *where, "--name", "lifecycle"]
    r = sb(*up, "--set", "max_model_len=1024", timeout=UP_S)
    assert r.returncode == 0, r.stdout + r.stderr
    after = _roles("lifecycle")
    for role in ("prefill", "decode"):
        old, new = roles[role], after[role]
        assert new["pod"] != old["pod"] and new["ready"], (old, new)
        assert new["restarts_since_apply"] == 0, new

    down = sb("down", "lifecycle", timeout=600)
    assert down.returncode == 0, down.stdout + down.stderr
    assert sb("status", "lifecycle", timeout=120).returncode == 2
