"""Recipe schema: a typed serving topology for one engine and one model.

A recipe never carries placeholder text.  Anything a user must supply is a declared,
typed *parameter* and is referenced as ``${name}``; rendering refuses while any is
unresolved.  Unknown keys anywhere are errors (``extra="forbid"``), because a misspelt
key that is silently ignored is a deployment that silently does not do what it claims.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


class ParamType(StrEnum):
    STR = "str"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    PATH = "path"
    # A Kubernetes node name: it ends up in a nodeSelector/nodeName, so it must be a valid
    # label value (field notes: a literal `<NODE>` was "created" and no Pod ever appeared).
    NODE = "node"
    LABEL = "label"
    CHOICE = "choice"
    # Command-line arguments: a YAML list, or one string split the way a shell splits it
    # (`--set extra_engine_args="--trust-remote-code --max-num-seqs 64"`).  Referenced as
    # a whole element of a list, the arguments are spliced into that list.
    ARGS = "args"
    # Structured Kubernetes settings (tolerations, affinity, Pod spec overrides): YAML
    # from a values file, or YAML/JSON text with --set.  Used as a whole element of a
    # list, a list value is spliced into that list.
    YAML = "yaml"


Backend = Literal["local", "kubernetes"]


class Parameter(_Strict):
    type: ParamType = ParamType.STR
    description: str = Field(min_length=1)
    # How to find the right value on a real cluster or machine (PARAMETERS.md).
    how_to_find: str = ""
    # ``None`` means required: there is no safe default.
    default: Any = None
    # An optional parameter may be left unset (or set to an empty value): it then resolves
    # to none and the key that refers to it (a whole-value reference) is left out, e.g. no
    # RDMA device request, no draft model.  Unset is a stated choice, never a blank.
    optional: bool = False
    # Needed on these backends only (an image, a node): elsewhere it may be left unset, as
    # if optional, and a backend listed here refuses to start (render refuses to write)
    # while it is unset, naming it.  Lets one recipe serve both backends.
    required_on: list[Backend] = Field(default_factory=list)
    choices: list[str] | None = None
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _choices_only_for_choice(self) -> Parameter:
        if self.type is ParamType.CHOICE and not self.choices:
            raise ValueError("a parameter of type 'choice' needs a non-empty 'choices' list")
        if self.type is not ParamType.CHOICE and self.choices:
            raise ValueError("'choices' is only allowed with type: choice")
        if self.required_on and (self.default is not None or self.optional):
            raise ValueError(
                "'required_on' is for a parameter without a default that is needed on some "
                "backends only; it cannot have a default or be optional"
            )
        return self


class Generate(StrEnum):
    """What servebook can create when a model directory is absent (tiny recipes only)."""

    TINY = "tiny"
    TINY_DRAFT = "tiny-draft"


def _matching(regex: str, what: str) -> AfterValidator:
    """A string check whose error says what is expected in words (a regex in an error
    message helps nobody, and a terminal may even eat its brackets)."""
    compiled = re.compile(regex)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"expected {what}")
        return value

    return AfterValidator(check)


# A Kubernetes object name (RFC 1123 label), e.g. a namespace.
DnsLabel = Annotated[
    str,
    _matching(
        r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?",
        "a Kubernetes name: at most 63 lowercase letters, digits and '-', starting and "
        "ending with a letter or digit",
    ),
]
# An extended resource name: `vendor-domain/resource` (nvidia.com/gpu, rdma/ib).
ResourceName = Annotated[
    str,
    _matching(
        r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?",
        "an extended resource name such as nvidia.com/gpu, amd.com/gpu or rdma/ib",
    ),
]
# A Kubernetes quantity such as 16Gi, 512M or 1500m, as the API server parses one
# (k8s.io/apimachinery/pkg/api/resource/quantity.go: a number, then a binary-SI suffix
# Ki..Ei, a decimal-SI one n, u, m, k, M..E, or an exponent e3/E-2); never negative (a
# request or a size below 0 is refused: "must be greater than or equal to 0").
Quantity = Annotated[
    str,
    _matching(
        r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][-+]?[0-9]+)?",
        "a Kubernetes quantity, a number that is not negative with an optional suffix "
        "(2, 1500m, 16Gi, 512M)",
    ),
]
# A node's kubernetes.io/hostname value: it ends up in a node affinity, so a label value.
NodeName = Annotated[
    str,
    _matching(
        r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]",
        "a node name: a Kubernetes label value of at most 63 letters, digits, '-', '_' and "
        "'.', starting and ending with a letter or digit",
    ),
]
# An image reference: no whitespace (anything else is the registry's business).
Image = Annotated[str, _matching(r"\S+", "an image reference without spaces")]

CONTAINER_PATH_HELP = (
    "Kubernetes: the path inside the container where the node directory given as the path "
    "is mounted read-only (hostPath, type Directory); the engine is given this path. Two "
    "nodes may keep the same weights at different paths and still hand the engines the "
    "same path. Unset: the engine is given the path itself (local backend)."
)


class Model(_Strict):
    # None only when every engine role sets its own model_path.
    path: str | None = Field(
        default=None, description="Model directory (or hub id) every role loads by default."
    )
    container_path: str | None = Field(default=None, description=CONTAINER_PATH_HELP)
    served_name: str = Field(min_length=1)
    max_model_len: int | None = Field(default=None, gt=0)
    generate: Generate | None = None


class Speculative(_Strict):
    """Speculative decoding, defined once and applied identically to every role that runs
    the model (field notes, pd-spec: decode-only speculation hangs or crashes)."""

    method: str = Field(min_length=1)
    model: str | None = None
    container_path: str | None = Field(default=None, description=CONTAINER_PATH_HELP)
    num_speculative_tokens: int = Field(gt=0)
    generate: Generate | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class KVConnector(_Strict):
    name: str = Field(min_length=1)
    extra_config: dict[str, Any] = Field(default_factory=dict)


class Resources(_Strict):
    # Kubernetes quantities (the local backend ignores them): checked here, so a value
    # the API server would refuse stops the render naming its parameter.
    cpu: Quantity | None = None
    memory: Quantity | None = None
    gpus: int | str = 0
    gpu_resource: ResourceName = "nvidia.com/gpu"
    # An extended resource (e.g. rdma/ib) each engine Pod requests; None: none.  With
    # kubernetes.fabric the Plan fills it (and the count) from the fabric profile.
    rdma_resource: ResourceName | None = None
    # How many of it (None: one).
    rdma_count: int | None = Field(default=None, ge=1)
    # Kubernetes: with `guaranteed: true` the Pod's CPU and memory limits equal its
    # requests (QoS Guaranteed: evicted last, CPUs pinnable); otherwise only requests are
    # set (Burstable: the engine may use idle CPU and memory beyond them).
    guaranteed: bool = False


class Placement(_Strict):
    node: str | None = None
    # Kubernetes: a role whose Pods run on several nodes (replicas, or a LeaderWorkerSet
    # group spanning nodes) lists them all; each keeps the weights at the role's
    # model_path, and every Pod is pinned to the list, one Pod per node.  A
    # comma-separated string is accepted.
    nodes: list[NodeName] = Field(default_factory=list)

    @field_validator("nodes", mode="before")
    @classmethod
    def split_nodes(cls, value: Any) -> Any:
        return _names(value)

    @model_validator(mode="after")
    def _one_way(self) -> Placement:
        if self.node and self.nodes:
            raise ValueError(
                "give placement.node (one node) or placement.nodes (several), not both"
            )
        return self

    @property
    def all_nodes(self) -> list[str]:
        """Every node the role's Pods may run on, in order (the first is the leader's)."""
        return list(self.nodes) if self.nodes else ([self.node] if self.node else [])


class Role(_Strict):
    # Per-role overrides: two nodes may keep the same weights at different paths.
    model_path: str | None = None
    draft_path: str | None = None
    engine_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    placement: Placement = Field(default_factory=Placement)
    # Kubernetes: copies of the role behind the router (each its own engine, or its own
    # LeaderWorkerSet group); with more than one the router finds them by label.
    replicas: int = Field(default=1, ge=1, le=64)
    # Kubernetes: nodes one copy spans (a LeaderWorkerSet group of this size: a leader
    # that serves the API and headless workers), joined by vLLM's multi-node data
    # parallelism; each node runs data_parallel_per_node engine ranks.
    nodes_per_replica: int = Field(default=1, ge=1, le=64)
    data_parallel_per_node: int = Field(default=1, ge=1, le=64)


class Router(_Strict):
    # vllm-router's PD mode (`--vllm-pd-disaggregation`) routed ExampleConnector
    # deployments on CPU here, so it is the default and only kind for now.
    kind: Literal["vllm-router"] = "vllm-router"
    # Kubernetes: the router's own image (the engine image does not ship vllm-router).
    image: Image | None = None
    args: list[str] = Field(default_factory=list)


AbsPath = Annotated[str, _matching(r"/\S*", "an absolute path such as /kv")]


class KVStorage(_Strict):
    """Kubernetes: the KV connector's shared storage (ExampleConnector's
    ``shared_storage_path``) as a directory of the node both PD engine Pods run on.

    ExampleConnector hands the KV cache over as files: prefill writes them, decode reads
    them, so both Pods must see one directory, which on a cluster means one node (the
    recipe pins both roles to it).  The node directory is scratch, not weights: it is
    ``host_path/DEPLOYMENT`` (one per deployment), created when absent
    (``DirectoryOrCreate``), emptied when the prefill Pod starts, and mounted read-write
    at ``container_path``, which the engines are given instead of the local path."""

    host_path: AbsPath
    container_path: AbsPath = "/kv"


def _names(value: Any) -> Any:
    """A list of names given as one comma- or space-separated string (a parameter), or
    unset (None: none)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [n for n in re.split(r"[,\s]+", value) if n]
    return value


def _none_is_empty(value: Any) -> Any:
    return {} if value is None else value


FabricProfile = Literal["ib-shared", "ib-sriov", "roce", "efa", "tcp"]


class Fabric(_Strict):
    """Kubernetes, PD: the network the KV cache crosses from prefill to decode, as one
    profile of ``servebook.engines.fabrics`` (device resources and counts, network
    annotations, transport environment, capabilities, the connector's backend).  Stated,
    never implied: without it NIXL silently moves KV over TCP."""

    profile: FabricProfile
    # The device plugin's resource name when it differs from the profile's default (the
    # SR-IOV plugin's name is the cluster's own: required there).
    resource: ResourceName | None = None
    # Devices per engine Pod when not the profile's (one per GPU, or one shared).
    devices: int | None = Field(default=None, ge=1)
    # Secondary networks to attach: Multus NetworkAttachmentDefinition names, or GKE
    # network names (networking: gke).  A comma-separated string is accepted.
    networks: list[DnsLabel] = Field(default_factory=list)
    networking: Literal["multus", "gke"] = "multus"
    # UCX_NET_DEVICES (e.g. mlx5_0:1,mlx5_1:1): which HCAs UCX may use.
    net_devices: str | None = None
    # PD over TCP is far slower; it renders only when acknowledged.
    allow_tcp: bool = False

    @field_validator("networks", mode="before")
    @classmethod
    def split_networks(cls, value: Any) -> Any:
        return _names(value)


class CompileCache(_Strict):
    """Kubernetes: a node directory that keeps vLLM's compiled kernels (VLLM_CACHE_ROOT:
    torch.compile artifacts under torch_compile_cache/, Triton kernels under TRITON_CACHE_DIR)
    across Pod restarts, so a restart does not recompile.  Scratch, not weights:
    ``host_path/DEPLOYMENT-ROLE``, created when absent."""

    host_path: AbsPath
    container_path: AbsPath = "/cache"


# A Kubernetes Secret's name (RFC 1123 subdomain) and a key of its data.
SecretName = Annotated[
    str,
    _matching(
        r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?",
        "a Secret's name: lowercase letters, digits, '-' and '.', starting and ending with "
        "a letter or digit",
    ),
]
SecretKey = Annotated[
    str,
    _matching(r"[-._A-Za-z0-9]{1,253}", "a key of a Secret's data: letters, digits, '-', '_', '.'"),
]


class SecretRef(_Strict):
    """Kubernetes: one key of an existing Secret in the deployment's namespace, given as
    ``NAME`` (key ``api-key``) or ``NAME/KEY``.  Only the reference is rendered
    (``valueFrom.secretKeyRef``), never the value."""

    name: SecretName
    key: SecretKey = "api-key"

    @model_validator(mode="before")
    @classmethod
    def name_or_name_key(cls, value: Any) -> Any:
        if isinstance(value, str):
            name, _, key = value.partition("/")
            return {"name": name, "key": key} if key else {"name": name}
        return value


class PodSettings(_Strict):
    """Kubernetes: Pod settings of the engine (and router) Pods that admission, scheduling
    and QoS need, and a schema-checked ``overrides`` for the long tail."""

    image_pull_secrets: list[DnsLabel] = Field(default_factory=list)
    service_account: DnsLabel | None = None
    priority_class: str | None = Field(default=None, min_length=1)
    # Added to the Pod's affinity as written (node, Pod and anti-affinity terms).
    affinity: dict[str, Any] = Field(default_factory=dict)
    # vLLM's own drain on SIGTERM (--shutdown-timeout, vLLM >= 0.18): in-flight requests
    # get this long to finish; the Pod's termination grace is this plus a margin.  None:
    # vLLM aborts in-flight requests on SIGTERM, Kubernetes' default grace (30 s) applies.
    drain_timeout_s: int | None = Field(default=None, ge=1, le=86400)
    # Merged into every engine Pod spec last (a mapping merges key by key, anything else
    # replaces); the result is checked against the Pod schema before anything is written.
    overrides: dict[str, Any] = Field(default_factory=dict)

    @field_validator("image_pull_secrets", mode="before")
    @classmethod
    def split_secrets(cls, value: Any) -> Any:
        return _names(value)

    @field_validator("affinity", "overrides", mode="before")
    @classmethod
    def unset_is_empty(cls, value: Any) -> Any:
        return _none_is_empty(value)


class Kubernetes(_Strict):
    """Settings only the kubernetes backend reads (render, up); the local backend ignores
    them."""

    # Every object goes here, and the render emits the Namespace itself (field notes: a
    # namespace referenced by every manifest and created by none).
    namespace: DnsLabel = "servebook"
    # Budget for the engine to load weights and answer /health before Kubernetes restarts
    # it: field notes saw ~8 min normal loads and 10-14 min deploys; a budget shorter than
    # the load is an endless restart loop that looks like a crash.
    startup_timeout_s: int = Field(default=1800, ge=60, le=86400)
    # How often the kubelet asks a serving role's /health while it starts and then for
    # readiness: a role is Ready up to two periods after it first answers (the startup
    # probe's tick, then the readiness probe's).  10 s suits a load of minutes; an engine
    # that starts in seconds (the tiny recipes) takes 2.
    probe_period_s: int = Field(default=10, ge=1, le=60)
    # /dev/shm for NCCL and the engine's worker processes (the container default is 64Mi).
    shm_size: Quantity = "16Gi"
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    # Where the engine Pods get the model.  `node`: model.path (and the draft) are node
    # directories mounted at model.container_path (or hub ids, when that is unset).
    # `generate`: each engine Pod makes the model itself: an init container of the engine
    # image runs servebook's own generator (model.generate, and speculative.generate for
    # the draft), shipped in a ConfigMap, into an emptyDir the engine mounts read-only at
    # /models.  Nothing is downloaded but the image and nothing is read from the nodes;
    # the generator is deterministic, so every Pod of one image makes the same bytes.
    model_source: Literal["node", "generate"] = "node"
    kv_storage: KVStorage | None = None
    fabric: Fabric | None = None
    # A node directory (or {host_path, container_path}); None: compiled kernels live and
    # die with the container.
    compile_cache: CompileCache | None = None
    pod: PodSettings = Field(default_factory=PodSettings)
    # The engines' API key: every engine container gets VLLM_API_KEY and the router
    # OPENAI_API_KEY from this Secret's key (secretKeyRef); None: no key.
    api_key_secret: SecretRef | None = None
    # An image without a version tag or digest (or tagged `latest`) is refused unless this
    # says a moving image is meant: results record the image as provenance, and a tag
    # that moves makes two runs of one recipe run different engines.
    allow_unpinned_image: bool = False

    @field_validator("compile_cache", mode="before")
    @classmethod
    def cache_dir_only(cls, value: Any) -> Any:
        return {"host_path": value} if isinstance(value, str) else value


ENGINE_ROLES = {"mixed": ("mixed",), "pd": ("prefill", "decode")}


class Recipe(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = Field(min_length=1)
    engine: Literal["vllm"] = "vllm"
    backends: list[Literal["local", "kubernetes"]] = Field(min_length=1)
    topology: Literal["mixed", "pd"]
    image: Image | None = None
    parameters: dict[str, Parameter] = Field(default_factory=dict)
    model: Model
    speculative: Speculative | None = None
    kv_connector: KVConnector | None = None
    roles: dict[str, Role]
    router: Router | None = None
    kubernetes: Kubernetes | None = None
    # The engines refuse requests without a bearer key.  Local: the key comes from
    # servebook's environment (OPENAI_API_KEY, else VLLM_API_KEY) and reaches the engines
    # as VLLM_API_KEY in theirs, never on a command line; up refuses to start without one.
    require_api_key: bool = False

    @model_validator(mode="after")
    def _topology_shape(self) -> Recipe:
        expected = set(ENGINE_ROLES[self.topology])
        got = set(self.roles)
        if got != expected:
            raise ValueError(
                f"topology '{self.topology}' needs exactly the roles {sorted(expected)} "
                f"under 'roles:', got {sorted(got)}"
            )
        if self.topology == "pd":
            if self.kv_connector is None:
                raise ValueError(
                    "topology 'pd' needs 'kv_connector:' (the decode role gets its KV "
                    "cache from the prefill role through it)"
                )
            if self.router is None:
                raise ValueError("topology 'pd' needs 'router:' (the entry point)")
        elif self.kv_connector is not None:
            raise ValueError("'kv_connector:' is only meaningful with topology 'pd'")
        if self.model.path is None:
            lacking = [n for n, r in self.roles.items() if r.model_path is None]
            if lacking:
                raise ValueError(
                    f"model.path is unset and roles {', '.join(sorted(lacking))} set no "
                    "model_path: say which model each engine loads"
                )
        # Whether the speculative method needs a draft is checked per role when the Plan
        # is built (roles may each name their own draft directory).
        k8s = self.kubernetes
        if k8s is not None and k8s.model_source == "generate":
            if self.model.generate is None:
                raise ValueError(
                    "kubernetes.model_source 'generate' needs model.generate (what to make)"
                )
            spec_mount = self.speculative.container_path if self.speculative else None
            if self.model.container_path is not None or spec_mount is not None:
                raise ValueError(
                    "kubernetes.model_source 'generate' makes the model in the Pod, so no "
                    "node directory is mounted: leave container_path unset"
                )
            if self.speculative is not None and (
                self.speculative.model is not None and self.speculative.generate is None
            ):
                raise ValueError(
                    "kubernetes.model_source 'generate' with a draft model needs "
                    "speculative.generate (the draft is made in the Pod too)"
                )
        if k8s is not None and k8s.fabric is not None and self.topology != "pd":
            raise ValueError(
                "kubernetes.fabric is the network PD's KV cache crosses; topology "
                f"'{self.topology}' hands no KV over. Remove it."
            )
        if k8s is not None and k8s.kv_storage is not None:
            path = (self.kv_connector.extra_config if self.kv_connector else {}).get(
                "shared_storage_path"
            )
            if path is None:
                raise ValueError(
                    "kubernetes.kv_storage replaces the KV connector's shared_storage_path "
                    "(ExampleConnector); this recipe's kv_connector.extra_config has none"
                )
        return self
