"""The rollout verdict of the Kubernetes backend, over `kubectl get pods,events -o json`
fixtures of each way a deploy fails (built by scripts/make_rollout_fixtures.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from servebook.kube.rollout import RoleState, overall, role_state

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
