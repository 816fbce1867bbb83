"""Plan: a resolved, validated topology.  Backends consume only Plans.

Each role carries its exact engine arguments (without host and port, which the backend
chooses), environment, resources and placement.  A Plan is plain data, so a test can
break one on purpose (e.g. speculation on one PD role only) and hand it to a backend.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, Field

from servebook.engines import fabrics, vllm
from servebook.errors import UsageError
from servebook.recipe.schema import (
    ENGINE_ROLES,
    Generate,
    Kubernetes,
    Placement,
    Recipe,
    Resources,
    Role,
)

# kubernetes.model_source 'generate': where each engine Pod makes its models (an emptyDir
# mounted here, read-only in the engine container) and the directories the engine is given.
POD_MODELS_MOUNT = "/models"
POD_MODEL_DIR = f"{POD_MODELS_MOUNT}/model"
POD_DRAFT_DIR = f"{POD_MODELS_MOUNT}/draft"


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class _Role(_Named, Protocol):
    @property
    def kind(self) -> str: ...


N = TypeVar("N", bound=_Named)
R = TypeVar("R", bound=_Role)


def role_named(roles: Iterable[N], name: str) -> N:
    """The role called ``name`` among a Plan's roles or a view of them (KeyError: none)."""
    for r in roles:
        if r.name == name:
            return r
    raise KeyError(name)


def engines_of(roles: Iterable[R]) -> list[R]:
    """The roles that run an engine (not the router), in order."""
    return [r for r in roles if r.kind == "engine"]


class RecipeValueError(UsageError):
    """A resolved recipe value that cannot work, at the given recipe keys.  ``resolve``
    adds which parameter set each key, so the message names what the user typed."""

    def __init__(self, message: str, keys: list[str]) -> None:
        super().__init__(message)
        self.keys = keys


class RolePlan(BaseModel):
    name: str
    kind: Literal["engine", "router"]
    # Where the weights are on the machine that runs the role (the node, on kubernetes).
    model_path: str | None = None
    draft_path: str | None = None
    # Kubernetes: where model_path/draft_path are mounted in the container (the engine is
    # given these paths); None: not mounted, the engine is given the path itself.
    model_container_path: str | None = None
    draft_container_path: str | None = None
    image: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    placement: Placement = Field(default_factory=Placement)
    # Kubernetes: copies of the role, and nodes per copy (more than one: a
    # LeaderWorkerSet group whose leader serves the API and whose workers are headless).
    replicas: int = 1
    nodes_per_replica: int = 1
    # Kubernetes only (the local backend reads args): the engine's arguments where they
    # differ on a cluster (a model made in the Pod, KV storage mounted from the node);
    # None: the same as args.
    kube_args: list[str] | None = None
    # Kubernetes only: directories the Pod makes before the engine starts (container path
    # -> generator), with kubernetes.model_source 'generate'.
    pod_models: dict[str, Generate] = Field(default_factory=dict)

    @property
    def spans_nodes(self) -> bool:
        """One copy of the engine runs on several nodes (a LeaderWorkerSet group)."""
        return self.nodes_per_replica > 1

    @property
    def pods(self) -> int:
        """Every Pod of the role: replicas times nodes per replica."""
        return self.replicas * self.nodes_per_replica

    @property
    def cluster_args(self) -> list[str]:
        """The engine's arguments on Kubernetes."""
        return self.args if self.kube_args is None else self.kube_args


class Plan(BaseModel):
    recipe: str
    origin: str
    engine: str
    backends: list[str] = Field(default_factory=lambda: ["local"])
    topology: Literal["mixed", "pd"]
    served_model_name: str
    image: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    # Where each parameter's value came from: "the recipe's default", "values file F",
    # "--set NAME", "unset (optional)".
    param_origins: dict[str, str] = Field(default_factory=dict)
    roles: list[RolePlan]
    # Model directories servebook may create when absent: path -> generator.
    generate: dict[str, Generate] = Field(default_factory=dict)
    # Directories of the KV connector's storage that `down` removes (local backend).
    kv_storage: list[str] = Field(default_factory=list)
    speculative: dict[str, Any] | None = None
    kubernetes: Kubernetes | None = None
    # Backend -> one line per parameter that backend requires (`required_on`) and that is
    # unset; that backend refuses to start (render refuses to write) while any is listed.
    unresolved_on: dict[str, list[str]] = Field(default_factory=dict)
    # The recipe's require_api_key: engines start protected by a key (never in the Plan).
    require_api_key: bool = False

    def role(self, name: str) -> RolePlan:
        return role_named(self.roles, name)

    def refuse_unset_on(self, backend: str) -> None:
        """Refuses (exit 2, nothing rendered or started) while a parameter ``backend``
        needs is unset (``unresolved_on``), naming each and how to set it."""
        missing = self.unresolved_on.get(backend)
        if missing:
            raise UsageError(
                f"{self.origin}: {len(missing)} parameter(s) the {backend} backend needs are "
                "unset; nothing was rendered or started:\n" + "\n".join(missing)
            )

    @property
    def engine_roles(self) -> list[RolePlan]:
        return engines_of(self.roles)

    @property
    def entry_role(self) -> str:
        return "router" if self.topology == "pd" else "mixed"

    def command_lines(
        self, python: str = "python", host: str = "127.0.0.1"
    ) -> dict[str, list[str]]:
        """Each role's full command line, with illustrative ports (8100, 8101, ...)."""
        ports = {r.name: 8100 + i for i, r in enumerate(self.roles)}
        lines: dict[str, list[str]] = {}
        for r in self.roles:
            if r.kind == "engine":
                lines[r.name] = vllm.server_argv(python, r.args, host, ports[r.name])
            else:
                lines[r.name] = vllm.router_argv(
                    "vllm-router",
                    prefill_url=f"http://{host}:{ports['prefill']}",
                    decode_url=f"http://{host}:{ports['decode']}",
                    host=host,
                    port=ports[r.name],
                    extra=r.args,
                )
        return lines


def _check_engine_args(origin: str, role: str, args: list[str]) -> None:
    key = f"roles.{role}.engine_args"
    reserved = vllm.reserved_flags(args)
    if reserved:
        written, where = reserved[0]
        raise RecipeValueError(
            f"{origin}: {key} sets {written}, which servebook sets from {where}. Remove it "
            "from engine_args and set it there (defined once, applied identically to every "
            "role).",
            [key],
        )
    dups = vllm.duplicate_flags(args)
    if dups:
        raise RecipeValueError(
            f"{origin}: {key} gives {', '.join(dups)} more than once; the engine would "
            "silently keep one. Keep a single occurrence.",
            [key],
        )


DP_FLAGS = (
    "--data-parallel-size",
    "-dp",
    "--data-parallel-size-local",
    "-dpl",
    "--data-parallel-address",
    "-dpa",
    "--data-parallel-rpc-port",
    "-dpp",
    "--data-parallel-start-rank",
    "-dpr",
    "--headless",
)


def _role_extra(recipe: Recipe, name: str) -> list[str]:
    """The role's own engine arguments plus the data-parallel sizes its shape implies
    (identical on every member of a group; the render adds each member's address, rank
    and --headless)."""
    role = recipe.roles[name]
    k, local = role.nodes_per_replica, role.data_parallel_per_node
    if k * local == 1:
        return list(role.engine_args)
    dp = ["--data-parallel-size", str(k * local)]
    if k > 1:
        dp += ["--data-parallel-size-local", str(local)]
    return [*role.engine_args, *dp]


def _check_shape(origin: str, recipe: Recipe, name: str) -> None:
    """A role on several Pods: Kubernetes only, its data-parallel flags given once, and
    node-local weights on exactly one listed node per Pod."""
    role = recipe.roles[name]
    k, r = role.nodes_per_replica, role.replicas
    key = f"roles.{name}"
    if k * role.data_parallel_per_node > 1:
        given = [a.split("=", 1)[0] for a in role.engine_args if a.split("=", 1)[0] in DP_FLAGS]
        if given:
            raise RecipeValueError(
                f"{origin}: {key}.engine_args sets {given[0]}, which servebook sets from "
                f"{key}.nodes_per_replica and data_parallel_per_node (the same on every "
                "member of a group, plus each member's address, rank and --headless). Remove "
                "it from engine_args.",
                [f"{key}.engine_args", f"{key}.nodes_per_replica"],
            )
    if k * r == 1:
        return
    if "local" in recipe.backends:
        raise RecipeValueError(
            f"{origin}: {key} runs {k * r} Pods (replicas {r} x nodes_per_replica {k}), which "
            "only the kubernetes backend can place; this recipe also lists the local backend. "
            "Keep one replica on one node, or make the recipe kubernetes-only.",
            [f"{key}.replicas", f"{key}.nodes_per_replica"],
        )
    k8s = recipe.kubernetes
    if k > 1 and k8s is not None and k8s.kv_storage is not None:
        raise RecipeValueError(
            f"{origin}: kubernetes.kv_storage is one node's directory, and {key} spans "
            f"{k} nodes. Use a network KV connector (NixlConnector) for a role on several "
            "nodes.",
            [f"{key}.nodes_per_replica"],
        )
    node_local = recipe.model.container_path is not None and (
        k8s is None or k8s.model_source != "generate"
    )
    nodes = role.placement.all_nodes
    if node_local and len(nodes) != k * r:
        raise RecipeValueError(
            f"{origin}: {key} runs {k * r} Pods (replicas {r} x nodes_per_replica {k}), each "
            f"mounting the weights from its node, but {key}.placement lists {len(nodes)} "
            f"node(s) ({', '.join(nodes) or 'none'}). List exactly one node per Pod, each "
            "with the weights at the same path: every Pod is pinned to the list, one per "
            "node, so none lands where the directory is empty.",
            [f"{key}.placement.nodes", f"{key}.replicas", f"{key}.nodes_per_replica"],
        )
    if len(set(nodes)) != len(nodes):
        raise RecipeValueError(
            f"{origin}: {key}.placement.nodes names a node twice ({', '.join(nodes)}); each "
            "Pod needs a node of its own (each takes the node's GPUs).",
            [f"{key}.placement.nodes"],
        )


def _mounted(origin: str, path: str, key: str, container_path: str, what: str) -> None:
    """A directory mounted from the node must be an absolute node path, mounted at an
    absolute container path."""
    if not container_path.startswith("/"):
        raise RecipeValueError(
            f"{origin}: the {what}'s container_path {container_path!r} is not an absolute "
            "path; use one such as /models/model.",
            ["model.container_path" if what == "model" else "speculative.container_path"],
        )
    if not path.startswith("/") or "/../" in f"{path}/":
        raise RecipeValueError(
            f"{origin}: {key} = {path!r} is mounted from the node at {container_path} "
            f"(the {what}), so it must be an absolute directory on the node, e.g. "
            "/data/models/NAME. `servebook probe --find /` on the node lists candidates.",
            [key],
        )


def _draft(
    origin: str, recipe: Recipe, name: str, role_draft: str | None
) -> tuple[str | None, str]:
    """The role's draft directory (None: no draft) and the recipe key it came from."""
    spec = recipe.speculative
    assert spec is not None
    keys = [f"roles.{name}.draft_path", "speculative.model"]
    key = keys[0] if role_draft else keys[1]
    draft = role_draft or spec.model
    if spec.method in vllm.NO_DRAFT_METHODS and draft is not None:
        raise RecipeValueError(
            f"{origin}: speculative method '{spec.method}' uses no draft model, but {key} = "
            f"{draft!r} names one. Leave the draft unset, or choose a method that loads a "
            f"draft ({', '.join(sorted(vllm.DRAFT_METHODS))}).",
            [key, "speculative.method"],
        )
    if spec.method in vllm.DRAFT_METHODS and draft is None:
        raise RecipeValueError(
            f"{origin}: speculative method '{spec.method}' loads a draft model, but role "
            f"{name} has none (neither {keys[0]} nor {keys[1]} is set). Set the draft "
            "directory, or choose a method that needs none "
            f"({', '.join(sorted(vllm.NO_DRAFT_METHODS))}).",
            [*keys, "speculative.method"],
        )
    return draft, key


def _kube_variant(
    recipe: Recipe, name: str, draft_path: str | None, args: list[str]
) -> tuple[list[str] | None, dict[str, Generate]]:
    """A role's engine arguments on Kubernetes when they differ from ``args`` (None when
    not), and the model directories its Pod makes (container path -> generator).

    Built from the same recipe in the same way as ``args``; only the paths differ: the
    model (and draft) the Pod made under POD_MODELS_MOUNT, and the KV connector's
    storage mounted from the node.  So the local command lines never change with the
    ``kubernetes:`` section, and both roles' configs stay identical on a cluster too."""
    k8s = recipe.kubernetes
    if k8s is None or (
        k8s.model_source != "generate" and k8s.kv_storage is None and k8s.fabric is None
    ):
        return None, {}
    role = recipe.roles[name]
    spec = recipe.speculative
    pod_models: dict[str, Generate] = {}
    model_path = role.model_path or recipe.model.path
    assert model_path is not None
    model = recipe.model.container_path or model_path
    # No draft directory: no draft (mtp, ngram), whatever container_path says.
    draft = (spec.container_path or draft_path) if spec is not None and draft_path else None
    if k8s.model_source == "generate":
        assert recipe.model.generate is not None  # the schema requires it
        model = POD_MODEL_DIR
        pod_models[POD_MODEL_DIR] = recipe.model.generate
        if spec is not None and draft_path is not None:
            assert spec.generate is not None  # the schema requires it
            draft = POD_DRAFT_DIR
            pod_models[POD_DRAFT_DIR] = spec.generate
    spec_cfg = None
    if spec is not None:
        spec_cfg = vllm.speculative_config(
            spec.method, spec.num_speculative_tokens, draft, spec.extra
        )
    kv_cfg = None
    if recipe.kv_connector is not None:
        extra = dict(recipe.kv_connector.extra_config)
        if k8s.kv_storage is not None:
            extra[vllm.KV_STORAGE_KEY] = k8s.kv_storage.container_path
        buffer_device = None
        if k8s.fabric is not None:
            told = fabrics.connector_config(
                fabrics.profile(k8s.fabric.profile), recipe.kv_connector.name
            )
            extra.update(told or {})
            buffer_device = fabrics.KV_BUFFER_DEVICE
        kv_cfg = vllm.kv_transfer_config(
            recipe.kv_connector.name, extra, buffer_device=buffer_device
        )
    kube_args = vllm.engine_args(
        model_path=model,
        served_name=recipe.model.served_name,
        max_model_len=recipe.model.max_model_len,
        speculative=spec_cfg,
        kv_transfer=kv_cfg,
        extra=_role_extra(recipe, name),
    )
    return (None if kube_args == args else kube_args), pod_models


def _fabric_resources(origin: str, recipe: Recipe, name: str) -> Resources:
    """A PD role's resources with the fabric's device resource and count filled in, after
    checking the fabric can work with this recipe (each refusal names its keys, so the
    message names the parameters the user typed)."""
    role = recipe.roles[name]
    k8s = recipe.kubernetes
    fabric = k8s.fabric if k8s is not None else None
    if fabric is None:
        return role.resources
    p = fabrics.profile(fabric.profile)
    if p.transport == "tcp" and not fabric.allow_tcp:
        raise RecipeValueError(
            f"{origin}: the KV cache would cross from prefill to decode over TCP "
            f"(fabric '{p.name}'): GPU memory staged through the host, TTFT up to hundreds "
            "of times worse than over RDMA (NVIDIA Dynamo's disaggregation guide measured "
            "~98 s). Choose the cluster's RDMA fabric, or acknowledge TCP explicitly.",
            ["kubernetes.fabric.allow_tcp", "kubernetes.fabric.profile"],
        )
    assert recipe.kv_connector is not None  # the schema allows a fabric with PD only
    connector = recipe.kv_connector.name
    if fabrics.connector_config(p, connector) is None:
        raise RecipeValueError(
            f"{origin}: fabric '{p.name}' cannot be given to the KV connector {connector}: "
            f"servebook tells NIXL connectors ({', '.join(sorted(fabrics.NIXL_CONNECTORS))}) "
            "which backend to use, and MooncakeConnector which protocol (rdma or tcp; "
            "not efa). Choose another fabric or connector.",
            ["kubernetes.fabric.profile", "kv_connector.name"],
        )
    if role.resources.rdma_resource is not None:
        raise RecipeValueError(
            f"{origin}: roles.{name}.resources.rdma_resource is set beside "
            "kubernetes.fabric; the fabric requests the devices. Set the resource once, "
            "as kubernetes.fabric.resource.",
            [f"roles.{name}.resources.rdma_resource"],
        )
    resource = fabric.resource or p.default_resource
    if p.resource_required and resource is None:
        raise RecipeValueError(
            f"{origin}: fabric '{p.name}' requests one device per GPU of the SR-IOV device "
            "plugin, whose resource name is the cluster's own (its config's "
            "resourcePrefix/resourceName); it is not set. `kubectl get node NODE -o "
            "jsonpath='{.status.allocatable}'` lists it.",
            ["kubernetes.fabric.resource", "kubernetes.fabric.profile"],
        )
    wants_networks = p.networks == "multus" or (
        p.networks == "multus-or-gke" and fabric.networking == "gke"
    )
    if wants_networks and not fabric.networks:
        raise RecipeValueError(
            f"{origin}: fabric '{p.name}' ({fabric.networking}) attaches the RDMA "
            "interfaces as secondary networks, and none is named: without them the Pod "
            "gets the devices but no RDMA interface and NIXL falls back to TCP. "
            "`kubectl get network-attachment-definitions -A` (Multus) or `kubectl get "
            "networks` (GKE) lists them.",
            ["kubernetes.fabric.networks", "kubernetes.fabric.profile"],
        )
    if p.networks == "none" and fabric.networks:
        raise RecipeValueError(
            f"{origin}: fabric '{p.name}' attaches no secondary network, but networks "
            f"{fabric.networks} are named. Leave them unset, or choose ib-sriov or roce.",
            ["kubernetes.fabric.networks", "kubernetes.fabric.profile"],
        )
    if resource is None:
        return role.resources
    try:
        gpus = int(role.resources.gpus)
    except ValueError:
        gpus = 1
    count = fabrics.device_count(p, gpus, fabric.devices)
    return role.resources.model_copy(update={"rdma_resource": resource, "rdma_count": count})


def _role_speculative(
    origin: str,
    recipe: Recipe,
    name: str,
    role_draft: str | None,
    model_container: str | None,
    generate: dict[str, Generate],
) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """A role's speculative config (None without speculative decoding), its draft's node
    path and container path; a draft to generate is added to ``generate``."""
    spec = recipe.speculative
    if spec is None:
        return None, None, None
    draft_container = None
    draft_path, draft_key = _draft(origin, recipe, name, role_draft)
    if draft_path is not None and spec.container_path is not None:
        draft_container = spec.container_path
        _mounted(origin, draft_path, draft_key, draft_container, "draft model")
        if draft_container == model_container:
            raise RecipeValueError(
                f"{origin}: the model and the draft are both mounted at "
                f"{draft_container}; give speculative.container_path its own path.",
                ["speculative.container_path"],
            )
    # The engine is given the container path when there is one, so PD roles whose
    # nodes keep the draft at different paths still get byte-identical configs.
    spec_cfg = vllm.speculative_config(
        spec.method, spec.num_speculative_tokens, draft_container or draft_path, spec.extra
    )
    if spec.generate is not None and draft_path is not None:
        generate[draft_path] = spec.generate
    return spec_cfg, draft_path, draft_container


def _kv_transfer(recipe: Recipe, kv_storage: list[str]) -> dict[str, Any] | None:
    """The KV connector's transfer config (None without one); its storage path, when it
    has one, is added to ``kv_storage``."""
    if recipe.kv_connector is None:
        return None
    kv_cfg = vllm.kv_transfer_config(recipe.kv_connector.name, recipe.kv_connector.extra_config)
    path = recipe.kv_connector.extra_config.get(vllm.KV_STORAGE_KEY)
    if isinstance(path, str) and path not in kv_storage:
        kv_storage.append(path)
    return kv_cfg


def _check_gpus(origin: str, name: str, role: Role, args: list[str]) -> None:
    """A role's Pod must request at least the GPU workers its engine arguments start."""
    gpus = role.resources.gpus
    # A group's Pod runs its node's share of the data-parallel ranks.
    per_pod = vllm.parallel_size(args) // role.nodes_per_replica
    if isinstance(gpus, int) and gpus > 0 and per_pod > gpus:
        raise RecipeValueError(
            f"{origin}: role {name} runs {per_pod} GPU workers per Pod "
            f"(tensor x pipeline x data parallel sizes in its engine arguments, the "
            f"data-parallel ranks over {role.nodes_per_replica} node(s)) but "
            f"requests {gpus} GPU(s); the engine would fail to start. Make the parallel "
            "sizes multiply to at most the GPU count.",
            [f"roles.{name}.engine_args", f"roles.{name}.resources.gpus"],
        )


def build_plan(recipe: Recipe, params: dict[str, Any], *, origin: str) -> Plan:
    """Turn a fully substituted recipe into a Plan."""
    roles: list[RolePlan] = []
    generate: dict[str, Generate] = {}
    kv_storage: list[str] = []
    plan_spec: dict[str, Any] | None = None
    for name in ENGINE_ROLES[recipe.topology]:
        role = recipe.roles[name]
        _check_engine_args(origin, name, role.engine_args)
        _check_shape(origin, recipe, name)
        model_key = f"roles.{name}.model_path" if role.model_path else "model.path"
        model_path = role.model_path or recipe.model.path
        assert model_path is not None  # the schema requires one or the other
        model_container = recipe.model.container_path
        if model_container is not None:
            _mounted(origin, model_path, model_key, model_container, "model")
        if recipe.model.generate is not None:
            generate[model_path] = recipe.model.generate
        spec_cfg, draft_path, draft_container = _role_speculative(
            origin, recipe, name, role.draft_path, model_container, generate
        )
        if spec_cfg is not None:
            # Identical on every role except for where each node keeps the draft.
            plan_spec = {k: v for k, v in spec_cfg.items() if k != "model"}
        kv_cfg = _kv_transfer(recipe, kv_storage)
        args = vllm.engine_args(
            model_path=model_container or model_path,
            served_name=recipe.model.served_name,
            max_model_len=recipe.model.max_model_len,
            speculative=spec_cfg,
            kv_transfer=kv_cfg,
            extra=_role_extra(recipe, name),
        )
        kube_args, pod_models = _kube_variant(recipe, name, draft_path, args)
        _check_gpus(origin, name, role, args)
        roles.append(
            RolePlan(
                name=name,
                kind="engine",
                model_path=model_path,
                draft_path=draft_path,
                model_container_path=model_container,
                draft_container_path=draft_container,
                image=recipe.image,
                args=args,
                env=dict(role.env),
                resources=_fabric_resources(origin, recipe, name),
                placement=role.placement,
                replicas=role.replicas,
                nodes_per_replica=role.nodes_per_replica,
                kube_args=kube_args,
                pod_models=pod_models,
            )
        )
    if recipe.router is not None:
        roles.append(
            RolePlan(
                name="router",
                kind="router",
                image=recipe.router.image,
                args=list(recipe.router.args),
            )
        )
    return Plan(
        recipe=recipe.name,
        origin=origin,
        engine=recipe.engine,
        backends=list(recipe.backends),
        topology=recipe.topology,
        served_model_name=recipe.model.served_name,
        image=recipe.image,
        params=params,
        roles=roles,
        generate=generate,
        kv_storage=kv_storage,
        speculative=plan_spec,
        kubernetes=recipe.kubernetes,
        require_api_key=recipe.require_api_key,
    )
