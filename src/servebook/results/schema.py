"""The results document: one JSON file per benchmark run, the contract between ``bench``
(which writes it, ``results.store.ResultsWriter``) and ``report``/``compare`` (which read
it, ``results.store.load_results``).

The stable core (``DIR/results.json``; more fields may be added, these stay)::

    {"schema": "servebook.bench/1",
     "provenance": {...},
     "points": [{"concurrency": 64, "rate": null, "repetition": 0, "valid": true,
                 "invalid_reasons": [], "requests_ok": N, "errors": N,
                 "output_tokens_per_s": x, "requests_per_s": x,
                 "ttft_ms": {"p50": x, "p90": x, "p99": x, "mean": x, "n": N},
                 "itl_ms": {...}, "tpot_ms": {...}, "e2e_ms": {...}, "server": {...}, ...}],
     "aggregates": [{"concurrency": 64, "repetitions": 3, "valid_repetitions": 3,
                     "figures": {"output_tokens_per_s": {"mean": x, "ci95": [lo, hi], "n": 3},
                                 "ttft_ms.p50": {...}, ...}}],
     "superseded_points": [...]}

What a point's figures are is stated where they are computed (``bench.figures``, from the
load generator's request records); the server's side of a point in ``results.evidence``;
aggregates and the precision target in ``results.aggregate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from servebook import redact
from servebook.results import stats

SCHEMA = "servebook.bench/1"
RESULTS_NAME = "results.json"


# --- provenance ----------------------------------------------------------------------------


class Accelerator(BaseModel):
    kind: str  # "gpu" | "cpu"
    model: str
    count: int  # GPUs on the host, or CPU cores available to it
    cores: int | None = None


class RoleProvenance(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    command: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    url: str | None = None
    engine_version: str | None = None
    image: str | None = None


class ModelInfo(BaseModel):
    name: str
    config_hash: str | None = None
    path: str | None = None


#: How the load reached the server (``LoadOrigin.route``).
ROUTES = {
    "direct": "straight to the server's address (no relay servebook opened)",
    "port-forward": "through port-forwards servebook opened from the bench machine "
    "(API server and kubelet relay every byte; latencies include them)",
    "cluster-service": "from agents in the cluster to the entry Service's cluster address",
}


class LoadOrigin(BaseModel):
    """Where a run's load came from and how it reached the server (``route``, one of
    :data:`ROUTES`): ``compare`` refuses runs measured through different routes."""

    model_config = ConfigDict(extra="allow")
    generator: str = "servebook"
    agents: int = 1  # load processes (1: the bench command's own)
    where: str  # "this machine", "2 agents on this machine", "3 agents in namespace X ..."
    host: str | None = None  # the bench machine
    route: str
    route_detail: str | None = None
    target_url: str | None = None  # the address the load was sent to
    # In the cluster (route cluster-service): the Job's namespace, its name, its Pods' nodes.
    namespace: str | None = None
    job: str | None = None
    nodes: list[str] = Field(default_factory=list)


class Provenance(BaseModel):
    model_config = ConfigDict(extra="allow")
    servebook_version: str
    # The git commit of servebook's source tree, ``+dirty`` with uncommitted changes; None
    # for an install from a wheel (``results.provenance.source_commit``).
    servebook_commit: str | None = None
    engine: str | None = None
    engine_version: str | None = None  # from the server's /version
    model: ModelInfo
    target: dict[str, Any] = Field(default_factory=dict)  # url, api, recipe/deployment
    roles: list[RoleProvenance] = Field(default_factory=list)
    packages: dict[str, str] = Field(default_factory=dict)
    accelerator: Accelerator | None = None
    accelerators_used: int | None = None
    host: dict[str, Any] = Field(default_factory=dict)
    protocol: dict[str, Any] = Field(default_factory=dict)
    workload: dict[str, Any] = Field(default_factory=dict)
    seed: int
    started_at: str
    ended_at: str | None = None
    load: LoadOrigin | None = None  # absent in files written before it was recorded


# --- figures -------------------------------------------------------------------------------


class Latency(BaseModel):
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    mean: float | None = None
    n: int = 0

    @classmethod
    def of(cls, values_ms: Sequence[float] | np.ndarray) -> Latency:
        s = stats.summarize(values_ms)
        return cls(p50=s.p50, p90=s.p90, p99=s.p99, mean=s.mean, n=s.n)


class Goodput(BaseModel):
    slo_ms: dict[str, float]
    requests_per_s: float | None
    fraction: float | None  # of the window's successful requests


class WindowInfo(BaseModel):
    warmup_s: float | None  # from load start to window start
    duration_s: float | None
    requests_scheduled: int  # scheduled inside the window (ok, errors, unfinished)
    requests_unfinished: int  # scheduled inside, still running at the window's end
    # The window's edges on CLOCK_MONOTONIC (system-wide on Linux), so a tool on the same
    # host can relate them to its own measurements (benchmarks/client_capacity.py).
    start_monotonic_ns: int | None = None
    end_monotonic_ns: int | None = None
    # The server's counters cover the span from the opening scrape to the closing one, not
    # the window itself: each scrape returned this long after its edge, so requests that
    # finished that close after an edge may be on the other side of it server-side.
    scrape_open_lag_ms: float | None = None
    scrape_close_lag_ms: float | None = None


class ClientEvidence(BaseModel):
    """What the client did in the window, for SB404/SB405 (``protocol.judge``)."""

    workers: int
    cpu_fraction: float  # busiest worker's share of one core over the window
    # Closed loop: slot free -> bytes out.  Open loop: scheduled -> bytes out (lateness).
    send_lag_p99_ms: float | None
    loop_lag_p99_ms: float | None  # reported; not a verdict on its own
    # Time-weighted mean of requests in flight (bytes out -> stream end) over the window,
    # and what the level asked for (closed loop: its concurrency).
    achieved_concurrency: float | None = None
    target_concurrency: int | None = None
    # Open loop: requests sent per second in the window (the offered rate, as achieved).
    offered_rate: float | None = None
    prompt_waits: int = 0  # requests that waited for their prompt to be built
    # Trace replay: actual minus intended send time over the window (SB411); None otherwise.
    schedule_lag_p50_ms: float | None = None
    schedule_lag_p99_ms: float | None = None
    prompts_ran_out: bool = False  # the prompts built before the point ran out
    # CPU seconds the prompt producer used during the load (it builds prompts ahead of
    # need in a process of its own; 0 when every prompt was built before the warm-up).
    producer_cpu_s: float = 0.0
    # The load agents that made the load (``bench/coordinator.py``), each with where it
    # ran, its clock offset to the coordinator (taken off its records), the offset's
    # drift over the point and uncertainty, how late the shared start reached it, its
    # share of the load and how many of the point's counted requests it made
    # (``figures.agents_counted``, SB414).  None: one worker in the bench command's own
    # process.
    agents: list[dict[str, Any]] | None = None


#: The figures a precision target judges: throughput, and median TPOT (the per-step figure
#: that reproduced within a few percent, field notes), one value per valid repetition.
PRECISION_FIGURES = ("output_tokens_per_s", "tpot_ms.p50")
PRECISION_TITLES = {
    "output_tokens_per_s": "tok/s",
    "tpot_ms.p50": "TPOT p50",
    "tpot_ms.mean": "TPOT mean (the engine's exact mean: its histogram leads TPOT)",
}


class PrecisionFigure(BaseModel):
    """One judged figure of a level: the interval reached over its valid repetitions."""

    mean: float | None
    ci95: tuple[float, float] | None
    n: int
    half_width_share: float | None  # half-width / mean; None without an interval


class LevelPrecision(BaseModel):
    """A level's precision verdict.  ``pending``: the level still needed repetitions when
    the file was written (an interrupted or unfinished run)."""

    target: float  # largest half-width as a share of the mean
    status: Literal["precise", "imprecise", "pending"]
    repetitions: int  # run, valid or not
    min_repetitions: int
    max_repetitions: int
    figures: dict[str, PrecisionFigure]

    def describe(self) -> str:
        """``tok/s ±3.1%, TPOT p50 ±12.0%, target ±5.0%`` (half-widths over the mean)."""
        parts = []
        for key, f in self.figures.items():
            share = "no interval" if f.half_width_share is None else f"±{f.half_width_share:.1%}"
            parts.append(f"{PRECISION_TITLES.get(key, key)} {share}")
        return ", ".join([*parts, f"target ±{self.target:.1%}"])


class Point(BaseModel):
    model_config = ConfigDict(extra="allow")
    concurrency: int | None
    rate: float | None = None
    repetition: int
    valid: bool
    invalid_reasons: list[str] = Field(default_factory=list)
    requests_ok: int
    errors: int
    error_samples: list[str] = Field(default_factory=list)
    output_tokens_per_s: float | None
    output_tokens_per_s_per_accelerator: float | None = None
    requests_per_s: float | None
    ttft_ms: Latency
    itl_ms: Latency
    tpot_ms: Latency
    e2e_ms: Latency
    # A workload of conversations: TTFT of each turn ("1" the first), whose later turns
    # find the conversation so far in the prefix cache.  None: not conversations.
    ttft_ms_by_turn: dict[str, Latency] | None = None
    output_tokens_mismatch: int = 0  # successful requests whose count differs from asked
    # Successful requests whose server-counted prompt length (usage.prompt_tokens) differs
    # from the workload's: the tokenizer given is not the deployment's.
    prompt_tokens_mismatch: int = 0
    # Successful requests with a stated prompt length the server gave no count for: their
    # length was not checked (SB409 cannot pass on them).
    prompt_tokens_unchecked: int = 0
    goodput: Goodput | None = None
    window: WindowInfo
    client: ClientEvidence
    server: dict[str, Any] = Field(default_factory=dict)
    # Seconds spent building prompts before the point's warm-up (the rest are built by a
    # producer process during the load, never in the sending loop).
    prompt_build_s: float | None = None
    # role -> {"ttft": HistogramWindow.to_dict(1000), "itl": ..., ...}: the engine's own
    # latency histograms over the window, in ms (``server_latency``).
    server_latency: dict[str, dict[str, Any]] | None = None
    # The client's per-token latency against the server's (``LatencyDiagnosis.to_dict``).
    latency_diagnosis: dict[str, Any] | None = None
    # Where a diagnosis says the client's per-token timing is wrong (burst_delivery...),
    # ``tpot_ms``/``itl_ms`` are the engine's histograms and this names their source
    # (``{"tpot_ms": "server:decode"}``); the client's own figures are kept in
    # ``client_latency``.  Empty: every figure is the client's (``results.evidence``).
    latency_source: dict[str, str] = Field(default_factory=dict)
    client_latency: dict[str, Latency] = Field(default_factory=dict)
    # The level's precision verdict (a precision target only; the same on every point of
    # the level): ``imprecise`` once the level stopped at the cap above the target.
    imprecise: bool = False
    precision: LevelPrecision | None = None
    started_at: str | None = None
    ended_at: str | None = None

    @property
    def key(self) -> PointKey:
        return point_key(self.concurrency, self.rate, self.repetition)


PointKey = tuple[str, float, int]


def point_key(concurrency: int | None, rate: float | None, repetition: int) -> PointKey:
    if concurrency is not None:
        return ("concurrency", float(concurrency), repetition)
    assert rate is not None
    return ("rate", float(rate), repetition)


# --- aggregates ----------------------------------------------------------------------------


class Figure(BaseModel):
    mean: float | None
    ci95: tuple[float, float] | None
    n: int


class Aggregate(BaseModel):
    concurrency: int | None
    rate: float | None = None
    repetitions: int
    valid_repetitions: int
    figures: dict[str, Figure]
    precision: LevelPrecision | None = None  # with a precision target only


# --- the document --------------------------------------------------------------------------


class Results(BaseModel):
    model_config = ConfigDict(extra="allow")
    schema_: str = Field(default=SCHEMA, alias="schema")
    provenance: Provenance
    points: list[Point] = Field(default_factory=list)
    aggregates: list[Aggregate] = Field(default_factory=list)
    superseded_points: list[Point] = Field(default_factory=list)

    def redacted(self) -> Results:
        """This document with no secret in it (``servebook.redact``): the provenance's
        command lines, environments and URLs (noted in ``provenance.redacted``), and every
        text a server wrote into it (``error_samples``, ``invalid_reasons`` quoting them: a
        gateway's "invalid key sk-..." or a proxy echoing the Authorization header)."""
        doc = self.model_dump(by_alias=True)
        doc["provenance"] = redact.provenance(doc["provenance"])
        return Results.model_validate(redact.scrub(doc)[0])

    def to_json(self) -> str:
        """The document as it is written: redacted (``redacted``), whoever writes it."""
        return self.redacted().model_dump_json(by_alias=True, indent=2)
