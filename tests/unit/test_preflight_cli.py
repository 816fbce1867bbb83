"""`servebook preflight vllm-pd --set ... --snapshot FILE`: the verdicts the issue names,
through the real command, on snapshots in `kubectl get -o json` shape."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servebook.preflight.probe_pod import ProbeTarget, interpret_events, pod_manifest, probe_targets
from servebook.recipe.resolve import resolve
from tests.conftest import GPU_PD_SETS, CliResult
from tests.unit.conftest import LOCAL_ONLY_RECIPE

Cli = Callable[..., CliResult]
FIX = Path(__file__).parent / "fixtures" / "preflight"
SETS = GPU_PD_SETS


def preflight(cli: Cli, snapshot: str, *extra: str) -> tuple[int, list[dict[str, Any]]]:
    args = ["preflight", "vllm-pd", "--snapshot", str(FIX / snapshot), "--json"]
    for s in [*SETS, *extra]:
        args += ["--set", s]
    r = cli(*args)
    assert r.returncode in (0, 1, 2), r.stderr
    return r.returncode, json.loads(r.stdout)["findings"]


def verdicts(findings: list[dict[str, Any]], check: str) -> dict[str, str]:
    return {
        f["subject"].removeprefix("node/"): f["severity"] for f in findings if f["check"] == check
    }


def test_healthy_cluster_passes_and_says_the_node_probes_did_not_run(cli: Cli) -> None:
    code, found = preflight(cli, "healthy.json")
    assert code == 0, [f for f in found if f["severity"] in ("fail", "error")]
    probe = [f for f in found if f["check"] == "SB259"]
    assert probe[0]["severity"] == "info" and "node probes were not run" in probe[0]["message"]


def test_gpus_held_by_a_pending_pod_in_another_namespace(cli: Cli) -> None:
    code, found = preflight(cli, "pending-other-namespace.json")
    assert code == 1
    assert verdicts(found, "SB254")["gpu-a"] == "fail"
    msg = next(
        f["message"] for f in found if f["check"] == "SB254" and f["subject"] == "node/gpu-a"
    )
    assert "ml-team/llama-finetune-0" in msg


def test_field_notes_pod_in_default_holding_all_eight(cli: Cli) -> None:
    code, found = preflight(cli, "default-namespace-holds-all.json")
    assert code == 1
    msg = next(f["message"] for f in found if f["check"] == "SB254" and f["severity"] == "fail")
    assert "default/vllm-llama-70b" in msg


@pytest.mark.parametrize(
    ("snapshot", "check", "code", "expected"),
    [
        pytest.param(
            "succeeded-pod.json",
            "SB254",
            0,
            {"gpu-a": "pass", "gpu-b": "pass"},
            id="a-succeeded-pod-no-longer-holds-gpus",
        ),
        pytest.param(
            "cordoned.json", "SB252", 1, {"gpu-a": "fail", "gpu-b": "pass"}, id="cordoned-node"
        ),
        # gpu-a: nvidia.com/gpu:NoSchedule, which the GPU recipes tolerate;
        # gpu-b: dedicated=training:NoExecute, which they do not.
        pytest.param(
            "taints.json",
            "SB253",
            1,
            {"gpu-a": "pass", "gpu-b": "fail"},
            id="tolerated-and-untolerated-taints",
        ),
        pytest.param(
            "notready.json", "SB251", 1, {"gpu-a": "fail", "gpu-b": "fail"}, id="notready-node"
        ),
        pytest.param(
            "missing-node.json", "SB250", 1, {"gpu-a": "pass", "gpu-b": "fail"}, id="missing-node"
        ),
    ],
)
def test_each_nodes_verdict_on_a_snapshot(
    cli: Cli, snapshot: str, check: str, code: int, expected: dict[str, str]
) -> None:
    got, found = preflight(cli, snapshot)
    assert got == code
    assert verdicts(found, check) == expected


def test_local_recipe_is_refused_with_exit_2(cli: Cli) -> None:
    r = cli("preflight", LOCAL_ONLY_RECIPE, "--snapshot", str(FIX / "healthy.json"))
    assert r.returncode == 2 and "local backend only" in r.stderr


# --- the probe Pod, as built (nothing here talks to a cluster) -------------------------


def test_probe_pod_is_read_only_pinned_bounded_and_creates_nothing() -> None:
    plan = resolve("vllm-pd", SETS)
    target = probe_targets(plan)[0]
    pod = pod_manifest(target, namespace="servebook", deadline_s=90, script="print()")
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": target.node}
    assert spec["activeDeadlineSeconds"] == 90
    assert spec["restartPolicy"] == "Never"
    (c,) = spec["containers"]
    assert c["securityContext"]["privileged"] is False
    assert all(m["readOnly"] for m in c["volumeMounts"])
    assert [v["hostPath"]["type"] for v in spec["volumes"]] == ["Directory"]


def test_probe_targets_cover_each_node() -> None:
    plan = resolve("vllm-pd", SETS)
    assert sorted(t.node for t in probe_targets(plan)) == ["gpu-a", "gpu-b"]


def test_absent_hostpath_is_reported_as_absent_on_the_node() -> None:
    t = ProbeTarget(node="gpu-b", roles=("decode",), image="img", model_dir="/models/typo")
    event = {
        "reason": "FailedMount",
        "type": "Warning",
        "message": 'MountVolume.SetUp failed for volume "model" : hostPath type check '
        "failed: /models/typo is not a directory",
    }
    f = interpret_events(t, [event])
    assert f is not None and f.check == "SB259" and f.failed
    assert "/models/typo is absent on node gpu-b" in f.message


@pytest.mark.parametrize("events", [[], [{"reason": "Scheduled", "message": "ok"}]])
def test_unexplained_events_leave_the_pod_running(events: list[dict[str, str]]) -> None:
    t = ProbeTarget(node="n", roles=("mixed",), image="img", model_dir="/m")
    assert interpret_events(t, events) is None


def test_a_recipe_that_makes_its_model_in_the_pod_needs_no_node_probe() -> None:
    """tiny-pd on a cluster: each engine Pod generates the model, so the probe must not
    look for this machine's model directory on the node (it is not there, and need not
    be)."""
    plan = resolve("tiny-pd", ["image=vllm/vllm-openai-cpu:v0.32.0-x86_64", "node=kind-1"])
    assert all(r.placement.node == "kind-1" and r.model_path for r in plan.engine_roles)
    assert probe_targets(plan) == []


def test_a_role_on_several_nodes_is_probed_on_each() -> None:
    """Two prefill replicas on gpu-a and gpu-b, a decode group over gpu-c..gpu-e: the
    weights must be on every one of those nodes, so each gets a probe."""
    values = Path(__file__).parent / "fixtures" / "render" / "vllm-pd-wide-ep-replicas"
    plan = resolve("vllm-pd-wide-ep", [], [values / "values.yaml"])
    assert sorted(t.node for t in probe_targets(plan)) == [
        "gpu-a",
        "gpu-b",
        "gpu-c",
        "gpu-d",
        "gpu-e",
    ]
