"""Attached deployments: ones servebook did not make, recorded on this machine so that
``verify``, ``bench``, ``status`` and ``report`` reach them as they reach servebook's own.

``servebook attach`` writes the record, ``servebook detach`` removes it; nothing on the
deployment itself is ever touched (no apply, no restart, no label), so an attached
deployment has no ``up`` and no ``down``.

The record, ``$SERVEBOOK_HOME/deployments/NAME/attached.json`` (beside where a local or
Kubernetes deployment of that name would keep its own; a name is one deployment's only)::

    {
      "name": "prod-pd",
      "backend": "url" | "kubernetes",
      "namespace": "",               # kubernetes: the namespace the Pods were found in
      "stack": "url",                # how it was recognised: url, llm-d, dynamo, kserve, ...
      "entry": "http://10.0.0.5:8000",  # url: the entry URL; kubernetes: "svc/NAME:PORT"
      "served_model_name": "tiny",
      "created": "2026-12-01T20:40:00+00:00",
      "notes": ["decode http://...: its command line could not be read: ..."],
      "roles": [                     # prefill + decode: a PD claim; mixed: one aggregated role
        {"name": "decode", "kind": "engine",
         "replicas": [               # every replica judged on its own
           {"name": "http://10.0.0.6:8200",   # a Pod's name on Kubernetes, else the URL
            "api_url": "http://10.0.0.6:8200",  # base URL (no /v1); kubernetes: "" (forwarded)
            "metrics_url": "http://10.0.0.6:8200",  # the engine's own /metrics, never a sidecar's
            "argv": ["python", "-m", "vllm.entrypoints.openai.api_server", ...],
            "env": {"VLLM_ADDITIONAL_ARGS": "..."},
            "argv_from": "pid 4242 listening on port 8200 (/proc/4242/cmdline)",
            "argv_unread": "",          # why the command line could not be read: the claims
                                        # of this replica are then "not determined"
            # Kubernetes only (optional; a URL replica leaves them unset):
            "pod": null, "container": null, "node": null,
            "port": null, "metrics_port": null, "scheme": "http"}]}]
    }

``view_of(record, reach)`` turns a record into the same ``DeploymentView`` servebook's own
backends yield (``deployment.reach.build``), given each replica's reachable URLs
(``reach``: the record's own URLs for ``backend: url``; port-forwards for ``backend:
kubernetes``, which the Kubernetes attach opens and hands in).  Its claims are read from
the engines' own command lines (``engines.cmdline``), never from a recipe: roles prefill
and decode claim PD; a speculative config on any replica claims speculation; a replica
whose command line could not be read leaves its claims "not determined"
(``Claims.argv_unread``), never assumed.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from servebook import files
from servebook.backends.state import deployments_dir, state_dir_for
from servebook.deployment.reach import Address, Reach, Record, ReplicaRecord, RoleRecord, build
from servebook.deployment.view import Claims, DeploymentView
from servebook.engines.cmdline import EngineCommand, parse_argv, speculative_config
from servebook.errors import UsageError
from servebook.files import read_model
from servebook.recipe.plan import Plan, RolePlan

ATTACHED_STATE_FILE = "attached.json"
ENGINE_ROLE_NAMES = ("mixed", "prefill", "decode")
BACKENDS = ("url", "kubernetes")


class AttachedReplica(BaseModel):
    """One engine process (or router) of a role: a Pod, or a URL given to attach."""

    name: str
    api_url: str = ""
    metrics_url: str = ""
    argv: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    argv_from: str = ""
    argv_unread: str = ""
    pod: str | None = None
    container: str | None = None
    node: str | None = None
    port: int | None = None
    metrics_port: int | None = None
    scheme: Literal["http", "https"] = "http"


class AttachedRole(BaseModel):
    name: str
    kind: Literal["engine", "router"] = "engine"
    replicas: list[AttachedReplica] = Field(default_factory=list)


class AttachedDeployment(BaseModel):
    name: str
    backend: Literal["url", "kubernetes"] = "url"
    namespace: str = ""
    stack: str = "url"
    entry: str
    served_model_name: str = ""
    created: str = ""
    notes: list[str] = Field(default_factory=list)
    roles: list[AttachedRole] = Field(default_factory=list)

    @property
    def engine_roles(self) -> list[AttachedRole]:
        return [r for r in self.roles if r.kind == "engine"]

    @property
    def topology(self) -> Literal["mixed", "pd"]:
        names = {r.name for r in self.engine_roles}
        return "pd" if {"prefill", "decode"} <= names else "mixed"

    def role(self, name: str) -> AttachedRole:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)


def roles_problem(roles: list[AttachedRole]) -> str | None:
    """Why these roles are no deployment verify can judge (None: they are one)."""
    names = [r.name for r in roles if r.kind == "engine"]
    unknown = sorted(set(names) - set(ENGINE_ROLE_NAMES))
    if unknown:
        return f"role(s) {', '.join(unknown)}: an engine role is mixed, prefill or decode"
    if not names:
        return "no engine role: give --role mixed=URL, or --role prefill=URL --role decode=URL"
    if "mixed" in names and ({"prefill", "decode"} & set(names)):
        return "mixed beside prefill/decode: one deployment is aggregated or disaggregated"
    if ("prefill" in names) != ("decode" in names):
        given = "prefill" if "prefill" in names else "decode"
        other = "decode" if given == "prefill" else "prefill"
        return f"role {given} without {other}: a PD deployment names both"
    return None


# --- the store ---------------------------------------------------------------------------


def record_path(name: str) -> Path:
    return state_dir_for(name) / ATTACHED_STATE_FILE


def read_record(name: str) -> AttachedDeployment | None:
    return read_model(
        record_path(name),
        AttachedDeployment,
        "a servebook attached-deployment record",
        f"`servebook detach {name}` forgets it; attach it again.",
    )


def write_record(dep: AttachedDeployment) -> None:
    """Atomically (a reader sees the old record or the new one, never half), redacted and
    private (``files.write_record``): a replica's ``--api-key`` is kept as ``<redacted>``."""
    if not dep.created:
        dep = dep.model_copy(update={"created": datetime.now(UTC).isoformat(timespec="seconds")})
    files.write_record(record_path(dep.name), dep)


def remove_record(name: str) -> bool:
    """Forget the deployment (True when there was a record); the directory goes when
    nothing else is in it."""
    path = record_path(name)
    existed = path.is_file()
    path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()
    return existed


def recorded_names() -> list[str]:
    root = deployments_dir()
    return (
        sorted(d.name for d in root.iterdir() if (d / ATTACHED_STATE_FILE).is_file())
        if root.is_dir()
        else []
    )


# --- claims and the view -----------------------------------------------------------------


def engine_command(replica: AttachedReplica) -> EngineCommand | None:
    """The engine's command line as the replica was started (``VLLM_ADDITIONAL_ARGS``
    from its environment appended where its script expands it)."""
    if not replica.argv:
        return None
    return parse_argv(replica.argv, env=replica.env)


def claims_of(dep: AttachedDeployment, entry_url: str) -> Claims:
    """What the deployment says of itself: PD by its role names, speculation by any
    engine's own command line; a replica whose command line was not read (or is not an
    engine's) is named in ``argv_unread`` and its claims are not determined."""
    speculative = False
    unread: dict[str, str] = {}
    for role in dep.engine_roles:
        for rep in role.replicas:
            cmd = engine_command(rep)
            if cmd is None:
                unread[f"{role.name} {rep.name}"] = rep.argv_unread or (
                    "its command line does not run vLLM's engine"
                    if rep.argv
                    else "its command line was not read"
                )
                continue
            cfg, _ = speculative_config(cmd)
            speculative = speculative or cfg is not None
    return Claims(
        topology=dep.topology,
        speculative=speculative,
        served_model_name=dep.served_model_name,
        entry_url=entry_url,
        argv_unread=unread,
    )


def plan_of(dep: AttachedDeployment) -> Plan:
    """A Plan shaped like the deployment (roles, replicas, command lines as read), so the
    view's users see what they see of servebook's own; it is never run."""
    spec: dict[str, Any] | None = None
    roles: list[RolePlan] = []
    for role in dep.roles:
        first = role.replicas[0] if role.replicas else AttachedReplica(name=role.name)
        cmd = engine_command(first) if role.kind == "engine" else None
        if cmd is not None and spec is None:
            cfg, _ = speculative_config(cmd)
            spec = {k: v for k, v in cfg.items() if k != "model"} if cfg else None
        roles.append(
            RolePlan(
                name=role.name,
                kind=role.kind,
                args=list(cmd.args) if cmd is not None else [],
                env=dict(first.env),
                replicas=max(1, len(role.replicas)),
            )
        )
    return Plan(
        recipe=f"attached ({dep.stack})",
        origin=f"attached by servebook attach ({dep.backend})",
        engine="vllm",
        backends=[dep.backend],
        topology=dep.topology,
        served_model_name=dep.served_model_name,
        roles=roles,
        speculative=spec,
    )


def url_reach(dep: AttachedDeployment) -> Reach:
    """``backend: url``: every replica at the URLs the record holds, reached directly."""
    return Reach(
        route="direct",
        replicas={
            role.name: [
                Address(
                    rep.api_url,
                    rep.metrics_url or rep.api_url,
                    describe=lambda rep=rep: rep.argv_from or rep.name,  # type: ignore[misc]
                )
                for rep in role.replicas
            ]
            for role in dep.roles
        },
        entry_url=dep.entry,
    )


def view_record(dep: AttachedDeployment) -> Record:
    """What the view of an attached deployment is made from (``deployment.reach``): its
    roles and replicas as recorded, its claims read from the engines' own command lines;
    its entry is the reach's (a router where it is no role's own server)."""
    for role in dep.roles:
        if not role.replicas:
            raise UsageError(f"attached deployment {dep.name}: role {role.name} has no replica.")
    return Record(
        name=dep.name,
        backend=f"attached ({dep.backend})",
        recipe=f"attached ({dep.stack})",
        plan=plan_of(dep),
        served_model_name=dep.served_model_name,
        roles=[
            RoleRecord(
                role.name,
                role.kind,
                [ReplicaRecord(rep.name, list(rep.argv), dict(rep.env)) for rep in role.replicas],
            )
            for role in dep.roles
        ],
        entry_role=None,
        local_model_dir=None,  # the weights are the deployment's own: bench asks the server
        claimed=claims_of(dep, dep.entry),
    )


def reread_commands(dep: AttachedDeployment) -> AttachedDeployment:
    """The record with each replica's command line read again from the process that
    listens on its port now (a replica restarted with other flags claims what it runs
    now); a replica whose process cannot be read now keeps what attach read."""
    from servebook.backends.attached.listener import read_listener

    roles = []
    for role in dep.roles:
        reps = []
        for rep in role.replicas:
            who = read_listener(rep.api_url)
            if who.argv:
                rep = rep.model_copy(
                    update={
                        "argv": who.argv,
                        "env": who.env,
                        "argv_from": who.source,
                        "argv_unread": "",
                    }
                )
            reps.append(rep)
        roles.append(role.model_copy(update={"replicas": reps}))
    return dep.model_copy(update={"roles": roles})


def view_of(dep: AttachedDeployment, reach: Reach) -> DeploymentView:
    """The deployment view of a record, given how this process reaches each replica
    (``deployment.reach.build``: an entry that is no role's own URL is the deployment's
    router, shown as role ``router``)."""
    return build(view_record(dep), reach)


__all__ = [
    "ATTACHED_STATE_FILE",
    "AttachedDeployment",
    "AttachedReplica",
    "AttachedRole",
    "claims_of",
    "plan_of",
    "read_record",
    "recorded_names",
    "remove_record",
    "roles_problem",
    "url_reach",
    "view_of",
    "view_record",
    "write_record",
]
