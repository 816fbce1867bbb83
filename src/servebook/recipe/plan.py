"""Plan: a resolved, validated topology.  Backends consume only Plans.

Each role carries its exact engine arguments (without host and port, which the backend
chooses), environment, resources and placement.  A Plan is plain data, so a test can
break one on purpose (e.g. speculation on one PD role only) and hand it to a backend.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from servebook.engines import vllm
from servebook.findings import UsageError
from servebook.recipe.schema import ENGINE_ROLES, Generate, Placement, Recipe, Resources


class RolePlan(BaseModel):
    name: str
    kind: Literal["engine", "router"]
    model_path: str | None = None
    draft_path: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    placement: Placement = Field(default_factory=Placement)


class Plan(BaseModel):
    recipe: str
    origin: str
    engine: str
    backends: list[str] = Field(default_factory=lambda: ["local"])
    topology: Literal["mixed", "pd"]
    served_model_name: str
    image: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    roles: list[RolePlan]
    # Model directories servebook may create when absent: path -> generator.
    generate: dict[str, Generate] = Field(default_factory=dict)
    # Directories of the KV connector's storage that `down` removes (local backend).
    kv_storage: list[str] = Field(default_factory=list)
    speculative: dict[str, Any] | None = None

    def role(self, name: str) -> RolePlan:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)

    @property
    def engine_roles(self) -> list[RolePlan]:
        return [r for r in self.roles if r.kind == "engine"]

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
    for a in args:
        name = vllm.flag_name(a)
        if name in vllm.RESERVED_FLAGS:
            raise UsageError(
                f"{origin}: roles.{role}.engine_args sets {name}, which servebook sets from "
                f"{vllm.RESERVED_FLAGS[name]}. Remove it from engine_args and set it there "
                "(defined once, applied identically to every role)."
            )
    dups = vllm.duplicate_flags(args)
    if dups:
        raise UsageError(
            f"{origin}: roles.{role}.engine_args gives {', '.join(dups)} more than once; the "
            "engine would silently keep one. Keep a single occurrence."
        )


def build_plan(recipe: Recipe, params: dict[str, Any], *, origin: str) -> Plan:
    """Turn a fully substituted recipe into a Plan."""
    roles: list[RolePlan] = []
    generate: dict[str, Generate] = {}
    kv_storage: list[str] = []
    spec = recipe.speculative
    plan_spec: dict[str, Any] | None = None
    for name in ENGINE_ROLES[recipe.topology]:
        role = recipe.roles[name]
        _check_engine_args(origin, name, role.engine_args)
        model_path = role.model_path or recipe.model.path
        if recipe.model.generate is not None:
            generate[model_path] = recipe.model.generate
        spec_cfg = None
        draft_path = None
        if spec is not None:
            draft_path = role.draft_path or spec.model
            spec_cfg = vllm.speculative_config(
                spec.method, spec.num_speculative_tokens, draft_path, spec.extra
            )
            if spec.generate is not None and draft_path is not None:
                generate[draft_path] = spec.generate
            # Identical on every role except for where each node keeps the draft.
            plan_spec = {k: v for k, v in spec_cfg.items() if k != "model"}
        kv_cfg = None
        if recipe.kv_connector is not None:
            kv_cfg = vllm.kv_transfer_config(
                recipe.kv_connector.name, recipe.kv_connector.extra_config
            )
            path = recipe.kv_connector.extra_config.get("shared_storage_path")
            if isinstance(path, str) and path not in kv_storage:
                kv_storage.append(path)
        roles.append(
            RolePlan(
                name=name,
                kind="engine",
                model_path=model_path,
                draft_path=draft_path,
                args=vllm.engine_args(
                    model_path=model_path,
                    served_name=recipe.model.served_name,
                    max_model_len=recipe.model.max_model_len,
                    speculative=spec_cfg,
                    kv_transfer=kv_cfg,
                    extra=role.engine_args,
                ),
                env=dict(role.env),
                resources=role.resources,
                placement=role.placement,
            )
        )
    if recipe.router is not None:
        roles.append(RolePlan(name="router", kind="router", args=list(recipe.router.args)))
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
    )
