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

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servebook.bench.endpoint import Endpoint
from servebook.bench.openai_stream import request_body
from servebook.bench.sweep import BenchArgs, prompt_run, settings_from
from servebook.bench.tokens import HFTokenizer
from servebook.bench.validity import Thresholds, judge, prefix_hit_bound
from servebook.bench.workload import DatasetPrompts, Prompt, RandomPrompts
from servebook.metrics.scrape import Snapshot, snapshot_from_text
from servebook.report.comparability import provenance_differences
from servebook.results.evidence import server_evidence
from servebook.results.store import ResultsWriter, load_results
from servebook.verify.checks import Window, check_speculation
from tests.unit.conftest import a_point, a_provenance
from tests.unit.engine_standin import scripted_engine

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


def bodies(seen: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(seen.iterdir())]


def test_every_request_to_vllm_carries_a_cache_salt_of_its_own_run_and_index(
    cli: Callable[..., Any], tiny_dir: Path, tmp_path: Path
) -> None:
    """A dataset repeats its prompts (a file shorter than the run, a second bench): vLLM's
    ``cache_salt`` keeps each request out of every other's prefix cache, so SB412 judges a
    dataset too.  The stand-in answers /version as vLLM 0.32 does."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {w}"}) + "\n" for w in ("a", "b")))
    salts: list[list[str]] = []
    for n in range(2):
        seen = tmp_path / f"seen{n}"
        seen.mkdir()
        out = tmp_path / f"out{n}"
        with scripted_engine(tokenizer=tiny_dir / "tokenizer.json", seen=seen) as (url, _):
            r = cli(
                "bench", "--url", url, "--model", "tiny", "--tokenizer", str(tiny_dir),
                "--dataset", str(data), "--concurrency", "1", "--duration", "1s",
                "--warmup", "2r", "--repetitions", "1", "--precision", "off",
                "--output-len", "2", "--max-client-lag-ms", "1000",
                "--min-achieved-concurrency", "0.5", "-o", str(out),
            )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        sent = bodies(seen)
        salts.append([b["cache_salt"] for b in sent])
        assert len(set(salts[-1])) == len(sent) > 2  # one salt a request, prompts repeat
        res = load_results(out / "results.json")
        runs = {s.rsplit("-", 1)[0] for s in salts[-1]}
        assert len(runs) == 1 and runs.pop().startswith("sb")  # the run's salt, then the index
        assert res.provenance.workload["cache_salt"] == "per request"
        assert res.provenance.protocol["thresholds"]["max_prefix_hit_share"] == 0.05
    assert not set(salts[0]) & set(salts[1])


def test_a_workload_that_shares_prefixes_is_salted_once_per_run() -> None:
    ep = Endpoint("http://x", "tiny", cache_salt="sb7", salt_each=False)
    assert request_body(ep, "hi", 4, index=3)["cache_salt"] == "sb7"
    each = Endpoint("http://x", "tiny", cache_salt="sb7", salt_each=True)
    assert request_body(each, "hi", 4, index=3)["cache_salt"] == "sb7-3"
    assert "cache_salt" not in request_body(Endpoint("http://x", "tiny"), "hi", 4, index=3)
