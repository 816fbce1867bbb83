"""`servebook preflight`'s cluster checks (SB250-SB299) on snapshots in real
`kubectl get nodes,pods,namespaces,customresourcedefinitions -A -o json` shape.

Every snapshot case asserts the exact verdict of every finding (check, subject, severity),
not just "something failed".  The cases include each one a hand-written pre-flight got
wrong in the field (reference/field-notes.md, "Pre-flight"): a cordoned node, a
NoSchedule-tainted node, and free GPUs counted in one namespace over Running pods only.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from servebook.errors import UsageError
from servebook.findings import EXIT_FAIL, EXIT_OK, EXIT_UNUSABLE, REGISTRY, Finding, exit_code
from servebook.findings import Severity as S
from servebook.kube.objects import (
    BadObject,
    accelerators_on_node,
    index_pods_by_node,
    parse_quantity,
    pod_request,
    tolerates,
)
from servebook.kube.snapshot import (
    SNAPSHOT_COMMAND,
    ClusterSnapshot,
    ClusterUnreachable,
    load_snapshot,
    read_live,
    snapshot_from_list,
)
from servebook.preflight import cluster as C
from servebook.preflight.cluster import check_cluster
from servebook.preflight.nodes import taint_verdicts
from servebook.preflight.requirements import (
    LWS_CRD,
    ClusterRequirements,
    NodeAsk,
    UnplacedRole,
    requirements_from_plan,
)
from servebook.recipe.plan import Plan, RolePlan
from servebook.recipe.schema import Placement, Resources

FIXTURES = Path(__file__).parent / "fixtures" / "preflight"
MAX_SECONDS = 2.0
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

Verdicts = dict[tuple[str, str], S]


def snap(name: str) -> ClusterSnapshot:
    return load_snapshot(FIXTURES / f"{name}.json")


def verdicts(findings: Sequence[Finding]) -> Verdicts:
    out: Verdicts = {}
    for f in findings:
        key = (f.check, f.subject)
        assert key not in out, f"two findings for {key}"
        out[key] = f.severity
    return out


def node_verdicts(
    node: str,
    *,
    ready: S = S.PASS,
    cordon: S = S.PASS,
    taints: S = S.PASS,
    free: S = S.PASS,
    rdma: S | None = None,
    rdma_free: S | None = None,
    mig: S | None = S.PASS,
) -> Verdicts:
    """The fixtures' GPU nodes carry feature discovery's labels (MIG strategy `single`,
    MIG off), so SB260 speaks for them; SB261 follows an advertised RDMA resource."""
    subject = f"node/{node}"
    out = {
        ("SB250", subject): S.PASS,
        ("SB251", subject): ready,
        ("SB252", subject): cordon,
        ("SB253", subject): taints,
        ("SB254", subject): free,
    }
    if rdma is not None:
        out[("SB255", subject)] = rdma
    if rdma_free is None and rdma is S.PASS:
        rdma_free = S.PASS
    if rdma_free is not None:
        out[("SB261", subject)] = rdma_free
    if mig is not None:
        out[("SB260", subject)] = mig
    return out


def finding(findings: Sequence[Finding], check: str, subject: str) -> Finding:
    (f,) = [f for f in findings if f.check == check and f.subject == subject]
    return f


def pd(
    prefill: str = "gpu-a",
    decode: str = "gpu-b",
    gpus: int = 8,
    rdma: str | None = None,
    tolerations: Sequence[dict[str, Any]] = (),
    **kw: Any,
) -> ClusterRequirements:
    return ClusterRequirements(
        nodes=(
            NodeAsk(
                prefill, ("prefill",), gpus, rdma_resource=rdma, tolerations=tuple(tolerations)
            ),
            NodeAsk(decode, ("decode",), gpus, rdma_resource=rdma, tolerations=tuple(tolerations)),
        ),
        **kw,
    )


def one(node: str = "gpu-a", gpus: int = 8, **kw: Any) -> ClusterRequirements:
    return ClusterRequirements(nodes=(NodeAsk(node, ("mixed",), gpus, **kw),))


NS_OK = {("SB256", "namespace/servebook"): S.PASS}


# --- the snapshot cases the issue names -------------------------------------------------------


def test_healthy_pd_cluster_passes_every_check() -> None:
    findings = check_cluster(snap("healthy"), pd(rdma="rdma/ib", crds=(LWS_CRD,)))
    assert verdicts(findings) == {
        **node_verdicts("gpu-a", rdma=S.PASS),
        **node_verdicts("gpu-b", rdma=S.PASS),
        **NS_OK,
        ("SB257", f"crd/{LWS_CRD}"): S.PASS,
    }
    assert exit_code(findings) == EXIT_OK
    # A pod on gpu-b that asks for no GPU is not listed as a holder.
    assert finding(findings, "SB254", "node/gpu-b").evidence["holders"] == []


def test_free_gpus_count_a_pending_pod_in_another_namespace() -> None:
    findings = check_cluster(snap("pending-other-namespace"), pd())
    assert verdicts(findings) == {
        **node_verdicts("gpu-a", free=S.FAIL),
        **node_verdicts("gpu-b"),
        **NS_OK,
    }
    f = finding(findings, "SB254", "node/gpu-a")
    assert f.evidence["holders"] == [
        {"pod": "ml-team/llama-finetune-0", "count": 8, "state": "Pending (ContainerCreating)"}
    ]
    assert (f.evidence["free"], f.evidence["needed"]) == (0, 8)
    assert "ml-team/llama-finetune-0: 8 (Pending (ContainerCreating))" in f.message
    assert exit_code(findings) == EXIT_FAIL


def test_succeeded_and_failed_pods_no_longer_hold_gpus() -> None:
    findings = check_cluster(snap("succeeded-pod"), pd())
    assert verdicts(findings) == {**node_verdicts("gpu-a"), **node_verdicts("gpu-b"), **NS_OK}
    f = finding(findings, "SB254", "node/gpu-a")
    assert (f.evidence["free"], f.evidence["holders"]) == (8, [])


def test_cordoned_node_fails_and_its_cordon_taint_is_not_reported_twice() -> None:
    findings = check_cluster(snap("cordoned"), pd())
    assert verdicts(findings) == {
        **node_verdicts("gpu-a", cordon=S.FAIL),
        **node_verdicts("gpu-b"),
        **NS_OK,
    }
    assert "cordoned" in finding(findings, "SB252", "node/gpu-a").message
    assert "kubectl uncordon gpu-a" in finding(findings, "SB252", "node/gpu-a").hint


def test_tolerated_taint_passes_and_untolerated_taint_fails() -> None:
    req = ClusterRequirements(
        nodes=tuple(
            NodeAsk(n, (r,), 8, tolerations=(GPU_TOLERATION,))
            for n, r in (("gpu-a", "prefill"), ("gpu-b", "decode"), ("gpu-c", "extra"))
        )
    )
    findings = check_cluster(snap("taints"), req)
    assert verdicts(findings) == {
        **node_verdicts("gpu-a"),  # nvidia.com/gpu=present:NoSchedule, tolerated
        **node_verdicts("gpu-b", taints=S.FAIL),  # dedicated=training:NoExecute
        **node_verdicts("gpu-c", taints=S.WARN),  # team=research:PreferNoSchedule
        **NS_OK,
    }
    assert "dedicated=training:NoExecute" in finding(findings, "SB253", "node/gpu-b").message
    assert exit_code(findings) == EXIT_FAIL


def test_gpu_taint_fails_when_the_pods_carry_no_toleration() -> None:
    findings = check_cluster(snap("taints"), one("gpu-a"))
    assert verdicts(findings) == {**node_verdicts("gpu-a", taints=S.FAIL), **NS_OK}


def test_notready_and_unreachable_nodes_fail_without_double_reporting_their_taints() -> None:
    findings = check_cluster(snap("notready"), pd())
    assert verdicts(findings) == {
        **node_verdicts("gpu-a", ready=S.FAIL),  # Ready=Unknown: kubelet stopped posting
        **node_verdicts("gpu-b", ready=S.FAIL),  # Ready=False: CNI not initialized
        **NS_OK,
    }
    assert "Ready=Unknown" in finding(findings, "SB251", "node/gpu-a").message
    assert "NotReady" in finding(findings, "SB251", "node/gpu-b").message
    assert "cni plugin not initialized" in finding(findings, "SB251", "node/gpu-b").message


def test_missing_node_fails_and_only_its_existence_is_reported() -> None:
    findings = check_cluster(snap("missing-node"), pd(decode="gpu-b"))
    assert verdicts(findings) == {
        **node_verdicts("gpu-a"),
        ("SB250", "node/gpu-b"): S.FAIL,
        **NS_OK,
    }
    assert exit_code(findings) == EXIT_FAIL


def test_node_is_found_by_the_hostname_label_the_pods_select_whatever_its_name() -> None:
    # EKS-style: metadata.name ip-10-0-7-21.ec2.internal, kubernetes.io/hostname ip-10-0-7-21.
    # The render pins Pods with nodeSelector on kubernetes.io/hostname, so this is the node.
    findings = check_cluster(snap("missing-node"), one("ip-10-0-7-21"))
    assert verdicts(findings) == {**node_verdicts("ip-10-0-7-21"), **NS_OK}
    f = finding(findings, "SB250", "node/ip-10-0-7-21")
    assert "node ip-10-0-7-21.ec2.internal exists" in f.message
    assert f.evidence["matches"] == ["ip-10-0-7-21.ec2.internal"]


def test_node_name_that_is_not_its_hostname_label_fails_under_the_label_selector() -> None:
    findings = check_cluster(snap("missing-node"), one("ip-10-0-7-21.ec2.internal"))
    assert verdicts(findings) == {("SB250", "node/ip-10-0-7-21.ec2.internal"): S.FAIL, **NS_OK}
    hint = finding(findings, "SB250", "node/ip-10-0-7-21.ec2.internal").hint
    assert "set the node parameter to ip-10-0-7-21." in hint


def test_node_pinned_by_name_names_the_node_whose_hostname_label_matches() -> None:
    findings = check_cluster(snap("missing-node"), one("ip-10-0-7-21", selector=None))
    assert verdicts(findings) == {("SB250", "node/ip-10-0-7-21"): S.FAIL, **NS_OK}
    f = finding(findings, "SB250", "node/ip-10-0-7-21")
    assert "no node named ip-10-0-7-21" in f.message
    assert "set the node parameter to ip-10-0-7-21.ec2.internal" in f.hint
    by_name = check_cluster(snap("missing-node"), one("ip-10-0-7-21.ec2.internal", selector=None))
    assert verdicts(by_name) == {**node_verdicts("ip-10-0-7-21.ec2.internal"), **NS_OK}


def test_hostname_label_shared_by_two_nodes_fails() -> None:
    s = snap("healthy")
    twin = copy.deepcopy(s.nodes["gpu-b"])
    twin["metadata"]["labels"]["kubernetes.io/hostname"] = "gpu-a"
    s2 = ClusterSnapshot({**s.nodes, "gpu-b": twin}, s.pods, s.namespaces, s.crds)
    findings = check_cluster(s2, one("gpu-a"))
    assert verdicts(findings) == {("SB250", "node/gpu-a"): S.FAIL, **NS_OK}
    assert "2 nodes carry kubernetes.io/hostname=gpu-a" in findings[0].message


# --- field notes and the other required cases ---------------------------------------------------


def test_pod_in_default_namespace_holding_all_eight_gpus_is_found() -> None:
    # Field notes: the hand-written pre-flight looked in its own namespace, at Running pods,
    # and called this node free.
    findings = check_cluster(snap("default-namespace-holds-all"), one("gpu-a"))
    assert verdicts(findings) == {**node_verdicts("gpu-a", free=S.FAIL), **NS_OK}
    f = finding(findings, "SB254", "node/gpu-a")
    (holder,) = f.evidence["holders"]
    assert holder["pod"].startswith("default/vllm-llama-70b-")
    assert (holder["count"], holder["state"]) == (8, "Running")
    assert (f.evidence["allocatable"], f.evidence["held"], f.evidence["free"]) == (8, 8, 0)
    # The other node passes every node check, so the hint offers it.
    assert "Nodes with 8 free: gpu-b." in f.hint


def test_gpus_requested_only_under_limits_are_counted() -> None:
    s = snap("limits-only")
    short = check_cluster(s, one("gpu-a", 8))
    assert verdicts(short) == {**node_verdicts("gpu-a", free=S.FAIL), **NS_OK}
    assert finding(short, "SB254", "node/gpu-a").evidence["free"] == 4
    fits = check_cluster(s, one("gpu-a", 4))
    assert verdicts(fits) == {**node_verdicts("gpu-a"), **NS_OK}


AMD_TOLERATION = {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.mark.parametrize(("gpus", "verdict"), [(6, S.PASS), (7, S.FAIL)])
def test_amd_gpus_are_counted_under_amd_com_gpu(gpus: int, verdict: S) -> None:
    req = one("mi300-1", gpus, gpu_resource="amd.com/gpu", tolerations=(AMD_TOLERATION,))
    findings = check_cluster(snap("amd"), req)
    # An AMD node: no NVIDIA MIG to speak of (SB260 is silent).
    assert verdicts(findings) == {**node_verdicts("mi300-1", free=verdict, mig=None), **NS_OK}
    f = finding(findings, "SB254", "node/mi300-1")
    assert (f.evidence["resource"], f.evidence["free"]) == ("amd.com/gpu", 6)
    assert f.evidence["holders"][0]["pod"] == "ml-team/rocm-bench-0"


def test_asking_nvidia_gpus_of_an_amd_node_names_what_it_advertises() -> None:
    findings = check_cluster(snap("amd"), one("mi300-1", 8, tolerations=(AMD_TOLERATION,)))
    assert verdicts(findings) == {**node_verdicts("mi300-1", free=S.FAIL, mig=None), **NS_OK}
    f = finding(findings, "SB254", "node/mi300-1")
    assert "advertises no nvidia.com/gpu" in f.message
    assert "amd.com/gpu: 8" in f.message
    assert "resources.gpu_resource" in f.hint


def test_rdma_missing_or_zero_on_a_pd_node_fails() -> None:
    req = ClusterRequirements(
        nodes=tuple(
            NodeAsk(n, (r,), 8, rdma_resource="rdma/ib")
            for n, r in (("gpu-a", "prefill"), ("gpu-b", "decode"), ("gpu-c", "decode-2"))
        )
    )
    findings = check_cluster(snap("rdma-missing"), req)
    assert verdicts(findings) == {
        **node_verdicts("gpu-a", rdma=S.PASS),
        **node_verdicts("gpu-b", rdma=S.FAIL),  # not in allocatable at all
        **node_verdicts("gpu-c", rdma=S.FAIL),  # advertised as "0"
        **NS_OK,
    }
    assert finding(findings, "SB255", "node/gpu-a").evidence["allocatable"] == "1k"
    assert "advertises no rdma/ib" in finding(findings, "SB255", "node/gpu-b").message
    assert "advertises 0 rdma/ib" in finding(findings, "SB255", "node/gpu-c").message


def test_rdma_is_not_checked_when_the_recipe_asks_for_none() -> None:
    findings = check_cluster(snap("rdma-missing"), pd())
    assert not [f for f in findings if f.check == "SB255"]


@pytest.mark.parametrize(("creates", "verdict"), [(False, S.FAIL), (True, S.PASS)])
def test_missing_namespace_fails_unless_the_rendered_set_creates_it(
    creates: bool, verdict: S
) -> None:
    req = ClusterRequirements(namespace="servebook", creates_namespace=creates)
    findings = check_cluster(snap("no-namespace-no-lws"), req)
    assert verdicts(findings) == {("SB256", "namespace/servebook"): verdict}


@pytest.mark.parametrize("creates", [False, True])
def test_terminating_namespace_fails_even_when_the_set_creates_it(creates: bool) -> None:
    req = ClusterRequirements(namespace="servebook-old", creates_namespace=creates)
    findings = check_cluster(snap("no-namespace-no-lws"), req)
    assert verdicts(findings) == {("SB256", "namespace/servebook-old"): S.FAIL}
    assert "Terminating" in findings[0].message


def test_missing_crd_fails_and_installed_crds_pass() -> None:
    crds = (LWS_CRD, "clusterpolicies.nvidia.com")
    missing = check_cluster(snap("no-namespace-no-lws"), ClusterRequirements(crds=crds))
    assert verdicts(missing) == {
        ("SB256", "namespace/servebook"): S.FAIL,
        ("SB257", f"crd/{LWS_CRD}"): S.FAIL,
        ("SB257", "crd/clusterpolicies.nvidia.com"): S.PASS,
    }
    present = check_cluster(snap("healthy"), ClusterRequirements(crds=crds))
    assert verdicts(present) == {
        **NS_OK,
        ("SB257", f"crd/{LWS_CRD}"): S.PASS,
        ("SB257", "crd/clusterpolicies.nvidia.com"): S.PASS,
    }


def test_crd_that_is_not_established_fails() -> None:
    s = snap("healthy")
    crd = copy.deepcopy(s.crds[LWS_CRD])
    for cond in crd["status"]["conditions"]:
        if cond["type"] == "Established":
            cond.update(status="False", reason="Installing", message="not all names are accepted")
    s2 = ClusterSnapshot(s.nodes, s.pods, s.namespaces, {**s.crds, LWS_CRD: crd})
    findings = check_cluster(s2, ClusterRequirements(crds=(LWS_CRD,)))
    assert verdicts(findings) == {**NS_OK, ("SB257", f"crd/{LWS_CRD}"): S.FAIL}
    assert "not Established: Installing" in findings[-1].message


def test_init_containers_and_sidecars_count_by_the_effective_request_rule() -> None:
    s = snap("init-containers")
    by_name = {p["metadata"]["name"].rsplit("-", 2)[0]: p for p in s.pods}
    # init 4 runs alone before server 1 + shadow 1: max(4, 2) = 4, not 6 and not 2.
    assert pod_request(by_name["warmup"], "nvidia.com/gpu") == 4
    # sidecar 1 keeps running beside ray 2: 3, not max(1, 2) = 2.
    assert pod_request(by_name["ray-worker"], "nvidia.com/gpu") == 3
    findings = check_cluster(s, one("gpu-a", 2))
    assert verdicts(findings) == {**node_verdicts("gpu-a", free=S.FAIL), **NS_OK}
    f = finding(findings, "SB254", "node/gpu-a")
    assert (f.evidence["held"], f.evidence["free"]) == (7, 1)
    assert [h["state"] for h in f.evidence["holders"]] == ["Pending (PodInitializing)", "Running"]
    assert verdicts(check_cluster(s, one("gpu-a", 1))) == {**node_verdicts("gpu-a"), **NS_OK}


def test_free_gpus_count_pods_in_every_namespace_and_non_terminal_phase() -> None:
    s = snap("healthy")
    node = s.nodes["gpu-a"]
    template = next(p for p in s.pods if p["metadata"]["namespace"] == "gpu-operator")

    def gpu_pod(ns: str, name: str, phase: str, gpus: str, **meta: Any) -> dict[str, Any]:
        p = copy.deepcopy(template)
        p["metadata"].update(namespace=ns, name=name, **meta)
        p["spec"]["nodeName"] = "gpu-a"
        p["spec"]["containers"][0]["resources"] = {
            "limits": {"nvidia.com/gpu": gpus},
            "requests": {"nvidia.com/gpu": gpus},
        }
        p["status"]["phase"] = phase
        return p

    pods = [
        gpu_pod("team-a", "running", "Running", "1"),
        gpu_pod("team-b", "unknown", "Unknown", "1"),
        gpu_pod("team-c", "terminating", "Running", "2", deletionTimestamp="2025-06-18T14:20Z"),
        gpu_pod("team-d", "done", "Succeeded", "4"),
        gpu_pod("team-e", "crashed", "Failed", "4"),
    ]
    on_node = index_pods_by_node(pods)["gpu-a"]
    acc = accelerators_on_node(node, on_node, "nvidia.com/gpu")
    assert (acc.allocatable, acc.held, acc.free) == (8, 4, 4)
    assert [(h.pod, h.state) for h in acc.holders] == [
        ("team-c/terminating", "Running (Terminating)"),
        ("team-a/running", "Running"),
        ("team-b/unknown", "Unknown"),
    ]


def test_unreadable_quantity_is_an_error_not_a_pass() -> None:
    s = snap("limits-only")
    pods = copy.deepcopy(list(s.pods))
    for p in pods:
        for c in p["spec"]["containers"]:
            if "nvidia.com/gpu" in c["resources"]["limits"]:
                c["resources"]["limits"]["nvidia.com/gpu"] = "four"
    findings = check_cluster(ClusterSnapshot(s.nodes, pods, s.namespaces, s.crds), one())
    assert verdicts(findings) == {**node_verdicts("gpu-a", free=S.ERROR), **NS_OK}
    assert "'four' is not a Kubernetes quantity" in finding(findings, "SB254", "node/gpu-a").message
    assert exit_code(findings) == EXIT_UNUSABLE


def test_devices_withheld_by_the_device_plugin_are_named() -> None:
    s = snap("healthy")
    node = copy.deepcopy(s.nodes["gpu-a"])
    node["status"]["allocatable"]["nvidia.com/gpu"] = "7"  # one GPU unhealthy (XID 79)
    s2 = ClusterSnapshot({**s.nodes, "gpu-a": node}, s.pods, s.namespaces, s.crds)
    findings = check_cluster(s2, one("gpu-a", 8))
    f = finding(findings, "SB254", "node/gpu-a")
    assert f.severity is S.FAIL
    assert "capacity 8: 1 not allocatable" in f.message


# --- the rules, one by one ---------------------------------------------------------------


NO_SCHEDULE = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        ({"operator": "Exists"}, NO_SCHEDULE, True),  # empty key + Exists: everything
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, NO_SCHEDULE, True),  # any effect
        (
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
            NO_SCHEDULE,
            False,
        ),
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}, NO_SCHEDULE, True),
        ({"key": "nvidia.com/gpu", "value": "present"}, NO_SCHEDULE, True),  # Equal by default
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}, NO_SCHEDULE, False),
        ({"key": "nvidia.com/gpu", "operator": "Equal"}, NO_SCHEDULE, False),  # value "" != present
        ({"key": "amd.com/gpu", "operator": "Exists"}, NO_SCHEDULE, False),
        ({"key": "nvidia.com/gpu", "operator": "Gt", "value": "1"}, NO_SCHEDULE, False),
        (
            {"key": "dedicated", "operator": "Equal"},
            {"key": "dedicated", "effect": "NoExecute"},
            True,
        ),
    ],
)
def test_toleration_matching_follows_kubernetes(
    toleration: dict[str, Any], taint: dict[str, Any], expected: bool
) -> None:
    assert tolerates(toleration, taint) is expected


def _tainted(*taints: dict[str, Any], ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": "n"},
        "spec": {"taints": list(taints)},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_noexecute_toleration_with_seconds_evicts_and_fails() -> None:
    taint = {"key": "maintenance", "effect": "NoExecute"}
    timed = {"key": "maintenance", "operator": "Exists", "tolerationSeconds": 600}
    forever = {"key": "maintenance", "operator": "Exists"}
    (v,) = taint_verdicts(_tainted(taint), [timed])
    assert (v.severity, v.why) == (S.FAIL, "tolerated for 600 s, then evicted")
    # Kubernetes takes the least tolerationSeconds among the matching tolerations.
    (v,) = taint_verdicts(_tainted(taint), [forever, timed])
    assert v.severity is S.FAIL
    (v,) = taint_verdicts(_tainted(taint), [forever])
    assert v.severity is S.PASS


def test_not_ready_taints_on_a_ready_node_are_judged_like_any_taint() -> None:
    stale = {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}
    (v,) = taint_verdicts(_tainted(stale, ready=True), [])
    assert v.severity is S.FAIL
    assert taint_verdicts(_tainted(stale, ready=False), []) == []


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", Fraction(8)),
        (8, Fraction(8)),
        ("1k", Fraction(1000)),
        ("1Ki", Fraction(1024)),
        ("1Ti", Fraction(2**40)),
        ("500m", Fraction(1, 2)),
        ("1e3", Fraction(1000)),
        ("1.5", Fraction(3, 2)),
        ("2113498728Ki", Fraction(2113498728 * 1024)),
    ],
)
def test_quantities_parse_as_kubernetes_writes_them(text: str | int, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["eight", "", "8 GPUs", "1KB", None, True, [8]])
def test_malformed_quantities_are_refused(bad: Any) -> None:
    with pytest.raises(BadObject):
        parse_quantity(bad)


def test_pod_overhead_adds_to_the_effective_request() -> None:
    pod = {
        "metadata": {"namespace": "a", "name": "b"},
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": {"example.com/dev": "1"}}}],
            "overhead": {"example.com/dev": "1"},
        },
    }
    assert pod_request(pod, "example.com/dev") == 2
    assert pod_request(pod, "nvidia.com/gpu") == 0


# --- requirements from a Plan ------------------------------------------------------------------


def _plan(*roles: RolePlan, **params: Any) -> Plan:
    return Plan(
        recipe="vllm-pd",
        origin="vllm-pd.yaml",
        engine="vllm",
        backends=["kubernetes"],
        topology="pd",
        served_model_name="m",
        params=params,
        roles=list(roles),
    )


def _role(name: str, node: str | None, gpus: int | str = 0, **res: Any) -> RolePlan:
    return RolePlan(
        name=name,
        kind="router" if name == "router" else "engine",
        resources=Resources(gpus=gpus, **res),
        placement=Placement(node=node),
    )


def test_requirements_from_plan_adds_up_roles_on_the_same_node() -> None:
    plan = _plan(
        _role("prefill", "gpu-a", 4, rdma_resource="rdma/ib"),
        _role("decode", "gpu-a", "4"),
        _role("router", None),
        namespace="llm",
    )
    req = requirements_from_plan(
        plan, creates_namespace=True, crds=[LWS_CRD, LWS_CRD], tolerations=[GPU_TOLERATION]
    )
    assert req.namespace == "llm"
    assert req.creates_namespace is True
    assert req.crds == (LWS_CRD,)
    assert req.nodes == (
        NodeAsk(
            "gpu-a",
            ("prefill", "decode"),
            8,
            "nvidia.com/gpu",
            "rdma/ib",
            (GPU_TOLERATION,),
            rdma_devices=1,  # only prefill asks for RDMA
        ),
    )
    assert req.unplaced == (UnplacedRole("router", 0),)
    # Together they need all 8 of a node where 4 are held.
    findings = check_cluster(snap("limits-only"), req)
    assert finding(findings, "SB254", "node/gpu-a").severity is S.FAIL


def test_requirements_from_plan_defaults_the_namespace_to_servebook() -> None:
    req = requirements_from_plan(_plan(_role("prefill", "gpu-a", 8), _role("decode", "gpu-b", 8)))
    assert req.namespace == "servebook"
    assert [(a.node, a.roles, a.accelerators) for a in req.nodes] == [
        ("gpu-a", ("prefill",), 8),
        ("gpu-b", ("decode",), 8),
    ]
    assert verdicts(check_cluster(snap("healthy"), req)) == {
        **node_verdicts("gpu-a"),
        **node_verdicts("gpu-b"),
        **NS_OK,
    }


@pytest.mark.parametrize("gpus", ["${gpus}", "eight", "-1"])
def test_requirements_from_plan_refuses_a_gpu_count_that_is_not_a_count(gpus: str) -> None:
    with pytest.raises(UsageError, match=r"roles\.prefill\.resources\.gpus"):
        requirements_from_plan(_plan(_role("prefill", "gpu-a", gpus)))


def test_requirements_from_plan_refuses_two_accelerator_kinds_on_one_node() -> None:
    plan = _plan(_role("prefill", "n", 1), _role("decode", "n", 1, gpu_resource="amd.com/gpu"))
    with pytest.raises(UsageError, match="different accelerator resources"):
        requirements_from_plan(plan)


def test_role_without_a_node_warns_when_it_needs_accelerators() -> None:
    req = requirements_from_plan(_plan(_role("prefill", None, 8), _role("router", None)))
    findings = check_cluster(snap("healthy"), req)
    assert verdicts(findings) == {
        ("SB258", "role/prefill"): S.WARN,
        ("SB258", "role/router"): S.INFO,
        **NS_OK,
    }


def test_every_cluster_check_is_registered_with_rationale_and_fix() -> None:
    ids = [c.id for c in C.CHECKS]
    assert len(set(ids)) == len(ids)
    for check in C.CHECKS:
        assert 250 <= int(check.id[2:]) <= 299
        assert REGISTRY[check.id] is check
        assert check.title and len(check.rationale) > 80 and check.fix


# --- snapshot files ----------------------------------------------------------------------------


ALL_FIXTURES = sorted(p.stem for p in FIXTURES.glob("*.json"))


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_every_fixture_loads_and_is_checked_in_under_two_seconds(name: str) -> None:
    started = time.perf_counter()
    s = snap(name)
    req = ClusterRequirements(
        crds=(LWS_CRD,),
        nodes=tuple(NodeAsk(n, ("mixed",), 8, rdma_resource="rdma/ib") for n in s.nodes),
    )
    findings = check_cluster(s, req)
    elapsed = time.perf_counter() - started
    assert elapsed < MAX_SECONDS, f"{name}: {elapsed:.2f} s"
    assert findings and s.nodes and s.pods and s.namespaces
    assert all(p["kind"] == "Pod" and p["spec"].get("nodeName") for p in s.pods)


def test_fixtures_are_in_kubectl_list_shape() -> None:
    for path in FIXTURES.glob("*.json"):
        doc = json.loads(path.read_text())
        assert (doc["apiVersion"], doc["kind"]) == ("v1", "List"), path.name
        for item in doc["items"]:
            meta = item["metadata"]
            assert item["apiVersion"] and meta["uid"] and meta["creationTimestamp"], path.name
            if item["kind"] == "Node":
                assert meta["labels"]["kubernetes.io/hostname"]
                assert isinstance(item["status"]["allocatable"]["cpu"], str)
                assert {c["type"] for c in item["status"]["conditions"]} >= {"Ready"}


def _write(tmp_path: Path, text: str, name: str = "snap.json") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _items_without(kind: str) -> str:
    doc = json.loads((FIXTURES / "healthy.json").read_text())
    doc["items"] = [i for i in doc["items"] if i["kind"] != kind]
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{not json", "not valid JSON (line 1, column 2"),
        ("apiVersion: v1\nkind: List\nitems: []\n", "It looks like YAML: use -o json"),
        ('{"kind": "Pod", "metadata": {"name": "p"}}', "expected a Kubernetes List with 'items'"),
        ("[]", "expected a Kubernetes List with 'items'"),
        (
            '{"kind": "List", "items": [{"metadata": {"name": "x"}}]}',
            "items[0]: item without 'kind'",
        ),
        ('{"kind": "List", "items": [{"kind": "Node", "metadata": {}}]}', "items[0]: Node without"),
        ('{"kind": "List", "items": [{"kind": "Pod", "metadata": {"name": "p"}}]}', "Pod without"),
    ],
)
def test_unusable_snapshot_file_is_a_usage_error_naming_the_file(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(UsageError) as e:
        load_snapshot(path)
    assert str(e.value).startswith(str(path))
    assert expected in str(e.value)
    assert e.value.exit_code == EXIT_UNUSABLE


@pytest.mark.parametrize("kind", ["Node", "Pod", "Namespace"])
def test_snapshot_without_a_required_kind_is_refused(tmp_path: Path, kind: str) -> None:
    path = _write(tmp_path, _items_without(kind))
    with pytest.raises(UsageError, match=f"has no {kind} objects") as e:
        load_snapshot(path)
    assert SNAPSHOT_COMMAND in str(e.value)


def test_snapshot_without_crds_loads_and_a_required_crd_fails_with_a_note(tmp_path: Path) -> None:
    s = load_snapshot(_write(tmp_path, _items_without("CustomResourceDefinition")))
    (f,) = [f for f in check_cluster(s, ClusterRequirements(crds=(LWS_CRD,))) if f.check == "SB257"]
    assert f.severity is S.FAIL
    assert "holds no CRDs at all" in f.message


def test_snapshot_taken_without_all_namespaces_is_refused(tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "default-namespace-holds-all.json").read_text())
    doc["items"] = [
        i for i in doc["items"] if i["kind"] != "Pod" or i["metadata"]["namespace"] == "default"
    ]
    with pytest.raises(UsageError, match="without -A"):
        load_snapshot(_write(tmp_path, json.dumps(doc)))


def test_missing_snapshot_file_and_directory_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        load_snapshot(tmp_path / "absent.json")
    with pytest.raises(UsageError, match="is a directory"):
        load_snapshot(tmp_path)


def test_other_kinds_in_a_snapshot_are_counted_and_ignored() -> None:
    doc = json.loads((FIXTURES / "healthy.json").read_text())
    doc["items"].append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}})
    s = snapshot_from_list(doc, source="x")
    assert s.ignored == {"Service": 1}
    assert set(s.nodes) == {"cp-1", "gpu-a", "gpu-b"}


# --- the live edge without a cluster: errors, never a pass ---------------------------------------


def _kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: c\n  cluster:\n    server: {server}\n"
        "    insecure-skip-tls-verify: true\n"
        "contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n"
        "current-context: c\n"
        "users:\n- name: u\n  user:\n    token: t\n"
    )
    return path


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP port that accepts connections and never answers (a hung API server)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"https://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    t.join()
    for c in held:
        c.close()
    sock.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_read_live_without_a_kubeconfig_is_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ClusterUnreachable, match="no kubeconfig") as e:
        read_live()
    assert e.value.exit_code == EXIT_UNUSABLE
    assert "--snapshot FILE" in str(e.value)


def test_read_live_with_a_refused_connection_is_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "KUBECONFIG", str(_kubeconfig(tmp_path, f"https://127.0.0.1:{_closed_port()}"))
    )
    with pytest.raises(ClusterUnreachable, match="cannot read the cluster") as e:
        read_live(timeout_s=10)
    assert e.value.exit_code == EXIT_UNUSABLE


def test_read_live_gives_up_on_a_silent_server_at_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, silent_server: str
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path, silent_server)))
    started = time.perf_counter()
    with pytest.raises(ClusterUnreachable, match=r"no answer from the API server within 1\.5 s"):
        read_live(connect_timeout_s=1.5)
    assert time.perf_counter() - started < 5


class _FakeApiServer:
    """Just enough of the Kubernetes API for `read_live`: /version and the four list
    endpoints, paged with `limit`/`continue` as the API server does, items without
    kind/apiVersion (the API server leaves them off list items; kubectl adds them)."""

    def __init__(self, doc: dict[str, Any], forbid: str = "") -> None:
        import http.server

        lists: dict[str, list[dict[str, Any]]] = {
            "/api/v1/nodes": [],
            "/api/v1/pods": [],
            "/api/v1/namespaces": [],
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions": [],
        }
        paths = {
            "Node": "/api/v1/nodes",
            "Pod": "/api/v1/pods",
            "Namespace": "/api/v1/namespaces",
            "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        }
        for item in doc["items"]:
            stripped = {k: v for k, v in item.items() if k not in ("kind", "apiVersion")}
            lists[paths[item["kind"]]].append(stripped)
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                from urllib.parse import parse_qs, urlparse

                url = urlparse(self.path)
                server.requests.append(self.path)
                query = parse_qs(url.query)
                path = url.path.rstrip("/")  # kr8s asks for /version/
                if path == "/version":
                    return self._json(200, {"gitVersion": "v1.30.5", "major": "1", "minor": "30"})
                if forbid and path == forbid:
                    return self._json(
                        403,
                        {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "status": "Failure",
                            "message": 'pods is forbidden: User "dev" cannot list resource '
                            '"pods" in API group "" at the cluster scope',
                            "reason": "Forbidden",
                            "code": 403,
                        },
                    )
                if path not in lists:
                    return self._json(404, {"kind": "Status", "code": 404, "message": "not found"})
                items = lists[path]
                limit = int(query.get("limit", ["500"])[0])
                start = int(query.get("continue", ["0"])[0])
                page = items[start : start + limit]
                more = start + limit < len(items)
                meta = {
                    "resourceVersion": "48213377",
                    "continue": str(start + limit) if more else "",
                }
                return self._json(
                    200, {"kind": "List", "apiVersion": "v1", "metadata": meta, "items": page}
                )

            def _json(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> _FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _big_cluster_doc() -> dict[str, Any]:
    """healthy.json plus 250 completed job pods, so the pod list takes three pages."""
    doc = json.loads((FIXTURES / "succeeded-pod.json").read_text())
    job = next(
        i for i in doc["items"] if i["kind"] == "Pod" and i["status"]["phase"] == "Succeeded"
    )
    for n in range(250):
        p = copy.deepcopy(job)
        p["metadata"]["name"] = f"sweep-{n:03d}"
        doc["items"].append(p)
    return doc


def test_read_live_lists_all_four_kinds_across_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _big_cluster_doc()
    with _FakeApiServer(doc) as api:
        monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path, api.url)))
        live = read_live(timeout_s=20, request_timeout_s=5)
    from_file = snapshot_from_list(doc, source="file")
    assert set(live.nodes) == set(from_file.nodes) == {"cp-1", "gpu-a", "gpu-b"}
    assert len(live.pods) == len(from_file.pods) > 250
    assert set(live.namespaces) == set(from_file.namespaces)
    assert set(live.crds) == set(from_file.crds)
    assert live.source == f"cluster {api.url} (context c)"
    assert any("continue=" in r for r in api.requests if r.startswith("/api/v1/pods"))
    # Same verdicts as from the file: Succeeded pods hold nothing.
    assert verdicts(check_cluster(live, pd())) == verdicts(check_cluster(from_file, pd()))


def test_read_live_refused_a_list_is_unreachable_naming_what(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = json.loads((FIXTURES / "healthy.json").read_text())
    with _FakeApiServer(doc, forbid="/api/v1/pods") as api:
        monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path, api.url)))
        with pytest.raises(ClusterUnreachable) as e:
            read_live(timeout_s=20, request_timeout_s=5)
    message = str(e.value)
    assert "refused listing pods (403" in message
    assert "cannot list resource" in message
    assert e.value.exit_code == EXIT_UNUSABLE


def test_requirements_from_plan_reads_the_plans_kubernetes_namespace_and_tolerations() -> None:
    from types import SimpleNamespace

    plan = _plan(_role("prefill", "gpu-a", 8), _role("decode", "gpu-b", 8), namespace="ignored")
    kube = SimpleNamespace(namespace="llm-serving", tolerations=[GPU_TOLERATION])
    plan = plan.model_copy(update={"kubernetes": kube})
    req = requirements_from_plan(plan, creates_namespace=True)
    assert req.namespace == "llm-serving"
    assert all(a.tolerations == (GPU_TOLERATION,) for a in req.nodes)
    # gpu-a's nvidia.com/gpu taint is tolerated, gpu-b's dedicated=training is not.
    assert verdicts(check_cluster(snap("taints"), req)) == {
        **node_verdicts("gpu-a"),
        **node_verdicts("gpu-b", taints=S.FAIL),
        ("SB256", "namespace/llm-serving"): S.PASS,
    }


# --- a namespace's tenant: what it may not read is not checked, and says so ------------------


def _as_tenant(name: str, unread: dict[str, str]) -> ClusterSnapshot:
    """A snapshot as a tenant of namespace servebook reads it: the refused lists empty (or,
    for pods, that namespace's only), and why in ``unread``."""
    whole = snap(name)
    return ClusterSnapshot(
        nodes={} if "nodes" in unread else whole.nodes,
        pods=[p for p in whole.pods if p["metadata"]["namespace"] == "servebook"]
        if "pods" in unread
        else whole.pods,
        namespaces=whole.namespaces,
        crds={} if "crds" in unread else whole.crds,
        source="tenant",
        unread=unread,
    )


FORBIDDEN = 'nodes is forbidden: User "servebook-tenant" cannot list resource "nodes"'


def test_a_tenant_who_may_not_read_nodes_or_crds_gets_not_checked_never_a_pass() -> None:
    unread = {"nodes": FORBIDDEN, "crds": "customresourcedefinitions is forbidden", "pods": "x"}
    findings = check_cluster(_as_tenant("healthy", unread), pd(crds=(LWS_CRD,)))
    assert verdicts(findings) == {
        ("SB250", "node/gpu-a"): S.WARN,
        ("SB250", "node/gpu-b"): S.WARN,
        **NS_OK,
        ("SB257", f"crd/{LWS_CRD}"): S.WARN,
    }
    for f in findings:
        if f.severity is S.WARN:
            assert f.message.startswith("not checked: ") and f.evidence["checked"] is False
            assert "--snapshot FILE" in f.hint
    node = finding(findings, "SB250", "node/gpu-a")
    assert FORBIDDEN in node.message and "8 free nvidia.com/gpu" in node.message


def test_nodes_readable_but_not_every_namespaces_pods_leave_free_gpus_unchecked() -> None:
    """The field's false pass: free GPUs counted over one namespace's Pods.  A caller who
    may read the nodes but not every namespace's Pods gets SB254 as not checked."""
    whole = check_cluster(snap("pending-other-namespace"), pd())
    assert finding(whole, "SB254", "node/gpu-a").severity is S.FAIL
    findings = check_cluster(_as_tenant("pending-other-namespace", {"pods": "forbidden"}), pd())
    free = finding(findings, "SB254", "node/gpu-a")
    assert free.severity is S.WARN and free.evidence["checked"] is False, free.message
    assert finding(findings, "SB251", "node/gpu-a").severity is S.PASS
