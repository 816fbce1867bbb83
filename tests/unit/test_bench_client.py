"""The client against a real HTTP server on 127.0.0.1 (aiohttp, in a thread of this test):
closed loop, open loop from scheduled times, errors kept, the controller's window, worker
processes.  The server streams like vLLM: one event per token, a usage-only chunk, [DONE]."""

from __future__ import annotations

import asyncio
import signal
import socket
import time

import numpy as np
import pytest
from aiohttp import web

from servebook import stopping
from servebook.bench.control import Decision, LoadSpec, Progress
from servebook.bench.coordinator import run_load
from servebook.bench.endpoint import Endpoint
from servebook.bench.openai_stream import request_body
from servebook.bench.workload import DatasetPrompts, Prompt
from tests.unit.served_app import TTFT_MS, StreamingServer, served


def prompts(*texts: str, out: int = 6) -> DatasetPrompts:
    return DatasetPrompts([Prompt(t, out) for t in texts], "memory", "0")


def test_request_body_asks_for_usage_ignore_eos_and_greedy_decoding() -> None:
    b = request_body(Endpoint("http://x", "tiny"), "hi", 16)
    assert b == {
        "model": "tiny",
        "prompt": "hi",
        "max_tokens": 16,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    chat = request_body(Endpoint("http://x", "tiny", api="chat"), "hi", 4)
    assert chat["messages"] == [{"role": "user", "content": "hi"}] and "prompt" not in chat


def test_closed_loop_keeps_concurrency_requests_in_flight_and_times_each(
    server: tuple[str, StreamingServer],
) -> None:
    url, srv = server
    srv.max_in_flight = 0
    res = run_load(Endpoint(url, "tiny"), LoadSpec(concurrency=4, num_requests=16), prompts("x"))
    assert [r.index for r in res.records] == list(range(16))
    assert all(r.ok for r in res.records), [r.error for r in res.records]
    assert srv.max_in_flight == 4
    for r in res.records:
        assert r.output_tokens == 6
        # Closed loop: scheduled when the slot frees, on the wire right after (the first
        # requests also open their connections).
        assert 0 <= r.send_lag_ns < 500_000_000
        recv, stamps = srv.truth[f"sb-{r.index}"]
        # Closed loop measures from when the bytes went out, which precedes the server's
        # reading them: the stamp is the socket write's.
        assert r.latency_from == "sent"
        assert r.sent_ns <= recv
        assert r.ttft_ns is not None and r.ttft_ns >= stamps[0] - recv
        assert len(r.itl_ns()) == 5
        assert r.chunk_ns[0] >= stamps[0]  # stamped on arrival, never before the send
    lags = sorted(r.send_lag_ns for r in res.records[4:])  # connections open by now
    assert lags[len(lags) // 2] < 5_000_000
    assert res.workers[0].cpu_fraction > 0
    assert len(res.workers[0].loop_lag_ns) > 0


def test_rate_mode_follows_the_seeded_poisson_schedule_and_charges_lateness(
    server: tuple[str, StreamingServer],
) -> None:
    url, _ = server
    # One request in flight at a time at 200 req/s: most requests wait for the slot, and
    # their TTFT must include the wait.
    spec = LoadSpec(rate=200.0, max_concurrency=1, num_requests=10, seed=5)
    res = run_load(Endpoint(url, "tiny"), spec, prompts("x", out=3))
    gaps = np.random.default_rng([5, 0, 0x5EED]).exponential(1e9 / 200.0, size=10).astype(np.int64)
    sched = np.array([r.scheduled_ns for r in res.records]) - res.records[0].scheduled_ns
    assert sched.tolist() == (np.cumsum(gaps) - gaps[0]).tolist()
    late = [r for r in res.records if r.send_lag_ns > 5_000_000]
    assert late, "expected requests to wait behind max_concurrency=1"
    for r in res.records:
        assert r.ok and r.latency_from == "scheduled"
        assert r.ttft_ns is not None and r.ttft_ns >= r.send_lag_ns + TTFT_MS * 1e6 * 0.9


def test_errors_are_recorded_never_dropped(server: tuple[str, StreamingServer]) -> None:
    url, _ = server
    res = run_load(
        Endpoint(url, "tiny"),
        LoadSpec(concurrency=2, num_requests=4),
        prompts("x", "http500", "errorevent", "x"),
    )
    assert len(res.records) == 4
    by = {r.index: r for r in res.records}
    assert by[0].ok and by[3].ok
    assert by[1].error is not None and by[1].error.startswith("HTTP 500: ")
    assert by[1].status == 500
    assert by[2].error == "server error event: engine died (500)"


def test_a_refused_connection_is_an_error_record() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    res = run_load(
        Endpoint(f"http://127.0.0.1:{port}", "tiny"),
        LoadSpec(concurrency=1, num_requests=2),
        prompts("x"),
    )
    assert [r.ok for r in res.records] == [False, False]
    assert all("Connect" in (r.error or "") for r in res.records)


def test_multi_token_chunks_are_counted_from_token_ids(server: tuple[str, StreamingServer]) -> None:
    url, _ = server
    res = run_load(Endpoint(url, "tiny"), LoadSpec(concurrency=1, num_requests=1), prompts("pairs"))
    r = res.records[0]
    assert r.ok and r.output_tokens == 6 and len(r.chunk_ns) == 3
    assert sorted(r.itl_ns().tolist())[:3] == [0, 0, 0]


def test_the_controller_opens_the_window_and_stops_the_load(
    server: tuple[str, StreamingServer],
) -> None:
    url, _ = server
    seen: list[Progress] = []

    def controller(p: Progress) -> Decision:
        seen.append(p)
        if p.window_start_ns is None:
            return Decision(open_window=p.completed_ok >= 4)
        return Decision(stop=p.window_ok >= 6)

    # Requests of ~60 ms: some are always in flight when the stop comes (the worker sees
    # it within 10 ms; with 6-token requests all three sometimes ended in between).
    res = run_load(
        Endpoint(url, "tiny"),
        LoadSpec(concurrency=3, deadline_s=30),
        prompts("x", out=28),
        controller=controller,
        poll_s=0.01,
    )
    assert res.window_start_ns is not None and res.window_end_ns is not None
    assert res.window_end_ns > res.window_start_ns
    in_window = [
        r
        for r in res.records
        if r.ok and r.start_ns >= res.window_start_ns and r.end_ns <= res.window_end_ns
    ]
    assert len(in_window) >= 6
    assert any(r.cancelled for r in res.records)  # in flight at the stop: cancelled
    assert not any(r.cancelled and r.error for r in res.records)
    assert seen[-1].window_ok >= 6


def test_a_stop_signal_the_event_loop_swallowed_still_stops_the_load(
    server: tuple[str, StreamingServer],
) -> None:
    """Issue 33: a Ctrl-C whose KeyboardInterrupt landed in a uvloop transport callback was
    logged as a transport error and lost, and the sweep ran on to exit 0. The signal is
    recorded before the raise (``servebook.stopping``); the load's next poll stops it."""
    url, _ = server
    polls: list[int] = []

    def swallowed(p: Progress) -> None:
        polls.append(p.completed_ok)
        if p.completed_ok >= 3 and not stopping.stopped_by:
            stopping.stopped_by.append(signal.SIGINT)  # recorded; its raise never came

    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_load(
                Endpoint(url, "tiny"),
                LoadSpec(concurrency=2, deadline_s=30),
                prompts("x", out=28),
                on_progress=swallowed,
                poll_s=0.01,
            )
    finally:
        stopping.stopped_by.clear()
    assert time.monotonic() - t0 < 10, "the load ran on after the stop"
    assert polls and polls[-1] >= 3


def test_a_stop_during_a_polled_load_is_recorded_for_its_poll_not_raised_in_a_callback() -> None:
    """The handler's raise landed inside uvloop's ``data_received`` and printed a
    "Fatal error on transport" traceback; while the load polls, the handler records the
    signal and the poll raises it."""
    from servebook import cli

    saved = {sig: signal.getsignal(sig) for sig in cli.STOPPING}
    try:
        with stopping.polled():
            cli._on_stop(signal.SIGINT, None)  # no KeyboardInterrupt here
        assert stopping.stopped_by == [signal.SIGINT]
        with pytest.raises(KeyboardInterrupt):
            stopping.raise_if_requested()
        with pytest.raises(KeyboardInterrupt):  # outside a polled load: at once, as before
            cli._on_stop(signal.SIGINT, None)
    finally:
        stopping.stopped_by.clear()
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_worker_processes_split_the_load_and_merge_their_records(
    server: tuple[str, StreamingServer],
) -> None:
    url, srv = server
    srv.max_in_flight = 0
    res = run_load(
        Endpoint(url, "tiny"),
        LoadSpec(concurrency=4, num_requests=12, workers=2),
        prompts("x", out=4),
    )
    assert [r.index for r in res.records] == list(range(12))
    assert {r.worker for r in res.records} == {0, 1}
    assert all(r.worker == r.index % 2 for r in res.records)
    assert all(r.ok for r in res.records)
    assert len(res.workers) == 2 and len({w.pid for w in res.workers}) == 2
    assert srv.max_in_flight <= 4


def test_events_split_across_chunks_multi_token_chunks_and_error_events_give_their_records(
    server: tuple[str, StreamingServer],
) -> None:
    url, _ = server
    res = run_load(
        Endpoint(url, "tiny"),
        LoadSpec(concurrency=2, num_requests=4),
        prompts("x", "split", "pairs", "errorevent", out=5),
    )
    summary = [(r.index, r.output_tokens, len(r.chunk_ns), r.error) for r in res.records]
    assert summary == [
        (0, 5, 5, None),
        (1, 5, 5, None),  # events split across HTTP chunks are reassembled
        (2, 5, 3, None),
        (3, 1, 1, "server error event: engine died (500)"),
    ]


def test_default_workers_scale_with_concurrency_within_the_cores() -> None:
    from servebook.bench.control import default_workers

    assert default_workers(1, cores=8) == 1
    assert default_workers(256, cores=8) == 1
    assert default_workers(257, cores=8) == 2
    assert default_workers(2048, cores=4) == 4
    assert default_workers(None, cores=8) == 1  # open loop: one Poisson stream


def test_a_request_that_outlasts_its_timeout_is_an_error_record() -> None:
    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(3)
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/completions", hang)
    with served(app) as url:
        res = run_load(
            Endpoint(url, "tiny", request_timeout_s=0.3),
            LoadSpec(concurrency=1, num_requests=1),
            prompts("x"),
        )
    assert [r.error for r in res.records] == ["timed out after 0.3 s"]
    # Ended at its timeout, not when the server answered 3 s later (the request's own
    # clock: a worker process's start on a busy machine is not the request's time).
    (r,) = res.records
    assert 0.25e9 <= r.end_ns - r.sent_ns < 2e9
