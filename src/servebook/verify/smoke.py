"""Run verify against a deployment: read counters, send verify's own requests, read
counters again, and judge (checks in ``verify.checks``).

Every network call has an explicit timeout, and a role that does not answer stops the
traffic phase early, so verify's total time is bounded by its options, never by a hang.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servebook import auth, http
from servebook.deployment.view import Claims, RoleView
from servebook.engines import vllm
from servebook.findings import Finding, Severity
from servebook.metrics.scrape import ScrapeError, Snapshot, delta, scrape_replicas, split_replicas
from servebook.verify import checks as C
from servebook.verify import rules as R

if TYPE_CHECKING:
    from servebook.deployment.view import DeploymentView

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


def _reachable(t: RoleView, opts: Options) -> Finding:
    alive = t.alive()
    if alive is False:
        extra = t.describe()
        return C.REACHABLE.finding(
            Severity.FAIL,
            t.name,
            f"{t.name}: the process is not running{(' (' + extra + ')') if extra else ''}",
            evidence={"url": t.api_url},
        )
    t0 = time.monotonic()
    try:
        resp = http.get(t.api_url + "/health", timeout=opts.health_timeout_s)
        ok, why = resp.status == 200, f"HTTP {resp.status}"
    except http.HTTPError as e:
        ok, why = False, str(e)
    waited = time.monotonic() - t0
    if ok:
        return C.REACHABLE.finding(
            Severity.PASS,
            t.name,
            f"{t.name}: /health answered in {1000 * waited:.0f} ms",
            evidence={"url": t.api_url, "seconds": waited},
        )
    extra = t.describe()  # after the failure, which may have told the backend more (a forward)
    return C.REACHABLE.finding(
        Severity.FAIL,
        t.name,
        f"{t.name}: did not answer /health within {opts.health_timeout_s:g} s ({why})"
        + (f"; process: {extra}" if extra else ""),
        evidence={"url": t.api_url, "seconds": waited, "error": why},
    )


def _scrape_all(
    engines: Sequence[RoleView], opts: Options, phase: str
) -> tuple[dict[str, Snapshot], list[Finding]]:
    snaps: dict[str, Snapshot] = {}
    findings: list[Finding] = []
    for t in engines:
        try:
            snaps[t.name] = scrape_replicas(t.all_metrics_urls, timeout=opts.health_timeout_s)
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


def _replicas_served(t: RoleView, before: Snapshot, opts: Options) -> bool:
    """Whether every replica of ``t`` counted prompt tokens since ``before`` (a replica's
    scrape failing reads as not yet)."""
    try:
        now = scrape_replicas(t.all_metrics_urls, timeout=opts.health_timeout_s)
    except ScrapeError:
        return False
    return all(
        (delta(b, a, vllm.M.PROMPT_TOKENS).value or 0) > 0
        for b, a in zip(split_replicas(before), split_replicas(now), strict=False)
    )


def _probe(claims: Claims, opts: Options, what: str) -> tuple[dict[str, Any] | None, Finding]:
    t0 = time.monotonic()
    body, err = completion(
        claims.entry_url,
        claims.served_model_name,
        long_prompt(opts.pd_prompt_words)
        if what != "smoke completion"
        else "Say hello to servebook.",
        opts.max_tokens if what == "smoke completion" else 16,
        opts.request_timeout_s,
        opts.api_key,
    )
    return body, _smoke_finding(what, body, err, time.monotonic() - t0, opts, claims.entry_url)


def _traffic(
    engines: Sequence[RoleView], claims: Claims, opts: Options, before: dict[str, Snapshot]
) -> tuple[list[int], list[Finding]]:
    """verify's own requests: a smoke completion, and for PD long prompts that must reach
    decode by KV transfer, repeated (up to three per decode replica) until every decode
    replica has served one, so each replica's handoff can be judged."""
    findings: list[Finding] = []
    prompt_tokens: list[int] = []
    body, finding = _probe(claims, opts, "smoke completion")
    findings.append(finding)
    if body is None:
        return prompt_tokens, findings
    prompt_tokens.append(int((body.get("usage") or {}).get("prompt_tokens") or 0))
    if claims.topology != "pd":
        return prompt_tokens, findings
    decode = next((t for t in engines if t.name == "decode"), None)
    replicas = len(decode.all_metrics_urls) if decode is not None else 1
    for i in range(3 * replicas if replicas > 1 else 1):
        body, finding = _probe(claims, opts, "PD handoff probe (long prompt)")
        if body is None or i == 0:
            findings.append(finding)
        if body is None:
            break
        prompt_tokens.append(int((body.get("usage") or {}).get("prompt_tokens") or 0))
        if decode is None or replicas == 1:
            break
        if i + 1 >= replicas and _replicas_served(decode, before[decode.name], opts):
            break
    return prompt_tokens, findings


def verify(view: DeploymentView, opts: Options | None = None) -> Report:
    """verify over a deployment's view: its roles, what it claims."""
    return run(view.roles, view.claims(), opts)


def run(targets: Sequence[RoleView], claims: Claims, opts: Options | None = None) -> Report:
    """Every registered check (``verify.rules``) over what the deployment says of itself,
    what it does under verify's own requests, and what its logs say."""
    opts = opts or Options()
    t_start = time.monotonic()
    rep = Report()
    f = rep.findings
    engines = [t for t in targets if t.kind == "engine"]

    for _, on_commands in R.COMMAND_LINE_CHECKS:
        f += on_commands(claims, targets)
    reach = [_reachable(t, opts) for t in targets]
    f += reach
    blocked = [x.subject for x in reach if x.failed]

    if not blocked:
        before, errs = _scrape_all(engines, opts, "before")
        f += errs
        if not errs:
            prompt_tokens, sent = _traffic(engines, claims, opts, before)
            f += sent
            after, errs = _scrape_all(engines, opts, "after")
            f += errs
            both = {t.name for t in engines if t.name in before and t.name in after}
            w = C.Window(
                before={n: before[n] for n in both},
                after={n: after[n] for n in both},
                prompt_tokens=prompt_tokens,
                replica_names={t.name: t.all_replica_names for t in engines},
            )
            for _, on_window in R.WINDOW_CHECKS:
                f += on_window(claims, w)
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
    logs = {t.name: (t, t.log()) for t in targets if t.log is not None}
    for _, on_log in R.LOG_CHECKS:
        for t, text in logs.values():
            f += on_log(claims, t, text)
    if logs and not any(x.check == C.LOGS.id for x in f):
        f.append(C.LOGS.finding(Severity.PASS, "all", "no known failure signature in the logs"))
    rep.elapsed_s = time.monotonic() - t_start
    return rep
