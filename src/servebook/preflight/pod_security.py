"""SB265: the namespace's Pod Security level, read before the apply (issue 23 point 11).

Pod Security Admission enforces the level in a namespace's
``pod-security.kubernetes.io/enforce`` label on Pods, never on the Deployment or
LeaderWorkerSet that makes them: the apply succeeds, and the Pods are refused later, in
the ReplicaSet's events (a Deployment) or the StatefulSet's (a LeaderWorkerSet), while
``up`` waits.  servebook's engine Pods mount their weights and caches by ``hostPath``, and
GPU engines over RDMA add ``IPC_LOCK``: ``baseline`` refuses both, ``restricted`` more.  So
preflight reads the label (from the cluster or a snapshot) and says, before anything is
applied, which Pods the level refuses and why, in Pod Security's own words.

The rules, as k8s.io/pod-security-admission/policy states them for the fields servebook
writes: baseline forbids hostPath volumes and any added capability outside its default
set (check_capabilities_baseline.go; IPC_LOCK is not in it); restricted adds the volume
types, ``allowPrivilegeEscalation: false``, dropping ALL capabilities and running as
non-root.  SB264's dry run of each Pod template (where RBAC lets it create Pods) is the
authority; this check needs no permissions and runs on a snapshot too.  Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from servebook.findings import Finding, Severity, register_once
from servebook.preflight.admission import PSA_ENFORCE, PSA_LEVELS, pods_of

Obj = dict[str, Any]

POD_SECURITY = register_once(
    "SB265",
    "The namespace's Pod Security level admits the engine Pods",
    "Pod Security refuses Pods, not the workloads that make them: an apply into a "
    "namespace that enforces `baseline` or `restricted` succeeds, then every engine Pod "
    "(hostPath weights, IPC_LOCK for RDMA) is refused in the ReplicaSet's or StatefulSet's "
    "events while the deploy waits out its budget.",
    "Deploy into a namespace labelled pod-security.kubernetes.io/enforce=privileged (or "
    "without the label, where the cluster's default allows it), or ask the cluster's admin "
    "for an exemption; hostPath weights cannot run under baseline.",
)
CHECKS = (POD_SECURITY,)

# Pod Security's baseline set of capabilities a container may add (check_capabilities_
# baseline.go, capabilities_allowed_1_0).
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
        "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
# The one capability restricted lets a container add (check_capabilities_restricted.go).
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})


def _names(items: Sequence[str]) -> str:
    return ", ".join(f'"{i}"' for i in items)


def _who(names: Sequence[str], pod: bool = False) -> str:
    """``container "a"`` / ``containers "a", "b"`` (``pod or ...`` where the Pod's own
    securityContext would do), as Pod Security names them."""
    return ("pod or " if pod else "") + f"container{'s' if len(names) > 1 else ''} {_names(names)}"


def _added(containers: Sequence[Obj], allowed: frozenset[str]) -> str:
    """Pod Security's detail for capabilities added outside ``allowed`` ("" when none)."""
    added = {
        str(c.get("name")): sorted(
            set(((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or ())
            - allowed
        )
        for c in containers
    }
    added = {k: v for k, v in added.items() if v}
    if not added:
        return ""
    caps = sorted({x for v in added.values() for x in v})
    return (
        f"{_who(list(added))} must not include {_names(caps)} in securityContext.capabilities.add"
    )


def violations(level: str, pod_spec: Obj) -> list[str]:
    """Pod Security's forbidden reasons (with their details) for ``pod_spec`` at
    ``level``; empty: admitted (for the fields servebook writes).  In its words and in the
    order of its check IDs, as the test plane's API server (Kubernetes 1.37) refused
    servebook's Pods; at restricted its capability and volume checks replace baseline's."""
    if level not in ("baseline", "restricted"):
        return []
    containers = [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]
    host = [str(v.get("name")) for v in pod_spec.get("volumes") or () if "hostPath" in v]
    out: list[str] = []
    if level == "baseline":
        added = _added(containers, BASELINE_CAPABILITIES)
        if added:
            out.append(f"non-default capabilities ({added})")
        if host:
            out.append(f"hostPath volumes (volume{'s' if len(host) > 1 else ''} {_names(host)})")
        return out
    return _restricted(containers, host, pod_spec.get("securityContext") or {})


def _restricted(containers: Sequence[Obj], host: Sequence[str], pod_sc: Obj) -> list[str]:
    def failing(ok: Callable[[Obj], bool]) -> list[str]:
        return [str(c.get("name")) for c in containers if not ok(c.get("securityContext") or {})]

    out: list[str] = []
    escalating = failing(lambda sc: sc.get("allowPrivilegeEscalation") is False)
    if escalating:
        out.append(
            f"allowPrivilegeEscalation != false ({_who(escalating)} must set "
            "securityContext.allowPrivilegeEscalation=false)"
        )
    undropped = failing(lambda sc: "ALL" in ((sc.get("capabilities") or {}).get("drop") or ()))
    parts = [f'{_who(undropped)} must set securityContext.capabilities.drop=["ALL"]'] * bool(
        undropped
    )
    added = _added(containers, RESTRICTED_CAPABILITIES)
    parts += [added] * bool(added)
    if parts:
        out.append(f"unrestricted capabilities ({'; '.join(parts)})")
    if host:
        volumes = f"volume{'s' if len(host) > 1 else ''} {_names(host)}"
        verb = "uses" if len(host) == 1 else "use"
        out.append(f'restricted volume types ({volumes} {verb} restricted volume type "hostPath")')
    root = failing(lambda sc: sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True)
    if root:
        out.append(
            f"runAsNonRoot != true ({_who(root, pod=True)} must set "
            "securityContext.runAsNonRoot=true)"
        )
    profile = (pod_sc.get("seccompProfile") or {}).get("type")
    unconfined = failing(
        lambda sc: (
            (sc.get("seccompProfile") or {}).get("type", profile) in ("RuntimeDefault", "Localhost")
        )
    )
    if unconfined:
        out.append(
            f"seccompProfile ({_who(unconfined, pod=True)} must set "
            'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")'
        )
    return out


def enforce_label(namespace_obj: Obj | None) -> str | None:
    """The namespace's enforce label as written (None: no label, or no namespace)."""
    labels = ((namespace_obj or {}).get("metadata") or {}).get("labels") or {}
    value = labels.get(PSA_ENFORCE)
    return None if value is None else str(value)


def pod_security_finding(
    objects: Sequence[Obj], namespace: str, namespace_obj: Obj | None
) -> Finding:
    """SB265 for the rendered ``objects`` in ``namespace`` (``namespace_obj`` as read; None
    when it does not exist yet)."""
    subject = f"namespace/{namespace}"
    level = enforce_label(namespace_obj)
    evidence: dict[str, Any] = {"namespace": namespace, "enforce": level}
    if namespace_obj is None:
        return POD_SECURITY.finding(
            Severity.INFO,
            subject,
            f"namespace {namespace} does not exist yet: the render creates it without a "
            f"{PSA_ENFORCE} label, so the cluster's default level applies, which a "
            "namespace does not show (the API server's admission configuration sets it; "
            "privileged unless changed); SB264's dry run in preflight's own namespace "
            "stands in for it",
            evidence=evidence,
        )
    if level is None or level == "privileged":
        how = "privileged" if level else "no label: the cluster's default level applies"
        return POD_SECURITY.finding(
            Severity.PASS if level else Severity.INFO,
            subject,
            f"namespace {namespace} enforces Pod Security {how}"
            + ("" if level else " (privileged unless its admission configuration says else)"),
            evidence=evidence,
        )
    if level not in PSA_LEVELS:
        return POD_SECURITY.finding(
            Severity.FAIL,
            subject,
            f"namespace {namespace} has {PSA_ENFORCE}={level!r}, not one of "
            f"{', '.join(PSA_LEVELS)}: Pod Security refuses every Pod there",
            hint=POD_SECURITY.fix,
            evidence=evidence,
        )
    refused: list[str] = []
    for obj in objects:
        for owner, pod in pods_of(obj):
            why = violations(level, pod.get("spec") or {})
            if why:
                refused.append(f"the Pods of {obj.get('kind')}/{owner}: {', '.join(why)}")
    evidence["refused"] = refused
    if not refused:
        return POD_SECURITY.finding(
            Severity.PASS,
            subject,
            f"namespace {namespace} enforces Pod Security {level}, which admits every "
            "rendered Pod template",
            evidence=evidence,
        )
    return POD_SECURITY.finding(
        Severity.FAIL,
        subject,
        f"namespace {namespace} enforces Pod Security {level} ({PSA_ENFORCE}={level}), "
        f"which refuses {len(refused)} of the rendered Pod templates at Pod creation, "
        "after the apply succeeds: " + "; ".join(refused),
        hint=POD_SECURITY.fix,
        evidence=evidence,
    )


__all__ = ["CHECKS", "POD_SECURITY", "enforce_label", "pod_security_finding", "violations"]
