"""The rollout verdict of the Kubernetes backend, over `kubectl get
deployments,replicasets,pods,events -o json` fixtures of each way a deploy fails and of each
step of a re-`up` (built by scripts/make_rollout_fixtures.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from servebook.kube.rollout import RoleState, overall, restart_counts, role_state

FIXTURES = Path(__file__).parent / "fixtures" / "rollout"
APPLIED = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC)  # the Pods were created at 10:00:05


def state(case: str, after_s: float = 30) -> RoleState:
    items: list[dict[str, Any]] = json.loads((FIXTURES / f"{case}.json").read_text())["items"]
    pods = [i for i in items if i["kind"] == "Pod"]
    events = [i for i in items if i["kind"] == "Event"]
    return role_state(
        "prefill",
        "vllm-pd-prefill",
        pods,
        events,
        now=APPLIED + timedelta(seconds=after_s),
        started=APPLIED,
    )


def test_an_absent_weights_directory_fails_at_once_naming_path_and_node() -> None:
    s = state("hostpath-absent")
    assert s.state == "failed"
    assert "/data/models/Kimi-K2-Instruct is absent on node gpu-node-1" in s.summary
    assert s.evidence["reason"] == "FailedMount"


def test_an_image_that_cannot_be_pulled_fails_at_once_naming_it() -> None:
    s = state("image-pull-backoff")
    assert s.state == "failed"
    assert "the image cannot be pulled (ImagePullBackOff)" in s.summary
    assert "vllm/vllm-openai:v0.11.0" in s.summary


def test_an_unschedulable_pod_waits_through_the_grace_then_fails_with_the_schedulers_words() -> (
    None
):
    early = state("unschedulable", after_s=60)
    assert early.state == "waiting" and "Insufficient nvidia.com/gpu" in early.summary
    late = state("unschedulable", after_s=200)
    assert late.state == "failed"
    assert "could not be scheduled for 195 s" in late.summary
    assert "Insufficient nvidia.com/gpu" in late.summary


def test_a_crashed_engine_fails_on_its_first_restart_and_names_the_container() -> None:
    s = state("crash-loop", after_s=420)
    assert s.state == "failed"
    assert s.crashed_container == "engine"
    assert "exited with code 1 (Error)" in s.summary and "restarted 1 time" in s.summary


def test_a_loading_engine_is_waiting_not_failed_despite_failing_startup_probes() -> None:
    s = state("loading", after_s=400)
    assert s.state == "waiting"
    assert "engine starting on gpu-node-1 for 369 s" in s.summary


def test_ready_uses_the_new_pod_not_the_terminating_one() -> None:
    s = state("ready", after_s=600)
    assert s.state == "ready" and s.pod == "vllm-pd-prefill-6c8d9f7b5-x2k9q"


def test_a_pod_the_cluster_refuses_to_create_fails_with_the_controllers_message() -> None:
    s = state("quota-refused")
    assert s.state == "failed" and "exceeded quota: gpu-quota" in s.summary


def test_an_earlier_deploys_refusal_is_not_this_ones() -> None:
    items = json.loads((FIXTURES / "quota-refused.json").read_text())["items"]
    later = APPLIED + timedelta(minutes=30)  # applied again after the quota was raised
    s = role_state(
        "prefill", "vllm-pd-prefill", [], items, now=later + timedelta(seconds=10), started=later
    )
    assert s.state == "waiting"


@pytest.mark.parametrize(("after_s", "verdict"), [(30, "waiting"), (90, "failed")])
def test_no_pod_at_all_is_waiting_then_a_failure(after_s: float, verdict: str) -> None:
    s = role_state(
        "decode",
        "vllm-pd-decode",
        [],
        [],
        now=APPLIED + timedelta(seconds=after_s),
        started=APPLIED,
    )
    assert s.state == verdict


def test_overall_is_failed_if_any_role_failed_and_ready_only_if_all_are() -> None:
    ready, waiting, failed = state("ready", 600), state("loading", 400), state("crash-loop", 420)
    assert overall([ready, ready]) == "ready"
    assert overall([ready, waiting]) == "waiting"
    assert overall([ready, waiting, failed]) == "failed"
    assert overall([]) == "waiting"


# A re-`up`: the fixtures hold `kubectl get deployments,replicasets,pods,events -o json`.
OLD_POD = "vllm-pd-prefill-7f5b8c4d9-h4tzm"
NEW_POD = "vllm-pd-prefill-6c8d9f7b5-x2k9q"
IMAGE = "vllm/vllm-openai:v0.11.0"


def objects(case: str) -> dict[str, list[dict[str, Any]]]:
    items: list[dict[str, Any]] = json.loads((FIXTURES / f"{case}.json").read_text())["items"]
    out: dict[str, list[dict[str, Any]]] = {}
    for i in items:
        out.setdefault(i["kind"], []).append(i)
    return out


def rollout(
    case: str, after_s: float = 30, baseline: dict[str, int] | None = None, **kw: Any
) -> RoleState:
    o = objects(case)
    (deployment,) = o["Deployment"]
    return role_state(
        "prefill",
        "vllm-pd-prefill",
        o.get("Pod", []),
        o.get("Event", []),
        now=APPLIED + timedelta(seconds=after_s),
        started=APPLIED,
        deployment=deployment,
        replicasets=o["ReplicaSet"],
        restart_baseline=baseline,
        **kw,
    )


def test_a_new_generation_the_controller_has_not_observed_is_waiting_not_the_old_ready_pod() -> (
    None
):
    assert state("reup-not-observed", after_s=1).state == "ready"  # the false success
    s = rollout("reup-not-observed", after_s=1)
    assert s.state == "waiting"
    assert s.summary.startswith("rollout of generation 2 not yet observed")
    assert f"old Pod {OLD_POD} still Ready (not counted)" in s.summary
    assert s.pod is None and not s.ready and s.old_pods == (OLD_POD,)


def test_recreate_waiting_for_the_old_pod_to_stop_is_waiting_however_long_it_takes() -> None:
    for after_s in (2, 90):  # past the no-Pod grace: the controller is waiting, not stuck
        s = rollout("reup-old-terminating", after_s=after_s)
        assert s.state == "waiting"
        assert "has not created this apply's ReplicaSet yet" in s.summary
        assert f"old Pod {OLD_POD} terminating" in s.summary
        assert s.pod is None and s.revision is None


def test_the_old_pod_still_ready_does_not_make_the_role_ready_while_the_new_one_loads() -> None:
    s = rollout("reup-new-starting", after_s=60)
    assert s.state == "waiting"
    assert s.summary.startswith("engine starting on gpu-node-1 for 29 s")
    assert f"old Pod {OLD_POD} still Ready (not counted)" in s.summary
    assert s.pod == NEW_POD and not s.ready and s.revision == "2"
    assert s.evidence["replicaset"] == "vllm-pd-prefill-6c8d9f7b5"


def test_the_new_pod_ready_is_ready_and_the_old_one_is_ignored() -> None:
    s = rollout("reup-ready", after_s=600)
    assert s.state == "ready"
    assert s.pod == NEW_POD and s.ready and s.node == "gpu-node-1" and s.image == IMAGE
    assert s.revision == "2" and s.old_pods == (OLD_POD,)
    assert s.restarts_since_apply == 0 and s.crashed_container is None


def test_without_the_replicasets_the_deployments_counters_still_gate_readiness() -> None:
    o = objects("reup-new-starting")
    s = role_state(
        "prefill",
        "vllm-pd-prefill",
        [p for p in o["Pod"] if p["metadata"]["name"] == OLD_POD],  # the new Pod not listed
        [],
        now=APPLIED + timedelta(seconds=10),
        started=APPLIED,
        deployment={**o["Deployment"][0], "status": {"observedGeneration": 2}},
    )
    assert s.state == "waiting" and "0 of 1 Pod(s) of this apply's template" in s.summary


def test_restart_counts_is_the_baseline_to_record_when_applying() -> None:
    pods = objects("restarted-before-apply")["Pod"]
    assert restart_counts(pods) == {pods[0]["metadata"]["uid"]: 1}
    assert restart_counts([{"metadata": {"uid": "u"}, "status": {}}]) == {"u": 0}


def test_a_restart_before_this_apply_is_not_a_crash_of_this_deploy() -> None:
    baseline = restart_counts(objects("restarted-before-apply")["Pod"])
    assert rollout("restarted-before-apply").state == "failed"  # every restart counts
    s = rollout("restarted-before-apply", baseline=baseline)
    assert s.state == "ready" and s.pod == OLD_POD and s.ready
    assert s.restarts_since_apply == 0 and s.crashed_container is None
    assert s.node == "gpu-node-1" and s.image == IMAGE


def test_a_crash_after_this_apply_fails_counting_restarts_from_the_apply() -> None:
    baseline = restart_counts(objects("restarted-before-apply")["Pod"])
    s = rollout("crashed-after-apply", after_s=240, baseline=baseline)
    assert s.state == "failed" and s.crashed_container == "engine"
    assert "exited with code 1 (Error) and was restarted 1 time(s) since this apply" in s.summary
    assert s.restarts_since_apply == 1 and s.evidence["restarts"] == 2
    assert not s.ready


def test_a_crash_loop_fails_whatever_the_baseline() -> None:
    # Restarted before the apply and backing off now: it is crash-looping still.
    o = objects("crashed-after-apply")
    (pod,) = o["Pod"]
    s = rollout("crashed-after-apply", after_s=240, baseline={pod["metadata"]["uid"]: 2})
    assert s.state == "failed" and "is crash-looping (CrashLoopBackOff)" in s.summary
    assert s.restarts_since_apply == 0 and s.crashed_container == "engine"


def test_a_container_that_has_exited_now_is_failed() -> None:
    (pod,) = objects("loading")["Pod"]
    ended = {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "x"}}
    pod["status"]["containerStatuses"][0]["state"] = ended
    s = role_state("prefill", "vllm-pd-prefill", [pod], [], now=APPLIED, started=APPLIED)
    assert s.state == "failed" and "has exited: its last run exited with code 137" in s.summary


def _initializing(inits: list[dict[str, Any]]) -> dict[str, Any]:
    """The loading Pod still in its init containers ``inits`` (kubelet's shapes: an init
    container's status as a container's, the engine waiting in PodInitializing)."""
    (pod,) = objects("loading")["Pod"]
    pod["status"]["phase"] = "Pending"
    pod["status"]["initContainerStatuses"] = inits
    for cs in pod["status"]["containerStatuses"]:
        cs["state"] = {"waiting": {"reason": "PodInitializing"}}
        cs["started"], cs["ready"] = False, False
    return pod


def test_an_init_container_crash_looping_fails_the_role_naming_it() -> None:
    """`make-model` crash-looping (on the plane: an interpreter without numpy) left the
    engine in PodInitializing, and `up` waited out its whole timeout saying nothing."""
    done = {"name": "clear-kv-storage", "restartCount": 0, "ready": True,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}  # fmt: skip
    looping = {
        "name": "make-model", "restartCount": 3, "ready": False,
        "state": {"waiting": {"reason": "CrashLoopBackOff",
                              "message": "back-off 40s restarting failed container=make-model"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                     "finishedAt": "2026-11-30T10:00:50Z"}},
    }  # fmt: skip
    pod = _initializing([done, looping])
    s = role_state("prefill", "vllm-pd-prefill", [pod], [], now=APPLIED, started=APPLIED)
    assert s.state == "failed" and s.crashed_container == "make-model", s.summary
    assert "container make-model is crash-looping (CrashLoopBackOff)" in s.summary
    # one that finished well, and one still making the model: the role waits
    running = {"name": "make-model", "restartCount": 0, "ready": False,
               "state": {"running": {"startedAt": "2026-11-30T10:00:10Z"}}}  # fmt: skip
    pod = _initializing([done, running])
    s = role_state("prefill", "vllm-pd-prefill", [pod], [], now=APPLIED, started=APPLIED)
    assert s.state == "waiting", s.summary


FIRST_UP = [
    "hostpath-absent",
    "image-pull-backoff",
    "unschedulable",
    "crash-loop",
    "loading",
    "ready",
    "quota-refused",
]


@pytest.mark.parametrize("case", FIRST_UP)
@pytest.mark.parametrize("after_s", [30, 200, 420])
def test_on_a_first_up_the_deployment_and_replicasets_change_no_verdict(
    case: str, after_s: float
) -> None:
    before, after = state(case, after_s), rollout(case, after_s, baseline={})
    assert (after.state, after.pod, after.crashed_container) == (
        before.state,
        before.pod,
        before.crashed_container,
    )
    # A first up's baseline is empty: every restart is one since this apply.
    assert after.summary.replace(" since this apply", "").startswith(before.summary)
    assert {k: v for k, v in after.evidence.items() if k in before.evidence} == before.evidence


def test_each_role_carries_what_status_shows() -> None:
    crashed = state("crash-loop", after_s=420)
    assert (crashed.node, crashed.ready, crashed.restarts_since_apply, crashed.image) == (
        "gpu-node-1",
        False,
        1,
        IMAGE,
    )
    ready = state("ready", after_s=600)
    assert (ready.pod, ready.node, ready.ready, ready.restarts_since_apply) == (
        NEW_POD,
        "gpu-node-1",
        True,
        0,
    )
    assert state("unschedulable", 60).node == "gpu-node-1"  # pinned, not yet bound
    assert state("quota-refused").pod is None and not state("quota-refused").ready


def _first_sight(case: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The fixture as the kubelet shows it on its first failure: one try, no back-off."""
    items: list[dict[str, Any]] = json.loads((FIXTURES / f"{case}.json").read_text())["items"]
    pods = [i for i in items if i["kind"] == "Pod"]
    events = [i for i in items if i["kind"] == "Event" and i["reason"] != "BackOff"]
    for cs in pods[0]["status"]["containerStatuses"]:
        cs["state"]["waiting"]["reason"] = "ErrImagePull"
    return pods, events


def test_a_pull_that_failed_once_is_waiting_until_the_kubelets_back_off_persists() -> None:
    """Issue 23 point 4: ErrImagePull at first sight is not final (a registry's blip)."""
    pods, events = _first_sight("image-pull-backoff")

    def at(after_s: float) -> RoleState:
        now = APPLIED + timedelta(seconds=after_s)
        return role_state("prefill", "vllm-pd-prefill", pods, events, now=now, started=APPLIED)

    first = at(30)
    assert first.state == "waiting", first.summary
    assert "ErrImagePull" in first.summary and "not yet final" in first.summary
    assert at(30 + 200).state == "failed"  # still failing after the retry grace


def test_a_mount_error_that_persists_fails_and_one_that_passed_does_not() -> None:
    items: list[dict[str, Any]] = json.loads((FIXTURES / "loading.json").read_text())["items"]
    pods = [i for i in items if i["kind"] == "Pod"]
    pod = pods[-1]
    mount = {
        "kind": "Event",
        "involvedObject": {"kind": "Pod", "name": pod["metadata"]["name"]},
        "reason": "FailedMount",
        "message": 'MountVolume.SetUp failed for volume "cache" : secret "hf-token" not found',
        "count": 1,
        "firstTimestamp": "2026-11-30T10:00:10Z",
        "lastTimestamp": "2026-11-30T10:00:10Z",
    }
    for cs in pod["status"].get("containerStatuses") or []:
        cs["started"] = False
        cs["state"] = {"waiting": {"reason": "ContainerCreating"}}
    pod["status"]["conditions"] = []

    def at(after_s: float) -> RoleState:
        now = APPLIED + timedelta(seconds=after_s)
        return role_state("prefill", "vllm-pd-prefill", [pod], [mount], now=now, started=APPLIED)

    assert at(20).state == "waiting"
    assert at(20 + MOUNT_GRACE).state == "failed"


MOUNT_GRACE = 130


# The kubelet's passing mount error (kubernetes#105204), as it words it: every Pod may get it
# before the namespace's root CA is registered with its kubelet, then runs.
ROOT_CA = (
    'MountVolume.SetUp failed for volume "kube-api-access-2kx5l" : '
    '[object "moe-pd"/"kube-root-ca.crt" not registered]'
)


def test_a_passing_failed_mount_does_not_fail_a_ready_pods_role() -> None:
    """Issue 23 point 4: a Ready Pod whose events hold the kubelet's FailedMount of the root
    CA is ready, long after the mount grace."""
    items: list[dict[str, Any]] = json.loads((FIXTURES / "ready.json").read_text())["items"]
    pods = [i for i in items if i["kind"] == "Pod" and not i["metadata"].get("deletionTimestamp")]
    mount = {
        "kind": "Event",
        "type": "Warning",
        "involvedObject": {"kind": "Pod", "name": pods[-1]["metadata"]["name"]},
        "reason": "FailedMount",
        "message": ROOT_CA,
        "count": 1,
        "firstTimestamp": "2026-11-30T10:00:06Z",
        "lastTimestamp": "2026-11-30T10:00:06Z",
    }
    now = APPLIED + timedelta(seconds=MOUNT_GRACE + 60)
    s = role_state("prefill", "vllm-pd-prefill", pods, [mount], now=now, started=APPLIED)
    assert s.state == "ready", s.summary
