"""Server-side latency from vLLM's histograms: window percentiles from bucket deltas of a
captured /metrics pair (expected figures computed by hand below from the fixture's bucket
counts), the bucket each estimate lies in, +Inf, empty windows and restarts; and the
client-vs-server diagnosis."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from servebook.engines.vllm import LATENCY_HISTOGRAMS, H
from servebook.metrics.histogram import (
    Buckets,
    LatencyDiagnosis,
    diagnose_client_latency,
    histogram_window,
    latency_windows,
    quantile,
    read_buckets,
)
from servebook.metrics.scrape import Snapshot, snapshot_from_text

FIX = Path(__file__).parent / "fixtures" / "metrics"


def snap(name: str) -> Snapshot:
    return snapshot_from_text((FIX / f"vllm-0.32.0-cpu-{name}.prom").read_text())


DECODE_BEFORE, DECODE_AFTER = snap("pd-failopen-decode-before"), snap("pd-failopen-decode-after")


def test_the_captures_carry_every_latency_histogram_the_protocol_reads() -> None:
    for name in LATENCY_HISTOGRAMS.values():
        b = read_buckets(DECODE_AFTER, name)
        assert b is not None, name
        assert math.isinf(b.bounds[-1])


def test_itl_percentiles_from_bucket_deltas_of_a_captured_pair() -> None:
    # vllm:inter_token_latency_seconds_bucket, engine 0, before -> after:
    #   le   0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 ... +Inf
    #   bef  0    3     5    5     5   5    5   6       7
    #   aft  1    10    17   18    18  20   20  21      22
    #   Δ    1    7     12   13    13  15   15  15      15   (count 15)
    w = histogram_window(DECODE_BEFORE, DECODE_AFTER, H.ITL)
    assert w.status == "ok" and w.count == 15
    # Mean is exact: Δsum / Δcount = (1.5982012279998798 - 1.0340292880000561) / 15.
    assert w.mean == pytest.approx((1.5982012279998798 - 1.0340292880000561) / 15)
    p50, p90, p99 = w.p(0.5), w.p(0.9), w.p(0.99)
    assert p50 is not None and p90 is not None and p99 is not None
    # p50: rank 7.5 in (0.025, 0.05] (cumulative 7 -> 12): 0.025 + 0.025 x 0.5/5.
    assert (p50.value, p50.low, p50.high) == pytest.approx((0.0275, 0.025, 0.05))
    # p90: rank 13.5 in (0.1, 0.15] (13 -> 15): 0.1 + 0.05 x 0.5/2.
    assert (p90.value, p90.low, p90.high) == pytest.approx((0.1125, 0.1, 0.15))
    # p99: rank 14.85 in the same bucket: 0.1 + 0.05 x 1.85/2.
    assert p99.value == pytest.approx(0.14625) and not p99.above_range


def test_ttft_and_tpot_of_a_window_with_one_request() -> None:
    b, a = snap("pd-spec-decode-before"), snap("pd-spec-decode-after")
    ws = latency_windows(b, a, {"ttft": H.TTFT, "tpot": H.TPOT, "decode": H.DECODE})
    # TTFT Δ: 0 up to le 0.5, 1 from le 0.75: one request in (0.5, 0.75]; p50 at its middle.
    ttft = ws["ttft"]
    assert ttft.count == 1 and ttft.mean == pytest.approx(1.6864898204803467 - 1.0053560733795166)
    p = ttft.p(0.5)
    assert p is not None and (p.value, p.low, p.high) == pytest.approx((0.625, 0.5, 0.75))
    # TPOT Δ: le 0.01 stays 1, le 0.025 goes 1 -> 2: one request in (0.01, 0.025].
    p = ws["tpot"].p(0.5)
    assert p is not None and (p.value, p.low, p.high) == pytest.approx((0.0175, 0.01, 0.025))
    # Decode time Δ: le 0.3 1 -> 1, le 0.5 1 -> 2.
    p = ws["decode"].p(0.5)
    assert p is not None and p.value == pytest.approx(0.4)


def test_a_prefill_server_has_no_itl_observations_in_the_window() -> None:
    w = histogram_window(snap("pd-spec-prefill-before"), snap("pd-spec-prefill-after"), H.ITL)
    assert w.status == "empty" and w.mean is None and not w.percentiles
    assert not w.usable


def test_a_histogram_missing_from_a_scrape_is_absent_not_zero() -> None:
    off = snap("mixed-disable-log-stats")
    w = histogram_window(off, off, H.TTFT)
    assert w.status == "absent" and w.mean is None


def test_a_restart_inside_the_window_gives_no_figures() -> None:
    # Scrapes in the wrong order look exactly like a restart: counts went backwards.
    w = histogram_window(DECODE_AFTER, DECODE_BEFORE, H.ITL)
    assert w.status == "reset" and not w.percentiles and w.mean is None


def test_a_rank_in_the_inf_bucket_is_the_largest_finite_bound_and_says_so() -> None:
    b = Buckets((0.1, 1.0, math.inf), (2.0, 3.0, 10.0), 10.0, 50.0)
    e = quantile(b, 0.9)
    assert e is not None and e.above_range
    assert (e.value, e.low, e.high) == (1.0, 1.0, math.inf)
    d = e.to_dict(1000)
    assert d["bucket"] == [1000.0, None] and d["above_range"] is True


def test_the_first_bucket_interpolates_from_zero_and_non_monotonic_deltas_are_mended() -> None:
    # A bucket read a moment before its neighbour can lag by one: cumulative must not fall.
    b = Buckets((0.01, 0.025, math.inf), (4.0, 3.0, 4.0), 4.0, 0.02)
    e = quantile(b, 0.5)
    assert e is not None and (e.value, e.low, e.high) == pytest.approx((0.005, 0.0, 0.01))


def test_text_histograms_with_two_engines_are_summed_per_bucket() -> None:
    def text(c0: tuple[int, int, int], c1: tuple[int, int, int], s: float) -> str:
        lines = ["# TYPE vllm:inter_token_latency_seconds histogram"]
        for eng, cs in (("0", c0), ("1", c1)):
            for le, c in zip(("0.01", "0.025", "+Inf"), cs, strict=True):
                lines.append(
                    f'vllm:inter_token_latency_seconds_bucket{{engine="{eng}",le="{le}"}} {c}'
                )
            lines.append(f'vllm:inter_token_latency_seconds_count{{engine="{eng}"}} {cs[-1]}')
            lines.append(f'vllm:inter_token_latency_seconds_sum{{engine="{eng}"}} {s}')
        return "\n".join(lines) + "\n"

    before = snapshot_from_text(text((0, 0, 0), (0, 0, 0), 0.0))
    after = snapshot_from_text(text((1, 3, 4), (1, 1, 2), 0.05))
    w = histogram_window(before, after, H.ITL)
    assert w.count == 6 and w.mean == pytest.approx(0.1 / 6)
    # Δ summed: le 0.01: 2, le 0.025: 4, +Inf: 6. p50: rank 3 in (0.01, 0.025]: 0.01 + 0.015/2.
    p = w.p(0.5)
    assert p is not None and p.value == pytest.approx(0.0175)
    one = histogram_window(before, after, H.ITL, engine="1")
    assert one.count == 2


# --- the client's view against the server's ------------------------------------------------


# Server: ITL mean 37.6 ms, p50 27.5 ms in (25, 50]; TPOT mean
# (0.18532993238094864 - 0.14771846971429373) x 1000 = 37.6 ms (one request).
SERVER = latency_windows(DECODE_BEFORE, DECODE_AFTER, {"itl": H.ITL, "tpot": H.TPOT})


def diagnose(
    tpot: float, itl: float, cpu: float | None = None, lag: float | None = None
) -> LatencyDiagnosis:
    return diagnose_client_latency(
        client_tpot_ms=tpot,
        client_itl_ms=itl,
        server_tpot=SERVER["tpot"],
        server_itl=SERVER["itl"],
        client_cpu_fraction=cpu,
        client_loop_lag_p99_ms=lag,
    )


def test_a_client_that_matches_the_server_agrees() -> None:
    d = diagnose(38.0, 30.0)
    assert d.agrees is True and d.cause is None
    assert d.server_tpot_ms == pytest.approx(37.6114627)
    assert d.server_itl_bucket_ms == pytest.approx((25.0, 50.0))


def test_client_itl_near_zero_with_the_right_tpot_is_coalesced_streaming() -> None:
    # Issue 14's run: ITL p50 0.00 ms at every level, TPOT as the server saw it.
    d = diagnose(36.0, 0.0)
    assert (d.agrees, d.cause) == (False, "coalesced_streaming")
    assert "chunk" in d.message and d.to_dict()["cause"] == "coalesced_streaming"


def test_tokens_arriving_faster_than_produced_is_burst_delivery_not_blamed_on_a_proxy() -> None:
    # tiny-mixed on real vLLM CPU, no proxy in the path: client TPOT 0.2 ms against the
    # server's 1.3 ms, client ITL p50 0.
    d = diagnose(2.0, 0.01)
    assert (d.agrees, d.cause) == (False, "burst_delivery")
    assert "server flushed its stream in bursts" in d.message and "or something" in d.message
    assert "event loop" not in d.message


def test_bursts_read_by_a_lagging_client_say_the_client_may_have_made_them() -> None:
    # tiny-pd with its engines' processes roaming both cores of a 2-core machine: client
    # TPOT 0.004 ms against the engine's 1.73, the client's event loop 262 ms late at p99.
    d = diagnose(0.004, 0.0, cpu=0.01, lag=262.1)
    assert (d.agrees, d.cause) == (False, "burst_delivery")
    assert "event loop lagged 262 ms at p99" in d.message and "read the stream late" in d.message
    assert "event loop" not in diagnose(0.004, 0.0, lag=12.0).message


def test_slow_reads_by_a_busy_client_are_a_saturated_client() -> None:
    d = diagnose(80.0, 75.0, cpu=0.97)
    assert (d.agrees, d.cause) == (False, "saturated_client")
    idle = diagnose(80.0, 75.0, cpu=0.2)
    assert idle.cause == "unexplained"


def test_without_server_histograms_there_is_no_verdict() -> None:
    off = snap("mixed-disable-log-stats")
    absent = histogram_window(off, off, H.ITL)
    d = diagnose_client_latency(
        client_tpot_ms=10.0, client_itl_ms=0.0, server_tpot=absent, server_itl=absent
    )
    assert d.agrees is None and d.cause is None
