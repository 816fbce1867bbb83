"""The whole chain on a real cluster (skipped without one, and without an image to run).

Needs a CPU cluster (kind or k3s will do) in KUBECONFIG and vLLM's CPU image named by
SERVEBOOK_TEST_IMAGE (e.g. vllm/vllm-openai-cpu:v0.32.0-x86_64), which every node can pull.
Each test brings up the tiny recipes on the first Ready node, in a namespace of its own,
and takes everything down again:

* `servebook run tiny-pd --backend kubernetes`: preflight, up, verify, bench and report,
  then down, exit 0;
* a handoff that fails open (decode reads KV from another directory) is caught by verify
  through its port-forwards (SB302 names decode);
* a re-up after a change waits for the new Pod, and status shows it;
* two deployments of one recipe in one namespace: `down a` leaves `b` serving.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servebook.backends import kubernetes as kube
from servebook.kube.snapshot import ClusterSnapshot
from servebook.recipe.resolve import resolve

pytestmark = pytest.mark.cluster

UP_S = 1800  # pulling a multi-GB image on a laptop cluster is most of it


@pytest.fixture
def where(live: ClusterSnapshot, image: str) -> Iterator[list[str]]:
    """--set arguments for tiny-pd on this cluster, in a namespace of its own (tiny-mixed
    takes the same but `node`); afterwards nothing labelled by servebook is left there."""
    ready = [
        n
        for n, node in sorted(live.nodes.items())
        if any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in node.get("status", {}).get("conditions", [])
        )
    ]
    assert ready, "the cluster has no Ready node"
    ns = f"sb-chain-{int(time.time())}"
    yield [
        a for s in (f"image={image}", f"node={ready[0]}", f"namespace={ns}") for a in ("--set", s)
    ]
    left = _sb("status", "--backend", "kubernetes", "-n", ns, "--json", timeout=120)
    for found in json.loads(left.stdout or "[]"):
        _sb("down", found["name"], "--backend", "kubernetes", "-n", ns, timeout=600)


def _sb(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servebook", *args], capture_output=True, text=True, timeout=timeout
    )


def _sets(where: list[str]) -> list[str]:
    return [where[i + 1] for i in range(0, len(where), 2)]


def _mixed(where: list[str]) -> list[str]:
    """tiny-mixed's --set arguments: tiny-pd's without `node` (one Pod, no shared KV)."""
    return where[:-2]


def test_run_tiny_pd_on_the_cluster_is_the_whole_chain(where: list[str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = _sb(
        "run", "tiny-pd", "--backend", "kubernetes", *where, "--name", "chain", "-o", str(out),
        timeout=UP_S + 900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / "report.html").is_file() and (out / "results.json").is_file()
    results = json.loads((out / "results.json").read_text())
    assert results["provenance"]["target"]["backend"] == "kubernetes"
    assert all(p["server"].get("handoff_share") for p in results["points"])
    assert "down:" in r.stdout


def test_a_handoff_that_fails_open_is_caught_by_verify_through_the_forwards(
    where: list[str],
) -> None:
    plan = resolve("tiny-pd", _sets(where), [])
    decode = plan.role("decode")
    i = decode.args.index("--kv-transfer-config") + 1
    cfg = json.loads(decode.args[i])
    cfg["kv_connector_extra_config"]["shared_storage_path"] += "-elsewhere"
    decode.args[i] = json.dumps(cfg)
    kube.up(plan, name="failopen", timeout_s=UP_S)
    r = _sb("verify", "failopen", "--json", timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    bad = [f for f in json.loads(r.stdout)["findings"] if f["severity"] == "fail"]
    assert [(f["check"], f["subject"]) for f in bad if f["check"] == "SB302"] == [
        ("SB302", "decode")
    ], bad


def test_a_reup_after_a_change_waits_for_the_new_pod(where: list[str]) -> None:
    up = ["up", "tiny-mixed", "--backend", "kubernetes", *_mixed(where), "--name", "reup"]
    assert _sb(*up, timeout=UP_S).returncode == 0
    before = json.loads(_sb("status", "reup", "--json", timeout=120).stdout)
    r = _sb(*up, "--set", "max_model_len=1024", timeout=UP_S)
    assert r.returncode == 0, r.stderr
    after = json.loads(_sb("status", "reup", "--json", timeout=120).stdout)
    (old,), (new,) = before["roles"], after["roles"]
    assert new["pod"] != old["pod"] and new["ready"] and new["restarts_since_apply"] == 0


def test_two_deployments_of_one_recipe_in_one_namespace_and_down_removes_one(
    where: list[str],
) -> None:
    for name in ("a", "b"):
        up = ["up", "tiny-mixed", "--backend", "kubernetes", *_mixed(where), "--name", name]
        r = _sb(*up, timeout=UP_S)
        assert r.returncode == 0, r.stderr
    d = _sb("down", "a", timeout=600)
    assert d.returncode == 0, d.stderr
    assert _sb("status", "b", timeout=120).returncode == 0
    assert _sb("verify", "b", timeout=600).returncode == 0
    assert _sb("status", "a", timeout=120).returncode == 2
