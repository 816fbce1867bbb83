"""Plan -> Kubernetes objects: what `servebook render` writes and the kubernetes backend
applies.  Plain data in, plain dicts out; nothing here touches a cluster.

Each rule answers a failure in the field notes:

* The Namespace is one of the objects (a namespace every manifest referenced and none
  created made the apply fail).
* Weights come from the node's disk as hostPath ``type: Directory``, mounted read-only: a
  typo'd or absent directory fails at mount time with the path in the event, instead of
  ``DirectoryOrCreate`` creating it empty and the engine crash-looping minutes later with
  an error that reads like a bad model name.  Every Pod that mounts node directories is
  pinned to its node (``nodeSelector`` on ``kubernetes.io/hostname``), so it cannot land
  on a node where the path is empty.
* The startup probe allows the whole weight load (``startup_timeout_s``): a budget shorter
  than the load is an endless restart loop that looks like a crash.  Readiness is vLLM's
  ``/health``, which answers 200 only once the engine serves and 503 once it died.
* Deployments use ``Recreate``: a rolling update would start a second GPU Pod on the
  pinned node and wait forever for the GPUs the first one holds.
* A model the recipe generates (``kubernetes.model_source: generate``, the tiny recipes)
  is made in each engine Pod by an init container of the engine image running
  servebook's own generator, shipped in a ConfigMap, into an emptyDir the engine mounts
  read-only: no weights on any node, no download but the image.  The Pod template
  carries the generator's hash, so a new generator rolls the Pods.
* A PD recipe's fabric (``kubernetes.fabric``, ``servebook.kube.fabrics``) states the KV
  transport: device resources and counts, network annotations, the transport library's
  environment and the capabilities it needs; without one NIXL silently uses TCP.
* The engine gets vLLM's own start-up budget (``VLLM_ENGINE_READY_TIMEOUT_S``, 600 s by
  default) raised to the startup probe's, or vLLM gives up on a large model's load before
  Kubernetes would; node-local weights run with ``HF_HUB_OFFLINE=1``, so an incomplete
  directory fails at once instead of turning into a download.
* Engine Pods request CPU and memory (Burstable QoS, or Guaranteed on request), never
  BestEffort, the first evicted; a drain timeout becomes vLLM's ``--shutdown-timeout`` and
  the Pod's termination grace; ``pod.overrides`` is merged last and checked against the
  Pod schema, naming the key, before anything is written.
* A KV connector that hands KV over through files (``kubernetes.kv_storage``,
  ExampleConnector) gets a node directory both engines mount read-write: scratch, not
  weights, so ``DirectoryOrCreate``, one directory per deployment, emptied by the
  prefill Pod before its engine starts (stale files from an earlier run would read as
  transferred KV); both Pods are pinned to that node like any Pod mounting a node path.
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
from importlib import resources
from typing import Any

import yaml

from servebook.engines import vllm
from servebook.findings import UsageError
from servebook.kube import fabrics
from servebook.kube.validate import schema_errors
from servebook.recipe.plan import POD_MODELS_MOUNT, Plan, RolePlan
from servebook.recipe.schema import Generate, Kubernetes

ENGINE_PORT = 8000
ROUTER_PORT = 8000
ROUTER_METRICS_PORT = 29000
HOSTNAME_LABEL = "kubernetes.io/hostname"
PROBE_PERIOD_S = 10
MANAGED_BY = "servebook"
# Every object of a deployment carries its deployment's name under this label, and every
# role's Pod selector includes it: two deployments of one recipe in one namespace never
# select each other's Pods, and `down a` finds (and deletes) only a's objects.
DEPLOYMENT_LABEL = "servebook.io/deployment"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# The recipe a deployment was made from (annotation on its Deployments and Services).
RECIPE_ANNOTATION = "servebook.io/recipe"
# On a Namespace servebook created: the deployment that created it (only such a namespace
# is ever deleted by `down`).
CREATED_BY_ANNOTATION = "servebook.io/created-by"
# Namespaces every cluster has: emitting a Namespace object for them would only relabel
# them (and `kubectl delete -f` would try to delete them).
BUILTIN_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# The generator a Pod runs to make a model in place (kubernetes.model_source 'generate'):
# servebook/models/tiny.py, which runs as a lone script with numpy and tokenizers (both in
# vLLM's images), shipped under this key of a ConfigMap mounted at GENERATOR_MOUNT.
GENERATOR_KEY = "tiny_model.py"
GENERATOR_MOUNT = "/servebook"
GENERATOR_HASH_ANNOTATION = "servebook.io/model-generator-sha256"
GENERATOR_ARGS: dict[Generate, list[str]] = {Generate.TINY: [], Generate.TINY_DRAFT: ["--draft"]}
KV_VOLUME = "kv-storage"
COMPILE_CACHE_VOLUME = "compile-cache"
# vLLM's default VLLM_ENGINE_READY_TIMEOUT_S (vllm/envs.py): the API server gives up on
# its engine core after this ("Timed out waiting for engine core processes to start").
VLLM_ENGINE_READY_DEFAULT_S = 600
# Termination grace beyond vLLM's drain: the engine core and its workers shut down after
# the API server stops (kserve and llm-d allow 30 s and more on top of the drain).
DRAIN_MARGIN_S = 30


# A role whose one copy spans nodes is a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1,
# kubernetes-sigs/lws): a group of nodes_per_replica Pods, the leader (worker index 0)
# serving the API, the workers headless engines, joined by vLLM's multi-node data
# parallelism (docs/serving/data_parallel_deployment.md).  The LWS controller injects
# LWS_LEADER_ADDRESS (the leader's name under the group's headless Service),
# LWS_GROUP_SIZE and LWS_WORKER_INDEX into every container; Kubernetes expands
# $(LWS_LEADER_ADDRESS) in args.  It names that headless Service after the
# LeaderWorkerSet, so the set is NAME-ROLE-lws and NAME-ROLE stays the role's Service.
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_SUFFIX = "-lws"
# Which member of a group a Pod is (leader serves the API; workers run headless).
MEMBER_LABEL = "servebook.io/member"
DP_RPC_PORT = 13345
# The router's own identity when it discovers engine Pods (roles with replicas > 1).
ROUTER_DISCOVERY_VERBS = ["get", "list", "watch"]

Obj = dict[str, Any]


def settings(plan: Plan) -> Kubernetes:
    """The recipe's Kubernetes settings, or the defaults when it gives none."""
    return plan.kubernetes or Kubernetes()


def role_object_name(deployment: str, role: str) -> str:
    """The Deployment and Service name of a role of deployment ``deployment``: the
    deployment's name for a mixed server, ``NAME-ROLE`` for the PD roles (vllm-pd-prefill,
    vllm-pd-decode, vllm-pd-router for a deployment named vllm-pd)."""
    return deployment if role == "mixed" else f"{deployment}-{role}"


def object_name(plan: Plan, role: str, name: str | None = None) -> str:
    """``role_object_name`` of deployment ``name`` (default: the recipe's name)."""
    return role_object_name(name or plan.recipe, role)


def selector_for(deployment: str, role: str) -> dict[str, str]:
    """The labels that select a role's Pods: its deployment's and its role's."""
    return {DEPLOYMENT_LABEL: deployment, COMPONENT_LABEL: role}


def api_selector_for(deployment: str, role: RolePlan) -> dict[str, str]:
    """The labels that select the role's Pods that serve the API: all of them, or, for a
    role whose copy spans nodes, the group leaders (workers are headless)."""
    sel = selector_for(deployment, role.name)
    if role.spans_nodes:
        sel[MEMBER_LABEL] = "leader"
    return sel


def lws_name(deployment: str, role: str) -> str:
    """The LeaderWorkerSet of a role whose copy spans nodes (and its headless Service)."""
    return role_object_name(deployment, role) + LWS_SUFFIX


def router_account_name(deployment: str) -> str:
    return f"{deployment}-router"


def discovers(plan: Plan) -> bool:
    """The router finds the engines by label: some PD role has more than one copy."""
    return plan.topology == "pd" and any(r.replicas > 1 for r in plan.engine_roles)


def deployment_selector(deployment: str) -> str:
    """A label selector (query text) for every object of a deployment."""
    return f"{DEPLOYMENT_LABEL}={deployment}"


def generator_source() -> str:
    """The text of the model generator a Pod runs (servebook/models/tiny.py)."""
    return (resources.files("servebook.models") / "tiny.py").read_text(encoding="utf-8")


def generator_configmap_name(deployment: str) -> str:
    return f"{deployment}-model-generator"


def _generator_configmap(plan: Plan, namespace: str, name: str, source: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": generator_configmap_name(name),
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "servebook-model-generator",
                "app.kubernetes.io/instance": name,
                COMPONENT_LABEL: "model-generator",
                MANAGED_BY_LABEL: MANAGED_BY,
                DEPLOYMENT_LABEL: name,
            },
            "annotations": {RECIPE_ANNOTATION: plan.recipe},
        },
        "data": {GENERATOR_KEY: source},
    }


def _labels(plan: Plan, role: RolePlan, name: str) -> dict[str, str]:
    app = "vllm-router" if role.kind == "router" else plan.engine
    return {
        "app.kubernetes.io/name": app,
        "app.kubernetes.io/instance": name,
        COMPONENT_LABEL: role.name,
        MANAGED_BY_LABEL: MANAGED_BY,
        DEPLOYMENT_LABEL: name,
    }


def _metadata(plan: Plan, role: RolePlan, namespace: str, name: str) -> Obj:
    return {
        "name": object_name(plan, role.name, name),
        "namespace": namespace,
        "labels": _labels(plan, role, name),
        "annotations": {RECIPE_ANNOTATION: plan.recipe},
    }


def _http_probe(path: str, period: int, timeout: int, failures: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _startup_failures(budget_s: int) -> int:
    return max(1, math.ceil(budget_s / PROBE_PERIOD_S))


def gpu_count(role: RolePlan) -> int:
    gpus = role.resources.gpus
    try:
        return int(gpus)
    except ValueError:
        raise UsageError(
            f"role {role.name}: resources.gpus = {gpus!r} is not a whole number of GPUs."
        ) from None


def _engine_resources(role: RolePlan) -> Obj:
    r = role.resources
    limits: dict[str, Any] = {}
    gpus = gpu_count(role)
    if gpus > 0:
        limits[r.gpu_resource] = gpus
    if r.rdma_resource:
        limits[r.rdma_resource] = r.rdma_count or 1
    requests: dict[str, Any] = dict(limits)
    if r.cpu:
        requests["cpu"] = r.cpu
    if r.memory:
        requests["memory"] = r.memory
    if r.guaranteed:
        if not (r.cpu and r.memory):
            raise UsageError(
                f"role {role.name}: guaranteed QoS needs both CPU and memory requests "
                "(the limits are set equal to them); set resources.cpu and "
                "resources.memory."
            )
        limits["cpu"] = r.cpu
        limits["memory"] = r.memory
    out: Obj = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _engine_env(plan: Plan, role: RolePlan) -> list[Obj]:
    env: list[Obj] = [{"name": k, "value": v} for k, v in role.env.items()]
    connector = vllm.kv_connector_of(role.args)
    if connector is None:
        return env
    net = vllm.connector_network(connector)
    for name in net.own_ip_env:
        if name not in role.env:
            # The other engine dials this address: the Pod's own IP, not localhost.
            env.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    port_env = net.bootstrap_port_env
    if role.name == "prefill" and port_env and net.bootstrap_port and port_env not in role.env:
        env.append({"name": port_env, "value": str(net.bootstrap_port)})
    return env


def _settings_env(plan: Plan, role: RolePlan, k8s: Kubernetes) -> dict[str, str]:
    """Environment the Kubernetes settings give an engine: the fabric's transport, the
    start-up budget, offline weights, the compile cache.  A role's own env wins."""
    env: dict[str, str] = {}
    if k8s.fabric is not None:
        p = fabrics.profile(k8s.fabric.profile)
        env.update(fabrics.environment(p, k8s.fabric.net_devices))
    if k8s.startup_timeout_s > VLLM_ENGINE_READY_DEFAULT_S:
        # vLLM's API server waits this long for its engine core to load the weights and
        # report ready, then exits: a budget shorter than the startup probe's turns a slow
        # load into a crash loop.
        env["VLLM_ENGINE_READY_TIMEOUT_S"] = str(k8s.startup_timeout_s)
    if role.model_container_path is not None and not role.pod_models:
        # The weights are a node directory: never reach for the hub (an incomplete
        # directory would otherwise read as a model id and start a download, or fail
        # minutes later with an error about the hub).
        env["HF_HUB_OFFLINE"] = "1"
    if k8s.compile_cache is not None:
        # vllm/envs.py: VLLM_CACHE_ROOT holds torch_compile_cache/ (compiled graphs);
        # Triton keeps its kernels under TRITON_CACHE_DIR (default ~/.triton).
        root = k8s.compile_cache.container_path.rstrip("/")
        env["VLLM_CACHE_ROOT"] = f"{root}/vllm"
        env["TRITON_CACHE_DIR"] = f"{root}/triton"
    return {k: v for k, v in env.items() if k not in role.env}


def _api_key_env(name: str, k8s: Kubernetes) -> list[Obj]:
    """The API key as ``name`` from the recipe's Secret (api_key_secret): a reference, so
    no key is ever written into a manifest.  vLLM reads VLLM_API_KEY itself (never
    ``--api-key``, which ``ps`` and the Pod spec would show); vllm-router sends its own
    OPENAI_API_KEY to the engines.  None without a Secret."""
    ref = k8s.api_key_secret
    if ref is None:
        return []
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def _engine_ports(role: RolePlan) -> list[Obj]:
    ports: list[Obj] = [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}]
    connector = vllm.kv_connector_of(role.args)
    net = vllm.connector_network(connector) if connector else None
    if role.name == "prefill" and net and net.bootstrap_port:
        ports.append({"name": "bootstrap", "containerPort": net.bootstrap_port, "protocol": "TCP"})
    return ports


def _model_init_containers(plan: Plan, role: RolePlan, name: str) -> list[Obj]:
    """One init container per model the Pod makes: the engine image runs the generator
    from the ConfigMap into the emptyDir the engine then mounts read-only."""
    script = f"{GENERATOR_MOUNT}/{GENERATOR_KEY}"
    out: list[Obj] = []
    for path, gen in role.pod_models.items():
        out.append(
            {
                "name": f"make-{path.rstrip('/').rsplit('/', 1)[-1]}",
                "image": role.image,
                "command": ["python3", script, path, *GENERATOR_ARGS[gen]],
                "volumeMounts": [
                    {"name": "models", "mountPath": POD_MODELS_MOUNT},
                    {"name": "model-generator", "mountPath": GENERATOR_MOUNT, "readOnly": True},
                ],
            }
        )
    return out


def _pin(pod: Obj, nodes: list[str], k8s: Kubernetes, labels: dict[str, str]) -> None:
    """Pin a Pod to its node, or to a list of nodes with one Pod of the role per node: a
    required node affinity on the hostname In the list (ANDed into every term of the
    recipe's own), and a required anti-affinity against the role's other Pods on the
    hostname.  Each listed node keeps the weights at the same path."""
    affinity: Obj = dict(k8s.pod.affinity) if k8s.pod.affinity else {}
    if len(nodes) == 1:
        pod["nodeSelector"] = {HOSTNAME_LABEL: nodes[0]}
    elif nodes:
        pin = {"key": HOSTNAME_LABEL, "operator": "In", "values": list(nodes)}
        node_aff = dict(affinity.get("nodeAffinity") or {})
        required = dict(node_aff.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        terms = list(required.get("nodeSelectorTerms") or [{}])
        required["nodeSelectorTerms"] = [
            {**t, "matchExpressions": [*(t.get("matchExpressions") or []), pin]} for t in terms
        ]
        node_aff["requiredDuringSchedulingIgnoredDuringExecution"] = required
        anti = dict(affinity.get("podAntiAffinity") or {})
        apart = {
            "labelSelector": {"matchLabels": dict(labels)},
            "topologyKey": HOSTNAME_LABEL,
        }
        anti["requiredDuringSchedulingIgnoredDuringExecution"] = [
            *(anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []),
            apart,
        ]
        affinity = {**affinity, "nodeAffinity": node_aff, "podAntiAffinity": anti}
    if affinity:
        pod["affinity"] = affinity


def _member_nodes(role: RolePlan, member: str | None) -> list[str]:
    """The nodes a member's Pods may run on: with one copy, the leader on the first
    listed node and the workers on the rest; with several, any listed node."""
    nodes = role.placement.all_nodes
    if member is None or role.replicas > 1:
        return nodes
    return nodes[:1] if member == "leader" else nodes[1:]


def _member_args(role: RolePlan, member: str | None, args: list[str]) -> list[str]:
    """A group member's own data-parallel flags (vLLM's multi-node data parallel: every
    member dials the leader's address; workers are headless and start at their rank)."""
    if member is None:
        return args
    out = [
        *args,
        "--data-parallel-address",
        "$(LWS_LEADER_ADDRESS)",
        "--data-parallel-rpc-port",
        str(DP_RPC_PORT),
    ]
    if member == "worker":
        local = int(vllm.flag_value(args, "--data-parallel-size-local") or 1)
        out.append("--headless")
        if role.nodes_per_replica == 2:
            out += ["--data-parallel-start-rank", str(local)]
    return out


def _engine_deployment(
    plan: Plan, role: RolePlan, k8s: Kubernetes, name: str, generator_hash: str | None
) -> Obj:
    pod, annotations, _ = _engine_pod(plan, role, k8s, name, generator_hash, None)
    return _deployment(plan, role, k8s.namespace, pod, name, annotations)


def _engine_lws(
    plan: Plan, role: RolePlan, k8s: Kubernetes, name: str, generator_hash: str | None
) -> tuple[Obj, list[Obj]]:
    """A role whose copy spans nodes: one LeaderWorkerSet, a group per replica."""
    leader, leader_ann, ports = _engine_pod(plan, role, k8s, name, generator_hash, "leader")
    worker, worker_ann, _ = _engine_pod(plan, role, k8s, name, generator_hash, "worker")

    def template(pod: Obj, member: str, ann: dict[str, str]) -> Obj:
        meta: Obj = {"labels": {**_labels(plan, role, name), MEMBER_LABEL: member}}
        if ann:
            meta["annotations"] = ann
        # Copies: one shared list would be written as a YAML anchor and alias.
        return {"metadata": meta, "spec": copy.deepcopy(pod)}

    meta = _metadata(plan, role, k8s.namespace, name)
    meta["name"] = lws_name(name, role.name)
    lws: Obj = {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": meta,
        "spec": {
            "replicas": role.replicas,
            # Workers start with the leader: the leader's API server waits for every
            # rank's handshake, so it cannot become Ready alone.
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": role.nodes_per_replica,
                # A member that restarts alone cannot rejoin its group's collectives.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template(leader, "leader", leader_ann),
                "workerTemplate": template(worker, "worker", worker_ann),
            },
        },
    }
    return lws, ports


def _engine_pod(
    plan: Plan,
    role: RolePlan,
    k8s: Kubernetes,
    name: str,
    generator_hash: str | None,
    member: str | None,
) -> tuple[Obj, dict[str, str], list[Obj]]:
    """An engine Pod spec, its Pod annotations and its ports; ``member`` is ``leader`` or
    ``worker`` in a group that spans nodes, None otherwise."""
    if not role.image:
        raise UsageError(
            f"recipe {plan.recipe} names no image for role {role.name}: set the recipe's "
            "top-level `image:` (usually `image: ${image}` with an `image` parameter)."
        )
    volumes: list[Obj] = []
    mounts: list[Obj] = []
    for vol, host, inside in (
        ("model", role.model_path, role.model_container_path),
        ("draft", role.draft_path, role.draft_container_path),
    ):
        if host is None or inside is None or role.pod_models:
            continue
        # Directory, never DirectoryOrCreate: a missing path must fail at mount time.
        volumes.append({"name": vol, "hostPath": {"path": host, "type": "Directory"}})
        mounts.append({"name": vol, "mountPath": inside, "readOnly": True})
    init: list[Obj] = []
    if k8s.kv_storage is not None:
        kv = k8s.kv_storage
        # Scratch both engines share, not weights: created when absent, one per deployment.
        host = f"{kv.host_path.rstrip('/')}/{name}"
        volumes.append({"name": KV_VOLUME, "hostPath": {"path": host, "type": "DirectoryOrCreate"}})
        mounts.append({"name": KV_VOLUME, "mountPath": kv.container_path})
        if role.name == "prefill":
            # Files an earlier run left would be found by decode as if transferred now.
            init.append(
                {
                    "name": "clear-kv-storage",
                    "image": role.image,
                    "command": ["find", kv.container_path, "-mindepth", "1", "-delete"],
                    "volumeMounts": [{"name": KV_VOLUME, "mountPath": kv.container_path}],
                }
            )
    nodes = _member_nodes(role, member)
    if role.pod_models:
        init += _model_init_containers(plan, role, name)
        volumes += [
            {"name": "models", "emptyDir": {}},
            {
                "name": "model-generator",
                "configMap": {"name": generator_configmap_name(name)},
            },
        ]
        mounts.append({"name": "models", "mountPath": POD_MODELS_MOUNT, "readOnly": True})
    if k8s.compile_cache is not None:
        cc = k8s.compile_cache
        # Scratch, one per deployment and role: created when absent, kept across restarts.
        host = f"{cc.host_path.rstrip('/')}/{name}-{role.name}"
        volumes.append(
            {"name": COMPILE_CACHE_VOLUME, "hostPath": {"path": host, "type": "DirectoryOrCreate"}}
        )
        mounts.append({"name": COMPILE_CACHE_VOLUME, "mountPath": cc.container_path})
    host_paths = [v["hostPath"]["path"] for v in volumes if "hostPath" in v]
    if host_paths and not nodes:
        raise UsageError(
            f"recipe {plan.recipe}: role {role.name} mounts directories of a node "
            f"({', '.join(host_paths)}) but is pinned to no node; "
            "on another node the path may be empty or not the other role's. Set roles."
            f"{role.name}.placement.node (a node parameter)."
        )
    volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": k8s.shm_size}})
    mounts.append({"name": "shm", "mountPath": "/dev/shm"})

    args = _member_args(role, member, list(role.cluster_args))
    drain = k8s.pod.drain_timeout_s
    if drain is not None:
        if vllm.flag_value(args, "--shutdown-timeout") is not None:
            raise UsageError(
                f"recipe {plan.recipe}: role {role.name}'s engine arguments set "
                "--shutdown-timeout, which servebook sets from kubernetes.pod.drain_timeout_s "
                "(with the Pod's termination grace to match); remove it from the arguments."
            )
        # vLLM >= 0.18: on SIGTERM, refuse new requests and let in-flight ones finish for
        # up to this long (0, the default, aborts them at once).
        args += ["--shutdown-timeout", str(drain)]
    argv = vllm.server_argv("python3", args, "0.0.0.0", ENGINE_PORT)
    command, cargs = argv[:3], argv[3:]
    if member == "worker" and role.nodes_per_replica > 2:
        # Workers share one template; each starts at its own rank, which only a shell can
        # compute from LWS_WORKER_INDEX ($$ is a literal $ to Kubernetes).
        local = int(vllm.flag_value(args, "--data-parallel-size-local") or 1)
        command = [
            "/bin/sh",
            "-c",
            f'exec {" ".join(argv[:3])} "$@" --data-parallel-start-rank '
            f"$$((LWS_WORKER_INDEX * {local}))",
            "engine",
        ]
    container: Obj = {
        "name": "engine",
        "image": role.image,
        "command": command,
        "args": cargs,
    }
    env = _engine_env(plan, role)
    env += [{"name": k, "value": v} for k, v in _settings_env(plan, role, k8s).items()]
    if "VLLM_API_KEY" not in role.env:
        env += _api_key_env("VLLM_API_KEY", k8s)
    if env:
        container["env"] = env
    ports = _engine_ports(role) if member != "worker" else []
    if ports:
        container["ports"] = ports
    resources = _engine_resources(role)
    if resources:
        container["resources"] = resources
    container["volumeMounts"] = mounts
    # Startup: the whole weight load.  Then readiness: the engine answers /health (200, or
    # 503 once the engine core died).  Liveness is lenient: a busy engine's /health may be
    # slow, and a restart costs a full weight load.
    # A headless worker serves no HTTP: its health is the leader's /health, which fails
    # once any rank of the group died (and the group is recreated with it).
    if member != "worker":
        container["startupProbe"] = _http_probe(
            vllm.HEALTH_PATH, PROBE_PERIOD_S, 5, _startup_failures(k8s.startup_timeout_s)
        )
        container["readinessProbe"] = _http_probe(vllm.HEALTH_PATH, PROBE_PERIOD_S, 10, 3)
        container["livenessProbe"] = _http_probe(vllm.HEALTH_PATH, 30, 30, 5)
    capabilities: list[str] = []
    annotations: dict[str, str] = {}
    if k8s.fabric is not None:
        p = fabrics.profile(k8s.fabric.profile)
        capabilities += p.capabilities
        annotations.update(
            fabrics.pod_annotations(
                p, k8s.fabric.networking, k8s.fabric.networks, role.resources.rdma_count or 1
            )
        )
    elif role.resources.rdma_resource:
        # RDMA registers (pins) GPU and host memory: it needs to lock memory.
        capabilities.append("IPC_LOCK")
    if capabilities:
        container["securityContext"] = {"capabilities": {"add": capabilities}}

    pod: Obj = {}
    _pin(pod, nodes, k8s, selector_for(name, role.name))
    if k8s.tolerations:
        pod["tolerations"] = k8s.tolerations
    _pod_identity(pod, k8s)
    if drain is not None:
        pod["terminationGracePeriodSeconds"] = drain + DRAIN_MARGIN_S
    # No Service environment variables: a Service named like `vllm-...` would inject
    # VLLM_*_PORT=tcp://... variables that vLLM reads as its own settings.
    pod["enableServiceLinks"] = False
    if init:
        pod["initContainers"] = init
    pod["containers"] = [container]
    pod["volumes"] = volumes
    if k8s.pod.overrides:
        pod = _override(plan, role, pod, k8s.pod.overrides)
    if role.pod_models and generator_hash:
        annotations[GENERATOR_HASH_ANNOTATION] = generator_hash
    return pod, annotations, ports


def _pod_identity(pod: Obj, k8s: Kubernetes) -> None:
    """What every Pod of a deployment gets for admission and scheduling: pull secrets, a
    service account, a priority class."""
    s = k8s.pod
    if s.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in s.image_pull_secrets]
    if s.service_account:
        pod["serviceAccountName"] = s.service_account
    if s.priority_class:
        pod["priorityClassName"] = s.priority_class


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(base[k], v) if k in base else v
        return out
    return over


def _override(plan: Plan, role: RolePlan, pod: Obj, overrides: dict[str, Any]) -> Obj:
    """The engine Pod spec with ``kubernetes.pod.overrides`` merged in, checked against the
    Pod schema first so that an error names the override, not a generated object."""
    merged: Obj = _merge(pod, overrides)
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "override"}, "spec": merged}
    errors = schema_errors([probe])
    if errors:
        detail = "\n".join("  " + e.split(": ", 1)[1].replace("spec.", "", 1) for e in errors)
        raise UsageError(
            f"recipe {plan.recipe}: kubernetes.pod.overrides makes role {role.name}'s Pod "
            "spec invalid against the Kubernetes Pod schema (strict); nothing was written:\n"
            f"{detail}\nFix the override (keys are Pod spec fields: `kubectl explain "
            "pod.spec`)."
        )
    return merged


def _deployment(
    plan: Plan,
    role: RolePlan,
    namespace: str,
    pod: Obj,
    name: str,
    pod_annotations: dict[str, str] | None = None,
) -> Obj:
    template: Obj = {"metadata": {"labels": _labels(plan, role, name)}, "spec": pod}
    if pod_annotations:
        template["metadata"]["annotations"] = pod_annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(plan, role, namespace, name),
        "spec": {
            "replicas": role.replicas,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector_for(name, role.name)},
            "template": template,
        },
    }


def _service(plan: Plan, role: RolePlan, namespace: str, ports: list[Obj], name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(plan, role, namespace, name),
        "spec": {
            "type": "ClusterIP",
            "selector": api_selector_for(name, role),
            "ports": [
                {"name": p["name"], "port": p["containerPort"], "targetPort": p["name"]}
                for p in ports
            ],
        },
    }


def _router_deployment(
    plan: Plan, role: RolePlan, k8s: Kubernetes, name: str
) -> tuple[Obj, list[Obj]]:
    if not role.image:
        raise UsageError(
            f"recipe {plan.recipe}: the router has no image; set router.image (the "
            "vllm-router image; the engine image does not ship it)."
        )
    connector = vllm.kv_connector_of(plan.role("prefill").cluster_args) or ""
    net = vllm.connector_network(connector)
    k8s_args = vllm.router_k8s_args(connector, k8s.startup_timeout_s, ROUTER_METRICS_PORT)
    if discovers(plan):
        if net.bootstrap_port:
            raise UsageError(
                f"recipe {plan.recipe}: a role has several replicas, so the router finds the "
                f"engines by label, but {connector} needs each prefill engine's bootstrap "
                "port, which vllm-router takes only with a --prefill URL. Keep one replica "
                "per role with this connector, or use NixlConnector."
            )
        # vllm-router's Kubernetes service discovery: it watches the namespace's Pods and
        # routes to those of each selector once Ready (vllm-router --help).
        argv = [
            "vllm-router",
            "--vllm-pd-disaggregation",
            "--service-discovery",
            "--prefill-selector",
            *(f"{k}={v}" for k, v in api_selector_for(name, plan.role("prefill")).items()),
            "--decode-selector",
            *(f"{k}={v}" for k, v in api_selector_for(name, plan.role("decode")).items()),
            "--service-discovery-namespace",
            k8s.namespace,
            "--service-discovery-port",
            str(ENGINE_PORT),
            "--host",
            "0.0.0.0",
            "--port",
            str(ROUTER_PORT),
            *k8s_args,
            *role.args,
        ]
    else:
        argv = vllm.router_argv(
            "vllm-router",
            prefill_url=f"http://{object_name(plan, 'prefill', name)}:{ENGINE_PORT}",
            decode_url=f"http://{object_name(plan, 'decode', name)}:{ENGINE_PORT}",
            host="0.0.0.0",
            port=ROUTER_PORT,
            extra=[*k8s_args, *role.args],
            prefill_bootstrap_port=net.bootstrap_port,
        )
    dups = vllm.duplicate_flags(argv[1:])
    if dups:
        raise UsageError(
            f"recipe {plan.recipe}: router.args gives {', '.join(dups)}, which servebook "
            "already sets for the router; remove it from router.args."
        )
    ports: list[Obj] = [
        {"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"},
        {"name": "metrics", "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"},
    ]
    # The router waits for both engines before it serves; its budget is theirs plus a
    # minute, and it is ready once it has a healthy prefill and decode engine.
    container: Obj = {"name": "router", "image": role.image, "command": argv[:1], "args": argv[1:]}
    # vllm-router checks no client's key; it sends its own OPENAI_API_KEY to the engines.
    router_env = _api_key_env("OPENAI_API_KEY", k8s)
    if router_env:
        container["env"] = router_env
    container |= {
        "ports": ports,
        "startupProbe": _http_probe(
            vllm.ROUTER_LIVENESS_PATH,
            PROBE_PERIOD_S,
            5,
            _startup_failures(k8s.startup_timeout_s + 60),
        ),
        "readinessProbe": _http_probe(vllm.ROUTER_READINESS_PATH, PROBE_PERIOD_S, 5, 3),
        "livenessProbe": _http_probe(vllm.ROUTER_LIVENESS_PATH, 30, 10, 5),
    }
    pod: Obj = {}
    if k8s.tolerations:
        pod["tolerations"] = k8s.tolerations
    _pod_identity(pod, k8s)
    if discovers(plan):
        # Its own account, allowed to watch the namespace's Pods and nothing more.
        pod["serviceAccountName"] = router_account_name(name)
    pod["enableServiceLinks"] = False
    pod["containers"] = [container]
    return _deployment(plan, role, k8s.namespace, pod, name), ports


def _router_access(plan: Plan, role: RolePlan, namespace: str, name: str) -> list[Obj]:
    """ServiceAccount, Role and RoleBinding that let the router watch the namespace's
    Pods (its service discovery lists and watches Pods; it writes nothing)."""
    account = router_account_name(name)
    meta = _metadata(plan, role, namespace, name)
    meta["name"] = account
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": dict(meta),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ROUTER_DISCOVERY_VERBS}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": dict(meta),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": account,
            },
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    ]


def render(plan: Plan, name: str | None = None) -> list[Obj]:
    """Every object of deployment ``name`` (default: the recipe's name), in apply order:
    Namespace, then per role (engines first, router last) its Deployment and Service.
    Object names, labels and Pod selectors derive from the deployment's name."""
    if "kubernetes" not in plan.backends:
        raise UsageError(
            f"recipe {plan.recipe} runs on the {', '.join(plan.backends)} backend only "
            f"(backends: {plan.backends}); `servebook render` writes Kubernetes manifests. "
            "Use `servebook up` for it, or render a recipe with `backends: [kubernetes]` "
            "(`servebook recipes` lists them)."
        )
    missing = plan.unresolved_on.get("kubernetes")
    if missing:
        raise UsageError(
            f"{plan.origin}: {len(missing)} parameter(s) the kubernetes backend needs are "
            "unset; nothing was rendered or started:\n" + "\n".join(missing)
        )
    name = name or plan.recipe
    whose = f"recipe name {name!r}" if name == plan.recipe else f"deployment name {name!r}"
    fix = "Shorten the recipe's name." if name == plan.recipe else "Choose another --name."
    k8s = settings(plan)
    generates = any(r.pod_models for r in plan.roles)
    names = [name, *(object_name(plan, role.name, name) for role in plan.roles)]
    names += [lws_name(name, r.name) for r in plan.roles if r.spans_nodes]
    if generates:
        names.append(generator_configmap_name(name))
    for obj_name in names:
        if not _DNS_LABEL.match(obj_name):
            raise UsageError(
                f"{whose} makes the object name {obj_name!r}, which is not a valid "
                "Kubernetes name (at most 63 lowercase letters, digits and '-', starting and "
                f"ending with a letter or digit). {fix}"
            )
    objects: list[Obj] = []
    if k8s.namespace not in BUILTIN_NAMESPACES:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": k8s.namespace,
                    "labels": {MANAGED_BY_LABEL: MANAGED_BY},
                },
            }
        )
    generator_hash: str | None = None
    if generates:
        source = generator_source()
        generator_hash = hashlib.sha256(source.encode()).hexdigest()
        objects.append(_generator_configmap(plan, k8s.namespace, name, source))
    for role in plan.roles:
        if role.kind == "engine" and role.spans_nodes:
            dep, ports = _engine_lws(plan, role, k8s, name, generator_hash)
        elif role.kind == "engine":
            dep = _engine_deployment(plan, role, k8s, name, generator_hash)
            ports = dep["spec"]["template"]["spec"]["containers"][0]["ports"]
        else:
            if discovers(plan):
                objects += _router_access(plan, role, k8s.namespace, name)
            dep, ports = _router_deployment(plan, role, k8s, name)
        objects += [dep, _service(plan, role, k8s.namespace, ports, name)]
    return objects


class _Dumper(yaml.SafeDumper):
    """Safe YAML, with text of several lines (a script in a ConfigMap) as a literal block
    a reader can read."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def manifest_files(plan: Plan, objects: list[Obj]) -> dict[str, str]:
    """File name -> YAML text: the Namespace first, then one file per role holding its
    Deployment and Service, numbered so `kubectl apply -f DIR` applies them in order."""
    groups: list[tuple[str, list[Obj]]] = []
    for obj in objects:
        name = obj["metadata"]["name"]
        if obj["kind"] == "Namespace":
            groups.append(("namespace", [obj]))
        elif groups and groups[-1][0] == name:
            groups[-1][1].append(obj)
        else:
            groups.append((name, [obj]))
    header = (
        f"# Rendered by `servebook render` from recipe {plan.recipe}. Do not edit: change a\n"
        "# parameter and render again (PARAMETERS.md lists every value and how it was found).\n"
    )
    files: dict[str, str] = {}
    for i, (name, objs) in enumerate(groups):
        text = yaml.dump_all(
            objs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=4096
        )
        files[f"{i * 10:02d}-{name}.yaml"] = header + text
    return files
