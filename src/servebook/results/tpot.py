"""A point's per-token latency as every reader takes it: one judged value with its source.

bench's table, the report's tables, plots and headline, ``compare``, ``compare
--reproduce``, a precision target and an experiment's ratios, Pareto view and max load all
read TPOT (and ITL) through :func:`judged`, :func:`judged_key`, :func:`judge_together` and
:func:`figure`, never a point's stored percentiles directly.

Where the client's per-token timing was diagnosed wrong (tokens read in bursts, a saturated
client: ``evidence.SERVER_LEADS``), a point's TPOT and ITL are its engine's histograms over
the window.  A histogram knows its mean exactly (sum / count) and its percentiles only
within their buckets: vLLM's TPOT buckets are 33-100% wide (0-10, 10-25, 25-50 ms ...), so a
p50 interpolated inside the first is 5.00 ms and a p99 9.90 for any CPU engine's 2-3 ms
TPOT.  An engine-led figure is therefore its engine's exact mean, shown beside the bucket
its histogram puts the p50 in (``<10 (mean 2.31)``), and its percentiles are no figure.  A
client-led figure is the client's p50 (and p99) over the window's requests.

Points judged together (a level's repetitions; one level of two runs compared) are judged
one way: on the engines' exact means when any of them is engine-led, each point on its own
engine (``evidence.one_source`` makes each read its own histogram first), and a point whose
engine saw nothing then has no figure, never its client's.  Measured in the field trial
(issue 32): ``compare`` set tiny-mixed-spec's 5.00 midpoint against tiny-pd-spec's client
p50 of 2.7 ms and called PD 46% better; the exact means, 1.84 against 2.82 ms, say 53% worse.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from servebook.results.evidence import HISTOGRAM_OF, one_source
from servebook.results.schema import Point

#: The figures a client can time wrong, which the engine's histograms then give instead.
PER_TOKEN = tuple(HISTOGRAM_OF)


def engine_led(point: Point, name: str = "tpot_ms") -> bool:
    """Whether ``point``'s figure ``name`` is its engine's histogram (``latency_source``)."""
    return point.latency_source.get(name, "").startswith("server:")


@dataclass(frozen=True)
class Judged:
    """One point's per-token figure as it is judged: the client's p50, or the engine's
    exact mean with the bucket (ms) its histogram puts the p50 in."""

    name: str  # "tpot_ms" | "itl_ms"
    value: float | None  # ms
    source: str  # "client" | "server:<role>"
    bucket: tuple[float, float] | None = None

    @property
    def engine(self) -> bool:
        return self.source.startswith("server:")

    @property
    def key(self) -> str:
        return f"{self.name}.mean" if self.engine else f"{self.name}.p50"

    def cell(self, digits: int = 2) -> str:
        """``2.70``; ``<10 (mean 2.31)`` or ``10-25 (mean 11.52)`` where the engine leads;
        ``-`` when nothing was measured."""
        if self.value is None:
            return "-"
        number = f"{self.value:.{digits}f}"
        if not self.engine:
            return number
        return f"{bucket_label(self.bucket)} (mean {number})" if self.bucket else f"mean {number}"


def judged(point: Point, name: str = "tpot_ms") -> Judged:
    """THE figure of ``point``'s TPOT (or ITL) that every reader shows and judges."""
    if engine_led(point, name):
        src = point.latency_source[name]
        return Judged(name, getattr(point, name).mean, src, quantile_bucket(point, name, "p50"))
    return Judged(name, getattr(point, name).p50, "client")


def judged_key(points: Iterable[Point], name: str = "tpot_ms") -> str:
    """The statistic ``points`` judged together are judged on: ``tpot_ms.mean`` (each
    engine's exact mean) where any of them is engine-led, else ``tpot_ms.p50``."""
    return f"{name}.mean" if any(engine_led(p, name) for p in points) else f"{name}.p50"


def judge_together(points: Sequence[Point], name: str = "tpot_ms") -> tuple[str, list[Point]]:
    """Points judged together (one level of the runs, or of the arms, compared): the
    statistic they are judged on (:func:`judged_key` over the valid ones) and ``points``
    with TPOT and ITL from one source (``evidence.one_source``), in their order; each
    one's figure is then :func:`figure` of that statistic.  ``compare`` judges a level of
    two runs so (``report.tables.same_source``, ``report.compare.judged_metric``), an
    experiment a level of its arms (``experiment.analysis``)."""
    same = one_source(points)
    return judged_key([p for p in same if p.valid], name), same


def figure(point: Point, key: str) -> float | None:
    """Figure ``key`` (``ttft_ms.p50``, ``tpot_ms.mean`` ...) of ``point``, only where it is
    a measurement: a per-token percentile only where the client's figure stands, a per-token
    mean only where the engine's leads (its exact mean; a client's mean is never set beside
    it).  Other figures as stored."""
    name, _, q = key.partition(".")
    value = getattr(getattr(point, name), q)
    if name not in PER_TOKEN:
        return value
    return value if (q == "mean") == engine_led(point, name) else None


def quantile_bucket(point: Point, name: str, q: str) -> tuple[float, float] | None:
    """The bucket (ms) in which an engine-led figure's histogram puts quantile ``q``
    (``p50``, ``p99``); ``None`` for a client-led figure or one the file does not place."""
    if not engine_led(point, name):
        return None
    role = point.latency_source[name].split(":", 1)[1]
    window = ((point.server_latency or {}).get(role) or {}).get(HISTOGRAM_OF[name]) or {}
    est = window.get(q) if isinstance(window, Mapping) else None
    bucket = est.get("bucket") if isinstance(est, Mapping) else None
    if not isinstance(bucket, list | tuple) or len(bucket) != 2:
        return None
    return float(bucket[0]), float(bucket[1])


def bucket_span(points: Iterable[Point], name: str, q: str) -> tuple[float, float] | None:
    """The span (ms) of the buckets holding quantile ``q`` among the engine-led ``points``
    (:func:`quantile_bucket`); ``None`` when none is placed."""
    buckets = [b for p in points if (b := quantile_bucket(p, name, q)) is not None]
    if not buckets:
        return None
    return min(b[0] for b in buckets), max(b[1] for b in buckets)


def bucket_label(bucket: tuple[float, float] | None) -> str:
    """``<10`` (a first bucket) or ``10-25``; ``?`` when unknown."""
    if bucket is None:
        return "?"
    lo, hi = bucket
    return f"<{hi:g}" if lo <= 0 else f"{lo:g}-{hi:g}"
