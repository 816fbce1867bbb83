"""Engine flags and container scripts: SB108 (a flag given twice), SB111 (a JSON flag that
is not JSON), SB113 (a LeaderWorkerSet whose leader and workers run different flags),
SB116 (a Job's or Pod's script that waits for an endpoint without a bound) and SB117
(flags only a shell script assembles, which lint cannot see)."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator, Sequence
from typing import Any

from servebook.engines.cmdline import EngineCommand, split_shell
from servebook.findings import Finding, Severity, register
from servebook.lint.docs import curl_has_timeout
from servebook.lint.loader import Document, KeyPath
from servebook.lint.rules.objects import (
    Engine,
    PodSpec,
    container_script,
    engine_command,
    finding_at,
    lookup,
    pod_specs,
    script_expansions,
)
from servebook.lint.rules.registry import DOCUMENT_RULES, ENGINE_RULES
from servebook.lint.rules.templates import template_tool

JSON_FLAGS = (
    "--speculative-config",
    "--kv-transfer-config",
    "--compilation-config",
    "--hf-overrides",
    "--override-generation-config",
    "--limit-mm-per-prompt",
    "--kv-events-config",
    "--additional-config",
    "--model-loader-extra-config",
    "--mm-processor-kwargs",
    "--rope-scaling",
)
# Flags whose value must be JSON whatever it looks like.
_ALWAYS_JSON = ("--speculative-config", "--kv-transfer-config")


DUPLICATE_FLAG = register(
    "SB108",
    "Engine flag given more than once",
    "vLLM's argument parser keeps the last occurrence of a repeated flag without a word, "
    "so an edit that appends a flag instead of changing it takes effect or not depending "
    "on its position, and a reader of the manifest sees two contradicting values. "
    "`--x` and `--no-x`, `-tp` and `--tensor-parallel-size`, dashes and underscores count "
    "as the same flag.",
    "Give each engine flag once; delete the stale occurrence.",
)


@ENGINE_RULES.add(DUPLICATE_FLAG)
def check_duplicate_flags(engine: Engine) -> list[Finding]:
    findings = []
    for setting, flags in engine.cmd.duplicates().items():
        shown = [
            f"{f.written} {f.value}" if f.value is not None and "=" not in f.written else f.written
            for f in flags
        ]
        last = shown[-1]
        findings.append(
            finding_at(
                DUPLICATE_FLAG,
                Severity.FAIL,
                engine.doc,
                engine.path,
                f"{setting} is given {len(flags)} times ({'; then '.join(shown)}); vLLM "
                f"silently keeps the last one ({last}).",
                extra=f"container {engine.cname}",
                evidence={"flag": setting, "occurrences": shown},
            )
        )
    return findings


ENGINE_JSON = register(
    "SB111",
    "Engine flag that takes JSON is not valid JSON",
    "`--speculative-config`, `--kv-transfer-config` and the other JSON flags are parsed at "
    "engine start: a quoting slip (YAML quotes eaten, a trailing comma) makes the engine "
    "exit after the image pull and weight load, or, where the flag is optional, the "
    "intended feature is simply absent. Lint cannot compare a config it cannot read, so "
    "this is also what keeps the prefill/decode rules from passing silently.",
    "Write the value as one JSON object; in YAML, wrap it in single quotes: "
    '`- \'{"kv_connector":"NixlConnector","kv_role":"kv_producer"}\'`.',
)


@ENGINE_RULES.add(ENGINE_JSON)
def check_engine_json(engine: Engine) -> list[Finding]:
    findings = []
    for key in ("command", "args"):
        items = engine.container.get(key)
        for i, item in enumerate(items if isinstance(items, list) else []):
            if isinstance(item, dict | list):
                findings.append(
                    finding_at(
                        ENGINE_JSON,
                        Severity.FAIL,
                        engine.doc,
                        (*engine.path, key, i),
                        f"{key}[{i}] is a YAML {'mapping' if isinstance(item, dict) else 'list'}"
                        f", not a string: unquoted JSON in YAML is parsed as YAML, and the API "
                        f"server rejects the container; quote it: '{json.dumps(item)}'.",
                        extra=f"container {engine.cname}",
                        evidence={"item": item},
                    )
                )
    for name in JSON_FLAGS:
        flag = engine.cmd.last(name)
        if flag is None or flag.value is None:
            continue
        text = flag.value.strip()
        if "$" in text:
            continue  # shell or Kubernetes expansion: the value is only known at run time
        if name not in _ALWAYS_JSON and not text.startswith(("{", "[")):
            continue  # e.g. `-O3`, `--compilation-config 3`
        _, err = engine.cmd.json_value(name)
        if err:
            findings.append(
                finding_at(
                    ENGINE_JSON,
                    Severity.FAIL,
                    engine.doc,
                    engine.path,
                    f"{err}: {text[:120]!r}.",
                    extra=f"container {engine.cname}",
                    evidence={"flag": name, "value": text},
                )
            )
    return findings


# Flags that are each member's own in vLLM's multi-node data parallelism.
_MEMBER_FLAGS = frozenset({"--headless", "--data-parallel-start-rank", "-dpr", "--host", "--port"})


def _settings(cmd: EngineCommand) -> dict[str, str | None]:
    return {f.setting: f.value for f in cmd.flags if f.name not in _MEMBER_FLAGS}


GROUP_MEMBERS_DISAGREE = register(
    "SB113",
    "LeaderWorkerSet leader and workers run different engine settings",
    "A group that spans nodes is one vLLM engine: every member must load the same model with "
    "the same parallel sizes, KV connector and engine flags, and only the members' own "
    "data-parallel flags may differ (workers --headless, each starting at its own rank). A "
    "leader and worker that disagree fail the data-parallel handshake, hang in the first "
    "collective, or a worker without --headless starts a second API server on a rank the "
    "leader already counts (unless the group balances load per node on purpose: "
    "`--data-parallel-hybrid-lb` or `--data-parallel-external-lb`, where every member "
    "serves its own API and is not told to add --headless).",
    "Render the leader and worker from one argument list (servebook does), adding only "
    "--headless and --data-parallel-start-rank (leader 0, worker k: k x "
    "--data-parallel-size-local) to the workers.",
)


@DOCUMENT_RULES.add(GROUP_MEMBERS_DISAGREE)
def check_group_members(doc: Document) -> list[Finding]:
    """A LeaderWorkerSet's leader and worker engines agree on every flag but their own."""
    if doc.kind != "LeaderWorkerSet" or template_tool(doc) is not None:
        return []  # a template's flags are not the ones that run (SB115)
    by_member: dict[str, tuple[PodSpec, KeyPath, EngineCommand]] = {}
    for pod in pod_specs(doc):
        member = "leader" if "leaderTemplate" in pod.path else "worker"
        for cpath, container in pod.containers():
            cmd = engine_command(container)
            if cmd is not None:
                by_member.setdefault(member, (pod, cpath, cmd))
    if "worker" not in by_member:
        return []
    wpod, wpath, worker = by_member["worker"]
    findings: list[Finding] = []

    def disagree(message: str, **evidence: Any) -> None:
        findings.append(
            finding_at(
                GROUP_MEMBERS_DISAGREE,
                Severity.FAIL,
                doc,
                wpath,
                message,
                extra=wpod.part,
                evidence=evidence or None,
            )
        )

    size = lookup(doc.data, "spec", "leaderWorkerTemplate", "size")
    spans = isinstance(size, int) and size > 1
    if "leader" in by_member:
        _, _, leader = by_member["leader"]
        a, b = _settings(leader), _settings(worker)
        diff = sorted(
            f"{k}: leader {a.get(k)!r}, worker {b.get(k)!r}"
            for k in set(a) | set(b)
            if a.get(k) != b.get(k)
        )
        if diff:
            disagree(
                f"{doc.label}'s leader and workers run different engine settings: "
                + "; ".join(diff),
                differences=diff,
            )
        local = leader.value("--data-parallel-size-local")
        rank = worker.value("--data-parallel-start-rank")
        if spans and size == 2 and local and rank and not rank.startswith("$") and rank != local:
            disagree(
                f"{doc.label}'s worker starts at data-parallel rank {rank}, but the leader "
                f"holds ranks 0 to {int(local) - 1} (--data-parallel-size-local {local}): "
                "the worker's first rank must be " + local
            )
    # With hybrid or external load balancing every node runs its own API server on purpose
    # (the router targets each), so a worker without --headless is the design.
    own_servers = worker.has("--data-parallel-hybrid-lb") or worker.has(
        "--data-parallel-external-lb"
    )
    if (
        spans
        and worker.has("--data-parallel-size")
        and not worker.has("--headless")
        and not own_servers
    ):
        disagree(
            f"{doc.label}'s workers run data-parallel ranks without --headless: each would "
            "start an API server of its own beside the leader's."
        )
    return findings


# Kinds whose Pods are meant to finish: a wait that never ends keeps them from finishing.
_FINISHING_KINDS = frozenset({"Job", "CronJob", "Pod"})
_COMPARISONS = frozenset({"-lt", "-le", "-gt", "-ge", "-eq", "-ne"})


def _deadline(doc: Document, pod: PodSpec) -> bool:
    return any(
        isinstance(v, int) and v > 0
        for v in (
            pod.spec.get("activeDeadlineSeconds"),
            lookup(doc.data, "spec", "activeDeadlineSeconds"),
            lookup(doc.data, "spec", "jobTemplate", "spec", "activeDeadlineSeconds"),
        )
    )


def _probe_bounded(words: Sequence[str]) -> bool:
    """A curl or wget probe in a loop condition that carries its own time limit, or runs
    under `timeout`."""
    for i, w in enumerate(words):
        tool = posixpath.basename(w)
        if tool in ("curl", "wget"):
            if "timeout" in words[:i]:
                return True
            rest = list(words[i + 1 :])
            if tool == "curl":
                return curl_has_timeout(rest)
            return any(a.startswith(("--timeout", "-T")) for a in rest)
    return True  # no probe in this condition


def unbounded_waits(script: str) -> Iterator[str]:
    """`while`/`until` loops whose condition probes an endpoint with curl or wget and that
    nothing ends: no `timeout`, no attempt counter compared in the condition or body."""
    commands = split_shell(script) or []
    i = 0
    while i < len(commands):
        words = commands[i]
        if not words or words[0] not in ("while", "until"):
            i += 1
            continue
        cond: list[str] = []
        j = i
        while j < len(commands) and (j == i or commands[j][:1] != ["do"]):
            cond.extend(commands[j] if j > i else commands[j][1:])
            j += 1
        body: list[str] = []
        while j < len(commands) and commands[j][:1] != ["done"]:
            body.extend(commands[j])
            j += 1
        probes = any(posixpath.basename(w) in ("curl", "wget") for w in cond)
        counted = bool(_COMPARISONS & set(cond + body)) or "timeout" in cond + body
        if probes and not counted:
            yield " ".join([words[0], *cond])
        i = j + 1


UNBOUNDED_WAIT = register(
    "SB116",
    "Job or Pod script waits for an endpoint with no bound",
    "A `until curl URL; do sleep 5; done` loop in a Job's or Pod's shell script, with no "
    "deadline on the loop (`timeout`, an attempt counter) and none on the Job or Pod "
    "(`activeDeadlineSeconds`), waits as long as the endpoint stays down: a benchmark or "
    "smoke-test Job that never finishes and never fails, a CI pipeline that hangs until "
    "its own global timeout, and no error anywhere saying what it waited for. A curl "
    "without --max-time inside the loop can hang a single attempt forever as well.",
    "Bound the wait: `timeout 600 sh -c 'until curl -sf --max-time 5 URL; do sleep 5; "
    "done'`, or count attempts and `exit 1` after N, or give the Job "
    "`activeDeadlineSeconds`.",
)


@DOCUMENT_RULES.add(UNBOUNDED_WAIT)
def check_unbounded_waits(doc: Document) -> Iterator[Finding]:
    if doc.kind not in _FINISHING_KINDS:
        return
    for pod in pod_specs(doc):
        if _deadline(doc, pod):
            continue
        for cpath, container in pod.containers():
            for loop in unbounded_waits(container_script(container) or ""):
                yield finding_at(
                    UNBOUNDED_WAIT,
                    Severity.FAIL,
                    doc,
                    cpath,
                    f"container {container.get('name', '?')} waits in `{loop[:100]}` with no "
                    f"deadline (no timeout or attempt count, no activeDeadlineSeconds): "
                    f"{doc.label} never finishes while the endpoint is down.",
                    extra=pod.part,
                    evidence={"loop": loop},
                )


SCRIPT_ASSEMBLED_FLAGS = register(
    "SB117",
    "Engine flags assembled by a shell script: lint cannot see them",
    "When the engine is started as `exec vllm serve $SPEC_ARGS $KV_ARGS ...` and the "
    'script sets those variables at start time (`if [ "$LWS_GROUP_SIZE" -gt 1 ]; then '
    "SPEC_ARGS=...`), the flags the engine actually gets exist only in the running Pod. "
    "Lint compares what is written: it cannot tell whether a prefill/decode pair ends up "
    "with the same speculative or KV-cache settings, or whether a flag is given twice, so "
    "its silence about those flags means nothing. A warning, saying what lint could not "
    "see, instead of a guess either way.",
    "Write the flags out in the manifest (render one argument list per role), or check "
    "the running engines: `servebook verify` reads each engine's own flags and counters.",
)


@ENGINE_RULES.add(SCRIPT_ASSEMBLED_FLAGS)
def check_script_assembled_flags(engine: Engine) -> list[Finding]:
    # `vllm serve "${MODEL_DIR}"`: a variable alone in the model's place is the model.
    hidden = [w for w in script_expansions(engine.cmd) if w != engine.cmd.positional_model]
    if not hidden:
        return []
    pd = (
        f"; as the {engine.role} role of a prefill/decode pair, its speculative, KV-cache "
        "and parallel settings may differ from the other role's without lint seeing it"
        if engine.role
        else ""
    )
    return [
        finding_at(
            SCRIPT_ASSEMBLED_FLAGS,
            Severity.WARN,
            engine.doc,
            engine.path,
            f"container {engine.cname} starts the engine with {', '.join(hidden)}: flags "
            f"its script assembles at start time, which lint cannot read{pd}. Lint "
            "checked only the flags written out.",
            extra=engine.pod.part,
            evidence={"variables": hidden},
        )
    ]
