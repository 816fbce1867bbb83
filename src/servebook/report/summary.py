"""What a report says first, in one paragraph: per run, the best valid point, where
latency breaks the SLO (when SLOs were set), which points are invalid and which are
imprecise; and each run's plan as settings a person reads ("c=1,4; 2 repetitions,
shuffled; 8 s windows after a 3 s warm-up"), never a Python repr.

Read defensively: a field the results do not carry is simply not mentioned.

* SLOs: ``point.goodput.slo_ms`` (``--slo``); a level breaks one when the mean over its
  valid repetitions of that latency's p99 exceeds it (more than 1% of requests miss).
* Imprecise: a level is imprecise when any of its points carries ``imprecise: true``
  (the verdict of a precision target, ``bench --precision``; its ``precision`` record
  says what half-width was reached).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from servebook.report.comparability import differing_fields
from servebook.report.plots import check_ids
from servebook.report.tables import (
    Level,
    Run,
    fmt_interval,
    fmt_num,
    levels,
    settings_value,
)
from servebook.results.evidence import bucket_words, unplaced_tpot_bucket
from servebook.results.measurement import biasing_choices
from servebook.results.schema import Point
from servebook.results.tpot import judged_key

ACCELERATORS_ABSENT = (
    "Per-accelerator figures are not shown: no run records how many accelerators its "
    "deployment uses (a CPU deployment has none to divide by)."
)


# --- the plan as settings ------------------------------------------------------------------


def _num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, int | float) and not isinstance(x, bool) else str(x)


def _seconds(x: Any) -> str:
    return f"{_num(x)} s" if isinstance(x, int | float) else str(x)


def _warmup(w: Any) -> str:
    """``"10s,8r"`` -> ``10 s and 8 requests``; ``default`` -> the default's rule."""
    if w in (None, "default"):
        return "the default warm-up (at least 10 s and 2 x the level in requests)"
    if w == "0":
        return "no warm-up"
    parts = []
    for p in str(w).split(","):
        if p.endswith("s"):
            parts.append(f"{p[:-1]} s")
        elif p.endswith("r"):
            parts.append(f"{p[:-1]} requests")
        else:
            parts.append(p)
    return "a warm-up of " + " and ".join(parts)


def describe_protocol(protocol: Mapping[str, Any]) -> str:
    """A run's protocol settings (``provenance.protocol``, ``ProtocolSettings.to_dict()``)
    as one line of settings; keys it does not know are listed as ``key=value``."""
    parts: list[str] = []
    levels_ = []
    if protocol.get("concurrencies"):
        levels_.append("c=" + ",".join(_num(c) for c in protocol["concurrencies"]))
    if protocol.get("rates"):
        levels_.append("rate=" + ",".join(_num(r) for r in protocol["rates"]) + "/s")
    if levels_:
        parts.append(" and ".join(levels_))
    if "repetitions" in protocol:
        reps = protocol["repetitions"]
        order = protocol.get("order")
        parts.append(
            f"{reps} repetition{'s' if reps != 1 else ''}" + (f", {order}" if order else "")
        )
    if "duration_s" in protocol:
        parts.append(
            f"{_seconds(protocol['duration_s'])} windows after {_warmup(protocol.get('warmup'))}"
        )
    if protocol.get("min_requests") is not None:
        parts.append(f"at least {protocol['min_requests']} requests per window")
    if protocol.get("max_concurrency") is not None:
        parts.append(f"rate levels capped at {protocol['max_concurrency']} in flight")
    if isinstance(protocol.get("precision"), int | float):
        cap = protocol.get("max_repetitions")
        parts.append(
            "repeated until the 95% interval of tok/s and TPOT p50 (the engine's exact "
            "TPOT mean where its histogram leads TPOT) is within "
            f"±{100 * protocol['precision']:g}% of the mean"
            + (f", at most {_num(cap)} repetitions" if cap is not None else "")
        )
    if "seed" in protocol:
        parts.append(f"seed {protocol['seed']}")
    known = {
        "concurrencies",
        "rates",
        "repetitions",
        "order",
        "duration_s",
        "warmup",
        "min_requests",
        "max_concurrency",
        "seed",
        "thresholds",
        "max_point_s",
        "stall_s",
        "precision",
        "max_repetitions",
    }
    extra = {
        k: v
        for k, v in protocol.items()
        if k not in known and not k.endswith("_default") and not isinstance(v, str)
    }
    parts += [f"{k}={settings_value(v)}" for k, v in sorted(extra.items())]
    return "; ".join(parts)


# --- the summary ---------------------------------------------------------------------------

_SLO_FIGURE = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2e": "e2e_ms"}
_SLO_TITLE = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E latency"}


def _mean(xs: Sequence[float]) -> float | None:
    return math.fsum(xs) / len(xs) if xs else None


def slos(run: Run) -> dict[str, float]:
    """The run's SLOs in ms (``--slo``), from any point's goodput; empty when none."""
    for p in run.results.points:
        if p.goodput is not None and p.goodput.slo_ms:
            return dict(p.goodput.slo_ms)
    return {}


def _p99(lv: Level, key: str) -> float | None:
    name = _SLO_FIGURE.get(key)
    if name is None:
        return None
    vals = [getattr(getattr(p, name), "p99", None) for p in lv.valid]
    return _mean([float(v) for v in vals if v is not None])


def slo_break(run: Run) -> str | None:
    """Where latency first breaks an SLO, scanning load levels upward; ``None`` without
    SLOs."""
    objectives = slos(run)
    if not objectives:
        return None
    for lv in levels(run):
        broken = []
        for key, limit in objectives.items():
            v = _p99(lv, key)
            if v is not None and v > limit:
                broken.append(f"{_SLO_TITLE.get(key, key)} p99 {fmt_num(v)} ms > {limit:g} ms")
        if broken:
            return f"latency breaks the SLO at {lv.label} ({'; '.join(broken)})"
    slo_text = ", ".join(f"{_SLO_TITLE.get(k, k)} {v:g} ms" for k, v in objectives.items())
    return f"every level meets the SLO at p99 ({slo_text})"


def is_imprecise(p: Point) -> bool:
    """A precision verdict the results may carry (``imprecise: true`` on a point)."""
    return bool(getattr(p, "imprecise", False))


def imprecise_levels(run: Run) -> list[str]:
    return [lv.label for lv in levels(run) if any(is_imprecise(p) for p in lv.points)]


def best_point(run: Run) -> str | None:
    best: tuple[float, Level] | None = None
    for lv in levels(run):
        if lv.not_measured:
            continue  # no figure to name (``results.measurement``)
        iv = lv.figure("output_tokens_per_s")
        if iv.mean is not None and (best is None or iv.mean > best[0]):
            best = (iv.mean, lv)
    if best is None:
        return None
    lv = best[1]
    tok = fmt_interval(lv.figure("output_tokens_per_s"))
    lat = []
    top = unplaced_tpot_bucket(lv.valid)  # a p50 the histogram does not place is no figure
    tpot = judged_key(lv.valid)
    for key, title in ((tpot, "TPOT " + tpot.split(".")[1]), ("ttft_ms.p50", "TTFT p50")):
        m = lv.figure(key).mean
        if m is not None:
            src = " from the engine histograms" if lv.source(key) else ""
            if key == tpot and top is not None:
                src += f" (its histogram places the p50 only {bucket_words(top)})"
            lat.append(f"{title} {fmt_num(m)} ms{src}")
    tail = f" ({', '.join(lat)})" if lat else ""
    return f"best valid point {lv.label}: {tok} output tok/s{tail}"


def run_summary(run: Run) -> str:
    parts = []
    protocol = run.results.provenance.protocol
    bias = biasing_choices(protocol)
    if bias:
        parts.append("choices that bias it: " + "; ".join(bias))
    best = best_point(run)
    lvs = levels(run)
    unmeasured = [(lv.label, lv.not_measured) for lv in lvs if lv.not_measured]
    parts.append(
        best
        or (
            "no level is a measurement: no figure to report"
            if unmeasured and any(lv.valid for lv in lvs)
            else "no valid point: no figure to report"
        )
    )
    if unmeasured:
        parts.append(
            "not a measurement, so shown but not drawn as figures: "
            + "; ".join(f"{label} ({', '.join(why)})" for label, why in unmeasured)
        )
    brk = slo_break(run)
    if brk:
        parts.append(brk)
    invalid = [(lv.label, p) for lv in lvs for p in lv.invalid]
    if invalid:
        named = ", ".join(f"{label} rep {p.repetition} ({check_ids(p)})" for label, p in invalid)
        parts.append(
            f"{len(invalid)} invalid point{'s' if len(invalid) != 1 else ''}, excluded: {named}"
        )
    else:
        parts.append("every point valid")
    load = run.results.provenance.load
    if load is not None and load.route == "port-forward":
        parts.append(
            "its latencies include a port-forward (the load went from the bench machine "
            "through the API server and the kubelet)"
        )
    imprecise = imprecise_levels(run)
    if imprecise:
        reached = [
            lv.label + (f" ({lv.precision.describe()})" if lv.precision is not None else "")
            for lv in lvs
            if lv.imprecise
        ]
        parts.append(
            f"imprecise (interval wider than the precision target) at {'; '.join(reached)}"
        )
    return f"{run.label}: " + "; ".join(parts) + "."


#: What makes runs shown side by side measure different things, beside what they are
#: about: field notes ("Benchmarks"), the same baseline moved -15% and +29% between images.
NOT_LIKE_FOR_LIKE = {
    "engine": "engine versions",
    "packages": "images or packages",
    "model": "models",
}


def unlike_warning(runs: Sequence[Run]) -> str | None:
    """A warning, for the summary's first words, when the runs shown differ in engine
    version, images or packages, or model (``comparability.differing_fields``; `compare`
    refuses such a pair unless told); ``None`` when they do not."""
    fields: dict[str, list[str]] = {}
    for name, kind, _ in differing_fields(runs) if len(runs) > 1 else []:
        if kind in NOT_LIKE_FOR_LIKE:
            fields.setdefault(kind, []).append(name)
    if not fields:
        return None

    def named(names: list[str]) -> str:
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        return ", ".join(names[:3]) + more

    what = "; ".join(f"{NOT_LIKE_FOR_LIKE[k]} ({named(v)})" for k, v in fields.items())
    return (
        f"Warning: these runs differ in {what}, so they are not like for like: a difference "
        "between their numbers may come from that, not from what the runs are about "
        "(`servebook compare` refuses such a pair unless the difference is declared with "
        "--variable); the table 'What differs between the runs shown' lists each field."
    )


def summary(runs: Sequence[Run]) -> str:
    """The report's opening paragraph: a warning first when the runs are not like for
    like (:func:`unlike_warning`), then each run."""
    warning = unlike_warning(runs)
    return " ".join([*([warning] if warning else []), *(run_summary(r) for r in runs)])


# --- the server's latency beside the client's ----------------------------------------------


def latency_diagnoses(run: Run) -> list[tuple[str, int, dict[str, Any]]]:
    """``(level, repetition, diagnosis)`` for every point that carries
    ``latency_diagnosis`` (``metrics.histogram.LatencyDiagnosis.to_dict()``)."""
    out = []
    for lv in levels(run):
        for p in sorted(lv.points, key=lambda p: p.repetition):
            d = getattr(p, "latency_diagnosis", None)
            if isinstance(d, Mapping):
                out.append((lv.label, p.repetition, dict(d)))
    return out


def missing_points(protocol: Mapping[str, Any], points: Sequence[Point]) -> list[str]:
    """The points a run's sweep planned (every level, its minimum repetitions) that its
    results do not hold, as ``c=4 rep 1``: a sweep stopped before it finished (Ctrl-C, a
    dead role, a stalled target).  Empty when the plan cannot be read from the protocol."""
    reps = protocol.get("repetitions")
    if not isinstance(reps, int) or isinstance(reps, bool) or reps < 1:
        return []
    if isinstance(protocol.get("precision"), int | float):
        reps = max(2, reps)
    levels_ = [(c, None, f"c={_num(c)}") for c in protocol.get("concurrencies") or []]
    levels_ += [(None, r, f"rate={_num(r)}/s") for r in protocol.get("rates") or []]
    have = {(p.concurrency, p.rate, p.repetition) for p in points}
    return [
        f"{label} rep {rep}"
        for rep in range(reps)
        for c, r, label in levels_
        if (c, r, rep) not in have
    ]


def incomplete_note(label: str, protocol: Mapping[str, Any], points: Sequence[Point]) -> str:
    """What a report says first about a run whose sweep did not finish; "" when it did."""
    missing = missing_points(protocol, points)
    if not missing:
        return ""
    planned = len(missing) + len({(p.concurrency, p.rate, p.repetition) for p in points})
    shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
    return (
        f"INCOMPLETE: {label} holds {planned - len(missing)} of the {planned} points its "
        f"sweep planned (missing: {shown}); the sweep stopped before it finished, so its "
        "figures cover only part of the plan."
    )
