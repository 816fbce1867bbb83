"""What a load is asked to do (``LoadSpec``, ``default_workers``) and the counters and
flags its workers share with the controller that opens its window and stops it
(``Control``, ``Progress``, ``Decision``, ``Controller``).

**Worker processes.**  With ``workers = W > 1`` the load is split: closed loop gives each
worker ``concurrency / W`` slots (the remainder to the first workers); open loop gives each
worker an independent seeded Poisson stream of rate ``rate / W`` (the superposition of
independent Poisson processes is a Poisson process of the summed rate); request ``i`` goes
to worker ``i mod W`` so prompts stay unique and deterministic.  Workers share a small
array of counters and flags (``multiprocessing.RawArray``) through which the parent's
``Controller`` opens the window and stops the load.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

now_ns = time.monotonic_ns


class ClientError(Exception):
    """The load generator itself failed (a worker died); no results were measured."""


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
    # Trace replay: request ``index_offset + k`` is scheduled ``arrivals_ns[k]`` after the
    # load's start, whatever is in flight (``rate`` is then the trace's mean rate, for
    # the record); None: Poisson arrivals at ``rate``.
    arrivals_ns: tuple[int, ...] | None = None
    # Open loop: gamma inter-arrival times of shape ``burstiness`` (CV = 1/sqrt(B), as
    # vLLM's and AIPerf's --burstiness); 1 is Poisson, below 1 burstier, above smoother.
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency and rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.arrivals_ns is not None and (self.rate is None or self.num_requests is None):
            raise ValueError("a replay (arrivals_ns) is open loop with num_requests")
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


def next_gap_ns(rng: Any, rate: float, burstiness: float = 1.0) -> int:
    """The next open-loop inter-arrival time: gamma with mean ``1/rate`` and shape
    ``burstiness`` (CV = 1/sqrt(burstiness)); at 1 the exponential draw Poisson arrivals
    always used, so a seed sends what it sent before burstiness existed."""
    if burstiness == 1.0:
        return int(rng.exponential(1e9 / rate))
    return int(rng.gamma(burstiness, 1e9 / (rate * burstiness)))


STREAMS_PER_WORKER = 256


def default_workers(concurrency: int | None, cores: int | None = None) -> int:
    """Worker processes for a level when the user did not say: one per 256 concurrent
    streams (where benchmarks/client_capacity.py shows one core nearing saturation against
    a fast server), at most the cores this process may use, and never more than the
    concurrency.  SB404/SB405 still flag a saturated client; ``--agents`` overrides."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if concurrency is None:
        return 1
    want = -(-concurrency // STREAMS_PER_WORKER)
    return max(1, min(want, cores, concurrency))


# --- shared control between the controller and the workers -------------------------------

# Global slots, then per-worker counter slots.
G_START, G_WINDOW, G_STOP, G_N = 0, 1, 2, 3
W_SENT, W_OK, W_ERR, W_TOKENS, W_WIN_OK, W_WIN_ERR = range(6)
# W_AUTH: requests the server refused for want of the API key (401/403).
W_READY, W_DONE, W_AUTH, W_N = range(6, 10)


class Control:
    """Counters and flags shared by the controller and the workers.  Each worker writes
    only its own slots; the controller writes the global ones."""

    def __init__(self, workers: int, arr: Any = None) -> None:
        self.workers = workers
        self.arr = (
            arr if arr is not None else mp.get_context("spawn").RawArray("q", G_N + W_N * workers)
        )

    def _w(self, worker: int, slot: int) -> int:
        return G_N + W_N * worker + slot

    def add(self, worker: int, slot: int, n: int = 1) -> None:
        self.arr[self._w(worker, slot)] += n

    def get(self, worker: int, slot: int) -> int:
        return int(self.arr[self._w(worker, slot)])

    def total(self, slot: int) -> int:
        return sum(int(self.arr[self._w(w, slot)]) for w in range(self.workers))

    @property
    def start_ns(self) -> int:
        return int(self.arr[G_START])

    @property
    def window_start_ns(self) -> int:
        return int(self.arr[G_WINDOW])

    @property
    def stopped(self) -> bool:
        return bool(self.arr[G_STOP])

    def open_window(self, t: int) -> None:
        if not self.arr[G_WINDOW]:
            self.arr[G_WINDOW] = t

    def stop(self, t: int) -> None:
        if not self.arr[G_STOP]:
            self.arr[G_STOP] = t

    @property
    def stop_ns(self) -> int:
        return int(self.arr[G_STOP])


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


def progress(control: Control, t: int) -> Progress:
    ws = control.window_start_ns
    return Progress(
        now_ns=t,
        start_ns=control.start_ns,
        window_start_ns=ws or None,
        sent=control.total(W_SENT),
        completed_ok=control.total(W_OK),
        errors=control.total(W_ERR),
        output_tokens=control.total(W_TOKENS),
        window_ok=control.total(W_WIN_OK),
        window_errors=control.total(W_WIN_ERR),
        workers_done=control.total(W_DONE),
    )


WindowEdge = Literal["open", "close"]
WindowHook = Callable[[WindowEdge], None]


def decide(
    control: Control,
    controller: Controller | None,
    spec: LoadSpec,
    on_progress: Callable[[Progress], None] | None,
) -> tuple[bool, int | None]:
    """One poll: (the window opened now, the stop time if the load should stop now).  The
    stop is not applied here: the caller first runs the window-close hook (the "after"
    counters must be read before in-flight requests are cancelled)."""
    t = now_ns()
    p = progress(control, t)
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
    if control.total(W_AUTH):
        stop = t  # the server refuses our key: every further request would be refused too
    if on_progress is not None:
        on_progress(p)
    return opened, stop if not control.stopped else None


@contextlib.contextmanager
def children_ignore_sigint() -> Iterator[None]:
    """Processes started inside the block (load workers, prompt producers) start with
    SIGINT ignored, and Python leaves an ignored SIGINT ignored: a Ctrl-C at the terminal
    reaches the whole process group, and only the parent acts on it (it stops the load
    through the shared flags, collects what the workers saw, and says what it saved).
    Without this, a child still importing when Ctrl-C came printed its own traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
