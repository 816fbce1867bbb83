"""How verify, bench and run reach a Kubernetes deployment: ``open_view`` holds a
port-forward servebook opens (``kube.portforward``) to each role's Ready Pod for the length
of the command, and reads the command lines and environment from those Pods.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from servebook.backends.kubernetes.record import (
    KubeDeployment,
    find_deployment,
    not_found,
    read_state,
)
from servebook.deployment.reach import (
    FORWARDED,
    Address,
    Reach,
    Record,
    ReplicaRecord,
    RoleRecord,
    build,
)
from servebook.deployment.view import DeploymentView
from servebook.errors import UsageError
from servebook.kube import client as kube_client
from servebook.kube import names
from servebook.kube.engine_pod import gpu_count
from servebook.kube.objects import is_ready, is_terminating
from servebook.kube.resources import list_objects
from servebook.recipe.plan import Plan, RolePlan

Obj = dict[str, Any]


def ready_pods(api: Any, dep: KubeDeployment, role: RolePlan) -> list[dict[str, Any]]:
    """The role's Ready Pods that serve its API (for a role spanning nodes, the group
    leaders, never a headless worker), newest first, one per replica; unusable (exit 2)
    while fewer are Ready: the counters of a role are those of all its replicas."""
    pods = list_objects(api, "Pod", dep.namespace, names.api_selector_for(dep.name, role))
    ready = [p for p in pods if not is_terminating(p) and is_ready(p)]
    want = max(1, role.replicas)
    if len(ready) < want:
        raise UsageError(
            f"deployment {dep.name}: role {role.name} has {len(ready)} Ready Pod(s) of "
            f"{want} in namespace {dep.namespace} ({len(pods)} found). Run `servebook status "
            f"{dep.name}`."
        )
    ready.sort(key=lambda p: str(p["metadata"].get("creationTimestamp", "")), reverse=True)
    return ready[:want]


def container_named(pod: dict[str, Any], name: str) -> dict[str, Any]:
    for c in pod.get("spec", {}).get("containers", []):
        if c.get("name") == name:
            return dict(c)
    return dict(pod.get("spec", {}).get("containers", [{}])[0])


def _pod_log(api: Any, namespace: str, pod: str, container: str) -> Callable[[], str]:
    from kr8s.objects import Pod

    def read() -> str:
        try:
            obj = Pod.get(pod, namespace=namespace, api=api)
            return "\n".join(obj.logs(container=container, tail_lines=4000))
        except Exception as e:  # the log is evidence, not a requirement
            return f"(the log of Pod {pod} could not be read: {type(e).__name__}: {e})"

    return read


def recorded_deployment(name: str, namespace: str | None) -> tuple[Any, KubeDeployment, Plan]:
    """(a client, the deployment, its plan): as recorded on this machine, or as the
    cluster has it when it is not recorded here (or in another namespace)."""
    api = None
    dep = read_state(name)
    if dep is None or (namespace is not None and dep.namespace != namespace):
        api = kube_client.connect()  # not recorded here: as the cluster has it
        dep = find_deployment(api, name, namespace)
        if dep is None:
            raise not_found(name, namespace)
    if not dep.plan:
        raise UsageError(
            f"deployment {name} was recorded by an older servebook without its plan: "
            f"`servebook down {name}`, then up again."
        )
    return api or kube_client.connect(), dep, Plan.model_validate(dep.plan)


def engine_argv(pod: dict[str, Any], kind: str) -> ReplicaRecord:
    """A Pod's command line and environment as applied, under its name."""
    container = container_named(pod, "router" if kind == "router" else "engine")
    return ReplicaRecord(
        str(pod["metadata"]["name"]),
        [*container.get("command", []), *container.get("args", [])],
        {str(e["name"]): str(e["value"]) for e in container.get("env", []) if "value" in e},
        str(container.get("image") or ""),
    )


def cluster_record(dep: KubeDeployment, plan: Plan, pods: dict[str, list[Obj]]) -> Record:
    """The deployment as the cluster has it: each role's Ready Pods (``ready_pods``), the
    first its API's, each replica named by its Pod."""
    gpus = sum(
        gpu_count(r) * max(1, r.replicas) * max(1, r.nodes_per_replica) for r in plan.engine_roles
    )
    return Record(
        name=dep.name,
        backend=dep.backend,
        recipe=dep.recipe,
        plan=plan,
        served_model_name=dep.served_model_name,
        roles=[
            RoleRecord(r.name, r.kind, [engine_argv(p, r.kind) for p in pods[r.name]])
            for r in plan.roles
        ],
        entry_role=plan.entry_role,
        local_model_dir=None,  # the weights live on the nodes: bench asks the server
        accelerators=gpus or None,
    )


def _forwarded_role(
    fw: Any, api: Any, dep: KubeDeployment, r: RolePlan, pods: list[Obj]
) -> tuple[list[Address], Address]:
    """A forward to each replica's Pod (the router's metrics port too), and the role's
    own liveness, description and log: its forwards', its first Pod's."""
    router = r.kind == "router"
    pod, *others = pods
    pod_name = str(pod["metadata"]["name"])
    node = pod.get("spec", {}).get("nodeName", "?")
    container = container_named(pod, "router" if router else "engine")

    def forward(name: str, port: int) -> str:
        return str(fw.open(role=r.name, pod=name, namespace=dep.namespace, remote_port=port))

    api_url = forward(pod_name, names.ROUTER_PORT if router else names.ENGINE_PORT)
    metrics_url = forward(pod_name, names.ROUTER_METRICS_PORT) if router else api_url
    # every other replica's counters (vLLM: on its API port)
    rest = [forward(str(p["metadata"]["name"]), names.ENGINE_PORT) for p in others if not router]

    def describe(role: str = r.name, pod: str = pod_name, node: str = node) -> str:
        problem = fw.problems().get(role)
        where = f"Pod {pod} on node {node}"
        return f"{where}: {problem}" if problem else where

    own = Address(
        api_url,
        metrics_url,
        alive=lambda role=r.name: fw.alive(role),  # type: ignore[misc]
        describe=describe,
        log=_pod_log(api, dep.namespace, pod_name, str(container.get("name", ""))),
    )
    return [Address(api_url, metrics_url), *(Address(u) for u in rest)], own


@contextlib.contextmanager
def open_view(
    name: str, *, namespace: str | None = None, forward_timeout_s: float = 10.0
) -> Iterator[DeploymentView]:
    """The deployment as a command reaches it: a port-forward servebook holds to each
    role's Ready Pod (engine API and metrics; router API and metrics; the metrics of every
    other replica of a role that runs several) for the body of the with-block.  A forward
    that dies or a Pod replaced meanwhile makes that role not alive, with the reason in
    its description; the view's users fail naming the role."""
    from servebook.kube.kr8s_dialer import Kr8sDialer, kr8s_pod_identity
    from servebook.kube.portforward import Forwards

    api, dep, plan = recorded_deployment(name, namespace)
    pods = {r.name: ready_pods(api, dep, r) for r in plan.roles}
    with Forwards(
        Kr8sDialer(api), pod_identity=kr8s_pod_identity(api), timeout_s=forward_timeout_s
    ) as fw:
        replicas: dict[str, list[Address]] = {}
        roles: dict[str, Address] = {}
        for r in plan.roles:
            replicas[r.name], roles[r.name] = _forwarded_role(fw, api, dep, r, pods[r.name])
        reach = Reach("port-forward", replicas, roles, detail=FORWARDED)
        yield build(cluster_record(dep, plan, pods), reach)
