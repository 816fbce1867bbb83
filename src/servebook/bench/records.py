"""What the load generator records: one ``RequestRecord`` per request, a worker's
``WorkerStats``, and a load's ``LoadResult``.  Times are monotonic nanoseconds.

**Tokens are counted from the server, not from chunks.**  A chunk carries ``k >= 1``
tokens when the server batches (speculative decoding, stream intervals).  The count per
request is ``usage.completion_tokens`` from the final usage chunk (requested with
``stream_options.include_usage``); without usage it falls back to ``len(token_ids)`` per
chunk when the server sends ids, else one per non-empty chunk.

**ITL rule.**  A request with ``n`` output tokens has exactly ``n - 1`` inter-token gaps:
the gaps between consecutive token-bearing chunks, plus one zero gap for every token
beyond the first in a chunk (``k`` tokens arriving in one chunk are one gap and ``k - 1``
zeros: that is what a reader of the stream sees).  So the mean ITL equals TPOT, the sum of
a request's ITLs is its decode time, and the zeros do not depend on *which* chunk carried
the extra tokens, so the rule needs only the usage count and the chunk timestamps.
``vllm bench serve`` instead appends one ITL per chunk (``len(itl) == chunks - 1``): with
multi-token chunks its ITL percentiles describe chunks, not tokens, and its mean ITL
exceeds its TPOT.  TPOT here is ``(e2e - ttft) / (n - 1)`` as in vLLM's bench.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from servebook.bench.control import LoadSpec
from servebook.bench.endpoint import Endpoint


@dataclass(eq=False)
class RequestRecord:
    """What happened to one request.  Times are monotonic nanoseconds."""

    index: int
    worker: int
    # Open loop: the arrival time the seeded schedule gave it.  Closed loop: when its slot
    # came free.
    scheduled_ns: int
    # When its bytes were written to the socket (``http1.Connection.start``); the
    # time just before the send began until then.
    sent_ns: int = 0
    # Where latency is measured from: "scheduled" (open loop: a late client is charged)
    # or "sent" (closed loop: there is no schedule; the client's own delay before the
    # bytes went out is send lag, reported, not server latency).
    latency_from: Literal["scheduled", "sent"] = "scheduled"
    end_ns: int = 0  # the stream closed (or the error happened); 0 while in flight
    chunk_ns: array = field(default_factory=lambda: array("q"))
    # Tokens per token-bearing chunk; None while every chunk carried exactly one.
    chunk_tokens: array | None = None
    usage_output_tokens: int | None = None
    prompt_tokens: int | None = None
    expected_output_tokens: int | None = None
    expected_prompt_tokens: int | None = None  # the workload's server-side count
    status: int | None = None
    error: str | None = None
    # Stopped by the load's end (the window closed); neither a success nor an error.
    cancelled: bool = False
    done: bool = False  # data: [DONE] seen
    # The model the server's chunks named (their ``model`` field), when they named one.
    answered_model: str | None = None
    # A conversation's turn (``bench/sessions.py``), counted from 0; None: not one.
    turn: int | None = None
    # The --turn-delay the conversation waited before this turn: its slot was the
    # conversation's meanwhile (``figures.achieved_concurrency``).
    turn_delay_ns: int = 0
    # A conversation's turn keeps its stream's bytes until its reply is read from them.
    body: list[bytes] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.cancelled and self.end_ns > 0

    @property
    def output_tokens(self) -> int:
        if self.usage_output_tokens is not None:
            return self.usage_output_tokens
        if self.chunk_tokens is not None:
            return int(sum(self.chunk_tokens))
        return len(self.chunk_ns)

    @property
    def start_ns(self) -> int:
        """The request's start: the origin of its latencies, and what places it inside or
        outside a measurement window."""
        if self.latency_from == "sent" and self.sent_ns:
            return self.sent_ns
        return self.scheduled_ns

    @property
    def ttft_ns(self) -> int | None:
        return self.chunk_ns[0] - self.start_ns if self.chunk_ns else None

    @property
    def e2e_ns(self) -> int | None:
        """Start to the last token-bearing chunk (vLLM bench's ``latency``)."""
        return self.chunk_ns[-1] - self.start_ns if self.chunk_ns else None

    @property
    def tpot_ns(self) -> float | None:
        n = self.output_tokens
        if n < 2 or not self.chunk_ns:
            return None
        return (self.chunk_ns[-1] - self.chunk_ns[0]) / (n - 1)

    @property
    def send_lag_ns(self) -> int:
        return self.sent_ns - self.scheduled_ns if self.sent_ns else 0

    def itl_ns(self) -> np.ndarray:
        """``output_tokens - 1`` gaps by the module's ITL rule (int64 ns)."""
        ts = np.frombuffer(self.chunk_ns, dtype=np.int64) if self.chunk_ns else np.empty(0, "q")
        gaps = np.diff(ts)
        extra = self.output_tokens - len(ts)
        if extra > 0:
            gaps = np.concatenate([gaps, np.zeros(extra, dtype=np.int64)])
        return gaps

    def token_times_ns(self) -> np.ndarray:
        """Arrival time of every output token (a chunk's tokens share its time; tokens the
        usage counted beyond the chunks' are placed at the last chunk)."""
        ts = np.frombuffer(self.chunk_ns, dtype=np.int64) if self.chunk_ns else np.empty(0, "q")
        if self.chunk_tokens is not None:
            ts = np.repeat(ts, np.frombuffer(self.chunk_tokens, dtype=np.int32))
        extra = self.output_tokens - len(ts)
        if extra > 0 and len(ts):
            ts = np.concatenate([ts, np.full(extra, ts[-1], dtype=np.int64)])
        return ts


@dataclass
class WorkerStats:
    worker: int
    pid: int
    cpu_ns: int  # process CPU time (user + system) during the load
    wall_ns: int
    loop_lag_ns: array  # oversleep of a 10 ms timer, sampled through the load...
    tick_ns: array = field(default_factory=lambda: array("q"))  # ...at these times,
    tick_cpu_ns: array = field(default_factory=lambda: array("q"))  # ...with this CPU used
    cpus: tuple[int, ...] | None = None
    prompt_waits: int = 0  # requests that waited for their prompt from the producer
    prompts_ran_out: bool = False  # a slot ended because no prompt was left
    producer_cpu_s: float = 0.0  # CPU time of this worker's prompt producer (0: none ran)

    @property
    def cpu_fraction(self) -> float:
        """Share of one core this worker's process used during the load."""
        return self.cpu_ns / self.wall_ns if self.wall_ns > 0 else 0.0

    def cpu_fraction_between(self, t0: int, t1: int) -> float | None:
        """Share of a core used between two instants (from the 10 ms ticks)."""
        t = np.frombuffer(self.tick_ns, dtype=np.int64)
        if t.size < 2 or t1 <= t0 or t0 > t[-1] or t1 < t[0]:
            return None
        cpu = np.frombuffer(self.tick_cpu_ns, dtype=np.int64)
        a, b = max(t0, int(t[0])), min(t1, int(t[-1]))
        if b <= a:
            return None
        return float(np.interp(b, t, cpu) - np.interp(a, t, cpu)) / (b - a)

    def loop_lag_between(self, t0: int, t1: int) -> np.ndarray:
        lag = np.frombuffer(self.loop_lag_ns, dtype=np.int64)
        t = np.frombuffer(self.tick_ns, dtype=np.int64)
        if t.size != lag.size:
            return lag
        return lag[(t >= t0) & (t <= t1)]


@dataclass(frozen=True)
class AgentInfo:
    """One load agent of a load (``bench/coordinator.py``): where it ran and its clock.
    Offsets are the agent's clock minus the coordinator's, measured before the load and
    after it; ``correction_ns`` (their mean) was taken off its records."""

    index: int
    pid: int
    host: str
    where: str
    offset_ns: int
    offset_after_ns: int
    uncertainty_ns: int  # half the best round trip of the two measurements
    correction_ns: int
    start_late_ns: int  # how long after the shared instant the start reached it

    def to_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "pid": self.pid,
            "host": self.host,
            "where": self.where,
            "clock_offset_us": round(self.correction_ns / 1e3, 1),
            "clock_drift_us": round((self.offset_after_ns - self.offset_ns) / 1e3, 1),
            "clock_uncertainty_us": round(self.uncertainty_ns / 1e3, 1),
            "start_late_ms": round(self.start_late_ns / 1e6, 3),
        }


@dataclass
class LoadResult:
    spec: LoadSpec
    endpoint: Endpoint
    # Not in the repr: asyncio formats a finished task's result when it restores the
    # SIGINT handler, and the repr of every record took seconds after a long load.
    records: list[RequestRecord] = field(repr=False)
    workers: list[WorkerStats] = field(repr=False)
    start_ns: int
    end_ns: int
    window_start_ns: int | None
    window_end_ns: int | None  # when the load was stopped (None: it ran out)
    # The load agents that made it (empty: one worker in the caller's process).
    agents: list[AgentInfo] = field(default_factory=list, repr=False)

    @property
    def client_cpu_fraction(self) -> float:
        """Busiest worker's share of a core: one saturated worker saturates the client."""
        return max((w.cpu_fraction for w in self.workers), default=0.0)

    def loop_lag_ns(self, t0: int | None = None, t1: int | None = None) -> np.ndarray:
        """Event-loop lag samples of every worker (within ``[t0, t1]`` when given)."""
        parts = [
            w.loop_lag_between(t0, t1)
            if t0 is not None and t1 is not None
            else np.frombuffer(w.loop_lag_ns, dtype=np.int64)
            for w in self.workers
        ]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    @property
    def prompt_waits(self) -> int:
        return sum(w.prompt_waits for w in self.workers)

    @property
    def prompts_ran_out(self) -> bool:
        return any(w.prompts_ran_out for w in self.workers)

    @property
    def producer_cpu_s(self) -> float:
        """CPU time the prompt producers used (building prompts during the load)."""
        return sum(w.producer_cpu_s for w in self.workers)

    def cpu_fraction_between(self, t0: int, t1: int) -> float:
        """Busiest worker's share of a core within ``[t0, t1]`` (whole load if unknown)."""
        fr = [w.cpu_fraction_between(t0, t1) for w in self.workers]
        return max(
            (f if f is not None else w.cpu_fraction for f, w in zip(fr, self.workers, strict=True)),
            default=0.0,
        )
