"""The target node's checks of ``servebook preflight`` (``SB250``-``SB253``): the node the
recipe's Pods are pinned to exists (found as the Pods select it), is Ready, is not
cordoned, and its taints are tolerated.  Pure functions over Node objects; the device
checks on the same node and ``check_cluster`` are in ``preflight.cluster``.

A hand-written pre-flight passed a cordoned node and a NoSchedule-tainted node in the
field (``reference/field-notes.md``, "Pre-flight").
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servebook.findings import Check, Finding, Severity, register_once
from servebook.kube.names import HOSTNAME_LABEL
from servebook.kube.objects import (
    BadObject,
    condition,
    is_cordoned,
    is_ready,
    labels_of,
    name_of,
    taint_text,
    tolerates,
)
from servebook.preflight.requirements import NodeAsk, roles_text

Obj = Mapping[str, Any]


# Ids are stable: docs, CI configs and people refer to them.

NODE_EXISTS = register_once(
    "SB250",
    "Target node exists",
    "A Pod pinned to a node name that is not in the cluster stays Pending forever (with "
    "nodeName it is never even scheduled, and no event says why); the deploy times out "
    "after its full ready timeout instead of failing at once.",
    "Use a name from `kubectl get nodes` (the node's metadata.name, which can differ from "
    "its hostname) in the recipe's node parameter.",
)
NODE_READY = register_once(
    "SB251",
    "Target node is Ready",
    "On a node whose Ready condition is False or Unknown the kubelet is not running Pods (or "
    "cannot report them): the engine Pods never start, or start and are evicted once the "
    "node controller's not-ready taint takes effect.",
    "Look at `kubectl describe node NODE` (conditions, kubelet and runtime status) and fix "
    "the node, or choose a Ready node.",
)
NODE_SCHEDULABLE = register_once(
    "SB252",
    "Target node is not cordoned",
    "A cordoned node (spec.unschedulable) takes no new Pods: the scheduler leaves the "
    "engine Pods Pending. Nodes are usually cordoned on purpose (drain, maintenance, a "
    "broken GPU), so deploying there also fights whoever cordoned it.",
    "Ask why the node is cordoned; `kubectl uncordon NODE` once it is fit, or choose another node.",
)
NODE_TAINTS = register_once(
    "SB253",
    "Target node's taints are tolerated by the recipe's Pods",
    "A NoSchedule taint the Pods do not tolerate keeps them Pending; an untolerated "
    "NoExecute taint evicts them even when they are bound by nodeName, and a NoExecute "
    "toleration with tolerationSeconds evicts them once the seconds run out. GPU nodes "
    "are commonly tainted (nvidia.com/gpu, dedicated=...) to keep other work off them.",
    "Add a matching toleration to the recipe's Pods (key, operator, value, effect as in "
    "`kubectl get node NODE -o jsonpath='{.spec.taints}'`), or choose an untainted node.",
)

# ---------------------------------------------------------------------------------------
# Taints.


# Taints the node controllers set to mirror a state that SB251/SB252 already report.
_CORDON_TAINT = "node.kubernetes.io/unschedulable"
_NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


@dataclass(frozen=True)
class TaintVerdict:
    taint: Obj
    severity: Severity
    why: str


def taint_verdicts(node: Obj, tolerations: Sequence[Obj]) -> list[TaintVerdict]:
    """Each of the node's taints, judged against ``tolerations``.

    NoSchedule/NoExecute untolerated: FAIL.  NoExecute tolerated only for
    ``tolerationSeconds``: FAIL (the Pods are evicted when they run out; Kubernetes takes
    the least of the matching tolerations' seconds).  PreferNoSchedule untolerated: WARN
    (the scheduler avoids the node but may use it).  Taints that mirror a cordon or a
    NotReady node are left to SB252 and SB251.
    """
    out: list[TaintVerdict] = []
    cordoned = is_cordoned(node)
    ready = is_ready(node)
    for taint in (node.get("spec") or {}).get("taints") or ():
        key = taint.get("key")
        if (key == _CORDON_TAINT and cordoned) or (key in _NOT_READY_TAINTS and not ready):
            continue
        effect = taint.get("effect")
        matching = [t for t in tolerations if tolerates(t, taint)]
        if not matching:
            if effect == "PreferNoSchedule":
                out.append(TaintVerdict(taint, Severity.WARN, "not tolerated (scheduler avoids)"))
            else:
                out.append(TaintVerdict(taint, Severity.FAIL, "not tolerated"))
            continue
        timed = []
        for t in matching:
            seconds = t.get("tolerationSeconds")
            if seconds is None:
                continue
            if isinstance(seconds, bool) or not isinstance(seconds, int):
                raise BadObject(f"toleration {dict(t)}: tolerationSeconds must be an integer")
            timed.append(seconds)
        if effect == "NoExecute" and timed:
            out.append(
                TaintVerdict(
                    taint, Severity.FAIL, f"tolerated for {max(0, min(timed))} s, then evicted"
                )
            )
        else:
            out.append(TaintVerdict(taint, Severity.PASS, "tolerated"))
    return out


# ---------------------------------------------------------------------------------------
# The checks of one node.


def node_subject(name: str) -> str:
    return f"node/{name}"


def fix_for(check: Check, node: str) -> str:
    return check.fix.replace("NODE", node)


def nodes_by_label(nodes: Mapping[str, Obj], label: str) -> dict[str, list[str]]:
    """Label value -> names of the nodes carrying it (built once per check run)."""
    out: dict[str, list[str]] = defaultdict(list)
    for name, node in nodes.items():
        value = labels_of(node).get(label)
        if value is not None:
            out[value].append(name)
    return out


def resolve_node(
    nodes: Mapping[str, Obj],
    ask: NodeAsk,
    by_label: Mapping[str, Sequence[str]] | None = None,
) -> tuple[Obj | None, Finding]:
    """The Node the Pods of ``ask`` land on, and the SB250 finding that says so.

    With ``ask.selector`` (the render's ``nodeSelector`` on ``kubernetes.io/hostname``) the
    node is the one whose label has the asked value, whatever its name; with no selector
    (``spec.nodeName``) it is the node of that name.  No node, or several carrying the
    label, is a failure: the Pods would stay Pending, or land where the weights are not.
    """
    subject = node_subject(ask.node)
    label = ask.selector
    evidence: dict[str, Any] = {"node": ask.node, "selector": label or "spec.nodeName"}
    if label is None:
        matches = [ask.node] if ask.node in nodes else []
    else:
        index = by_label if by_label is not None else nodes_by_label(nodes, label)
        matches = list(index.get(ask.node, ()))
    evidence["matches"] = matches
    how = f"{label}={ask.node}" if label else f"the name {ask.node}"
    if len(matches) == 1:
        name = matches[0]
        message = f"node {name} exists"
        if name != ask.node:
            message += f" (the Pods select it by {how})"
        return nodes[name], NODE_EXISTS.finding(Severity.PASS, subject, message, evidence=evidence)
    if len(matches) > 1:
        return None, NODE_EXISTS.finding(
            Severity.FAIL,
            subject,
            f"{len(matches)} nodes carry {how} ({', '.join(sorted(matches))}): the Pods of "
            f"{roles_text(ask)} could land on any of them, and the model directory is on one",
            hint=f"Give each node a distinct {label} label, or pin the role by node name.",
            evidence=evidence,
        )
    hint = ""
    if label is not None and ask.node in nodes:
        actual = labels_of(nodes[ask.node]).get(label)
        hint = (
            f"The node named {ask.node} has {label}={actual}, and the Pods select by that "
            f"label: set the node parameter to {actual}."
            if actual
            else f"The node named {ask.node} has no {label} label, which the Pods select by."
        )
    elif label is None:
        by_hostname = nodes_by_label(nodes, HOSTNAME_LABEL).get(ask.node, [])
        if by_hostname:
            hint = (
                f"{ask.node} is the {HOSTNAME_LABEL} label of node {by_hostname[0]}; the "
                f"Pods are pinned by node name: set the node parameter to {by_hostname[0]}."
            )
    if not hint:
        candidates = (
            list(nodes)
            if label is None
            else sorted({v for n in nodes.values() if (v := labels_of(n).get(label)) is not None})
        )
        close = difflib.get_close_matches(ask.node, candidates, n=3, cutoff=0.6)
        if close:
            hint = f"Did you mean {' or '.join(close)}? ({NODE_EXISTS.fix})"
    where = f"no node has {how}" if label else f"no node named {ask.node}"
    return None, NODE_EXISTS.finding(
        Severity.FAIL,
        subject,
        f"{where} in the cluster ({len(nodes)} nodes); the Pods of {roles_text(ask)} would "
        "stay Pending",
        hint=hint,
        evidence=evidence,
    )


def check_node_exists(nodes: Mapping[str, Obj], ask: NodeAsk) -> Finding:
    return resolve_node(nodes, ask)[1]


def check_node_ready(node: Obj, subject: str = "") -> Finding:
    name = name_of(node)
    subject = subject or node_subject(name)
    cond = condition(node, "Ready")
    if cond is None:
        return NODE_READY.finding(
            Severity.FAIL,
            subject,
            f"node {name} reports no Ready condition (the kubelet never registered status)",
            evidence={"conditions": []},
        )
    status = cond.get("status")
    evidence = {
        k: cond.get(k)
        for k in ("status", "reason", "message", "lastHeartbeatTime", "lastTransitionTime")
        if cond.get(k) is not None
    }
    if status == "True":
        return NODE_READY.finding(
            Severity.PASS, subject, f"node {name} is Ready", evidence=evidence
        )
    state = "NotReady" if status == "False" else f"Ready={status}"
    detail = "; ".join(str(cond[k]) for k in ("reason", "message") if cond.get(k))
    since = f" since {cond['lastTransitionTime']}" if cond.get("lastTransitionTime") else ""
    return NODE_READY.finding(
        Severity.FAIL,
        subject,
        f"node {name} is {state}{since}" + (f": {detail}" if detail else ""),
        hint=fix_for(NODE_READY, name),
        evidence=evidence,
    )


def check_node_schedulable(node: Obj, subject: str = "") -> Finding:
    name = name_of(node)
    subject = subject or node_subject(name)
    if is_cordoned(node):
        return NODE_SCHEDULABLE.finding(
            Severity.FAIL,
            subject,
            f"node {name} is cordoned (spec.unschedulable: true): new Pods are not scheduled there",
            hint=fix_for(NODE_SCHEDULABLE, name),
            evidence={"unschedulable": True},
        )
    return NODE_SCHEDULABLE.finding(Severity.PASS, subject, f"node {name} is schedulable")


def check_node_taints(node: Obj, ask: NodeAsk, subject: str = "") -> Finding:
    name = name_of(node)
    subject = subject or node_subject(name)
    verdicts = taint_verdicts(node, ask.tolerations)
    evidence: dict[str, Any] = {
        "taints": [
            {"taint": taint_text(v.taint), "verdict": v.severity.value, "why": v.why}
            for v in verdicts
        ],
        "tolerations": [dict(t) for t in ask.tolerations],
    }
    failing = [v for v in verdicts if v.severity is Severity.FAIL]
    warning = [v for v in verdicts if v.severity is Severity.WARN]
    if failing:
        listed = ", ".join(f"{taint_text(v.taint)} ({v.why})" for v in failing)
        return NODE_TAINTS.finding(
            Severity.FAIL,
            subject,
            f"node {name} has taint{'s' if len(failing) > 1 else ''} the Pods of "
            f"{roles_text(ask)} do not tolerate: {listed}",
            hint=fix_for(NODE_TAINTS, name),
            evidence=evidence,
        )
    if warning:
        listed = ", ".join(taint_text(v.taint) for v in warning)
        return NODE_TAINTS.finding(
            Severity.WARN,
            subject,
            f"node {name} has PreferNoSchedule taint(s) the Pods do not tolerate: {listed}; "
            "the scheduler avoids the node but may still use it",
            hint=fix_for(NODE_TAINTS, name),
            evidence=evidence,
        )
    all_taints = (node.get("spec") or {}).get("taints") or ()
    if verdicts:
        listed = ", ".join(taint_text(v.taint) for v in verdicts)
        message = f"every taint on node {name} is tolerated: {listed}"
    elif all_taints:
        listed = ", ".join(taint_text(t) for t in all_taints)
        message = (
            f"node {name}'s taints ({listed}) mirror its cordon or NotReady state, reported "
            "on their own"
        )
    else:
        message = f"node {name} has no taints"
    return NODE_TAINTS.finding(Severity.PASS, subject, message, evidence=evidence)


__all__ = [
    "NODE_EXISTS",
    "NODE_READY",
    "NODE_SCHEDULABLE",
    "NODE_TAINTS",
    "TaintVerdict",
    "check_node_exists",
    "check_node_ready",
    "check_node_schedulable",
    "check_node_taints",
    "fix_for",
    "node_subject",
    "nodes_by_label",
    "resolve_node",
    "taint_verdicts",
]
