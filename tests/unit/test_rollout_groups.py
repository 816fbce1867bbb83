"""A LeaderWorkerSet role is ready only when every Pod of every group is Ready, and a
member's failure fails the role naming the member (kube.rollout.group_state).  The Pods
are the checked-in rollout fixtures' real Pods, relabelled as LWS members."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from servebook.kube.rollout import RoleState
from servebook.kube.rollout_groups import LWS_GROUP_INDEX, LWS_WORKER_INDEX, group_state

FIX = Path(__file__).parent / "fixtures" / "rollout"


def _pod(fixture: str, name: str, group: int, member: int) -> dict[str, Any]:
    items = json.loads((FIX / fixture).read_text())["items"]
    pod = copy.deepcopy(
        [i for i in items if i["kind"] == "Pod" and not i["metadata"].get("deletionTimestamp")][-1]
    )
    pod["metadata"]["name"] = name
    pod["metadata"]["uid"] = name
    pod["metadata"]["labels"][LWS_GROUP_INDEX] = str(group)
    pod["metadata"]["labels"][LWS_WORKER_INDEX] = str(member)
    return pod


def _events(fixture: str) -> list[dict[str, Any]]:
    items = json.loads((FIX / fixture).read_text())["items"]
    return [i for i in items if i["kind"] == "Event"]


def _at(pod: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00"))


LWS = {
    "metadata": {"name": "x-decode-lws", "generation": 1},
    "status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1},
}


def _decode(
    pods: list[dict[str, Any]],
    *,
    now: datetime,
    started: datetime,
    events: list[dict[str, Any]] | None = None,
    lws: dict[str, Any] | None = LWS,
) -> RoleState:
    """``group_state`` of the decode role: one group of two Pods (leader and worker)."""
    return group_state(
        "decode",
        "x-decode-lws",
        pods,
        events or [],
        now=now,
        started=started,
        replicas=1,
        size=2,
        lws=lws,
    )


def test_a_group_is_ready_only_when_all_its_pods_are() -> None:
    leader = _pod("ready.json", "x-decode-lws-0", 0, 0)
    worker = _pod("loading.json", "x-decode-lws-0-1", 0, 1)
    now = _at(leader) + timedelta(minutes=5)
    s = _decode([leader, worker], now=now, started=_at(leader))
    assert s.state == "waiting"
    assert "0 of 1 group(s) Ready (1 of 2 Pods)" in s.summary
    ready_worker = _pod("ready.json", "x-decode-lws-0-1", 0, 1)
    s = _decode([leader, ready_worker], now=now, started=_at(leader))
    assert s.state == "ready" and s.pod == "x-decode-lws-0"


def test_a_missing_member_keeps_the_group_waiting() -> None:
    leader = _pod("ready.json", "x-decode-lws-0", 0, 0)
    s = _decode([leader], now=_at(leader) + timedelta(minutes=5), started=_at(leader))
    assert s.state == "waiting"


def test_a_crashed_worker_fails_the_role_naming_it() -> None:
    leader = _pod("ready.json", "x-decode-lws-0", 0, 0)
    worker = _pod("crash-loop.json", "x-decode-lws-0-1", 0, 1)
    s = _decode(
        [leader, worker],
        events=_events("crash-loop.json"),
        now=_at(worker) + timedelta(minutes=5),
        started=_at(worker),
        lws=None,
    )
    assert s.state == "failed"
    assert "(group 0, member 1)" in s.summary


def test_an_unobserved_generation_is_waiting_even_with_ready_pods() -> None:
    leader = _pod("ready.json", "x-decode-lws-0", 0, 0)
    worker = _pod("ready.json", "x-decode-lws-0-1", 0, 1)
    lws = {**LWS, "metadata": {"name": "x", "generation": 2}}
    s = _decode([leader, worker], now=_at(leader), started=_at(leader), lws=lws)
    assert s.state == "waiting" and "not yet observed" in s.summary


# --- LeaderWorkerSet releases before v0.9.0 (issue 23 point 1), which the plane cannot run:
# their controller writes no observedGeneration, only its counters and conditions, each
# condition added once it is first true (lws: pkg/controllers/leaderworkerset_controller.go).


def _before_v0_9(*, moved_at: datetime) -> dict[str, Any]:
    """A LeaderWorkerSet's status as v0.7/v0.8 write it: one group, its condition moved at
    ``moved_at``."""
    stamp = moved_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [
        {"type": "Available", "status": "True", "reason": "AllGroupsReady",
         "lastTransitionTime": stamp},
        {"type": "Progressing", "status": "False", "reason": "GroupsProgressing",
         "lastTransitionTime": stamp},
    ]  # fmt: skip
    status = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "conditions": conditions}
    return {"metadata": {"name": "x-decode-lws", "generation": 1}, "status": status}


def test_a_status_without_observed_generation_is_ready_once_a_condition_moved_since_the_apply() -> (
    None
):
    leader = _pod("ready.json", "x-decode-lws-0", 0, 0)
    worker = _pod("ready.json", "x-decode-lws-0-1", 0, 1)
    applied = _at(leader)

    def judged(lws: dict[str, Any]) -> RoleState:
        return group_state("decode", "x-decode-lws", [leader, worker], [], now=applied,
                           started=applied, replicas=1, size=2, lws=lws, changed=True)  # fmt: skip

    s = judged(_before_v0_9(moved_at=applied + timedelta(seconds=3)))
    assert s.state == "ready" and s.pod == "x-decode-lws-0", s.summary
    # Its conditions last moved before this apply: the counters may be the previous spec's.
    s = judged(_before_v0_9(moved_at=applied - timedelta(minutes=5)))
    assert s.state == "waiting" and "no observedGeneration before LWS v0.9.0" in s.summary


# --- a group that crashes, as the test plane's LeaderWorkerSet controller (v0.9.0) handles it
# lws-recreate.json is `kubectl get leaderworkersets,pods,events -o json` from the plane,
# three minutes into an up whose workers exit with code 3 five seconds after they start:
# the controller recreated each group every 6 s (RecreateGroupOnPodRestart), and this
# snapshot caught prefill's worker restarted while its group was being deleted.

PLANE = json.loads((FIX / "lws-recreate.json").read_text())["items"]
APPLIED = datetime.fromisoformat("2026-12-04T22:31:04+00:00")


def _plane(role: str, *, started: datetime = APPLIED) -> RoleState:
    lws_name = f"wide-{role}-lws"
    pods = [
        o
        for o in PLANE
        if o["kind"] == "Pod" and o["metadata"]["labels"]["app.kubernetes.io/component"] == role
    ]
    lws = next(
        o for o in PLANE if o["kind"] == "LeaderWorkerSet" and o["metadata"]["name"] == lws_name
    )
    return group_state(
        role,
        lws_name,
        pods,
        [o for o in PLANE if o["kind"] == "Event"],
        now=datetime.fromisoformat("2026-12-04T22:34:35+00:00"),
        started=started,
        replicas=1,
        size=2,
        lws=lws,
        restart_baseline={},
    )


def test_a_member_seen_restarted_while_its_group_is_recreated_fails_naming_its_exit() -> None:
    """Both prefill Pods are being deleted (the controller took the group down), so no
    live Pod shows the crash; the worker's restart and exit code 3 are on the deleted one."""
    s = _plane("prefill")
    assert s.state == "failed", s.summary
    assert "container engine of Pod wide-prefill-lws-0-1 (group 0, member 1)" in s.summary
    assert "exited with code 3 (Error)" in s.summary
    assert "recreated the group" in s.summary and "RecreateGroupOnPodRestart" in s.summary
    assert s.pod == "wide-prefill-lws-0-1" and s.crashed_container == "engine"


def test_recreate_events_fail_the_role_when_no_poll_saw_the_restart() -> None:
    """decode's Pods are the freshly recreated group (no restart on them); the controller's
    RecreateGroup events are all that is left of the crash: the role fails naming the
    member, instead of waiting and then asking whether the controller runs."""
    s = _plane("decode")
    assert s.state == "failed", s.summary
    assert "Pod wide-decode-lws-0-1 of group 0 failed" in s.summary
    assert "Worker pod wide-decode-lws-0-1 failed, deleted leader pod" in s.summary
    assert s.evidence["reason"] == "RecreateGroup"
    assert "is the LeaderWorkerSet controller running" not in s.summary


def test_recreations_before_this_apply_are_not_its_own() -> None:
    s = _plane("decode", started=datetime.fromisoformat("2026-12-04T22:34:31+00:00"))
    assert s.state == "waiting", s.summary
