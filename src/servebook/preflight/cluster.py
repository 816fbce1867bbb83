"""Cluster checks of ``servebook preflight`` (ids ``SB250``-``SB299``): pure functions over
Kubernetes API objects.

Every input is a plain dict in the shape ``kubectl get -o json`` prints (a Node, a Pod, a
Namespace, a CustomResourceDefinition), gathered in a ``ClusterSnapshot`` that was read
either from a file or live (``servebook.kube.snapshot``).  Nothing here does I/O, so each
check is tested on real API objects without a cluster.

What the recipe asks of the cluster is a ``ClusterRequirements`` (``preflight.requirements``;
``requirements_from_plan`` builds it from a Plan); ``check_cluster(snapshot, requirements)``
returns the findings: the target node's own checks (``preflight.nodes``), then here its
devices (free accelerators, RDMA, whole GPUs), roles without a node, the namespace and the
CRDs.

A hand-written pre-flight got these wrong in the field (``reference/field-notes.md``,
"Pre-flight"): it passed a cordoned node and a NoSchedule-tainted node, and counted free
GPUs in one namespace and over Running pods only, missing a pod in ``default`` that held all
eight.  Here a device is held by every Pod bound to the node, in every namespace, whose phase
is neither Succeeded nor Failed: Pending pods (ContainerCreating, pulling an image) and
terminating pods hold their devices too (``kube.objects``: ``pod_request``,
``holds_devices``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from servebook.findings import Check, Finding, Severity, register_once
from servebook.kube.objects import (
    Accelerators,
    BadObject,
    accelerators_on_node,
    allocatable,
    amount_text,
    index_pods_by_node,
    is_cordoned,
    is_ready,
    labels_of,
    name_of,
    parse_quantity,
)
from servebook.preflight.nodes import (
    NODE_EXISTS,
    NODE_READY,
    NODE_SCHEDULABLE,
    NODE_TAINTS,
    check_node_ready,
    check_node_schedulable,
    check_node_taints,
    fix_for,
    node_subject,
    nodes_by_label,
    resolve_node,
    taint_verdicts,
)
from servebook.preflight.requirements import ClusterRequirements, NodeAsk, UnplacedRole, roles_text

if TYPE_CHECKING:
    from servebook.kube.snapshot import ClusterSnapshot

Obj = Mapping[str, Any]


# ---------------------------------------------------------------------------------------
# The checks.  Ids are stable: docs, CI configs and people refer to them.  The target
# node's own (SB250-SB253) are registered in ``preflight.nodes``.

FREE_ACCELERATORS = register_once(
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
RDMA_ADVERTISED = register_once(
    "SB255",
    "RDMA resource advertised on the target node",
    "Prefill/decode KV transfer over RDMA needs the node's RDMA device plugin to advertise "
    "the resource: a Pod requesting an unadvertised resource stays Pending, and one "
    "deployed without it falls back to TCP (or fails the connector handshake) and the "
    "disaggregated numbers are not what the topology promised.",
    "Install or fix the RDMA device plugin on the node (its allocatable must list the "
    "resource), or choose a node that advertises it.",
)
NAMESPACE_READY = register_once(
    "SB256",
    "Namespace exists or the rendered set creates it",
    "Applying into a namespace that does not exist fails part-way through a multi-object "
    'apply (`namespaces "x" not found`); a namespace that is Terminating rejects every '
    "new object.",
    "Create it (`kubectl create namespace NAME`), render with the namespace included, or "
    "pick an existing namespace.",
)
CRDS_INSTALLED = register_once(
    "SB257",
    "Required CustomResourceDefinitions are installed and established",
    "Objects of a kind whose CRD is missing are rejected by the API server (`no matches "
    "for kind`), part-way through the apply; a CRD that is not Established does not serve "
    "its kind yet.",
    "Install the controller that provides the kind (for LeaderWorkerSet: "
    "https://lws.sigs.k8s.io/docs/installation/) and wait for "
    "`kubectl wait --for condition=established crd/NAME`.",
)
ROLE_PLACED = register_once(
    "SB258",
    "Role is pinned to a node",
    "A role without a node is placed by the scheduler, so no node check (readiness, "
    "taints, free accelerators) can be made for it in advance, and its hostPath model "
    "directory may not exist on the node it lands on.",
    "Set the role's placement node (the recipe's node parameter) to the node that holds "
    "its weights.",
)

MIG_SLICES = register_once(
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
RDMA_FREE = register_once(
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
# The device checks of a target node, and the rest of one snapshot's checks.


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


def _holding_evidence(acc: Accelerators, needed: int) -> dict[str, Any]:
    """A free-device finding's evidence: the resource's count, who holds how much, the need."""
    return {
        "resource": acc.resource,
        "allocatable": amount_text(acc.allocatable),
        "held": amount_text(acc.held),
        "free": amount_text(acc.free),
        "needed": needed,
        "holders": [
            {"pod": h.pod, "count": amount_text(h.count), "state": h.state} for h in acc.holders
        ],
    }


def _free_text(acc: Accelerators, node: str, ask: NodeAsk, needed: int) -> str:
    return (
        f"{amount_text(acc.free)} of {amount_text(acc.allocatable)} {acc.resource} free on "
        f"node {node}, {roles_text(ask, 'need')} {needed}"
    )


def check_free_accelerators(
    node: Obj,
    pods_on_node: Sequence[Obj],
    ask: NodeAsk,
    alternatives: Sequence[str] = (),
    subject: str = "",
) -> Finding:
    name = name_of(node)
    subject = subject or node_subject(name)
    resource = ask.gpu_resource
    needed = ask.accelerators
    if needed == 0:
        return FREE_ACCELERATORS.finding(
            Severity.PASS, subject, f"{roles_text(ask, 'ask')} for no {resource}"
        )
    acc = accelerators_on_node(node, pods_on_node, resource)
    advertised = allocatable(node, resource)
    evidence = _holding_evidence(acc, needed)
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
            f"{roles_text(ask, 'need')} {needed}",
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
    held_by = "; ".join(f"{h.pod}: {amount_text(h.count)} ({h.state})" for h in acc.holders)
    summary = _free_text(acc, name, ask, needed)
    capacity_raw = ((node.get("status") or {}).get("capacity") or {}).get(resource)
    if capacity_raw is not None:
        capacity = parse_quantity(capacity_raw, f"node {name} status.capacity {resource}")
        evidence["capacity"] = amount_text(capacity)
        if capacity > acc.allocatable:
            # The device plugin withholds devices it found unhealthy (XID errors, ECC).
            summary += (
                f" (capacity {amount_text(capacity)}: "
                f"{amount_text(capacity - acc.allocatable)} not allocatable, e.g. reported "
                "unhealthy by the device plugin)"
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
    name = name_of(node)
    subject = subject or node_subject(name)
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
        f"{roles_text(ask, 'ask')} for",
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
    name = name_of(node)
    subject = subject or node_subject(name)
    acc = accelerators_on_node(node, pods_on_node, resource)
    needed = ask.rdma_needed
    evidence = _holding_evidence(acc, needed)
    held_by = "; ".join(f"{h.pod}: {amount_text(h.count)} ({h.state})" for h in acc.holders[:10])
    more = f" and {len(acc.holders) - 10} more" if len(acc.holders) > 10 else ""
    message = _free_text(acc, name, ask, needed) + (f"; held by {held_by}{more}" if held_by else "")
    if acc.free >= needed:
        return RDMA_FREE.finding(Severity.PASS, subject, message, evidence=evidence)
    return RDMA_FREE.finding(
        Severity.FAIL, subject, message, hint=fix_for(RDMA_FREE, name), evidence=evidence
    )


MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"


def mig_in_use(node: Obj) -> bool:
    """Whether feature discovery describes the node's nvidia.com/gpu as MIG slices: under
    strategy ``single`` it overrides the product (``A100-SXM4-40GB-MIG-1g.5gb``), count
    and memory labels with the slices', and adds ``nvidia.com/gpu.slices.*``."""
    labels = labels_of(node)
    return "-MIG-" in labels.get(GPU_PRODUCT_LABEL, "") or "nvidia.com/gpu.slices.gi" in labels


def check_mig(node: Obj, ask: NodeAsk, subject: str = "") -> Finding | None:
    """SB260 for the NVIDIA GPUs ``ask`` requests; None when it asks for none, for another
    vendor's, or the node carries no MIG information (no feature discovery labels and no
    MIG resources)."""
    resource = ask.gpu_resource
    if not ask.accelerators or not resource.startswith("nvidia.com/"):
        return None
    labels = labels_of(node)
    strategy = labels.get(MIG_STRATEGY_LABEL)
    alloc = (node.get("status") or {}).get("allocatable") or {}
    slices = {k: str(v) for k, v in alloc.items() if k.startswith("nvidia.com/mig-")}
    if strategy is None and not slices:
        return None
    name = name_of(node)
    subject = subject or node_subject(name)
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
                f"{roles_text(ask, 'ask')} for {ask.accelerators} {resource} on node {name}: "
                "a CUDA process sees one MIG device, so an engine cannot use more than one",
                hint=fix_for(MIG_SLICES, name),
                evidence=evidence,
            )
        return MIG_SLICES.finding(
            Severity.PASS,
            subject,
            f"{roles_text(ask, 'ask')} for one MIG slice ({resource}) on node {name}, on purpose",
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
            f"{ask.accelerators} {resource} {roles_text(ask, 'ask')} for would be slices, "
            "not whole GPUs, and one engine process can use only one of them",
            hint=fix_for(MIG_SLICES, name),
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
        value = labels_of(nodes[name]).get(ask.selector) if ask.selector else name
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
    if "nodes" in snapshot.unread:
        findings += [_nodes_unread(ask, snapshot.unread["nodes"]) for ask in req.nodes]
    else:
        findings += _node_findings(snapshot, req)
    findings.extend(check_unplaced(r) for r in req.unplaced)
    if "namespaces" in snapshot.unread:
        what = f"whether namespace {req.namespace} exists and is Active"
        findings.append(
            _unread(
                NAMESPACE_READY, f"namespace/{req.namespace}", what, snapshot.unread["namespaces"]
            )
        )
    else:
        findings.append(check_namespace(snapshot.namespaces, req.namespace, req.creates_namespace))
    for name in req.crds:
        if "crds" in snapshot.unread:
            what = f"whether CRD {name} is installed"
            findings.append(_unread(CRDS_INSTALLED, f"crd/{name}", what, snapshot.unread["crds"]))
        else:
            findings.append(check_crd(snapshot.crds, name))
    return findings


def _unread(check: Check, subject: str, what: str, why: str) -> Finding:
    """A check the caller's credentials could not decide (a namespace's tenant reads no
    cluster-scoped objects): said as not checked, never as passed or as absent."""
    from servebook.kube.snapshot import SNAPSHOT_COMMAND

    return check.finding(
        Severity.WARN,
        subject,
        f"not checked: {what}, since the caller may not read it ({why})",
        hint="Ask the cluster's admin to run `servebook preflight` with the same recipe, or "
        f"for a snapshot (`{SNAPSHOT_COMMAND} > FILE`) to pass as --snapshot FILE.",
        evidence={"checked": False, "why": why},
    )


def _nodes_unread(ask: NodeAsk, why: str) -> Finding:
    return _unread(
        NODE_EXISTS,
        node_subject(ask.node),
        f"whether node {ask.node} exists, is Ready and schedulable, and whose taints the "
        "Pods tolerate"
        + (
            f", and whether it has {ask.accelerators} free {ask.gpu_resource}"
            if ask.accelerators
            else ""
        ),
        why,
    )


def _held_findings(
    snapshot: ClusterSnapshot,
    pods_by_node: Mapping[str, Sequence[Obj]],
    node: Obj,
    ask: NodeAsk,
    targets: set[str],
) -> list[Finding]:
    """What the Pods on ``node`` hold of what ``ask`` needs: its accelerators and RDMA."""
    subject = node_subject(ask.node)
    if "pods" in snapshot.unread:
        # Pods of other namespaces hold GPUs too: counting only the readable ones would
        # call held GPUs free.
        what = f"what the Pods on node {ask.node} hold of its {ask.gpu_resource}"
        return [_unread(FREE_ACCELERATORS, subject, what, snapshot.unread["pods"])]
    on_node = pods_by_node.get(name_of(node), [])
    out: list[Finding] = []
    try:
        free = check_free_accelerators(node, on_node, ask, subject=subject)
        if free.failed and ask.accelerators:
            alternatives = nodes_that_fit(snapshot.nodes, pods_by_node, ask, exclude=targets)
            if alternatives:
                free = check_free_accelerators(node, on_node, ask, alternatives, subject)
        out.append(free)
    except BadObject as e:
        out.append(_could_not_read(FREE_ACCELERATORS, subject, e))
    try:
        rdma_free = check_rdma_free(node, on_node, ask, subject)
    except BadObject as e:
        rdma_free = _could_not_read(RDMA_FREE, subject, e)
    if rdma_free is not None:
        out.append(rdma_free)
    return out


def _node_findings(snapshot: ClusterSnapshot, req: ClusterRequirements) -> list[Finding]:
    """Each target node's findings (``check_cluster``)."""
    findings: list[Finding] = []
    pods_by_node = index_pods_by_node(snapshot.pods)
    labels = {a.selector for a in req.nodes if a.selector}
    by_label = {label: nodes_by_label(snapshot.nodes, label) for label in labels}
    resolved = [
        (ask, *resolve_node(snapshot.nodes, ask, by_label.get(ask.selector or "")))
        for ask in req.nodes
    ]
    targets = {name_of(node) for _, node, _ in resolved if node is not None}
    for ask, node, exists in resolved:
        findings.append(exists)
        if node is None:
            continue
        subject = node_subject(ask.node)
        findings.append(check_node_ready(node, subject))
        findings.append(check_node_schedulable(node, subject))
        try:
            findings.append(check_node_taints(node, ask, subject))
        except BadObject as e:
            findings.append(_could_not_read(NODE_TAINTS, subject, e))
        try:
            rdma = check_rdma(node, ask, subject)
        except BadObject as e:
            rdma = _could_not_read(RDMA_ADVERTISED, subject, e)
        if rdma is not None:
            findings.append(rdma)
        findings += _held_findings(snapshot, pods_by_node, node, ask, targets)
        mig = check_mig(node, ask, subject)
        if mig is not None:
            findings.append(mig)
    return findings


__all__ = [
    "CHECKS",
    "GPU_COUNT_LABEL",
    "GPU_MEMORY_LABEL",
    "GPU_PRODUCT_LABEL",
    "check_cluster",
    "check_crd",
    "check_free_accelerators",
    "check_mig",
    "check_namespace",
    "check_rdma",
    "check_rdma_free",
    "check_unplaced",
    "mig_in_use",
    "nodes_that_fit",
]
