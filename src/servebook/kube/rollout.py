"""Is a Kubernetes deployment coming up, up, or never going to be?  Pure functions over
the API objects (Pods, Events, Deployments as ``kubectl get -o json`` prints them).

Field notes: deploys took 10-14 minutes before the engine got far enough to complain, and
one hung for 45 minutes.  A rollout that cannot succeed usually says so within seconds,
in a place nobody looks: an image that cannot be pulled, a hostPath that is absent on the
node, a scheduler that cannot place the Pod, a container that exited.  ``role_state``
reads those places and returns ``failed`` with the evidence as soon as one of them is
conclusive, ``waiting`` (with what it is waiting for) while the rollout can still
succeed, and ``ready`` when every Pod of the role is Ready.

Some things are conclusive only after a grace period, because a cluster can fix them by
itself: a Pod the scheduler cannot place (an autoscaler may add a node), a Deployment with
no Pod at all (a ReplicaSet is created asynchronously), a volume the kubelet cannot mount
yet (it emits passing ``FailedMount`` events such as ``kube-root-ca.crt not registered``,
kubernetes#105204: final only when its retries persist past ``MOUNT_GRACE_S`` or it says it
timed out, and never once a container has started) and an image pull or container
creation that failed (final once the kubelet's back-off has repeated, ``BACKOFF_FINAL``
times, or its failures are ``RETRY_GRACE_S`` old).  An invalid image name, an absent
hostPath and a crashed engine (restarted into the same crash) are conclusive at once.

Only *this* apply's Pods count.  A re-``up`` after a change leaves the previous Pod Ready
for a while (or listed while it terminates); reporting it as the role's Ready Pod would be
a false success.  Given the role's Deployment and ReplicaSets, ``role_state`` follows the
Deployment controller: while it has not observed the applied generation
(``status.observedGeneration < metadata.generation``) the role is waiting; otherwise the
current ReplicaSet is the one the Deployment owns whose ``deployment.kubernetes.io/revision``
annotation equals the Deployment's and that is scaled up, and its ``pod-template-hash``
label selects this apply's Pods.  Under ``Recreate`` the controller keeps the previous
revision's annotation (its ReplicaSet scaled to 0) until the old Pods have stopped, so no
Pod counts then.  Pods of another template hash are reported as old, never judged and never
counted Ready; and the role is ready only when ``status.updatedReplicas`` has reached
``spec.replicas``.  Without the Deployment and ReplicaSets the newest Pod is judged, as
before.

Restarts count from this apply: ``restart_counts(pods)`` taken when the objects are applied
is the ``restart_baseline``.  A container that restarted before it (and runs now) is not a
crash of this deploy; one that restarted since, or that is crash-looping or has exited now,
is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from servebook.kube.objects import (
    annotation,
    as_int,
    condition,
    container_statuses,
    event_since,
    hostpath_absent,
    is_ready,
    is_terminating,
    labels_of,
    owned_by,
    parse_time,
    restarts,
)

Obj = Mapping[str, Any]

# Waiting reasons of a container that will not resolve by waiting: InvalidImageName at
# once; the others once the kubelet's retries have persisted (``_persisted``): a pull that
# failed once (a registry's blip, a rate limit) or a Secret created a moment late heal.
FATAL_WAITING = {
    "ErrImagePull": "the image cannot be pulled",
    "ImagePullBackOff": "the image cannot be pulled",
    "InvalidImageName": "the image name is invalid",
    "CreateContainerConfigError": "the container's configuration is invalid",
    "CreateContainerError": "the container could not be created",
    "RunContainerError": "the container could not be started",
}


FINAL_AT_ONCE = {"InvalidImageName"}
# The kubelet backs off 10 s, 20 s, 40 s... between tries: a back-off repeated this often,
# or failures older than this, are its verdict.
BACKOFF_FINAL = 3
RETRY_GRACE_S = 180.0
# A volume mount the kubelet still retries after this long is not a passing error: after
# 2 minutes it reports "Unable to attach or mount volumes ... timed out".
MOUNT_GRACE_S = 120.0
MOUNT_TIMED_OUT = "Unable to attach or mount volumes"

REVISION = "deployment.kubernetes.io/revision"
TEMPLATE_HASH = "pod-template-hash"
ENGINE_CONTAINER = "engine"


@dataclass(frozen=True)
class RoleState:
    role: str
    state: Literal["ready", "waiting", "failed"]
    summary: str
    # Evidence for a person: the event or status text that decided, the node, the Pod.
    evidence: dict[str, Any] = field(default_factory=dict)
    # This apply's Pod that was judged (None when it has none yet).
    pod: str | None = None
    # Set when a container exited: read its previous log for the cause.
    crashed_container: str | None = None
    # What `servebook status` shows per role, all of the judged Pod: its node (where it is
    # scheduled, else the node it is pinned to), whether it is Ready, its containers'
    # restarts since this apply (beyond the baseline), the engine container's image.
    node: str | None = None
    ready: bool = False
    restarts_since_apply: int = 0
    image: str | None = None
    # The Deployment revision this apply rolls out, when the Deployment was given.
    revision: str | None = None
    # Pods of an earlier revision (or being deleted) that are not this role's Pods.
    old_pods: tuple[str, ...] = ()


def restart_counts(pods: Iterable[Obj]) -> dict[str, int]:
    """Pod uid -> the sum of its containers' ``restartCount``: record it when applying and
    pass it back as ``role_state(..., restart_baseline=...)``."""
    out = {}
    for p in pods:
        uid = p.get("metadata", {}).get("uid")
        if uid:
            out[str(uid)] = restarts(p)
    return out


def _newest(pods: Sequence[Obj]) -> Obj | None:
    """The Pod that matters: the newest one that is not being deleted."""
    live = [p for p in pods if not is_terminating(p)]
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


def _age_s(since: datetime | None, now: datetime) -> float:
    return (now - since).total_seconds() if since else 0.0


@dataclass(frozen=True)
class _Rollout:
    """What the Deployment and its ReplicaSets say about the rollout of this apply."""

    known: bool = False  # False: neither was given; judge the newest Pod as before
    unobserved: str | None = None  # the controller has not yet observed the applied spec
    replicaset: str | None = None  # the current ReplicaSet's name
    template_hash: str | None = None  # selects this apply's Pods; None: no Pod counts yet
    revision: str | None = None  # the current ReplicaSet's revision
    desired: int = 1
    updated: int | None = None  # status.updatedReplicas, when the Deployment was given


def _rollout(
    deployment_name: str, deployment: Obj | None, replicasets: Sequence[Obj] | None
) -> _Rollout:
    if deployment is None and replicasets is None:
        return _Rollout()
    revision = None
    desired = 1
    updated = None
    uid = None
    if deployment is not None:
        meta = deployment.get("metadata", {})
        status = deployment.get("status") or {}
        uid = meta.get("uid")
        generation = as_int(meta.get("generation"), 0)
        observed = as_int(status.get("observedGeneration"), 0)
        if observed < generation:
            return _Rollout(
                known=True,
                unobserved=f"rollout of generation {generation} not yet observed by the "
                f"Deployment controller (it has observed {observed or 'none'})",
            )
        revision = annotation(deployment, REVISION)
        desired = as_int((deployment.get("spec") or {}).get("replicas"), 1)
        updated = as_int(status.get("updatedReplicas"), 0)  # omitted when 0
    if replicasets is None:
        # Without the ReplicaSets the template hash is unknown: the Deployment's counters
        # still gate readiness, and the newest Pod is judged.
        return _Rollout(known=True, desired=desired, updated=updated)
    owned = [rs for rs in replicasets if owned_by(rs, "Deployment", deployment_name, uid)]
    if deployment is None:
        # No Deployment: the highest revision is the current one.
        owned = sorted(owned, key=lambda rs: as_int(annotation(rs, REVISION), -1))[-1:]
        revision = annotation(owned[0], REVISION) if owned else None
    current = [
        rs
        for rs in owned
        if revision is not None
        and annotation(rs, REVISION) == revision
        # Under Recreate the Deployment keeps the old revision, its ReplicaSet scaled to
        # 0, until the old Pods have stopped and the new ReplicaSet is created.
        and (as_int((rs.get("spec") or {}).get("replicas"), 1) > 0 or desired == 0)
    ]
    rs = current[0] if current else None
    return _Rollout(
        known=True,
        replicaset=str(rs.get("metadata", {}).get("name", "")) if rs else None,
        template_hash=(
            str(labels_of(rs).get(TEMPLATE_HASH) or "")
            or str(
                (((rs.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}).get(
                    TEMPLATE_HASH, ""
                )
            )
            or None
        )
        if rs
        else None,
        revision=revision if rs else None,
        desired=desired,
        updated=updated,
    )


def _engine_image(pod: Obj) -> str | None:
    containers = pod.get("spec", {}).get("containers") or []
    engine = [c for c in containers if c.get("name") == ENGINE_CONTAINER] or containers[:1]
    if engine and engine[0].get("image"):
        return str(engine[0]["image"])
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        if cs.get("name") == ENGINE_CONTAINER and cs.get("image"):
            return str(cs["image"])
    return None


def _persisted(events: Sequence[Obj], now: datetime, grace_s: float, *, count: int) -> bool:
    """Whether the kubelet's repeated events say it has kept failing: one seen ``count``
    times or more (``count`` 0: never by count), or the first of them ``grace_s`` ago."""
    for e in events:
        if count and as_int(e.get("count"), 1) >= count:
            return True
        first = parse_time(e.get("firstTimestamp") or e.get("eventTime"))
        if first is not None and _age_s(first, now) >= grace_s:
            return True
    return False


def _terminated_at(cs: Obj) -> str:
    last = (cs.get("lastState") or {}).get("terminated") or {}
    return str(last.get("finishedAt") or "")


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
    deployment: Obj | None = None,
    replicasets: Sequence[Obj] | None = None,
    restart_baseline: Mapping[str, int] | None = None,
) -> RoleState:
    """The state of one role (one Deployment with one replica) from its Pods and the
    namespace's events.  ``started`` is when servebook applied the objects.

    ``deployment`` (the role's apps/v1 Deployment) and ``replicasets`` (the ReplicaSets
    of the namespace, or of the role's selector) make the verdict one on this apply's
    rollout; ``restart_baseline`` (``restart_counts`` of the role's Pods when applying)
    makes restarts count from this apply.  Without them, the newest Pod is judged and
    every restart counts."""
    ro = _rollout(deployment_name, deployment, replicasets)
    if ro.unobserved:
        old = _old_pods(ro, pods, [], None)
        return RoleState(
            role,
            "waiting",
            ro.unobserved + _old_note(pods, old),
            {"old_pods": list(old)},
            old_pods=old,
        )
    mine = _this_applys_pods(ro, pods, replicasets)
    pod = _newest(mine)
    old = _old_pods(ro, pods, mine, pod)
    note = _old_note(pods, old)
    rollout: dict[str, Any] = {}
    if ro.known:
        rollout = {"revision": ro.revision, "old_pods": list(old)}
        if ro.replicaset:
            rollout["replicaset"] = ro.replicaset
    if pod is None:
        return _without_pod(
            role,
            deployment_name,
            ro,
            old,
            note,
            rollout,
            _failed_creates(events, ro, deployment_name, started),
            waited=_age_s(started, now),
            no_pod_grace_s=no_pod_grace_s,
            replicasets_given=replicasets is not None,
        )
    judged = _judged(role, pod, ro, old, note, rollout, events, now, restart_baseline)
    return (
        _mount_verdict(judged)
        or _ended_verdict(judged)
        or _schedule_verdict(judged, unschedulable_grace_s)
        or _container_verdict(judged)
        or _ready_or_starting(judged, ro, mine)
    )


def _old_pods(
    ro: _Rollout, pods: Sequence[Obj], mine: Sequence[Obj], chosen: Obj | None
) -> tuple[str, ...]:
    """The Pods that are not this apply's (or are being deleted), by name; none without
    the rollout."""
    if not ro.known:
        return ()
    names = []
    for p in pods:
        if p is chosen:
            continue
        meta = p.get("metadata", {})
        if not any(p is m for m in mine) or meta.get("deletionTimestamp"):
            names.append(str(meta.get("name", "")))
    return tuple(sorted(names))


def _old_note(pods: Sequence[Obj], old: tuple[str, ...]) -> str:
    """What each old Pod is doing, appended to every summary."""
    if not old:
        return ""
    by_name = {str(p.get("metadata", {}).get("name", "")): p for p in pods}
    parts = []
    for n in old:
        p = by_name.get(n, {})
        if is_terminating(p):
            parts.append(f"old Pod {n} terminating")
        elif is_ready(p):
            parts.append(f"old Pod {n} still Ready (not counted)")
        else:
            parts.append(f"old Pod {n} not counted")
    return "; " + "; ".join(parts)


def _this_applys_pods(
    ro: _Rollout, pods: Sequence[Obj], replicasets: Sequence[Obj] | None
) -> Sequence[Obj]:
    if ro.template_hash is not None:
        return [p for p in pods if labels_of(p).get(TEMPLATE_HASH) == ro.template_hash]
    if ro.known and replicasets is not None:
        return []  # the current ReplicaSet does not exist yet: no Pod is this apply's
    return pods


def _failed_creates(
    events: Sequence[Obj], ro: _Rollout, deployment_name: str, started: datetime
) -> list[Obj]:
    """The role's ReplicaSet's ``FailedCreate`` events since this apply."""
    return [
        e
        for e in (
            _events_for(events, "ReplicaSet", ro.replicaset, exact=True)
            if ro.replicaset
            else _events_for(events, "ReplicaSet", deployment_name + "-", exact=False)
        )
        if e.get("reason") == "FailedCreate"
        # Events outlive their objects (an hour by default): an earlier deploy's refusal
        # in the same namespace is not this one's.
        and event_since(e, started)
    ]


def _without_pod(
    role: str,
    deployment_name: str,
    ro: _Rollout,
    old: tuple[str, ...],
    note: str,
    rollout: dict[str, Any],
    failed_create: list[Obj],
    *,
    waited: float,
    no_pod_grace_s: float,
    replicasets_given: bool,
) -> RoleState:
    """A role with no Pod of this apply: refused, waiting for the old Pods to stop or for
    the controller, or failed after ``no_pod_grace_s``."""
    if failed_create:
        msg = str(failed_create[-1].get("message", ""))
        return RoleState(
            role,
            "failed",
            f"the cluster refused to create its Pod: {msg}",
            {"event": msg, "reason": "FailedCreate", **rollout},
            revision=ro.revision,
            old_pods=old,
        )
    if old and ro.known:
        # The controller creates this apply's Pod once the old ones have stopped.
        what = (
            f"no Pod of ReplicaSet {ro.replicaset} yet"
            if ro.replicaset
            else "the Deployment controller has not created this apply's ReplicaSet yet"
            if replicasets_given
            else "no Pod of this apply yet"
        )
        return RoleState(
            role,
            "waiting",
            what + note,
            {**rollout, "waited_s": round(waited)},
            revision=ro.revision,
            old_pods=old,
        )
    if waited > no_pod_grace_s:
        return RoleState(
            role,
            "failed",
            f"no Pod was created for Deployment {deployment_name} in {waited:.0f} s "
            "(`kubectl describe deployment` and the namespace's events say why)",
            {"waited_s": round(waited), **rollout},
            revision=ro.revision,
            old_pods=old,
        )
    return RoleState(
        role, "waiting", "no Pod yet" + note, rollout, revision=ro.revision, old_pods=old
    )


@dataclass(frozen=True)
class _Judged:
    """The Pod a role is judged by, and what every verdict on it carries."""

    role: str
    pod: Obj
    name: str
    node: Any
    now: datetime
    note: str  # the old Pods, after every summary
    rollout: dict[str, Any]
    per_role: dict[str, Any]
    base: dict[str, Any]  # the evidence every verdict starts from
    pod_events: list[Obj]
    statuses: list[Obj]
    since_apply: int  # restarts since this apply
    from_apply: bool  # restarts are counted from this apply (a baseline was given)

    def result(
        self,
        state: Literal["ready", "waiting", "failed"],
        summary: str,
        evidence: dict[str, Any],
        crashed: str | None = None,
    ) -> RoleState:
        return RoleState(
            self.role,
            state,
            summary + self.note,
            {**evidence, **self.rollout},
            crashed_container=crashed,
            **self.per_role,
        )


def _judged(
    role: str,
    pod: Obj,
    ro: _Rollout,
    old: tuple[str, ...],
    note: str,
    rollout: dict[str, Any],
    events: Sequence[Obj],
    now: datetime,
    restart_baseline: Mapping[str, int] | None,
) -> _Judged:
    meta = pod.get("metadata", {})
    name = str(meta.get("name", ""))
    node = pod.get("spec", {}).get("nodeName") or pod.get("spec", {}).get("nodeSelector", {}).get(
        "kubernetes.io/hostname"
    )
    baseline = int((restart_baseline or {}).get(str(meta.get("uid", "")), 0))
    since_apply = max(0, restarts(pod) - baseline)
    per_role: dict[str, Any] = {
        "pod": name,
        "node": None if node is None else str(node),
        "ready": is_ready(pod),
        "restarts_since_apply": since_apply,
        "image": _engine_image(pod),
        "revision": ro.revision,
        "old_pods": old,
    }
    return _Judged(
        role=role,
        pod=pod,
        name=name,
        node=node,
        now=now,
        note=note,
        rollout=rollout,
        per_role=per_role,
        base={"pod": name, "node": node},
        pod_events=_events_for(events, "Pod", name, exact=True),
        statuses=container_statuses(pod),
        since_apply=since_apply,
        from_apply=restart_baseline is not None,
    )


def _mount_verdict(j: _Judged) -> RoleState | None:
    """A volume that cannot be mounted: an absent hostPath at once, others once the
    kubelet's retries persist; nothing once a container has started."""
    # Once a container has started, every volume was mounted: earlier FailedMount events
    # (kubelet's passing "kube-root-ca.crt not registered", kubernetes#105204) are past.
    mounted = is_ready(j.pod) or any(
        cs.get("started") or (cs.get("state") or {}).get("running") for cs in j.statuses
    )
    for e in [] if mounted else reversed(j.pod_events):
        msg = str(e.get("message", ""))
        absent = hostpath_absent(msg)
        if e.get("reason") == "FailedMount" and absent:
            return j.result(
                "failed",
                f"{absent} is absent on node {j.node}: the hostPath mount failed. Put "
                "the weights there, or fix the model directory parameter and render again.",
                {**j.base, "event": msg, "reason": "FailedMount"},
            )
        if e.get("reason") == "FailedMount":
            if MOUNT_TIMED_OUT in msg or _persisted([e], j.now, MOUNT_GRACE_S, count=0):
                return j.result(
                    "failed",
                    f"a volume of Pod {j.name} cannot be mounted on node {j.node}: {msg}",
                    {**j.base, "event": msg, "reason": "FailedMount"},
                )
            return j.result(
                "waiting",
                f"a volume of Pod {j.name} is not mounted yet (the kubelet retries): {msg}",
                {**j.base, "event": msg, "reason": "FailedMount"},
            )
    return None


def _ended_verdict(j: _Judged) -> RoleState | None:
    status = j.pod.get("status", {})
    phase = status.get("phase")
    if phase in ("Failed", "Succeeded"):
        why = status.get("message") or status.get("reason") or phase
        return j.result(
            "failed", f"Pod {j.name} ended ({phase}): {why}", {**j.base, "phase": phase}
        )
    return None


def _schedule_verdict(j: _Judged, unschedulable_grace_s: float) -> RoleState | None:
    """A Pod the scheduler cannot place: waiting, then failed after the grace period."""
    sched = condition(j.pod, "PodScheduled")
    if sched is None or sched.get("status") != "False":
        return None
    msg = str(sched.get("message") or sched.get("reason") or "")
    waited = _age_s(parse_time(str(j.pod.get("metadata", {}).get("creationTimestamp"))), j.now)
    if waited > unschedulable_grace_s:
        return j.result(
            "failed",
            f"Pod {j.name} could not be scheduled for {waited:.0f} s: {msg}",
            {**j.base, "scheduler": msg, "waited_s": round(waited)},
        )
    return j.result("waiting", f"not scheduled yet: {msg}", {**j.base, "scheduler": msg})


def _container_verdict(j: _Judged) -> RoleState | None:
    """The first container that cannot start (an image, its configuration) or that
    crashed since this apply, is crash-looping or has exited."""
    # The restarts beyond the baseline are the container's whose last exit is the newest.
    restarted = sorted(
        (
            cs
            for cs in j.statuses
            if as_int(cs.get("restartCount")) > 0 and (cs.get("lastState") or {}).get("terminated")
        ),
        key=_terminated_at,
    )
    last_out = str(restarted[-1].get("name", "")) if j.since_apply and restarted else None
    for cs in j.statuses:
        reason = str(((cs.get("state") or {}).get("waiting") or {}).get("reason", ""))
        if reason in FATAL_WAITING:
            return _cannot_start(j, cs, reason)
        last = (cs.get("lastState") or {}).get("terminated")
        if str(cs.get("name", "")) == last_out and last:
            return _crashed_since_apply(j, cs, last)
        ended = (cs.get("state") or {}).get("terminated")
        if reason == "CrashLoopBackOff" or ended:
            return _crashing_now(j, cs, reason, ended or last or {})
    return None


def _cannot_start(j: _Judged, cs: Obj, reason: str) -> RoleState:
    """A container waiting for a reason that waiting will not cure: final at once, or once
    the kubelet's retries have persisted (the Pod's age when there are no events)."""
    msg = str(((cs.get("state") or {}).get("waiting") or {}).get("message", ""))
    tries = [e for e in j.pod_events if e.get("reason") in ("Failed", "BackOff")]
    final = reason in FINAL_AT_ONCE or _persisted(tries, j.now, RETRY_GRACE_S, count=BACKOFF_FINAL)
    if not tries:  # no events to read: the Pod's own age
        created = parse_time(str(j.pod.get("metadata", {}).get("creationTimestamp")))
        final = final or _age_s(created, j.now) > RETRY_GRACE_S + 120.0
    return j.result(
        "failed" if final else "waiting",
        f"{FATAL_WAITING[reason]} ({reason}): {msg or cs.get('image', '')}"
        + ("" if final else "; the kubelet retries, not yet final"),
        {**j.base, "container": str(cs.get("name", "")), "reason": reason, "message": msg},
    )


def _crashed_since_apply(j: _Judged, cs: Obj, last: Obj) -> RoleState:
    n = min(j.since_apply, as_int(cs.get("restartCount")))
    when = " since this apply" if j.from_apply else ""
    return _crashed(
        j,
        cs,
        last,
        n,
        f"container {cs.get('name', '')} exited with code {last.get('exitCode')} "
        f"({last.get('reason') or 'Error'}) and was restarted {n} time(s){when}; it will "
        "restart into the same failure",
    )


def _crashing_now(j: _Judged, cs: Obj, reason: str, exit_: Obj) -> RoleState:
    """Crash-looping or exited now, whenever its restarts were counted."""
    doing = "is crash-looping (CrashLoopBackOff)" if reason else "has exited"
    return _crashed(
        j,
        cs,
        exit_,
        j.since_apply,
        f"container {cs.get('name', '')} {doing}: its last run exited with code "
        f"{exit_.get('exitCode')} ({exit_.get('reason') or 'Error'}); it will restart into "
        "the same failure",
    )


def _crashed(j: _Judged, cs: Obj, exit_: Obj, since_apply: int, summary: str) -> RoleState:
    """A container's crash, with its exit and restarts as evidence."""
    cname = str(cs.get("name", ""))
    evidence = {
        **j.base,
        "container": cname,
        "exit_code": exit_.get("exitCode"),
        "reason": exit_.get("reason") or "Error",
        "message": exit_.get("message"),
        "restarts": as_int(cs.get("restartCount")),
        "restarts_since_apply": since_apply,
    }
    return j.result("failed", summary, evidence, crashed=cname)


def _ready_or_starting(j: _Judged, ro: _Rollout, mine: Sequence[Obj]) -> RoleState:
    """No verdict of failure: ready when this apply's Pods are, else what it waits for."""
    if is_ready(j.pod):
        live_mine = [p for p in mine if not is_terminating(p)]
        ready_n = sum(1 for p in live_mine if is_ready(p))
        if ro.updated is not None and ro.updated < ro.desired:
            return j.result(
                "waiting",
                f"Pod {j.name} is Ready on {j.node}, but the Deployment reports {ro.updated} "
                f"of {ro.desired} Pod(s) of this apply's template",
                j.base,
            )
        if ro.known and ready_n < ro.desired:
            return j.result("waiting", f"{ready_n} of {ro.desired} Pods Ready", j.base)
        return j.result("ready", f"Pod {j.name} is Ready on {j.node}", j.base)
    running_since = None
    for cs in j.statuses:
        running_since = parse_time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
    if running_since is not None:
        what = f"engine starting on {j.node} for {_age_s(running_since, j.now):.0f} s"
    else:
        reason = ""
        for cs in j.statuses:
            reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason") or reason
        phase = j.pod.get("status", {}).get("phase")
        what = f"{reason or phase or 'Pending'} on {j.node}"
    return j.result("waiting", what, j.base)


def overall(states: Sequence[RoleState]) -> Literal["ready", "waiting", "failed"]:
    if any(s.state == "failed" for s in states):
        return "failed"
    if states and all(s.state == "ready" for s in states):
        return "ready"
    return "waiting"
