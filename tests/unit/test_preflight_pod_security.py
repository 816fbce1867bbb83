"""SB265: preflight reads the namespace's Pod Security enforce label and says, before the
apply, which rendered Pods the level refuses (issue 23 point 11): engine Pods mount their
weights by hostPath, and GPU engines over RDMA add IPC_LOCK, both refused by baseline.
Pod Security refuses Pods, not workloads, so without this the apply succeeds and the
refusal shows only in a ReplicaSet's or StatefulSet's events."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servebook.commands.render import render_files
from servebook.findings import Severity
from servebook.preflight.pod_security import pod_security_finding, violations
from tests.conftest import GPU_PD_SETS, CliResult
from tests.unit.preflight_standin import FIX

Cli = Callable[..., CliResult]
REPLICAS = Path(__file__).parent / "fixtures" / "render" / "vllm-pd-wide-ep-replicas"


def ns(level: str | None) -> dict[str, Any]:
    labels = {"pod-security.kubernetes.io/enforce": level} if level else {}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "s", "labels": labels}}


def test_baseline_refuses_the_hostpath_and_ipc_lock_of_rdma_engine_pods() -> None:
    """The IB fabric adds IPC_LOCK to the engines of a LeaderWorkerSet recipe."""
    _, objects, _ = render_files("vllm-pd-wide-ep", [], [REPLICAS / "values.yaml"])
    f = pod_security_finding(objects, "s", ns("baseline"))
    assert f.severity is Severity.FAIL
    assert "enforces Pod Security baseline" in f.message
    assert "the Pods of LeaderWorkerSet/vllm-pd-wide-ep-decode-lws-leader" in f.message
    # In Pod Security's own words and order, as the test plane's API server refused such a
    # Pod (tests/cluster/test_scenarios.py): capabilities first, then hostPath.
    assert (
        'non-default capabilities (container "engine" must not include "IPC_LOCK" in '
        'securityContext.capabilities.add), hostPath volumes (volume "model")'
    ) in f.message, f.message
    # The router mounts nothing and adds nothing: baseline admits it.
    assert "vllm-pd-wide-ep-router" not in f.message


def test_restricted_says_more_and_privileged_or_no_label_passes() -> None:
    _, objects, _ = render_files("vllm-pd", GPU_PD_SETS)
    restricted = pod_security_finding(objects, "s", ns("restricted"))
    assert restricted.severity is Severity.FAIL
    # Pod Security's words at restricted, as the test plane's API server refused the same
    # Pods in a dry run (tests/cluster/test_scenarios.py): its checks in place of baseline's.
    router = (
        'allowPrivilegeEscalation != false (container "router" must set '
        "securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container "
        '"router" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true '
        '(pod or container "router" must set securityContext.runAsNonRoot=true), seccompProfile '
        '(pod or container "router" must set securityContext.seccompProfile.type to '
        '"RuntimeDefault" or "Localhost")'
    )
    assert f"the Pods of Deployment/vllm-pd-router: {router}" in restricted.message
    engine = (
        'unrestricted capabilities (container "engine" must set '
        'securityContext.capabilities.drop=["ALL"]), restricted volume types (volume "model" '
        'uses restricted volume type "hostPath"), runAsNonRoot'
    )
    assert engine in restricted.message, restricted.message
    assert "hostPath volumes" not in restricted.message
    assert pod_security_finding(objects, "s", ns("privileged")).severity is Severity.PASS
    unlabelled = pod_security_finding(objects, "s", ns(None))
    assert unlabelled.severity is Severity.INFO and "default level" in unlabelled.message
    assert pod_security_finding(objects, "s", None).severity is Severity.INFO


def test_a_pod_with_nothing_baseline_forbids_is_admitted() -> None:
    spec = {"containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["CHOWN"]}}}]}
    assert violations("baseline", spec) == []
    assert violations("privileged", {"volumes": [{"name": "v", "hostPath": {"path": "/"}}]}) == []


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_preflight_on_a_snapshot_fails_before_the_apply(
    cli: Cli, tmp_path: Path, level: str
) -> None:
    doc = json.loads((FIX / "healthy.json").read_text())
    for item in doc["items"]:
        if item["kind"] == "Namespace" and item["metadata"]["name"] == "servebook":
            item["metadata"].setdefault("labels", {})["pod-security.kubernetes.io/enforce"] = level
            break
    else:
        raise AssertionError("the fixture has no namespace servebook")
    snap = tmp_path / "snap.json"
    snap.write_text(json.dumps(doc))
    argv = ["preflight", "vllm-pd", "--json", "--snapshot", str(snap)]
    for s in GPU_PD_SETS:
        argv += ["--set", s]
    r = cli(*argv)
    findings = json.loads(r.stdout)["findings"]
    (f,) = [f for f in findings if f["check"] == "SB265"]
    assert f["severity"] == "fail", f
    # restricted's own check for the volume replaces baseline's
    hostpath = "hostPath volumes" if level == "baseline" else 'restricted volume type "hostPath"'
    assert hostpath in f["message"], f
    assert r.returncode == 1, r.stderr


# --- the StatefulSet's events, where a LeaderWorkerSet's refusal shows -------------------


def _event(kind: str, name: str, when: str, message: str) -> dict[str, Any]:
    """A core/v1 Event as the StatefulSet controller records a refused Pod."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.17a", "namespace": "s"},
        "involvedObject": {"kind": kind, "name": name, "namespace": "s", "apiVersion": "apps/v1"},
        "reason": "FailedCreate",
        "type": "Warning",
        "source": {"component": "statefulset-controller"},
        "message": message,
        "lastTimestamp": when,
    }


def test_the_statefulsets_refusal_names_the_reason() -> None:
    from datetime import UTC, datetime

    from servebook.kube.lws_events import refusal_summary

    psa = (
        "create Pod m-decode-lws-0 in StatefulSet m-decode-lws failed error: pods "
        '"m-decode-lws-0" is forbidden: violates PodSecurity "baseline:latest": hostPath '
        'volumes (volume "model")'
    )
    events = [
        _event("StatefulSet", "m-decode-lws", "2026-06-01T10:00:00Z", "an older deploy's"),
        _event("StatefulSet", "m-decode-lws", "2026-06-01T12:00:05Z", psa),
        _event("StatefulSet", "m-prefill-lws-0", "2026-06-01T12:00:06Z", "another role's"),
        _event("ReplicaSet", "m-decode-lws-7f", "2026-06-01T12:00:07Z", "not a StatefulSet"),
    ]
    since = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    said = refusal_summary(events, "m-decode-lws", since)
    assert said is not None and said.endswith(psa)
    assert "StatefulSet m-decode-lws, 1 refusal" in said
    worker = _event("StatefulSet", "m-decode-lws-1", "2026-06-01T12:00:09Z", "worker refused")
    assert (refusal_summary([*events, worker], "m-decode-lws", since) or "").endswith(
        "worker refused"
    )
    assert refusal_summary(events[:1], "m-decode-lws", since) is None


def test_a_refusal_in_the_same_second_as_the_apply_is_this_deploys() -> None:
    """An Event's time has whole seconds: a refusal 0.3 s after an apply made at
    12:00:05.7 reads 12:00:05, and is still this deploy's."""
    from datetime import UTC, datetime

    from servebook.kube.lws_events import refusal_summary

    event = _event("StatefulSet", "m-decode-lws", "2026-06-01T12:00:05Z", "refused")
    since = datetime(2026, 6, 1, 12, 0, 5, 700_000, tzinfo=UTC)
    assert (refusal_summary([event], "m-decode-lws", since) or "").endswith("refused")
    before = datetime(2026, 6, 1, 12, 0, 6, tzinfo=UTC)
    assert refusal_summary([event], "m-decode-lws", before) is None
