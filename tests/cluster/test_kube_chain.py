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
from pathlib import Path

import pytest

from servebook.backends import kubernetes as kube
from servebook.recipe.resolve import resolve
from tests.cluster.conftest import UP_S, mixed_sets, sb, set_values

pytestmark = pytest.mark.cluster


def test_run_tiny_pd_on_the_cluster_is_the_whole_chain(where: list[str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = sb(
        "run", "tiny-pd", "--backend", "kubernetes", *where, "--name", "chain", "-o", str(out),
        "--max-repetitions", "3",  # the chain, not the precision, is what this test is about
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
    plan = resolve("tiny-pd", set_values(where), [])
    # The Pods' arguments (cluster_args), not the local backend's: on the test plane the
    # test changed only the latter and the handoff worked. A directory inside the shared
    # mount, so no Pod writes outside its volumes.
    args = plan.role("decode").cluster_args
    i = args.index("--kv-transfer-config") + 1
    cfg = json.loads(args[i])
    cfg["kv_connector_extra_config"]["shared_storage_path"] += "/elsewhere"
    args[i] = json.dumps(cfg)
    kube.up(plan, name="failopen", timeout_s=UP_S)
    r = sb("verify", "failopen", "--json", timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    bad = [f for f in json.loads(r.stdout)["findings"] if f["severity"] == "fail"]
    assert [(f["check"], f["subject"]) for f in bad if f["check"] == "SB302"] == [
        ("SB302", "decode")
    ], bad


def test_a_reup_after_a_change_waits_for_the_new_pod(where: list[str]) -> None:
    up = ["up", "tiny-mixed", "--backend", "kubernetes", *mixed_sets(where), "--name", "reup"]
    assert sb(*up, timeout=UP_S).returncode == 0
    before = json.loads(sb("status", "reup", "--json", timeout=120).stdout)
    r = sb(*up, "--set", "max_model_len=1024", timeout=UP_S)
    assert r.returncode == 0, r.stderr
    after = json.loads(sb("status", "reup", "--json", timeout=120).stdout)
    (old,), (new,) = before["roles"], after["roles"]
    assert new["pod"] != old["pod"] and new["ready"] and new["restarts_since_apply"] == 0


def test_two_deployments_of_one_recipe_in_one_namespace_and_down_removes_one(
    where: list[str],
) -> None:
    for name in ("a", "b"):
        up = [
            "up",
            "tiny-mixed",
            "--backend",
            "kubernetes",
            *mixed_sets(where),
            "--name",
            name,
        ]
        r = sb(*up, timeout=UP_S)
        assert r.returncode == 0, r.stderr
    d = sb("down", "a", timeout=600)
    assert d.returncode == 0, d.stderr
    assert sb("status", "b", timeout=120).returncode == 0
    assert sb("verify", "b", timeout=600).returncode == 0
    assert sb("status", "a", timeout=120).returncode == 2
