"""Recipe schema: a typed serving topology for one engine and one model.

A recipe never carries placeholder text.  Anything a user must supply is a declared,
typed *parameter* and is referenced as ``${name}``; rendering refuses while any is
unresolved.  Unknown keys anywhere are errors (``extra="forbid"``), because a misspelt
key that is silently ignored is a deployment that silently does not do what it claims.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


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


class Parameter(_Strict):
    type: ParamType = ParamType.STR
    description: str = Field(min_length=1)
    # How to find the right value on a real cluster or machine (PARAMETERS.md).
    how_to_find: str = ""
    # ``None`` means required: there is no safe default.
    default: Any = None
    choices: list[str] | None = None
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _choices_only_for_choice(self) -> Parameter:
        if self.type is ParamType.CHOICE and not self.choices:
            raise ValueError("a parameter of type 'choice' needs a non-empty 'choices' list")
        if self.type is not ParamType.CHOICE and self.choices:
            raise ValueError("'choices' is only allowed with type: choice")
        return self


class Generate(StrEnum):
    """What servebook can create when a model directory is absent (tiny recipes only)."""

    TINY = "tiny"
    TINY_DRAFT = "tiny-draft"


class Model(_Strict):
    path: str = Field(description="Model directory (or hub id) every role loads by default.")
    served_name: str = Field(min_length=1)
    max_model_len: int | None = Field(default=None, gt=0)
    generate: Generate | None = None


class Speculative(_Strict):
    """Speculative decoding, defined once and applied identically to every role that runs
    the model (field notes, pd-spec: decode-only speculation hangs or crashes)."""

    method: str = Field(min_length=1)
    model: str | None = None
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
    gpu_resource: str = "nvidia.com/gpu"
    rdma_resource: str | None = None


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
    args: list[str] = Field(default_factory=list)


ENGINE_ROLES = {"mixed": ("mixed",), "pd": ("prefill", "decode")}


class Recipe(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = Field(min_length=1)
    engine: Literal["vllm"] = "vllm"
    backends: list[Literal["local", "kubernetes"]] = Field(min_length=1)
    topology: Literal["mixed", "pd"]
    image: str | None = None
    parameters: dict[str, Parameter] = Field(default_factory=dict)
    model: Model
    speculative: Speculative | None = None
    kv_connector: KVConnector | None = None
    roles: dict[str, Role]
    router: Router | None = None

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
        if (
            self.speculative is not None
            and self.speculative.method == "draft_model"
            and (self.speculative.model is None)
        ):
            raise ValueError("speculative method 'draft_model' needs 'model:' (the draft)")
        return self
