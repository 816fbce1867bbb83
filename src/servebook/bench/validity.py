"""Whether a benchmark point is valid: the SB4xx checks, one function each.

A point is valid only if every check passes; the reasons are recorded in the point
(``invalid_reasons``) and invalid points are never averaged into aggregates (MLPerf
LoadGen's VALID/INVALID with reasons).  Each check is registered beside the function that
decides it (``@VERDICTS.add(CHECK)``); ``judge`` runs every one of them on a point, in
check-id order.  A function returns ``None`` when its check does not apply to the point
(the PD handoff share of a deployment that is not PD).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servebook.engines.vllm import M, speculation_problem
from servebook.findings import Check, Finding, Rules, Severity, register
from servebook.results.schema import Point

# Ids are stable: reports and CI configs refer to them.


@dataclass(frozen=True)
class Thresholds:
    max_error_rate: float = 0.01
    # Open loop: lateness p99 (scheduled -> sent).  Closed loop: reported, not judged.
    max_send_lag_p99_ms: float = 10.0
    # Trace replay: schedule lag p99 (actual minus the trace's send time) above this fails.
    max_schedule_lag_p99_ms: float = 50.0
    max_loop_lag_p99_ms: float = 10.0  # reported, not judged (kept for the record)
    max_client_cpu: float = 0.90  # share of one core, busiest worker
    # Closed loop: achieved concurrency / level below this is a client-limited point.
    min_achieved_concurrency: float = 0.98
    require_server_evidence: bool = True
    min_handoff_share: float | None = None  # PD deployments: the verify threshold
    # PD deployments whose prompts are too short for the threshold to be above 0: why the
    # handoff cannot be judged at this length (SB407 fails, saying so).
    handoff_undecidable: str | None = None
    # A workload that shares no prefix (``prefix_hit_bound``): the most of its prompt
    # tokens the engines may find in their prefix caches (SB412).  None: not judged.
    max_prefix_hit_share: float | None = None


@dataclass(frozen=True)
class Case:
    """One point and what it is judged against."""

    point: Point
    duration_s: float
    min_requests: int
    thresholds: Thresholds
    pd: bool = False
    stop_reason: str | None = None
    speculative: bool = False  # the deployment claims speculative decoding (SB413)


@dataclass(frozen=True)
class Verdict:
    """One check's answer on one point: failed or not, and why."""

    failed: bool
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


VERDICTS: Rules[Callable[[Case], Verdict | None]] = Rules()


def judge(
    point: Point,
    *,
    duration_s: float,
    min_requests: int,
    thresholds: Thresholds,
    pd: bool = False,
    stop_reason: str | None = None,
    speculative: bool = False,
) -> list[Finding]:
    """Every SB4xx check on one point; a FAIL makes the point invalid."""
    case = Case(point, duration_s, min_requests, thresholds, pd, stop_reason, speculative)
    subject = (
        f"c={point.concurrency}" if point.concurrency is not None else f"rate={point.rate:g}/s"
    ) + f" rep {point.repetition}"
    out: list[Finding] = []
    for check, decide in VERDICTS:
        v = decide(case)
        if v is not None:
            severity = Severity.FAIL if v.failed else Severity.PASS
            out.append(check.finding(severity, subject, v.message, evidence=v.evidence))
    return out


WINDOW_SHORT = register(
    "SB401",
    "Measurement window at least the required duration",
    "A short window is dominated by its edges: at 32 requests over ~15 s the first "
    "request's TTFT (2.5 s cold, 0.4 s warm) decided the published number, and independent "
    "runs got 166 and 270 tok/s against a published 242 (field notes). A window cut short "
    "(the server died, the point hit its time limit) measures something else.",
    "Run the point again with a longer --duration, or find out why it ended early (the "
    "point's errors and the server's log say whether the server stopped answering).",
)


@VERDICTS.add(WINDOW_SHORT)
def window_long_enough(case: Case) -> Verdict:
    win = case.point.window.duration_s or 0.0
    stopped = case.stop_reason and win < case.duration_s
    why = f" (the load stopped: {case.stop_reason})" if stopped else ""
    return Verdict(
        win + 1e-6 < case.duration_s,
        f"window {win:.1f} s of the required {case.duration_s:g} s{why}",
        dict(window_s=win, required_s=case.duration_s),
    )


TOO_FEW_REQUESTS = register(
    "SB402",
    "Enough requests scheduled and finished inside the window",
    "Percentiles of a handful of requests are noise: p99 of 30 requests is the largest "
    "one. Only requests that start and finish inside the window are steady-state.",
    "Raise --duration or lower --min-requests deliberately (both are recorded); at high "
    "concurrency with long outputs the window must be long enough for whole requests.",
)


@VERDICTS.add(TOO_FEW_REQUESTS)
def enough_requests(case: Case) -> Verdict:
    ok = case.point.requests_ok
    return Verdict(
        ok < case.min_requests,
        f"{ok} requests scheduled and finished inside the window, {case.min_requests} required",
        dict(requests_ok=ok, required=case.min_requests),
    )


ERROR_RATE = register(
    "SB403",
    "Error rate in the window at most the threshold (1%)",
    "Failed requests return fast; a benchmark that drops them from the percentiles reports "
    "better latency exactly when the server is failing. Errors are counted, never dropped, "
    "and a point with more than 1% of them does not describe a working server.",
    "Read the point's error_samples and the server's log; lower the load if the server "
    "rejects requests (queue full, KV cache exhausted, timeouts).",
)


@VERDICTS.add(ERROR_RATE)
def error_rate_low(case: Case) -> Verdict:
    point, max_rate = case.point, case.thresholds.max_error_rate
    total = point.requests_ok + point.errors
    rate = point.errors / total if total else 0.0
    return Verdict(
        total == 0 or rate > max_rate,
        (
            f"{point.errors} of {total} requests failed ({100 * rate:.1f}%, threshold "
            f"{100 * max_rate:g}%)"
            if total
            else "no request finished inside the window"
        )
        + (f"; first error: {point.error_samples[0]}" if point.error_samples else ""),
        dict(errors=point.errors, total=total),
    )


CLIENT_LAG = register(
    "SB404",
    "Client kept the load it was asked for (closed loop: achieved concurrency at least 98% "
    "of the level; open loop: requests sent on schedule)",
    "A client that cannot keep up quietly lowers the load: in closed loop fewer requests "
    "are in flight than the level says (the point is labelled c=64 while the server saw "
    "c=50), in open loop requests go out late. Judged by what it harms, the time-weighted "
    "mean of requests in flight over the window, not by send lag alone: streams that end "
    "together and restart a few event-loop turns later cost the load almost nothing.",
    "Run the client with more load agents (--agents) or on a machine with free "
    "cores, away from the server; if the point says requests waited for prompts, use "
    "--prompt-format ids or a local --tokenizer; see benchmarks/client_capacity.py for what "
    "one client core sustains.",
)


@VERDICTS.add(CLIENT_LAG)
def client_kept_load(case: Case) -> Verdict:
    """Closed loop: the achieved concurrency against the level; open loop: the lateness of
    sends against the schedule.  Send lag and event-loop lag are reported beside it."""
    point, thresholds = case.point, case.thresholds
    c = point.client
    lag = f"send lag p99 {c.send_lag_p99_ms:.1f} ms" if c.send_lag_p99_ms is not None else None
    loop = (
        f"event-loop lag p99 {c.loop_lag_p99_ms:.1f} ms" if c.loop_lag_p99_ms is not None else None
    )
    waits = f"{c.prompt_waits} request(s) waited for their prompt" if c.prompt_waits else None
    ran_out = "the prompts built before the point ran out" if c.prompts_ran_out else None
    notes = "".join(f"; {x}" for x in (lag, loop, waits, ran_out) if x)
    if point.concurrency is not None:
        target = c.target_concurrency or point.concurrency
        got = c.achieved_concurrency
        if got is None:
            return Verdict(False, "achieved concurrency unknown (no window)" + notes)
        share = got / target
        if share < thresholds.min_achieved_concurrency:
            return Verdict(
                True,
                f"client-limited: achieved concurrency {got:.1f} of {target} "
                f"({100 * share:.1f}%, below {100 * thresholds.min_achieved_concurrency:g}%)"
                + notes,
            )
        return Verdict(
            False, f"achieved concurrency {got:.1f} of {target} ({100 * share:.1f}%)" + notes
        )
    # A replay's lateness is judged against its own bound (SB411).
    late = (
        c.send_lag_p99_ms is not None
        and c.send_lag_p99_ms > thresholds.max_send_lag_p99_ms
        and c.schedule_lag_p99_ms is None
    )
    rate = (
        f"offered {c.offered_rate:.2f} req/s of {point.rate:g}"
        if c.offered_rate is not None
        else ""
    )
    head = (
        f"client-limited: requests went out late (lateness p99 {c.send_lag_p99_ms:.1f} ms, "
        f"threshold {thresholds.max_send_lag_p99_ms:g} ms)"
        if late
        else "requests sent on schedule"
    )
    extra = "; ".join(x for x in (rate, loop, waits, ran_out) if x)
    return Verdict(late or c.prompts_ran_out, head + (f"; {extra}" if extra else ""))


CLIENT_CPU = register(
    "SB405",
    "Client CPU below the saturation threshold",
    "A client process near 100% of a core cannot read every stream promptly: token "
    "timestamps slip and ITL spreads out, while the server is blameless. The client is "
    "then the limit of the point even when it still keeps its streams open.",
    "Use more load agents (--agents), pin the client away from the server's "
    "cores, or lower the concurrency per worker.",
)


@VERDICTS.add(CLIENT_CPU)
def client_cpu_below_saturation(case: Case) -> Verdict:
    c, max_cpu = case.point.client, case.thresholds.max_client_cpu
    return Verdict(
        c.cpu_fraction > max_cpu,
        ("client-limited: its core was saturated: " if c.cpu_fraction > max_cpu else "")
        + f"busiest client worker used {100 * c.cpu_fraction:.0f}% of a core "
        f"(threshold {100 * max_cpu:.0f}%, {c.workers} worker(s))",
        dict(cpu_fraction=c.cpu_fraction, workers=c.workers),
    )


SERVER_EVIDENCE = register(
    "SB406",
    "Server-side counters read before and after the window",
    "Without the server's own counters a point cannot show what the server did in the "
    "window (handoff share, speculative acceptance, preemptions, server-side errors), and "
    "a server restart in the window goes unnoticed.",
    "Make every role's /metrics reachable from the client (the message names the role "
    "and the error); a counter that went backwards means the role restarted mid-window.",
)


@VERDICTS.add(SERVER_EVIDENCE)
def server_counters_read(case: Case) -> Verdict | None:
    server = case.point.server or {}
    missing = list(server.get("missing", [])) if server else ["no server evidence collected"]
    if case.thresholds.require_server_evidence:
        return Verdict(
            bool(missing),
            "server evidence missing: " + "; ".join(missing)
            if missing
            else "counters read from every role before and after the window",
            dict(missing=missing),
        )
    if not missing:
        return None
    # A server without counters (not vLLM or SGLang, or metrics off): its points stand on
    # their client-side figures, and say so.
    return Verdict(
        False,
        ("no server evidence" if server.get("evidence") == "none" else "server evidence incomplete")
        + ": "
        + "; ".join(missing)
        + " (figures are the client's own; --require-server-evidence makes this invalid)",
        dict(missing=missing),
    )


HANDOFF_SHARE = register(
    "SB407",
    "PD handoff share at least the verify threshold",
    "A PD deployment whose KV handoff fails open still answers, with decode recomputing "
    "the prompt; its throughput and TTFT are then those of a different topology, labelled "
    "PD.",
    "Run `servebook verify` on the deployment; check that both roles use the same KV "
    "connector settings and that the router sends every request to prefill first. A point "
    "whose handoff was 'not judged' had prompts too short for the threshold, which allows "
    "one whole KV block of slack a request (on vLLM's CPU default of 128-token blocks it "
    "needs 258-token prompts, and ExampleConnector hands over nothing of one under 130): "
    "send longer prompts, or give every engine of every arm a smaller --block-size (the "
    'tiny recipes: --set extra_engine_args="--block-size 32").',
)


@VERDICTS.add(HANDOFF_SHARE)
def handoff_share_high(case: Case) -> Verdict | None:
    threshold = case.thresholds.min_handoff_share
    if not case.pd or threshold is None:
        return None
    share = (case.point.server or {}).get("handoff_share")
    why = case.thresholds.handoff_undecidable
    if why is not None:
        seen = "" if share is None else f"; {100 * share:.1f}% arrived by KV transfer"
        return Verdict(True, why + seen, dict(share=share, threshold=threshold))
    # Several decode replicas: each must clear the threshold on its own (one failing open
    # among four would otherwise hide in the sum).
    by_replica = (case.point.server or {}).get("handoff_share_by_replica") or {}
    low = {n: s for n, s in by_replica.items() if s is not None and s < threshold}
    if share is not None and share >= threshold and low:
        return Verdict(
            True,
            "PD handoff failed open on decode replica(s) "
            + ", ".join(f"{n} ({100 * s:.1f}%)" for n, s in low.items())
            + f" (threshold {100 * threshold:.1f}%; all replicas {100 * share:.1f}%)",
            dict(share=share, threshold=threshold, by_replica=by_replica),
        )
    return Verdict(
        share is None or share < threshold,
        "PD handoff share unknown (decode's transfer counters were not read)"
        if share is None
        else f"{100 * share:.1f}% of decode's prompt tokens arrived by KV transfer "
        f"(threshold {100 * threshold:.1f}%)",
        dict(share=share, threshold=threshold),
    )


def _length_check(
    id: str,
    title: str,
    rationale: str,
    fix: str,
    *,
    mismatched: Callable[[Point], int],
    failing: str,
    passing: str,
    unchecked: Callable[[Point], int] = lambda p: 0,
    unchecked_why: str = "",
) -> Check:
    """SB408/SB409: register a check, and its verdict, that fails a point where some
    successful requests (``mismatched`` counts them) had another length than stated, or
    where some could not be checked at all (``unchecked``): a check that could not look
    is not a pass (issue 24 point 2)."""
    check = register(id, title, rationale, fix)

    @VERDICTS.add(check)
    def lengths_as_stated(case: Case) -> Verdict:
        n, blind = mismatched(case.point), unchecked(case.point)
        if n:
            message = f"{n} successful request(s) {failing}"
        elif blind:
            message = (
                f"not judged: {blind} of {case.point.requests_ok} successful request(s) "
                f"{unchecked_why}"
            )
        else:
            message = passing
        return Verdict(n > 0 or blind > 0, message, dict(mismatched=n, unchecked=blind))

    return check


OUTPUT_LENGTH = _length_check(
    "SB408",
    "Every request produced the output length asked for",
    "Throughput and TPOT comparisons assume a fixed output length; a server that ignores "
    "ignore_eos or max_tokens (or a proxy that strips them) stops early and looks faster.",
    "Check that the server honours ignore_eos (vLLM does; some OpenAI-compatible servers "
    "do not) and that no proxy rewrites the request body.",
    mismatched=lambda p: p.output_tokens_mismatch,
    failing="returned a different number of output tokens than asked for",
    passing="every request produced the output length asked for",
)


INPUT_LENGTH = _length_check(
    "SB409",
    "Every prompt had the input length the workload states",
    "Prefill cost and TTFT scale with the prompt; when the server counts a different "
    "number of prompt tokens than the workload claims (a tokenizer that is not the "
    "deployment's, a chat template added by a proxy), the point is labelled with an input "
    "length it did not have.",
    "Pass --tokenizer the deployment's own model directory (servebook uses the "
    "deployment's by default), and check whether the server adds a chat template.",
    mismatched=lambda p: p.prompt_tokens_mismatch,
    failing="had a server-counted prompt length different from the workload's",
    passing="every prompt had the stated input length (server's count)",
    unchecked=lambda p: p.prompt_tokens_unchecked,
    unchecked_why=(
        "came back with no server count of their prompt (usage.prompt_tokens), so their "
        "stated input length was never checked"
    ),
)


SCHEDULE_LAG = register(
    "SB411",
    "A replayed trace's requests left on the trace's clock",
    "A replay measures the server under the trace's arrivals only if the requests leave "
    "when the trace says: a client that sends late smooths the bursts the trace recorded "
    "(the very load the replay is for), and the server is credited with a calmer load "
    "than production gave it.",
    "Use more load agents (--agents) or a machine with free cores for the client, or a "
    "lower --replay-speed; the bound is --max-schedule-lag-ms.",
)


@VERDICTS.add(SCHEDULE_LAG)
def replay_on_schedule(case: Case) -> Verdict | None:
    """Only a replay has a schedule lag: other points get no verdict here."""
    c, bound = case.point.client, case.thresholds.max_schedule_lag_p99_ms
    if c.schedule_lag_p99_ms is None:
        return None
    p50 = c.schedule_lag_p50_ms or 0.0
    late = c.schedule_lag_p99_ms > bound
    return Verdict(
        late,
        ("requests left late: " if late else "")
        + f"schedule lag p50 {p50:.1f} ms, p99 {c.schedule_lag_p99_ms:.1f} ms "
        f"(bound {bound:g} ms)",
        dict(p50_ms=p50, p99_ms=c.schedule_lag_p99_ms, bound_ms=bound),
    )


# A workload of distinct prompts still starts each with the server's own tokens (a chat
# template, a BOS); beyond those, this share of hits is more than chance.
PREFIX_HIT_SLACK = 0.05


def prefix_hit_bound(
    shares_prefixes: bool | None, lead_tokens: int, input_len: int
) -> float | None:
    """SB412's bound for a workload: None unless it declares that it shares no prefix;
    else ``PREFIX_HIT_SLACK`` above the share its prompts' common lead tokens can hit."""
    if shares_prefixes is not False or input_len < 1:
        return None
    return min(1.0, PREFIX_HIT_SLACK + lead_tokens / input_len)


PREFIX_CACHE = register(
    "SB412",
    "Prompts that share no prefix were not served from the prefix cache",
    "The same seed rebuilds the same prompts: a second identical bench on a warm "
    "deployment served 55-75% of its prompt tokens from vLLM's prefix cache and ran 5-16% "
    "faster, every point 'valid' (issue 32). A point measured on a cache it did not "
    "declare is a different workload.",
    "Run the point again (each invocation draws new prompts); if it recurs, the server "
    "saw these prompts before some other way (another client replaying them). A workload "
    "meant to share prefixes says so (--prefix-len, a trace's hash ids, a dataset).",
)


@VERDICTS.add(PREFIX_CACHE)
def prefix_cache_cold(case: Case) -> Verdict | None:
    bound = case.thresholds.max_prefix_hit_share
    if bound is None:
        return None
    server = case.point.server or {}
    share = server.get("prefix_hit_share")
    if share is None:
        return None  # no lookups counted: caching off, or no counters (SB406 judges those)
    hits = sum(
        (r.get("counters") or {}).get("prefix_cache_hits") or 0.0
        for r in (server.get("roles") or {}).values()
    )
    return Verdict(
        share > bound,
        f"{100 * share:.1f}% of the prompt tokens looked up were found in the engines' prefix "
        f"caches ({hits:.0f} tokens: {M.PREFIX_HITS} over {M.PREFIX_QUERIES}), on a "
        f"workload that shares no prefix (bound {100 * bound:.1f}%)",
        dict(share=share, bound=bound, hits=hits),
    )


SPECULATION = register(
    "SB413",
    "Speculative decoding drafted and accepted tokens in the window",
    "A deployment that claims speculative decoding but stopped drafting (or accepts "
    "nothing) still answers: its figures are then those of plain decoding, labelled "
    "speculative. The handoff has SB407; speculation needs the same per point.",
    "Run `servebook verify` on the deployment; check the decoding role's "
    "--speculative-config, and that the workload is text a draft can predict (random "
    "tokens accept little: use a --dataset of real text).",
)


@VERDICTS.add(SPECULATION)
def speculation_engaged(case: Case) -> Verdict | None:
    if not case.speculative:
        return None
    roles = (case.point.server or {}).get("roles") or {}
    drafted = accepted = 0.0
    read = False
    for r in roles.values():
        c = r.get("counters") or {}
        if c.get("spec_draft_tokens") is not None:
            read = True
            drafted += c["spec_draft_tokens"]
            accepted += c.get("spec_accepted_tokens") or 0.0
    problem = speculation_problem(drafted if read else None, accepted)
    return Verdict(
        problem is not None,
        problem or f"{drafted:.0f} draft tokens, {accepted:.0f} accepted in the window",
        dict(draft_tokens=drafted if read else None, accepted_tokens=accepted),
    )


#: SB414 fails an agent with no counted request only where its share of the point's
#: counted requests would have been at least this many: an open loop's Poisson share of
#: mean 10 sends none in the window with probability e^-10 (5e-5), so a healthy point of a
#: low rate, a short window or long requests is not failed for chance.
AGENT_MIN_EXPECTED = 10.0

AGENT_SILENT = register(
    "SB414",
    "Every load agent made requests counted in the window",
    "A point made by several load agents claims all of their load. An agent that made "
    "nothing counted in the window (its process starved of CPU for seconds on a machine "
    "the server fills, or stuck) leaves a smaller load labelled as the whole, and its "
    "requests left open still count as in flight for SB404: in CI agent 1 of 2 started no "
    "request in a 4 s window (its event loop ran about once a second), the achieved "
    "concurrency read 2.9 of 4, and under the test's loose SB404 bound the point was "
    "valid.",
    "Run the point again; if it recurs, give the client cores the server does not use "
    "(the point's event-loop lag says whether an agent was starved), or use fewer "
    "--agents.",
)


def _silent_evidence(agent: Mapping[str, Any]) -> str:
    """What a silent agent's record says about why: requests it sent that were never
    answered in the window, and how long its event loop waited (a process starved of CPU
    lags; one waiting on the server does not)."""
    lag = agent.get("loop_lag_p99_ms")
    return (
        f"{agent.get('requests_open_at_end', '?')} of its requests open at the window's "
        "end; its event-loop lag p99 " + ("unknown" if lag is None else f"{lag:g} ms")
    )


@VERDICTS.add(AGENT_SILENT)
def every_agent_counted(case: Case) -> Verdict | None:
    """Only a load of several agents whose counts were recorded (``figures.agents_counted``)
    gets a verdict here."""
    agents = case.point.client.agents or []
    if len(agents) < 2 or any("requests_counted" not in a for a in agents):
        return None
    total = case.point.requests_ok
    silent = [
        a
        for a in agents
        if a["requests_counted"] == 0 and a["load_share"] * total >= AGENT_MIN_EXPECTED
    ]
    made = ", ".join(f"agent {a['index']} {a['requests_counted']}" for a in agents)
    if not silent:
        return Verdict(
            False, f"requests counted per agent: {made}", dict(counted=made, total=total)
        )
    named = "; ".join(
        f"load agent {a['index']} (pid {a['pid']}) made none of the {total} requests counted "
        f"in the window, where its share ({100 * a['load_share']:.0f}% of the load) would "
        f"have made about {a['load_share'] * total:.0f} ({_silent_evidence(a)})"
        for a in silent
    )
    return Verdict(
        True,
        f"{named}: the point is not the load of the {len(agents)} agents it claims "
        f"(counted per agent: {made})",
        dict(silent=[a["index"] for a in silent], counted=made, total=total),
    )


REACH = register(
    "SB410",
    "Every role stayed reachable and the same for the whole point",
    "A role whose process died, whose port-forward broke or whose Pod was replaced during "
    "a point was measured across two incarnations, or not at all: its counters' deltas "
    "and the requests it served belong to neither.",
    "Run `servebook status NAME` for the role's state; bring it back and rerun the point "
    "(`servebook bench NAME --resume -o DIR`).",
)


def reach_findings(problems: Mapping[str, str]) -> list[Finding]:
    """SB410 for the roles a backend says it lost during the point."""
    return [
        REACH.finding(Severity.FAIL, role, f"{role} during the point: {why}")
        for role, why in sorted(problems.items())
    ]


def reasons(findings: Sequence[Finding]) -> list[str]:
    """``invalid_reasons`` for a results file: ``"SB402: 37 requests ..."``."""
    return [f"{f.check}: {f.message}" for f in findings if f.failed]


def apply_verdict(point: Point, findings: Sequence[Finding]) -> Point:
    r = reasons(findings)
    return point.model_copy(update={"valid": not r, "invalid_reasons": r})
