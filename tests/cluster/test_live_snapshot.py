"""Reading a live cluster for `servebook preflight` (needs a reachable Kubernetes cluster).

Skipped, with the reason, when no kubeconfig is configured or the cluster does not answer:
`read_live` raises `ClusterUnreachable` then, which is what the skip reports.
"""

from __future__ import annotations

import pytest

from servebook.findings import Severity
from servebook.kube.objects import is_cordoned, is_ready
from servebook.kube.snapshot import ClusterSnapshot
from servebook.preflight.cluster import check_cluster
from servebook.preflight.requirements import ClusterRequirements, NodeAsk

pytestmark = pytest.mark.cluster


def test_live_snapshot_holds_every_kind_from_every_namespace(live: ClusterSnapshot) -> None:
    assert live.nodes, "a cluster has at least one node"
    assert {"default", "kube-system"} <= set(live.namespaces)
    namespaces = {p["metadata"]["namespace"] for p in live.pods}
    assert namespaces <= set(live.namespaces)
    # Every namespace's pods, not only the current context's namespace.
    assert "kube-system" in namespaces or len(namespaces) > 1
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
