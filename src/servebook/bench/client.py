"""The load generator: sends streaming OpenAI requests and times every chunk.

This module sends and times; it does not decide when a measurement window opens or closes
(``protocol.py`` does, through a ``Controller``) and it does not compute figures
(``bench/figures.py`` and ``results/`` do).

**Clock.**  Every timestamp is ``time.monotonic_ns()`` (CLOCK_MONOTONIC on Linux, the same
clock ``perf_counter_ns`` reads there), which is system-wide, so timestamps from worker
processes and from a reference server on the same host are comparable.  Body bytes are
stamped inside the connection's ``data_received``, as the event loop reads them
(``http1.py``: servebook's own HTTP/1.1 for the load, and why); every SSE event of one
read shares its timestamp (they arrived together).

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

**Latency origin.**  Open loop (``rate``): arrivals follow a seeded Poisson process and
TTFT and E2E are measured from a request's *scheduled* time, so a request that went out
late is charged its lateness (field notes: a late client must not hide server latency).
Closed loop: there is no schedule, and latency is measured from when the request's bytes
were written to the socket (``http1.Connection.start``); the client's own delay
between a slot coming free and its request going out is *send lag*, recorded per request
and reported, instead of being added to the server's latency; what it costs the load shows
in the achieved concurrency (time-weighted requests in flight), which SB404 judges.  The
event loop's own lag is sampled too, and reported.

**Errors are records.**  A non-200 status, an ``{"error": ...}`` event, a stream that
closes before ``data: [DONE]``, a stream with no tokens, a timeout or a connection error:
each gives a ``RequestRecord`` with ``error`` set; nothing is dropped.

**Prompts are never built here.**  A source that builds its prompts
(``workload.BuildsPrompts``) is read, never asked to build, while the load runs: a prompt
is either built before the load (``pregenerate``) or built ahead of need by a *producer*
process of this worker's own, which writes batches into a pipe that the event loop reads
without blocking (``_Feed``).  A slot whose prompt is not there yet waits for it (counted,
and it lowers the achieved concurrency); a source that cannot build during the load (a
server's ``/tokenize``) ends a slot when its prompts run out (``prompts_ran_out``).

**Worker processes.**  One process runs one event loop (uvloop when importable).  With
``workers = W > 1`` the load is split: closed loop gives each worker ``concurrency / W``
slots (the remainder to the first workers); open loop gives each worker an independent
seeded Poisson stream of rate ``rate / W`` (the superposition of independent Poisson
processes is a Poisson process of the summed rate); request ``i`` goes to worker ``i mod
W`` so prompts stay unique and deterministic.  Workers share a small array of counters
and flags (``multiprocessing.RawArray``) through which the parent's ``Controller`` opens
the window and stops the load; each worker sends its records back when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import multiprocessing as mp
import os
import pickle
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast
from urllib.parse import urlsplit

import numpy as np

from servebook import auth
from servebook.bench import http1
from servebook.bench.workload import Api, BuildsPrompts, Prompt, PromptSource

try:  # orjson parses a stream chunk several times faster; json is the fallback.
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
    _dumps: Callable[[Any], bytes] = orjson.dumps
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj).encode()


now_ns = time.monotonic_ns


# --- SSE -----------------------------------------------------------------------------------


class SSEParser:
    """Incremental ``text/event-stream`` parser (WHATWG HTML, "Event stream
    interpretation"): bytes in, ``(event_type, data)`` pairs out.

    Lines end in LF, CRLF or CR, and a line may be split anywhere across reads, including
    between the CR and LF of one CRLF.  ``:`` lines are comments (keep-alive pings).  An
    event is dispatched at a blank line; its data is its ``data:`` lines joined by LF; an
    event with no ``data:`` line is not dispatched.  ``id`` and ``retry`` are ignored (a
    benchmark never reconnects).  ``data: [DONE]`` is an ordinary event here: the caller
    gives it its OpenAI meaning."""

    __slots__ = ("_buf", "_data", "_event", "_skip_lf")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._event = ""
        self._skip_lf = False

    @property
    def idle(self) -> bool:
        """Nothing pending: the next byte starts a line of a new event."""
        return not self._buf and not self._data and not self._skip_lf and not self._event

    def feed(self, chunk: bytes) -> list[tuple[str, bytes]]:
        # Fast path, the shape of nearly every read from an OpenAI server: exactly one
        # complete "data: ..." event with LF line ends and nothing pending.
        if (
            chunk[:6] == b"data: "
            and chunk[-2:] == b"\n\n"
            and self.idle
            and chunk.count(b"\n") == 2
            and b"\r" not in chunk
        ):
            return [("message", chunk[6:-2])]
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            # A CR at the very end ends a line now; an LF starting the next read is the
            # second half of a CRLF, not a blank line.
            if buf[-1:] == b"\r":
                self._skip_lf = True
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        out: list[tuple[str, bytes]] = []
        data = self._data
        for line in lines:
            if line[:6] == b"data: ":
                data.append(line[6:])
            elif not line:
                if data:
                    out.append((self._event or "message", b"\n".join(data)))
                    data.clear()
                self._event = ""
            elif line[:1] == b":":
                continue
            else:
                name, _, value = line.partition(b":")
                if value[:1] == b" ":
                    value = value[1:]
                if name == b"data":
                    data.append(value)
                elif name == b"event":
                    self._event = value.decode("utf-8", "replace")
        return out


# --- one request ---------------------------------------------------------------------------


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
    sent_traced: bool = False  # sent_ns came from the socket write, not the fallback

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


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        msg = err.get("message") or json.dumps(err)[:300]
        code = err.get("code") or err.get("type")
        return f"server error event: {msg}" + (f" ({code})" if code else "")
    return f"server error event: {str(err)[:300]}"


def _choice_tokens(choice: Any, chat: bool) -> int:
    """Tokens a streamed choice carries (0 for role-only or finish-only chunks)."""
    if not isinstance(choice, dict):
        return 0
    ids = choice.get("token_ids")
    if ids:
        return len(ids)
    if chat:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            return 1
        return 1 if delta.get("tool_calls") else 0
    return 1 if choice.get("text") else 0


def apply_events(
    rec: RequestRecord, t: int, events: Sequence[tuple[str, bytes]], chat: bool
) -> None:
    """Fold SSE events that arrived at ``t`` into ``rec``."""
    for name, data in events:
        if name == "error":
            rec.error = rec.error or _error_text(data.decode("utf-8", "replace"))
        else:
            apply_data(rec, t, data, chat)


def apply_data(rec: RequestRecord, t: int, data: bytes, chat: bool) -> None:
    """Fold one ``message`` event's data (a JSON chunk or ``[DONE]``) into ``rec``.  This is
    the per-token hot path: keep it flat."""
    if data == b"[DONE]":
        rec.done = True
        return
    try:
        obj = _loads(data)
    except ValueError:
        rec.error = rec.error or f"malformed stream event: {data[:200]!r}"
        return
    if type(obj) is not dict:
        rec.error = rec.error or f"unexpected stream event: {data[:200]!r}"
        return
    err = obj.get("error")
    if err is not None:
        rec.error = rec.error or _error_text(err)
        return
    choices = obj.get("choices")
    if choices:
        c0 = choices[0]
        if not chat and type(c0) is dict:  # completions, inlined
            ids = c0.get("token_ids")
            k = len(ids) if ids else 1 if c0.get("text") else 0
        else:
            k = _choice_tokens(c0, chat)
        if k:
            rec.chunk_ns.append(t)
            if k != 1 or rec.chunk_tokens is not None:
                if rec.chunk_tokens is None:
                    rec.chunk_tokens = array("i", [1] * (len(rec.chunk_ns) - 1))
                rec.chunk_tokens.append(k)
    usage = obj.get("usage")
    if usage:
        ct = usage.get("completion_tokens")
        if isinstance(ct, int):
            rec.usage_output_tokens = ct
        pt = usage.get("prompt_tokens")
        if isinstance(pt, int):
            rec.prompt_tokens = pt


def finish_record(rec: RequestRecord, t: int) -> None:
    """Close a stream that ended normally: a stream must end with [DONE] and carry tokens."""
    rec.end_ns = t
    if rec.error is None:
        if not rec.done:
            rec.error = "stream closed before data: [DONE]"
        elif rec.output_tokens == 0:
            rec.error = "stream carried no output tokens"


# --- what to send --------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server and how to ask it."""

    base_url: str  # e.g. http://127.0.0.1:8000 (no /v1)
    model: str
    api: Api = "completions"
    ignore_eos: bool = True
    temperature: float = 0.0
    api_key: str | None = None
    extra_body: tuple[tuple[str, Any], ...] = ()
    request_timeout_s: float = 600.0
    request_id_prefix: str = "sb-"

    @property
    def url(self) -> str:
        path = "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        return self.base_url.rstrip("/") + path


def request_body(endpoint: Endpoint, prompt: str | list[int], max_tokens: int) -> dict[str, Any]:
    """The request for one prompt: text, or (completions only) a list of token ids."""
    body: dict[str, Any] = {"model": endpoint.model}
    if endpoint.api == "chat":
        if not isinstance(prompt, str):
            raise ValueError("the chat API takes text, not token ids")
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(
        {
            "max_tokens": max_tokens,
            "temperature": endpoint.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    if endpoint.ignore_eos:
        body["ignore_eos"] = True
    body.update(dict(endpoint.extra_body))
    return body


@dataclass(frozen=True)
class LoadSpec:
    """How much load: exactly one of ``concurrency`` (closed loop) and ``rate`` (open loop,
    requests/s, Poisson).  Without ``num_requests`` the load runs until the controller
    stops it or ``deadline_s`` passes."""

    concurrency: int | None = None
    rate: float | None = None
    max_concurrency: int | None = None  # open loop: cap on requests in flight
    num_requests: int | None = None
    seed: int = 0
    workers: int = 1
    cpus: tuple[int, ...] | None = None  # pin worker w to cpus[w % len(cpus)]
    deadline_s: float | None = None
    index_offset: int = 0  # first request index (a repetition's prompts stay distinct)

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency and rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.concurrency is not None and self.workers > self.concurrency:
            raise ValueError(f"{self.workers} workers for concurrency {self.concurrency}")

    @property
    def mode(self) -> Literal["concurrency", "rate"]:
        return "concurrency" if self.concurrency is not None else "rate"

    def share(self, worker: int) -> tuple[int | None, float | None, int | None]:
        """(slots, rate, max in flight) of one worker."""
        w = self.workers
        if self.concurrency is not None:
            return self.concurrency // w + (1 if worker < self.concurrency % w else 0), None, None
        assert self.rate is not None
        cap = None
        if self.max_concurrency is not None:
            m = self.max_concurrency
            cap = max(1, m // w + (1 if worker < m % w else 0))
        return None, self.rate / w, cap


STREAMS_PER_WORKER = 256


def default_workers(concurrency: int | None, cores: int | None = None) -> int:
    """Worker processes for a level when the user did not say: one per 256 concurrent
    streams (where benchmarks/client_capacity.py shows one core nearing saturation against
    a fast server), at most the cores this process may use, and never more than the
    concurrency.  SB404/SB405 still flag a saturated client; ``--workers`` overrides."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if concurrency is None:
        return 1
    want = -(-concurrency // STREAMS_PER_WORKER)
    return max(1, min(want, cores, concurrency))


# --- shared control between the controller and the workers -------------------------------

# Global slots, then per-worker counter slots.
_G_START, _G_WINDOW, _G_STOP, _G_N = 0, 1, 2, 3
_W_SENT, _W_OK, _W_ERR, _W_TOKENS, _W_WIN_OK, _W_WIN_ERR = range(6)
# _W_AUTH: requests the server refused for want of the API key (401/403).
_W_READY, _W_DONE, _W_AUTH, _W_N = range(6, 10)


class Control:
    """Counters and flags shared by the controller and the workers.  Each worker writes
    only its own slots; the controller writes the global ones."""

    def __init__(self, workers: int, arr: Any = None) -> None:
        self.workers = workers
        self.arr = (
            arr if arr is not None else mp.get_context("spawn").RawArray("q", _G_N + _W_N * workers)
        )

    def _w(self, worker: int, slot: int) -> int:
        return _G_N + _W_N * worker + slot

    def add(self, worker: int, slot: int, n: int = 1) -> None:
        self.arr[self._w(worker, slot)] += n

    def get(self, worker: int, slot: int) -> int:
        return int(self.arr[self._w(worker, slot)])

    def total(self, slot: int) -> int:
        return sum(int(self.arr[self._w(w, slot)]) for w in range(self.workers))

    @property
    def start_ns(self) -> int:
        return int(self.arr[_G_START])

    @property
    def window_start_ns(self) -> int:
        return int(self.arr[_G_WINDOW])

    @property
    def stopped(self) -> bool:
        return bool(self.arr[_G_STOP])

    def open_window(self, t: int) -> None:
        if not self.arr[_G_WINDOW]:
            self.arr[_G_WINDOW] = t

    def stop(self, t: int) -> None:
        if not self.arr[_G_STOP]:
            self.arr[_G_STOP] = t

    @property
    def stop_ns(self) -> int:
        return int(self.arr[_G_STOP])


@dataclass(frozen=True)
class Progress:
    """What the controller sees at each poll (totals over workers)."""

    now_ns: int
    start_ns: int
    window_start_ns: int | None
    sent: int
    completed_ok: int
    errors: int
    output_tokens: int
    window_ok: int
    window_errors: int
    workers_done: int

    @property
    def elapsed_s(self) -> float:
        return (self.now_ns - self.start_ns) / 1e9

    @property
    def window_elapsed_s(self) -> float:
        return 0.0 if self.window_start_ns is None else (self.now_ns - self.window_start_ns) / 1e9


@dataclass(frozen=True)
class Decision:
    open_window: bool = False
    stop: bool = False


class Controller(Protocol):
    """Decides, from progress, when the window opens and when the load stops (the protocol
    module provides the benchmark's; ``None`` means neither: the load runs to
    ``num_requests`` or its deadline)."""

    def __call__(self, progress: Progress, /) -> Decision: ...


def _progress(control: Control, t: int) -> Progress:
    ws = control.window_start_ns
    return Progress(
        now_ns=t,
        start_ns=control.start_ns,
        window_start_ns=ws or None,
        sent=control.total(_W_SENT),
        completed_ok=control.total(_W_OK),
        errors=control.total(_W_ERR),
        output_tokens=control.total(_W_TOKENS),
        window_ok=control.total(_W_WIN_OK),
        window_errors=control.total(_W_WIN_ERR),
        workers_done=control.total(_W_DONE),
    )


WindowHook = Callable[[Literal["open", "close"]], None]


def _decide(
    control: Control,
    controller: Controller | None,
    spec: LoadSpec,
    on_progress: Callable[[Progress], None] | None,
) -> tuple[bool, int | None]:
    """One poll: (the window opened now, the stop time if the load should stop now).  The
    stop is not applied here: the caller first runs the window-close hook (the "after"
    counters must be read before in-flight requests are cancelled)."""
    t = now_ns()
    p = _progress(control, t)
    opened, stop = False, None
    if controller is not None and not control.stopped:
        d = controller(p)
        if d.open_window and not control.window_start_ns:
            control.open_window(t)
            opened = True
        if d.stop:
            stop = t
    if spec.deadline_s is not None and t - control.start_ns > spec.deadline_s * 1e9:
        stop = t
    if control.total(_W_AUTH):
        stop = t  # the server refuses our key: every further request would be refused too
    if on_progress is not None:
        on_progress(p)
    return opened, stop if not control.stopped else None


# --- one worker ----------------------------------------------------------------------------


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
    prompt_wait_ns: int = 0
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


_LAG_TICK_NS = 10_000_000
#: Requests a closed loop starts per event-loop turn at most (``_Worker._admitter``).
ADMIT_PER_TURN = 4


# --- reading the body --------------------------------------------------------------------------
#
# The connection (``http1.Connection``) stamps each body chunk inside its ``data_received``
# and queues it; once the loop turn's reads are done the queue comes here (``_fold``), to
# each request's SSE parser.  The request's coroutine only waits for the response's end.


class _Sink:
    """Where one response's body goes.  ``busy``: its SSE parser holds part of an event
    (then every chunk goes through the parser)."""

    __slots__ = ("busy", "chat", "parser", "rec")

    def __init__(self, rec: RequestRecord, chat: bool) -> None:
        self.rec, self.parser, self.chat, self.busy = rec, SSEParser(), chat, False


def _fold(chunks: list[tuple[_Sink, int, bytes]]) -> None:
    """Parse the chunks the connections read in one loop turn (``http1.Pool.on_chunks``).
    This is the per-token hot path: keep it flat."""
    for sink, t, data in chunks:
        try:
            # One whole event per chunk, the usual case ("data: ...\n\n", no other line
            # end): skip the general parser.
            if (
                not sink.busy
                and data[:6] == b"data: "
                and data.find(b"\n") == len(data) - 2
                and data[-1] == 10
                and b"\r" not in data
            ):
                apply_data(sink.rec, t, data[6:-2], sink.chat)
            else:
                p = sink.parser
                events = p.feed(data)
                sink.busy = not p.idle
                if events:
                    apply_events(sink.rec, t, events, sink.chat)
        except Exception as e:  # a bad chunk fails its request, never the load
            sink.rec.error = sink.rec.error or f"client failed to read the stream: {e!r}"[:500]


# --- prompts, ready before they are needed ----------------------------------------------------

#: Prompts per batch a producer writes; and how many a worker keeps ready before it stops
#: reading the pipe (the producer then blocks on the full pipe: memory stays bounded).
PRODUCER_BATCH = 64
READY_HIGH = 1024
#: The producer counts one prompt in this many (``workload.RandomPrompts.build_many``):
#: one per batch.  The word table prompts are sampled from was checked whole when it was
#: made; counting a 1024-token text costs ~0.6 ms, twenty times the sampling, and one
#: count in 16 made the producer's CPU per prompt 81 us instead of 43 us.
PRODUCER_CHECK_EVERY = 64


def _produce(
    source: BuildsPrompts, first: int, step: int, conn: Any, avoid: tuple[int, ...] | None
) -> None:
    """Body of a producer process: build prompts ``first, first + step, ...`` in batches
    and write each batch to the pipe as a length-prefixed pickle of ``("batch", cpu_s,
    [(index, prompt)])`` (``cpu_s``: the CPU time this process has used so far, which the
    point records: the producer's work is the client's too), until the reader goes; a
    failure is written as ``("error", message)``.  It runs off
    the cores the workers are pinned to when there are others; at the same priority as the
    load it feeds (at a lower one, on a busy machine, it fell behind and requests waited
    for prompts), and it takes no more than the load consumes: it blocks on a full pipe."""
    if avoid and hasattr(os, "sched_setaffinity"):
        others = set(range(os.cpu_count() or 1)) - set(avoid)
        if others:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, others)
    fd = conn.fileno()

    def write(obj: Any) -> None:
        data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        view = memoryview(len(data).to_bytes(4, "little") + data)
        while view:
            view = view[os.write(fd, view) :]

    i = first
    try:
        while True:
            idx = [i + k * step for k in range(PRODUCER_BATCH)]
            try:
                built = source.build_many(idx, check_every=PRODUCER_CHECK_EVERY)
                batch: Any = ("batch", time.process_time(), list(zip(idx, built, strict=True)))
            except Exception as e:
                write(("error", f"{type(e).__name__}: {e}"))
                return
            write(batch)
            i += PRODUCER_BATCH * step
    except (BrokenPipeError, KeyboardInterrupt):
        return


@dataclass
class Producer:
    process: Any
    conn: Any  # the read end, for the worker

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()
        self.process.terminate()
        self.process.join(timeout=5)
        if self.process.is_alive():  # pragma: no cover - a producer that ignored SIGTERM
            self.process.kill()
            self.process.join(timeout=5)


def _first_unbuilt(prompts: PromptSource, spec: LoadSpec, worker: int) -> int | None:
    """This worker's first request index that was not built before the load; ``None`` when
    nothing is left to build (the source looks its prompts up, or every request of a
    bounded load is built)."""
    if not isinstance(prompts, BuildsPrompts):
        return None
    i = spec.index_offset + worker
    end = spec.index_offset + spec.num_requests if spec.num_requests is not None else None
    while prompts.cached(i) is not None:
        i += spec.workers
    if end is not None and i >= end:
        return None
    return i


def start_producers(prompts: PromptSource, spec: LoadSpec) -> list[Producer | None]:
    """One producer process per worker whose prompts will run out, when the source can
    build during the load (``workload.BuildsPrompts.producible``)."""
    out: list[Producer | None] = []
    for w in range(spec.workers):
        first = _first_unbuilt(prompts, spec, w)
        if first is None or not isinstance(prompts, BuildsPrompts) or not prompts.producible:
            out.append(None)
            continue
        ctx = mp.get_context("spawn")
        read_end, write_end = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_produce,
            args=(prompts.detached(), first, spec.workers, write_end, spec.cpus),
            name=f"servebook-bench-prompts-{w}",
            daemon=True,
        )
        p.start()
        write_end.close()
        out.append(Producer(p, read_end))
    return out


class _Feed:
    """One worker's prompts during the load, without building any: looked up (a dataset),
    built before the load (the source's cache), or read from the producer's pipe.  The pipe
    is read with non-blocking reads from the event loop, so a slow producer never holds
    the loop: a request whose prompt is not there yet waits for it instead."""

    def __init__(self, prompts: PromptSource, conn: Any = None) -> None:
        self.prompts = prompts
        self.builds = isinstance(prompts, BuildsPrompts)
        self.conn = conn
        self.ready: dict[int, Prompt] = {}
        self.waiters: dict[int, asyncio.Future[Prompt | None]] = {}
        self.buf = bytearray()
        self.reading = False
        self.closed = conn is None
        self.waits = 0
        self.wait_ns = 0
        self.ran_out = False
        self.error: str | None = None  # the producer failed: the load cannot go on
        self.producer_cpu_s = 0.0  # the producer's CPU time, as of its last batch
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        if self.conn is None:
            return
        self._loop = asyncio.get_running_loop()
        os.set_blocking(self.conn.fileno(), False)
        self._resume()

    def stop(self) -> None:
        if self.reading and self._loop is not None:
            self._loop.remove_reader(self.conn.fileno())
            self.reading = False
        self._close()

    def _resume(self) -> None:
        if not self.reading and not self.closed and self._loop is not None:
            self._loop.add_reader(self.conn.fileno(), self._on_readable)
            self.reading = True

    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.conn.close()
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_result(None)
        self.waiters.clear()

    def _on_readable(self) -> None:
        try:
            data = os.read(self.conn.fileno(), 1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the producer is gone
            self.stop()
            return
        buf = self.buf
        buf += data
        pos = 0
        while len(buf) - pos >= 4:
            n = int.from_bytes(buf[pos : pos + 4], "little")
            if len(buf) - pos - 4 < n:
                break
            batch = pickle.loads(buf[pos + 4 : pos + 4 + n])
            pos += 4 + n
            if batch[0] != "batch":  # ("error", message)
                self.error = str(batch[1])
                self.stop()
                return
            _, self.producer_cpu_s, items = batch
            for i, p in items:
                fut = self.waiters.pop(i, None)
                if fut is not None and not fut.done():
                    fut.set_result(p)
                else:
                    self.ready[i] = p
        if pos:
            del buf[:pos]
        if len(self.ready) >= READY_HIGH and self.reading and self._loop is not None:
            self._loop.remove_reader(self.conn.fileno())
            self.reading = False

    async def get(self, index: int) -> Prompt | None:
        """Prompt ``index``; ``None`` when none is left for it (the slot ends)."""
        prompts = self.prompts
        if not self.builds:
            return prompts.get(index)
        p = cast(BuildsPrompts, prompts).cached(index)
        if p is not None:
            return p
        p = self.ready.pop(index, None)
        if p is None:
            if self.error is not None:
                raise ClientError(f"building prompts failed: {self.error}")
            if self.closed:
                self.ran_out = True
                return None
            fut: asyncio.Future[Prompt | None] = asyncio.get_running_loop().create_future()
            self.waiters[index] = fut
            self.waits += 1
            t0 = now_ns()
            self._resume()
            p = await fut
            self.wait_ns += now_ns() - t0
            if p is None:
                if self.error is not None:
                    raise ClientError(f"building prompts failed: {self.error}")
                self.ran_out = True
                return None
        if len(self.ready) < READY_HIGH // 2:
            self._resume()
        return p


def _request_head(endpoint: Endpoint) -> tuple[bytes, bytes]:
    """The bytes every request of this endpoint starts with (request line and fixed
    headers; each request adds its length, its id and its body), and the id prefix."""
    u = urlsplit(endpoint.url)
    target = (u.path or "/") + (f"?{u.query}" if u.query else "")
    pool = http1.Pool(endpoint.url, endpoint.request_timeout_s)
    lines = [
        f"POST {target} HTTP/1.1",
        f"Host: {pool.host_header}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
    ]
    if endpoint.api_key:
        lines.append(f"Authorization: Bearer {endpoint.api_key}")
    head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
    return head, endpoint.request_id_prefix.encode("latin-1")


def _time_out(conn: http1.Connection, after_s: float) -> None:
    conn.fail(f"timed out after {after_s:g} s")


class _Worker:
    def __init__(
        self,
        worker: int,
        endpoint: Endpoint,
        spec: LoadSpec,
        prompts: PromptSource,
        control: Control,
        prompt_conn: Any = None,
    ) -> None:
        self.worker = worker
        self.endpoint = endpoint
        self.spec = spec
        self.prompts = prompts
        self.feed = _Feed(prompts, prompt_conn)
        self.control = control
        self.records: list[RequestRecord] = []
        self.lag = array("q")
        self.ticks = array("q")
        self.tick_cpu = array("q")
        self.chat = endpoint.api == "chat"
        self._next = spec.index_offset + worker
        self._end = spec.index_offset + spec.num_requests if spec.num_requests is not None else None
        self._head, self._id_prefix = _request_head(endpoint)

    def _take(self) -> int | None:
        """The next request's index; None when this worker sends no more: its share is
        sent, its prompts ran out, or the server refused the API key (the load ends with
        the key error: no request after a refusal is sent, not even until the
        controller's next poll)."""
        i = self._next
        if (
            (self._end is not None and i >= self._end)
            or self.feed.ran_out
            or self.control.get(self.worker, _W_AUTH)
        ):
            return None
        self._next += self.spec.workers
        return i

    async def _send(self, pool: http1.Pool, index: int, scheduled_ns: int) -> bool:
        """Send request ``index`` and read its stream; False when there was no prompt for
        it (the prompts built before the load ran out), so nothing was sent."""
        ep, c, w = self.endpoint, self.control, self.worker
        prompt = await self.feed.get(index)
        if prompt is None:
            return False
        rec = RequestRecord(
            index,
            w,
            scheduled_ns,
            latency_from="sent" if self.spec.concurrency is not None else "scheduled",
            expected_output_tokens=prompt.output_len,
            expected_prompt_tokens=prompt.prompt_tokens,
        )
        self.records.append(rec)
        sent: str | list[int] = prompt.token_ids if prompt.token_ids is not None else prompt.text
        body = _dumps(request_body(ep, sent, prompt.output_len))
        request = b"".join(
            (
                self._head,
                b"Content-Length: %d\r\nX-Request-Id: %s%d\r\n\r\n"
                % (len(body), self._id_prefix, index),
                body,
            )
        )
        sink = _Sink(rec, self.chat)
        c.add(w, _W_SENT)
        rec.sent_ns = now_ns()  # replaced by the send's own stamp once connected
        conn: http1.Connection | None = None
        timer: asyncio.TimerHandle | None = None
        try:
            conn = await pool.get()
            exchange = http1.Exchange(sink)
            timer = asyncio.get_running_loop().call_later(
                ep.request_timeout_s, _time_out, conn, ep.request_timeout_s
            )
            rec.sent_ns = conn.start(request, exchange)
            rec.sent_traced = True
            await exchange.done
            pool.flush()
            rec.status = exchange.status
            if exchange.status != 200:
                text = bytes(exchange.error_body).decode("utf-8", "replace")
                rec.error = f"HTTP {exchange.status}: {text.strip()[:500]}"
                rec.end_ns = now_ns()
                if auth.is_rejection(exchange.status):
                    c.add(w, _W_AUTH)
            else:
                finish_record(rec, now_ns())
        except asyncio.CancelledError:
            if conn is not None:
                conn.close()
            rec.cancelled = True
            rec.end_ns = now_ns()
            raise
        except http1.ExchangeFailed as e:
            pool.flush()
            rec.error = str(e)[:500]
            rec.end_ns = now_ns()
        finally:
            if timer is not None:
                timer.cancel()
        if rec.error is not None:
            c.add(w, _W_ERR)
        else:
            c.add(w, _W_OK)
            c.add(w, _W_TOKENS, rec.output_tokens)
        ws = c.window_start_ns
        if ws and rec.start_ns >= ws:
            c.add(w, _W_WIN_ERR if rec.error is not None else _W_WIN_OK)
        return True

    async def _closed_slot(
        self, pool: http1.Pool, admit: asyncio.Queue[asyncio.Future[None]]
    ) -> None:
        loop = asyncio.get_running_loop()
        while not self.control.stopped:
            i = self._take()
            if i is None:
                return
            scheduled = now_ns()
            turn: asyncio.Future[None] = loop.create_future()
            admit.put_nowait(turn)
            await turn
            if not await self._send(pool, i, scheduled):
                return

    async def _admitter(self, admit: asyncio.Queue[asyncio.Future[None]]) -> None:
        """Let at most ``ADMIT_PER_TURN`` requests start per event-loop turn.  When
        hundreds of streams end together (a closed loop against a server whose requests
        all take the same time), starting all their successors in one turn held the loop
        for ~75 ms at 512 streams (with aiohttp), and every token that arrived meanwhile
        was stamped that late.  Spread over turns, the loop reads sockets between starts;
        the wait is recorded as send lag.  With aiohttp a start cost ~150 us, and one per
        turn was best (benchmarks/client_capacity.py at 512 streams, ITL 20 ms: the p99
        delay from the server's token write to the client's stamp was 1.5 ms with eight
        per turn, 0.7 ms with two and 0.3 ms with one).  A start now costs a few times
        less, and one per turn capped a fast server's closed loop at one start per loop
        turn: slots waited their turn and the achieved concurrency fell below the level."""
        while True:
            turn = await admit.get()
            if not turn.done():
                turn.set_result(None)
            for _ in range(min(ADMIT_PER_TURN - 1, admit.qsize())):
                turn = admit.get_nowait()
                if not turn.done():
                    turn.set_result(None)
            await asyncio.sleep(0)

    async def _closed_loop(self, pool: http1.Pool, slots: int) -> None:
        admit: asyncio.Queue[asyncio.Future[None]] = asyncio.Queue()
        admitter = asyncio.create_task(self._admitter(admit))
        try:
            await asyncio.gather(*(self._closed_slot(pool, admit) for _ in range(slots)))
        finally:
            admitter.cancel()

    async def _open_loop(self, pool: http1.Pool, rate: float, cap: int | None) -> None:
        rng = np.random.default_rng([self.spec.seed, self.worker, 0x5EED])
        sem = asyncio.Semaphore(cap) if cap is not None else None
        tasks: set[asyncio.Task[None]] = set()
        t_next = self.control.start_ns

        async def one(i: int, t: int) -> None:
            if sem is None:
                await self._send(pool, i, t)
                return
            async with sem:
                await self._send(pool, i, t)

        try:
            while not self.control.stopped:
                i = self._take()
                if i is None:
                    break
                t_next += int(rng.exponential(1e9 / rate))
                delay = (t_next - now_ns()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
                if self.control.stopped:
                    break
                task = asyncio.create_task(one(i, t_next))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            # Stopped mid-schedule: end what is in flight here, before the session closes.
            pending = list(tasks)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def _lag_probe(self) -> None:
        tick = _LAG_TICK_NS / 1e9
        cpu = time.process_time_ns
        while True:
            t0 = now_ns()
            await asyncio.sleep(tick)
            t1 = now_ns()
            self.lag.append(t1 - t0 - _LAG_TICK_NS)
            self.ticks.append(t1)
            self.tick_cpu.append(cpu())

    async def _stop_watch(self, main: asyncio.Task[None]) -> None:
        while not self.control.stopped:
            await asyncio.sleep(0.01)
        main.cancel()

    async def run(self) -> WorkerStats:
        slots, rate, cap = self.spec.share(self.worker)
        c = self.control
        pool = http1.Pool(self.endpoint.url, self.endpoint.request_timeout_s, _fold)
        try:
            # Connections open before the load starts: otherwise every request of the
            # first wave also opens its TCP connection, and at 512 streams that burst of
            # connection set-up held the loop for ~15 ms while the first tokens arrived.
            # Failures are left for the load's own requests to report.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pool.warm(slots if slots is not None else cap or 16), 30)
            self.feed.start()
            c.add(self.worker, _W_READY)
            while not c.start_ns:
                await asyncio.sleep(0.001)
            delay = (c.start_ns - now_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            # No automatic garbage collection during the load: a collection pauses the
            # loop, and every token in flight would be stamped that much late (seen as
            # multi-ms ITL outliers at 512 streams).  A request leaves no reference
            # cycles behind (measured: 0 unreachable objects after 5000 requests with
            # the collector off), so nothing accumulates; collection resumes after.
            gc.collect()
            gc.freeze()
            gc_was_enabled = gc.isenabled()
            gc.disable()
            cpu0, wall0 = time.process_time_ns(), now_ns()
            lag = asyncio.create_task(self._lag_probe())
            if slots is not None:
                body = self._closed_loop(pool, slots)
            else:
                assert rate is not None
                body = self._open_loop(pool, rate, cap)
            main = asyncio.create_task(body)
            watch = asyncio.create_task(self._stop_watch(main))
            try:
                with contextlib.suppress(asyncio.CancelledError):
                    await main
            finally:
                watch.cancel()
                lag.cancel()
                self.feed.stop()
                cpu, wall = time.process_time_ns() - cpu0, now_ns() - wall0
                gc.unfreeze()
                if gc_was_enabled:
                    gc.enable()
        finally:
            pool.close()
        c.add(self.worker, _W_DONE)
        self.records.sort(key=lambda r: r.index)
        return WorkerStats(
            self.worker,
            os.getpid(),
            cpu,
            wall,
            self.lag,
            self.ticks,
            self.tick_cpu,
            self.spec.cpus,
            prompt_waits=self.feed.waits,
            prompt_wait_ns=self.feed.wait_ns,
            prompts_ran_out=self.feed.ran_out,
            producer_cpu_s=self.feed.producer_cpu_s,
        )


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is optional
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _pin(spec: LoadSpec, worker: int) -> None:
    if spec.cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {spec.cpus[worker % len(spec.cpus)]})


def _worker_entry(
    worker: int,
    endpoint: Endpoint,
    spec: LoadSpec,
    prompts: PromptSource,
    arr: Any,
    conn: Any,
    prompt_conn: Any,
) -> None:
    """Body of a worker process: run its share of the load, send back what it saw."""
    try:
        _pin(spec, worker)
        _install_uvloop()
        w = _Worker(worker, endpoint, spec, prompts, Control(spec.workers, arr), prompt_conn)
        stats = asyncio.run(w.run())
        conn.send((w.records, stats))
    except BaseException as e:  # the parent must hear about it, not wait forever
        conn.send(RuntimeError(f"{type(e).__name__}: {e}"))
        raise
    finally:
        conn.close()


class ClientError(Exception):
    """The load generator itself failed (a worker died); no results were measured."""


def _refused(records: Iterable[RequestRecord], endpoint: Endpoint) -> None:
    """A load the server refused for want of the key (401/403) measured nothing: it ends
    with ``auth.ApiKeyError`` (exit 2), never as a point of failed requests."""
    for r in records:
        if auth.is_rejection(r.status):
            raise auth.rejected(r.status or 401, endpoint.url, endpoint.api_key)


async def run_load_async(
    endpoint: Endpoint,
    spec: LoadSpec,
    prompts: PromptSource,
    controller: Controller | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    poll_s: float = 0.05,
    on_window: WindowHook | None = None,
) -> LoadResult:
    """The load in this process's running event loop (``spec.workers`` must be 1)."""
    if spec.workers != 1:
        raise ValueError("run_load_async runs one worker; use run_load for worker processes")
    control = Control(1, array("q", bytes(8 * (_G_N + _W_N))))
    (producer,) = start_producers(prompts, spec)
    try:
        w = _Worker(0, endpoint, spec, prompts, control, producer.conn if producer else None)
        task = asyncio.create_task(w.run())
        while not control.get(0, _W_READY) and not task.done():
            await asyncio.sleep(0.001)
        start = now_ns()
        control.arr[_G_START] = start
        while not task.done():
            await asyncio.sleep(poll_s)
            opened, stop = _decide(control, controller, spec, on_progress)
            # Hooks do blocking I/O (scraping /metrics): in a thread, so this loop keeps
            # reading streams and stamping tokens meanwhile.
            if opened and on_window is not None:
                await asyncio.to_thread(on_window, "open")
            if stop is not None:
                if on_window is not None and control.window_start_ns:
                    await asyncio.to_thread(on_window, "close")
                control.stop(stop)
        try:
            stats = task.result()
        except Exception as e:
            raise ClientError(f"the bench client failed: {type(e).__name__}: {e}") from e
    finally:
        if producer is not None:
            producer.stop()
    end = now_ns()
    _refused(w.records, endpoint)
    return LoadResult(
        spec,
        endpoint,
        w.records,
        [stats],
        start,
        end,
        control.window_start_ns or None,
        control.stop_ns or None,
    )


def run_load(
    endpoint: Endpoint,
    spec: LoadSpec,
    prompts: PromptSource,
    controller: Controller | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    poll_s: float = 0.05,
    on_window: WindowHook | None = None,
) -> LoadResult:
    """Run the load to its end and return every request's record.

    ``controller`` is polled every ``poll_s``; ``on_window("open")`` runs right after it
    opens the window and ``on_window("close")`` right before its stop takes effect (the
    window's end is the poll at which it decided), so a caller can read server counters at
    both edges.  ``on_progress`` sees every poll (for a progress display).

    One worker runs in this process under uvloop (the caller must not be inside a running
    event loop: use ``run_load_async`` there).  More workers run as spawned processes,
    started together at one shared start time; the controller is polled here."""
    if spec.workers == 1:
        _pin(spec, 0)
        _install_uvloop()
        return asyncio.run(
            run_load_async(endpoint, spec, prompts, controller, on_progress, poll_s, on_window)
        )
    ctx = mp.get_context("spawn")
    control = Control(spec.workers)
    conns, procs = [], []
    producers = start_producers(prompts, spec)
    for w in range(spec.workers):
        parent_end, child_end = ctx.Pipe(duplex=False)
        prod = producers[w]
        p = ctx.Process(
            target=_worker_entry,
            args=(
                w,
                endpoint,
                spec,
                prompts,
                control.arr,
                child_end,
                prod.conn if prod is not None else None,
            ),
            name=f"servebook-bench-worker-{w}",
            daemon=True,
        )
        p.start()
        child_end.close()
        if prod is not None:
            prod.conn.close()  # the worker holds its own copy of the read end
        conns.append(parent_end)
        procs.append(p)
    results: dict[int, tuple[list[RequestRecord], WorkerStats]] = {}
    try:
        # Wait for every worker to be ready so the start is shared.
        deadline = time.monotonic() + 120
        while control.total(_W_READY) < spec.workers:
            _check_workers(procs, conns, results)
            if time.monotonic() > deadline:
                raise ClientError("bench workers did not start within 120 s")
            time.sleep(0.01)
        start = now_ns() + 20_000_000
        control.arr[_G_START] = start
        while len(results) < spec.workers:
            time.sleep(poll_s)
            opened, stop = _decide(control, controller, spec, on_progress)
            if opened and on_window is not None:
                on_window("open")
            if stop is not None:
                if on_window is not None and control.window_start_ns:
                    on_window("close")
                control.stop(stop)
            _check_workers(procs, conns, results)
    finally:
        control.stop(now_ns())
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        for prod in producers:
            if prod is not None:
                prod.stop()
    end = now_ns()
    records = sorted((r for recs, _ in results.values() for r in recs), key=lambda r: r.index)
    stats = [results[w][1] for w in sorted(results)]
    _refused(records, endpoint)
    return LoadResult(
        spec,
        endpoint,
        records,
        stats,
        start,
        end,
        control.window_start_ns or None,
        control.stop_ns or None,
    )


def _check_workers(
    procs: Sequence[Any],
    conns: Sequence[Any],
    results: dict[int, tuple[list[RequestRecord], WorkerStats]],
) -> None:
    for w, (p, conn) in enumerate(zip(procs, conns, strict=True)):
        if w in results:
            continue
        if conn.poll():
            try:
                msg = conn.recv()
            except EOFError:
                raise ClientError(f"bench worker {w} exited without results") from None
            if isinstance(msg, BaseException):
                raise ClientError(f"bench worker {w} failed: {msg!r}") from msg
            results[w] = msg
        elif not p.is_alive():
            raise ClientError(f"bench worker {w} exited with code {p.exitcode}, no results")
