"""Cluster checks of ``servebook preflight`` (ids ``SB250``-``SB299``): pure functions over
Kubernetes API objects.

Every input is a plain dict in the shape ``kubectl get -o json`` prints (a Node, a Pod, a
Namespace, a CustomResourceDefinition), gathered in a ``ClusterSnapshot`` that was read
either from a file or live (``servebook.kube.snapshot``).  Nothing here does I/O, so each
check is tested on real API objects without a cluster.

What the recipe asks of the cluster is a ``ClusterRequirements`` (``requirements_from_plan``
builds it from a Plan); ``check_cluster(snapshot, requirements)`` returns the findings.

A hand-written pre-flight got these wrong in the field (``reference/field-notes.md``,
"Pre-flight"): it passed a cordoned node and a NoSchedule-tainted node, and counted free
GPUs in one namespace and over Running pods only, missing a pod in ``default`` that held all
eight.  Here a device is held by every Pod bound to the node, in every namespace, whose phase
is neither Succeeded nor Failed: Pending pods (ContainerCreating, pulling an image) and
terminating pods hold their devices too.
"""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from servebook.findings import REGISTRY, Check, Finding, Severity, UsageError, register

if TYPE_CHECKING:
    from servebook.kube.snapshot import ClusterSnapshot
    from servebook.recipe.plan import Plan

Obj = Mapping[str, Any]


def _check(id: str, title: str, rationale: str, fix: str) -> Check:
    # A module reload (tests) must not register the same id twice.
    return REGISTRY.get(id) or register(id, title, rationale, fix)


# ---------------------------------------------------------------------------------------
# The checks.  Ids are stable: docs, CI configs and people refer to them.

NODE_EXISTS = _check(
    "SB250",
    "Target node exists",
    "A Pod pinned to a node name that is not in the cluster stays Pending forever (with "
    "nodeName it is never even scheduled, and no event says why); the deploy times out "
    "after its full ready timeout instead of failing at once.",
    "Use a name from `kubectl get nodes` (the node's metadata.name, which can differ from "
    "its hostname) in the recipe's node parameter.",
)
NODE_READY = _check(
    "SB251",
    "Target node is Ready",
    "On a node whose Ready condition is False or Unknown the kubelet is not running Pods (or "
    "cannot report them): the engine Pods never start, or start and are evicted once the "
    "node controller's not-ready taint takes effect.",
    "Look at `kubectl describe node NODE` (conditions, kubelet and runtime status) and fix "
    "the node, or choose a Ready node.",
)
NODE_SCHEDULABLE = _check(
    "SB252",
    "Target node is not cordoned",
    "A cordoned node (spec.unschedulable) takes no new Pods: the scheduler leaves the "
    "engine Pods Pending. Nodes are usually cordoned on purpose (drain, maintenance, a "
    "broken GPU), so deploying there also fights whoever cordoned it.",
    "Ask why the node is cordoned; `kubectl uncordon NODE` once it is fit, or choose another node.",
)
NODE_TAINTS = _check(
    "SB253",
    "Target node's taints are tolerated by the recipe's Pods",
    "A NoSchedule taint the Pods do not tolerate keeps them Pending; an untolerated "
    "NoExecute taint evicts them even when they are bound by nodeName, and a NoExecute "
    "toleration with tolerationSeconds evicts them once the seconds run out. GPU nodes "
    "are commonly tainted (nvidia.com/gpu, dedicated=...) to keep other work off them.",
    "Add a matching toleration to the recipe's Pods (key, operator, value, effect as in "
    "`kubectl get node NODE -o jsonpath='{.spec.taints}'`), or choose an untainted node.",
)
FREE_ACCELERATORS = _check(
    "SB254",
    "Enough free accelerators on the target node",
    "The scheduler admits a Pod only where allocatable minus what every bound Pod requests "
    "covers its request: with too few free GPUs the engine Pod stays Pending. Counting "
    "only Running pods or only one namespace misses Pending/ContainerCreating pods and "
    "other teams' pods that hold devices (a pod in `default` holding all 8 GPUs was missed "
    "this way).",
    "Free the devices (the finding names the pods that hold them), lower the recipe's "
    "gpus, or choose a node with enough free devices.",
)
RDMA_ADVERTISED = _check(
    "SB255",
    "RDMA resource advertised on the target node",
    "Prefill/decode KV transfer over RDMA needs the node's RDMA device plugin to advertise "
    "the resource: a Pod requesting an unadvertised resource stays Pending, and one "
    "deployed without it falls back to TCP (or fails the connector handshake) and the "
    "disaggregated numbers are not what the topology promised.",
    "Install or fix the RDMA device plugin on the node (its allocatable must list the "
    "resource), or choose a node that advertises it.",
)
NAMESPACE_READY = _check(
    "SB256",
    "Namespace exists or the rendered set creates it",
    "Applying into a namespace that does not exist fails part-way through a multi-object "
    'apply (`namespaces "x" not found`); a namespace that is Terminating rejects every '
    "new object.",
    "Create it (`kubectl create namespace NAME`), render with the namespace included, or "
    "pick an existing namespace.",
)
CRDS_INSTALLED = _check(
    "SB257",
    "Required CustomResourceDefinitions are installed and established",
    "Objects of a kind whose CRD is missing are rejected by the API server (`no matches "
    "for kind`), part-way through the apply; a CRD that is not Established does not serve "
    "its kind yet.",
    "Install the controller that provides the kind (for LeaderWorkerSet: "
    "https://lws.sigs.k8s.io/docs/installation/) and wait for "
    "`kubectl wait --for condition=established crd/NAME`.",
)
ROLE_PLACED = _check(
    "SB258",
    "Role is pinned to a node",
    "A role without a node is placed by the scheduler, so no node check (readiness, "
    "taints, free accelerators) can be made for it in advance, and its hostPath model "
    "directory may not exist on the node it lands on.",
    "Set the role's placement node (the recipe's node parameter) to the node that holds "
    "its weights.",
)

MIG_SLICES = _check(
    "SB260",
    "Target node's GPUs are whole GPUs, not MIG slices",
    "With MIG strategy `single` (NVIDIA GPU operator, device plugin and feature discovery), "
    "a node whose GPUs are partitioned advertises each MIG slice as nvidia.com/gpu: a Pod "
    "asking for 8 GPUs gets 8 slices such as 1g.10gb. A CUDA process sees one MIG device "
    "only, so tensor parallelism over them fails at start-up, and each slice holds a "
    "fraction of the memory the recipe was sized for. The strategy label alone says "
    "nothing: `single` is the operator's default, with MIG off.",
    "Choose a node whose nvidia.com/gpu.product has no -MIG- suffix, or have the cluster's "
    "admin turn MIG off on the node (with the GPU operator's MIG manager: `kubectl label "
    "node NODE nvidia.com/mig.config=all-disabled --overwrite`).",
)
RDMA_FREE = _check(
    "SB261",
    "Enough free RDMA devices on the target node",
    "An RDMA device plugin advertises a fixed number of devices (one per HCA or virtual "
    "function with SR-IOV, a shared pool otherwise); the scheduler admits a Pod only where "
    "allocatable minus what every bound Pod requests covers its request, in every "
    "namespace and every phase but Succeeded and Failed. With too few free the engine Pod "
    "stays Pending, while the GPUs it also needs look free.",
    "Free the devices (the finding names the Pods that hold them), or choose a node with "
    "enough free; with SR-IOV, the device plugin's config sets how many virtual functions "
    "each node advertises.",
)

CHECKS: tuple[Check, ...] = (
    NODE_EXISTS,
    NODE_READY,
    NODE_SCHEDULABLE,
    NODE_TAINTS,
    FREE_ACCELERATORS,
    RDMA_ADVERTISED,
    NAMESPACE_READY,
    CRDS_INSTALLED,
    ROLE_PLACED,
    MIG_SLICES,
    RDMA_FREE,
)

# ---------------------------------------------------------------------------------------
# What the recipe asks of the cluster.

DEFAULT_NAMESPACE = "servebook"
LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
# The render pins each Pod with `nodeSelector: {kubernetes.io/hostname: NODE}`.
HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class NodeAsk:
    """What the Pods pinned to one node need from it.

    ``node`` is the value the recipe gives; ``selector`` says how the Pods pick the node
    with it: a ``nodeSelector`` on that label (the render uses ``kubernetes.io/hostname``,
    whose value can differ from the node's name), or ``None`` for ``spec.nodeName`` (the
    node's ``metadata.name``).  ``tolerations`` are Kubernetes tolerations as in a Pod spec
    (``key``, ``operator``, ``value``, ``effect``, ``tolerationSeconds``) that every Pod on
    this node carries.
    """

    node: str
    roles: tuple[str, ...]
    accelerators: int
    gpu_resource: str = "nvidia.com/gpu"
    rdma_resource: str | None = None
    tolerations: tuple[Obj, ...] = ()
    selector: str | None = HOSTNAME_LABEL
    # RDMA devices the Pods on this node request together; None: one per role.
    rdma_devices: int | None = None

    @property
    def rdma_needed(self) -> int:
        return len(self.roles) if self.rdma_devices is None else self.rdma_devices


@dataclass(frozen=True)
class UnplacedRole:
    role: str
    accelerators: int
    gpu_resource: str = "nvidia.com/gpu"


@dataclass(frozen=True)
class ClusterRequirements:
    namespace: str = DEFAULT_NAMESPACE
    # True when the rendered set contains the Namespace object itself.
    creates_namespace: bool = False
    # CRD names (``plural.group``) the rendered set's kinds need.
    crds: tuple[str, ...] = ()
    nodes: tuple[NodeAsk, ...] = ()
    unplaced: tuple[UnplacedRole, ...] = ()


def _accelerator_count(value: int | str, role: str, origin: str) -> int:
    if isinstance(value, bool):  # bool is an int; `gpus: true` is a mistake, not 1
        raise UsageError(f"{origin}: roles.{role}.resources.gpus is {value!r}; give a count.")
    if isinstance(value, int):
        count = value
    elif isinstance(value, str) and value.strip().isdigit():
        count = int(value.strip())
    else:
        raise UsageError(
            f"{origin}: roles.{role}.resources.gpus is {value!r}, not a whole number of "
            "devices; set it to a count such as 8 (or --set the parameter it refers to)."
        )
    if count < 0:
        raise UsageError(f"{origin}: roles.{role}.resources.gpus is {count}; it cannot be < 0.")
    return count


def requirements_from_plan(
    plan: Plan,
    *,
    creates_namespace: bool = False,
    crds: Iterable[str] = (),
    tolerations: Iterable[Obj] = (),
    selector: str | None = HOSTNAME_LABEL,
) -> ClusterRequirements:
    """What ``plan`` asks of the cluster.

    Each role's ``placement.node``, ``resources.gpus`` / ``gpu_resource`` /
    ``rdma_resource``; roles pinned to the same node add up their accelerators.  The
    namespace is the Plan's ``kubernetes.namespace`` when it has one, else
    ``plan.params["namespace"]``, else ``servebook``.  Tolerations are the Plan's
    ``kubernetes.tolerations`` (when it has them) plus ``tolerations``, on every role's
    Pods.  ``selector`` is how the Pods pick their node (see ``NodeAsk``).  The caller that
    renders the set says whether it creates the namespace and which CRDs its kinds need
    (``LWS_CRD`` when it uses LeaderWorkerSet).
    """
    # getattr: the Plan's kubernetes settings are newer than this module's first version.
    kube = getattr(plan, "kubernetes", None)
    tols = (*(getattr(kube, "tolerations", None) or ()), *tolerations)
    namespace = str(
        getattr(kube, "namespace", None) or plan.params.get("namespace") or DEFAULT_NAMESPACE
    )
    grouped: dict[str, list[tuple[str, int, str, str | None]]] = {}
    rdma_devices: dict[str, int] = {}
    unplaced: list[UnplacedRole] = []
    crds = list(crds)
    for role in plan.roles:
        res = role.resources
        count = _accelerator_count(res.gpus, role.name, plan.origin)
        # A role on several nodes (replicas, or a LeaderWorkerSet group) runs one Pod on
        # each listed node; a group needs the LeaderWorkerSet CRD.
        placement = role.placement
        nodes = getattr(placement, "all_nodes", None) or (
            [placement.node] if placement.node else []
        )
        if getattr(role, "nodes_per_replica", 1) > 1 and LWS_CRD not in crds:
            crds.append(LWS_CRD)
        for node in nodes:
            grouped.setdefault(node, []).append(
                (role.name, count, res.gpu_resource, res.rdma_resource)
            )
            if res.rdma_resource:
                per_pod = getattr(res, "rdma_count", None)
                rdma_devices[node] = rdma_devices.get(node, 0) + (
                    per_pod if isinstance(per_pod, int) and per_pod > 0 else 1
                )
        if not nodes:
            unplaced.append(UnplacedRole(role.name, count, res.gpu_resource))
    asks: list[NodeAsk] = []
    for node, roles in grouped.items():
        gpu_resources = sorted({r[2] for r in roles if r[1] > 0})
        if len(gpu_resources) > 1:
            raise UsageError(
                f"{plan.origin}: roles {', '.join(r[0] for r in roles)} share node {node} but "
                f"ask for different accelerator resources ({', '.join(gpu_resources)}); a "
                "node advertises one kind. Set the same resources.gpu_resource on each."
            )
        rdma = sorted({r[3] for r in roles if r[3]})
        if len(rdma) > 1:
            raise UsageError(
                f"{plan.origin}: roles {', '.join(r[0] for r in roles)} share node {node} but "
                f"ask for different RDMA resources ({', '.join(rdma)}). Use one "
                "resources.rdma_resource."
            )
        asks.append(
            NodeAsk(
                node=node,
                roles=tuple(r[0] for r in roles),
                accelerators=sum(r[1] for r in roles),
                gpu_resource=gpu_resources[0] if gpu_resources else roles[0][2],
                rdma_resource=rdma[0] if rdma else None,
                tolerations=tols,
                selector=selector,
                rdma_devices=rdma_devices.get(node),
            )
        )
    return ClusterRequirements(
        namespace=namespace,
        creates_namespace=creates_namespace,
        crds=tuple(dict.fromkeys(crds)),
        nodes=tuple(asks),
        unplaced=tuple(unplaced),
    )


# ---------------------------------------------------------------------------------------
# Quantities, requests, holders.


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


def _num(q: Amount) -> int | str:
    """A quantity for a message or evidence: whole numbers as ints."""
    return int(q) if q.denominator == 1 else str(float(q))


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name") or "?")


def pod_ref(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or '?'}/{meta.get('name') or '?'}"


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
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        reasons.append("Terminating")
    uniq = list(dict.fromkeys(reasons))
    return f"{phase} ({', '.join(uniq)})" if uniq else phase


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
    return parse_quantity(value, f"node {_name(node)} status.allocatable {resource}")


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
# Node conditions and taints.


def ready_condition(node: Obj) -> Obj | None:
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return cond
    return None


def is_ready(node: Obj) -> bool:
    cond = ready_condition(node)
    return cond is not None and cond.get("status") == "True"


def is_cordoned(node: Obj) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


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


def _taint_text(taint: Obj) -> str:
    value = taint.get("value")
    key = taint.get("key") or ""
    return f"{key}={value}:{taint.get('effect')}" if value else f"{key}:{taint.get('effect')}"


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
# The checks over one snapshot.


def _node_subject(name: str) -> str:
    return f"node/{name}"


def _roles_text(ask: NodeAsk, verb: str = "") -> str:
    """``role prefill needs`` / ``roles prefill, decode need``."""
    many = len(ask.roles) > 1
    text = f"role{'s' if many else ''} {', '.join(ask.roles)}"
    if verb:
        text += f" {verb}" if many else f" {verb}s"
    return text


def _fix_for(check: Check, node: str) -> str:
    return check.fix.replace("NODE", node)


def _labels(node: Obj) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def nodes_by_label(nodes: Mapping[str, Obj], label: str) -> dict[str, list[str]]:
    """Label value -> names of the nodes carrying it (built once per check run)."""
    out: dict[str, list[str]] = defaultdict(list)
    for name, node in nodes.items():
        value = _labels(node).get(label)
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
    subject = _node_subject(ask.node)
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
            f"{_roles_text(ask)} could land on any of them, and the model directory is on one",
            hint=f"Give each node a distinct {label} label, or pin the role by node name.",
            evidence=evidence,
        )
    hint = ""
    if label is not None and ask.node in nodes:
        actual = _labels(nodes[ask.node]).get(label)
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
            else sorted({v for n in nodes.values() if (v := _labels(n).get(label)) is not None})
        )
        close = difflib.get_close_matches(ask.node, candidates, n=3, cutoff=0.6)
        if close:
            hint = f"Did you mean {' or '.join(close)}? ({NODE_EXISTS.fix})"
    where = f"no node has {how}" if label else f"no node named {ask.node}"
    return None, NODE_EXISTS.finding(
        Severity.FAIL,
        subject,
        f"{where} in the cluster ({len(nodes)} nodes); the Pods of {_roles_text(ask)} would "
        "stay Pending",
        hint=hint,
        evidence=evidence,
    )


def check_node_exists(nodes: Mapping[str, Obj], ask: NodeAsk) -> Finding:
    return resolve_node(nodes, ask)[1]


def check_node_ready(node: Obj, subject: str = "") -> Finding:
    name = _name(node)
    subject = subject or _node_subject(name)
    cond = ready_condition(node)
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
        hint=_fix_for(NODE_READY, name),
        evidence=evidence,
    )


def check_node_schedulable(node: Obj, subject: str = "") -> Finding:
    name = _name(node)
    subject = subject or _node_subject(name)
    if is_cordoned(node):
        return NODE_SCHEDULABLE.finding(
            Severity.FAIL,
            subject,
            f"node {name} is cordoned (spec.unschedulable: true): new Pods are not scheduled there",
            hint=_fix_for(NODE_SCHEDULABLE, name),
            evidence={"unschedulable": True},
        )
    return NODE_SCHEDULABLE.finding(Severity.PASS, subject, f"node {name} is schedulable")


def check_node_taints(node: Obj, ask: NodeAsk, subject: str = "") -> Finding:
    name = _name(node)
    subject = subject or _node_subject(name)
    verdicts = taint_verdicts(node, ask.tolerations)
    evidence: dict[str, Any] = {
        "taints": [
            {"taint": _taint_text(v.taint), "verdict": v.severity.value, "why": v.why}
            for v in verdicts
        ],
        "tolerations": [dict(t) for t in ask.tolerations],
    }
    failing = [v for v in verdicts if v.severity is Severity.FAIL]
    warning = [v for v in verdicts if v.severity is Severity.WARN]
    if failing:
        listed = ", ".join(f"{_taint_text(v.taint)} ({v.why})" for v in failing)
        return NODE_TAINTS.finding(
            Severity.FAIL,
            subject,
            f"node {name} has taint{'s' if len(failing) > 1 else ''} the Pods of "
            f"{_roles_text(ask)} do not tolerate: {listed}",
            hint=_fix_for(NODE_TAINTS, name),
            evidence=evidence,
        )
    if warning:
        listed = ", ".join(_taint_text(v.taint) for v in warning)
        return NODE_TAINTS.finding(
            Severity.WARN,
            subject,
            f"node {name} has PreferNoSchedule taint(s) the Pods do not tolerate: {listed}; "
            "the scheduler avoids the node but may still use it",
            hint=_fix_for(NODE_TAINTS, name),
            evidence=evidence,
        )
    all_taints = (node.get("spec") or {}).get("taints") or ()
    if verdicts:
        listed = ", ".join(_taint_text(v.taint) for v in verdicts)
        message = f"every taint on node {name} is tolerated: {listed}"
    elif all_taints:
        listed = ", ".join(_taint_text(t) for t in all_taints)
        message = (
            f"node {name}'s taints ({listed}) mirror its cordon or NotReady state, reported "
            "on their own"
        )
    else:
        message = f"node {name} has no taints"
    return NODE_TAINTS.finding(Severity.PASS, subject, message, evidence=evidence)


_ACCELERATOR_RESOURCES = frozenset(
    {"habana.ai/gaudi", "aws.amazon.com/neuron", "aws.amazon.com/neuroncore", "google.com/tpu"}
)


def _other_accelerators(node: Obj, asked: str) -> dict[str, str]:
    """Accelerator resources the node advertises besides ``asked`` (amd.com/gpu, MIG slices)."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    out = {}
    for k, v in alloc.items():
        if k == asked or "/" not in k:
            continue
        short = k.rsplit("/", 1)[-1]
        if "gpu" in short or short.startswith("mig-") or k in _ACCELERATOR_RESOURCES:
            out[k] = str(v)
    return out


def check_free_accelerators(
    node: Obj,
    pods_on_node: Sequence[Obj],
    ask: NodeAsk,
    alternatives: Sequence[str] = (),
    subject: str = "",
) -> Finding:
    name = _name(node)
    subject = subject or _node_subject(name)
    resource = ask.gpu_resource
    needed = ask.accelerators
    if needed == 0:
        return FREE_ACCELERATORS.finding(
            Severity.PASS, subject, f"{_roles_text(ask, 'ask')} for no {resource}"
        )
    acc = accelerators_on_node(node, pods_on_node, resource)
    advertised = allocatable(node, resource)
    evidence: dict[str, Any] = {
        "resource": resource,
        "allocatable": _num(acc.allocatable),
        "held": _num(acc.held),
        "free": _num(acc.free),
        "needed": needed,
        "holders": [{"pod": h.pod, "count": _num(h.count), "state": h.state} for h in acc.holders],
    }
    alt = f" Nodes with {needed} free: {', '.join(alternatives)}." if alternatives else ""
    if advertised is None:
        others = _other_accelerators(node, resource)
        evidence["other_accelerators"] = others
        also = (
            f"; it advertises {', '.join(f'{k}: {v}' for k, v in others.items())}" if others else ""
        )
        capacity = ((node.get("status") or {}).get("capacity") or {}).get(resource)
        return FREE_ACCELERATORS.finding(
            Severity.FAIL,
            subject,
            f"node {name} advertises no {resource} (status.allocatable has none{also}); "
            f"{_roles_text(ask, 'need')} {needed}",
            hint=(
                "Set resources.gpu_resource to the resource the node advertises "
                f"({', '.join(others)})."
                if others
                else (
                    "The device plugin may not be running on the node (capacity: "
                    f"{capacity if capacity is not None else 'none'}): check its DaemonSet "
                    f"Pod there.{alt}"
                )
            ),
            evidence=evidence,
        )
    held_by = "; ".join(f"{h.pod}: {_num(h.count)} ({h.state})" for h in acc.holders)
    summary = (
        f"{_num(acc.free)} of {_num(acc.allocatable)} {resource} free on node {name}, "
        f"{_roles_text(ask, 'need')} {needed}"
    )
    capacity_raw = ((node.get("status") or {}).get("capacity") or {}).get(resource)
    if capacity_raw is not None:
        capacity = parse_quantity(capacity_raw, f"node {name} status.capacity {resource}")
        evidence["capacity"] = _num(capacity)
        if capacity > acc.allocatable:
            # The device plugin withholds devices it found unhealthy (XID errors, ECC).
            summary += (
                f" (capacity {_num(capacity)}: {_num(capacity - acc.allocatable)} not "
                "allocatable, e.g. reported unhealthy by the device plugin)"
            )
    message = summary + (f"; held by {held_by}" if held_by else "")
    if acc.free >= needed:
        return FREE_ACCELERATORS.finding(Severity.PASS, subject, message, evidence=evidence)
    return FREE_ACCELERATORS.finding(
        Severity.FAIL, subject, message, hint=FREE_ACCELERATORS.fix + alt, evidence=evidence
    )


def check_rdma(node: Obj, ask: NodeAsk, subject: str = "") -> Finding | None:
    if not ask.rdma_resource:
        return None
    name = _name(node)
    subject = subject or _node_subject(name)
    amount = allocatable(node, ask.rdma_resource)
    raw = ((node.get("status") or {}).get("allocatable") or {}).get(ask.rdma_resource)
    evidence = {"resource": ask.rdma_resource, "allocatable": raw}
    if amount is not None and amount > 0:
        return RDMA_ADVERTISED.finding(
            Severity.PASS,
            subject,
            f"node {name} advertises {ask.rdma_resource}: {raw}",
            evidence=evidence,
        )
    what = "no" if amount is None else "0"
    return RDMA_ADVERTISED.finding(
        Severity.FAIL,
        subject,
        f"node {name} advertises {what} {ask.rdma_resource} (status.allocatable), which "
        f"{_roles_text(ask, 'ask')} for",
        evidence=evidence,
    )


def check_rdma_free(
    node: Obj, pods_on_node: Sequence[Obj], ask: NodeAsk, subject: str = ""
) -> Finding | None:
    """Free RDMA devices against what the Pods on the node request together, counted like
    the GPUs (every namespace, every phase but Succeeded/Failed).  None when no RDMA is
    asked for or the node advertises none (SB255 reports that)."""
    resource = ask.rdma_resource
    if not resource or not (allocatable(node, resource) or 0) > 0:
        return None
    name = _name(node)
    subject = subject or _node_subject(name)
    acc = accelerators_on_node(node, pods_on_node, resource)
    needed = ask.rdma_needed
    evidence = {
        "resource": resource,
        "allocatable": _num(acc.allocatable),
        "held": _num(acc.held),
        "free": _num(acc.free),
        "needed": needed,
        "holders": [{"pod": h.pod, "count": _num(h.count), "state": h.state} for h in acc.holders],
    }
    held_by = "; ".join(f"{h.pod}: {_num(h.count)} ({h.state})" for h in acc.holders[:10])
    more = f" and {len(acc.holders) - 10} more" if len(acc.holders) > 10 else ""
    message = (
        f"{_num(acc.free)} of {_num(acc.allocatable)} {resource} free on node {name}, "
        f"{_roles_text(ask, 'need')} {needed}" + (f"; held by {held_by}{more}" if held_by else "")
    )
    if acc.free >= needed:
        return RDMA_FREE.finding(Severity.PASS, subject, message, evidence=evidence)
    return RDMA_FREE.finding(
        Severity.FAIL, subject, message, hint=_fix_for(RDMA_FREE, name), evidence=evidence
    )


MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"


def mig_in_use(node: Obj) -> bool:
    """Whether feature discovery describes the node's nvidia.com/gpu as MIG slices: under
    strategy ``single`` it overrides the product (``A100-SXM4-40GB-MIG-1g.5gb``), count
    and memory labels with the slices', and adds ``nvidia.com/gpu.slices.*``."""
    labels = _labels(node)
    return "-MIG-" in labels.get(GPU_PRODUCT_LABEL, "") or "nvidia.com/gpu.slices.gi" in labels


def check_mig(node: Obj, ask: NodeAsk, subject: str = "") -> Finding | None:
    """SB260 for the NVIDIA GPUs ``ask`` requests; None when it asks for none, for another
    vendor's, or the node carries no MIG information (no feature discovery labels and no
    MIG resources)."""
    resource = ask.gpu_resource
    if not ask.accelerators or not resource.startswith("nvidia.com/"):
        return None
    labels = _labels(node)
    strategy = labels.get(MIG_STRATEGY_LABEL)
    alloc = (node.get("status") or {}).get("allocatable") or {}
    slices = {k: str(v) for k, v in alloc.items() if k.startswith("nvidia.com/mig-")}
    if strategy is None and not slices:
        return None
    name = _name(node)
    subject = subject or _node_subject(name)
    product = labels.get(GPU_PRODUCT_LABEL, "")
    evidence: dict[str, Any] = {
        "strategy": strategy,
        "product": product,
        "gpu_count": labels.get(GPU_COUNT_LABEL),
        "gpu_memory_mib": labels.get(GPU_MEMORY_LABEL),
        "mig_config": labels.get("nvidia.com/mig.config"),
        "mig_resources": slices,
    }
    if resource.startswith("nvidia.com/mig-"):
        if ask.accelerators > 1:
            return MIG_SLICES.finding(
                Severity.FAIL,
                subject,
                f"{_roles_text(ask, 'ask')} for {ask.accelerators} {resource} on node {name}: "
                "a CUDA process sees one MIG device, so an engine cannot use more than one",
                hint=_fix_for(MIG_SLICES, name),
                evidence=evidence,
            )
        return MIG_SLICES.finding(
            Severity.PASS,
            subject,
            f"{_roles_text(ask, 'ask')} for one MIG slice ({resource}) on node {name}, on purpose",
            evidence=evidence,
        )
    if strategy == "single" and mig_in_use(node):
        memory = labels.get(GPU_MEMORY_LABEL)
        size = f" of {memory} MiB each" if memory else ""
        return MIG_SLICES.finding(
            Severity.FAIL,
            subject,
            f"node {name} advertises MIG slices as {resource} (MIG strategy single, product "
            f"{product}, {labels.get(GPU_COUNT_LABEL, '?')} slices{size}): the "
            f"{ask.accelerators} {resource} {_roles_text(ask, 'ask')} for would be slices, "
            "not whole GPUs, and one engine process can use only one of them",
            hint=_fix_for(MIG_SLICES, name),
            evidence=evidence,
        )
    also = (
        f"; MIG slices are advertised apart ({', '.join(f'{k}: {v}' for k, v in slices.items())})"
        if slices
        else ""
    )
    return MIG_SLICES.finding(
        Severity.PASS,
        subject,
        f"node {name}'s {resource} are whole GPUs ({product or 'product unlabelled'}, MIG "
        f"strategy {strategy or 'unlabelled'}){also}",
        evidence=evidence,
    )


def check_namespace(
    namespaces: Mapping[str, Obj], namespace: str, creates_namespace: bool
) -> Finding:
    subject = f"namespace/{namespace}"
    ns = namespaces.get(namespace)
    if ns is not None:
        phase = (ns.get("status") or {}).get("phase") or "Active"
        if phase == "Terminating" or (ns.get("metadata") or {}).get("deletionTimestamp"):
            return NAMESPACE_READY.finding(
                Severity.FAIL,
                subject,
                f"namespace {namespace} is Terminating: it accepts no new objects (and "
                "re-creating it fails until the deletion finishes)",
                hint="Wait for `kubectl get namespace "
                f"{namespace}` to report NotFound, or use another namespace.",
                evidence={"phase": "Terminating"},
            )
        return NAMESPACE_READY.finding(
            Severity.PASS, subject, f"namespace {namespace} exists", evidence={"phase": phase}
        )
    if creates_namespace:
        return NAMESPACE_READY.finding(
            Severity.PASS,
            subject,
            f"namespace {namespace} does not exist yet; the rendered set creates it",
            evidence={"exists": False, "created_by_set": True},
        )
    return NAMESPACE_READY.finding(
        Severity.FAIL,
        subject,
        f"namespace {namespace} does not exist and the rendered set does not create it",
        hint=f"`kubectl create namespace {namespace}`, or render with the namespace included.",
        evidence={"exists": False, "created_by_set": False},
    )


def check_crd(crds: Mapping[str, Obj], name: str) -> Finding:
    subject = f"crd/{name}"
    crd = crds.get(name)
    if crd is None:
        note = (
            " (the snapshot holds no CRDs at all: if it was captured without "
            "customresourcedefinitions, capture it again with all four kinds)"
            if not crds
            else ""
        )
        return CRDS_INSTALLED.finding(
            Severity.FAIL,
            subject,
            f"CustomResourceDefinition {name} is not installed{note}",
            evidence={"installed": False},
        )
    conditions = {c.get("type"): c for c in (crd.get("status") or {}).get("conditions") or ()}
    established = conditions.get("Established") or {}
    versions = [
        v.get("name") for v in (crd.get("spec") or {}).get("versions") or () if v.get("served")
    ]
    evidence = {
        "installed": True,
        "established": established.get("status"),
        "served_versions": versions,
    }
    if established.get("status") != "True":
        why = "; ".join(str(established[k]) for k in ("reason", "message") if established.get(k))
        return CRDS_INSTALLED.finding(
            Severity.FAIL,
            subject,
            f"CustomResourceDefinition {name} is installed but not Established"
            + (f": {why}" if why else ""),
            evidence=evidence,
        )
    return CRDS_INSTALLED.finding(
        Severity.PASS,
        subject,
        f"CustomResourceDefinition {name} is established (serves {', '.join(map(str, versions))})",
        evidence=evidence,
    )


def check_unplaced(role: UnplacedRole) -> Finding:
    if role.accelerators:
        return ROLE_PLACED.finding(
            Severity.WARN,
            f"role/{role.role}",
            f"role {role.role} asks for {role.accelerators} {role.gpu_resource} but is not "
            "pinned to a node: the scheduler picks one, so no node was checked for it",
            evidence={"accelerators": role.accelerators},
        )
    return ROLE_PLACED.finding(
        Severity.INFO,
        f"role/{role.role}",
        f"role {role.role} is not pinned to a node and asks for no accelerators; the "
        "scheduler places it",
    )


def _fits(node: Obj, pods_on_node: Sequence[Obj], ask: NodeAsk) -> bool:
    if not is_ready(node) or is_cordoned(node):
        return False
    if any(v.severity is Severity.FAIL for v in taint_verdicts(node, ask.tolerations)):
        return False
    if ask.rdma_resource and not (allocatable(node, ask.rdma_resource) or 0) > 0:
        return False
    alloc = allocatable(node, ask.gpu_resource)
    if alloc is None or alloc < ask.accelerators:
        return False
    return accelerators_on_node(node, pods_on_node, ask.gpu_resource).free >= ask.accelerators


def nodes_that_fit(
    nodes: Mapping[str, Obj],
    pods_by_node: Mapping[str, Sequence[Obj]],
    ask: NodeAsk,
    exclude: Iterable[str] = (),
    limit: int = 5,
) -> list[str]:
    """Up to ``limit`` other nodes where ``ask`` would pass every node check, each as the
    value to give the recipe's node parameter (its ``ask.selector`` label, or its name)."""
    skip = set(exclude)
    out = []
    for name in sorted(nodes):
        if name in skip:
            continue
        value = _labels(nodes[name]).get(ask.selector) if ask.selector else name
        if value is None:
            continue  # the Pods could not select it
        try:
            if _fits(nodes[name], pods_by_node.get(name, ()), ask):
                out.append(value)
        except BadObject:
            continue
        if len(out) >= limit:
            break
    return out


def _could_not_read(check: Check, subject: str, err: BadObject) -> Finding:
    return check.finding(
        Severity.ERROR,
        subject,
        f"could not decide: {err}",
        hint="The API server would not have stored this value: capture the snapshot again with "
        "kubectl instead of editing it (or, for a toleration, fix the recipe).",
    )


def check_cluster(snapshot: ClusterSnapshot, req: ClusterRequirements) -> list[Finding]:
    """Every cluster check for ``req`` against ``snapshot``, in a stable order: per target
    node (exists, Ready, not cordoned, taints, free accelerators, RDMA advertised and free,
    whole GPUs rather than MIG slices), then roles without a
    node, the namespace and the CRDs.  A missing node gets only its SB250 finding."""
    findings: list[Finding] = []
    pods_by_node = index_pods_by_node(snapshot.pods)
    labels = {a.selector for a in req.nodes if a.selector}
    by_label = {label: nodes_by_label(snapshot.nodes, label) for label in labels}
    resolved = [
        (ask, *resolve_node(snapshot.nodes, ask, by_label.get(ask.selector or "")))
        for ask in req.nodes
    ]
    targets = {_name(node) for _, node, _ in resolved if node is not None}
    for ask, node, exists in resolved:
        findings.append(exists)
        if node is None:
            continue
        name = _name(node)
        subject = _node_subject(ask.node)
        findings.append(check_node_ready(node, subject))
        findings.append(check_node_schedulable(node, subject))
        try:
            findings.append(check_node_taints(node, ask, subject))
        except BadObject as e:
            findings.append(_could_not_read(NODE_TAINTS, subject, e))
        on_node = pods_by_node.get(name, [])
        try:
            free = check_free_accelerators(node, on_node, ask, subject=subject)
            if free.failed and ask.accelerators:
                alternatives = nodes_that_fit(snapshot.nodes, pods_by_node, ask, exclude=targets)
                if alternatives:
                    free = check_free_accelerators(node, on_node, ask, alternatives, subject)
            findings.append(free)
        except BadObject as e:
            findings.append(_could_not_read(FREE_ACCELERATORS, subject, e))
        try:
            rdma = check_rdma(node, ask, subject)
        except BadObject as e:
            rdma = _could_not_read(RDMA_ADVERTISED, subject, e)
        if rdma is not None:
            findings.append(rdma)
        try:
            rdma_free = check_rdma_free(node, on_node, ask, subject)
        except BadObject as e:
            rdma_free = _could_not_read(RDMA_FREE, subject, e)
        if rdma_free is not None:
            findings.append(rdma_free)
        mig = check_mig(node, ask, subject)
        if mig is not None:
            findings.append(mig)
    findings.extend(check_unplaced(r) for r in req.unplaced)
    findings.append(check_namespace(snapshot.namespaces, req.namespace, req.creates_namespace))
    findings.extend(check_crd(snapshot.crds, name) for name in req.crds)
    return findings


__all__ = [
    "CHECKS",
    "HOSTNAME_LABEL",
    "LWS_CRD",
    "Accelerators",
    "BadObject",
    "ClusterRequirements",
    "Holder",
    "NodeAsk",
    "UnplacedRole",
    "accelerators_on_node",
    "check_cluster",
    "check_mig",
    "check_rdma_free",
    "holds_devices",
    "index_pods_by_node",
    "mig_in_use",
    "parse_quantity",
    "pod_request",
    "pod_state",
    "requirements_from_plan",
    "resolve_node",
    "taint_verdicts",
    "tolerates",
]
