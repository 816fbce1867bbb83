"""Why a LeaderWorkerSet has no Pods: its StatefulSets' events (issue 23 point 11).

A LeaderWorkerSet's Pods are made by StatefulSets, not by the LeaderWorkerSet: the leader
StatefulSet named after the set, and per group a worker StatefulSet named after the
group's leader Pod, ``LWS-INDEX`` (kubernetes-sigs/lws, pkg/controllers/
pod_controller.go).  When the API server refuses a Pod (Pod Security, a quota, a webhook,
an invalid label such as an over-long controller-revision-hash), the StatefulSet
controller records a ``FailedCreate`` Warning on the StatefulSet, worded
``create Pod POD in StatefulSet STS failed error: WHY`` (pkg/controller/statefulset/
stateful_pod_control.go), and no event on the LeaderWorkerSet says so.  Pure: the caller
lists the namespace's events.

Called by ``kube.rollout_groups.group_state`` where it finds no live Pod (or a group
short of members), before its "is the controller running?" wait: a refusal found here
fails the role at once with the API server's reason.

A group that crashes leaves another trace.  Under ``restartPolicy:
RecreateGroupOnPodRestart`` (servebook's render, and the webhook's default) the LWS pod
controller deletes the group's leader as soon as any member's container has restarted (or
a member is deleted), which takes the whole group down, and records a ``RecreateGroup``
event on the LeaderWorkerSet, worded ``Worker pod POD failed, deleted leader pod LEADER
to recreate group G`` (pkg/controllers/pod_controller.go, ``handleRestartPolicy``; the
leader is named "worker pod" too when it is the one that restarted).  The StatefulSets
then make the group again under the same names, so the restarted Pod is seen for a moment
at most: on the test plane (LWS v0.9.0) a worker that exits 5 s after it starts was
recreated every 6 s, and no poll saw it restarted.  These events (one per recreation,
``eventTime`` set, ``lastTimestamp`` null) are what stays.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from servebook.kube.objects import as_int, event_since

Obj = Mapping[str, Any]


def is_statefulset_of(name: str, lws_name: str) -> bool:
    """Whether StatefulSet ``name`` is one a LeaderWorkerSet ``lws_name`` makes."""
    return name == lws_name or re.fullmatch(re.escape(lws_name) + r"-[0-9]+", name) is not None


def statefulset_refusals(events: Iterable[Obj], lws_name: str, since: datetime) -> list[Obj]:
    """The ``FailedCreate`` events of the LeaderWorkerSet's StatefulSets at or after
    ``since`` (events outlive their objects: an earlier deploy's are not this one's),
    oldest first."""
    out = []
    for e in events:
        inv = e.get("involvedObject") or {}
        if inv.get("kind") != "StatefulSet" or e.get("reason") != "FailedCreate":
            continue
        if not is_statefulset_of(str(inv.get("name", "")), lws_name):
            continue
        if not event_since(e, since):
            continue
        out.append(e)
    return sorted(out, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))


def refusal_summary(events: Iterable[Obj], lws_name: str, since: datetime) -> str | None:
    """One sentence naming the StatefulSet and the API server's reason for the latest
    refusal; None when its StatefulSets recorded none."""
    found = statefulset_refusals(events, lws_name, since)
    if not found:
        return None
    last = found[-1]
    sts = (last.get("involvedObject") or {}).get("name")
    return (
        f"the cluster refused to create the Pods of LeaderWorkerSet {lws_name} (StatefulSet "
        f"{sts}, {len(found)} refusal event(s)): {last.get('message', '')}"
    )


_RECREATED = re.compile(
    r"Worker pod (?P<pod>\S+) failed, deleted leader pod (?P<leader>\S+) to recreate group "
    r"(?P<group>\S+)"
)


@dataclass(frozen=True)
class Recreation:
    """What the LeaderWorkerSet controller's ``RecreateGroup`` events since an apply say."""

    pod: str  # the member that failed, in the latest event
    group: str
    times: int  # recreations since the apply, of every group
    message: str  # the latest event's own words


def recreations(events: Iterable[Obj], lws_name: str, since: datetime) -> Recreation | None:
    """The ``RecreateGroup`` events of LeaderWorkerSet ``lws_name`` at or after ``since``,
    summed up; None when it recreated no group since."""
    found = sorted(
        (
            e
            for e in events
            if e.get("reason") == "RecreateGroup"
            and (e.get("involvedObject") or {}).get("kind") == "LeaderWorkerSet"
            and (e.get("involvedObject") or {}).get("name") == lws_name
            and event_since(e, since)
        ),
        key=lambda e: str(e.get("eventTime") or e.get("lastTimestamp") or ""),
    )
    if not found:
        return None
    times = sum(
        max(1, as_int((e.get("series") or {}).get("count") or e.get("count"), 1)) for e in found
    )
    last = str(found[-1].get("message", ""))
    m = _RECREATED.search(last)
    return Recreation(
        pod=m.group("pod") if m else "",
        group=m.group("group") if m else "?",
        times=times,
        message=last,
    )


__all__ = [
    "Recreation",
    "is_statefulset_of",
    "recreations",
    "refusal_summary",
    "statefulset_refusals",
]
