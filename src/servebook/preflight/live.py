"""Preflight of a resolved Plan against a cluster: the cluster checks over a snapshot (read
live, or from a file), then, live, the read-only weights probe in a Pod on each target
node.  Used by `servebook preflight` and by the Kubernetes backend's part of `run`."""

from __future__ import annotations

from pathlib import Path

from servebook.findings import Finding, Severity
from servebook.kube.probe_pod import PROBE_POD, probe_targets, run_probe_pod
from servebook.kube.snapshot import load_snapshot, read_live
from servebook.preflight.cluster import check_cluster, requirements_from_plan
from servebook.recipe.plan import Plan


def plan_findings(
    plan: Plan,
    *,
    snapshot: Path | None = None,
    kubeconfig: str | None = None,
    probe_deadline: int = 120,
) -> list[Finding]:
    # servebook render always emits the Namespace, so the set creates it.
    req = requirements_from_plan(plan, creates_namespace=True)
    snap = load_snapshot(snapshot) if snapshot else read_live(kubeconfig=kubeconfig)
    findings = check_cluster(snap, req)
    targets = probe_targets(plan)
    if snapshot is not None:
        findings.append(
            PROBE_POD.finding(
                Severity.INFO,
                ", ".join(t.node for t in targets) or "-",
                "node probes were not run: --snapshot reads no live cluster, so no Pod can "
                "check the model directories; the verdict is the cluster checks' alone",
            )
        )
        return findings
    for t in targets:
        findings += run_probe_pod(t, namespace=req.namespace, deadline_s=probe_deadline)
    return findings
