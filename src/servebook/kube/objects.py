"""Reading Kubernetes API objects: pure accessors over the plain dicts the API returns (the
shape ``kubectl get -o json`` prints), written once for the rollout verdicts
(``kube.rollout``), the cluster checks of preflight (``preflight.cluster``), the backend
and the port-forward watcher.

Metadata (name, labels, annotations, owners), conditions (Ready, cordoned), container
states (restarts, why a Pod waits), resource quantities, what a Pod requests and holds on
its node, and whether a toleration matches a taint, each by Kubernetes' own rule.  Every
accessor reads a missing or null field as absent: a Pod without ``status`` yet is a Pod
with no conditions and no restarts.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from typing import Any

Obj = Mapping[str, Any]

# ---------------------------------------------------------------------------------------
# Metadata.


def meta_of(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def name_of(obj: Obj, default: str = "?") -> str:
    return str(meta_of(obj).get("name") or default)


def labels_of(obj: Obj) -> Mapping[str, str]:
    return meta_of(obj).get("labels") or {}


def annotations_of(obj: Obj) -> Mapping[str, str]:
    return meta_of(obj).get("annotations") or {}


def annotation(obj: Obj, key: str) -> str | None:
    value = annotations_of(obj).get(key)
    return None if value is None else str(value)


def pod_ref(pod: Obj) -> str:
    """``namespace/name``, as a person looks the Pod up."""
    meta = meta_of(pod)
    return f"{meta.get('namespace') or '?'}/{meta.get('name') or '?'}"


def owned_by(obj: Obj, kind: str, name: str, uid: str | None = None) -> bool:
    """Whether ``obj``'s controlling owner is the ``kind`` named ``name`` (and, when both
    are known, of that ``uid``: a deleted and re-created owner is another object)."""
    for ref in meta_of(obj).get("ownerReferences") or []:
        if (
            ref.get("kind") == kind
            and ref.get("name") == name
            and ref.get("controller", True) is not False
            and (not uid or not ref.get("uid") or ref.get("uid") == uid)
        ):
            return True
    return False


def parse_time(text: str | None) -> datetime | None:
    """An API timestamp (``2026-01-02T03:04:05Z``); None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def event_since(event: Mapping[str, Any], since: datetime) -> bool:
    """Whether ``event`` was last seen at or after ``since``.  An Event's
    ``lastTimestamp`` has whole seconds (metav1.Time is RFC 3339 without a fraction), so
    an event of the same second as ``since`` but earlier in it reads as before it: compare
    whole seconds.  An event without a time counts as recent."""
    when = parse_time(event.get("lastTimestamp") or event.get("eventTime"))
    return when is None or when >= since.replace(microsecond=0)


def as_int(value: Any, default: int = 0) -> int:
    """A counter the API may omit (``status.updatedReplicas`` is absent when 0)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


# ---------------------------------------------------------------------------------------
# Conditions, Pods and containers.


def condition(obj: Obj, kind: str) -> Obj | None:
    """The ``status.conditions`` entry of type ``kind`` (a Node's or a Pod's)."""
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return cond
    return None


def is_ready(obj: Obj) -> bool:
    """A Node or Pod whose Ready condition is True."""
    cond = condition(obj, "Ready")
    return cond is not None and cond.get("status") == "True"


def is_cordoned(node: Obj) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def is_terminating(obj: Obj) -> bool:
    return bool(meta_of(obj).get("deletionTimestamp"))


def restarts(pod: Obj) -> int:
    """The sum of the Pod's containers' ``restartCount``."""
    return sum(
        int(cs.get("restartCount") or 0)
        for cs in (pod.get("status") or {}).get("containerStatuses") or []
    )


def container_statuses(pod: Obj) -> list[Obj]:
    """The statuses a Pod's verdict reads: its init containers' that have not finished
    well (one crash-looping makes the Pod's containers wait forever: ``up`` waited out its
    whole timeout on a ``make-model`` that could not import numpy, saying nothing), then
    its containers'."""
    status = pod.get("status") or {}
    unfinished = [
        cs
        for cs in status.get("initContainerStatuses") or []
        if ((cs.get("state") or {}).get("terminated") or {}).get("exitCode") != 0
    ]
    return [*unfinished, *(status.get("containerStatuses") or [])]


def pod_state(pod: Obj) -> str:
    """The Pod's phase, as ``kubectl get pods`` would show why: ``Pending (ContainerCreating)``."""
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "no phase")
    reasons = []
    statuses = [
        *(status.get("initContainerStatuses") or ()),
        *(status.get("containerStatuses") or ()),
    ]
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            reasons.append(str(waiting["reason"]))
    if is_terminating(pod):
        reasons.append("Terminating")
    uniq = list(dict.fromkeys(reasons))
    return f"{phase} ({', '.join(uniq)})" if uniq else phase


# The kubelet's event when a hostPath volume of type Directory is absent on the node.
_HOSTPATH_ABSENT = re.compile(r"hostPath type check failed: (?P<path>\S+) is not a directory")


def hostpath_absent(message: str) -> str | None:
    """The node path an event message says is absent (a hostPath ``type: Directory`` whose
    directory does not exist), else None."""
    m = _HOSTPATH_ABSENT.search(message)
    return m.group("path") if m else None


# ---------------------------------------------------------------------------------------
# Quantities.


class BadObject(ValueError):
    """An API object that cannot be read (only in a hand-edited snapshot: the API server
    validates what it stores).  Reported as an ERROR finding: could not decide."""


_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}


# An exact amount: a plain int for the common whole counts ("8"), a Fraction otherwise
# ("500m"); the two mix exactly, and ints keep a 60,000-pod cluster fast to sum.
Amount = int | Fraction


def parse_quantity(value: Any, where: str = "quantity") -> Amount:
    """A Kubernetes resource quantity ("8", "1k", "500m", "1Ti", "1e3") as an exact number."""
    if isinstance(value, bool):
        raise BadObject(f"{where}: {value!r} is not a Kubernetes quantity")
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        raise BadObject(f"{where}: {value!r} is not a Kubernetes quantity")
    if value.isdigit() and value.isascii():
        return int(value)
    m = _QUANTITY.match(value.strip())
    if m is None:
        raise BadObject(f"{where}: {value!r} is not a Kubernetes quantity")
    number = Fraction(m.group("num"))
    suffix = m.group("suffix") or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    if suffix:
        return number * Fraction(10) ** int(suffix[1:])
    return number


def amount_text(q: Amount) -> int | str:
    """A quantity for a message or evidence: whole numbers as ints."""
    return int(q) if q.denominator == 1 else str(float(q))


# ---------------------------------------------------------------------------------------
# What Pods request and hold on their node.


def _container_request(container: Obj, resource: str, where: str) -> Amount:
    # Kubernetes defaults a container's request to its limit when only the limit is set
    # (and extended resources such as GPUs cannot be overcommitted: request == limit), so
    # a Pod that names GPUs only under limits holds them all the same.
    res = container.get("resources") or {}
    requests = res.get("requests") or {}
    limits = res.get("limits") or {}
    value = requests.get(resource, limits.get(resource))
    if value is None:
        return 0
    return parse_quantity(value, f"{where} container {container.get('name')!r} {resource}")


def pod_request(pod: Obj, resource: str) -> Amount:
    """The Pod's effective request for ``resource``, by Kubernetes' rule.

    Init containers run one at a time before the app containers, so they need the most
    any one of them asks, not the sum; app containers run together, so they need the sum:
    ``max(max(init containers), sum(containers))``.  Sidecars (init containers with
    ``restartPolicy: Always``) keep running beside everything started after them, so they
    add to the app containers' sum and to every later init container:
    ``max(sum(containers) + sum(sidecars), max_i(init_i + sidecars started before i))``.
    Pod ``spec.overhead`` (RuntimeClass) is added on top.  Requests default to limits.
    """
    spec = pod.get("spec") or {}
    where = f"pod {pod_ref(pod)}"
    total: Amount = 0
    for c in spec.get("containers") or ():
        total += _container_request(c, resource, where)
    sidecars: Amount = 0
    init_peak: Amount = 0
    for c in spec.get("initContainers") or ():
        req = _container_request(c, resource, where)
        if c.get("restartPolicy") == "Always":
            sidecars += req
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, req + sidecars)
    effective = max(total + sidecars, init_peak)
    overhead = (spec.get("overhead") or {}).get(resource)
    if overhead is not None:
        effective += parse_quantity(overhead, f"{where} spec.overhead {resource}")
    return effective


_DONE_PHASES = frozenset({"Succeeded", "Failed"})


def holds_devices(pod: Obj) -> bool:
    """True while the Pod can hold devices: every phase but Succeeded and Failed.

    Pending pods bound to a node (ContainerCreating, pulling an image) hold theirs: the
    kubelet admitted them and the scheduler counts them.  So do terminating pods until they
    are gone, and pods with no phase yet.
    """
    return (pod.get("status") or {}).get("phase") not in _DONE_PHASES


def index_pods_by_node(pods: Iterable[Obj]) -> dict[str, list[Obj]]:
    """Pods that hold devices, by the node they are bound to (``spec.nodeName``)."""
    by_node: dict[str, list[Obj]] = defaultdict(list)
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and holds_devices(pod):
            by_node[node].append(pod)
    return by_node


@dataclass(frozen=True)
class Holder:
    pod: str  # namespace/name
    count: Amount
    state: str


@dataclass(frozen=True)
class Accelerators:
    resource: str
    allocatable: Amount
    holders: tuple[Holder, ...] = field(default_factory=tuple)

    @property
    def held(self) -> Amount:
        return sum((h.count for h in self.holders), 0)

    @property
    def free(self) -> Amount:
        return self.allocatable - self.held


def allocatable(node: Obj, resource: str) -> Amount | None:
    value = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    if value is None:
        return None
    return parse_quantity(value, f"node {name_of(node)} status.allocatable {resource}")


def accelerators_on_node(node: Obj, pods_on_node: Iterable[Obj], resource: str) -> Accelerators:
    """``resource`` on ``node``: allocatable, and which of the given Pods hold how much.

    ``pods_on_node`` are the Pods bound to the node that hold devices
    (``index_pods_by_node``); Pods whose effective request is zero are left out.
    """
    holders = []
    for pod in pods_on_node:
        count = pod_request(pod, resource)
        if count:
            holders.append(Holder(pod_ref(pod), count, pod_state(pod)))
    holders.sort(key=lambda h: (-h.count, h.pod))
    return Accelerators(resource, allocatable(node, resource) or 0, tuple(holders))


# ---------------------------------------------------------------------------------------
# Taints and tolerations.


def tolerates(toleration: Obj, taint: Obj) -> bool:
    """Kubernetes' ``Toleration.ToleratesTaint``, rule for rule.

    An empty effect matches every effect; an empty key matches every key (valid only with
    ``Exists``, so ``{operator: Exists}`` tolerates everything); ``Exists`` ignores the
    value; ``Equal`` (the default operator) needs the same value.  Unknown operators
    tolerate nothing.
    """
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def taint_text(taint: Obj) -> str:
    """``key=value:Effect``, as ``kubectl taint`` takes it."""
    value = taint.get("value")
    key = taint.get("key") or ""
    return f"{key}={value}:{taint.get('effect')}" if value else f"{key}:{taint.get('effect')}"


__all__ = [
    "Accelerators",
    "Amount",
    "BadObject",
    "Holder",
    "accelerators_on_node",
    "allocatable",
    "amount_text",
    "annotation",
    "annotations_of",
    "as_int",
    "condition",
    "holds_devices",
    "hostpath_absent",
    "index_pods_by_node",
    "is_cordoned",
    "is_ready",
    "is_terminating",
    "labels_of",
    "meta_of",
    "name_of",
    "owned_by",
    "parse_quantity",
    "parse_time",
    "pod_ref",
    "pod_request",
    "pod_state",
    "restarts",
    "taint_text",
    "tolerates",
]
