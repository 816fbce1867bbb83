"""Verify's decisions over Prometheus text captured from real vLLM CPU servers
(scripts/capture_metrics.py wrote the fixtures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servebook.engines import handoff as H
from servebook.engines import vllm
from servebook.findings import Severity
from servebook.metrics.scrape import ScrapeError, Snapshot, delta, snapshot_from_text
from servebook.verify import checks as C

FIX = Path(__file__).parent / "fixtures" / "metrics"


def snap(name: str) -> Snapshot:
    return snapshot_from_text((FIX / f"vllm-0.32.0-cpu-{name}.prom").read_text(), url=name)


def probe_prompt_tokens() -> int:
    usage = json.loads((FIX / "vllm-0.32.0-cpu-pd-spec-probe-usage.json").read_text())
    return int(usage["prompt_tokens"])


def window(kind: str, prompt_tokens: list[int]) -> C.Window:
    return C.Window(
        before={r: snap(f"{kind}-{r}-before") for r in ("prefill", "decode")},
        after={r: snap(f"{kind}-{r}-after") for r in ("prefill", "decode")},
        prompt_tokens=prompt_tokens,
    )


# --- metrics/scrape ------------------------------------------------------------------------


def test_created_samples_are_dropped_and_counters_keep_their_total_name() -> None:
    s = snap("pd-spec-decode-after")
    assert s.has(vllm.M.PROMPT_TOKENS)
    assert not any(name.endswith("_created") for name in s.samples)


def test_value_sums_matching_label_sets_and_absent_is_none() -> None:
    s = snap("pd-spec-decode-after")
    by_source = sum(
        s.value(vllm.M.PROMPT_TOKENS_BY_SOURCE, source=src) or 0
        for src in (vllm.SOURCE_EXTERNAL, vllm.SOURCE_LOCAL_COMPUTE, vllm.SOURCE_LOCAL_CACHE)
    )
    assert by_source == s.value(vllm.M.PROMPT_TOKENS)  # the three sources sum to the total
    assert s.value("vllm:no_such_metric_total") is None


def test_delta_over_a_real_window() -> None:
    d = delta(
        snap("pd-spec-decode-before"), snap("pd-spec-decode-after"), vllm.M.EXTERNAL_PREFIX_HITS
    )
    assert d.usable and d.value is not None and d.value > 0
    assert d.value % 128 == 0  # whole blocks only


def test_counter_reset_is_flagged_not_negative() -> None:
    # A restarted server: the "after" snapshot is a fresh server with lower counters.
    d = delta(snap("pd-spec-decode-after"), snap("pd-spec-decode-before"), vllm.M.PROMPT_TOKENS)
    assert d.reset and d.value is None and not d.usable


def test_metric_absent_in_one_snapshot_is_none_not_zero() -> None:
    d = delta(snap("mixed-disable-log-stats"), snap("pd-spec-decode-after"), vllm.M.PROMPT_TOKENS)
    assert d.value is None and not d.reset


def test_garbage_is_a_scrape_error() -> None:
    with pytest.raises(ScrapeError):
        snapshot_from_text("vllm:x{a=b 1 2 3\n")


# --- block rounding ---------------------------------------------------------------------


def test_block_size_is_read_from_cache_config_info() -> None:
    assert H.block_size(snap("pd-spec-decode-after")) == 128


@pytest.mark.parametrize(
    ("prompts", "block", "required"),
    [
        ([1007], 128, 896 - 128),  # 1007 tokens transfer 896 on CPU (whole blocks)
        ([1007, 6], 128, 896 - 256),  # a short smoke prompt adds nothing but slack
        ([129], 128, 0),  # not even one full block after the last token: nothing required
        ([2000, 2000], 16, 2 * (1998 // 16 * 16) - 32),
    ],
)
def test_handoff_threshold_accounts_for_whole_blocks(
    prompts: list[int], block: int, required: int
) -> None:
    assert H.handoff_required_tokens(prompts, block) == max(0, required)


def test_align_to_block_matches_what_example_connector_transferred() -> None:
    assert vllm.align_to_block(1007, 128) == 896
    assert vllm.align_to_block(970, 128) == 896
    assert vllm.align_to_block(1, 128) == 0


# --- checks ---------------------------------------------------------------------------


def test_healthy_handoff_passes_on_both_roles() -> None:
    found = C.check_handoff("prefill", "decode", window("pd-spec", [probe_prompt_tokens()]))
    assert [(f.subject, f.severity) for f in found] == [
        ("decode", Severity.PASS),
        ("prefill", Severity.PASS),
    ]
    assert found[0].evidence["share"] >= found[0].evidence["threshold"] > 0.5


def test_handoff_that_failed_open_fails_naming_decode_and_share() -> None:
    found = C.check_handoff("prefill", "decode", window("pd-failopen", [probe_prompt_tokens()]))
    decode = found[0]
    assert decode.check == "SB302" and decode.subject == "decode"
    assert decode.severity is Severity.FAIL
    assert decode.evidence["share"] == 0.0
    assert "0.0%" in decode.message and "failed open" in decode.message


def test_handoff_with_restarted_decode_is_a_failure_not_a_negative_share() -> None:
    w = window("pd-spec", [probe_prompt_tokens()])
    restarted = C.Window(before=w.after, after=w.before, prompt_tokens=w.prompt_tokens)
    found = C.check_handoff("prefill", "decode", restarted)
    assert found[0].severity is Severity.FAIL and "restarted" in found[0].message


def test_handoff_without_external_counters_cannot_decide() -> None:
    nostats = snap("mixed-disable-log-stats")
    w = C.Window(
        before={"decode": nostats, "prefill": nostats},
        after={"decode": nostats, "prefill": nostats},
        prompt_tokens=[1000],
    )
    found = C.check_handoff("prefill", "decode", w)
    assert found[0].severity is Severity.ERROR and "absent" in found[0].message


def test_speculation_engaged_reports_acceptance() -> None:
    w = window("pd-spec", [probe_prompt_tokens()])
    [f] = C.check_speculation("decode", w)
    assert f.severity is Severity.PASS
    assert 0 < f.evidence["acceptance_rate"] <= 1
    assert f.evidence["drafts"] > 0


def test_speculation_absent_on_a_role_that_claims_it_fails() -> None:
    w = window("pd-failopen", [1000])  # tiny-pd: no speculation configured
    [f] = C.check_speculation("decode", w)
    assert f.severity is Severity.FAIL and "not configured on this role" in f.message


def test_outcomes_pass_without_errors_and_report_preemptions() -> None:
    [f] = C.check_outcomes("decode", window("pd-spec", [1000]))
    assert f.severity is Severity.PASS and f.evidence["preemptions"] == 0


def test_missing_metrics_are_a_finding_naming_them() -> None:
    [f] = C.check_metrics_present("mixed", snap("mixed-disable-log-stats"), vllm.REQUIRED_METRICS)
    assert f.severity is Severity.FAIL
    assert vllm.M.PROMPT_TOKENS in f.message


def test_spec_symmetry_ignores_the_draft_path_but_not_the_rest() -> None:
    a = [
        "--speculative-config",
        '{"method":"draft_model","model":"/n1/d","num_speculative_tokens":3}',
    ]
    b = [
        "--speculative-config",
        '{"method":"draft_model","model":"/n2/d","num_speculative_tokens":3}',
    ]
    c = [
        "--speculative-config",
        '{"method":"draft_model","model":"/n1/d","num_speculative_tokens":4}',
    ]
    assert C.check_spec_symmetry({"prefill": a, "decode": b})[0].severity is Severity.PASS
    # differently named draft directories: a warning, as lint's SB105 gives
    e = ["--speculative-config", '{"method":"draft_model","model":"/e","num_speculative_tokens":3}']
    assert C.check_spec_symmetry({"prefill": a, "decode": e})[0].severity is Severity.WARN
    assert C.check_spec_symmetry({"prefill": a, "decode": c})[0].severity is Severity.FAIL
    one_sided = C.check_spec_symmetry({"prefill": ["--dtype", "bf16"], "decode": a})
    assert one_sided[0].severity is Severity.FAIL and "prefill: absent" in one_sided[0].message
    assert C.check_spec_symmetry({"prefill": [], "decode": []}) == []


def test_spec_symmetry_reads_full_command_lines_and_the_dotted_form() -> None:
    serve = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    cfg = '{"method":"draft_model","model":"/a","num_speculative_tokens":3}'
    a = [*serve, f"--speculative-config={cfg}"]
    # the dotted form overrides one key: the engine would run with 4 speculative tokens
    b = [*serve, "--speculative-config", cfg, "--speculative-config.num_speculative_tokens", "4"]
    [f] = C.check_spec_symmetry({"prefill": a, "decode": b})
    assert (
        f.severity is Severity.FAIL and "num_speculative_tokens: prefill 3, decode 4" in f.message
    )
    broken = [*serve, "--speculative-config", "{method: ngram"]
    [g] = C.check_spec_symmetry({"prefill": a, "decode": broken})
    assert g.severity is Severity.FAIL and "unparsed" in g.message


def test_log_signature_of_decode_only_speculation() -> None:
    line = (
        "(Worker pid=8529) ERROR 11-29 21:36:42 [multiproc_executor.py:1063] "
        "FileNotFoundError: No such file or directory: /s/kv/76e4af/"
        "draft_model.model.layers.0.self_attn.attn.safetensors"
    )
    found = C.check_logs("decode", "INFO start\n" + line + "\nmore\n")
    assert [f.evidence["signature"] for f in found] == ["asymmetric-speculation"]
    assert "speculative" in found[0].message and found[0].subject == "decode"
    assert C.check_logs("decode", "INFO all good\n") == []


def test_a_prompt_too_short_for_whole_blocks_is_not_judged_and_says_how_long_it_must_be() -> None:
    # decode's page says block_size 128: a 256-token prompt transfers one block, which is
    # the slack, so the threshold would be 0 and could not fail
    assert H.handoff_min_prompt_tokens(128) == 258
    assert H.handoff_required_tokens([257], 128) == 0 < H.handoff_required_tokens([258], 128)
    found = C.check_handoff("prefill", "decode", window("pd-spec", [256]))
    decode = found[0]
    assert decode.severity is Severity.ERROR and decode.failed
    assert "handoff not judged at this length: needs >= 258 prompt tokens" in decode.message
