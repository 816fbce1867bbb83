"""A window's latency from an engine's own Prometheus histograms: the mean and percentiles
of what the server observed between two scrapes, estimated from bucket deltas.

Why the server's view: the client's per-token figures are what the client *received*; a
server that coalesces its stream, a proxy that buffers it or a client too busy to read it
each bend them (issue 14: ITL p50 0.00 ms at every level while the server stepped every
~25 ms).  The engine's histograms are what the engine *did*, so a report can put both side
by side and name the likely cause when they differ (:func:`diagnose_client_latency`).

How the estimate is made (the same rule as Prometheus' ``histogram_quantile``, so a
reader can check it against Grafana):

* each ``le`` bucket's delta over the window (after minus before, summed over the label
  sets that match, e.g. every ``engine``), made monotonic (bucket samples are not read
  atomically with each other);
* the rank ``q x count`` falls in the first bucket whose cumulative count reaches it; the
  value is interpolated linearly inside that bucket, from its lower bound (0 for the
  first bucket) to its upper bound;
* a rank in the ``+Inf`` bucket has no upper bound: the estimate is the largest finite
  bound, marked ``above_range`` (it is a lower bound on the true value);
* every estimate carries the bounds of the bucket it lies in (its *resolution*): with
  vLLM's ITL buckets 0.01, 0.025, 0.05 s a p50 of "18.75 ms" means "between 10 and
  25 ms", and a report says so.

The mean is exact, not estimated: ``_sum`` delta over ``_count`` delta.

A window with no observations is ``empty`` (no figures, never zeros); a histogram absent
from either scrape is ``absent``; one whose count, sum or any bucket went backwards (the
server restarted inside the window) or whose bucket layout changed is ``reset``: no
figures, because the observations before the restart are lost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from servebook.metrics.scrape import Snapshot

QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)

Status = Literal["ok", "empty", "absent", "reset"]


def qname(q: float) -> str:
    """0.5 -> ``p50``, 0.99 -> ``p99``, 0.999 -> ``p99.9``."""
    return f"p{100 * q:g}"


@dataclass(frozen=True)
class Buckets:
    """Cumulative counts per upper bound (ascending, the last ``+Inf``) of one histogram,
    summed over the label sets that matched."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    count: float  # the _count sample (or the +Inf bucket when _count is absent)
    sum: float | None


def read_buckets(snap: Snapshot, name: str, **labels: str) -> Buckets | None:
    """``name`` is the histogram's base name (``vllm:inter_token_latency_seconds``);
    ``None`` when it has no ``_bucket`` samples in ``snap``."""
    series = snap.samples.get(name + "_bucket")
    if not series:
        return None
    want = set(labels.items())
    by_le: dict[float, float] = {}
    for lbls, v in series.items():
        d = dict(lbls)
        if "le" not in d or not want <= set(lbls):
            continue
        le = float(d["le"])
        by_le[le] = by_le.get(le, 0.0) + v
    if not by_le:
        return None
    bounds = tuple(sorted(by_le))
    cumulative = tuple(by_le[b] for b in bounds)
    count = snap.value(name + "_count", **labels)
    total = snap.value(name + "_sum", **labels)
    return Buckets(bounds, cumulative, cumulative[-1] if count is None else count, total)


@dataclass(frozen=True)
class Estimate:
    """A percentile estimated from buckets: ``value`` lies in ``(low, high]``, the bucket
    it was interpolated in.  ``above_range``: the rank fell in the ``+Inf`` bucket, so the
    value is the largest finite bound and the truth is at least that."""

    q: float
    value: float
    low: float
    high: float  # math.inf in the +Inf bucket
    above_range: bool = False

    def to_dict(self, scale: float = 1.0) -> dict[str, Any]:
        return {
            "value": self.value * scale,
            "bucket": [self.low * scale, self.high * scale if math.isfinite(self.high) else None],
            "above_range": self.above_range,
        }


def quantile(b: Buckets, q: float) -> Estimate | None:
    """Prometheus' ``histogram_quantile`` over one window's bucket deltas, with the bucket
    it lies in; ``None`` when the window has no observations."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    if not b.bounds or not math.isinf(b.bounds[-1]):
        return None  # no +Inf bucket: not a Prometheus histogram
    cum = list(b.cumulative)
    for i in range(1, len(cum)):
        cum[i] = max(cum[i], cum[i - 1])
    total = cum[-1]
    if total <= 0:
        return None
    rank = q * total
    i = next(i for i, c in enumerate(cum) if c >= rank)
    if i == len(cum) - 1:
        top = b.bounds[-2] if len(b.bounds) > 1 else 0.0
        return Estimate(q, top, top, math.inf, above_range=True)
    upper = b.bounds[i]
    # Prometheus takes 0 as the first bucket's lower bound (latencies are not negative).
    lower = b.bounds[i - 1] if i > 0 else min(0.0, upper)
    below = cum[i - 1] if i > 0 else 0.0
    inside = cum[i] - below
    value = upper if inside <= 0 else lower + (upper - lower) * (rank - below) / inside
    return Estimate(q, value, lower, upper)


def window_buckets(before: Buckets, after: Buckets) -> Buckets | None:
    """``after - before`` per bucket; ``None`` when anything went backwards or the bucket
    layout changed (a restart or an upgrade inside the window)."""
    if before.bounds != after.bounds:
        return None
    deltas = [a - b for a, b in zip(after.cumulative, before.cumulative, strict=True)]
    count = after.count - before.count
    total = None
    if after.sum is not None and before.sum is not None:
        total = after.sum - before.sum
    if any(d < 0 for d in deltas) or count < 0 or (total is not None and total < 0):
        return None
    return Buckets(after.bounds, tuple(deltas), count, total)


@dataclass(frozen=True)
class HistogramWindow:
    """One histogram over one window: how many observations, their exact mean, and the
    percentiles estimated from buckets (each with its bucket)."""

    name: str
    status: Status
    count: float = 0.0
    mean: float | None = None  # exact: sum delta / count delta
    percentiles: Mapping[str, Estimate] = field(default_factory=dict)
    buckets: Buckets | None = None  # the window's deltas (ok and empty only)

    @property
    def usable(self) -> bool:
        return self.status == "ok"

    def p(self, q: float) -> Estimate | None:
        return self.percentiles.get(qname(q))

    def to_dict(self, scale: float = 1.0) -> dict[str, Any]:
        """JSON for a results file; ``scale`` 1000 turns seconds into ms."""
        return {
            "metric": self.name,
            "status": self.status,
            "count": self.count,
            "mean": self.mean * scale if self.mean is not None else None,
            **{k: e.to_dict(scale) for k, e in self.percentiles.items()},
            "method": "bucket deltas, linear inside a bucket (Prometheus histogram_quantile);"
            " mean = sum/count (exact)",
        }


def histogram_window(
    before: Snapshot,
    after: Snapshot,
    name: str,
    quantiles: Sequence[float] = QUANTILES,
    **labels: str,
) -> HistogramWindow:
    """The histogram ``name`` over the window between two scrapes of one server."""
    b, a = read_buckets(before, name, **labels), read_buckets(after, name, **labels)
    if b is None or a is None:
        return HistogramWindow(name, "absent")
    w = window_buckets(b, a)
    if w is None:
        return HistogramWindow(name, "reset")
    observed = w.cumulative[-1]
    if observed <= 0 and w.count <= 0:
        return HistogramWindow(name, "empty", buckets=w)
    count = w.count if w.count > 0 else observed
    mean = w.sum / count if w.sum is not None and count > 0 else None
    pct: dict[str, Estimate] = {}
    for q in quantiles:
        e = quantile(w, q)
        if e is not None:
            pct[qname(q)] = e
    return HistogramWindow(name, "ok", count, mean, pct, w)


def latency_windows(
    before: Snapshot,
    after: Snapshot,
    names: Mapping[str, str],
    quantiles: Sequence[float] = QUANTILES,
    **labels: str,
) -> dict[str, HistogramWindow]:
    """Several histograms at once: ``{"ttft": name, ...}`` -> ``{"ttft": window, ...}``."""
    return {k: histogram_window(before, after, n, quantiles, **labels) for k, n in names.items()}


# --- the client's view against the server's ------------------------------------------------

Cause = Literal["coalesced_streaming", "burst_delivery", "saturated_client", "unexplained"]

CAUSES: dict[str, str] = {
    "coalesced_streaming": "the server sent several tokens per streamed chunk, so the "
    "client's ITL measures gaps between chunks, not tokens; its TPOT still matches. Read "
    "per-token latency from the server's histograms (or stream one token per chunk)",
    "burst_delivery": "tokens reached the client in a few bursts, much faster than the "
    "server produced them: the server flushed its stream in bursts (vLLM's CPU build does "
    "under load, with no proxy in the path) or something between them buffers it (a proxy, "
    "an ingress, a router). The client's TTFT may be late and its TPOT/ITL are too low: read "
    "per-token latency from the server's histograms",
    "saturated_client": "the client read tokens later than the server produced them and "
    "its CPU or event loop was busy: the load generator, not the server, set these "
    "figures. Use more --agents or a bigger client machine",
    "unexplained": "the client's figure is far from the server's and the client was not "
    "busy: look at the path between them (network, proxy) before trusting either",
}


@dataclass(frozen=True)
class LatencyDiagnosis:
    """Whether the client's per-token latency agrees with the server's, and if not the
    likely cause.  ``agrees`` is ``None`` when there is nothing to compare."""

    agrees: bool | None
    cause: Cause | None
    message: str
    client_tpot_ms: float | None = None
    server_tpot_ms: float | None = None
    client_itl_ms: float | None = None
    server_itl_ms: float | None = None  # the server's ITL p50 estimate
    server_itl_bucket_ms: tuple[float, float] | None = None
    tpot_ratio: float | None = None  # client / server

    def to_dict(self) -> dict[str, Any]:
        return {
            "agrees": self.agrees,
            "cause": self.cause,
            "message": self.message,
            "client_tpot_ms_mean": self.client_tpot_ms,
            "server_tpot_ms_mean": self.server_tpot_ms,
            "client_itl_ms_p50": self.client_itl_ms,
            "server_itl_ms_p50": self.server_itl_ms,
            "server_itl_ms_p50_bucket": list(self.server_itl_bucket_ms)
            if self.server_itl_bucket_ms
            else None,
            "tpot_ratio": self.tpot_ratio,
        }


BUSY_CPU = 0.9  # a worker using 90% of a core cannot keep up with its sockets
BUSY_LOOP_MS = 50.0  # event-loop lag at p99 that delays reads visibly
# A client whose event loop stalls reads a stream late, and then whole: what looks like a
# server's burst can be the client's own.  tiny-pd on a 2-core machine, with the engines'
# processes free to roam both cores: every window diagnosed as bursts had a loop lag p99 of
# 150-600 ms, every streaming one 2-130 ms.
LATE_READER = (
    ". The client's own event loop lagged {lag:.0f} ms at p99 in this window, so it may "
    "have read the stream late, in lumps: give the load generator a core the servers do "
    "not busy"
)


def diagnose_client_latency(
    *,
    client_tpot_ms: float | None,
    client_itl_ms: float | None,
    server_tpot: HistogramWindow | None,
    server_itl: HistogramWindow | None,
    client_cpu_fraction: float | None = None,
    client_loop_lag_p99_ms: float | None = None,
    tolerance: float = 0.25,
    near_zero: float = 0.1,
) -> LatencyDiagnosis:
    """Compare one window's client figures with the server's.

    ``client_tpot_ms``: the client's *mean* TPOT (compared with the server's exact mean);
    ``client_itl_ms``: the client's ITL *p50* (compared with the server's p50 estimate,
    whose bucket widens the tolerance: a value inside the bucket agrees).  They differ
    when the ratio is outside ``1 ± tolerance``; a client ITL below ``near_zero`` x the
    server's mean ITL is "near zero" (several tokens per read).

    The causes, in the order they are tried: client ITL near zero while TPOT agrees:
    *coalesced_streaming*; client TPOT (or ITL) well below the server's: *burst_delivery*
    (the client cannot tell a server that flushed in bursts from a buffering proxy);
    above it with a busy client (CPU >= 90% of a core or loop lag p99 >= 50 ms):
    *saturated_client*; above it otherwise: *unexplained*."""
    s_tpot = (
        server_tpot.mean * 1000 if server_tpot and server_tpot.usable and server_tpot.mean else None
    )
    s_itl_mean = (
        server_itl.mean * 1000 if server_itl and server_itl.usable and server_itl.mean else None
    )
    s_itl_p50 = server_itl.p(0.5) if server_itl and server_itl.usable else None
    s_itl = s_itl_p50.value * 1000 if s_itl_p50 else None
    bucket = None
    if s_itl_p50 is not None:
        bucket = (s_itl_p50.low * 1000, s_itl_p50.high * 1000)
    ratio = client_tpot_ms / s_tpot if client_tpot_ms is not None and s_tpot else None
    figures = {
        "client_tpot_ms": client_tpot_ms,
        "server_tpot_ms": s_tpot,
        "client_itl_ms": client_itl_ms,
        "server_itl_ms": s_itl,
        "server_itl_bucket_ms": bucket,
        "tpot_ratio": ratio,
    }

    def out(agrees: bool | None, cause: Cause | None, message: str) -> LatencyDiagnosis:
        return LatencyDiagnosis(agrees, cause, message, **figures)  # type: ignore[arg-type]

    if ratio is None and (client_itl_ms is None or s_itl is None):
        return out(None, None, "nothing to compare: no server histogram or no client figure")

    tpot_ok = ratio is None or abs(ratio - 1) <= tolerance
    tpot_low = ratio is not None and ratio < 1 - tolerance
    tpot_high = ratio is not None and ratio > 1 + tolerance
    itl_ok = itl_low = itl_high = False
    itl_near_zero = False
    if client_itl_ms is not None and s_itl is not None and bucket is not None:
        lo, hi = bucket[0] * (1 - tolerance), bucket[1] * (1 + tolerance)
        lo = min(lo, s_itl * (1 - tolerance))
        hi = max(hi, s_itl * (1 + tolerance))
        itl_ok = lo <= client_itl_ms <= hi
        itl_low, itl_high = client_itl_ms < lo, client_itl_ms > hi
        ref = s_itl_mean if s_itl_mean else s_itl
        itl_near_zero = client_itl_ms < near_zero * ref
    else:
        itl_ok = True

    lagging = client_loop_lag_p99_ms is not None and client_loop_lag_p99_ms >= BUSY_LOOP_MS
    busy = lagging or (client_cpu_fraction is not None and client_cpu_fraction >= BUSY_CPU)
    if tpot_ok and itl_ok:
        return out(True, None, f"client and server agree within {tolerance:.0%}")
    if itl_near_zero and tpot_ok:
        return out(False, "coalesced_streaming", CAUSES["coalesced_streaming"])
    if tpot_low or (itl_low and not tpot_high):
        message = CAUSES["burst_delivery"]
        if lagging:
            message += LATE_READER.format(lag=client_loop_lag_p99_ms)
        return out(False, "burst_delivery", message)
    if tpot_high or itl_high:
        cause: Cause = "saturated_client" if busy else "unexplained"
        return out(False, cause, CAUSES[cause])
    return out(False, "unexplained", CAUSES["unexplained"])
