"""The server's latency beside the client's, per point, on a real sweep over HTTP.

The stand-in is a server that coalesces its stream: it sends a request's first token,
then, after as long as the remaining tokens took to make, all of them in one write (as a
server with a large stream interval, or an engine that flushes per scheduler step,
does).  Its ``/metrics`` page is vLLM's shape (prometheus_client, vLLM's names and ITL
buckets) and says what the engine did: a token every 20 ms.  The client reads the
remaining tokens in one go, so its ITL p50 is ~0 while its TPOT (first to last token
over the gaps) is still ~20 ms: the results and the report must say
``coalesced_streaming``, not that the server streamed at 0 ms per token.

The same server in its bursting mode holds the whole answer back and writes it in one
burst once the engine made it (vLLM's CPU build under load, or a buffering proxy): the
client's TPOT and ITL are then ~0 and its TTFT late, while the histograms still say a
token every 20 ms.  Then the engine's figures lead: the point's TPOT/ITL, the report's
headline and tables, the precision target and compare are the server's, marked as such,
with the client's kept beside them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from servebook.bench.endpoint import Endpoint
from servebook.bench.protocol import ProtocolSettings, Target, Warmup, run_sweep
from servebook.bench.workload import DatasetPrompts, Prompt
from servebook.report.compare import compare, rows_table
from servebook.report.render import build_report, to_html, to_markdown
from servebook.report.summary import summary
from servebook.report.tables import LATENCY_KEYS, load_runs
from servebook.results.schema import ModelInfo, Provenance
from servebook.results.store import ResultsWriter, load_results
from tests.unit.served_app import loose_thresholds, served

STEP_S = 0.02  # the engine's time per output token
TTFT_S = 0.01
OUTPUT_LEN = 12
# vLLM's bucket bounds for these histograms (vllm.md 1.2), so the estimates carry the
# same resolution a real server's would.
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0)


class CoalescingServer:
    def __init__(self, burst: bool = False) -> None:
        self.burst = burst  # hold every token back and send them in one write
        self.registry = CollectorRegistry()
        r = self.registry
        self.prompt_tokens = Counter("vllm:prompt_tokens", "prompt tokens", registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "output", registry=r)
        self.success = Counter("vllm:request_success", "finished", ["finished_reason"], registry=r)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "TTFT", buckets=TTFT_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "ITL", buckets=ITL_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "vllm:request_time_per_output_token_seconds",
            "TPOT",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "E2E", buckets=E2E_BUCKETS, registry=r
        )

    @staticmethod
    def event(choice: object) -> bytes:
        return b"data: " + json.dumps(choice).encode() + b"\n\n"

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body["max_tokens"])
        t0 = time.monotonic()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(TTFT_S)
        token = {"choices": [{"index": 0, "text": "a", "finish_reason": None}]}
        if not self.burst:
            await resp.write(self.event(token))
        await asyncio.sleep(STEP_S * (n - 1))  # the engine makes the other tokens...
        held = n if self.burst else n - 1
        rest = b"".join(self.event(token) for _ in range(held))  # ...sent in one write
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}
        await resp.write(rest + self.event(usage) + b"data: [DONE]\n\n")
        await resp.write_eof()
        # What the engine observed: a token every STEP_S.
        self.ttft.observe(TTFT_S)
        for _ in range(n - 1):
            self.itl.observe(STEP_S)
        self.tpot.observe(STEP_S)
        self.e2e.observe(time.monotonic() - t0)
        self.prompt_tokens.inc(3)
        self.generation_tokens.inc(n)
        self.success.labels(finished_reason="length").inc()
        return resp

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain")


@contextlib.contextmanager
def scripted(burst: bool) -> Iterator[str]:
    srv = CoalescingServer(burst)
    app = web.Application()
    app.router.add_post("/v1/completions", srv.completions)
    app.router.add_get("/metrics", srv.metrics)
    with served(app) as url:
        yield url


@pytest.fixture()
def coalescing() -> Iterator[str]:
    with scripted(burst=False) as url:
        yield url


SETTINGS = ProtocolSettings(
    concurrencies=(2,),
    repetitions=1,
    warmup=Warmup(0.05, 2),
    duration_s=0.6,
    min_requests=3,
    # The latency diagnosis is what is under test, not the client.
    thresholds=loose_thresholds(),
)


def sweep(url: str, out: Path, settings: ProtocolSettings = SETTINGS) -> None:
    provenance = Provenance(
        servebook_version="test",
        model=ModelInfo(name="tiny"),
        seed=0,
        protocol=settings.to_dict(),
        started_at="2026-01-01T00:00:00+00:00",
    )
    run_sweep(
        Target(endpoint=Endpoint(url, "tiny"), metrics_urls={"server": url}),
        settings,
        DatasetPrompts([Prompt("x", OUTPUT_LEN)], "memory", "0"),
        ResultsWriter(out, provenance),
    )


def test_a_coalescing_server_is_reported_as_such_in_the_results_and_the_report(
    coalescing: str, tmp_path: Path
) -> None:
    sweep(coalescing, tmp_path)
    (p,) = load_results(tmp_path / "results.json").points
    assert p.valid, p.invalid_reasons
    # the client's own view: tokens arrived together, yet first-to-last took 20 ms a gap
    client_itl = p.client_latency["itl_ms"].p50
    assert client_itl is not None and client_itl < 1.0
    assert p.tpot_ms.mean == pytest.approx(STEP_S * 1000, rel=0.25)
    # so ITL's figure of record is the engine's, TPOT stays the client's
    assert p.latency_source == {"itl_ms": "server:server"}
    assert p.itl_ms.p50 is not None and 10.0 <= p.itl_ms.p50 <= 25.0

    assert p.server_latency is not None
    server = p.server_latency["server"]
    assert server["tpot"]["status"] == "ok" and server["ttft"]["status"] == "ok"
    assert server["tpot"]["mean"] == pytest.approx(STEP_S * 1000)  # exact: sum / count
    assert server["ttft"]["mean"] == pytest.approx(TTFT_S * 1000)
    assert server["itl"]["p50"]["bucket"] == [10.0, 25.0]  # the resolution, stated
    assert server["itl"]["count"] == server["tpot"]["count"] * (OUTPUT_LEN - 1)

    d = p.latency_diagnosis
    assert d is not None
    assert d["agrees"] is False and d["cause"] == "coalesced_streaming"
    assert d["server_tpot_ms_mean"] == pytest.approx(STEP_S * 1000)
    assert d["server_itl_ms_p50_bucket"] == [10.0, 25.0]

    report = build_report(load_runs([tmp_path]))
    table = report.server_latency
    assert table is not None and table in report.tables
    (row,) = table.rows
    assert row[1] == "c=2" and row[-1] == "coalesced_streaming"
    assert row[4] == "20.00"  # server TPOT mean, beside the client's
    assert "coalesced_streaming" in to_markdown(report)
    pngs = {p.id: b"" for p in report.plots}
    assert "coalesced_streaming" in to_html(report, pngs)


def test_a_bursting_server_is_measured_by_its_histograms_not_by_the_client(
    tmp_path: Path,
) -> None:
    # 10 requests a window: fewer make a level "not a measurement", with no headline figure
    settings = dataclasses.replace(SETTINGS, repetitions=2, min_requests=10)
    with scripted(burst=True) as url:
        sweep(url, tmp_path / "a", settings)
        sweep(url, tmp_path / "b", settings)
    points = load_results(tmp_path / "a" / "results.json").points
    assert len(points) == 2
    for p in points:
        assert p.valid, p.invalid_reasons
        d = p.latency_diagnosis
        assert d is not None and d["cause"] == "burst_delivery"
        # the client saw every token at once...
        assert p.client_latency["tpot_ms"].mean is not None
        assert p.client_latency["tpot_ms"].mean < 2.0
        assert p.client_latency["itl_ms"].p50 is not None and p.client_latency["itl_ms"].p50 < 1
        # ...its figures of record are the engine's: 20 ms a token, inside vLLM's bucket
        assert p.latency_source == {"tpot_ms": "server:server", "itl_ms": "server:server"}
        assert p.tpot_ms.mean == pytest.approx(STEP_S * 1000)
        assert p.tpot_ms.p50 is not None and 10.0 <= p.tpot_ms.p50 <= 25.0
        assert p.itl_ms.p50 is not None and 10.0 <= p.itl_ms.p50 <= 25.0
        assert p.tpot_ms.n == p.requests_ok or p.tpot_ms.n >= p.requests_ok

    runs = load_runs([tmp_path / "a", tmp_path / "b"])
    report = build_report(runs[:1])
    # the headline's TPOT is the server's: its exact mean (20 ms), as the histogram places
    # the p50 only within vLLM's 10-25 ms bucket, and it says so
    text = summary(runs[:1])
    m = re.search(r"TPOT mean ([0-9.]+) ms from the engine histograms", text)
    assert m is not None and float(m.group(1)) == pytest.approx(STEP_S * 1000), text
    assert "places the p50 only within 10-25 ms" in text, text
    assert "TPOT p50" not in text, text
    latency = next(t for t in report.tables if t.id == "latency")
    (row,) = latency.rows
    tpot = row[2 + LATENCY_KEYS.index("tpot_ms.p50")]
    assert "(server)" in tpot and not tpot.startswith("0")
    assert "server" in latency.note
    # the precision target judges the server's TPOT, not the client's ~0
    (agg,) = load_results(tmp_path / "a" / "results.json").aggregates
    assert 10.0 <= (agg.figures["tpot_ms.p50"].mean or 0) <= 25.0
    # compare: ITL and TPOT are the server's on both sides, never "-100% better"
    c = compare(runs[0], runs[1], force=True)
    for row_ in c.rows:
        if row_.metric in ("itl_ms.p50", "tpot_ms.p50"):
            assert row_.ratio is not None and row_.ratio > 0.5
    table = rows_table(c)
    assert any("(server)" in r[1] for r in table.rows)
