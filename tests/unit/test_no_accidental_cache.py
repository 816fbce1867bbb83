"""No accidental cache, and speculation judged per point (issue 32, findings 2 and 4).

Finding 2: the same seed rebuilt the same prompts, so a second identical ``bench`` on a
warm tiny-mixed served 55-75% of its prompt tokens from vLLM's prefix cache and ran 5-16%
faster, every point "valid".  Now each invocation draws its own ``run`` for the prompts'
text (kept by ``--resume``), and a point of a workload that shares no prefix is invalid
(SB412) when the engines' own counters say they served much of it from their caches.

Finding 4: a point of a deployment that claims speculative decoding stayed valid when no
token was drafted or none accepted; now it is invalid (SB413), by the rule verify's SB308
reads the same counters with (``engines.vllm.speculation_problem``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servebook.bench.tokens import HFTokenizer
from servebook.bench.validity import Thresholds, judge, prefix_hit_bound
from servebook.bench.workload import DatasetPrompts, Prompt, RandomPrompts
from servebook.metrics.scrape import Snapshot, snapshot_from_text
from servebook.report.comparability import provenance_differences
from servebook.results.evidence import server_evidence
from servebook.results.store import ResultsWriter
from servebook.sweep import BenchArgs, prompt_run, settings_from
from servebook.verify.checks import Window, check_speculation
from tests.unit.conftest import a_point, a_provenance

FIX = Path(__file__).parent / "fixtures" / "metrics"
SPEC = "vllm-0.32.0-cpu-pd-spec-{}-{}.prom"


def texts(prompts: RandomPrompts, indices: range) -> list[str]:
    return [p.text for p in prompts.build_many(list(indices))]


def test_two_invocations_with_one_seed_send_no_prompt_twice(
    tok: HFTokenizer, tmp_path: Path
) -> None:
    """Before: prompt i was default_rng([seed, i]) in every invocation, so a second bench
    sent the first one's prompts again."""
    runs = {prompt_run(tmp_path, resume=False) for _ in range(4)}
    assert len(runs) == 4
    first, second = sorted(runs)[:2]
    a = RandomPrompts(tok, input_len=64, output_len=8, seed=0, run=first)
    b = RandomPrompts(tok, input_len=64, output_len=8, seed=0, run=second)
    sent_a, sent_b = texts(a, range(40)), texts(b, range(40))
    assert not set(sent_a) & set(sent_b)
    # ... the same lengths, and the same text again for the same run (a resumed sweep)
    assert [p.prompt_tokens for p in b.build_many(list(range(40)))] == [64] * 40
    again = RandomPrompts(tok, input_len=64, output_len=8, seed=0, run=first)
    assert texts(again, range(40)) == sent_a
    assert a.describe()["run"] == first and "seeding" in a.describe()


def test_a_resumed_sweep_takes_the_run_its_results_file_recorded(tmp_path: Path) -> None:
    with ResultsWriter(tmp_path, a_provenance(workload={"kind": "random", "run": 12345})) as w:
        w.add(a_point(1, 0))
    assert prompt_run(tmp_path, resume=True) == 12345
    assert prompt_run(tmp_path, resume=False) != 12345  # a new invocation: its own run


def snap(text: str) -> Snapshot:
    return snapshot_from_text(text, url="http://mixed/metrics")


def counters(queries: float, hits: float) -> str:
    """A vLLM 0.32 engine's /metrics, shaped as tests/unit/fixtures/metrics has them, with
    the counters SB406 needs and the two prefix-cache counters at the given values."""
    lab = '{engine="0",model_name="tiny"}'
    return "\n".join(
        [
            f"vllm:prompt_tokens_total{lab} {queries}",
            f"vllm:generation_tokens_total{lab} 100.0",
            'vllm:request_success_total{engine="0",finished_reason="length",'
            'model_name="tiny"} 10.0',
            f"vllm:num_preemptions_total{lab} 0.0",
            f"vllm:prefix_cache_queries_total{lab} {queries}",
            f"vllm:prefix_cache_hits_total{lab} {hits}",
            "",
        ]
    )


def judged(server: dict[str, Any], bound: float | None, speculative: bool = False) -> list[Any]:
    point = a_point(1, 0).model_copy(update={"server": server})
    found = judge(
        point,
        duration_s=60,
        min_requests=1,
        thresholds=Thresholds(max_prefix_hit_share=bound, require_server_evidence=False),
        speculative=speculative,
    )
    return [f for f in found if f.check in ("SB412", "SB413")]


def test_a_point_served_from_the_prefix_cache_is_invalid_naming_the_counter() -> None:
    """The trial's second bench: 60% of the window's prompt tokens were cache hits."""
    bound = prefix_hit_bound(False, lead_tokens=1, input_len=512)
    assert bound is not None and bound < 0.06
    warm = server_evidence({"mixed": snap(counters(0, 0))}, {"mixed": snap(counters(5120, 3072))})
    assert warm["prefix_hit_share"] == pytest.approx(0.6)
    (f,) = judged(warm, bound)
    assert f.severity.name == "FAIL"
    assert "vllm:prefix_cache_hits_total" in f.message and "60.0%" in f.message
    cold = server_evidence({"mixed": snap(counters(0, 0))}, {"mixed": snap(counters(5120, 0))})
    (f,) = judged(cold, bound)
    assert f.severity.name == "PASS"


def test_the_bound_leaves_room_for_the_templates_own_tokens_and_skips_declared_sharing() -> None:
    # A chat template's 30 leading tokens on 128-token prompts may be cached on a GPU
    # (16-token blocks): 23% is the template, not a reused prompt.
    bound = prefix_hit_bound(False, lead_tokens=30, input_len=128)
    assert bound is not None and 0.28 < bound < 0.29
    assert prefix_hit_bound(True, 30, 128) is None  # --prefix-len, multi-turn
    assert prefix_hit_bound(None, 30, 128) is None  # a dataset: cannot say
    hot = server_evidence({"mixed": snap(counters(0, 0))}, {"mixed": snap(counters(100, 90))})
    assert judged(hot, None) == []


def test_sweep_settings_judge_random_prompts_and_not_a_dataset(tok: HFTokenizer) -> None:
    args = BenchArgs(input_len=64, output_len=8, concurrency="1")
    rand = RandomPrompts(tok, input_len=64, output_len=8, seed=0, run=1)
    got = settings_from(args, None, None, rand).thresholds.max_prefix_hit_share
    assert got == pytest.approx(0.05 + 1 / 64)  # the tiny tokenizer's BOS
    ds = DatasetPrompts([Prompt("hello", 8, None)], "d.jsonl", "sha256:0")
    assert settings_from(args, None, None, ds).thresholds.max_prefix_hit_share is None


def spec_window(role: str) -> tuple[Snapshot, Snapshot]:
    return tuple(  # type: ignore[return-value]
        snapshot_from_text((FIX / SPEC.format(role, edge)).read_text(), url=f"http://{role}")
        for edge in ("before", "after")
    )


def no_acceptance(text: str) -> str:
    """The same scrape with the accepted-token counter where it was before the window."""
    return text.replace(
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 27.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 5.0',
    )


def test_a_speculative_point_with_no_accepted_token_is_invalid_as_verify_warns() -> None:
    """tiny-pd-spec's real scrapes: 33 draft tokens, 22 accepted in the window (valid);
    the same with nothing accepted fails SB413 and verify's SB308 says the same words."""
    (pb, pa), (db, da) = spec_window("prefill"), spec_window("decode")
    ev = server_evidence({"prefill": pb, "decode": db}, {"prefill": pa, "decode": da})
    (f,) = judged(ev, None, speculative=True)
    assert f.severity.name == "PASS" and "33 draft tokens, 22 accepted" in f.message
    assert judged(ev, None, speculative=False) == []

    da_none = snapshot_from_text(no_acceptance((FIX / SPEC.format("decode", "after")).read_text()))
    ev = server_evidence({"prefill": pb, "decode": db}, {"prefill": pa, "decode": da_none})
    (f,) = judged(ev, None, speculative=True)
    assert f.severity.name == "FAIL" and "none accepted" in f.message
    (v,) = check_speculation("decode", Window({"decode": db}, {"decode": da_none}))
    assert v.severity.name == "WARN" and v.evidence["acceptance_rate"] == 0


def test_a_speculative_point_that_drafted_nothing_is_invalid() -> None:
    (db, _) = spec_window("decode")
    ev = server_evidence({"decode": db}, {"decode": db})  # the counters did not move
    (f,) = judged(ev, None, speculative=True)
    assert f.severity.name == "FAIL" and "0 draft tokens" in f.message


def test_two_runs_of_one_workload_differ_in_their_run_and_still_compare() -> None:
    """Each invocation's own ``run`` (and SB412's bound, derived from the workload) is no
    difference between runs: a re-run must differ in it.  Found on real vLLM: `compare`
    refused tiny-mixed-spec against tiny-pd-spec over ``workload.run``."""
    wl = {"kind": "random", "input_len": 512, "seed": 0, "seeding": "..."}
    a = a_provenance(
        workload={**wl, "run": 1},
        protocol={"duration_s": 60, "thresholds": {"max_prefix_hit_share": 0.052}},
    )
    b = a_provenance(workload={**wl, "run": 2}, protocol={"duration_s": 60, "thresholds": {}})
    assert provenance_differences(a, b) == []
    c = a_provenance(workload={**wl, "run": 1, "input_len": 256})
    assert [d.field for d in provenance_differences(a, c)] == ["workload.input_len"]
