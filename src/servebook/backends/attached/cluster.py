"""Attached deployments on Kubernetes: what ``servebook attach NAME --backend kubernetes
-n NS`` finds (``kube.stacks`` over the namespace's Pods, Services and Deployments), the
record it keeps (``backends.attached.record``), and how a later command reaches every replica:
a port-forward servebook holds to each recorded Pod's engine port (and its metrics port
where that is another), and one to a Ready Pod behind the entry Service, for the length
of the command.  A recorded Pod that is gone (replaced, scaled away) is a failure naming
the role and the Pod, never a silent pass: attach the deployment again.

Nothing is changed on the cluster: attach lists Pods, Services and Deployments; a command
opens port-forwards.  Not yet run against the operators' deployments on a real cluster:
the stand-in API server of the tests holds Pods shaped like theirs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from servebook.backends.attached.record import (
    AttachedDeployment,
    AttachedReplica,
    AttachedRole,
    view_of,
    view_record,
)
from servebook.deployment.reach import FORWARDED, IN_CLUSTER, Address, Reach, build
from servebook.deployment.view import DeploymentView
from servebook.engines.cmdline import parse_argv
from servebook.errors import UsageError
from servebook.kube import client as kube_client
from servebook.kube import stacks
from servebook.kube.resources import list_objects

if TYPE_CHECKING:
    from servebook.backends.kubernetes.job_site import Source

NOT_RUN_ON_A_CLUSTER = (
    "Recognising the stacks has been tested on Pods shaped like each operator's (a stand-in "
    "API server), never against those operators on a real cluster."
)


def read_namespace(api: Any, namespace: str) -> stacks.Objects:
    """The namespace's Pods, Services and Deployments (reads only)."""
    return stacks.Objects(
        list_objects(api, "Pod", namespace),
        list_objects(api, "Service", namespace),
        list_objects(api, "Deployment", namespace),
    )


def find(
    namespace: str,
    roles: Sequence[tuple[str, str]] = (),
    entry: str | None = None,
    *,
    api: Any = None,
) -> stacks.Found:
    """The deployment in ``namespace``: by its stack's labels, or by the roles' selectors
    when given (``--role ROLE=SELECTOR``)."""
    api = api or kube_client.connect()
    objs = read_namespace(api, namespace)
    if roles:
        return stacks.explicit(namespace, objs, roles, entry)
    return stacks.discover(namespace, objs, entry=entry)


def _served_model(found: stacks.Found) -> str:
    for role in found.roles:
        for rep in role.replicas:
            cmd = parse_argv(rep.argv)
            if cmd is not None and cmd.served_model_names:
                return cmd.served_model_names[0]
    return ""


def record_of(name: str, found: stacks.Found, model: str | None = None) -> AttachedDeployment:
    """The record of what was found; unusable (exit 2) when its entry or a role's Pods
    could not be determined, naming the flag that says it."""
    if found.entry is None:
        why = next((u for u in found.unknown if u.startswith("the entry")), "the entry")
        raise UsageError(
            f"namespace {found.namespace}: {why}.",
            hint=f"give it: --entry svc/NAME:PORT (see `servebook attach {name} --backend "
            f"kubernetes -n {found.namespace} --dry-run`).",
        )
    empty = [r.name for r in found.roles if not r.replicas]
    if empty:
        raise UsageError(
            f"namespace {found.namespace}: role(s) {', '.join(empty)} have no Pod.",
            hint=stacks.EXPLICIT_FLAGS,
        )
    roles = []
    for role in found.roles:
        replicas = []
        for rep in role.replicas:
            engine = parse_argv(rep.argv)
            unread = "" if engine is not None else "; ".join(rep.unknown) or "not vLLM"
            replicas.append(
                AttachedReplica(
                    name=rep.pod,
                    argv=rep.argv,
                    env=rep.env,
                    argv_from=f"Pod {rep.pod} container {rep.container} ({rep.form})",
                    argv_unread=unread,
                    pod=rep.pod,
                    container=rep.container,
                    node=rep.node,
                    port=rep.api.port,
                    metrics_port=rep.metrics.port,
                    scheme="https" if rep.metrics.scheme == "https" else "http",
                )
            )
        roles.append(AttachedRole(name=role.name, replicas=replicas))
    notes = found.undetermined() + [
        f"{r.name} Pod {p.pod}: metrics at path {p.metrics.path}, read at /metrics"
        for r in found.roles
        for p in r.replicas
        if p.metrics.path not in ("", "/metrics")
    ]
    return AttachedDeployment(
        name=name,
        backend="kubernetes",
        namespace=found.namespace,
        stack=found.stack,
        entry=f"svc/{found.entry.service}:{found.entry.port}",
        served_model_name=model or _served_model(found),
        notes=notes,
        roles=roles,
    )


def found_dict(found: stacks.Found) -> dict[str, Any]:
    """What was found, for ``--dry-run`` and ``--json``."""
    entry = found.entry
    return {
        "stack": found.stack,
        "namespace": found.namespace,
        "topology": found.topology,
        "entry": (
            {
                "service": entry.service,
                "port": entry.port,
                "target_port": entry.target_port,
                "scheme": entry.scheme,
                "pods": entry.pods,
            }
            if entry
            else None
        ),
        "roles": [
            {
                "name": r.name,
                "selector": r.selector,
                "replicas": [
                    {
                        "pod": p.pod,
                        "node": p.node,
                        "ready": p.ready,
                        "container": p.container,
                        "api": f"{p.api.scheme}://:{p.api.port}",
                        "metrics": f"{p.metrics.scheme}://:{p.metrics.port}{p.metrics.path}",
                        "argv_from": p.form,
                        "claims": claims_text(p),
                        "notes": p.notes,
                    }
                    for p in r.replicas
                ],
            }
            for r in found.roles
        ],
        "undetermined": found.undetermined(),
        "tested_on": NOT_RUN_ON_A_CLUSTER,
    }


def claims_text(rep: stacks.Replica) -> str:
    """The replica's KV connector and speculative config, as its own argv states them."""
    from servebook.engines.cmdline import kv_transfer_config, speculative_config

    cmd = parse_argv(rep.argv)
    if cmd is None:
        return "claims not determined (no vLLM command line read)"
    kv, kv_err = kv_transfer_config(cmd)
    spec, spec_err = speculative_config(cmd)
    connector = kv_err or (f"{kv.get('kv_connector')} ({kv.get('kv_role')})" if kv else "none")
    speculative = spec_err or (str(spec.get("method", spec)) if spec else "none")
    return f"kv_connector {connector}, speculative {speculative}"


def _entry(objs: stacks.Objects, dep: AttachedDeployment) -> stacks.Entry:
    """The recorded entry Service as the namespace has it now, with a Pod behind it."""
    name, port = stacks.parse_entry(dep.entry)
    svc = next((s for s in objs.services if s["metadata"]["name"] == name), None)
    entry = stacks.entry_of(objs, svc, port) if svc is not None else None
    if entry is None or not entry.pods:
        raise UsageError(
            f"attached deployment {dep.name}: its entry {dep.entry} in namespace "
            f"{dep.namespace} has no Pod behind it now.",
            hint=f"`servebook detach {dep.name}`, then attach it again.",
        )
    return entry


def _entry_url(fw: Any, api: Any, dep: AttachedDeployment) -> str:
    """A forward to a Ready Pod behind the recorded entry Service, at its target port."""
    objs = stacks.Objects(
        list_objects(api, "Pod", dep.namespace), list_objects(api, "Service", dep.namespace)
    )
    entry = _entry(objs, dep)
    url = str(fw.open(role="entry", pod=entry.pods[0], namespace=dep.namespace,
                      remote_port=entry.target_port))  # fmt: skip
    return url.replace("http://", "https://", 1) if entry.scheme == "https" else url


def cluster_source(dep: AttachedDeployment, *, api: Any = None) -> Source:
    """The load Job's source (``backends/kubernetes/job_site.Source``) for a ``backend:
    kubernetes`` record: every recorded Pod at its Pod IP and engine (and metrics) port,
    the entry Service by its cluster DNS name, the engines' own image, the API key the
    engine container reads from a Secret (VLLM_API_KEY), its pull secrets and
    tolerations.  Nothing is created; a recorded Pod that is gone is unusable (exit 2)
    naming the role and the Pod, as the forwarded path is."""
    from servebook.backends.kubernetes.job_site import Source, pod_url

    api = api or kube_client.connect()
    objs = stacks.Objects(
        list_objects(api, "Pod", dep.namespace), list_objects(api, "Service", dep.namespace)
    )
    pods = {p["metadata"]["name"]: p for p in objs.pods}
    replicas: dict[str, list[Address]] = {}
    first_engine: tuple[Any, AttachedReplica] | None = None
    for role in dep.roles:
        replicas[role.name] = []
        for rep in role.replicas:
            pod = pods.get(str(rep.pod))
            if pod is None:
                raise UsageError(
                    f"attached deployment {dep.name}: role {role.name} Pod {rep.pod} is gone "
                    f"from namespace {dep.namespace} (replaced or scaled away).",
                    hint=f"attach it again: `servebook attach {dep.name} --backend kubernetes "
                    f"-n {dep.namespace}`.",
                )
            port = int(rep.port or stacks.VLLM_PORT)
            replicas[role.name].append(
                Address(
                    pod_url(pod, port, role.name, rep.scheme),
                    pod_url(pod, int(rep.metrics_port or port), role.name, rep.scheme),
                )
            )
            if first_engine is None and role.kind == "engine":
                first_engine = (pod, rep)
    entry = _entry(objs, dep)
    reach = Reach(
        route="cluster-service",
        replicas=replicas,
        entry_url=f"{entry.scheme}://{entry.service}.{dep.namespace}.svc:{entry.port}",
        # the entry's own server: the deployment's router where it is no role's
        router=Address(pod_url(pods[entry.pods[0]], entry.target_port, "entry", entry.scheme)),
        detail=IN_CLUSTER,
    )
    view = build(view_record(dep), reach).to_doc()
    engine_pod, engine_rep = first_engine or (None, None)
    spec = (engine_pod or {}).get("spec") or {}
    container: dict[str, Any] = next(
        (
            c
            for c in spec.get("containers") or ()
            if engine_rep and c.get("name") == engine_rep.container
        ),
        {},
    )
    key_env = [
        {"name": "VLLM_API_KEY", "valueFrom": e["valueFrom"]}
        for e in container.get("env") or ()
        if e.get("name") in ("VLLM_API_KEY", "OPENAI_API_KEY")
        and "secretKeyRef" in (e.get("valueFrom") or {})
    ][:1]
    return Source(
        api=api,
        name=dep.name,
        namespace=dep.namespace,
        view=view,
        engine_image=container.get("image"),
        api_key_env=key_env,
        # Not the ones the API server adds to every Pod (DefaultTolerationSeconds).
        tolerations=[
            t
            for t in spec.get("tolerations") or ()
            if not str(t.get("key", "")).startswith("node.kubernetes.io/")
        ],
        image_pull_secrets=[
            str(s["name"]) for s in spec.get("imagePullSecrets") or () if s.get("name")
        ],
    )


@contextlib.contextmanager
def open_attached(dep: AttachedDeployment) -> Iterator[DeploymentView]:
    """The view of a ``backend: kubernetes`` record, reached through port-forwards held
    for the body of the with-block; every replica is forwarded on its own (its liveness
    and its description name its Pod)."""
    from servebook.kube.kr8s_dialer import Kr8sDialer, kr8s_pod_identity
    from servebook.kube.portforward import Forwards

    api = kube_client.connect()
    with Forwards(Kr8sDialer(api), pod_identity=kr8s_pod_identity(api), timeout_s=10.0) as fw:
        replicas: dict[str, list[Address]] = {}
        for role in dep.roles:
            replicas[role.name] = [_forwarded(fw, dep, role.name, rep) for rep in role.replicas]
        reach = Reach(
            "port-forward", replicas, entry_url=_entry_url(fw, api, dep), detail=FORWARDED
        )
        yield view_of(dep, reach)


def _forwarded(fw: Any, dep: AttachedDeployment, role: str, rep: AttachedReplica) -> Address:
    """A forward to one replica's Pod (its metrics port too where it differs); its
    liveness and description name its Pod."""
    key = f"{role} {rep.pod}"
    pod, port = str(rep.pod), int(rep.port or stacks.VLLM_PORT)
    api_url = fw.open(role=key, pod=pod, namespace=dep.namespace, remote_port=port)
    metrics_url = api_url
    if rep.metrics_port and rep.metrics_port != port:
        metrics_url = fw.open(
            role=key, pod=pod, namespace=dep.namespace, remote_port=rep.metrics_port
        )
    if rep.scheme == "https":
        api_url = api_url.replace("http://", "https://", 1)
        metrics_url = metrics_url.replace("http://", "https://", 1)

    def describe() -> str:
        where = f"Pod {rep.pod} on node {rep.node}, port {rep.port}"
        problem = fw.problems().get(key)
        return f"{where}: {problem}" if problem else where

    return Address(api_url, metrics_url, alive=lambda: fw.alive(key), describe=describe)


__all__ = [
    "NOT_RUN_ON_A_CLUSTER",
    "claims_text",
    "find",
    "found_dict",
    "open_attached",
    "read_namespace",
    "record_of",
]
