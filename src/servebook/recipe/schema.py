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

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator


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
# A Kubernetes quantity such as 16Gi or 512M.
Quantity = Annotated[
    str,
    _matching(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?", "a quantity such as 16Gi"),
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
    cpu: str | None = None
    memory: str | None = None
    gpus: int | str = 0
    gpu_resource: ResourceName = "nvidia.com/gpu"
    # One device of this extended resource (e.g. rdma/ib) per engine Pod; None: none.
    rdma_resource: ResourceName | None = None


class Placement(_Strict):
    node: str | None = None


class Role(_Strict):
    # Per-role overrides: two nodes may keep the same weights at different paths.
    model_path: str | None = None
    draft_path: str | None = None
    engine_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    placement: Placement = Field(default_factory=Placement)


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
