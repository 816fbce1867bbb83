"""The benchmark protocol: which points run in which order, when a point's measurement
window opens and closes, and whether the point is valid.

Field notes ("Benchmarks"): a published sweep did not reproduce because it was too short,
had no warm-up and ran its points low to high, so order looked like a trend.  Each rule
below answers one of those failures.

* **Order.**  Each repetition is one round over every load level; by default each round's
  order is shuffled with the seed (``numpy.random.default_rng([seed, round])``), so drift
  during the run (a warming cache, a cooling GPU) lands on every level alike instead of
  lining up with the levels.  ``ascending`` is available and recorded, and an experiment
  gives its benches ``counterbalanced`` orders (``level_orders``, round r the r-th, cycling).
* **Warm-up**, discarded: at least ``2 x concurrency`` requests *and* 10 s by default
  (``--warmup 10s``, ``--warmup 200r``, or both: ``--warmup 10s,200r``; ``0`` for none).
* **Window**: opens when the warm-up is done, closes once it is both ``--duration`` long
  (default 60 s) and holds ``--min-requests`` successful requests (default ``10 x
  concurrency``) that were scheduled *and* finished inside it.  Only those requests give
  latency figures (steady state: no request that saw the ramp-up or the drain).  The load
  stops at the window's end; requests still in flight are cancelled and not counted.
* **Rate levels** (open loop) use ``ceil(rate)`` where a concurrency level uses its
  concurrency in those defaults (2 x and 10 x requests).
* **Verdict**: a point is valid only if every SB4xx check passes (``bench.validity``, one
  function per check); the reasons are recorded in the point (``invalid_reasons``) and
  invalid points are never averaged into aggregates (MLPerf LoadGen's VALID/INVALID with
  reasons).
* **Precision target** (``--precision 5%``, off by default; recorded either way): a level
  is repeated until the 95% interval of its output tokens/s and of its TPOT p50 over its
  valid repetitions has a half-width of at most that share of the mean
  (``stats.precision_decision``), with at least ``--repetitions`` (and 2) and at most
  ``--max-repetitions`` (default 10) repetitions.  A level that does not get there is
  *imprecise*: a verdict of its own beside valid/invalid, stated with the interval it
  reached.  Repetitions stay interleaved: round ``r`` is the seeded shuffle of every
  level (as without a target), and runs repetition ``r`` of the levels not yet decided,
  in that order; a level leaves the rounds once it is precise or at the cap.  A point's
  place in the sweep (which seeds its arrivals and prompts) is its place in the full
  round, ``r x levels + i``, so it does not depend on which levels are still running and
  ``--resume`` sends what the uninterrupted run would have; the decisions are taken from
  the points of earlier rounds only, so a resumed run takes them again alike.
* **Server latency**: every role's latency histograms (``engines.vllm.LATENCY_HISTOGRAMS``)
  are read from the same two scrapes as the counters, recorded per point
  (``server_latency``), and the client's per-token figures are checked against the
  server's (``latency_diagnosis``: agreement, or the likely cause of a mismatch).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from servebook.bench.control import Decision, LoadSpec, Progress
from servebook.bench.coordinator import Launcher, run_load
from servebook.bench.endpoint import Endpoint
from servebook.bench.figures import point_from_load
from servebook.bench.flags import NO_WARMUP, Warmup
from servebook.bench.records import LoadResult
from servebook.bench.validity import Thresholds, apply_verdict, judge, reach_findings
from servebook.bench.workload import BuildsPrompts, PromptSource
from servebook.errors import UsageError
from servebook.findings import Finding
from servebook.metrics.scrape import Snapshot, scrape_roles
from servebook.results.aggregate import PrecisionTarget
from servebook.results.evidence import server_evidence, with_server_latency
from servebook.results.provenance import utc_now
from servebook.results.schema import Point, Results, point_key
from servebook.results.store import ResultsWriter

Order = Literal["shuffled", "ascending", "counterbalanced"]

# --- settings and order ---------------------------------------------------------------------


@dataclass(frozen=True)
class Level:
    """One load level: a concurrency (closed loop) or a rate (open loop)."""

    concurrency: int | None = None
    rate: float | None = None

    @property
    def size(self) -> int:
        """The level's 'concurrency' for the defaults (rate levels: ceil(rate))."""
        if self.concurrency is not None:
            return self.concurrency
        assert self.rate is not None
        return max(1, math.ceil(self.rate))

    def label(self) -> str:
        return f"c={self.concurrency}" if self.concurrency is not None else f"rate={self.rate:g}/s"


@dataclass(frozen=True)
class PointSpec:
    level: Level
    repetition: int


@dataclass(frozen=True)
class ProtocolSettings:
    concurrencies: tuple[int, ...] = ()
    rates: tuple[float, ...] = ()
    max_concurrency: int | None = None  # cap for rate levels
    repetitions: int = 3
    order: Order = "shuffled"
    seed: int = 0
    warmup: Warmup | None = None  # None: the default for each level
    duration_s: float = 60.0
    min_requests: int | None = None  # None: 10 x the level's size
    max_point_s: float | None = None  # None: 10 x (warm-up + duration), at least 600 s
    # No request succeeded for this long: the point stops and the sweep ends (a stalled
    # target; ``Stalled``).  Each point gets it afresh.
    stall_s: float = 120.0
    thresholds: Thresholds = field(default_factory=Thresholds)
    # Precision target: the largest 95% half-width, as a share of the mean, of a level's
    # tok/s and TPOT p50 (None: off, exactly ``repetitions`` repetitions per level).
    precision: float | None = None
    max_repetitions: int | None = None  # with a target; None: DEFAULT_MAX_REPETITIONS
    # Trace replay (``--replay-speed``): each point sends the trace's rows on its own
    # clock, scaled by this speed (``rates`` then holds the trace's mean rate at it).
    replay_speed: float | None = None
    # Open loop: gamma inter-arrivals of this shape (CV = 1/sqrt(B)); 1 is Poisson.
    burstiness: float = 1.0
    level_orders: tuple[tuple[str, ...], ...] = ()  # counterbalanced: each round's labels

    def __post_init__(self) -> None:
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise UsageError(
                f"--burstiness {self.burstiness:g}: give a positive shape, e.g. 1 (Poisson), "
                "0.5 (burstier) or 4 (smoother)"
            )
        if self.replay_speed is not None and not (
            self.replay_speed > 0 and math.isfinite(self.replay_speed)
        ):
            raise UsageError(
                f"--replay-speed {self.replay_speed:g}: give a positive factor, e.g. 1 (the "
                "trace's own clock) or 2 (twice as fast)"
            )
        if not self.concurrencies and not self.rates:
            raise UsageError("give at least one --concurrency level or --rate")
        if self.repetitions < 1:
            raise UsageError(f"--repetitions must be at least 1, got {self.repetitions}")
        if self.precision is not None and not 0 < self.precision < 1:
            raise UsageError(
                f"--precision {100 * self.precision:g}%: give a share of the mean between "
                "0 and 100%, e.g. 5%"
            )
        if self.max_repetitions is not None:
            if self.precision is None:
                raise UsageError(
                    "--max-repetitions caps the repetitions a --precision target may add; "
                    "without a target every level runs --repetitions times"
                )
            if self.max_repetitions < self.min_repetitions:
                raise UsageError(
                    f"--max-repetitions {self.max_repetitions} is below the minimum "
                    f"{self.min_repetitions} (--repetitions, and at least 2 for an interval)"
                )
        if self.order not in ("shuffled", "ascending", "counterbalanced") or (
            self.order == "counterbalanced"
        ) != bool(self.level_orders):  # counterbalanced orders are an experiment's, given
            raise UsageError(f"--order {self.order!r}: choose shuffled or ascending")
        if self.duration_s <= 0:
            raise UsageError("--duration must be positive")
        if not self.stall_s > 0 or self.stall_s == float("inf"):
            raise UsageError(f"--stall {self.stall_s:g} s: give a positive duration, e.g. 120s")
        if self.min_requests is not None and self.min_requests < 1:
            raise UsageError("--min-requests must be at least 1")

    @property
    def min_repetitions(self) -> int:
        """Repetitions every level runs (with a target: at least 2, for an interval)."""
        return max(2, self.repetitions) if self.precision is not None else self.repetitions

    @property
    def repetition_cap(self) -> int:
        """Repetitions a level may run at most (without a target: ``repetitions``)."""
        if self.precision is None:
            return self.repetitions
        if self.max_repetitions is not None:
            return self.max_repetitions
        return max(DEFAULT_MAX_REPETITIONS, self.min_repetitions)

    def precision_target(self) -> PrecisionTarget | None:
        if self.precision is None:
            return None
        return PrecisionTarget(self.precision, self.min_repetitions, self.repetition_cap)

    def levels(self) -> list[Level]:
        return [Level(concurrency=c) for c in self.concurrencies] + [
            Level(rate=r) for r in self.rates
        ]

    def warmup_for(self, level: Level) -> Warmup:
        if self.warmup is not None:
            return self.warmup
        if self.replay_speed is not None:
            return NO_WARMUP  # a replay's window is the whole trace
        return Warmup(10.0, 2 * level.size)

    def min_requests_for(self, level: Level) -> int:
        if self.min_requests is not None:
            return self.min_requests
        return 1 if self.replay_speed is not None else 10 * level.size

    def deadline_for(self, level: Level) -> float:
        if self.max_point_s is not None:
            return self.max_point_s
        w = self.warmup_for(level).duration_s or 0.0
        return max(600.0, 10.0 * (w + self.duration_s))

    def estimated_s(self, overhead_s: float = 3.0) -> tuple[float, float]:
        """How long the sweep takes at least and, with a precision target, at most: each
        point's warm-up duration and window, plus ``overhead_s`` a point (counters read at
        both edges, the last requests drained).  A lower bound on a slow server: a window
        also waits for its minimum of requests."""
        per_level = [
            (self.warmup_for(lv).duration_s or 0.0) + self.duration_s + overhead_s
            for lv in self.levels()
        ]
        one_round = sum(per_level)
        return one_round * self.min_repetitions, one_round * self.repetition_cap

    def to_dict(self) -> dict[str, Any]:
        """What results.json records under provenance.protocol."""
        d = asdict(self)
        if self.burstiness == 1.0:
            del d["burstiness"]  # Poisson, as every run before the setting existed
        if not self.level_orders:
            del d["level_orders"]  # not counterbalanced: the order says how
        d["warmup"] = self.warmup.describe() if self.warmup is not None else "default"
        d["warmup_default"] = "max(10 s, 2 x level) - both bounds"
        d["min_requests_default"] = "10 x level"
        d["steady_state"] = "requests scheduled and finished inside the window"
        d["percentiles"] = "numpy linear (type 7)"
        d["ci"] = "Student t 95% over valid repetitions"
        # Recorded either way: null is "no target, exactly `repetitions` per level".
        d["max_repetitions"] = self.repetition_cap if self.precision is not None else None
        if self.precision is not None:
            d["precision_rule"] = (
                "repeat a level until the 95% half-width of output_tokens_per_s and "
                "tpot_ms.p50 over its valid repetitions is at most `precision` x the mean; "
                "imprecise at max_repetitions"
            )
        return d


DEFAULT_MAX_REPETITIONS = 10


def round_order(settings: ProtocolSettings, rnd: int) -> list[Level]:
    """Every level in round ``rnd``'s order: shuffled with ``[seed, rnd]``, the round's given
    order (``counterbalanced``), or ``ascending`` (concurrencies ascending, then rates)."""
    levels = sorted(
        settings.levels(),
        key=lambda lv: (lv.concurrency is None, lv.concurrency or 0, lv.rate or 0.0),
    )
    if settings.order == "counterbalanced":
        given = settings.level_orders[rnd % len(settings.level_orders)]
        levels = sorted(levels, key=lambda lv: given.index(lv.label()))
    elif settings.order == "shuffled":
        perm = np.random.default_rng([settings.seed, rnd]).permutation(len(levels))
        levels = [levels[i] for i in perm]
    return levels


def point_order(settings: ProtocolSettings) -> list[PointSpec]:
    """The points every run makes: repetition-major rounds over every level, each in
    :func:`round_order`.  Without a precision target that is the whole sweep; with one,
    the first ``min_repetitions`` rounds, after which :func:`run_sweep` adds rounds for
    the levels still imprecise."""
    return [
        PointSpec(lv, rnd)
        for rnd in range(settings.min_repetitions)
        for lv in round_order(settings, rnd)
    ]


def level_points(
    points: Sequence[Point], level: Level, before_round: int | None = None
) -> list[Point]:
    """A level's points (those of rounds before ``before_round`` when given)."""
    return [
        p
        for p in points
        if p.concurrency == level.concurrency
        and p.rate == level.rate
        and (before_round is None or p.repetition < before_round)
    ]


def needs_round(
    settings: ProtocolSettings, level: Level, rnd: int, points: Sequence[Point]
) -> bool:
    """Whether ``level`` takes part in round ``rnd``: always in the first
    ``min_repetitions`` rounds; after them, while the precision target's stopping rule,
    over the level's points of the earlier rounds, says to continue."""
    if rnd < settings.min_repetitions:
        return True
    target = settings.precision_target()
    if target is None or rnd >= settings.repetition_cap:
        return False
    return target.decide(level_points(points, level, before_round=rnd)).status == "continue"


# --- the window, live --------------------------------------------------------------------------


class WindowController:
    """Opens the window when the warm-up is done and stops the load when the window is
    long enough and full enough.  Also stops a point that cannot become valid: errors
    outnumber successes (at least 20 of them) in the window, or no request succeeded for
    ``stall_s`` (``stalled``: nothing finished, or only timeouts and errors came back: a
    target that stopped answering).  Implements ``client.Controller``."""

    def __init__(
        self, warmup: Warmup, duration_s: float, min_requests: int, stall_s: float = 120.0
    ) -> None:
        self.warmup = warmup
        self.duration_s = duration_s
        self.min_requests = min_requests
        self.stall_s = stall_s
        self.phase: Literal["warmup", "window", "done"] = "warmup"
        self.stop_reason: str | None = None
        self.stalled = False
        self._last_count = -1
        self._last_change_ns: int | None = None

    def __call__(self, progress: Progress) -> Decision:
        p = progress
        finished = p.completed_ok + p.errors
        if p.completed_ok != self._last_count or self._last_change_ns is None:
            self._last_count, self._last_change_ns = p.completed_ok, p.now_ns
        if (p.now_ns - self._last_change_ns) / 1e9 > self.stall_s:
            self.phase, self.stalled = "done", True
            self.stop_reason = f"no request succeeded for {self.stall_s:g} s (--stall)" + (
                f"; {p.errors} failed" if p.errors else ""
            )
            return Decision(stop=True)
        if self.phase == "warmup":
            w = self.warmup
            if (w.duration_s is None or p.elapsed_s >= w.duration_s) and (
                w.requests is None or finished >= w.requests
            ):
                self.phase = "window"
                return Decision(open_window=True)
            return Decision()
        if self.phase == "window" and p.window_start_ns is not None:
            if p.window_errors >= 20 and p.window_errors > p.window_ok:
                self.phase, self.stop_reason = "done", "errors outnumber successes"
                return Decision(stop=True)
            if p.window_elapsed_s >= self.duration_s and p.window_ok >= self.min_requests:
                self.phase, self.stop_reason = "done", "window complete"
                return Decision(stop=True)
        return Decision()


def controller_for(settings: ProtocolSettings, level: Level) -> WindowController:
    """The point's window; a replay's stays open until the trace's last request ends."""
    return WindowController(
        settings.warmup_for(level),
        math.inf if settings.replay_speed is not None else settings.duration_s,
        settings.min_requests_for(level),
        settings.stall_s,
    )


# --- running points (the sweep runner's core; the CLI adds flags and a progress display) ----


@dataclass(frozen=True)
class Target:
    """What a sweep measures: the entry point, and where each role's counters are.

    ``metrics_urls`` maps role name -> base URL whose ``/metrics`` is read at both edges of
    every window (empty: no server evidence, e.g. ``--url`` against a non-vLLM server).
    ``decode_role`` names the PD decode role (its transfer counters give the handoff
    share); ``accelerators_used`` is what the deployment uses (the Plan's GPUs), for
    per-accelerator throughput."""

    endpoint: Endpoint
    # role -> its /metrics base URL, or every replica's when it runs several Pods
    metrics_urls: Mapping[str, str | tuple[str, ...]] = field(default_factory=dict)
    decode_role: str | None = None
    accelerators_used: int | None = None
    # role -> why it cannot be trusted now (process gone, forward broken, Pod replaced);
    # read after every point, whose verdict it joins (SB410).  None: nothing to ask.
    problems: Callable[[], Mapping[str, str]] | None = None
    # role -> a name per replica of metrics_urls (a Pod's, a URL), for per-replica evidence
    replica_names: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # The deployment claims speculative decoding: every point must show it (SB413).
    speculative: bool = False

    @property
    def pd(self) -> bool:
        return self.decode_role is not None


Scrape = Callable[[Mapping[str, str | tuple[str, ...]]], dict[str, Snapshot | str]]


@dataclass
class PointOutcome:
    point: Point
    findings: list[Finding]
    load: LoadResult
    stop_reason: str | None
    stalled: bool = False  # no request succeeded for the point's stall deadline


class Stalled(Exception):
    """The target stopped answering during a point: the sweep ends after writing that
    point (every later point would wait out the same deadline, measuring nothing)."""

    def __init__(self, spec: PointSpec, reason: str) -> None:
        super().__init__(reason)
        self.spec, self.reason = spec, reason


#: What a point whose server gives no counters records as its server evidence.
NO_SERVER_EVIDENCE = {
    "evidence": "none",
    "missing": ["the server exposes no counters servebook reads (vLLM's or SGLang's /metrics)"],
}


def _pregenerate(prompts: PromptSource, first: int, count: int) -> None:
    """Build a point's first ``count`` prompts before its warm-up starts.  A source that
    cannot build during the load (a server's /tokenize) gets twice as many: it has only
    what is built here."""
    if isinstance(prompts, BuildsPrompts):
        n = count if prompts.producible else 2 * count
        prompts.pregenerate(range(first, first + n))


#: Prompts built before a point beyond its minimum: a few seconds of a small fast server,
#: so that a first point with no history does not wait on the producer for them.
PROMPTS_SPARE = 16


def prompts_needed(settings: ProtocolSettings, level: Level, history: Sequence[Point] = ()) -> int:
    """How many prompts to build before a point's warm-up.  The minimum the protocol
    needs (warm-up requests, the window's minimum, two per slot) and some spare, or, where
    an earlier point measured the server's request rate (of this level, else of the other
    concurrency levels scaled to this one's slots), 1.5 times what that rate sends over a
    warm-up and a window.  ``history``: the sweep's points so far.  The producer builds
    the rest during the load, in a process of its own; on a machine whose cores the
    engines fill (tiny-pd on 2 cores) it fell behind, requests waited for their prompts
    (SB404), and the point was invalid."""
    warm = settings.warmup_for(level)
    count = (warm.requests or 0) + settings.min_requests_for(level) + 2 * level.size
    count += PROMPTS_SPARE
    same = [p for p in history if (p.concurrency, p.rate) == (level.concurrency, level.rate)]
    rates = [p.requests_per_s for p in same if p.requests_per_s]
    if not rates and level.concurrency:
        # The level's first point: the other concurrency levels' rates, scaled to this
        # one's slots (a closed loop sends at most that much more; tiny-pd's first c=4
        # point, built for c=4's minimum, waited for 4 prompts on a quiet 2-core machine).
        rates = [
            p.requests_per_s * level.concurrency / p.concurrency
            for p in history
            if p.requests_per_s and p.concurrency
        ]
    if level.rate:
        rates.append(level.rate)
    spans = [
        (p.window.warmup_s or 0.0) + (p.window.duration_s or 0.0)
        for p in history
        if p.window.duration_s
    ]
    if rates and spans:
        count = max(count, math.ceil(1.5 * max(rates) * max(spans)) + 2 * level.size)
    return count


#: A replay's first row leaves this long after the load starts, so that the window (opened
#: at the controller's first poll, every 50 ms) is open before any replayed request.
REPLAY_LEAD_S = 0.5


@dataclass(frozen=True)
class Replay:
    """A point's schedule of a trace: each request's send time after the load's start."""

    arrivals_ns: tuple[int, ...]
    span_s: float  # first to last send, at the replay speed

    def spec_fields(self) -> dict[str, Any]:
        """What a ``LoadSpec`` takes of it: every row once, each at its time."""
        return {"num_requests": len(self.arrivals_ns), "arrivals_ns": self.arrivals_ns}


def replay_schedule(settings: ProtocolSettings, prompts: PromptSource) -> Replay | None:
    """The trace's clock scaled by ``--replay-speed`` (None: not a replay)."""
    trace = getattr(prompts, "arrivals_ns", None)
    if settings.replay_speed is None or not trace:
        return None
    speed, lead = settings.replay_speed, int(REPLAY_LEAD_S * 1e9)
    arrivals = tuple(lead + int(t / speed) for t in trace)
    return Replay(arrivals, (arrivals[-1] - arrivals[0]) / 1e9)


def replay_rate(arrivals_ns: Sequence[int], speed: float) -> float:
    """A trace's mean request rate at ``speed`` (its level's ``rate``, for the record)."""
    span_s = (arrivals_ns[-1] - arrivals_ns[0]) / 1e9 / speed if arrivals_ns else 0.0
    return len(arrivals_ns) / span_s if span_s > 0 else float(len(arrivals_ns))


def run_point(
    target: Target,
    spec: PointSpec,
    settings: ProtocolSettings,
    prompts: PromptSource,
    *,
    position: int = 0,
    attempt: int = 0,
    workers: int = 1,
    cpus: tuple[int, ...] | None = None,
    slo_ms: Mapping[str, float] | None = None,
    scrape_fn: Scrape = scrape_roles,
    on_progress: Callable[[Progress], None] | None = None,
    history: Sequence[Point] = (),
    launcher: Launcher | None = None,
) -> PointOutcome:
    """Run one point (warm-up, window, verdict).  ``position``, the point's place in the
    sweep's full order, seeds its arrivals and picks its prompts (``position * 10**7 +
    attempt * 10**6`` on, ``attempt``: how often the point ran before; a replay: the
    trace's rows), so a resumed sweep sends what the first run would have, and a point
    run again sends no prompt it sent before."""
    level = spec.level
    controller = controller_for(settings, level)
    replay = replay_schedule(settings, prompts)
    offset = 0 if replay else position * 10_000_000 + (attempt % 10) * 1_000_000
    t_build = time.monotonic()
    _pregenerate(prompts, offset, prompts_needed(settings, level, history))
    build_s = time.monotonic() - t_build
    load_spec = LoadSpec(
        concurrency=level.concurrency,
        rate=level.rate,
        max_concurrency=settings.max_concurrency if level.rate is not None else None,
        seed=settings.seed * 1_000_003 + position,
        # An agent needs a slot: --agents 4 still runs c=1 (one agent).
        workers=min(workers, level.concurrency) if level.concurrency is not None else workers,
        cpus=cpus,
        deadline_s=settings.deadline_for(level) + (replay.span_s if replay else 0.0),
        index_offset=offset,
        burstiness=settings.burstiness,
        **(replay.spec_fields() if replay else {}),
    )
    edges: dict[str, dict[str, Snapshot | str]] = {}
    scraped_ns: dict[str, int] = {}

    def on_window(edge: Literal["open", "close"]) -> None:
        if target.metrics_urls:
            edges[edge] = scrape_fn(target.metrics_urls)
            scraped_ns[edge] = time.monotonic_ns()  # the window's edges' clock

    started = utc_now()
    load = run_load(
        target.endpoint,
        load_spec,
        prompts,
        controller,
        on_progress,
        on_window=on_window,
        launcher=launcher,
    )
    ws = load.window_start_ns or load.end_ns
    we = load.window_end_ns or load.end_ns
    server: dict[str, Any] = dict(NO_SERVER_EVIDENCE)
    if target.metrics_urls:
        if "open" in edges and "close" in edges:
            server = server_evidence(
                edges["open"],
                edges["close"],
                decode_role=target.decode_role,
                replica_names=target.replica_names,
            )
        else:
            server = {"missing": ["the window never opened or never closed, so no counters"]}
    point = point_from_load(
        load,
        window_start_ns=ws,
        window_end_ns=we,
        repetition=spec.repetition,
        accelerators_used=target.accelerators_used,
        slo_ms=slo_ms,
        server=server,
        started_at=started,
        scraped_ns=scraped_ns,
    )
    stop_reason = controller.stop_reason or (
        "the point's time limit"
        if load.window_end_ns
        else "the prompts built before the point ran out (a server's /tokenize is not asked "
        "during the load: use --prompt-format ids or a local --tokenizer DIR)"
        if load.prompts_ran_out
        else "the load ran out"
    )
    findings = judge(
        point,
        duration_s=replay.span_s if replay else settings.duration_s,
        min_requests=settings.min_requests_for(level),
        thresholds=settings.thresholds,
        pd=target.pd,
        stop_reason=stop_reason,
        speculative=target.speculative,
    )
    point = point.model_copy(update={"prompt_build_s": build_s})
    if "open" in edges and "close" in edges:
        point = with_server_latency(
            point, edges["open"], edges["close"], decode_role=target.decode_role
        )
    findings += reach_findings(target.problems() if target.problems else {})
    return PointOutcome(
        apply_verdict(point, findings), findings, load, stop_reason, controller.stalled
    )


def run_sweep(
    target: Target,
    settings: ProtocolSettings,
    prompts: PromptSource,
    writer: ResultsWriter,
    *,
    workers: int = 1,
    cpus: tuple[int, ...] | None = None,
    slo_ms: Mapping[str, float] | None = None,
    scrape_fn: Scrape = scrape_roles,
    on_point: Callable[[PointSpec, PointOutcome | None], None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    launcher: Launcher | None = None,
) -> Results:
    """Every point in protocol order, round by round (:func:`needs_round` says which levels
    a round runs), skipping those the writer already holds as valid (``--resume``); the
    results file is rewritten after each point.  ``on_point(spec, None)`` announces a
    point, ``on_point(spec, outcome)`` reports it.  A point whose target stalled ends the
    sweep once it is written (``Stalled``)."""
    done = writer.done_keys()
    n = len(settings.levels())
    for rnd in range(settings.repetition_cap):
        order = round_order(settings, rnd)
        # Decided at the round's start, from earlier rounds only: a level's own point in
        # this round does not take it out of the round it is in.
        taking_part = [lv for lv in order if needs_round(settings, lv, rnd, writer.results.points)]
        if not taking_part:
            break
        for i, level in enumerate(order):
            if level not in taking_part:
                continue
            ps = PointSpec(level, rnd)
            key = point_key(level.concurrency, level.rate, rnd)
            if key in done:
                continue
            # A point run again (--resume of an invalid one) sends prompts of its own: the
            # first attempt's are in a warm server's prefix cache (SB412).
            tried = writer.results.points + writer.results.superseded_points
            attempt = sum(p.key == key for p in tried)
            if on_point is not None:
                on_point(ps, None)
            outcome = run_point(
                target,
                ps,
                settings,
                prompts,
                position=rnd * n + i,
                attempt=attempt,
                workers=workers,
                cpus=cpus,
                slo_ms=slo_ms,
                scrape_fn=scrape_fn,
                on_progress=on_progress,
                history=writer.results.points,
                launcher=launcher,
            )
            writer.add(outcome.point)
            if on_point is not None:
                on_point(ps, outcome)
            if outcome.stalled:
                raise Stalled(ps, outcome.stop_reason or "stalled")
    return writer.results
