"""Kubernetes backend: apply a Plan's rendered objects and wait, boundedly, for them.

``up`` renders the Plan for the deployment's name (``kube.manifests``: object names,
labels and Pod selectors derive from it, so two deployments of one recipe share a
namespace without touching each other), checks every object against the Kubernetes
schema, refuses any object that exists and is not this deployment's (another deployment's
``servebook.io/deployment`` label, or none), and applies the objects server-side (field
manager ``servebook``, never forced: a conflict with another manager is reported, exit 2).
A namespace that exists is used as it is; one ``up`` creates carries an annotation naming
the deployment that created it.  ``up`` records what it applied in the deployment's state
directory, then polls each role's Pods and the namespace's events.  The verdict is
``kube.rollout``'s: it fails as soon as the cluster says the rollout cannot succeed (an
absent weights directory, an image that cannot be pulled, a crashed engine, a Pod the
scheduler cannot place for two minutes), with that evidence and, for a crashed engine, the
last lines of its previous log and any known failure signature.  ``--timeout`` bounds the
whole wait; a timeout is a failure with the last state of every role.

The local record is a cache: ``status`` and ``down`` find a deployment's objects in the
cluster by their label (``recover_record`` rebuilds the record from them, the plan
included, which ``up`` stores as an annotation on the entry Deployment), so they work from
another machine or after the record is lost.  ``down`` deletes exactly that deployment's
objects (the Namespace only when this deployment created it and no other servebook
deployment is left in it).  Every API request goes through kr8s's ``Api.call_api`` and
has a timeout.

``open_view`` is how verify, bench and run reach the deployment: a port-forward that
servebook opens and holds (``kube.portforward``) to each role's Ready Pod for the length of
the command, and the command lines and environment read from those Pods.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from servebook.backends.base import Down, Found, Ready, UpFailed
from servebook.backends.state import KUBE_STATE_FILE as STATE_FILE
from servebook.backends.state import deployments_dir, state_dir_for
from servebook.deployment import DeploymentView, RoleView
from servebook.engines import vllm
from servebook.files import read_model, write_atomic
from servebook.findings import Finding, UsageError
from servebook.kube import client as kube_client
from servebook.kube import manifests, names
from servebook.kube.engine_pod import gpu_count
from servebook.kube.names import (
    COMPONENT_LABEL,
    CREATED_BY_ANNOTATION,
    DEPLOYMENT_LABEL,
    RECIPE_ANNOTATION,
)
from servebook.kube.rollout import RoleState, group_state, overall, restart_counts, role_state
from servebook.kube.validate import schema_errors
from servebook.recipe.plan import Plan, RolePlan

POLL_S = 5.0
REQUEST_TIMEOUT_S = 30.0
FIELD_MANAGER = "servebook"
# On the entry role's Deployment (added by `up`, not by `render`): the resolved Plan as
# JSON, so a deployment found in the cluster can be reached (open_view) without a record.
PLAN_ANNOTATION = "servebook.io/plan"
# The order roles are applied and listed in when no plan says it: engines, then the router.
_ROLE_ORDER = ("mixed", "prefill", "decode", "router")

Obj = dict[str, Any]


class AppliedObject(BaseModel):
    apiVersion: str
    kind: str
    name: str
    namespace: str | None = None


class KubeDeployment(BaseModel):
    name: str
    backend: str = "kubernetes"
    recipe: str
    namespace: str
    created_namespace: bool
    created: str
    objects: list[AppliedObject] = Field(default_factory=list)
    # role -> Deployment name
    roles: dict[str, str] = Field(default_factory=dict)
    entry_service: str = ""
    entry_port: int = 0
    served_model_name: str = ""
    ready: bool = False
    plan: dict[str, Any] = Field(default_factory=dict)
    # Pod uid -> container restarts before this apply: restarts count from the apply.
    restart_baseline: dict[str, int] = Field(default_factory=dict)


def state_path(name: str) -> Path:
    return state_dir_for(name) / STATE_FILE


def read_state(name: str) -> KubeDeployment | None:
    return read_model(
        state_path(name),
        KubeDeployment,
        "a servebook Kubernetes state file",
        "Delete the objects by hand (`kubectl delete -f` on the render) and remove the file.",
    )


def recorded_names() -> list[str]:
    """Names of the Kubernetes deployments this machine recorded."""
    root = deployments_dir()
    return (
        sorted(d.name for d in root.iterdir() if (d / STATE_FILE).is_file())
        if root.is_dir()
        else []
    )


def write_state(dep: KubeDeployment) -> None:
    write_atomic(state_path(dep.name), dep.model_dump_json(indent=2))


# --- recovering state from the cluster: pure functions over API objects -------------------


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _labels_of(obj: Obj) -> dict[str, str]:
    return dict(_meta(obj).get("labels") or {})


def _annotations_of(obj: Obj) -> dict[str, str]:
    return dict(_meta(obj).get("annotations") or {})


def _role_rank(role: str) -> tuple[int, str]:
    return (_ROLE_ORDER.index(role) if role in _ROLE_ORDER else len(_ROLE_ORDER), role)


def _flag_value(argv: Sequence[Any], flag: str) -> str:
    args = [str(a) for a in argv]
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return ""


def recover_record(name: str, objects: Sequence[Obj]) -> KubeDeployment | None:
    """Deployment ``name``'s record rebuilt from API objects (ConfigMaps, Deployments,
    Services and Namespaces, shaped like the items of ``kubectl get
    configmaps,deployments,services,namespaces -o json``): its namespace, objects (in
    apply order), roles, entry Service and port, recipe, plan (when ``up`` stored it),
    and whether it created its Namespace (the Namespace's ``servebook.io/created-by``
    annotation names it).  None when no Deployment or Service carries its label;
    unusable (exit 2) when they lie in several namespaces."""
    mine = [
        o
        for o in objects
        if o.get("kind") in (*_WORKLOADS, "Service") and _labels_of(o).get(DEPLOYMENT_LABEL) == name
    ]
    if not mine:
        return None
    namespaces = sorted({str(_meta(o).get("namespace", "")) for o in mine})
    if len(namespaces) > 1:
        raise UsageError(
            f"deployment {name} has objects in several namespaces ({', '.join(namespaces)}): "
            f"name one with -n, e.g. `-n {namespaces[0]}`."
        )
    namespace = namespaces[0]
    plan: dict[str, Any] = {}
    recipe = ""
    for o in mine:
        ann = _annotations_of(o)
        recipe = recipe or ann.get(RECIPE_ANNOTATION, "")
        if not plan and ann.get(PLAN_ANNOTATION):
            with contextlib.suppress(ValueError):
                loaded = json.loads(ann[PLAN_ANNOTATION])
                plan = loaded if isinstance(loaded, dict) else {}
    role_names = [str(r["name"]) for r in plan.get("roles", []) if isinstance(r, dict)]
    by_role: dict[str, dict[str, Obj]] = {}
    for o in mine:
        role = _labels_of(o).get(COMPONENT_LABEL, "")
        by_role.setdefault(role, {})[str(o["kind"])] = o

    def rank(role: str) -> tuple[int, tuple[int, str]]:
        return (role_names.index(role) if role in role_names else len(role_names), _role_rank(role))

    order = sorted(by_role, key=rank)
    roles = {
        r: str(_meta(w)["name"])
        for r in order
        for w in [by_role[r].get("Deployment") or by_role[r].get("LeaderWorkerSet")]
        if w is not None
    }
    ns_obj = next(
        (o for o in objects if o.get("kind") == "Namespace" and _meta(o).get("name") == namespace),
        None,
    )
    created_ns = ns_obj is not None and _annotations_of(ns_obj).get(CREATED_BY_ANNOTATION) == name
    applied: list[AppliedObject] = []
    if created_ns:
        applied.append(AppliedObject(apiVersion="v1", kind="Namespace", name=namespace))
    for kind in _SUPPORT:  # what the roles use comes before them
        for o in objects:
            if (
                o.get("kind") == kind
                and _labels_of(o).get(DEPLOYMENT_LABEL) == name
                and str(_meta(o).get("namespace", "")) == namespace
            ):
                applied.append(_applied(o, namespace))
    for r in order:
        for kind in (*_WORKLOADS, "Service"):
            found = by_role[r].get(kind)
            if found is not None:
                applied.append(_applied(found, namespace))
    if plan.get("topology"):
        entry_role = "router" if plan["topology"] == "pd" else "mixed"
    else:
        entry_role = "router" if "router" in by_role else (order[0] if order else "")
    entry_svc = by_role.get(entry_role, {}).get("Service")
    entry_port = names.ROUTER_PORT if entry_role == "router" else names.ENGINE_PORT
    if entry_svc is not None:
        for port in entry_svc.get("spec", {}).get("ports", []):
            if port.get("name") == "http" and isinstance(port.get("port"), int):
                entry_port = port["port"]
    served = str(plan.get("served_model_name") or "")
    if not served:
        for r in order:
            d = by_role[r].get("Deployment")
            for c in (
                (d or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
            ):
                served = served or _flag_value(
                    [*c.get("command", []), *c.get("args", [])], "--served-model-name"
                )
    stamps = sorted(
        str(_meta(o).get("creationTimestamp")) for o in mine if _meta(o).get("creationTimestamp")
    )
    deployments = [w for r in order for k in _WORKLOADS if (w := by_role[r].get(k)) is not None]
    return KubeDeployment(
        name=name,
        recipe=recipe or str(plan.get("recipe") or ""),
        namespace=namespace,
        created_namespace=created_ns,
        created=stamps[0] if stamps else "1970-01-01T00:00:00+00:00",
        objects=applied,
        roles=roles,
        entry_service=(
            str(_meta(entry_svc)["name"])
            if entry_svc is not None
            else names.role_object_name(name, entry_role)
        ),
        entry_port=entry_port,
        served_model_name=served,
        ready=bool(deployments)
        and all(
            int(d.get("status", {}).get("readyReplicas") or 0)
            >= int(d.get("spec", {}).get("replicas", 1))
            for d in deployments
        ),
        plan=plan,
    )


def _applied(o: Obj, namespace: str) -> AppliedObject:
    kind = str(o["kind"])
    return AppliedObject(
        apiVersion=str(o.get("apiVersion") or _API_VERSIONS.get(kind, "v1")),
        kind=kind,
        name=str(_meta(o)["name"]),
        namespace=namespace,
    )


def deployments_found(objects: Sequence[Obj]) -> list[Found]:
    """Every servebook deployment the API objects (Deployments, LeaderWorkerSets and
    Services, shaped like the items of ``kubectl get deployments,services -o json``) carry
    the label of, one per (namespace, name), sorted; its roles from its workloads'
    component labels."""
    groups: dict[tuple[str, str], list[Obj]] = {}
    for o in objects:
        if o.get("kind") not in (*_WORKLOADS, "Service"):
            continue
        name = _labels_of(o).get(DEPLOYMENT_LABEL)
        if not name:
            continue
        groups.setdefault((str(_meta(o).get("namespace", "")), name), []).append(o)
    out = []
    for (namespace, name), objs in sorted(groups.items()):
        recipe = next(
            (
                _annotations_of(o)[RECIPE_ANNOTATION]
                for o in objs
                if RECIPE_ANNOTATION in _annotations_of(o)
            ),
            "",
        )
        roles = sorted(
            {
                _labels_of(o)[COMPONENT_LABEL]
                for o in objs
                if o.get("kind") in _WORKLOADS and COMPONENT_LABEL in _labels_of(o)
            },
            key=_role_rank,
        )
        out.append(Found(name, namespace, recipe, tuple(roles)))
    return out


def _workload_name(plan: Plan, role: str, name: str) -> str:
    """The name of the object a role is: its Deployment's, or its LeaderWorkerSet's."""
    if plan.role(role).spans_nodes:
        return names.lws_name(name, role)
    return names.object_name(plan, role, name)


def with_plan(objects: list[Obj], plan: Plan, name: str) -> list[Obj]:
    """The objects, the entry role's workload (Deployment or LeaderWorkerSet) annotated
    with the Plan (for recovery)."""
    entry = _workload_name(plan, plan.entry_role, name)
    out = []
    for o in objects:
        if o["kind"] in _WORKLOADS and o["metadata"]["name"] == entry:
            meta = dict(o["metadata"])
            meta["annotations"] = {
                **meta.get("annotations", {}),
                PLAN_ANNOTATION: plan.model_dump_json(),
            }
            o = {**o, "metadata": meta}
        out.append(o)
    return out


# --- requests: every one through kr8s's Api.call_api, bounded by the Api's timeout ---------


def _api(request_timeout_s: float = REQUEST_TIMEOUT_S, connect_timeout_s: float = 15.0) -> Any:
    """A kr8s client for the current KUBECONFIG/context (``kube.client.connect``: a timeout
    on every request, and connecting bounded too)."""
    return kube_client.connect(
        request_timeout_s=request_timeout_s, connect_timeout_s=connect_timeout_s
    )


_PLURALS = {
    "Namespace": "namespaces",
    "Deployment": "deployments",
    "Service": "services",
    "Pod": "pods",
    "Event": "events",
    "ReplicaSet": "replicasets",
    "ConfigMap": "configmaps",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "LeaderWorkerSet": "leaderworkersets",
}
_API_VERSIONS = {
    "Deployment": "apps/v1",
    "ReplicaSet": "apps/v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "LeaderWorkerSet": names.LWS_API_VERSION,
}
# The objects a role is: one Deployment, or a LeaderWorkerSet when its copy spans nodes.
_WORKLOADS = ("Deployment", "LeaderWorkerSet")
# What the roles use, applied before them: the tiny model's generator, the router's identity.
_SUPPORT = ("ConfigMap", "ServiceAccount", "Role", "RoleBinding")


@dataclass(frozen=True)
class _Where:
    """One resource path: kr8s's (version, namespace, url) and how a person reads it."""

    version: str
    namespace: str | None
    url: str

    @property
    def path(self) -> str:
        base = "/api" if self.version == "v1" else "/apis"
        ns = f"/namespaces/{self.namespace}" if self.namespace else ""
        return f"{base}/{self.version}{ns}/{self.url}"


def _where(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> _Where:
    plural = _PLURALS[kind]
    ns = None if kind == "Namespace" else namespace
    return _Where(api_version, ns, f"{plural}/{name}" if name else plural)


def _what(obj: AppliedObject | Obj) -> str:
    if isinstance(obj, AppliedObject):
        kind, name, ns = obj.kind, obj.name, obj.namespace
    else:
        kind, name, ns = obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace")
    return f"{kind}/{name}" + (f" in namespace {ns}" if ns and kind != "Namespace" else "")


class Conflict(UsageError):
    """A server-side apply that conflicts with another field manager (HTTP 409)."""


def _conflict_text(status: Obj) -> str:
    causes = (status.get("details") or {}).get("causes") or []
    parts = [
        f"{c.get('field', '?')} ({c.get('message', c.get('reason', 'conflict'))})"
        for c in causes
        if isinstance(c, dict)
    ]
    return "; ".join(parts) or str(status.get("message", "conflict"))


def _request(
    api: Any,
    method: str,
    where: _Where,
    doing: str,
    *,
    params: dict[str, str] | None = None,
    body: Obj | None = None,
    content_type: str = "application/json",
    missing_ok: bool = False,
) -> Obj | None:
    """One bounded request (``kube.client.call``).  The answer's JSON; None for a 404 when
    ``missing_ok``.  Any failure is exit 2 naming ``doing`` and the request: a 409 is a
    ``Conflict`` naming the fields and their manager, a 401/403 ``Forbidden`` saying what
    servebook needs."""
    try:
        return kube_client.call(
            api,
            method,
            where.path,
            doing,
            params=params,
            body=body,
            content_type=content_type,
            missing_ok=missing_ok,
        )
    except kube_client.RequestFailed as e:
        status, code = e.status, e.code
        message = e.server_message
        if code == 409:
            raise Conflict(
                f"{doing}: the server-side apply conflicts with another field manager: "
                f"{_conflict_text(status)}. servebook applies as field manager "
                f"'{FIELD_MANAGER}' and never forces: undo the other change (or delete the "
                "object), then up again."
            ) from e
        if code in (401, 403):
            raise Forbidden(
                f"{doing}: the API server refused {e.request} ({code} "
                f"{status.get('reason', 'Forbidden')}: {message}). servebook needs get, list, "
                "patch and delete on deployments and services in the namespace, and get and "
                "patch on namespaces to create one."
            ) from e
        if code == 422:
            raise UsageError(f"{doing}: the API server rejected it as invalid: {message}") from e
        raise kube_client.ClusterUnreachable(f"the cluster request failed: {e}") from e


def _get(api: Any, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
    return _request(
        api,
        "GET",
        _where(api_version, kind, namespace, name),
        f"reading {kind}/{name}",
        missing_ok=True,
    )


def _list(
    api: Any,
    kind: str,
    namespace: str | None,
    selector: dict[str, str] | str | None = None,
) -> list[Obj]:
    """The items of a list (every namespace when ``namespace`` is None), each with its
    ``kind`` and ``apiVersion`` set as ``kubectl get -o json`` writes them."""
    kind = {v: k for k, v in _PLURALS.items()}.get(kind, kind)
    api_version = _API_VERSIONS.get(kind, "v1")
    if isinstance(selector, dict):
        selector = ",".join(f"{k}={v}" for k, v in selector.items())
    where = _where(api_version, kind, namespace)
    doing = f"listing {_PLURALS[kind]}" + (f" in namespace {namespace}" if namespace else "")
    got = _request(
        api, "GET", where, doing, params={"labelSelector": selector} if selector else None
    )
    items = (got or {}).get("items") or []
    return [{"apiVersion": api_version, "kind": kind, **i} for i in items if isinstance(i, dict)]


class Forbidden(UsageError):
    """The API server refused a request (401/403): exit 2 naming it."""


def _namespace_exists(api: Any, namespace: str) -> Obj | None:
    """The Namespace, or None when it does not exist.  Credentials bound to the namespace
    alone (a Role and RoleBinding in it) may not read the cluster-scoped Namespace; such a
    binding exists only in a namespace that exists, so it is taken as existing and used as
    it is (never applied over, never deleted)."""
    try:
        return _get(api, "v1", "Namespace", None, namespace)
    except Forbidden:
        return {"metadata": {"name": namespace}}


def check_ownership(api: Any, objects: list[Obj], name: str) -> dict[str, bool]:
    """Whether each object (by ``_what``) exists; unusable (exit 2), before anything is
    applied, when one exists and is not deployment ``name``'s: servebook never adopts an
    object of another deployment or one it did not make."""
    existed: dict[str, bool] = {}
    for spec in objects:
        meta = spec["metadata"]
        what = _what(spec)
        got = _get(api, spec["apiVersion"], spec["kind"], meta.get("namespace"), meta["name"])
        existed[what] = got is not None
        if got is None:
            continue
        owner = _labels_of(got).get(DEPLOYMENT_LABEL)
        if owner != name:
            whose = (
                f"servebook deployment {owner!r}"
                if owner
                else f"no servebook deployment (it has no {DEPLOYMENT_LABEL} label)"
            )
            raise UsageError(
                f"{what} already exists and belongs to {whose}; servebook does not adopt "
                f"it. Bring this one up under another --name, or delete that object if it is "
                "yours and unused."
            )
    return existed


def apply(
    api: Any,
    objects: list[Obj],
    say: Callable[[str], None],
    existed: dict[str, bool] | None = None,
) -> None:
    """Server-side apply of each object, in order, as field manager ``servebook`` (no
    force: a conflict is a ``Conflict``, exit 2)."""
    for spec in objects:
        meta = spec["metadata"]
        what = _what(spec)
        _request(
            api,
            "PATCH",
            _where(spec["apiVersion"], spec["kind"], meta.get("namespace"), meta["name"]),
            f"applying {what}",
            params={"fieldManager": FIELD_MANAGER},
            body=spec,
            content_type="application/apply-patch+yaml",
        )
        say(f"{'configured' if (existed or {}).get(what) else 'created'} {what}")


def apply_deployment(
    api: Any, plan: Plan, name: str, say: Callable[[str], None] = lambda s: None
) -> KubeDeployment:
    """Everything ``up`` does before it waits: render deployment ``name``, schema-check,
    refuse objects that are not its own, record, create the namespace if it is absent
    (annotated as created by ``name``) and apply the rest server-side."""
    objects = with_plan(manifests.render(plan, name), plan, name)
    errors = schema_errors(objects)
    if errors:
        raise UsageError(
            "the rendered objects do not match the Kubernetes schema:\n" + "\n".join(errors)
        )
    k8s = names.settings(plan)
    ns_obj = _namespace_exists(api, k8s.namespace)
    created_ns = any(o["kind"] == "Namespace" for o in objects) and (
        ns_obj is None or _annotations_of(ns_obj).get(CREATED_BY_ANNOTATION) == name
    )
    to_apply: list[Obj] = []
    for o in objects:
        if o["kind"] != "Namespace":
            to_apply.append(o)
        elif ns_obj is None:
            # Only a namespace this deployment creates is applied (and later deleted); one
            # that exists is used as it is, nothing merged into it.
            meta = o["metadata"]
            to_apply.append(
                {
                    **o,
                    "metadata": {
                        **meta,
                        "labels": {**meta.get("labels", {}), DEPLOYMENT_LABEL: name},
                        "annotations": {CREATED_BY_ANNOTATION: name},
                    },
                }
            )
    existed = check_ownership(api, [o for o in to_apply if o["kind"] != "Namespace"], name)
    entry = plan.role(plan.entry_role)
    dep = KubeDeployment(
        name=name,
        recipe=plan.recipe,
        namespace=k8s.namespace,
        created_namespace=created_ns,
        created=datetime.now(UTC).isoformat(),
        objects=[
            AppliedObject(
                apiVersion=o["apiVersion"],
                kind=o["kind"],
                name=o["metadata"]["name"],
                namespace=o["metadata"].get("namespace"),
            )
            for o in objects
        ],
        roles={r.name: _workload_name(plan, r.name, name) for r in plan.roles},
        entry_service=names.object_name(plan, entry.name, name),
        entry_port=names.ROUTER_PORT if entry.kind == "router" else names.ENGINE_PORT,
        served_model_name=plan.served_model_name,
        plan=plan.model_dump(mode="json"),
        restart_baseline=restart_counts(
            _list(api, "Pod", k8s.namespace, names.deployment_selector(name))
            if ns_obj is not None
            else []
        ),
    )
    write_state(dep)  # before applying: `down` can clean up an interrupted `up`
    try:
        apply(api, to_apply, say, existed)
    except UsageError as e:
        raise type(e)(
            f"{e} Whatever was applied before it is recorded: `servebook down {name}` deletes it."
        ) from e
    return dep


def _cluster_objects(api: Any, name: str | None, namespace: str | None) -> list[Obj]:
    """servebook's objects (of deployment ``name``, or of every deployment): what the roles
    use (ConfigMaps, the router's ServiceAccount, Role and RoleBinding), the roles'
    Deployments, LeaderWorkerSets (where the cluster serves that kind) and Services, in
    ``namespace`` or, when None, every namespace; with the Namespace of each found when
    it can be read."""
    selector = names.deployment_selector(name) if name else DEPLOYMENT_LABEL
    try:
        found = [
            o
            for kind in (*_SUPPORT, "Deployment", "Service")
            for o in _list(api, kind, namespace, selector)
        ]
        found += _list_if_served(api, "LeaderWorkerSet", namespace, selector)
    except UsageError as e:
        if namespace is None and "refused" in str(e):
            raise UsageError(
                f"{e} Listing across namespaces is not allowed with these credentials: give "
                "the deployment's namespace with -n NAMESPACE."
            ) from e
        raise
    for ns in sorted({str(_meta(o).get("namespace", "")) for o in found}):
        with contextlib.suppress(UsageError):  # a namespace we may not read: not ours
            got = _namespace_exists(api, ns)
            if got is not None:
                found.append({"apiVersion": "v1", "kind": "Namespace", **got})
    return found


def _list_if_served(
    api: Any, kind: str, namespace: str | None, selector: dict[str, str] | str | None = None
) -> list[Obj]:
    """``_list`` of a kind a CRD adds: none when the cluster does not serve it (404)."""
    try:
        return _list(api, kind, namespace, selector)
    except kube_client.ClusterUnreachable as e:
        cause = e.__cause__
        if isinstance(cause, kube_client.RequestFailed) and cause.code == 404:
            return []
        raise


def find_deployment(api: Any, name: str, namespace: str | None = None) -> KubeDeployment | None:
    """Deployment ``name`` as the cluster has it (``recover_record`` over its labelled
    objects), in ``namespace``, else the recorded namespace, else any namespace; the local
    record fills in what the cluster cannot say (the plan of an older apply).  Without
    labelled objects, the local record (an older servebook's apply, or an interrupted up)."""
    local = read_state(name)
    ns = namespace or (local.namespace if local else None)
    dep = recover_record(name, _cluster_objects(api, name, ns))
    if dep is None:
        return local if local is not None and namespace in (None, local.namespace) else None
    if local is not None and local.namespace == dep.namespace:
        dep.plan = dep.plan or local.plan
        dep.served_model_name = dep.served_model_name or local.served_model_name
        dep.recipe = dep.recipe or local.recipe
        dep.created_namespace = dep.created_namespace or (
            local.created_namespace
            and not any(o.kind == "Namespace" for o in dep.objects)
            and _ns_created_by(api, dep.namespace) in (None, name)
        )
    return dep


def _ns_created_by(api: Any, namespace: str) -> str | None:
    with contextlib.suppress(UsageError):
        got = _namespace_exists(api, namespace)
        return _annotations_of(got).get(CREATED_BY_ANNOTATION) if got else None
    return None


def list_deployments(namespace: str | None = None) -> list[Found]:
    """servebook's deployments in the cluster, found by their label."""
    return deployments_found(_cluster_objects(_api(), None, namespace))


def _crash_log(api: Any, namespace: str, state: RoleState) -> str:
    """The crashed container's previous log (last 40 lines) and any known signature."""
    from kr8s.objects import Pod

    if not state.pod or not state.crashed_container:
        return ""
    try:
        pod = Pod.get(state.pod, namespace=namespace, api=api)
        lines = list(pod.logs(container=state.crashed_container, previous=True, tail_lines=40))
    except Exception as e:  # the log is evidence, not a requirement
        return f"(its previous log could not be read: {type(e).__name__}: {e})"
    text = "\n".join(lines)
    found = [
        f"known failure '{sig.id}': {sig.meaning}. Fix: {sig.fix}"
        for sig, _ in vllm.match_log(text)
    ]
    return "\n".join([*found, "last lines of its previous log:", text])


def _states(api: Any, dep: KubeDeployment, started: datetime) -> list[RoleState]:
    """Every role's verdict on the rollout of this apply (``kube.rollout``): its Pods, its
    Deployment and ReplicaSets (so an old Pod is never this apply's), and the namespace's
    events; restarts count from the baseline recorded at apply time."""
    ns = dep.namespace
    events = _list(api, "Event", ns)
    selector = names.deployment_selector(dep.name)
    deployments = {str(_meta(d).get("name")): d for d in _list(api, "Deployment", ns, selector)}
    replicasets = _list(api, "ReplicaSet", ns, selector)
    plan = Plan.model_validate(dep.plan) if dep.plan else None
    groups = [r for r in (plan.roles if plan else []) if r.spans_nodes]
    sets = (
        {str(_meta(o).get("name")): o for o in _list(api, "LeaderWorkerSet", ns, selector)}
        if groups
        else {}
    )
    out = []
    for role, deployment_name in dep.roles.items():
        pods = _list(api, "Pod", ns, names.selector_for(dep.name, role))
        group = next((r for r in groups if r.name == role), None)
        if group is not None:  # a LeaderWorkerSet: ready when every member of every group is
            out.append(
                group_state(
                    role,
                    deployment_name,
                    pods,
                    events,
                    now=datetime.now(UTC),
                    started=started,
                    replicas=group.replicas,
                    size=group.nodes_per_replica,
                    lws=sets.get(deployment_name),
                    restart_baseline=dep.restart_baseline or None,
                )
            )
            continue
        out.append(
            role_state(
                role,
                deployment_name,
                pods,
                events,
                now=datetime.now(UTC),
                started=started,
                deployment=deployments.get(deployment_name),
                replicasets=replicasets,
                restart_baseline=dep.restart_baseline or None,
            )
        )
    return out


def _signature(api: Any, namespace: str, state: RoleState) -> str | None:
    """The known failure signature in a crashed container's previous log, if any."""
    log = _crash_log(api, namespace, state)
    found = [line for line in log.splitlines() if line.startswith("known failure")]
    return found[0] if found else None


def role_status(s: RoleState, signature: str | None = None) -> dict[str, Any]:
    """One role's line of `servebook status`: its Pod, node, readiness, restarts since this
    apply, image and the last known failure signature, with the verdict and evidence."""
    where = f"Pod {s.pod} on node {s.node or '?'}" if s.pod else "no Pod yet"
    parts = [where, f"restarts since apply {s.restarts_since_apply}"]
    if s.image:
        parts.append(f"image {s.image}")
    summary = ", ".join(parts) + f": {s.summary}"
    if signature:
        summary += f" ({signature})"
    return {
        "name": s.role,
        "kind": "router" if s.role == "router" else "engine",
        "state": s.state,
        "ok": s.state == "ready",
        "summary": summary,
        "pod": s.pod,
        "node": s.node,
        "ready": s.ready,
        "restarts_since_apply": s.restarts_since_apply,
        "image": s.image,
        "failure_signature": signature,
        "evidence": s.evidence,
    }


def _describe_states(states: list[RoleState]) -> str:
    return "\n".join(f"  {s.role}: {s.state}: {s.summary}" for s in states)


def up(
    plan: Plan,
    *,
    name: str | None = None,
    timeout_s: float = 2400.0,
    say: Callable[[str], None] = lambda s: None,
    poll_s: float = POLL_S,
) -> KubeDeployment:
    name = name or plan.recipe
    api = _api()
    dep = apply_deployment(api, plan, name, say)
    started = datetime.fromisoformat(dep.created)
    deadline = time.monotonic() + timeout_s
    last = ""
    states: list[RoleState] = []
    misses = 0
    while True:
        try:
            states = _states(api, dep, started)
            misses = 0
        except UsageError:
            misses += 1  # one failed poll is a blip; three in a row are the answer
            if misses >= 3 or time.monotonic() > deadline:
                raise
            time.sleep(poll_s)
            continue
        now_text = _describe_states(states)
        if now_text != last:
            say(now_text)
            last = now_text
        verdict = overall(states)
        if verdict == "ready":
            dep.ready = True
            write_state(dep)
            return dep
        if verdict == "failed":
            parts = []
            for s in states:
                if s.state == "failed":
                    parts.append(f"{s.role}: {s.summary}\n  evidence: {json.dumps(s.evidence)}")
                    log = _crash_log(api, dep.namespace, s)
                    if log:
                        parts.append(log)
            raise UpFailed(
                f"deployment {name} cannot become ready:\n" + "\n".join(parts) + "\nThe objects "
                f"are left for inspection (`kubectl -n {dep.namespace} describe pods`); "
                f"`servebook down {name}` deletes them.",
                role=next(s.role for s in states if s.state == "failed"),
            )
        if time.monotonic() > deadline:
            raise UpFailed(
                f"deployment {name} was not ready within {timeout_s:.0f} s. Last state:\n"
                f"{now_text}\nRaise --timeout if the weights take longer to load; "
                f"`servebook down {name}` deletes the objects.",
            )
        time.sleep(poll_s)


def _not_found(name: str, namespace: str | None) -> UsageError:
    where = f"namespace {namespace}" if namespace else "any namespace"
    return UsageError(
        f"no Kubernetes deployment named {name!r} is recorded on this machine or labelled "
        f"{DEPLOYMENT_LABEL}={name} in {where}. `servebook status --backend kubernetes` "
        "lists the deployments the cluster has."
    )


def down(name: str, namespace: str | None = None) -> dict[str, str]:
    """Delete deployment ``name``'s objects, found in the cluster by its label (and in the
    local record), in reverse apply order; idempotent.  An object carrying another
    deployment's label is never touched; the Namespace goes only when this deployment
    created it and no other servebook deployment is left in it."""
    local = read_state(name)
    api = _api()
    dep = find_deployment(api, name, namespace)
    if dep is None:
        return {}
    result: dict[str, str] = {}
    deleted_any = False
    for o in reversed(dep.objects):
        what = _what(o)
        if o.kind == "Namespace":
            continue
        got = _get(api, o.apiVersion, o.kind, o.namespace, o.name)
        if got is None:
            result[what] = "not found"
            continue
        owner = _labels_of(got).get(DEPLOYMENT_LABEL)
        if owner is not None and owner != name:
            result[what] = f"kept (it belongs to deployment {owner})"
            continue
        _request(
            api,
            "DELETE",
            _where(o.apiVersion, o.kind, o.namespace, o.name),
            f"deleting {what}",
            body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"},
            missing_ok=True,
        )
        result[what] = "deleted"
        deleted_any = True
    ns_what = f"Namespace/{dep.namespace}"
    if dep.created_namespace:
        others = sorted(
            {
                f.name
                for f in deployments_found(_cluster_objects(api, None, dep.namespace))
                if f.name != name
            }
        )
        if others:
            result[ns_what] = f"kept (deployment {', '.join(others)} is in it)"
        else:
            gone = _request(
                api,
                "DELETE",
                _where("v1", "Namespace", None, dep.namespace),
                f"deleting {ns_what}",
                body={
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "propagationPolicy": "Foreground",
                },
                missing_ok=True,
            )
            result[ns_what] = "deleted" if gone is not None else "not found"
    elif any(o.kind == "Namespace" for o in dep.objects) or deleted_any:
        result[ns_what] = "kept (this deployment did not create it)"
    if local is not None and local.namespace == dep.namespace:
        state_path(name).unlink(missing_ok=True)
    return result


def status(name: str, namespace: str | None = None) -> dict[str, Any]:
    api = _api()
    dep = find_deployment(api, name, namespace)
    if dep is None:
        raise _not_found(name, namespace)
    states = _states(api, dep, datetime.fromisoformat(dep.created))
    roles = [role_status(s, _signature(api, dep.namespace, s)) for s in states]
    return {
        "name": dep.name,
        "backend": dep.backend,
        "recipe": dep.recipe,
        "namespace": dep.namespace,
        "entry": f"service/{dep.entry_service} port {dep.entry_port} in namespace {dep.namespace}",
        "roles": roles,
    }


# --- the deployment view: port-forwards held for the length of a command ------------------


def _ready_pods(api: Any, dep: KubeDeployment, role: RolePlan) -> list[dict[str, Any]]:
    """The role's Ready Pods that serve its API (for a role spanning nodes, the group
    leaders, never a headless worker), newest first, one per replica; unusable (exit 2)
    while fewer are Ready: the counters of a role are those of all its replicas."""
    pods = _list(api, "Pod", dep.namespace, names.api_selector_for(dep.name, role))
    ready = [
        p
        for p in pods
        if not p.get("metadata", {}).get("deletionTimestamp")
        and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in p.get("status", {}).get("conditions", [])
        )
    ]
    want = max(1, role.replicas)
    if len(ready) < want:
        raise UsageError(
            f"deployment {dep.name}: role {role.name} has {len(ready)} Ready Pod(s) of "
            f"{want} in namespace {dep.namespace} ({len(pods)} found). Run `servebook status "
            f"{dep.name}`."
        )
    ready.sort(key=lambda p: str(p["metadata"].get("creationTimestamp", "")), reverse=True)
    return ready[:want]


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    for c in pod.get("spec", {}).get("containers", []):
        if c.get("name") == name:
            return dict(c)
    return dict(pod.get("spec", {}).get("containers", [{}])[0])


def _pod_log(api: Any, namespace: str, pod: str, container: str) -> Callable[[], str]:
    from kr8s.objects import Pod

    def read() -> str:
        try:
            obj = Pod.get(pod, namespace=namespace, api=api)
            return "\n".join(obj.logs(container=container, tail_lines=4000))
        except Exception as e:  # the log is evidence, not a requirement
            return f"(the log of Pod {pod} could not be read: {type(e).__name__}: {e})"

    return read


@contextlib.contextmanager
def open_view(
    name: str, *, namespace: str | None = None, forward_timeout_s: float = 10.0
) -> Iterator[DeploymentView]:
    """The deployment as a command reaches it: a port-forward servebook holds to each
    role's Ready Pod (engine API and metrics; router API and metrics; the metrics of every
    other replica of a role that runs several) for the body of the with-block.  A forward
    that dies or a Pod replaced meanwhile makes that role not alive, with the reason in
    its description; the view's users fail naming the role."""
    from servebook.kube.kr8s_dialer import Kr8sDialer, kr8s_pod_identity
    from servebook.kube.portforward import Forwards

    api = None
    dep = read_state(name)
    if dep is None or (namespace is not None and dep.namespace != namespace):
        api = _api()  # not recorded here: as the cluster has it
        dep = find_deployment(api, name, namespace)
        if dep is None:
            raise _not_found(name, namespace)
    if not dep.plan:
        raise UsageError(
            f"deployment {name} was recorded by an older servebook without its plan: "
            f"`servebook down {name}`, then up again."
        )
    plan = Plan.model_validate(dep.plan)
    api = api or _api()
    pods = {r.name: _ready_pods(api, dep, r) for r in plan.roles}
    with Forwards(
        Kr8sDialer(api), pod_identity=kr8s_pod_identity(api), timeout_s=forward_timeout_s
    ) as fw:
        roles: list[RoleView] = []
        for r in plan.roles:
            pod, *others = pods[r.name]
            pod_name = str(pod["metadata"]["name"])
            node = pod.get("spec", {}).get("nodeName", "?")
            container = _container(pod, "router" if r.kind == "router" else "engine")
            api_url = fw.open(
                role=r.name,
                pod=pod_name,
                namespace=dep.namespace,
                remote_port=names.ROUTER_PORT if r.kind == "router" else names.ENGINE_PORT,
            )
            metrics_url = (
                fw.open(
                    role=r.name,
                    pod=pod_name,
                    namespace=dep.namespace,
                    remote_port=names.ROUTER_METRICS_PORT,
                )
                if r.kind == "router"
                else api_url
            )
            replicas = tuple(  # every other replica's counters (vLLM: on its API port)
                fw.open(
                    role=r.name,
                    pod=str(p["metadata"]["name"]),
                    namespace=dep.namespace,
                    remote_port=names.ENGINE_PORT,
                )
                for p in others
                if r.kind == "engine"
            )

            def describe(role: str = r.name, pod: str = pod_name, node: str = node) -> str:
                problem = fw.problems().get(role)
                where = f"Pod {pod} on node {node}"
                return f"{where}: {problem}" if problem else where

            roles.append(
                RoleView(
                    name=r.name,
                    kind=r.kind,
                    api_url=api_url,
                    metrics_url=metrics_url,
                    replica_metrics_urls=replicas,
                    argv=[*container.get("command", []), *container.get("args", [])],
                    env={
                        str(e["name"]): str(e["value"])
                        for e in container.get("env", [])
                        if "value" in e
                    },
                    alive=lambda role=r.name: fw.alive(role),  # type: ignore[misc]
                    describe=describe,
                    log=_pod_log(api, dep.namespace, pod_name, str(container.get("name", ""))),
                )
            )
        gpus = sum(
            gpu_count(r) * max(1, r.replicas) * max(1, r.nodes_per_replica)
            for r in plan.engine_roles
        )
        yield DeploymentView(
            name=dep.name,
            backend=dep.backend,
            recipe=dep.recipe,
            plan=plan,
            served_model_name=dep.served_model_name,
            entry_url=next(v.api_url for v in roles if v.name == plan.entry_role),
            roles=roles,
            local_model_dir=None,  # the weights live on the nodes: bench asks the server
            accelerators=gpus or None,
        )


class KubernetesBackend:
    """``Backend`` for a Kubernetes cluster (module docstring)."""

    name = "kubernetes"
    title = "Kubernetes"
    recipes_hint = (
        "Use a vllm-* recipe, or tiny-mixed or tiny-pd (`servebook recipes`), or --backend local."
    )
    up_cost = (
        "for a GPU deployment of a large model 10-40 minutes (image pull, weight load from "
        "the node's disk, compilation) before the first request"
    )

    def recorded(self) -> list[str]:
        return recorded_names()

    def has(self, name: str) -> bool:
        return read_state(name) is not None

    def preflight(self, plan: Plan) -> list[Finding]:
        from servebook.preflight.live import plan_findings

        return plan_findings(plan)

    def up(
        self,
        plan: Plan,
        *,
        name: str,
        timeout_s: float | None,
        say: Callable[[str], None],
        port: int | None = None,
    ) -> Ready:
        if port is not None:
            raise UsageError("--port is for the local backend; a Kubernetes entry is a Service.")
        # The engines' own startup budget, plus time to pull the image and schedule.
        budget = names.settings(plan).startup_timeout_s + 600.0
        dep = up(plan, name=name, timeout_s=timeout_s if timeout_s is not None else budget, say=say)
        return Ready(
            dep.name,
            f"ready: service/{dep.entry_service} port {dep.entry_port} in namespace "
            f"{dep.namespace} (model '{dep.served_model_name}'). `servebook verify {dep.name}` "
            f"and `servebook bench {dep.name}` reach it through port-forwards of their own.",
        )

    def status(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        return status(name, namespace)

    def down(self, name: str, namespace: str | None = None) -> Down:
        return Down(name, down(name, namespace))

    def found(self, namespace: str | None = None) -> list[Found]:
        """servebook's deployments in the cluster (by label), not this machine's records."""
        return list_deployments(namespace)

    def open(
        self, name: str, namespace: str | None = None
    ) -> contextlib.AbstractContextManager[DeploymentView]:
        return open_view(name, namespace=namespace)
