"""What a recipe asks of the cluster, for the cluster checks of ``servebook preflight``
(``preflight.cluster``): which nodes its Pods are pinned to and what each node must give
them (accelerators, RDMA devices, tolerated taints), the namespace and the CRDs.

``requirements_from_plan`` builds a ``ClusterRequirements`` from a Plan; the checks judge
a cluster snapshot against it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from servebook.errors import UsageError

# The render pins each Pod with `nodeSelector: {kubernetes.io/hostname: NODE}`.
from servebook.kube.names import HOSTNAME_LABEL

if TYPE_CHECKING:
    from servebook.recipe.plan import Plan

Obj = Mapping[str, Any]

DEFAULT_NAMESPACE = "servebook"
LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"


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


def roles_text(ask: NodeAsk, verb: str = "") -> str:
    """``role prefill needs`` / ``roles prefill, decode need``."""
    many = len(ask.roles) > 1
    text = f"role{'s' if many else ''} {', '.join(ask.roles)}"
    if verb:
        text += f" {verb}" if many else f" {verb}s"
    return text


__all__ = [
    "DEFAULT_NAMESPACE",
    "LWS_CRD",
    "ClusterRequirements",
    "NodeAsk",
    "UnplacedRole",
    "requirements_from_plan",
    "roles_text",
]
