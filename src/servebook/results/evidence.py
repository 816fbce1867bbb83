"""The server's side of a point: what every role's counters say about the window
(``server_evidence``) and the engine's own latency histograms over it, set against the
client's figures (``with_server_latency``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from servebook.deployment.view import replica_names as replica_names_of
from servebook.engines import SGLANG, VLLM, counters_of, sglang
from servebook.engines.handoff import transferred_tokens
from servebook.engines.vllm import (
    BAD_FINISH_REASONS,
    LATENCY_HISTOGRAMS,
    SOURCE_EXTERNAL,
    SOURCE_LOCAL_CACHE,
    H,
    M,
)
from servebook.metrics.histogram import (
    HistogramWindow,
    LatencyDiagnosis,
    diagnose_client_latency,
    histogram_window,
    latency_windows,
)
from servebook.metrics.scrape import Snapshot, delta, split_replicas
from servebook.results.schema import Latency, Point

# --- server evidence -----------------------------------------------------------------------


# The counters read per role, by key: (metric name, labels), under each engine's names.
_Counters = dict[str, tuple[str, dict[str, str]]]
_VLLM_COUNTERS: _Counters = {
    "prompt_tokens": (M.PROMPT_TOKENS, {}),
    "generation_tokens": (M.GENERATION_TOKENS, {}),
    "preemptions": (M.PREEMPTIONS, {}),
    "spec_draft_tokens": (M.SPEC_DRAFT_TOKENS, {}),
    "spec_accepted_tokens": (M.SPEC_ACCEPTED_TOKENS, {}),
    "external_prefix_hits": (M.EXTERNAL_PREFIX_HITS, {}),
    "prefix_cache_queries": (M.PREFIX_QUERIES, {}),
    "prefix_cache_hits": (M.PREFIX_HITS, {}),
    "prompt_tokens_by_transfer": (M.PROMPT_TOKENS_BY_SOURCE, {"source": SOURCE_EXTERNAL}),
    "prompt_tokens_local_cache": (M.PROMPT_TOKENS_BY_SOURCE, {"source": SOURCE_LOCAL_CACHE}),
}
_SGLANG_COUNTERS: _Counters = {
    "prompt_tokens": (sglang.M.PROMPT_TOKENS, {}),
    "generation_tokens": (sglang.M.GENERATION_TOKENS, {}),
    "preemptions": (sglang.M.RETRACTED_REQUESTS, {}),
    "cached_prompt_tokens": (sglang.M.CACHED_TOKENS, {}),
    # SGLang's radix cache: the prompt tokens it found cached, of all it read
    "prefix_cache_queries": (sglang.M.PROMPT_TOKENS, {}),
    "prefix_cache_hits": (sglang.M.CACHED_TOKENS, {}),
    "requests": (sglang.M.REQUESTS, {}),
    "request_errors": (sglang.M.ABORTED_REQUESTS, {}),
}


def server_evidence(
    before: Mapping[str, Snapshot | str],
    after: Mapping[str, Snapshot | str],
    *,
    decode_role: str | None = None,
    replica_names: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """What every role's counters say about one window, read under each role's engine's
    own names (vLLM's or SGLang's, ``servebook.engines``): per-role deltas, and
    ``handoff_share`` (share of decode's prompt tokens that arrived by KV transfer, when
    ``decode_role`` is given), ``spec_acceptance`` (accepted / draft tokens over roles),
    ``prefix_hit_share`` (the engines' own prefix-cache hits over lookups, in tokens),
    ``preemptions`` and ``request_errors`` (finished with error or abort).  A role given as
    a string is one whose scrape failed (the string is the error).  ``missing`` lists what
    could not be read; an empty list means the evidence is complete."""
    missing: list[str] = []
    totals: dict[str, float] = {}
    roles = {
        role: _role_evidence(role, before.get(role), after.get(role), totals, missing)
        for role in sorted(set(before) | set(after))
    }
    share = None if decode_role is None else _handoff_share(decode_role, roles, missing)
    drafts = totals.get("spec_draft_tokens")
    replicas = replica_evidence(before, after, decode_role, replica_names or {})
    for role, by_replica in replicas.items():
        roles[role]["replicas"] = by_replica
    return {
        **(
            {"handoff_share_by_replica": handoff_by_replica(replicas[decode_role])}
            if decode_role in replicas
            else {}
        ),
        "roles": roles,
        "handoff_share": share,
        "spec_acceptance": (
            totals["spec_accepted_tokens"] / drafts
            if drafts and "spec_accepted_tokens" in totals
            else None
        ),
        "prefix_hit_share": prefix_hit_share(totals),
        "preemptions": totals.get("preemptions"),
        "request_errors": totals.get("request_errors"),
        "missing": missing,
    }


def _role_evidence(
    role: str,
    b: Snapshot | str | None,
    a: Snapshot | str | None,
    totals: dict[str, float],
    missing: list[str],
) -> dict[str, Any]:
    """One role's counters over the window, under its engine's names; each is added to
    ``totals``, and what could not be read to ``missing``."""
    if not isinstance(b, Snapshot) or not isinstance(a, Snapshot):
        err = b if isinstance(b, str) else a if isinstance(a, str) else "not scraped"
        missing.append(f"{role}: /metrics not read ({err})")
        return {"scraped": False, "error": err}
    engine = counters_of(set(a.samples))
    if engine is None:
        missing.append(
            f"{role}: metric(s) absent: no counters of vLLM "
            f"({', '.join(VLLM.required)}) or SGLang ({', '.join(SGLANG.required)})"
        )
        return {"scraped": True, "url": a.url, "engine": None}
    counters: dict[str, float | None] = {}
    resets: list[str] = []
    for key, (name, labels) in (_SGLANG_COUNTERS if engine is SGLANG else _VLLM_COUNTERS).items():
        d = delta(b, a, name, **labels)
        counters[key] = d.value
        if d.reset:
            resets.append(name)
        if d.value is not None:
            totals[key] = totals.get(key, 0.0) + d.value
    if engine is not SGLANG:
        bad = 0.0
        for reason in BAD_FINISH_REASONS:
            d = delta(b, a, M.REQUEST_SUCCESS, finished_reason=reason)
            bad += d.value or 0.0
        counters["request_errors"] = bad
        totals["request_errors"] = totals.get("request_errors", 0.0) + bad
    absent = [n for n in engine.required if not a.has(n)]
    if absent:
        missing.append(f"{role}: metric(s) absent: {', '.join(absent)}")
    if resets:
        missing.append(f"{role}: counters went backwards (the role restarted in the window)")
    return {
        "scraped": True,
        "url": a.url,
        "engine": engine.engine,
        "counters": counters,
        "reset": resets,
    }


def _handoff_share(decode_role: str, roles: Mapping[str, Any], missing: list[str]) -> float | None:
    """The share of decode's prompt tokens that arrived by KV transfer; None (and why, in
    ``missing``) when it cannot be measured."""
    c = roles.get(decode_role, {}).get("counters") or {}
    moved = transferred_tokens(c.get("prompt_tokens_by_transfer"), c.get("external_prefix_hits"))
    total = c.get("prompt_tokens")
    # Tokens decode found in its own prefix cache needed no transfer (a prompt it had
    # seen, e.g. a second sweep with the same seed on a kept deployment): the share is
    # of the tokens decode had to get from somewhere.
    cached = c.get("prompt_tokens_local_cache") or 0.0
    needed = total - cached if total else total
    if moved is not None and needed:
        return moved / needed
    if moved is not None and total:
        missing.append(
            f"{decode_role}: every prompt token of the window was in decode's own prefix "
            "cache (prompts it had already seen: run with another --seed), so no handoff "
            "could be measured"
        )
    elif decode_role in roles and roles[decode_role].get("scraped"):
        missing.append(f"{decode_role}: no KV-transfer counters to compute the handoff share")
    return None


def prefix_hit_share(totals: Mapping[str, float]) -> float | None:
    """The share of the prompt tokens the engines looked up in their own prefix caches
    that they found there, over every role (vLLM's ``vllm:prefix_cache_hits_total`` /
    ``vllm:prefix_cache_queries_total``; SGLang's cached / prompt tokens).  None: no engine
    counted any lookup (prefix caching off, or no such counters)."""
    queries = totals.get("prefix_cache_queries")
    hits = totals.get("prefix_cache_hits")
    if not queries or hits is None:
        return None
    return hits / queries


def replica_evidence(
    before: Mapping[str, Snapshot | str],
    after: Mapping[str, Snapshot | str],
    decode_role: str | None,
    replica_names: Mapping[str, Sequence[str]],
) -> dict[str, dict[str, Any]]:
    """role -> replica -> that replica's own evidence (``server_evidence`` of its counters
    alone), for every role read from several replicas (``metrics.scrape.merge_replicas``
    tags their series): the per-replica figures beside the sum, so one replica whose
    handoff failed open is seen under its own name instead of inside an average."""
    out: dict[str, dict[str, Any]] = {}
    for role in sorted(set(before) & set(after)):
        b, a = before[role], after[role]
        if not isinstance(b, Snapshot) or not isinstance(a, Snapshot):
            continue
        bs, as_ = split_replicas(b), split_replicas(a)
        if len(bs) < 2 or len(bs) != len(as_):
            continue
        names = replica_names_of(role, list(replica_names.get(role) or ()), len(bs))
        by_replica: dict[str, Any] = {}
        for name, rb, ra in zip(names, bs, as_, strict=True):
            ev = server_evidence(
                {name: rb}, {name: ra}, decode_role=name if role == decode_role else None
            )
            by_replica[name] = {
                **ev["roles"][name],
                "handoff_share": ev["handoff_share"],
                "missing": ev["missing"],
            }
        out[role] = by_replica
    return out


def handoff_by_replica(replicas: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """Each decode replica's handoff share (None: it could not be measured there)."""
    return {name: ev.get("handoff_share") for name, ev in replicas.items()}


# --- the server's latency ------------------------------------------------------------------


def server_latency_windows(
    before: Mapping[str, Snapshot | str], after: Mapping[str, Snapshot | str]
) -> dict[str, dict[str, HistogramWindow]]:
    """Every role read at both edges: its latency histograms over the window (vLLM's
    names, ``engines.vllm.LATENCY_HISTOGRAMS``; ITL under its pre-0.11 name when the new
    one is absent).  A role not read at an edge is left out (``server.missing`` says so)."""
    out: dict[str, dict[str, HistogramWindow]] = {}
    for role in sorted(set(before) & set(after)):
        b, a = before[role], after[role]
        if not isinstance(b, Snapshot) or not isinstance(a, Snapshot):
            continue
        w = latency_windows(b, a, LATENCY_HISTOGRAMS)
        if w["itl"].status == "absent":
            legacy = histogram_window(b, a, H.ITL_LEGACY)
            if legacy.status != "absent":
                w["itl"] = legacy
        out[role] = w
    return out


def latency_role(
    windows: Mapping[str, Mapping[str, HistogramWindow]], decode_role: str | None
) -> tuple[str | None, list[str]]:
    """The role whose histograms time the tokens the client read: PD's decode role; else
    the only role whose TPOT or ITL histogram saw the window.  Second: the roles that saw
    it, when several did (each saw only its share of the requests)."""
    if decode_role is not None:
        return decode_role, []
    seen = [r for r, w in windows.items() if w["tpot"].usable or w["itl"].usable]
    if len(seen) > 1:
        return None, seen
    return (seen[0] if seen else None), []


def diagnose_point(
    point: Point, windows: Mapping[str, Mapping[str, HistogramWindow]], decode_role: str | None
) -> LatencyDiagnosis:
    """The client's TPOT (mean) and ITL (p50) against the server's, from the role that
    produced the tokens (:func:`latency_role`; several engine roles behind one entry point
    each saw only their share: compare them per role in ``server_latency``)."""
    role, several = latency_role(windows, decode_role)
    if several:
        return LatencyDiagnosis(
            None,
            None,
            f"several engine roles ({', '.join(several)}) served the window: each role's "
            "own latency is in server_latency",
            client_tpot_ms=point.tpot_ms.mean,
            client_itl_ms=point.itl_ms.p50,
        )
    w = windows.get(role) if role is not None else None
    return diagnose_client_latency(
        client_tpot_ms=point.tpot_ms.mean,
        client_itl_ms=point.itl_ms.p50,
        server_tpot=w["tpot"] if w else None,
        server_itl=w["itl"] if w else None,
        client_cpu_fraction=point.client.cpu_fraction,
        client_loop_lag_p99_ms=point.client.loop_lag_p99_ms,
    )


#: The diagnoses that say the client's per-token timing is wrong, and the figures the
#: engine's histograms then give instead (``metrics.histogram.CAUSES``): bursts make the
#: client's TPOT and ITL too low, a saturated client makes them its own; coalesced chunks
#: leave TPOT right but ITL measures gaps between chunks.
SERVER_LEADS: dict[str, tuple[str, ...]] = {
    "burst_delivery": ("tpot_ms", "itl_ms"),
    "saturated_client": ("tpot_ms", "itl_ms"),
    "coalesced_streaming": ("itl_ms",),
}
#: A point's per-token figures and the engine histogram each is read from.
HISTOGRAM_OF = {"tpot_ms": "tpot", "itl_ms": "itl"}


def server_figure(w: HistogramWindow) -> Latency | None:
    """A histogram over a window as a point's latency figure (ms): the exact mean, the
    percentiles estimated inside their buckets (``None`` above the last finite bound: the
    histogram cannot place them); ``None`` when it saw nothing."""
    if not w.usable or w.count <= 0:
        return None

    def q(x: float) -> float | None:
        e = w.p(x)
        return None if e is None or e.above_range else e.value * 1000

    return Latency(
        p50=q(0.5),
        p90=q(0.9),
        p99=q(0.99),
        mean=w.mean * 1000 if w.mean is not None else None,
        n=int(w.count),
    )


def server_led(
    point: Point,
    windows: Mapping[str, Mapping[str, HistogramWindow]],
    role: str | None,
    cause: str | None,
) -> dict[str, Any]:
    """The update that makes the engine's histograms a point's TPOT/ITL where the
    diagnosis says the client's are wrong: the figures, their source, and the client's
    own kept beside them; empty when the client's stand."""
    figures = SERVER_LEADS.get(cause or "", ())
    w = windows.get(role) if role is not None else None
    if not figures or w is None:
        return {}
    update: dict[str, Any] = {}
    source: dict[str, str] = {}
    client: dict[str, Latency] = {}
    for name in figures:
        fig = server_figure(w[HISTOGRAM_OF[name]])
        if fig is None:
            continue
        update[name] = fig
        source[name] = f"server:{role}"
        client[name] = getattr(point, name)
    if not update:
        return {}
    return {**update, "latency_source": source, "client_latency": client}


def stored_figure(window: Mapping[str, Any] | None) -> Latency | None:
    """``server_figure`` of a histogram as a results file stores it (``server_latency``,
    ms); ``None`` when it was not usable or saw nothing."""
    if not window or window.get("status") != "ok" or not window.get("count"):
        return None

    def q(name: str) -> float | None:
        e = window.get(name)
        return None if not isinstance(e, Mapping) or e.get("above_range") else e.get("value")

    return Latency(
        p50=q("p50"), p90=q("p90"), p99=q("p99"), mean=window.get("mean"), n=int(window["count"])
    )


def lead_from_server(point: Point, name: str, role: str) -> Point:
    """``point`` with figure ``name`` (``tpot_ms``/``itl_ms``) read from its own stored
    histograms of ``role``, as ``server_led`` makes it at measurement; unchanged where it
    already is, or where that histogram saw nothing."""
    source = f"server:{role}"
    if point.latency_source.get(name) == source:
        return point
    fig = stored_figure(((point.server_latency or {}).get(role) or {}).get(HISTOGRAM_OF[name]))
    if fig is None:
        return point
    return point.model_copy(
        update={
            name: fig,
            "latency_source": {**point.latency_source, name: source},
            "client_latency": {**point.client_latency, name: getattr(point, name)},
        }
    )


# How wide a bucket may be, relative to its upper bound, for a quantile interpolated inside
# it to count as placed.  Linear interpolation puts the quantile where the bucket's counts
# say, anywhere between its bounds, so a bucket wider than this cannot resolve a 5% change.
# vLLM's TPOT and ITL buckets (10, 25, 50, 75, 100, 150 ms ...) are 33-100% wide: measured
# on tiny-pd (2 cores, 12 repetitions), the engine's p50 read 6.3-17.0 ms inside its
# 0-10 and 10-25 ms buckets while the exact means were 9.3-11.7 ms.
PLACED_WIDTH = 0.10


def unplaced_p50(point: Point, name: str) -> tuple[float, float] | None:
    """The bucket (ms) of an engine-led figure's p50 when the histogram places it no finer
    than a bucket wider than :data:`PLACED_WIDTH` of its upper bound: interpolation there
    answers where the bucket's counts fall, not what the latency was (in vLLM's first
    bucket, 0-10 ms, it gives 5.00 for any CPU engine's 2-3 ms TPOT).  ``None`` when the
    figure is the client's or its bucket is fine enough."""
    src = point.latency_source.get(name, "")
    if not src.startswith("server:") or name not in HISTOGRAM_OF:
        return None
    role = src.split(":", 1)[1]
    window = ((point.server_latency or {}).get(role) or {}).get(HISTOGRAM_OF[name]) or {}
    q = window.get("p50") if isinstance(window, Mapping) else None
    bucket = q.get("bucket") if isinstance(q, Mapping) else None
    if not isinstance(bucket, list | tuple) or len(bucket) != 2:
        return None
    lo, hi = float(bucket[0]), float(bucket[1])
    if hi > 0 and (hi - lo) <= PLACED_WIDTH * hi:
        return None
    return lo, hi


def unplaced_tpot_bucket(points: Sequence[Point]) -> tuple[float, float] | None:
    """The span (ms) of the buckets holding an engine-led TPOT p50 that its histogram does
    not place among ``points`` (:func:`unplaced_p50`); ``None`` when every p50 is placed."""
    buckets = [b for p in points if (b := unplaced_p50(p, "tpot_ms")) is not None]
    if not buckets:
        return None
    return min(b[0] for b in buckets), max(b[1] for b in buckets)


def bucket_words(bucket: tuple[float, float]) -> str:
    """``below 10 ms`` or ``within 10-25 ms``: where the buckets of
    :func:`unplaced_tpot_bucket` put a p50, for a sentence (a span over several points'
    buckets, so it names no single bucket)."""
    lo, hi = bucket
    return f"below {hi:g} ms" if lo <= 0 else f"within {lo:g}-{hi:g} ms"


def one_source(points: Sequence[Point]) -> list[Point]:
    """The points of one load level (of one run, or of two runs compared) with each of
    TPOT and ITL from one source: where any repetition's diagnosis made the engine's
    histogram lead, every repetition reads it, each its own engine's (``tokens_role``; its
    client figure kept beside), and a point whose engine saw nothing keeps its client's
    figure under the client's name (``results.tpot`` gives it no figure then).  A level
    whose repetitions mixed the client's and the engine's estimates had medians and
    intervals over two different measurements: measured on tiny-pd (2 cores), TPOT p50
    came from the engine on 5 of 12 points and from the client on 7, and after six
    repetitions its 95% interval at c=4 was still +-73%."""
    out = list(points)
    led = sorted({(n, src) for p in out for n, src in p.latency_source.items()})
    for name, src in led:
        role = src.split(":", 1)[1] if src.startswith("server:") else None
        if role is not None and name in HISTOGRAM_OF:
            out = [lead_from_server(p, name, tokens_role(p) or role) for p in out]
    return out


def tokens_role(point: Point) -> str | None:
    """The role whose histograms timed the tokens of ``point``'s client (each point reads
    its own: two runs compared are rarely one topology, tiny-mixed-spec's ``mixed`` against
    tiny-pd-spec's ``decode``): the role a figure of it already reads; else the role
    recorded at measurement (``latency_diagnosis.role``); else, in files written before
    that was recorded, the one role whose TPOT histogram saw decode time (a PD prefill
    role's one token per request has none).  ``None`` when that is not one role."""
    for src in point.latency_source.values():
        if src.startswith("server:"):
            return src.split(":", 1)[1]
    recorded = (point.latency_diagnosis or {}).get("role")
    if isinstance(recorded, str):
        return recorded
    timed = [
        role
        for role, ws in (point.server_latency or {}).items()
        if isinstance(ws, Mapping) and (f := stored_figure(ws.get("tpot"))) and f.mean
    ]
    return timed[0] if len(timed) == 1 else None


def one_source_per_level(points: Sequence[Point]) -> list[Point]:
    """``one_source`` over each load level of a run; the order is kept."""
    levels: dict[tuple[int | None, float | None], list[int]] = {}
    for i, p in enumerate(points):
        levels.setdefault((p.concurrency, p.rate), []).append(i)
    out = list(points)
    for idx in levels.values():
        for i, p in zip(idx, one_source([out[i] for i in idx]), strict=True):
            out[i] = p
    return out


def with_server_latency(
    point: Point,
    before: Mapping[str, Snapshot | str],
    after: Mapping[str, Snapshot | str],
    *,
    decode_role: str | None = None,
) -> Point:
    """The point with ``server_latency`` (per role, ms) and ``latency_diagnosis`` (with
    the ``role`` whose histograms timed the client's tokens, :func:`latency_role`), from
    the scrapes its server evidence was read from; where the diagnosis says the client's
    per-token timing is wrong, its TPOT/ITL are the engine's (:data:`SERVER_LEADS`)."""
    windows = server_latency_windows(before, after)
    if not windows:
        return point
    diagnosis = diagnose_point(point, windows, decode_role)
    role, _ = latency_role(windows, decode_role)
    return point.model_copy(
        update={
            "server_latency": {
                r: {k: w.to_dict(1000) for k, w in ws.items()} for r, ws in windows.items()
            },
            "latency_diagnosis": {**diagnosis.to_dict(), "role": role},
            **server_led(point, windows, role, diagnosis.cause),
        }
    )
