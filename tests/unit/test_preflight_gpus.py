"""The GPU checks of preflight on snapshots shaped like real clusters: MIG slices
advertised as GPUs (SB260), free RDMA devices (SB261), weights that fit the GPUs (SB262);
and what the access review and the dry run ask and conclude (SB263, SB264), pure."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from servebook.errors import UsageError
from servebook.findings import Finding, Severity
from servebook.kube.snapshot import load_snapshot
from servebook.preflight.admission import (
    Access,
    DryRun,
    dry_run_finding,
    pods_of,
    required_access,
)
from servebook.preflight.cluster import check_cluster
from servebook.preflight.requirements import ClusterRequirements, NodeAsk
from servebook.preflight.weights_fit import (
    Parallelism,
    RoleWeights,
    WeightsSize,
    check_weights_fit,
    parallelism,
    parse_size,
    weights_size,
)
from tests.conftest import CliResult

Cli = Callable[..., CliResult]
FIX = Path(__file__).parent / "fixtures" / "preflight"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
DEEPSEEK_R1_FP8_BYTES = 688_586_727_753  # its model.safetensors.index.json total_size
KIMI_K2_FP8_BYTES = 1_029_174_409_216


def pd(**kw: Any) -> ClusterRequirements:
    return ClusterRequirements(
        nodes=(
            NodeAsk("gpu-a", ("prefill",), 8, tolerations=(GPU_TOLERATION,), **kw),
            NodeAsk("gpu-b", ("decode",), 8, tolerations=(GPU_TOLERATION,), **kw),
        )
    )


def only(findings: Sequence[Finding], check: str) -> dict[str, Finding]:
    return {f.subject: f for f in findings if f.check == check}


# --- SB260: MIG ----------------------------------------------------------------------------


def test_mig_single_with_mig_on_advertises_slices_as_gpus_and_fails() -> None:
    found = only(check_cluster(load_snapshot(FIX / "mig-single-enabled.json"), pd()), "SB260")
    assert found["node/gpu-a"].severity is Severity.FAIL
    assert found["node/gpu-b"].severity is Severity.PASS
    msg = found["node/gpu-a"].message
    assert "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb" in msg and "56 slices of 9856 MiB each" in msg
    assert "nvidia.com/mig.config=all-disabled" in found["node/gpu-a"].hint


def test_mig_single_label_with_mig_off_is_whole_gpus() -> None:
    # The GPU operator labels every node `single` by default: the label alone is no fault.
    found = only(check_cluster(load_snapshot(FIX / "healthy.json"), pd()), "SB260")
    assert {s: f.severity for s, f in found.items()} == {
        "node/gpu-a": Severity.PASS,
        "node/gpu-b": Severity.PASS,
    }
    assert "are whole GPUs (NVIDIA-H100-80GB-HBM3, MIG strategy single)" in (
        found["node/gpu-a"].message
    )


# --- SB261: free RDMA devices --------------------------------------------------------------


def test_rdma_devices_held_by_another_teams_pending_pod_fail() -> None:
    req = pd(rdma_resource="rdma/ib_sriov", rdma_devices=8)
    found = check_cluster(load_snapshot(FIX / "rdma-held.json"), req)
    free = only(found, "SB261")
    assert {s: f.severity for s, f in free.items()} == {
        "node/gpu-a": Severity.PASS,
        "node/gpu-b": Severity.FAIL,
    }
    msg = free["node/gpu-b"].message
    assert "0 of 8 rdma/ib_sriov free on node gpu-b, role decode needs 8" in msg
    assert "net-team/ib-write-bw-server: 8 (Pending (ContainerCreating))" in msg
    # Its GPUs are free all the same: only the RDMA check sees it.
    assert only(found, "SB254")["node/gpu-b"].severity is Severity.PASS
    assert only(found, "SB255")["node/gpu-b"].severity is Severity.PASS


def test_rdma_free_passes_on_a_shared_device_pool() -> None:
    found = check_cluster(load_snapshot(FIX / "healthy.json"), pd(rdma_resource="rdma/ib"))
    free = only(found, "SB261")
    assert free["node/gpu-a"].severity is Severity.PASS
    assert free["node/gpu-a"].evidence["allocatable"] == 1000


# --- SB262: weights fit --------------------------------------------------------------------


def fit(
    fixture: str, size: int | None, args: Sequence[str] = ("--tensor-parallel-size", "8")
) -> Finding:
    snap = load_snapshot(FIX / fixture)
    ask = NodeAsk("gpu-a", ("prefill",), 8)
    ws = WeightsSize(size, "test") if size is not None else None
    return check_weights_fit(snap.nodes, RoleWeights("prefill", ask, 8, parallelism(args), ws))


def test_deepseek_r1_fp8_fits_eight_h200s() -> None:
    f = fit("h200.json", DEEPSEEK_R1_FP8_BYTES)
    assert f.severity is Severity.PASS, f.message
    assert "80.2 GiB per GPU" in f.message
    assert "140.4 GiB each (nvidia.com/gpu.memory=143771 MiB, NVIDIA-H200)" in f.message
    assert f.evidence["shards"] == 8


def test_kimi_k2_fp8_does_not_fit_eight_h100s() -> None:
    f = fit("healthy.json", KIMI_K2_FP8_BYTES)
    assert f.severity is Severity.FAIL
    assert "do not fit" in f.message and "short per GPU" in f.message
    # ... but fits over two nodes' worth with pipeline parallelism.
    two = fit("h200.json", KIMI_K2_FP8_BYTES, ("-tp", "8", "-pp", "2"))
    assert two.severity is Severity.PASS and "TP 8 x PP 2" in two.message


def test_weights_that_leave_no_room_for_the_kv_cache_warn() -> None:
    # 8 x H100 at 0.9: 71.7 GiB each; 560 GiB of weights leaves 1.7 GiB (2%).
    f = fit("healthy.json", 560 * 2**30)
    assert f.severity is Severity.WARN
    assert "barely fit" in f.message


def test_weights_fit_says_when_it_cannot_decide() -> None:
    assert fit("healthy.json", None).severity is Severity.INFO
    amd = load_snapshot(FIX / "amd.json")
    f = check_weights_fit(
        amd.nodes,
        RoleWeights(
            "mixed", NodeAsk("mi300-1", ("mixed",), 8), 8, Parallelism(8), WeightsSize(1, "t")
        ),
    )
    assert f.severity is Severity.INFO and "no nvidia.com/gpu.memory label" in f.message


def test_parallelism_reads_vllms_spellings() -> None:
    p = parallelism(
        [
            "--tensor-parallel-size=8",
            "-dp",
            "2",
            "--enable-expert-parallel",
            "--gpu-memory-utilization",
            "0.85",
        ]
    )
    assert (p.tensor, p.pipeline, p.data, p.expert, p.shards) == (8, 1, 2, True, 16)
    assert p.gpu_memory_utilization == 0.85


@pytest.mark.parametrize(
    ("text", "size"),
    [("640Gi", 640 * 2**30), ("1.03TB", 1_030_000_000_000), ("688G", 688 * 10**9), ("123", 123)],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_weights_size_from_a_model_directorys_index(tmp_path: Path) -> None:
    index = {
        "metadata": {"total_size": DEEPSEEK_R1_FP8_BYTES},
        "weight_map": {"model.embed_tokens.weight": "model-00001-of-000163.safetensors"},
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    got = weights_size(str(tmp_path))
    assert got.bytes == DEEPSEEK_R1_FP8_BYTES
    assert "metadata.total_size" in got.source
    with pytest.raises(UsageError, match="neither a size"):
        weights_size(str(tmp_path / "absent"))


def test_cli_snapshot_with_weights_says_whether_they_fit(cli: Cli) -> None:
    sets = [
        "image=vllm/vllm-openai:v0.11.0",
        "prefill_node=gpu-a",
        "decode_node=gpu-b",
        "prefill_model_dir=/models/m",
        "decode_model_dir=/models/m",
        # No RDMA on these fixture clusters: PD over TCP, stated and acknowledged.
        "fabric=tcp",
        "allow_tcp_kv=true",
    ]

    def run(snapshot: str, weights: str) -> tuple[int, list[dict[str, Any]]]:
        args = ["preflight", "vllm-pd", "--snapshot", str(FIX / snapshot), "--json"]
        args += ["--weights", weights]
        for s in sets:
            args += ["--set", s]
        r = cli(*args)
        return r.returncode, json.loads(r.stdout)["findings"]

    code, found = run("h200.json", str(DEEPSEEK_R1_FP8_BYTES))
    assert code == 0
    assert {f["severity"] for f in found if f["check"] == "SB262"} == {"pass"}
    code, found = run("healthy.json", str(KIMI_K2_FP8_BYTES))
    assert code == 1
    assert all("do not fit" in f["message"] for f in found if f["check"] == "SB262")


# --- SB263 and SB264, pure -----------------------------------------------------------------


def _objects() -> list[dict[str, Any]]:
    from servebook.kube.manifests import render
    from servebook.recipe.resolve import resolve

    return render(
        resolve(
            "vllm-pd",
            [
                "image=i:1",
                "prefill_node=a",
                "decode_node=b",
                "prefill_model_dir=/m",
                "decode_model_dir=/m",
                # No RDMA on these fixture clusters: PD over TCP, stated and acknowledged.
                "fabric=tcp",
                "allow_tcp_kv=true",
            ],
            [],
        )
    )


def test_required_access_covers_what_up_and_down_use() -> None:
    asked = {a.text() for a in required_access(_objects(), "servebook", namespace_exists=True)}
    for verb in ("get", "list", "create", "patch", "delete"):
        assert f"{verb} deployments.apps" in asked and f"{verb} services" in asked
    assert {"create pods/portforward", "get pods/log", "list replicasets.apps"} <= asked
    # An existing namespace is used as it is, even by a tenant who may not read it.
    assert not any("namespaces" in a for a in asked)
    absent = required_access(_objects(), "servebook", namespace_exists=False)
    assert Access("create", "namespaces") in absent
    # Requests on a Namespace are judged in that namespace (a Role in it may allow them).
    assert Access("delete", "namespaces", namespace="servebook") in absent
    # What bench's load Job needs, asked by preflight on its behalf.
    loaded = {a.text() for a in required_access(_objects(), "servebook", True, load=True)}
    assert {"create jobs.batch", "delete jobs.batch", "create secrets"} <= loaded - asked


def test_pods_of_a_deployment_keep_its_template() -> None:
    dep = next(o for o in _objects() if o["kind"] == "Deployment")
    ((owner, pod),) = pods_of(dep)
    assert owner == dep["metadata"]["name"]
    assert pod["spec"] == dep["spec"]["template"]["spec"]
    assert pod["metadata"]["namespace"] == dep["metadata"]["namespace"]


def test_dry_run_without_rights_to_create_pods_says_what_went_unchecked() -> None:
    denied = DryRun(
        "Pod/x-servebook-dry-run",
        "POST /api/v1/namespaces/s/pods?dryRun=All",
        403,
        message='pods is forbidden: User "dev" cannot create resource "pods" in API group "" '
        'in the namespace "s"',
        reason="Forbidden",
        pod_of="Deployment/x",
    )
    ok = DryRun("Deployment/x", "PATCH ...", 200)
    f = dry_run_finding([ok, denied], "s")
    assert f.severity is Severity.WARN
    assert "were not dry-run (RBAC: no create on pods" in f.message
