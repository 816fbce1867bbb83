"""An engine role's Pod spec, as ``kube.manifests`` wraps it in a Deployment or a
LeaderWorkerSet: the weights from the node's disk, the fabric, the environment, the
resources, the probes, where it is pinned, and a group member's data-parallel flags
(``kube.manifests``' docstring gives the field notes behind each rule).  The router's Pod
shares its probes, its API-key reference and its identity settings (pull secrets, service
account, priority class).  Plain data in, plain dicts out.
"""

from __future__ import annotations

import math
from typing import Any

from servebook.engines import fabrics, vllm
from servebook.errors import UsageError
from servebook.kube import fabric_networks
from servebook.kube.names import (
    ENGINE_PORT,
    GENERATOR_KEY,
    HOSTNAME_LABEL,
    generator_configmap_name,
    selector_for,
)
from servebook.kube.validate import schema_errors
from servebook.recipe.plan import POD_MODELS_MOUNT, Plan, RolePlan
from servebook.recipe.schema import Generate, Kubernetes

# How long a serving role may fail its readiness probe before its Pod leaves the Service.
READY_GRACE_S = 30
# The generator's ConfigMap is mounted here; the generator runs as a lone script with
# numpy and tokenizers (both in vLLM's images).  The Pod template carries its hash, so a
# new generator rolls the Pods.
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
DP_RPC_PORT = 13345
# A Deployment's progressDeadlineSeconds beyond its Pods' start-up budget: the image pull
# (a vLLM image is 10-20 GB; preflight's pull budget is 900 s) and the init containers
# come before the startup probe's budget starts.  Kubernetes' default, 600 s, would have
# `kubectl rollout status` call a healthy 40-minute load failed at 10 minutes.
PROGRESS_MARGIN_S = 900
# The router's requests: vllm-router is one Rust process that proxies streams; requests
# keep it out of the BestEffort class (the first evicted) and only reserve, never cap.
ROUTER_REQUESTS = {"cpu": "1", "memory": "1Gi"}

Obj = dict[str, Any]


def http_probe(path: str, period: int, timeout: int, failures: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def serving_probes(
    start_path: str, ready_path: str, k8s: Kubernetes, budget_s: int, ready_timeout_s: int
) -> Obj:
    """A serving role's startup and readiness probes, both every ``k8s.probe_period_s``:
    the startup probe's failures span ``budget_s``; the readiness probe's ~30 s of failed
    probes (``READY_GRACE_S``; 3 at Kubernetes' usual 10 s period), whatever the period."""
    period = k8s.probe_period_s
    return {
        "startupProbe": http_probe(start_path, period, 5, max(1, math.ceil(budget_s / period))),
        "readinessProbe": http_probe(
            ready_path, period, ready_timeout_s, max(3, math.ceil(READY_GRACE_S / period))
        ),
    }


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
    if not (r.cpu and r.memory):
        raise UsageError(
            f"role {role.name} requests no {'cpu' if not r.cpu else 'memory'}: set "
            f"roles.{role.name}.resources.cpu and .memory (quantities such as 16 and "
            "128Gi). A Pod without requests is BestEffort, the first the kubelet evicts "
            "under node pressure."
        )
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


def _init_resources(role: RolePlan) -> Obj:
    """An init container's resources: the engine's CPU and memory (an init container
    runs before the engine, so the Pod's request stays the engine's), and with guaranteed
    QoS the same limits, which every container needs for the Pod to be Guaranteed."""
    r = role.resources
    cpu_mem = {"cpu": r.cpu, "memory": r.memory}
    return {"requests": cpu_mem, "limits": dict(cpu_mem)} if r.guaranteed else {"requests": cpu_mem}


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


def api_key_env(name: str, k8s: Kubernetes) -> list[Obj]:
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
                "resources": _init_resources(role),
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


def engine_pod(
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
    nodes = _member_nodes(role, member)
    volumes, mounts, init = _engine_volumes(plan, role, k8s, name, nodes)
    container, ports = _engine_container(plan, role, k8s, member, mounts)
    capabilities, annotations = _capabilities(role, k8s)
    if capabilities:
        container["securityContext"] = {"capabilities": {"add": capabilities}}

    pod: Obj = {}
    _pin(pod, nodes, k8s, selector_for(name, role.name))
    if k8s.tolerations:
        pod["tolerations"] = k8s.tolerations
    pod_identity(pod, k8s)
    drain = k8s.pod.drain_timeout_s
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


def _engine_volumes(
    plan: Plan, role: RolePlan, k8s: Kubernetes, name: str, nodes: list[str]
) -> tuple[list[Obj], list[Obj], list[Obj]]:
    """The engine's volumes, its container's mounts and the Pod's init containers: the
    weights from the node's disk (or made in the Pod), the KV scratch, the compile cache
    and shared memory.  A role that mounts a node's directories must be pinned to a node."""
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
                    "resources": _init_resources(role),
                }
            )
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
    return volumes, mounts, init


def _engine_command(
    plan: Plan, role: RolePlan, k8s: Kubernetes, member: str | None
) -> tuple[list[str], list[str]]:
    """The engine container's command and args: the role's engine arguments, a group
    member's data-parallel flags and the drain timeout."""
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
    return command, cargs


def _engine_container(
    plan: Plan, role: RolePlan, k8s: Kubernetes, member: str | None, mounts: list[Obj]
) -> tuple[Obj, list[Obj]]:
    """The engine container (command, environment, ports, resources, mounts, probes) and
    its ports."""
    command, cargs = _engine_command(plan, role, k8s, member)
    container: Obj = {
        "name": "engine",
        "image": role.image,
        "command": command,
        "args": cargs,
    }
    env = _engine_env(plan, role)
    env += [{"name": k, "value": v} for k, v in _settings_env(plan, role, k8s).items()]
    if "VLLM_API_KEY" not in role.env:
        env += api_key_env("VLLM_API_KEY", k8s)
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
        container |= serving_probes(
            vllm.HEALTH_PATH, vllm.HEALTH_PATH, k8s, k8s.startup_timeout_s, ready_timeout_s=10
        )
        container["livenessProbe"] = http_probe(vllm.HEALTH_PATH, 30, 30, 5)
    return container, ports


def _capabilities(role: RolePlan, k8s: Kubernetes) -> tuple[list[str], dict[str, str]]:
    """The capabilities the engine's fabric needs and the Pod annotations that attach it."""
    capabilities: list[str] = []
    annotations: dict[str, str] = {}
    if k8s.fabric is not None:
        p = fabrics.profile(k8s.fabric.profile)
        capabilities += p.capabilities
        annotations.update(
            fabric_networks.pod_annotations(
                p, k8s.fabric.networking, k8s.fabric.networks, role.resources.rdma_count or 1
            )
        )
    elif role.resources.rdma_resource:
        # RDMA registers (pins) GPU and host memory: it needs to lock memory.
        capabilities.append("IPC_LOCK")
    return capabilities, annotations


def pod_identity(pod: Obj, k8s: Kubernetes) -> None:
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
    _check_engine_container(plan, role, pod, merged)
    return merged


def _check_engine_container(plan: Plan, role: RolePlan, pod: Obj, merged: Obj) -> None:
    """An override may replace the containers (a list is replaced whole: a stand-in
    engine, a wrapped one), but the first container is still the engine's place: the
    role's Service and probes reach it by its port named ``http``.  Without it the Service
    had no port to target (a KeyError while rendering)."""
    wanted = [p["name"] for p in pod["containers"][0].get("ports") or [] if p["name"] == "http"]
    if not wanted:
        return  # a headless worker: nothing reaches it over HTTP
    containers = merged.get("containers") or []
    first = containers[0] if containers and isinstance(containers[0], dict) else {}
    names = {p.get("name") for p in first.get("ports") or [] if isinstance(p, dict)}
    if "http" not in names:
        who = f"container {first.get('name')!r}" if first else "no container"
        raise UsageError(
            f"recipe {plan.recipe}: kubernetes.pod.overrides (parameter pod_overrides) "
            f"replaces role {role.name}'s containers, and the first, the engine's place, is "
            f"{who} with no port named 'http': the role's Service and its health probes "
            "reach the engine by that port; nothing was written.",
            hint="Give the first container `ports: [{name: http, containerPort: "
            f"{ENGINE_PORT}}}]` (and the engine listening there), or leave containers out of "
            "pod_overrides: a list there replaces servebook's engine container whole.",
        )
