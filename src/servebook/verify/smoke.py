"""Run verify against a deployment: read counters, send verify's own requests, read
counters again, and judge (checks in ``verify.checks``).

Every network call has an explicit timeout, and a role that does not answer stops the
traffic phase early, so verify's total time is bounded by its options, never by a hang.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servebook import auth, http
from servebook.engines import vllm
from servebook.findings import Finding, Severity
from servebook.metrics.scrape import ScrapeError, Snapshot, scrape_replicas
from servebook.verify import checks as C

# A word list for verify's long prompt; a random nonce in front makes every verify's
# prompt unique, so no prefix cache (local or external) can answer it from an earlier run.
_WORDS = [
    "serving",
    "deployment",
    "prefill",
    "decode",
    "cache",
    "block",
    "handoff",
    "token",
    "router",
    "engine",
    "model",
    "request",
    "counter",
    "window",
    "latency",
    "throughput",
    "evidence",
    "connector",
    "storage",
    "transfer",
    "draft",
]


@dataclass
class Target:
    """One role as verify sees it: an endpoint, and what the backend can tell about it."""

    name: str
    kind: str  # engine | router
    url: str
    argv: Sequence[str] = ()
    alive: Callable[[], bool | None] = lambda: None  # None: the backend cannot tell
    log: Callable[[], str] | None = None
    describe: Callable[[], str] = lambda: ""
    metrics_url: str = ""  # where its /metrics is, when not at ``url``
    replica_metrics_urls: Sequence[str] = ()  # the other replicas' (counters are summed)
    # A name per replica (first: counters_url's), and each replica's command line where
    # they may differ (empty: all run ``argv``).
    replica_names: Sequence[str] = ()
    replica_argv: Sequence[Sequence[str]] = ()

    @property
    def counters_url(self) -> str:
        return self.metrics_url or self.url


@dataclass
class Claims:
    """What the deployment claims, from its recipe (not from how it was started)."""

    topology: str  # mixed | pd
    speculative: bool
    served_model_name: str
    entry_url: str
    fabric: str | None = None  # the KV transport fabric the recipe states (PD on a cluster)
    # Replicas whose own command line could not be read (an attached deployment on another
    # machine or of another user): "ROLE REPLICA" -> why.  Their claims are not determined.
    argv_unread: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Options:
    request_timeout_s: float = 120.0
    health_timeout_s: float = 5.0
    max_tokens: int = 1024
    finish_reasons: tuple[str, ...] = ("stop", "length")
    pd_prompt_words: int = 300
    api_key: str | None = None  # sent as a bearer token with verify's requests


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0


def long_prompt(words: int) -> str:
    nonce = secrets.token_hex(8)
    body = " ".join(_WORDS[(i * 7 + len(nonce)) % len(_WORDS)] for i in range(words))
    return f"verify {nonce}: {body}"


def completion(
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    timeout: float,
    api_key: str | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """(response body, error).  Non-streaming; the timeout bounds the whole request.  A
    401/403 raises ``auth.ApiKeyError``: a missing key is the caller's, not a failure of
    the server to judge."""
    try:
        resp = http.post_json(
            url + "/v1/completions",
            {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
            timeout=timeout,
            headers=auth.headers(api_key),
        )
    except http.HTTPError as e:
        return None, str(e)
    if auth.is_rejection(resp.status):
        raise auth.rejected(resp.status, url + "/v1/completions", api_key)
    if resp.status != 200:
        return None, f"HTTP {resp.status}: {resp.text[:300]}"
    try:
        body = resp.json()
    except ValueError:
        return None, f"HTTP 200 with a body that is not JSON: {resp.text[:200]}"
    return body, ""


def _smoke_finding(
    what: str,
    body: dict[str, Any] | None,
    error: str,
    seconds: float,
    opts: Options,
    entry: str,
) -> Finding:
    if body is None:
        return C.SMOKE.finding(
            Severity.FAIL,
            "entry",
            f"{what} through {entry} failed after {seconds:.1f} s: {error}",
            evidence={"error": error, "seconds": seconds},
        )
    choice = (body.get("choices") or [{}])[0]
    text = choice.get("text") or ""
    reason = choice.get("finish_reason")
    usage = body.get("usage") or {}
    ev = {"seconds": seconds, "finish_reason": reason, "usage": usage, "text": text[:200]}
    if not text.strip():
        return C.SMOKE.finding(
            Severity.FAIL, "entry", f"{what}: the completion is empty", evidence=ev
        )
    if reason not in opts.finish_reasons:
        return C.SMOKE.finding(
            Severity.FAIL,
            "entry",
            f"{what}: finish_reason {reason!r}, expected one of {', '.join(opts.finish_reasons)}",
            evidence=ev,
        )
    return C.SMOKE.finding(
        Severity.PASS,
        "entry",
        f"{what}: {usage.get('completion_tokens')} tokens in {seconds:.1f} s, "
        f"finish_reason {reason}",
        evidence=ev,
    )


def _reachable(t: Target, opts: Options) -> Finding:
    alive = t.alive()
    if alive is False:
        extra = t.describe()
        return C.REACHABLE.finding(
            Severity.FAIL,
            t.name,
            f"{t.name}: the process is not running{(' (' + extra + ')') if extra else ''}",
            evidence={"url": t.url},
        )
    t0 = time.monotonic()
    try:
        resp = http.get(t.url + "/health", timeout=opts.health_timeout_s)
        ok, why = resp.status == 200, f"HTTP {resp.status}"
    except http.HTTPError as e:
        ok, why = False, str(e)
    waited = time.monotonic() - t0
    if ok:
        return C.REACHABLE.finding(
            Severity.PASS,
            t.name,
            f"{t.name}: /health answered in {1000 * waited:.0f} ms",
            evidence={"url": t.url, "seconds": waited},
        )
    extra = t.describe()  # after the failure, which may have told the backend more (a forward)
    return C.REACHABLE.finding(
        Severity.FAIL,
        t.name,
        f"{t.name}: did not answer /health within {opts.health_timeout_s:g} s ({why})"
        + (f"; process: {extra}" if extra else ""),
        evidence={"url": t.url, "seconds": waited, "error": why},
    )


def _scrape_all(
    engines: Sequence[Target], opts: Options, phase: str
) -> tuple[dict[str, Snapshot], list[Finding]]:
    snaps: dict[str, Snapshot] = {}
    findings: list[Finding] = []
    for t in engines:
        try:
            snaps[t.name] = scrape_replicas(
                [t.counters_url, *t.replica_metrics_urls], timeout=opts.health_timeout_s
            )
        except ScrapeError as e:
            findings.append(
                C.REACHABLE.finding(
                    Severity.FAIL,
                    t.name,
                    f"{t.name}: could not read /metrics {phase} the window: {e}",
                    evidence={"url": t.counters_url, "error": str(e)},
                )
            )
    return snaps, findings


def run(targets: Sequence[Target], claims: Claims, opts: Options | None = None) -> Report:
    opts = opts or Options()
    t_start = time.monotonic()
    rep = Report()
    f = rep.findings
    engines = [t for t in targets if t.kind == "engine"]
    names = {t.name for t in engines}

    f += C.check_spec_symmetry({t.name: t.argv for t in engines if t.argv})
    reach = [_reachable(t, opts) for t in targets]
    f += reach
    blocked = [x.subject for x in reach if x.failed]

    if not blocked:
        before, errs = _scrape_all(engines, opts, "before")
        f += errs
        if not errs:
            for t in engines:
                need = list(vllm.REQUIRED_METRICS)
                if claims.topology == "pd":
                    need += vllm.PD_METRICS
                if claims.speculative and t.name in ("mixed", "decode"):
                    need += vllm.SPEC_METRICS
                # A role that claims speculation but exports none is judged by SB303.
                present = [n for n in need if n not in vllm.SPEC_METRICS]
                f += C.check_metrics_present(t.name, before[t.name], present)
            prompt_tokens: list[int] = []
            t0 = time.monotonic()
            body, err = completion(
                claims.entry_url,
                claims.served_model_name,
                "Say hello to servebook.",
                opts.max_tokens,
                opts.request_timeout_s,
                opts.api_key,
            )
            f.append(
                _smoke_finding(
                    "smoke completion", body, err, time.monotonic() - t0, opts, claims.entry_url
                )
            )
            if body is not None:
                prompt_tokens.append(int((body.get("usage") or {}).get("prompt_tokens") or 0))
            if claims.topology == "pd" and body is not None:
                t0 = time.monotonic()
                body2, err2 = completion(
                    claims.entry_url,
                    claims.served_model_name,
                    long_prompt(opts.pd_prompt_words),
                    16,
                    opts.request_timeout_s,
                    opts.api_key,
                )
                f.append(
                    _smoke_finding(
                        "PD handoff probe (long prompt)",
                        body2,
                        err2,
                        time.monotonic() - t0,
                        opts,
                        claims.entry_url,
                    )
                )
                if body2 is not None:
                    prompt_tokens.append(int((body2.get("usage") or {}).get("prompt_tokens") or 0))
            after, errs = _scrape_all(engines, opts, "after")
            f += errs
            both = {n for n in names if n in before and n in after}
            w = C.Window(before=before, after=after, prompt_tokens=prompt_tokens)
            if (
                claims.topology == "pd"
                and {"prefill", "decode"} <= both
                and len(prompt_tokens) == 2
            ):
                f += C.check_handoff("prefill", "decode", w)
            if claims.speculative:
                for role in ("mixed", "decode"):
                    if role in both:
                        f += C.check_speculation(role, w)
            for n in sorted(both):
                f += C.check_outcomes(n, w)
            rep.measured["prompt_tokens"] = prompt_tokens
    else:
        f.append(
            C.SMOKE.finding(
                Severity.FAIL,
                "entry",
                "no request sent: role(s) " + ", ".join(blocked) + " did not answer, so a "
                "request would only wait for its timeout",
            )
        )

    # Logs last: after a failure they say what really happened.
    sigs: list[Finding] = []
    for t in targets:
        if t.log is not None:
            sigs += C.check_logs(t.name, t.log())
    if sigs:
        f += sigs
    elif any(t.log is not None for t in targets):
        f.append(C.LOGS.finding(Severity.PASS, "all", "no known failure signature in the logs"))
    if claims.topology == "pd":
        # The transport the KV connector used, as its own log says, against the fabric
        # the recipe states (SB309): RDMA claimed and TCP used is the silent slow path.
        for t in engines:
            if t.log is not None and t.name in ("prefill", "decode"):
                f += C.check_kv_transport(t.name, claims.fabric, t.log())
    rep.elapsed_s = time.monotonic() - t_start
    return rep
