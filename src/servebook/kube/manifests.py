"""Plan -> Kubernetes objects: what `servebook render` writes and the kubernetes backend
applies.  Plain data in, plain dicts out; nothing here touches a cluster.

Each rule answers a failure in the field notes:

* The Namespace is one of the objects (a namespace every manifest referenced and none
  created made the apply fail), but a render writes it apart, under ``namespace/``
  (``manifest_files``): deployments of several recipes may share it, and `kubectl delete
  -f DIR` of one deleted the namespace with every other deployment in it (issue 32).
  ``kubectl apply -f DIR/namespace/`` makes it on a fresh cluster; ``kubectl delete -f
  DIR/`` (which does not descend into folders) removes this deployment's objects and
  nothing else.
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
* A PD recipe's fabric (``kubernetes.fabric``, ``servebook.engines.fabrics``) states the KV
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
* Nothing is rendered that the cluster would refuse later: names the API server or a
  controller refuses (``names.check_names``: a Service name starting with a digit, a
  LeaderWorkerSet whose StatefulSets' revision label would pass 63 characters), an image
  not pinned by a tag or digest (unless ``allow_unpinned_image``), an ``extra_engine_args``
  flag vLLM's own parser does not know (``recipe.engine_flags``).  Every container, the
  router's and the init containers too, requests CPU and memory, and each Deployment's
  ``progressDeadlineSeconds`` is above its Pods' start-up budget (the default 600 s would
  call a long, healthy load failed).
"""

from __future__ import annotations

import copy
import functools
import hashlib
from collections.abc import Iterable
from importlib import resources
from typing import Any

import yaml

from servebook.engines import vllm
from servebook.errors import UsageError
from servebook.kube.engine_pod import (
    PROGRESS_MARGIN_S,
    ROUTER_REQUESTS,
    api_key_env,
    engine_pod,
    http_probe,
    pod_identity,
    serving_probes,
)
from servebook.kube.names import (
    COMPONENT_LABEL,
    DEPLOYMENT_LABEL,
    ENGINE_PORT,
    GENERATOR_KEY,
    LWS_API_VERSION,
    LWS_KIND,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MEMBER_LABEL,
    RECIPE_ANNOTATION,
    ROUTER_METRICS_PORT,
    ROUTER_PORT,
    api_selector_for,
    check_names,
    generator_configmap_name,
    lws_name,
    object_name,
    router_account_name,
    selector_for,
    settings,
)
from servebook.recipe import engine_flags
from servebook.recipe.plan import Plan, RolePlan
from servebook.recipe.schema import Kubernetes

# Namespaces every cluster has: emitting a Namespace object for them would only relabel
# them (and `kubectl delete -f` would try to delete them).
BUILTIN_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
# Where a render writes the Namespace: a folder `kubectl apply/delete -f DIR/` skips, so that
# the teardown of one deployment never deletes a namespace others share.
NAMESPACE_DIR = "namespace"
# What kubectl reads from a directory given to -f.
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
# The router's own identity when it discovers engine Pods (roles with replicas > 1).
ROUTER_DISCOVERY_VERBS = ["get", "list", "watch"]

Obj = dict[str, Any]


def unpinned(image: str) -> str | None:
    """Why an image reference does not pin one image (None: it does): no digest and no
    tag, or the tag ``latest``.  A tag is what follows the last ':' of the last path
    component (a registry's ``host:port/`` is not one)."""
    if "@" in image:
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "it has no version tag or digest"
    if last.rsplit(":", 1)[1] == "latest":
        return "its tag `latest` moves"
    return None


def _check_pinned(plan: Plan, k8s: Kubernetes) -> None:
    if k8s.allow_unpinned_image:
        return
    for role in plan.roles:
        why = unpinned(role.image or "@")
        if why:
            key = "router.image" if role.kind == "router" else "image"
            raise UsageError(
                f"recipe {plan.recipe}: role {role.name}'s image {role.image!r} is not "
                f"pinned: {why}, so two runs of this deployment may run different engines "
                f"and results cannot say which ran; nothing was written. Set {key} to a "
                "version tag (vllm/vllm-openai:v0.11.0) or a digest (IMAGE@sha256:...), or "
                "--set allow_unpinned_image=true (kubernetes.allow_unpinned_image) if a "
                "moving image is meant."
            )


@functools.cache
def _vllm_flags() -> engine_flags.Flags | str:
    return engine_flags.load_flags()


def extra_engine_args(plan: Plan) -> list[str]:
    """What the user gave as ``extra_engine_args`` (the recipes' one ARGS parameter)."""
    value = plan.params.get("extra_engine_args")
    return [str(a) for a in value] if isinstance(value, list) else []


def engine_args_note(plan: Plan) -> str | None:
    """What the check of ``extra_engine_args`` against vLLM's parser found, in words (a
    render says it: a check that did not run never reads as passed); None without
    extra arguments."""
    extra = extra_engine_args(plan)
    if not extra:
        return None
    flags = _vllm_flags()
    if isinstance(flags, str):
        return (
            f"extra_engine_args NOT checked against vLLM's argument parser: {flags}; a "
            "misspelt flag fails only in the engine Pod (install vLLM where you render to "
            "check them)"
        )
    return (
        f"extra_engine_args checked against the argument parser of vLLM {flags.version} "
        "(installed here; the image's vLLM may be another version)"
    )


def _check_engine_args(plan: Plan) -> None:
    extra = extra_engine_args(plan)
    flags = _vllm_flags() if extra else None
    if not isinstance(flags, engine_flags.Flags):
        return
    unknown = engine_flags.unknown_flags(extra, flags.options)
    if unknown:
        listed = "; ".join(
            f"{flag} (did you mean {close}?)" if close else f"{flag} (no flag like it)"
            for flag, close in unknown
        )
        raise UsageError(
            f"{plan.origin}: parameter 'extra_engine_args' gives {len(unknown)} flag(s) vLLM "
            f"{flags.version}'s `vllm serve` does not know: {listed}; nothing was written. "
            "Fix them (`vllm serve --help` lists every flag), or check that the image's vLLM "
            "is the version that has them."
        )


def discovers(plan: Plan) -> bool:
    """The router finds the engines by label: some PD role has more than one copy."""
    return plan.topology == "pd" and any(r.replicas > 1 for r in plan.engine_roles)


def generator_source() -> str:
    """The text of the model generator a Pod runs (servebook/models/tiny.py)."""
    return (resources.files("servebook.models") / "tiny.py").read_text(encoding="utf-8")


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


def _engine_deployment(
    plan: Plan, role: RolePlan, k8s: Kubernetes, name: str, generator_hash: str | None
) -> Obj:
    pod, annotations, _ = engine_pod(plan, role, k8s, name, generator_hash, None)
    dep = _deployment(plan, role, k8s.namespace, pod, name, annotations)
    dep["spec"]["progressDeadlineSeconds"] = k8s.startup_timeout_s + PROGRESS_MARGIN_S
    return dep


def _engine_lws(
    plan: Plan, role: RolePlan, k8s: Kubernetes, name: str, generator_hash: str | None
) -> tuple[Obj, list[Obj]]:
    """A role whose copy spans nodes: one LeaderWorkerSet, a group per replica."""
    leader, leader_ann, ports = engine_pod(plan, role, k8s, name, generator_hash, "leader")
    worker, worker_ann, _ = engine_pod(plan, role, k8s, name, generator_hash, "worker")

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
    container["resources"] = {"requests": dict(ROUTER_REQUESTS)}
    # vllm-router checks no client's key; it sends its own OPENAI_API_KEY to the engines.
    router_env = api_key_env("OPENAI_API_KEY", k8s)
    if router_env:
        container["env"] = router_env
    container |= {
        "ports": ports,
        **serving_probes(
            vllm.ROUTER_LIVENESS_PATH,
            vllm.ROUTER_READINESS_PATH,
            k8s,
            k8s.startup_timeout_s + 60,
            ready_timeout_s=5,
        ),
        "livenessProbe": http_probe(vllm.ROUTER_LIVENESS_PATH, 30, 10, 5),
    }
    pod: Obj = {}
    if k8s.tolerations:
        pod["tolerations"] = k8s.tolerations
    pod_identity(pod, k8s)
    if discovers(plan):
        # Its own account, allowed to watch the namespace's Pods and nothing more.
        pod["serviceAccountName"] = router_account_name(name)
    pod["enableServiceLinks"] = False
    pod["containers"] = [container]
    dep = _deployment(plan, role, k8s.namespace, pod, name)
    # Its startup probe's budget (the engines' plus a minute), and the pull before it.
    dep["spec"]["progressDeadlineSeconds"] = k8s.startup_timeout_s + 60 + PROGRESS_MARGIN_S
    return dep, ports


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
    plan.refuse_unset_on("kubernetes")
    name = name or plan.recipe
    whose = f"recipe name {name!r}" if name == plan.recipe else f"deployment name {name!r}"
    fix = "Shorten the recipe's name." if name == plan.recipe else "Choose another --name."
    k8s = settings(plan)
    _check_pinned(plan, k8s)
    _check_engine_args(plan)
    generates = any(r.pod_models for r in plan.roles)
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
    check_names(objects, name, whose, fix)
    return objects


class _Dumper(yaml.SafeDumper):
    """Safe YAML, with text of several lines (a script in a ConfigMap) as a literal block
    a reader can read."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def manifest_files(plan: Plan, objects: list[Obj]) -> dict[str, str]:
    """File name -> YAML text: the Namespace first, in its own folder (``NAMESPACE_DIR``:
    other deployments may share it, so deleting this render's files must not delete it),
    then one file per role holding its Deployment and Service, numbered so `kubectl apply
    -f DIR` applies them in order."""
    groups: list[tuple[str, list[Obj]]] = []
    for obj in objects:
        name = obj["metadata"]["name"]
        if obj["kind"] == "Namespace":
            groups.append((f"{NAMESPACE_DIR}/namespace", [obj]))
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
        folder, _, base = name.rpartition("/")
        files[f"{folder + '/' if folder else ''}{i * 10:02d}-{base}.yaml"] = header + text
    return files


def owned_files(files: Iterable[str]) -> list[str]:
    """The manifests `kubectl delete -f DIR/` reads: those directly in DIR (it does not
    descend into folders without ``-R``), which hold only the deployment's own objects."""
    return [f for f in files if "/" not in f and f.endswith(MANIFEST_SUFFIXES)]


def apply_command(files: Iterable[str], where: str) -> str:
    """The kubectl command that applies a render in directory ``where``: the namespace
    first when the render has one (a fresh cluster has none), then the rest."""
    files = list(files)
    shared = sorted({f.rpartition("/")[0] for f in files if "/" in f})
    steps = [f"kubectl apply -f {where}/{folder}/" for folder in shared]
    return " && ".join([*steps, f"kubectl apply -f {where}/"])


def teardown_command(where: str) -> str:
    """The kubectl command that removes what a render in ``where`` applied and nothing
    another deployment needs: never the namespace (``NAMESPACE_DIR``)."""
    return f"kubectl delete -f {where}/"
