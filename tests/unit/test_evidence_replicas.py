"""Bench's per-point evidence keeps each replica's figures beside the sum: one decode
replica failing open among four makes the point invalid, named, instead of vanishing in
the average (counters captured from real vLLM 0.32.0 CPU PD pairs)."""

from __future__ import annotations

from pathlib import Path

from servebook.bench.validity import Thresholds, apply_verdict, judge
from servebook.metrics.scrape import Snapshot, merge_replicas, snapshot_from_text
from servebook.results.evidence import server_evidence
from tests.unit.conftest import a_measured_point

FIX = Path(__file__).parent / "fixtures" / "metrics"
PODS = ["decode-0", "decode-1", "decode-2", "decode-3"]


def snap(name: str) -> Snapshot:
    return snapshot_from_text((FIX / f"vllm-0.32.0-cpu-{name}.prom").read_text(), url=name)


def four_decodes(edge: str, failing: int | None) -> dict[str, Snapshot | str]:
    kinds = ["pd-failopen" if i == failing else "pd-spec" for i in range(4)]
    return {
        "prefill": snap(f"pd-spec-prefill-{edge}"),
        "decode": merge_replicas([snap(f"{k}-decode-{edge}") for k in kinds]),
    }


def evidence(failing: int | None) -> dict[str, object]:
    return server_evidence(
        four_decodes("before", failing),
        four_decodes("after", failing),
        decode_role="decode",
        replica_names={"decode": PODS},
    )


def test_each_decode_replica_has_its_own_figures_beside_the_sum() -> None:
    ev = evidence(failing=2)
    by = ev["handoff_share_by_replica"]
    assert isinstance(by, dict) and list(by) == PODS
    assert by["decode-2"] == 0.0
    assert all(by[p] == 896 / 917 for p in PODS if p != "decode-2")
    assert ev["handoff_share"] == 3 * 896 / (4 * 917)  # the sum: about 73%
    decode = ev["roles"]["decode"]  # type: ignore[index]
    assert decode["replicas"]["decode-2"]["counters"]["prompt_tokens"] == 917
    assert decode["counters"]["prompt_tokens"] == 4 * 917


def test_one_replica_failing_open_among_four_makes_the_point_invalid_naming_it() -> None:
    thresholds = Thresholds(min_handoff_share=0.7)  # the sum (73%) clears it
    bad = a_measured_point(server=evidence(failing=2))
    judged = apply_verdict(
        bad, judge(bad, duration_s=60, min_requests=40, thresholds=thresholds, pd=True)
    )
    assert not judged.valid
    [reason] = [r for r in judged.invalid_reasons if r.startswith("SB407")]
    assert "decode-2 (0.0%)" in reason
    good = a_measured_point(server=evidence(failing=None))
    ok = apply_verdict(
        good, judge(good, duration_s=60, min_requests=40, thresholds=thresholds, pd=True)
    )
    assert ok.valid, ok.invalid_reasons
