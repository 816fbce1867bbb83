"""Run the node probe (``preflight/probe.py``) in a Pod on a target node.

The Pod is built to change nothing it checks: the model directory is mounted read-only
with hostPath ``type: Directory`` (an absent path fails the mount and is reported from the
Pod's event as "absent on node X"; ``DirectoryOrCreate`` once created a typo'd directory
and turned a fast failure into a slow crash loop), no privileges, a deadline, and the Pod
is deleted afterwards in every case, Ctrl-C included.  It is pinned the way the engines
are, by a ``nodeSelector`` on the node's ``kubernetes.io/hostname`` label (the value the
recipe's node parameter gives): a node whose name differs from that label is found by
both, where a ``nodeName`` would name a node that does not exist and the Pod would never
run.  It tolerates every taint, the cordon's ``node.kubernetes.io/unschedulable`` too, so
a cordoned node is still probed (the cordon is reported on its own by the cluster checks).

Pulling the image is not the probe's time: a multi-GB engine image can take longer to pull
than the probe takes to run, and once counted in one 120 s deadline it turned a slow pull
into "the probe did not finish".  The pull is bounded on its own (``pull_timeout_s``, from
the Pod's creation until its container starts), the probe's ``deadline_s`` runs from the
container's start, and the Pod's ``activeDeadlineSeconds`` (which the kubelet counts from
the Pod's start, pull included) is the sum of both, a backstop should servebook die.  Any
image with ``python3`` runs the probe, so ``image`` may be a small one instead of the
engine's.

The manifest and the reading of events are pure functions; only ``run_probe_pod`` talks to
the cluster, through ``kube.client`` (the caller's kubeconfig, context and timeouts).
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from servebook.findings import Finding, Severity, register
from servebook.kube.client import RequestFailed, call, send
from servebook.kube.names import HOSTNAME_LABEL
from servebook.preflight.probe_checks import probe_script_path, to_findings

MODEL_MOUNT = "/servebook-probe/model"
DRAFT_MOUNT = "/servebook-probe/draft"

PROBE_POD = register(
    "SB259",
    "Node probe ran in a Pod on the target node",
    "The weights check must run where the engine will run: a directory can exist on one "
    "node and be empty or absent on another, and a hostPath that is absent fails only at "
    "mount time, minutes into a deploy.",
    "Read the message: an absent path is named with its node; a Pod that could not start "
    "names the reason from its events.",
)


@dataclass(frozen=True)
class ProbeTarget:
    node: str
    roles: tuple[str, ...]
    image: str
    model_dir: str
    draft_dir: str | None = None
    expect_model: str | None = None


def probe_targets(plan: Any) -> list[ProbeTarget]:
    """One probe per (node, model dir, draft dir) the Plan's engine roles read from their
    node; a role that makes its model inside its Pod (the tiny recipes) reads none."""
    seen: dict[tuple[str, str, str | None], list[str]] = {}
    image: dict[tuple[str, str, str | None], str] = {}
    for r in plan.engine_roles:
        if not r.model_path or getattr(r, "pod_models", None):
            continue
        for node in r.placement.all_nodes:  # every node a role's copies (or members) use
            key = (node, r.model_path, r.draft_path)
            seen.setdefault(key, []).append(r.name)
            image[key] = r.image or plan.image or ""
    return [
        ProbeTarget(node=k[0], roles=tuple(v), image=image[k], model_dir=k[1], draft_dir=k[2])
        for k, v in seen.items()
    ]


def pod_manifest(
    t: ProbeTarget,
    *,
    namespace: str,
    deadline_s: int,
    script: str,
    name: str | None = None,
    pull_timeout_s: int = 0,
    image: str | None = None,
) -> dict[str, Any]:
    """The probe Pod.  Its ``activeDeadlineSeconds`` covers the pull and the probe
    (``pull_timeout_s + deadline_s``): the kubelet counts it from the Pod's start, before
    the image is pulled."""
    name = name or f"servebook-probe-{secrets.token_hex(4)}"
    args = [MODEL_MOUNT, "--json"]
    volumes: list[dict[str, Any]] = [
        {"name": "model", "hostPath": {"path": t.model_dir, "type": "Directory"}}
    ]
    mounts: list[dict[str, Any]] = [{"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}]
    if t.draft_dir:
        args += ["--draft", DRAFT_MOUNT]
        volumes.append({"name": "draft", "hostPath": {"path": t.draft_dir, "type": "Directory"}})
        mounts.append({"name": "draft", "mountPath": DRAFT_MOUNT, "readOnly": True})
    if t.expect_model:
        args += ["--expect-model", t.expect_model]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "servebook-probe"},
        },
        "spec": {
            "nodeSelector": {HOSTNAME_LABEL: t.node},
            "restartPolicy": "Never",
            "activeDeadlineSeconds": deadline_s + max(0, pull_timeout_s),
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            # Probe wherever the engine would have to run, whatever its taints say.
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "probe",
                    "image": image or t.image,
                    "command": ["python3", "-c", script, *args],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "64Mi"},
                        "limits": {"memory": "256Mi"},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "privileged": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        },
    }


_HOSTPATH_ABSENT = re.compile(r"hostPath type check failed: (?P<path>\S+) is not a directory")


def interpret_events(t: ProbeTarget, events: Iterable[Mapping[str, Any]]) -> Finding | None:
    """A finding from the Pod's events when they explain why it could not run."""
    for ev in events:
        msg = str(ev.get("message", ""))
        m = _HOSTPATH_ABSENT.search(msg)
        if m:
            return PROBE_POD.finding(
                Severity.FAIL,
                t.node,
                f"{m.group('path')} is absent on node {t.node} (roles {', '.join(t.roles)}): "
                "the hostPath mount failed. Nothing was created.",
                hint="Copy or download the weights to that path on the node, or fix the path "
                "parameter; `servebook probe --find ROOT` on the node lists candidates.",
                evidence={"event": msg, "reason": ev.get("reason")},
            )
        if ev.get("reason") in ("Failed", "ErrImagePull", "ImagePullBackOff", "InspectFailed"):
            return PROBE_POD.finding(
                Severity.ERROR,
                t.node,
                f"the probe Pod on {t.node} could not start: {msg}",
                evidence={"event": msg, "reason": ev.get("reason")},
            )
    return None


def findings_from_logs(t: ProbeTarget, logs: str) -> list[Finding]:
    try:
        doc = json.loads(logs[logs.index("{") :])
    except (ValueError, json.JSONDecodeError):
        return [
            PROBE_POD.finding(
                Severity.ERROR,
                t.node,
                f"the probe on {t.node} printed no findings (does the image have python3?): "
                f"{logs[-300:]!r}",
            )
        ]
    found = to_findings(doc.get("findings", []))
    for f in found:
        f.subject = f"{t.node}:{f.subject}"
    return [
        PROBE_POD.finding(Severity.PASS, t.node, f"probe ran on {t.node} ({', '.join(t.roles)})"),
        *found,
    ]


_PULL_FAILURES = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)


def container_phase(pod: Mapping[str, Any]) -> tuple[str, str]:
    """(``pulling`` | ``failed-to-start`` | ``running`` | ``done``, detail) for the probe
    Pod's one container, from ``status.phase`` and its container status."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return "done", str(status.get("reason") or status.get("phase"))
    for cs in status.get("containerStatuses") or ():
        state = cs.get("state") or {}
        if "running" in state or "terminated" in state:
            return "running", ""
        waiting = state.get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if reason in _PULL_FAILURES:
            return "failed-to-start", f"{reason}: {waiting.get('message', '')}".rstrip(": ")
    return "pulling", ""


def run_probe_pod(
    api: Any,
    t: ProbeTarget,
    *,
    namespace: str,
    deadline_s: int = 120,
    pull_timeout_s: int = 900,
    image: str | None = None,
    poll_s: float = 2.0,
) -> list[Finding]:
    """Create the probe Pod in ``namespace`` (which must exist), wait for its image within
    ``pull_timeout_s`` and for the probe within ``deadline_s`` of its start, read its
    findings, delete it.  A probe Pod the namespace's Pod Security refuses is a failing
    finding (the engines' own Pods meet the same refusal); any other refused or failed
    request is ``RequestFailed`` (exit 2), naming the request."""
    script = probe_script_path().read_text(encoding="utf-8")
    manifest = pod_manifest(
        t,
        namespace=namespace,
        deadline_s=deadline_s,
        script=script,
        pull_timeout_s=pull_timeout_s,
        image=image,
    )
    name = manifest["metadata"]["name"]
    pods = f"/api/v1/namespaces/{namespace}/pods"
    try:
        call(api, "POST", pods, f"creating the probe Pod on node {t.node}", body=manifest)
    except RequestFailed as e:
        refused = _refused(t, namespace, e)
        if refused is None:
            raise
        return [refused]
    try:
        return _wait_for_probe(
            api, t, namespace, name, image or t.image, deadline_s, pull_timeout_s, poll_s
        )
    finally:
        # A failure above says more; the Pod's own deadline ends it regardless.
        with contextlib.suppress(RequestFailed):
            call(
                api,
                "DELETE",
                f"{pods}/{name}",
                f"deleting the probe Pod {namespace}/{name}",
                body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                missing_ok=True,
            )


def _refused(t: ProbeTarget, namespace: str, e: RequestFailed) -> Finding | None:
    """The finding for a probe Pod that the namespace's Pod Security refuses (seen on a real
    API server, which the stand-in did not enforce on Pods): it fails the node, since the
    engines' Pods mount the same hostPath. Any other refusal stays an error of the run."""
    said = e.server_message or str(e)
    if e.code != 403 or "violates PodSecurity" not in said:
        return None
    return PROBE_POD.finding(
        Severity.FAIL,
        t.node,
        f"namespace {namespace} refused the probe Pod for node {t.node}: {said}",
        hint="The engines' Pods mount their weights by hostPath too, so this namespace "
        "refuses them as well (SB265 says which level): deploy into a namespace whose "
        "pod-security.kubernetes.io/enforce label is privileged, or unset.",
    )


def _wait_for_probe(
    api: Any,
    t: ProbeTarget,
    namespace: str,
    name: str,
    image: str,
    deadline_s: int,
    pull_timeout_s: int,
    poll_s: float,
) -> list[Finding]:
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    created = time.monotonic()
    started: float | None = None
    while True:
        pod = call(api, "GET", path, f"reading the probe Pod on node {t.node}") or {}
        phase, detail = container_phase(pod)
        now = time.monotonic()
        if phase == "done":
            if detail == "DeadlineExceeded":
                return [_overran(t, deadline_s, pull_timeout_s)]
            logs = send(
                api, "GET", f"{path}/log", f"reading the probe's output on node {t.node}"
            ).text
            return findings_from_logs(t, logs)
        if phase == "failed-to-start":
            return [
                PROBE_POD.finding(
                    Severity.ERROR,
                    t.node,
                    f"the probe Pod on {t.node} could not start image {image}: {detail}",
                    hint="Any image with python3 runs the probe: pass --probe-image with one "
                    "the node can pull (and imagePullSecrets it has), e.g. a python slim image.",
                    evidence={"image": image, "state": detail},
                )
            ]
        if phase == "running" and started is None:
            started = now
        if started is None and now - created > pull_timeout_s:
            return [
                PROBE_POD.finding(
                    Severity.FAIL,
                    t.node,
                    f"the probe Pod on {t.node} did not start within the pull timeout of "
                    f"{pull_timeout_s} s (image {image} still pulling, or the Pod not "
                    "admitted)",
                    hint="Raise --pull-timeout, or pass --probe-image with a small image that "
                    "has python3.",
                    evidence={"image": image, "pull_timeout_s": pull_timeout_s},
                )
            ]
        if started is not None and now - started > deadline_s:
            return [_overran(t, deadline_s, pull_timeout_s)]
        events = (
            call(
                api,
                "GET",
                f"/api/v1/namespaces/{namespace}/events",
                f"reading the probe Pod's events on node {t.node}",
                params={"fieldSelector": f"involvedObject.name={name}"},
            )
            or {}
        )
        explained = interpret_events(
            t, [e for e in events.get("items") or () if isinstance(e, dict)]
        )
        if explained is not None:
            return [explained]
        time.sleep(poll_s)


def _overran(t: ProbeTarget, deadline_s: int, pull_timeout_s: int) -> Finding:
    return PROBE_POD.finding(
        Severity.FAIL,
        t.node,
        f"the probe on {t.node} did not finish within {deadline_s} s of its start",
        hint="A directory on a slow network mount can take this long to read: see the "
        "probe's mount check on the node (`servebook probe DIR`), or raise --probe-deadline.",
        evidence={"deadline_s": deadline_s, "pull_timeout_s": pull_timeout_s},
    )
