"""Run the node probe (``preflight/probe.py``) in a Pod on a target node.

The Pod is built to change nothing it checks: the model directory is mounted read-only
with hostPath ``type: Directory`` (an absent path fails the mount and is reported from the
Pod's event as "absent on node X"; ``DirectoryOrCreate`` once created a typo'd directory
and turned a fast failure into a slow crash loop), no privileges, a deadline, and the Pod
is deleted afterwards in every case, Ctrl-C included.  ``nodeName`` is set so a cordoned
node is still probed (the cordon is reported on its own by the cluster checks).

The manifest and the reading of events are pure functions; only ``run_probe_pod`` talks
to the cluster (kr8s).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from servebook.findings import Finding, Severity, register
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
    """One probe per (node, model dir, draft dir) the Plan's engine roles use."""
    seen: dict[tuple[str, str, str | None], list[str]] = {}
    image: dict[tuple[str, str, str | None], str] = {}
    for r in plan.engine_roles:
        node = r.placement.node
        if not node or not r.model_path:
            continue
        key = (node, r.model_path, r.draft_path)
        seen.setdefault(key, []).append(r.name)
        image[key] = r.image or plan.image or ""
    return [
        ProbeTarget(node=k[0], roles=tuple(v), image=image[k], model_dir=k[1], draft_dir=k[2])
        for k, v in seen.items()
    ]


def pod_manifest(
    t: ProbeTarget, *, namespace: str, deadline_s: int, script: str, name: str | None = None
) -> dict[str, Any]:
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
            "nodeName": t.node,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": deadline_s,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            # Probe wherever the engine would have to run, whatever its taints say.
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "probe",
                    "image": t.image,
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


def run_probe_pod(t: ProbeTarget, *, namespace: str, deadline_s: int = 120) -> list[Finding]:
    """Create the probe Pod, wait for it within the deadline, read its findings, delete it."""
    import kr8s
    from kr8s.objects import Pod

    script = probe_script_path().read_text(encoding="utf-8")
    manifest = pod_manifest(t, namespace=namespace, deadline_s=deadline_s, script=script)
    api = kr8s.api()
    pod = Pod(manifest, api=api)
    pod.create()
    try:
        end = time.monotonic() + deadline_s + 30
        while time.monotonic() < end:
            pod.refresh()
            phase = pod.status.get("phase")
            if phase in ("Succeeded", "Failed"):
                return findings_from_logs(t, "\n".join(pod.logs()))
            events = [
                e if isinstance(e, dict) else e.raw
                for e in api.get(
                    "events",
                    namespace=namespace,
                    field_selector=f"involvedObject.name={pod.name}",
                )
            ]
            explained = interpret_events(t, events)
            if explained is not None:
                return [explained]
            time.sleep(2)
        return [
            PROBE_POD.finding(
                Severity.FAIL,
                t.node,
                f"the probe Pod on {t.node} did not finish within {deadline_s} s",
            )
        ]
    finally:
        pod.delete(grace_period=0)
