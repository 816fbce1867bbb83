"""Verify checks (SB3xx): pure functions from server-side evidence to Findings.

The evidence is counters read before and after a window in which verify sent its own
requests.  Nothing here does I/O, so each rule is pinned by unit tests over Prometheus
text captured from a real vLLM server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servebook.engines import fabrics, vllm
from servebook.engines.cmdline import (
    EngineCommand,
    compare_speculative,
    parse_argv,
    parse_engine_args,
    speculative_config,
)
from servebook.engines.handoff import (
    block_size,
    handoff_not_judged,
    handoff_required_tokens,
    transferred_tokens,
)
from servebook.engines.vllm import M, speculation_problem
from servebook.findings import Finding, Severity, register
from servebook.metrics.scrape import Snapshot, delta

# Decided in servebook.verify.smoke, which sends the requests and probes the roles.
SMOKE = register(
    "SB301",
    "A real generation completes through the entry point",
    "A deployment can be Ready with every health check green and still not answer: the "
    "field notes' pd-spec deployment hung with pods Ready until the client's own timeout "
    "(45 minutes). Only a completed generation is evidence that it serves.",
    "Read the failing role's log (`servebook status`, then the log path); the message "
    "names the role and the HTTP status or timeout.",
)
REACHABLE = register(
    "SB305",
    "Every role answers within its timeout",
    "A probe without a bound hangs (field notes: 45 minutes); a probe whose port cannot "
    "be reached must fail, never pass silently (a taken port-forward once printed nothing "
    "and exited 0).",
    "Check the role's process (`servebook status`) and its log; a stopped (SIGSTOP) or "
    "overloaded engine does not answer /health.",
)


@dataclass(frozen=True)
class Window:
    """Counters of every engine role before and after verify's requests."""

    before: Mapping[str, Snapshot]
    after: Mapping[str, Snapshot]
    # Prompt lengths (server-counted tokens) of the requests verify sent in the window.
    prompt_tokens: Sequence[int] = ()
    # Each role's replica names, in the order its snapshots tag them (REPLICA_LABEL).
    replica_names: Mapping[str, Sequence[str]] = field(default_factory=dict)


def _fmt_share(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


METRICS = register(
    "SB306",
    "The engine exposes the metrics verify decides from",
    "An absent metric read as zero turns 'cannot tell' into a verdict. Metrics are absent "
    "on engines that are not vLLM, too old, or started with --disable-log-stats.",
    "Use a vLLM version that exports the metric (see the message) and do not pass "
    "--disable-log-stats.",
)


def check_metrics_present(role: str, snap: Snapshot, names: Sequence[str]) -> list[Finding]:
    missing = [n for n in names if not snap.has(n)]
    if missing:
        return [
            METRICS.finding(
                Severity.FAIL,
                role,
                f"{role}: metric(s) absent from /metrics: {', '.join(missing)}. Cannot "
                "decide from counters that are not there (not vLLM, too old, or "
                "--disable-log-stats).",
                evidence={"missing": missing, "url": snap.url},
            )
        ]
    return [METRICS.finding(Severity.PASS, role, f"{role}: all {len(names)} metrics present")]


HANDOFF = register(
    "SB302",
    "PD handoff: decode received the prompt's KV cache from prefill",
    "A PD deployment whose KV handoff fails open still answers, because decode silently "
    "recomputes the prompt, and it even looks faster. Only decode's counters of prompt "
    "tokens that arrived by KV transfer show the handoff happened.",
    "Check that both roles use the same KV connector settings (connector, storage or "
    "transfer endpoint, block size) and that the router sends prefill first.",
)


def check_handoff(prefill: str, decode: str, w: Window) -> list[Finding]:
    """Share of decode's prompt tokens that arrived by KV transfer, against the share the
    connector's whole-block transfer guarantees for verify's own prompts."""
    b, a = w.before[decode], w.after[decode]
    prompt = delta(b, a, M.PROMPT_TOKENS)
    by_transfer = delta(b, a, M.PROMPT_TOKENS_BY_SOURCE, source=vllm.SOURCE_EXTERNAL)
    hits = delta(b, a, M.EXTERNAL_PREFIX_HITS)
    queries = delta(b, a, M.EXTERNAL_PREFIX_QUERIES)
    resets = [d.name for d in (prompt, by_transfer, hits, queries) if d.reset]
    if resets:
        return [
            HANDOFF.finding(
                Severity.FAIL,
                decode,
                f"{decode}: counters went backwards during the window ({', '.join(resets)}): "
                "the decode server restarted; the handoff cannot be judged from this window.",
                evidence={"reset": resets},
            )
        ]
    transferred = transferred_tokens(by_transfer.value, hits.value)
    total = prompt.value if prompt.value is not None else queries.value
    if transferred is None or not total:
        return [
            HANDOFF.finding(
                Severity.ERROR if transferred is None else Severity.FAIL,
                decode,
                f"{decode}: no evidence of the handoff: "
                + (
                    "the external prefix cache counters are absent"
                    if transferred is None
                    else "decode counted no prompt tokens in the window (did the requests "
                    "reach it?)"
                ),
                evidence={"prompt_tokens": total, "transferred": transferred},
            )
        ]
    block = block_size(a)
    required = handoff_required_tokens(w.prompt_tokens, block)
    share = transferred / total
    threshold = required / total
    evidence = {
        "transferred_tokens": transferred,
        "prompt_tokens": total,
        "share": share,
        "threshold": threshold,
        "block_size": block,
        "verify_prompt_tokens": list(w.prompt_tokens),
        "external_hit_rate": (
            hits.value / queries.value if hits.value is not None and queries.value else None
        ),
    }
    return [
        _decode_finding(decode, transferred, total, required, block, w, evidence),
        _prefill_finding(prefill, transferred, w),
    ]


def _decode_finding(
    decode: str,
    transferred: float,
    total: float,
    required: int,
    block: int,
    w: Window,
    evidence: dict[str, Any],
) -> Finding:
    """Whether decode received at least the tokens the whole-block transfer guarantees."""
    share = transferred / total
    threshold = required / total
    if required == 0:
        return HANDOFF.finding(
            Severity.ERROR,
            decode,
            f"{decode}: {handoff_not_judged(block)}; verify's prompts had "
            f"{', '.join(str(n) for n in w.prompt_tokens)}.",
            evidence=evidence,
        )
    if transferred < required:
        return HANDOFF.finding(
            Severity.FAIL,
            decode,
            f"{decode}: only {transferred:.0f} of {total:.0f} prompt tokens "
            f"({_fmt_share(share)}) arrived by KV transfer; at least {required} "
            f"({_fmt_share(threshold)}, whole {block}-token blocks less one per request) "
            "were expected. The handoff failed open: decode recomputed the prompt.",
            evidence=evidence,
        )
    return HANDOFF.finding(
        Severity.PASS,
        decode,
        f"{decode}: {transferred:.0f} of {total:.0f} prompt tokens "
        f"({_fmt_share(share)}) arrived by KV transfer (threshold "
        f"{_fmt_share(threshold)})",
        evidence=evidence,
    )


def _prefill_finding(prefill: str, transferred: float, w: Window) -> Finding:
    """Prefill must have computed what decode received."""
    pb, pa = w.before[prefill], w.after[prefill]
    computed = delta(pb, pa, M.PROMPT_TOKENS_BY_SOURCE, source=vllm.SOURCE_LOCAL_COMPUTE)
    cached = delta(pb, pa, M.PROMPT_TOKENS_BY_SOURCE, source=vllm.SOURCE_LOCAL_CACHE)
    if computed.value is None:
        computed = delta(pb, pa, M.PROMPT_TOKENS)
    done = (computed.value or 0) + (cached.value or 0)
    pev = {"prefill_prompt_tokens": done, "decode_transferred_tokens": transferred}
    if computed.value is None or computed.reset:
        return HANDOFF.finding(
            Severity.ERROR, prefill, f"{prefill}: prompt token counters unusable", evidence=pev
        )
    if done < transferred:
        return HANDOFF.finding(
            Severity.FAIL,
            prefill,
            f"{prefill}: prefill processed {done:.0f} prompt tokens but decode received "
            f"{transferred:.0f} by transfer: the KV did not come from this prefill role.",
            evidence=pev,
        )
    return HANDOFF.finding(
        Severity.PASS,
        prefill,
        f"{prefill}: computed {done:.0f} prompt tokens, covering what decode received",
        evidence=pev,
    )


SPECULATION = register(
    "SB303",
    "Speculative decoding is engaged where the recipe claims it",
    "Speculation that is configured but not running makes every speculative figure a "
    "baseline figure with the wrong label; disabling speculation also hides the "
    "speculation-related crashes it was meant to test (field notes).",
    "Check the serving role's --speculative-config and the draft model path; the role's "
    "vllm:spec_decode_* counters must grow under traffic.",
)


def check_speculation(role: str, w: Window) -> list[Finding]:
    b, a = w.before[role], w.after[role]
    drafts = delta(b, a, M.SPEC_DRAFTS)
    draft_tokens = delta(b, a, M.SPEC_DRAFT_TOKENS)
    accepted = delta(b, a, M.SPEC_ACCEPTED_TOKENS)
    ev = {
        "drafts": drafts.value,
        "draft_tokens": draft_tokens.value,
        "accepted_tokens": accepted.value,
    }
    if drafts.value is None and not drafts.reset:
        return [
            SPECULATION.finding(
                Severity.FAIL,
                role,
                f"{role}: the recipe claims speculative decoding, but the role exports no "
                f"{M.SPEC_DRAFTS}: speculation is not configured on this role.",
                evidence=ev,
            )
        ]
    if drafts.reset or draft_tokens.reset:
        return [
            SPECULATION.finding(
                Severity.FAIL,
                role,
                f"{role}: speculation counters went backwards: the server restarted.",
                evidence=ev,
            )
        ]
    problem = speculation_problem(draft_tokens.value, accepted.value)
    if not drafts.value or not draft_tokens.value:
        return [
            SPECULATION.finding(
                Severity.FAIL,
                role,
                f"{role}: {problem or 'speculation is not engaged'} under verify's traffic "
                f"({drafts.value or 0:.0f} drafts).",
                evidence=ev,
            )
        ]
    rate = (accepted.value or 0) / draft_tokens.value
    ev["acceptance_rate"] = rate
    # Nothing accepted fails a bench point (SB413); verify's few requests only warn.
    sev = Severity.PASS if problem is None else Severity.WARN
    return [
        SPECULATION.finding(
            sev,
            role,
            f"{role}: {drafts.value:.0f} drafts, {draft_tokens.value:.0f} draft tokens, "
            f"{accepted.value or 0:.0f} accepted (acceptance {_fmt_share(rate)})",
            evidence=ev,
        )
    ]


OUTCOMES = register(
    "SB304",
    "No request in the window ended in error or abort",
    "Errors and aborts are requests a user did not get an answer to; a verify that only "
    "looks at the last response misses them.",
    "Read the role's log around the window for the failing requests.",
)


def check_outcomes(role: str, w: Window) -> list[Finding]:
    b, a = w.before[role], w.after[role]
    bad = {r: delta(b, a, M.REQUEST_SUCCESS, finished_reason=r) for r in vllm.BAD_FINISH_REASONS}
    preempt = delta(b, a, M.PREEMPTIONS)
    ev: dict[str, object] = {r: d.value for r, d in bad.items()}
    ev["preemptions"] = preempt.value
    out = []
    failing = {r: d.value for r, d in bad.items() if d.value}
    if any(d.reset for d in bad.values()):
        out.append(
            OUTCOMES.finding(
                Severity.FAIL,
                role,
                f"{role}: counters went backwards: the server restarted",
                evidence=ev,
            )
        )
    elif failing:
        out.append(
            OUTCOMES.finding(
                Severity.FAIL,
                role,
                f"{role}: requests finished with "
                + ", ".join(f"{r}: {v:.0f}" for r, v in failing.items())
                + " in the window",
                evidence=ev,
            )
        )
    else:
        out.append(
            OUTCOMES.finding(
                Severity.PASS,
                role,
                f"{role}: no error or abort; preemptions: "
                + ("n/a" if preempt.value is None else f"{preempt.value:.0f}"),
                evidence=ev,
            )
        )
    if preempt.value:
        out.append(
            OUTCOMES.finding(
                Severity.WARN,
                role,
                f"{role}: {preempt.value:.0f} preemption(s) in the window: the KV cache is too "
                "small for this load, latency figures will include recomputation.",
                evidence=ev,
            )
        )
    return out


SPEC_SYMMETRY = register(
    "SB308",
    "Speculative config identical on every role that runs the model",
    "With speculation on decode only, decode registers draft layers prefill never "
    "computes: it crashes or hangs on the first handoff, with pods Ready (field notes: "
    "pd-spec).",
    "Define speculation once (the recipe's `speculative:`) so every role gets the same "
    "--speculative-config.",
)


def role_command(argv: Sequence[str]) -> EngineCommand:
    """A role's full command line as the engine reads it (a bare list of engine flags
    too): the one reader lint uses (``engines.cmdline``)."""
    return parse_argv(argv) or parse_engine_args(argv, positional_model=False)


def check_spec_symmetry(argv_by_role: Mapping[str, Sequence[str]]) -> list[Finding]:
    """Compare the speculative config each engine role (or replica) was actually started
    with, by the rule lint's SB105 uses (``cmdline.compare_speculative``): identical, the
    draft's absolute path aside."""
    cfgs: dict[str, dict[str, Any] | None] = {}
    unparsed: dict[str, str] = {}
    for r, argv in argv_by_role.items():
        cmd = role_command(argv)
        cfgs[r], error = speculative_config(cmd)
        if error is not None:
            unparsed[r] = f"unparsed ({error}): {cmd.value('--speculative-config') or ''}"
    if all(c is None for c in cfgs.values()) and not unparsed:
        return []

    def shown(r: str) -> str:
        c = cfgs[r]
        return unparsed.get(r) or ("absent" if c is None else json.dumps(c, sort_keys=True))

    subject = ",".join(cfgs)
    evidence = {"config": {r: shown(r) for r in cfgs}}
    first, *rest = list(cfgs)
    problems = [f"{r}: {unparsed[r]}" for r in cfgs if r in unparsed]
    warnings: list[str] = []
    for r in rest:
        if first in unparsed or r in unparsed:
            continue
        cmp = compare_speculative(cfgs[first], cfgs[r], (first, r))
        warnings += cmp.warnings
        if cmp.only is not None:
            missing = r if cmp.only == first else first
            problems.append(f"{missing}: absent, {cmp.only}: {shown(cmp.only)}")
        problems += list(cmp.differences)
    if not problems:
        return [
            SPEC_SYMMETRY.finding(
                Severity.WARN if warnings else Severity.PASS,
                subject,
                "identical --speculative-config on "
                + ", ".join(cfgs)
                + (f" ({'; '.join(warnings)})" if warnings else ""),
                evidence=evidence,
            )
        ]
    return [
        SPEC_SYMMETRY.finding(
            Severity.FAIL,
            subject,
            "speculative config differs between roles: "
            + "; ".join(problems)
            + ". With speculation on decode only, decode waits for or crashes on draft KV "
            "that prefill never computes.",
            evidence=evidence,
        )
    ]


LOGS = register(
    "SB307",
    "No known failure signature in the roles' logs",
    "Some failures read as something else: a decode engine dying on a missing draft-model "
    "KV file reads as HTTP 500, an empty model directory reads as a bad model name. The "
    "log line says what really happened.",
    "Follow the fix in the message; it is specific to the signature found.",
)


def check_logs(role: str, log_text: str) -> list[Finding]:
    out = []
    for sig, line in vllm.match_log(log_text):
        out.append(
            LOGS.finding(
                Severity.FAIL,
                role,
                f"{role}: {sig.meaning}. Log: {line[:300]}",
                hint=sig.fix,
                evidence={"signature": sig.id, "line": line},
            )
        )
    return out


KV_TRANSPORT = register(
    "SB309",
    "PD KV transfer uses the transport the recipe's fabric claims",
    "With no RDMA device, or one the transport library cannot use, NIXL does not fail: it "
    "moves the KV cache over TCP through host memory, and the handoff still succeeds, so "
    "every counter check passes while time to first token is up to hundreds of times "
    "worse (NVIDIA Dynamo's guide measured ~98 s). Only the transport library's own log "
    "lines say which transport each endpoint uses.",
    "Check the Pod got its RDMA devices and interfaces (`kubectl describe pod`, "
    "`ls /dev/infiniband` in the engine container), that UCX sees them (`ucx_info -d`), "
    "and that the fabric parameter matches the cluster's network; or render with "
    "fabric=tcp and allow_tcp_kv=true if TCP is intended.",
)


def check_kv_transport(role: str, fabric: str | None, log_text: str) -> list[Finding]:
    """The KV transport a PD engine's log says its connector used, against the transport
    its recipe's fabric claims (``fabric``: the recipe's ``fabric`` parameter; None: the
    recipe claims none, nothing to check).  A log that does not say (UCX_LOG_LEVEL below
    info, no transfer yet) is a warning, never a pass."""
    claimed = fabrics.claimed_transport(fabric)
    if claimed is None:
        return []
    seen = vllm.kv_transport(log_text)
    ev: dict[str, object] = {
        "fabric": fabric,
        "claimed": claimed,
        "seen": seen.transport,
        "lines": list(seen.lines),
    }
    if seen.transport is None:
        return [
            KV_TRANSPORT.finding(
                Severity.WARN,
                role,
                f"{role}: the log does not say which transport the KV connector used (fabric "
                f"'{fabric}' claims {claimed}); UCX reports it at UCX_LOG_LEVEL=info, NIXL's "
                "libfabric backend at NIXL_LOG_LEVEL=INFO, once an endpoint connects.",
                hint="Render with servebook's fabric profiles (they set the log levels) and "
                "verify after at least one PD request.",
                evidence=ev,
            )
        ]
    line = seen.lines[0][:300] if seen.lines else ""
    if claimed == "rdma" and seen.transport == "tcp":
        return [
            KV_TRANSPORT.finding(
                Severity.FAIL,
                role,
                f"{role}: fabric '{fabric}' claims RDMA, but the KV connector moves KV over "
                f"TCP. Log: {line}",
                evidence=ev,
            )
        ]
    return [
        KV_TRANSPORT.finding(
            Severity.PASS,
            role,
            f"{role}: KV transfer over {seen.transport} (fabric '{fabric}' claims {claimed}). "
            f"Log: {line}",
            evidence=ev,
        )
    ]
