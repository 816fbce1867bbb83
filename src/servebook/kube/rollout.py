"""Is a Kubernetes deployment coming up, up, or never going to be?  Pure functions over
the API objects (Pods, Events, Deployments as ``kubectl get -o json`` prints them).

Field notes: deploys took 10-14 minutes before the engine got far enough to complain, and
one hung for 45 minutes.  A rollout that cannot succeed usually says so within seconds,
in a place nobody looks: an image that cannot be pulled, a hostPath that is absent on the
node, a scheduler that cannot place the Pod, a container that exited.  ``role_state``
reads those places and returns ``failed`` with the evidence as soon as one of them is
conclusive, ``waiting`` (with what it is waiting for) while the rollout can still
succeed, and ``ready`` when every Pod of the role is Ready.

Two things are conclusive only after a grace period, because a cluster can fix them by
itself: a Pod the scheduler cannot place (an autoscaler may add a node) and a Deployment
with no Pod at all (a ReplicaSet is created asynchronously).  Everything else listed
above is conclusive at once: a hostPath mount failure never heals, and a crashed engine
is restarted into the same crash.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

Obj = Mapping[str, Any]

# Waiting reasons of a container that will not resolve by waiting.
FATAL_WAITING = {
    "ErrImagePull": "the image cannot be pulled",
    "ImagePullBackOff": "the image cannot be pulled",
    "InvalidImageName": "the image name is invalid",
    "CreateContainerConfigError": "the container's configuration is invalid",
    "CreateContainerError": "the container could not be created",
    "RunContainerError": "the container could not be started",
}
_HOSTPATH = re.compile(r"hostPath type check failed: (?P<path>\S+) is not a directory")


@dataclass(frozen=True)
class RoleState:
    role: str
    state: Literal["ready", "waiting", "failed"]
    summary: str
    # Evidence for a person: the event or status text that decided, the node, the Pod.
    evidence: dict[str, Any] = field(default_factory=dict)
    pod: str | None = None
    # Set when a container exited: read its previous log for the cause.
    crashed_container: str | None = None


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _newest(pods: Sequence[Obj]) -> Obj | None:
    """The Pod that matters: the newest one that is not being deleted."""
    live = [p for p in pods if not p.get("metadata", {}).get("deletionTimestamp")]
    if not live:
        return None
    return max(live, key=lambda p: str(p.get("metadata", {}).get("creationTimestamp", "")))


def _events_for(events: Iterable[Obj], kind: str, name_prefix: str, exact: bool) -> list[Obj]:
    out = []
    for e in events:
        inv = e.get("involvedObject", {})
        name = str(inv.get("name", ""))
        if inv.get("kind") == kind and (
            name == name_prefix if exact else name.startswith(name_prefix)
        ):
            out.append(e)
    return sorted(out, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))


def _ready(pod: Obj) -> bool:
    conds = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _condition(pod: Obj, kind: str) -> Obj | None:
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return None


def _age_s(since: datetime | None, now: datetime) -> float:
    return (now - since).total_seconds() if since else 0.0


def role_state(
    role: str,
    deployment_name: str,
    pods: Sequence[Obj],
    events: Sequence[Obj],
    *,
    now: datetime,
    started: datetime,
    unschedulable_grace_s: float = 120.0,
    no_pod_grace_s: float = 60.0,
) -> RoleState:
    """The state of one role (one Deployment with one replica) from its Pods and the
    namespace's events.  ``started`` is when servebook applied the objects."""
    failed_create = [
        e
        for e in _events_for(events, "ReplicaSet", deployment_name + "-", exact=False)
        if e.get("reason") == "FailedCreate"
        # Events outlive their objects (an hour by default): an earlier deploy's refusal
        # in the same namespace is not this one's.
        and (_time(e.get("lastTimestamp") or e.get("eventTime")) or now) >= started
    ]
    pod = _newest(pods)
    if pod is None:
        if failed_create:
            msg = str(failed_create[-1].get("message", ""))
            return RoleState(
                role,
                "failed",
                f"the cluster refused to create its Pod: {msg}",
                {"event": msg, "reason": "FailedCreate"},
            )
        waited = _age_s(started, now)
        if waited > no_pod_grace_s:
            return RoleState(
                role,
                "failed",
                f"no Pod was created for Deployment {deployment_name} in {waited:.0f} s "
                "(`kubectl describe deployment` and the namespace's events say why)",
                {"waited_s": round(waited)},
            )
        return RoleState(role, "waiting", "no Pod yet")

    name = str(pod.get("metadata", {}).get("name", ""))
    node = pod.get("spec", {}).get("nodeName") or pod.get("spec", {}).get("nodeSelector", {}).get(
        "kubernetes.io/hostname"
    )
    status = pod.get("status", {})
    base: dict[str, Any] = {"pod": name, "node": node}
    pod_events = _events_for(events, "Pod", name, exact=True)

    for e in reversed(pod_events):
        msg = str(e.get("message", ""))
        m = _HOSTPATH.search(msg)
        if e.get("reason") == "FailedMount" and m:
            return RoleState(
                role,
                "failed",
                f"{m.group('path')} is absent on node {node}: the hostPath mount failed. Put "
                "the weights there, or fix the model directory parameter and render again.",
                {**base, "event": msg, "reason": "FailedMount"},
                pod=name,
            )
        if e.get("reason") == "FailedMount":
            return RoleState(
                role,
                "failed",
                f"a volume of Pod {name} cannot be mounted on node {node}: {msg}",
                {**base, "event": msg, "reason": "FailedMount"},
                pod=name,
            )

    phase = status.get("phase")
    if phase in ("Failed", "Succeeded"):
        why = status.get("message") or status.get("reason") or phase
        return RoleState(
            role, "failed", f"Pod {name} ended ({phase}): {why}", {**base, "phase": phase}, pod=name
        )

    sched = _condition(pod, "PodScheduled")
    if sched is not None and sched.get("status") == "False":
        msg = str(sched.get("message") or sched.get("reason") or "")
        waited = _age_s(_time(str(pod.get("metadata", {}).get("creationTimestamp"))), now)
        if waited > unschedulable_grace_s:
            return RoleState(
                role,
                "failed",
                f"Pod {name} could not be scheduled for {waited:.0f} s: {msg}",
                {**base, "scheduler": msg, "waited_s": round(waited)},
                pod=name,
            )
        return RoleState(role, "waiting", f"not scheduled yet: {msg}", {**base, "scheduler": msg})

    for cs in status.get("containerStatuses") or []:
        cname = str(cs.get("name", ""))
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason", ""))
        if reason in FATAL_WAITING:
            msg = str(waiting.get("message", ""))
            return RoleState(
                role,
                "failed",
                f"{FATAL_WAITING[reason]} ({reason}): {msg or cs.get('image', '')}",
                {**base, "container": cname, "reason": reason, "message": msg},
                pod=name,
            )
        last = (cs.get("lastState") or {}).get("terminated")
        restarts = int(cs.get("restartCount") or 0)
        if restarts > 0 and last:
            code = last.get("exitCode")
            why = last.get("reason") or "Error"
            return RoleState(
                role,
                "failed",
                f"container {cname} exited with code {code} ({why}) and was restarted "
                f"{restarts} time(s); it will restart into the same failure",
                {
                    **base,
                    "container": cname,
                    "exit_code": code,
                    "reason": why,
                    "message": last.get("message"),
                    "restarts": restarts,
                },
                pod=name,
                crashed_container=cname,
            )

    if _ready(pod):
        return RoleState(role, "ready", f"Pod {name} is Ready on {node}", base, pod=name)
    running_since = None
    for cs in status.get("containerStatuses") or []:
        running_since = _time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
    if running_since is not None:
        what = f"engine starting on {node} for {_age_s(running_since, now):.0f} s"
    else:
        reason = ""
        for cs in status.get("containerStatuses") or []:
            reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason") or reason
        what = f"{reason or phase or 'Pending'} on {node}"
    return RoleState(role, "waiting", what, base, pod=name)


def overall(states: Sequence[RoleState]) -> Literal["ready", "waiting", "failed"]:
    if any(s.state == "failed" for s in states):
        return "failed"
    if states and all(s.state == "ready" for s in states):
        return "ready"
    return "waiting"
