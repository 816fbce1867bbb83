"""verify's checks by what they read, each added where it is defined, as lint's and bench's
are (``servebook.findings.Rules``); ``verify.smoke`` runs what is registered:

* ``@COMMAND_LINE_CHECKS.add(CHECK)``: the claims and every engine's command line, before
  any request (what the deployment says of itself);
* ``@WINDOW_CHECKS.add(CHECK)``: the claims and the counters read before and after verify's
  requests (what the engines did);
* ``@LOG_CHECKS.add(CHECK)``: the claims and one role's log, last.

Every replica is judged on its own: a role's counters are read from each replica
(``metrics.scrape.scrape_replicas`` tags them), and the window checks split them
(``replica_windows``), so one replica that fails open among four fails under its own name
instead of vanishing in a sum.  Each check's pure core lives in ``verify.checks``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import combinations
from typing import TYPE_CHECKING, Any

from servebook.deployment.view import replica_names, replica_subject
from servebook.engines import vllm
from servebook.engines.cmdline import kv_connector_problems, kv_role_problem, kv_transfer_config
from servebook.findings import Finding, Rules, Severity, register
from servebook.metrics.scrape import Snapshot, delta, split_replicas
from servebook.verify import checks as C
from servebook.verify.checks import Window

if TYPE_CHECKING:
    from servebook.deployment.view import Claims, RoleView

COMMAND_LINE_CHECKS: Rules[Callable[[Claims, Sequence[RoleView]], list[Finding]]] = Rules()
WINDOW_CHECKS: Rules[Callable[[Claims, Window], list[Finding]]] = Rules()
LOG_CHECKS: Rules[Callable[[Claims, RoleView, str], list[Finding]]] = Rules()

# Roles that decode, so produce drafts when speculation runs (prefill makes one token).
DECODING_ROLES = ("mixed", "decode")


def commands(targets: Sequence[RoleView]) -> dict[str, Sequence[str]]:
    """Every engine replica's command line, by subject (``ROLE``, or ``ROLE REPLICA`` for a
    role of several), where it is known."""
    out: dict[str, Sequence[str]] = {}
    for t in targets:
        if t.kind != "engine":
            continue
        for subject, argv in t.replica_commands():
            if argv:
                out[subject] = argv
    return out


def replica_windows(w: Window, role: str) -> list[tuple[str, Window]]:
    """``(subject, window)`` for each replica of ``role``: the role itself when it has one,
    else ``ROLE NAME`` with the window's ``role`` entries replaced by that replica's own
    counters, under the subject's key."""
    before, after = split_replicas(w.before[role]), split_replicas(w.after[role])
    if len(before) == 1 or len(before) != len(after):
        return [(role, w)]
    names = replica_names(role, list(w.replica_names.get(role) or ()), len(before))
    out = []
    for name, b, a in zip(names, before, after, strict=True):
        subject = replica_subject(role, name)
        out.append(
            (
                subject,
                Window(
                    before={**w.before, subject: b},
                    after={**w.after, subject: a},
                    prompt_tokens=_replica_prompts(w.prompt_tokens, b, a),
                ),
            )
        )
    return out


def _replica_prompts(prompts: Sequence[int], b: Snapshot, a: Snapshot) -> list[int]:
    """Which of verify's prompts one replica served: the subset whose lengths sum to its
    prompt-token delta; without one (other traffic in the window), its requests taken as
    equal shares of its tokens."""
    total = delta(b, a, vllm.M.PROMPT_TOKENS).value
    if not total:
        return []
    for k in range(len(prompts), 0, -1):
        for subset in combinations(prompts, k):
            if sum(subset) == total:
                return list(subset)
    n = int(delta(b, a, vllm.M.REQUEST_SUCCESS).value or 0)
    if n <= 0:
        return []
    each, extra = divmod(int(total), n)
    return [each + (1 if i < extra else 0) for i in range(n)]


def _served(claims: Claims, w: Window, *roles: str) -> bool:
    return all(r in w.before and r in w.after for r in roles)


def _unread(claims: Claims, subject: str) -> bool:
    return any(subject.startswith(k) or k.startswith(subject + " ") for k in claims.argv_unread)


# --- what the engines were started with ---------------------------------------------------


@COMMAND_LINE_CHECKS.add(C.SPEC_SYMMETRY)
def spec_symmetry(claims: Claims, targets: Sequence[RoleView]) -> list[Finding]:
    return C.check_spec_symmetry(commands(targets))


CONNECTOR = register(
    "SB310",
    "A PD deployment's engines all load the same KV connector",
    "Prefill and decode hand the KV cache over only when every engine loads the same "
    "connector (prefill producing, decode consuming). An engine started without one does "
    "not fail: its requests answer, and decode silently recomputes every prompt (kserve "
    "#5987 built a whole P/D topology that way). Read from each engine's own command line.",
    "Give every prefill and decode engine the same `--kv-transfer-config` (kv_connector; "
    "kv_producer or kv_both on prefill, kv_consumer or kv_both on decode).",
)


@COMMAND_LINE_CHECKS.add(CONNECTOR)
def connector_on_every_engine(claims: Claims, targets: Sequence[RoleView]) -> list[Finding]:
    if claims.topology != "pd":
        return []
    configs: dict[str, dict[str, Any] | None] = {}
    subjects: list[str] = []  # every PD engine whose command line was read
    problems: list[str] = []
    for subject, argv in commands(targets).items():
        if not subject.startswith(("prefill", "decode")):
            continue
        subjects.append(subject)
        cfg, error = kv_transfer_config(C.role_command(argv))
        if error is not None:
            problems.append(f"{subject}: {error}")
            continue
        configs[subject] = cfg
        side = "prefill" if subject.startswith("prefill") else "decode"
        if (role := kv_role_problem(side, cfg)) is not None:
            problems.append(f"{subject}: {role}")
    if not subjects:
        return []  # no command line read: Claims.argv_unread says so (SB311)
    subject = ",".join(subjects)
    seen = {s: str((c or {}).get("kv_connector") or "") or None for s, c in configs.items()}
    problems += [p.text for p in kv_connector_problems(configs)]
    ev = {"kv_connector": seen, "problems": problems}
    if problems:
        return [
            CONNECTOR.finding(
                Severity.FAIL,
                subject,
                "; ".join(problems) + ": no KV cache is handed over there, and decode "
                "silently recomputes the prompt",
                evidence=ev,
            )
        ]
    names = sorted({c for c in seen.values() if c})
    if not names:
        return [
            CONNECTOR.finding(
                Severity.WARN,
                subject,
                "no engine names a KV connector on its command line; its launcher may load "
                "one (Dynamo's dynamo.vllm loads NIXL by default): the handoff counters "
                "(SB302) decide",
                evidence=ev,
            )
        ]
    return [
        CONNECTOR.finding(Severity.PASS, subject, f"{names[0]} on " + ", ".join(seen), evidence=ev)
    ]


CLAIMS_READ = register(
    "SB311",
    "Every engine's claims are read from its own command line",
    "An attached deployment's claims (speculation, KV connector) come from what its "
    "engines were started with. Where a command line cannot be read (another machine, "
    "another user's process, a container), those claims are not determined: assuming "
    "them would judge a deployment by what someone said of it.",
    "Attach from the machine that runs the engines as the user that runs them (the "
    "command line is read from /proc), or on Kubernetes (read from the Pod).",
)


@COMMAND_LINE_CHECKS.add(CLAIMS_READ)
def claims_read(claims: Claims, targets: Sequence[RoleView]) -> list[Finding]:
    return [
        CLAIMS_READ.finding(
            Severity.WARN,
            subject,
            f"{subject}: speculation and KV-connector claims not determined: {why}. Only "
            "its counters were judged.",
            evidence={"why": why},
        )
        for subject, why in sorted(claims.argv_unread.items())
    ]


# --- what the engines did in verify's window ------------------------------------------------


@WINDOW_CHECKS.add(C.HANDOFF)
def handoff(claims: Claims, w: Window) -> list[Finding]:
    """Each decode replica received its prompts by KV transfer (named when there are
    several); prefill computed what decode received."""
    if claims.topology != "pd" or not _served(claims, w, "prefill", "decode"):
        return []
    if len(w.prompt_tokens) < 2:
        return []  # the PD probe did not complete: SB301 says why
    replicas = replica_windows(w, "decode")
    summed = C.check_handoff("prefill", "decode", w)
    if len(replicas) == 1:
        return summed
    out = [f for f in summed if f.subject == "prefill"]
    for subject, rw in replicas:
        out += [f for f in C.check_handoff("prefill", subject, rw) if f.subject == subject]
    return out


@WINDOW_CHECKS.add(C.SPECULATION)
def speculation(claims: Claims, w: Window) -> list[Finding]:
    if not claims.speculative:
        return []
    out: list[Finding] = []
    for role in DECODING_ROLES:
        if _served(claims, w, role):
            for subject, rw in replica_windows(w, role):
                if not _unread(claims, subject):
                    out += C.check_speculation(subject, rw)
    return out


@WINDOW_CHECKS.add(C.OUTCOMES)
def outcomes(claims: Claims, w: Window) -> list[Finding]:
    out: list[Finding] = []
    for role in sorted(set(w.before) & set(w.after)):
        for subject, rw in replica_windows(w, role):
            out += C.check_outcomes(subject, rw)
    return out


@WINDOW_CHECKS.add(C.METRICS)
def metrics_present(claims: Claims, w: Window) -> list[Finding]:
    """Every replica's own /metrics has the counters verify decides from: a URL that is a
    router's or a sidecar's, not the engine's, fails here naming it."""
    out: list[Finding] = []
    for role in sorted(w.before):
        need = list(vllm.REQUIRED_METRICS)
        if claims.topology == "pd":
            need += vllm.PD_METRICS
        for subject, rw in replica_windows(w, role) if role in w.after else [(role, w)]:
            out += C.check_metrics_present(subject, rw.before[subject], need)
    return out


KV_FAILURES = register(
    "SB312",
    "No KV transfer failed or expired in the window",
    "A KV transfer that fails does not always fail the request: a NIXL receive failure "
    "has returned HTTP 200 with wrong tokens (vLLM#52234), and a prefill restart left "
    "decode with a stale NIXL agent that kept serving (vLLM#49238). The connector's own "
    "failure counters are the evidence.",
    "Read both roles' logs around the window (NIXL errors name the remote agent); restart "
    "decode after a prefill restart; check the KV transport (SB309).",
)
# The connector's failure counters (vllm.md: NIXL's; expired leases are counted on prefill).
KV_FAILURE_COUNTERS = (
    "vllm:nixl_num_failed_transfers",
    "vllm:nixl_num_failed_notifications",
    "vllm:nixl_num_kv_expired_reqs",
)


def _counter(name: str) -> Iterator[str]:
    yield name
    yield name + "_total"


@WINDOW_CHECKS.add(KV_FAILURES)
def kv_failures_flat(claims: Claims, w: Window) -> list[Finding]:
    if claims.topology != "pd":
        return []
    out: list[Finding] = []
    for role in ("prefill", "decode"):
        if not _served(claims, w, role):
            continue
        for subject, rw in replica_windows(w, role):
            grew: dict[str, float] = {}
            seen = False
            for metric in KV_FAILURE_COUNTERS:
                for name in _counter(metric):
                    d = delta(rw.before[subject], rw.after[subject], name)
                    if d.value is not None or d.reset:
                        seen = True
                    if d.value:
                        grew[metric] = d.value
            if not seen:
                continue  # a connector without these counters: nothing to read
            if grew:
                out.append(
                    KV_FAILURES.finding(
                        Severity.FAIL,
                        subject,
                        f"{subject}: "
                        + ", ".join(f"{n} +{v:.0f}" for n, v in grew.items())
                        + " in verify's window: KV transfers failed or expired",
                        evidence={"grew": grew},
                    )
                )
            else:
                out.append(
                    KV_FAILURES.finding(
                        Severity.PASS, subject, f"{subject}: KV failure counters flat"
                    )
                )
    return out


# --- the logs, last --------------------------------------------------------------------------


@LOG_CHECKS.add(C.LOGS)
def log_signatures(claims: Claims, t: RoleView, text: str) -> list[Finding]:
    return C.check_logs(t.name, text)


@LOG_CHECKS.add(C.KV_TRANSPORT)
def kv_transport(claims: Claims, t: RoleView, text: str) -> list[Finding]:
    """The transport a PD engine's connector used, as its log says, against the fabric
    the recipe states: RDMA claimed and TCP used is the silent slow path."""
    if claims.topology != "pd" or t.kind != "engine" or t.name not in ("prefill", "decode"):
        return []
    return C.check_kv_transport(t.name, claims.fabric, text)


__all__ = [
    "CLAIMS_READ",
    "COMMAND_LINE_CHECKS",
    "CONNECTOR",
    "KV_FAILURES",
    "LOG_CHECKS",
    "WINDOW_CHECKS",
    "commands",
    "replica_windows",
]
