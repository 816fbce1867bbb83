"""Trace replay against a scripted OpenAI-style server on 127.0.0.1 that records when each
request arrives and what it asks for: the trace's clock, exact prompt lengths, the trace's
output lengths and shared prefixes; then the replay's verdict (SB411), its settings, and
the workload in provenance and compare."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servebook.bench.control import next_gap_ns
from servebook.bench.datasets import Dataset, read_dataset
from servebook.bench.endpoint import Endpoint
from servebook.bench.protocol import (
    Level,
    PointOutcome,
    PointSpec,
    ProtocolSettings,
    Target,
    replay_rate,
    run_point,
)
from servebook.bench.sweep import BenchArgs, settings_from
from servebook.bench.target import workload_of
from servebook.bench.tokens import HFTokenizer
from servebook.bench.trace_prompts import TracePrompts
from servebook.bench.validity import Thresholds, judge
from servebook.report.comparability import comparability
from tests.unit.conftest import a_point, a_provenance
from tests.unit.served_app import loose_thresholds

SPEED = 2.0
THINK_S = 0.25  # the server's time to first token


@dataclasses.dataclass
class Recorded:
    """What the recording server saw: each prompt's arrival (the kernel's stamp, moved to
    this process's monotonic clock) and body."""

    arrivals: dict[str, int]
    bodies: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def recorder(
    tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """``recording_server.py`` in a process of its own; yields its URL and record file."""
    record = tmp_path_factory.mktemp("recorded") / "requests.jsonl"
    script = Path(__file__).parent / "recording_server.py"
    p = subprocess.Popen(
        [sys.executable, str(script), str(tiny_dir), str(record), str(THINK_S)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        port = int(p.stdout.readline())
        yield f"http://127.0.0.1:{port}", record
    finally:
        p.terminate()
        p.wait(10)


def realtime_minus_monotonic_ns() -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC, from the closest of a few paired readings."""
    pairs = []
    for _ in range(20):
        m0, r, m1 = time.monotonic_ns(), time.time_ns(), time.monotonic_ns()
        pairs.append((m1 - m0, r - (m0 + m1) // 2))
    return min(pairs)[1]


def recorded(record: Path) -> Recorded:
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    shift = realtime_minus_monotonic_ns()
    return Recorded({r["prompt"]: r["t"] - shift for r in rows}, {r["prompt"]: r for r in rows})


def bursty_trace(path: Path, rows: int = 48) -> Path:
    """A Mooncake-shaped trace of bursts: rows arrive in groups (same millisecond) with
    gaps between; each group's rows share their first hash id, and every row ends with
    an id of its own (so no two prompts are the same)."""
    rng = np.random.default_rng(7)
    t, lines, next_id = 0, [], 1000
    for n in range(rows):
        if n % 4 == 0:
            t += int(rng.integers(20, 160))
        group = n // 4
        lines.append(
            json.dumps(
                {
                    "timestamp": t,
                    "input_length": int(rng.integers(520, 900)),
                    "output_length": int(rng.integers(1, 5)),
                    "hash_ids": [group, next_id],
                }
            )
        )
        next_id += 1
    path.write_text("\n".join(lines) + "\n")
    return path


# The replay's arrival errors are timings: make test runs this module alone, after the unit
# tests that run in parallel.
pytestmark = pytest.mark.serial


@dataclasses.dataclass
class Replayed:
    ds: Dataset
    src: TracePrompts
    out: PointOutcome
    srv: Recorded


@pytest.fixture(scope="module", name="r")
def replayed(
    recorder: tuple[str, Path], tok: HFTokenizer, tmp_path_factory: pytest.TempPathFactory
) -> Replayed:
    """One replay of a bursty trace at SPEED through the protocol's point runner."""
    url, record = recorder
    ds = read_dataset(bursty_trace(tmp_path_factory.mktemp("trace") / "trace.jsonl"), "mooncake")
    src = TracePrompts(ds, tok, seed=1)  # built whole before the clock starts
    settings = ProtocolSettings(
        rates=(replay_rate(src.arrivals_ns, SPEED),),
        repetitions=1,
        replay_speed=SPEED,
        thresholds=dataclasses.replace(loose_thresholds(), require_server_evidence=False),
    )
    level = settings.levels()[0]
    out = run_point(Target(Endpoint(url, "tiny")), PointSpec(level, 0), settings, src)
    return Replayed(ds, src, out, recorded(record))


def test_a_replayed_trace_arrives_on_its_clock_whatever_is_in_flight(r: Replayed) -> None:
    records = sorted(r.out.load.records, key=lambda x: x.index)
    assert [x.index for x in records] == list(range(len(r.ds.rows)))
    # Scheduled on the trace's own clock, at SPEED, from the first row.
    t0, first = records[0].scheduled_ns, int(r.ds.rows[0].arrival_ns / SPEED)
    for x, row in zip(records, r.ds.rows, strict=True):
        assert x.scheduled_ns - t0 == int(row.arrival_ns / SPEED) - first
    # And arriving then: the server's stamp against the intended send time.
    errors_ms = [(r.srv.arrivals[r.src.get(x.index).text] - x.scheduled_ns) / 1e6 for x in records]
    shown = (
        " ".join(f"{e:.0f}" for e in errors_ms)
        + " / client: "
        + " ".join(f"{(x.sent_ns - x.scheduled_ns) / 1e6:.0f}" for x in records)
    )
    assert max(errors_ms) <= 50 and float(np.percentile(errors_ms, 90)) <= 20, shown
    # Rows left while earlier ones were still in flight (the server thinks THINK_S).
    sent = sorted(x.scheduled_ns for x in records)
    assert max(np.searchsorted(sent, t + THINK_S * 1e9) - k for k, t in enumerate(sent)) >= 8
    # The schedule lag is recorded and judged (SB411).
    c = r.out.point.client
    assert c.schedule_lag_p50_ms is not None and c.schedule_lag_p99_ms is not None
    sb411 = [f for f in r.out.findings if f.check == "SB411"]
    assert len(sb411) == 1 and not sb411[0].failed, sb411


def test_replayed_prompts_have_the_servers_exact_length_and_the_traces_output_length(
    r: Replayed, tok: HFTokenizer
) -> None:
    for i, row in enumerate(r.ds.rows):
        body = r.srv.bodies[r.src.get(i).text]
        assert len(tok.encode(body["prompt"], add_special_tokens=True)) == row.input_len
        assert body["max_tokens"] == row.output_len
    assert r.out.point.prompt_tokens_mismatch == 0 and r.out.point.output_tokens_mismatch == 0


def test_rows_sharing_a_leading_hash_id_reach_the_server_with_the_same_first_block(
    r: Replayed, tok: HFTokenizer
) -> None:
    def first_block(i: int) -> str:
        sent = r.srv.bodies[r.src.get(i).text]["prompt"]
        return tok.decode(tok.encode(sent, add_special_tokens=False)[:512])

    firsts = [first_block(i) for i in range(len(r.ds.rows))]
    for i, row in enumerate(r.ds.rows):
        for j, other in enumerate(r.ds.rows):
            same = row.hash_ids[0] == other.hash_ids[0]
            assert (firsts[i] == firsts[j]) == same, (i, j)


def test_a_replay_whose_requests_left_late_is_invalid() -> None:
    p = a_point(1, 0)
    late = p.model_copy(
        update={
            "client": p.client.model_copy(
                update={"schedule_lag_p50_ms": 4.0, "schedule_lag_p99_ms": 80.0}
            )
        }
    )
    found = judge(late, duration_s=60, min_requests=1, thresholds=Thresholds())
    (sb411,) = [f for f in found if f.check == "SB411"]
    assert sb411.failed and "p99 80.0 ms" in sb411.message and "bound 50 ms" in sb411.message
    # A point that is no replay gets no SB411 verdict at all.
    assert not [
        f
        for f in judge(p, duration_s=60, min_requests=1, thresholds=Thresholds())
        if f.check == "SB411"
    ]


def test_a_trace_without_levels_is_replayed_and_its_workload_is_provenance(
    tok: HFTokenizer, tmp_path: Path
) -> None:
    ds = read_dataset(bursty_trace(tmp_path / "t.jsonl", rows=8), "mooncake")
    src = TracePrompts(ds, tok, seed=0)
    args = BenchArgs(concurrency=None, dataset=tmp_path / "t.jsonl", replay_speed=2.0)
    s = settings_from(args, None, None, src)
    assert s.replay_speed == 2.0 and s.concurrencies == ()
    assert s.levels() == [Level(rate=s.rates[0])]
    assert s.warmup_for(s.levels()[0]).duration_s is None  # the window is the whole trace
    # Given a level, the same trace runs closed loop instead.
    closed = settings_from(dataclasses.replace(args, concurrency="2"), None, None, src)
    assert closed.replay_speed is None and closed.concurrencies == (2,)

    w = workload_of(s, src)
    assert (w["format"], w["sha256"], w["replay_speed"], w["block_size"]) == (
        "mooncake",
        ds.sha256,
        2.0,
        512,
    )
    faster = dict(w, replay_speed=4.0)
    c = comparability(a_provenance(workload=w), a_provenance(workload=faster), [])
    assert [d.kind for d in c.unexplained] == ["workload"]
    assert comparability(
        a_provenance(workload=w), a_provenance(workload=faster), ["workload"]
    ).like_for_like


@pytest.mark.parametrize("b", [0.25, 1.0, 4.0])
def test_burstiness_draws_gamma_gaps_with_the_mean_rate_and_cv_one_over_sqrt_b(b: float) -> None:
    rng = np.random.default_rng([0, 1])
    gaps = np.array([next_gap_ns(rng, 8.0, b) for _ in range(20_000)]) / 1e9
    assert gaps.mean() == pytest.approx(1 / 8, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(b), rel=0.05)


def test_burstiness_one_sends_the_poisson_arrivals_a_seed_always_sent() -> None:
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    assert [next_gap_ns(a, 2.0) for _ in range(5)] == [
        int(b.exponential(1e9 / 2.0)) for _ in range(5)
    ]
    assert "burstiness" not in ProtocolSettings(rates=(2.0,)).to_dict()
    assert ProtocolSettings(rates=(2.0,), burstiness=0.5).to_dict()["burstiness"] == 0.5
