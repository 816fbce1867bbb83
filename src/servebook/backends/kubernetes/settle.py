"""Waiting for what a deletion leaves behind: ``down`` until its objects are really gone,
``up`` until what an earlier ``down`` left has gone.

A DELETE is not the end of an object.  ``down`` deletes in the Foreground, so each
Deployment (or LeaderWorkerSet) stays, with a ``deletionTimestamp`` and the
``foregroundDeletion`` finalizer, until its ReplicaSets and Pods are gone; each Pod stays
for its grace period (an engine's drain time); a Namespace stays ``Terminating`` until all
of its content is gone, and refuses every create meanwhile (403 "unable to create new
content in namespace X because it is being terminated").  An ``up`` into that namespace
fails, and an object still there is patched and then vanishes under the rollout.

``wait_gone`` polls until every object named is 404 (bounded, saying what is left as it
changes); ``down`` reports each one gone or, past the bound, still terminating (not
complete: the record is kept).  ``wait_settled`` is ``up``'s: a namespace or object of the
apply that is being deleted is waited for, saying so, before anything is applied.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from servebook.errors import UsageError
from servebook.kube.objects import is_terminating, meta_of
from servebook.kube.resources import get, list_objects, object_text

Obj = dict[str, Any]
POLL_S = 2.0
# Beyond the longest grace period of the Pods being stopped: the controllers' own passes.
SETTLE_MARGIN_S = 120.0


@dataclass(frozen=True)
class Ref:
    api_version: str
    kind: str
    name: str
    namespace: str | None

    @property
    def what(self) -> str:
        return object_text(self.kind, self.name, self.namespace)


def _holding(obj: Obj) -> str:
    """What keeps a terminating object: its finalizers, a Namespace's phase."""
    meta = meta_of(obj)
    parts = [str(f) for f in meta.get("finalizers") or ()]
    if obj.get("kind") == "Namespace" or (obj.get("status") or {}).get("phase") == "Terminating":
        parts = ["Terminating", *parts]
    return ", ".join(parts) or "deleting"


def grace_bound_s(pods: Sequence[Obj]) -> float:
    """How long stopping ``pods`` may take: their longest grace period, plus the margin."""
    grace = [
        float((p.get("spec") or {}).get("terminationGracePeriodSeconds", 30) or 0) for p in pods
    ]
    return max(grace, default=30.0) + SETTLE_MARGIN_S


def wait_gone(
    api: Any,
    refs: Sequence[Ref],
    *,
    timeout_s: float,
    say: Callable[[str], None],
    poll_s: float = POLL_S,
    pods: tuple[str, str] | None = None,
) -> list[str]:
    """Poll until every object of ``refs`` is gone (404), and the Pods of ``pods``
    (namespace, label selector) too; what is left (``what: why``) when ``timeout_s`` ran
    out, else []."""
    deadline = time.monotonic() + timeout_s
    said = ""
    started = time.monotonic()
    while True:
        left = []
        for r in refs:
            got = get(api, r.api_version, r.kind, r.namespace, r.name)
            if got is not None:
                left.append(f"{r.what} ({_holding(got)})")
        if pods is not None:
            n = len(list_objects(api, "Pod", pods[0], pods[1]))
            if n:
                left.append(f"{n} Pod(s) in namespace {pods[0]} stopping")
        if not left:
            return []
        text = "; ".join(left)
        if text != said:
            waited = time.monotonic() - started
            say(f"waiting for the cluster to finish deleting ({waited:.0f} s): {text}")
            said = text
        if time.monotonic() >= deadline:
            return left
        time.sleep(poll_s)


def wait_settled(
    api: Any,
    namespace: str,
    ns_obj: Obj | None,
    live: Sequence[Obj],
    *,
    timeout_s: float,
    say: Callable[[str], None],
    poll_s: float = POLL_S,
) -> bool:
    """Before an apply: wait (bounded, saying so) for a Terminating ``namespace`` and for
    any of ``live`` (the apply's objects as the cluster has them) that is being deleted to
    be gone.  Whether it waited (what it read before is stale then).  ``UsageError`` (exit
    2) when they are still there at the bound."""
    refs = []
    if ns_obj is not None and is_terminating(ns_obj):
        say(
            f"namespace {namespace} is being deleted (Terminating, from an earlier down): "
            "waiting for it to go before creating it again"
        )
        refs.append(Ref("v1", "Namespace", namespace, None))
    else:
        for got in live:
            meta = meta_of(got)
            if is_terminating(got):
                kind, version = str(got.get("kind")), str(got.get("apiVersion"))
                refs.append(Ref(version, kind, meta["name"], meta.get("namespace")))
        if refs:
            say(
                "objects of this deployment are still being deleted (an earlier down): "
                "waiting for them to go before applying: " + ", ".join(r.what for r in refs)
            )
    if not refs:
        return False
    left = wait_gone(api, refs, timeout_s=timeout_s, say=say, poll_s=poll_s)
    if left:
        raise UsageError(
            f"still being deleted after {timeout_s:.0f} s: {'; '.join(left)}. Nothing was "
            f"applied. `kubectl get namespace {namespace} -o yaml` (its status.conditions) "
            "says what holds it; up again once it is gone."
        )
    return True


__all__ = ["Ref", "grace_bound_s", "wait_gone", "wait_settled"]
