"""Reading a live cluster for `servebook preflight`: the test plane, or KUBECONFIG's cluster."""

from __future__ import annotations

import json
import time

import pytest

from servebook.findings import Severity
from servebook.kube.objects import is_cordoned, is_ready
from servebook.kube.snapshot import ClusterSnapshot, read_live
from servebook.preflight.cluster import check_cluster
from servebook.preflight.requirements import ClusterRequirements, NodeAsk
from tests.cluster.conftest import kubectl

pytestmark = pytest.mark.cluster


@pytest.mark.admin(
    "preflight's whole snapshot (every namespace's Pods, the nodes, the CRDs) is what an admin "
    "reads; a tenant's is in test_tenant.py"
)
def test_live_snapshot_holds_every_kind_from_every_namespace() -> None:
    # A Pod outside the context's namespace: the test plane runs no kube-system Pods (its
    # control plane is processes), which a check for those alone took for a partial read.
    ns = f"sb-snap-{int(time.time() * 1000) % 10**9}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "elsewhere", "namespace": ns},
        "spec": {
            "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "600"]}]
        },
    }
    kubectl("create", "namespace", ns)
    try:
        kubectl("apply", "-f", "-", stdin=json.dumps(pod))
        live = read_live(connect_timeout_s=10)
    finally:
        kubectl("delete", "namespace", ns, "--wait=false")
    assert live.nodes, "a cluster has at least one node"
    assert {"default", "kube-system", ns} <= set(live.namespaces)
    namespaces = {p["metadata"]["namespace"] for p in live.pods}
    assert namespaces <= set(live.namespaces)
    # Every namespace's pods, not only the current context's namespace.
    assert ns in namespaces, namespaces
    assert live.source.startswith("cluster ")


def test_live_snapshot_passes_the_cluster_checks_on_a_real_node(live: ClusterSnapshot) -> None:
    name, node = next(iter(sorted(live.nodes.items())))
    req = ClusterRequirements(namespace="default", nodes=(NodeAsk(name, ("probe",), 0),))
    verdicts = {f.check: f.severity for f in check_cluster(live, req)}
    assert verdicts["SB250"] is Severity.PASS
    assert verdicts["SB251"] is (Severity.PASS if is_ready(node) else Severity.FAIL)
    assert verdicts["SB254"] is Severity.PASS  # asks for no accelerators
    assert verdicts["SB252"] is (Severity.FAIL if is_cordoned(node) else Severity.PASS)
    assert verdicts["SB256"] is Severity.PASS
