"""A whole sweep against a real HTTP server on 127.0.0.1, short: the protocol's order, the
window edges where counters are read, the results file after each point, a point that
fails because the server died, and --resume finishing the run."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from servebook.bench.endpoint import Endpoint
from servebook.bench.protocol import (
    PointOutcome,
    PointSpec,
    ProtocolSettings,
    Target,
    Warmup,
    run_sweep,
)
from servebook.bench.target import from_url
from servebook.bench.workload import DatasetPrompts, Prompt
from servebook.metrics.scrape import Snapshot, snapshot_from_text
from servebook.results.schema import ModelInfo, Provenance
from servebook.results.store import ResultsWriter, load_results
from tests.unit.served_app import StreamingServer, loose_thresholds

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"


class FakeScrape:
    """Counters of a real PD run: 'before' at the window's opening, 'after' at its end."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls = 0
        self.delay_s = delay_s  # a /metrics that takes this long to answer

    def __call__(self, urls: Mapping[str, str | tuple[str, ...]]) -> dict[str, Snapshot | str]:
        time.sleep(self.delay_s)
        edge = "before" if self.calls % 2 == 0 else "after"
        self.calls += 1
        return {
            role: snapshot_from_text(
                (FIXTURES / f"vllm-0.32.0-cpu-pd-spec-{role}-{edge}.prom").read_text()
            )
            for role in urls
        }


SETTINGS = ProtocolSettings(
    concurrencies=(1, 3),
    repetitions=1,
    order="ascending",
    warmup=Warmup(0.05, 2),
    duration_s=0.25,
    min_requests=3,
    thresholds=loose_thresholds(min_handoff_share=0.9),
)


def provenance() -> Provenance:
    return Provenance(
        servebook_version="test",
        model=ModelInfo(name="tiny"),
        seed=0,
        protocol=SETTINGS.to_dict(),
        started_at="2026-01-01T00:00:00+00:00",
    )


def target(url: str) -> Target:
    return Target(
        endpoint=Endpoint(url, "tiny"),
        metrics_urls={"prefill": "http://prefill", "decode": "http://decode"},
        decode_role="decode",
    )


def test_a_sweep_writes_valid_points_with_server_evidence(
    server: tuple[str, StreamingServer],
    tmp_path: Path,
) -> None:
    url, srv = server
    srv.down = False
    seen: list[tuple[int | None, bool]] = []

    def on_point(ps: PointSpec, outcome: PointOutcome | None) -> None:
        seen.append((ps.level.concurrency, outcome is not None))

    prompts = DatasetPrompts([Prompt("x", 4)], "memory", "0")
    scrape = FakeScrape(delay_s=0.03)
    res = run_sweep(
        target(url),
        SETTINGS,
        prompts,
        ResultsWriter(tmp_path, provenance()),
        scrape_fn=scrape,
        on_point=on_point,
    )
    assert seen == [(1, False), (1, True), (3, False), (3, True)]
    assert scrape.calls == 4  # both edges of both windows
    assert [p.concurrency for p in res.points] == [1, 3]
    for p in res.points:
        assert p.valid, p.invalid_reasons
        assert p.requests_ok >= 3 and p.errors == 0
        assert p.window.duration_s is not None and p.window.duration_s >= 0.25
        # the counters span scrape to scrape: how far each scrape lagged its edge is kept
        for lag in (p.window.scrape_open_lag_ms, p.window.scrape_close_lag_ms):
            assert lag is not None and lag >= 30
        assert p.server["handoff_share"] == pytest.approx(896 / 917)
        assert p.ttft_ms.p50 is not None and p.output_tokens_per_s
        # the engines' own latency, per role, from the same two scrapes
        assert p.server_latency is not None and set(p.server_latency) == {"prefill", "decode"}
        assert p.server_latency["decode"]["tpot"]["status"] == "ok"
        assert p.server_latency["prefill"]["ttft"]["status"] == "ok"
        # PD: the client's per-token figures are set against decode's, the role that
        # made the tokens (this test server streams at 2 ms a token, the capture did not)
        assert p.latency_diagnosis is not None
        assert p.latency_diagnosis["server_tpot_ms_mean"] == pytest.approx(
            p.server_latency["decode"]["tpot"]["mean"]
        )
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [p["concurrency"] for p in doc["points"]] == [1, 3]
    assert {a["concurrency"] for a in doc["aggregates"]} == {1, 3}


def test_a_dead_server_leaves_the_finished_points_and_an_invalid_one_then_resume_finishes(
    server: tuple[str, StreamingServer],
    tmp_path: Path,
) -> None:
    url, srv = server
    srv.down = False
    prompts = DatasetPrompts([Prompt("x", 4)], "memory", "0")

    def kill_before_second(ps: PointSpec, outcome: PointOutcome | None) -> None:
        if outcome is not None and ps.level.concurrency == 1:
            srv.down = True

    run_sweep(
        target(url),
        SETTINGS,
        prompts,
        ResultsWriter(tmp_path, provenance()),
        scrape_fn=FakeScrape(),
        on_point=kill_before_second,
    )
    first = load_results(tmp_path / "results.json")
    assert [(p.concurrency, p.valid) for p in first.points] == [(1, True), (3, False)]
    dead = first.points[1]
    assert dead.errors > 0 and dead.error_samples[0].startswith("HTTP 503")
    assert any(r.startswith("SB403: ") for r in dead.invalid_reasons)

    srv.down = False  # the server is back; --resume runs what is not done
    again = ResultsWriter(tmp_path, provenance(), resume=True)
    assert again.done_keys() == {("concurrency", 1.0, 0)}
    ran: list[int | None] = []
    run_sweep(
        target(url),
        SETTINGS,
        prompts,
        again,
        scrape_fn=FakeScrape(),
        on_point=lambda ps, o: ran.append(ps.level.concurrency) if o else None,
    )
    assert ran == [3]
    final = load_results(tmp_path / "results.json")
    assert [(p.concurrency, p.valid) for p in final.points] == [(1, True), (3, True)]
    assert [(p.concurrency, p.valid) for p in final.superseded_points] == [(3, False)]


def test_a_role_lost_during_a_point_makes_that_point_invalid_naming_the_role(
    server: tuple[str, StreamingServer],
    tmp_path: Path,
) -> None:
    """The backend's word that a role's forward broke (or its process died, or its Pod was
    replaced) during a point joins that point's verdict (SB410), though every request of
    the point succeeded; the points before it stay valid."""
    url, srv = server
    srv.down = False
    lost: dict[str, str] = {}

    def lose_decode_during_second(ps: PointSpec, outcome: PointOutcome | None) -> None:
        if outcome is None and ps.level.concurrency == 3:
            lost["decode"] = "Pod tiny-pd-decode-7f9c on node n1: port-forward to 8000 broke"

    t = target(url)
    res = run_sweep(
        Target(t.endpoint, t.metrics_urls, t.decode_role, problems=lambda: dict(lost)),
        SETTINGS,
        DatasetPrompts([Prompt("x", 4)], "memory", "0"),
        ResultsWriter(tmp_path, provenance()),
        scrape_fn=FakeScrape(),
        on_point=lose_decode_during_second,
    )
    first, second = res.points
    assert first.valid, first.invalid_reasons
    assert second.errors == 0 and not second.valid
    assert second.invalid_reasons == [
        "SB410: decode during the point: Pod tiny-pd-decode-7f9c on node n1: port-forward to "
        "8000 broke"
    ]


def test_a_url_server_without_counters_gives_valid_points_that_say_no_server_evidence(
    server: tuple[str, StreamingServer],
    tmp_path: Path,
) -> None:
    """Any OpenAI-compatible server: this one answers completions and has no /metrics at
    all.  ``--url`` finds no counters, and its points stand on the client's figures."""
    url, srv = server
    srv.down = False
    subject = from_url(url, model="tiny", tokenizer=None, api="completions", request_timeout_s=30)
    assert subject.target.metrics_urls == {} and subject.info["engine"] is None
    lenient = dataclasses.replace(
        SETTINGS,
        thresholds=dataclasses.replace(SETTINGS.thresholds, require_server_evidence=False),
    )
    res = run_sweep(
        subject.target,
        lenient,
        DatasetPrompts([Prompt("x", 4)], "memory", "0"),
        ResultsWriter(tmp_path, provenance()),
    )
    for p in res.points:
        assert p.valid, p.invalid_reasons
        assert p.server["evidence"] == "none"
    strict = dataclasses.replace(
        SETTINGS,
        concurrencies=(1,),
        thresholds=dataclasses.replace(SETTINGS.thresholds, require_server_evidence=True),
    )
    res = run_sweep(
        subject.target,
        strict,
        DatasetPrompts([Prompt("x", 4)], "memory", "0"),
        ResultsWriter(tmp_path / "strict", provenance()),
    )
    (p,) = res.points
    assert not p.valid and p.invalid_reasons[0].startswith("SB406: server evidence missing")
