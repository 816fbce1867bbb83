"""Is a LeaderWorkerSet role coming up, up, or never going to be?  ``kube.rollout``'s
verdict for a role whose copy spans nodes, over its groups' Pods and the LeaderWorkerSet's
status as each LWS version writes it.  Pure functions over the API objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from servebook.kube.lws_events import Recreation, recreations, refusal_summary
from servebook.kube.objects import as_int, is_ready, is_terminating, labels_of, parse_time, restarts
from servebook.kube.rollout import RoleState, _age_s, _engine_image, role_state

Obj = Mapping[str, Any]

# --- LeaderWorkerSet groups -----------------------------------------------------------------
# A role whose copy spans nodes is a LeaderWorkerSet: each group (replica) is a leader Pod
# and size-1 worker Pods, labelled with the group's index.  A group serves only when every
# member runs: the leader's API server waits for every data-parallel rank, and the
# controller recreates the whole group when one member restarts.  So the role is ready
# only when every group has all its Pods Ready, and any member's failure fails the role.
# A member that crashes is seen restarted for a moment at most: the controller recreates
# the group at once (``kube.lws_events``), so its restart is judged on Pods being deleted
# too, and its ``RecreateGroup`` events fail the role when no poll saw the Pod.

LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def group_state(
    role: str,
    lws_name: str,
    pods: Sequence[Obj],
    events: Sequence[Obj],
    *,
    now: datetime,
    started: datetime,
    replicas: int,
    size: int,
    lws: Obj | None = None,
    restart_baseline: Mapping[str, int] | None = None,
    no_pod_grace_s: float = 120.0,
    changed: bool = False,
) -> RoleState:
    """The state of a LeaderWorkerSet role: ``replicas`` groups of ``size`` Pods.

    ``lws`` (the LeaderWorkerSet as the API returns it) gates the verdict on the
    controller having observed this apply and reporting every group updated and ready
    (``lws_unsettled``; ``changed``: this apply created or changed the set's spec);
    each member Pod is judged as ``role_state`` judges a Pod (mount failures, pulls,
    crashes, scheduling), and the first that failed fails the role, named."""
    live = [p for p in pods if not is_terminating(p)]
    gone = tuple(sorted(str(p["metadata"].get("name", "")) for p in pods if p not in live))
    failed = _failed_member(role, lws_name, live, events, now, started, restart_baseline)
    if failed is not None:
        return replace(failed, old_pods=gone)
    crash = _restarted_member(pods, restart_baseline)
    recreated = recreations(events, lws_name, started)
    if crash is not None or recreated is not None:
        return _recreated(role, crash, recreated, gone)
    groups: dict[str, list[Obj]] = {}
    for p in live:
        groups.setdefault(str(labels_of(p).get(LWS_GROUP_INDEX, "?")), []).append(p)
    short = not live or any(len(members) < size for members in groups.values())
    refused = refusal_summary(events, lws_name, started) if short else None
    if refused is not None:
        # The API server refused a Pod of the set (Pod Security, a quota, a webhook): no
        # wait makes it appear, and only the StatefulSets' events say why.
        return RoleState(
            role,
            "failed",
            refused + " (`kubectl get events --field-selector involvedObject.kind=StatefulSet`)",
            {"pods": len(live), "pods_expected": replicas * size},
            old_pods=gone,
        )
    unsettled = lws_unsettled(lws, started=started, changed=changed) if lws else None
    if unsettled:
        return RoleState(role, "waiting", unsettled, old_pods=gone)
    if not live:
        waited = _age_s(started, now)
        if waited > no_pod_grace_s:
            return RoleState(
                role,
                "failed",
                f"no Pod was created for LeaderWorkerSet {lws_name} in {waited:.0f} s (is the "
                "LeaderWorkerSet controller running? `kubectl describe leaderworkerset` and "
                "the namespace's events say why)",
                {"waited_s": round(waited)},
                old_pods=gone,
            )
        return RoleState(role, "waiting", "no Pod yet", old_pods=gone)
    return _groups_ready(role, live, groups, replicas, size, lws, restart_baseline, gone)


def _failed_member(
    role: str,
    lws_name: str,
    live: Sequence[Obj],
    events: Sequence[Obj],
    now: datetime,
    started: datetime,
    restart_baseline: Mapping[str, int] | None,
) -> RoleState | None:
    """The first member Pod (by name) that ``role_state`` judges failed, its group and
    member named; None when none has."""
    for p in sorted(live, key=lambda p: str(p.get("metadata", {}).get("name", ""))):
        one = role_state(
            role,
            lws_name,
            [p],
            events,
            now=now,
            started=started,
            restart_baseline=restart_baseline,
        )
        if one.state == "failed":
            member = labels_of(p).get(LWS_WORKER_INDEX)
            group = labels_of(p).get(LWS_GROUP_INDEX)
            where = f" (group {group}, member {member})" if group is not None else ""
            return replace(one, summary=one.summary + where)
    return None


def _groups_ready(
    role: str,
    live: Sequence[Obj],
    groups: Mapping[str, list[Obj]],
    replicas: int,
    size: int,
    lws: Obj | None,
    restart_baseline: Mapping[str, int] | None,
    gone: tuple[str, ...],
) -> RoleState:
    """Ready when every group has all its Pods Ready (and the LeaderWorkerSet counts them
    so), else waiting, with the groups and Pods Ready so far; shown by the leader Pod."""
    complete = [
        g for g, members in groups.items() if len(members) >= size and all(map(is_ready, members))
    ]
    ready_pods = sum(1 for p in live if is_ready(p))
    leader = next((p for p in live if labels_of(p).get(LWS_WORKER_INDEX) == "0"), live[0])
    lname = str(leader.get("metadata", {}).get("name", ""))
    node = leader.get("spec", {}).get("nodeName")
    evidence = {
        "groups_ready": len(complete),
        "groups": replicas,
        "pods_ready": ready_pods,
        "pods": replicas * size,
    }
    per_role: dict[str, Any] = {
        "pod": lname,
        "node": None if node is None else str(node),
        "image": _engine_image(leader),
        "old_pods": gone,
        "restarts_since_apply": sum(
            max(
                0,
                restarts(p)
                - int((restart_baseline or {}).get(str(p["metadata"].get("uid", "")), 0)),
            )
            for p in live
        ),
    }
    if len(complete) >= replicas and _counted_ready(lws, replicas):
        return RoleState(
            role,
            "ready",
            f"{len(complete)} of {replicas} group(s) Ready, every one of their {size} Pods",
            evidence,
            ready=True,
            **per_role,
        )
    return RoleState(
        role,
        "waiting",
        f"{len(complete)} of {replicas} group(s) Ready ({ready_pods} of {replicas * size} "
        "Pods); a group serves only once all its Pods are Ready",
        evidence,
        **per_role,
    )


def _counted_ready(lws: Obj | None, replicas: int) -> bool:
    """Whether the LeaderWorkerSet (when given) counts every group updated and ready, and
    is not unavailable."""
    if lws is None:
        return True
    status = lws.get("status") or {}
    available = _lws_condition(lws, "Available")
    return (
        as_int(status.get("updatedReplicas")) >= replicas
        and as_int(status.get("readyReplicas")) >= replicas
        and (available is None or available.get("status") == "True")
    )


def _restarted_member(
    pods: Sequence[Obj], baseline: Mapping[str, int] | None
) -> tuple[Obj, Obj] | None:
    """A member Pod (being deleted or not) with a container restarted since this apply,
    and that container's status; the controller recreates the group for it."""
    for p in sorted(pods, key=lambda p: str(p.get("metadata", {}).get("name", ""))):
        uid = str(p.get("metadata", {}).get("uid", ""))
        if restarts(p) - int((baseline or {}).get(uid, 0)) <= 0:
            continue
        for cs in (p.get("status") or {}).get("containerStatuses") or ():
            if as_int(cs.get("restartCount")) > 0 and (cs.get("lastState") or {}).get("terminated"):
                return p, cs
    return None


def _recreated(
    role: str, crash: tuple[Obj, Obj] | None, recreated: Recreation | None, gone: tuple[str, ...]
) -> RoleState:
    """The verdict on a group that crashed: the restarted member when a poll saw it (its
    exit, and its previous log while the Pod is there), else the controller's events."""
    evidence: dict[str, Any] = {}
    container = node = None
    if crash is not None:
        pod, cs = crash
        labels = labels_of(pod)
        name = str(pod["metadata"].get("name", ""))
        container = str(cs.get("name", ""))
        node = pod.get("spec", {}).get("nodeName")
        last = (cs.get("lastState") or {}).get("terminated") or {}
        code, why = last.get("exitCode"), last.get("reason") or "Error"
        head = (
            f"container {container} of Pod {name} (group {labels.get(LWS_GROUP_INDEX)}, member "
            f"{labels.get(LWS_WORKER_INDEX)}) exited with code {code} ({why}) and was restarted"
        )
        evidence.update(pod=name, node=node, container=container, exit_code=code, reason=why)
        evidence["message"] = last.get("message")
    else:
        assert recreated is not None
        name = recreated.pod
        head = f"Pod {name} of group {recreated.group} failed"
    if recreated is not None:
        head += (
            f"; the LeaderWorkerSet controller recreated the group {recreated.times} time(s) "
            f"since this apply ({recreated.message})"
        )
        evidence.update(event=recreated.message, recreated=recreated.times)
        evidence.setdefault("reason", "RecreateGroup")
    else:
        head += "; the LeaderWorkerSet controller recreates its whole group for it"
    summary = (
        head + ": under restartPolicy RecreateGroupOnPodRestart every member restarts with it, "
        "into the same failure"
    )
    if crash is None:
        summary += (
            f". The failed container's log went with its Pod; `kubectl logs -f {name}` "
            "follows the recreated one to the failure"
        )
    return RoleState(
        role,
        "failed",
        summary,
        evidence,
        pod=name or None,
        node=None if node is None else str(node),
        crashed_container=container,
        old_pods=gone,
    )


def _lws_condition(lws: Obj, kind: str) -> Obj | None:
    for c in (lws.get("status") or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == kind:
            return c
    return None


def lws_unsettled(lws: Obj, *, started: datetime, changed: bool) -> str | None:
    """Why a LeaderWorkerSet's status cannot yet speak for this apply, or None.

    From v0.9.0 the controller writes ``status.observedGeneration``: the status is this
    apply's once it reaches ``metadata.generation``.  Before, it writes only its counters
    and conditions (``Available``, ``Progressing``, ``UpdateInProgress``): a rolling update
    in progress is waited for, and when this apply created or changed the spec
    (``changed``) a condition must have moved since ``started`` (the controller's answer
    to it), else the counters may still be the previous spec's."""
    meta = lws.get("metadata", {})
    status = lws.get("status") or {}
    generation = as_int(meta.get("generation"), 0)
    if "observedGeneration" in status:
        observed = as_int(status.get("observedGeneration"), 0)
        if observed < generation:
            return (
                f"rollout of generation {generation} not yet observed by the LeaderWorkerSet "
                f"controller (it has observed {observed or 'none'})"
            )
        return None
    updating = _lws_condition(lws, "UpdateInProgress")
    if updating is not None and updating.get("status") == "True":
        return f"the LeaderWorkerSet controller is rolling out an update: {updating.get('message')}"
    if not changed:
        return None
    since = started.replace(microsecond=0)
    moved = [
        c
        for c in status.get("conditions") or ()
        if (parse_time(c.get("lastTransitionTime")) or since) >= since
        and c.get("lastTransitionTime")
    ]
    if moved:
        return None
    return (
        "the LeaderWorkerSet controller has not reported on this apply yet (its status has "
        "no observedGeneration before LWS v0.9.0; waiting for a condition to change)"
    )
