"""The figures of a point, from the load generator's request records (``point_from_load``).

* the window is ``[window_start, window_end]`` (chosen by ``protocol.py``); latency
  figures come from the requests that were *scheduled and finished* inside it and
  succeeded; errors are the requests scheduled inside it that failed, counted, never
  dropped, and the first few distinct messages are kept;
* ``output_tokens_per_s`` counts every output token that *arrived* inside the window, from
  any request (straddling requests included), over the window's length: excluding the
  straddlers' tokens would bias throughput low by a ramp at each edge;
* ``requests_per_s`` counts the requests that finished successfully inside the window;
* per-accelerator throughput divides by the accelerators the deployment uses (the Plan's
  GPUs, not the host's), and is ``null`` when that is unknown or zero (a CPU deployment);
* goodput counts the window's requests that met every SLO.

The point they make is ``results.schema.Point``: this module is the only part of the
results that reads client records, so it stays with the load generator.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from servebook.bench.records import LoadResult, RequestRecord
from servebook.errors import UsageError
from servebook.results.provenance import utc_now
from servebook.results.schema import ClientEvidence, Goodput, Latency, Point, WindowInfo

ERROR_SAMPLES = 5

SLO_KEYS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2e", "e2el": "e2e"}
_UNITS = {"ms": 1.0, "s": 1000.0, "us": 0.001}


def parse_slo(text: str) -> dict[str, float]:
    """``"ttft=500ms,tpot=50ms"`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds).

    Keys: ``ttft``, ``tpot``, ``e2e`` (alias ``e2el``), ``itl`` (every gap of the request).
    Units ``ms``, ``s``, ``us``; a bare number is milliseconds, as in ``vllm bench serve
    --goodput``.  ``:`` is accepted for ``=``."""
    out: dict[str, float] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.replace(":", "=", 1).partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise UsageError(
                f"--slo {text!r}: {part!r} is not KEY=VALUE with KEY one of "
                "ttft, tpot, itl, e2e (e.g. --slo ttft=500ms,tpot=50ms)"
            )
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|us)?\s*", value)
        if not m:
            raise UsageError(f"--slo {text!r}: {value!r} is not a duration like 500ms or 0.5s")
        ms = float(m.group(1)) * _UNITS[m.group(2) or "ms"]
        if ms <= 0:
            raise UsageError(f"--slo {text!r}: {key} must be positive")
        out[SLO_KEYS[key]] = ms
    if not out:
        raise UsageError(f"--slo {text!r}: no objective given")
    return out


def meets_slo(rec: RequestRecord, slo: Mapping[str, float]) -> bool:
    for key, limit_ms in slo.items():
        limit_ns = limit_ms * 1e6
        if key == "ttft":
            v = rec.ttft_ns
            if v is None or v > limit_ns:
                return False
        elif key == "e2e":
            e = rec.e2e_ns
            if e is None or e > limit_ns:
                return False
        elif key == "tpot":
            t = rec.tpot_ns
            if t is not None and t > limit_ns:
                return False
        elif key == "itl":
            itl = rec.itl_ns()
            if itl.size and float(itl.max()) > limit_ns:
                return False
    return True


def window_records(
    records: Iterable[RequestRecord], start_ns: int, end_ns: int
) -> tuple[list[RequestRecord], list[RequestRecord], int]:
    """(ok, errors, unfinished) among the requests that *started* in ``[start, end]``: ok
    ones finished inside it, errors are every failed one, unfinished were still running
    (or cancelled) at its end."""
    ok, err, unfinished = [], [], 0
    for r in records:
        if not start_ns <= r.start_ns <= end_ns:
            continue
        if r.error is not None and (r.end_ns == 0 or r.end_ns <= end_ns):
            err.append(r)
        elif r.ok and r.end_ns <= end_ns:
            ok.append(r)
        else:
            unfinished += 1
    return ok, err, unfinished


def achieved_concurrency(
    records: Iterable[RequestRecord], start_ns: int, end_ns: int, load_end_ns: int
) -> float | None:
    """Time-weighted mean of the requests in flight over ``[start, end]``: each request
    counts from when its bytes went out until its stream ended (a request still open at the
    load's end counts to then).  A slot waiting for the client to send again is not in
    flight, so a client that cannot keep up shows here, in what it cost the load; a slot
    restarted a few loop turns late costs almost nothing.  A conversation's slot waiting
    out its ``--turn-delay`` is the conversation's, as a user thinking is, and counts
    (``bench/sessions.py``)."""
    if end_ns <= start_ns:
        return None
    busy = 0
    for r in records:
        s = (r.sent_ns or r.scheduled_ns) - r.turn_delay_ns
        e = r.end_ns or load_end_ns
        a, b = max(s, start_ns), min(e, end_ns)
        if b > a:
            busy += b - a
    return busy / (end_ns - start_ns)


def _error_samples(errs: Sequence[RequestRecord]) -> list[str]:
    seen: list[str] = []
    for r in errs:
        if r.error is not None and r.error not in seen:
            seen.append(r.error)
            if len(seen) >= ERROR_SAMPLES:
                break
    return seen


def ttft_by_turn(ok: Sequence[RequestRecord]) -> dict[str, Latency] | None:
    """TTFT per conversation turn (``"1"`` is the first), for a workload of
    conversations; None for any other."""
    by: dict[int, list[float]] = {}
    for r in ok:
        if r.turn is not None and r.ttft_ns is not None:
            by.setdefault(r.turn, []).append(r.ttft_ns * 1e-6)
    if not by:
        return None
    return {str(t + 1): Latency.of(v) for t, v in sorted(by.items())}


def _replay_lag(load: LoadResult, lags: list[int], q: float) -> float | None:
    """A replay's schedule lag percentile in ms (sent minus the trace's send time)."""
    if load.spec.arrivals_ns is None or not lags:
        return None
    return float(np.percentile(lags, q)) * 1e-6


def agents_counted(
    load: LoadResult, counted: Sequence[RequestRecord], window: tuple[int, int]
) -> list[dict[str, Any]] | None:
    """The load agents (``AgentInfo.to_dict``), each with its share of the load (its slots
    of the level; an open loop's rate is split evenly), how many of the point's counted
    requests it made (SB414 judges the two), and what says why an agent made none: its
    requests still open at the window's end (sent, never answered) and its event loop's
    lag p99 in the window (its process waited that long for a core, or was held); None
    when one process made the load."""
    if not load.agents:
        return None
    spec, (ws, we) = load.spec, window
    made = Counter(r.worker for r in counted)
    open_at_end = Counter(
        r.worker for r in load.records if r.sent_ns and r.sent_ns <= we and not 0 < r.end_ns <= we
    )
    lags = {w.worker: w.loop_lag_between(ws, we) for w in load.workers}
    out = []
    for a in load.agents:
        slots = spec.share(a.index)[0]
        share = slots / spec.concurrency if slots is not None and spec.concurrency else None
        lag = lags.get(a.index)
        out.append(
            {
                **a.to_dict(),
                "load_share": round(share if share is not None else 1 / spec.workers, 4),
                "requests_counted": made[a.index],
                "requests_open_at_end": open_at_end[a.index],
                "loop_lag_p99_ms": round(float(np.percentile(lag, 99)) / 1e6, 1)
                if lag is not None and lag.size
                else None,
            }
        )
    return out


def point_from_load(
    load: LoadResult,
    *,
    window_start_ns: int,
    window_end_ns: int,
    repetition: int,
    accelerators_used: int | None = None,
    slo_ms: Mapping[str, float] | None = None,
    server: Mapping[str, Any] | None = None,
    started_at: str | None = None,
    scraped_ns: Mapping[str, int] | None = None,
) -> Point:
    """The figures of one point (verdict left valid; ``protocol.judge`` decides it).
    ``scraped_ns``: when each edge's scrape of the server's counters returned ("open",
    "close"), on the window's clock."""
    ok, errs, unfinished = window_records(load.records, window_start_ns, window_end_ns)
    win_s = (window_end_ns - window_start_ns) / 1e9 if window_end_ns > window_start_ns else 0.0
    tokens_in = 0
    for r in load.records:
        if r.chunk_ns and r.chunk_ns[-1] >= window_start_ns and r.chunk_ns[0] <= window_end_ns:
            tt = r.token_times_ns()
            tokens_in += int(np.count_nonzero((tt >= window_start_ns) & (tt <= window_end_ns)))
    finished_in = sum(
        1 for r in load.records if r.ok and window_start_ns <= r.end_ns <= window_end_ns
    )
    ms = 1e-6
    ttft = [r.ttft_ns * ms for r in ok if r.ttft_ns is not None]
    e2e = [r.e2e_ns * ms for r in ok if r.e2e_ns is not None]
    tpot = [r.tpot_ns * ms for r in ok if r.tpot_ns is not None]
    itl = np.concatenate([r.itl_ns() for r in ok]) * ms if ok else np.empty(0)
    tok_s = tokens_in / win_s if win_s > 0 else None
    per_acc = tok_s / accelerators_used if tok_s is not None and accelerators_used else None
    goodput = None
    if slo_ms:
        good = sum(1 for r in ok if meets_slo(r, slo_ms))
        goodput = Goodput(
            slo_ms=dict(slo_ms),
            requests_per_s=good / win_s if win_s > 0 else None,
            fraction=good / len(ok) if ok else None,
        )
    # Client evidence from the window only: the first requests of a load open their
    # connections (send lag) and warm the interpreter (loop lag, CPU).
    lags = [
        r.send_lag_ns
        for r in load.records
        if r.sent_ns and window_start_ns <= r.start_ns <= window_end_ns
    ]
    loop_lag = load.loop_lag_ns(window_start_ns, window_end_ns)
    return Point(
        concurrency=load.spec.concurrency,
        rate=load.spec.rate,
        repetition=repetition,
        valid=True,
        requests_ok=len(ok),
        errors=len(errs),
        error_samples=_error_samples(errs),
        output_tokens_per_s=tok_s,
        output_tokens_per_s_per_accelerator=per_acc,
        requests_per_s=finished_in / win_s if win_s > 0 else None,
        ttft_ms=Latency.of(ttft),
        ttft_ms_by_turn=ttft_by_turn(ok),
        itl_ms=Latency.of(itl),
        tpot_ms=Latency.of(tpot),
        e2e_ms=Latency.of(e2e),
        output_tokens_mismatch=sum(
            1
            for r in ok
            if r.expected_output_tokens is not None and r.output_tokens != r.expected_output_tokens
        ),
        prompt_tokens_mismatch=sum(
            1
            for r in ok
            if r.expected_prompt_tokens is not None
            and r.prompt_tokens is not None
            and r.prompt_tokens != r.expected_prompt_tokens
        ),
        prompt_tokens_unchecked=sum(
            1 for r in ok if r.expected_prompt_tokens is not None and r.prompt_tokens is None
        ),
        goodput=goodput,
        window=WindowInfo(
            warmup_s=(window_start_ns - load.start_ns) / 1e9,
            duration_s=win_s,
            requests_scheduled=len(ok) + len(errs) + unfinished,
            requests_unfinished=unfinished,
            start_monotonic_ns=window_start_ns,
            end_monotonic_ns=window_end_ns,
            scrape_open_lag_ms=_lag_ms(scraped_ns, "open", window_start_ns),
            scrape_close_lag_ms=_lag_ms(scraped_ns, "close", window_end_ns),
        ),
        client=ClientEvidence(
            workers=len(load.workers),
            cpu_fraction=load.cpu_fraction_between(window_start_ns, window_end_ns),
            send_lag_p99_ms=float(np.percentile(lags, 99)) * ms if lags else None,
            loop_lag_p99_ms=(float(np.percentile(loop_lag, 99)) * ms if loop_lag.size else None),
            achieved_concurrency=achieved_concurrency(
                load.records, window_start_ns, window_end_ns, load.end_ns
            ),
            target_concurrency=load.spec.concurrency,
            offered_rate=len(lags) / win_s if load.spec.rate is not None and win_s > 0 else None,
            schedule_lag_p50_ms=_replay_lag(load, lags, 50),
            schedule_lag_p99_ms=_replay_lag(load, lags, 99),
            prompt_waits=load.prompt_waits,
            prompts_ran_out=load.prompts_ran_out,
            producer_cpu_s=load.producer_cpu_s,
            agents=agents_counted(load, ok, (window_start_ns, window_end_ns)),
        ),
        server=dict(server or {}),
        started_at=started_at,
        ended_at=utc_now(),
    )


def _lag_ms(scraped_ns: Mapping[str, int] | None, edge: str, at_ns: int) -> float | None:
    """How long after its window edge ``edge``'s scrape returned; None: not scraped."""
    if not scraped_ns or edge not in scraped_ns:
        return None
    return round((scraped_ns[edge] - at_ns) / 1e6, 3)
