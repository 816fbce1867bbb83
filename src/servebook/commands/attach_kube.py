"""`servebook attach NAME --backend kubernetes -n NS`: the Kubernetes path of attach
(``commands.attach`` parses the command line and calls ``attach_kubernetes``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.markup import escape

from servebook import redact
from servebook.backends.attached.cluster import NOT_RUN_ON_A_CLUSTER, find, found_dict, record_of
from servebook.backends.attached.record import write_record
from servebook.commands import print_json
from servebook.console import out
from servebook.errors import UsageError
from servebook.kube.stacks import EXPLICIT_FLAGS

KUBE_HELP = f"""On Kubernetes: `--backend kubernetes -n NS` finds the deployment in namespace
NS by its stack's own labels: llm-d (llm-d.ai/role), NVIDIA Dynamo
(nvidia.com/dynamo-component-type, or worker + nvidia.com/dynamo-sub-component-type),
KServe LLMInferenceService, AIBrix StormService (role-name), vLLM production-stack (the
engines' model label as the router's --prefill-model-labels/--decode-model-labels say),
OME (component=engine|decoder) and LeaderWorkerSet/DisaggregatedSet (leaders only).  Every
replica is recorded with its Pod, node, engine container and the engine's own port (read
from its argv: --port, a sh -c script, VLLM_ADDITIONAL_ARGS), never a routing sidecar's
or router's.  Anything else: `{EXPLICIT_FLAGS}` (label selectors; --role mixed=SELECTOR
for one aggregated role).  {NOT_RUN_ON_A_CLUSTER}

Example: servebook attach prod --backend kubernetes -n llm-d --dry-run
"""


def role_selectors(given: Sequence[str]) -> list[tuple[str, str]]:
    """``ROLE=SELECTOR`` values of --role (the selector may hold '=' and ',')."""
    out_: list[tuple[str, str]] = []
    for g in given:
        role, sep, selector = g.partition("=")
        if not sep or not selector:
            raise UsageError(
                f"--role {g}: on Kubernetes a role is ROLE=SELECTOR (a label selector).",
                hint=f"e.g. {EXPLICIT_FLAGS}",
            )
        out_.append((role.strip(), selector.strip()))
    return out_


def _print(found: dict[str, Any], name: str, recorded: bool) -> None:
    entry = found["entry"]
    where = (
        f"svc/{entry['service']}:{entry['port']} -> Pod port {entry['target_port']} "
        f"({entry['scheme']}; Pods {', '.join(entry['pods']) or 'none'})"
        if entry
        else "not determined"
    )
    head = f"{name}: {found['stack']} {found['topology']} deployment in namespace "
    out.print(escape(f"{head}{found['namespace']}, entry {where}"), highlight=False, soft_wrap=True)
    for role in found["roles"]:
        out.print(escape(f"  {role['name']} ({role['selector']}):"), highlight=False)
        for p in role["replicas"]:
            ready = "Ready" if p["ready"] else "NOT Ready"
            line = (
                f"    Pod {p['pod']} on {p['node']} ({ready}), container {p['container']}: "
                f"API {p['api']}, counters {p['metrics']}; {p['claims']}; "
                f"argv from {p['argv_from']}"
            )
            out.print(escape(line), highlight=False, soft_wrap=True)
            for note in p["notes"]:
                out.print(escape(f"      {note}"), highlight=False, soft_wrap=True)
    for u in found["undetermined"]:
        out.print(escape(f"  not determined: {u}"), highlight=False, soft_wrap=True)
    out.print(escape(f"  note: {found['tested_on']}"), highlight=False, soft_wrap=True)
    if recorded:
        out.print(escape(f"attached: {name}; next: `servebook verify {name}`"), highlight=False)
    else:
        out.print("dry run: nothing recorded.", highlight=False)


def attach_kubernetes(
    name: str,
    namespace: str | None,
    roles: Sequence[str],
    entry: str | None,
    model: str | None,
    *,
    dry_run: bool,
    json_out: bool,
) -> None:
    """Find, print, and (unless a dry run) record the deployment in ``namespace``."""
    if not namespace:
        raise UsageError(
            "--backend kubernetes needs the namespace: -n NS.",
            hint=f"e.g. servebook attach {name} --backend kubernetes -n llm-d --dry-run",
        )
    found = find(namespace, role_selectors(roles), entry)
    shown = found_dict(found)
    dep = None if dry_run else record_of(name, found, model)
    if dep is not None:
        write_record(dep)
    if json_out:
        print_json(redact.scrub({**shown, "name": name, "recorded": dep is not None})[0])
    else:
        _print(redact.scrub(shown)[0], name, recorded=dep is not None)


__all__ = ["KUBE_HELP", "attach_kubernetes", "role_selectors"]
