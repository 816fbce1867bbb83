"""A Kubernetes deployment's record: what ``up`` applied (namespace, objects in apply
order, roles, entry Service, plan, restart baseline), kept in the deployment's state
directory, and rebuilt from the cluster when it is not there.

The local record is a cache: ``status`` and ``down`` find a deployment's objects in the
cluster by their label (``recover_record`` rebuilds the record from them, the plan
included, which ``up`` stores as an annotation on the entry Deployment), so they work from
another machine or after the record is lost.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from servebook.backends.base import Found
from servebook.backends.state import KUBE_STATE_FILE as STATE_FILE
from servebook.backends.state import deployments_dir, state_dir_for
from servebook.engines.vllm import flag_value
from servebook.errors import UsageError
from servebook.files import read_model, write_record
from servebook.kube import names
from servebook.kube.names import (
    COMPONENT_LABEL,
    CREATED_BY_ANNOTATION,
    DEPLOYMENT_LABEL,
    RECIPE_ANNOTATION,
)
from servebook.kube.objects import annotations_of, labels_of, meta_of
from servebook.kube.resources import (
    API_VERSIONS,
    list_if_served,
    list_objects,
    namespace_exists,
    object_text,
)
from servebook.recipe.plan import Plan

# On the entry role's Deployment (added by `up`, not by `render`): the resolved Plan as
# JSON, so a deployment found in the cluster can be reached (open_view) without a record.
PLAN_ANNOTATION = "servebook.io/plan"
# The order roles are applied and listed in when no plan says it: engines, then the router.
_ROLE_ORDER = ("mixed", "prefill", "decode", "router")
# The objects a role is: one Deployment, or a LeaderWorkerSet when its copy spans nodes.
WORKLOADS = ("Deployment", "LeaderWorkerSet")
# What the roles use, applied before them: the tiny model's generator, the router's identity.
SUPPORT = ("ConfigMap", "ServiceAccount", "Role", "RoleBinding")

Obj = dict[str, Any]


class AppliedObject(BaseModel):
    apiVersion: str
    kind: str
    name: str
    namespace: str | None = None

    @property
    def what(self) -> str:
        """``Kind/name in namespace NS``, as a message names it."""
        return object_text(self.kind, self.name, self.namespace)


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
    # The workloads (by name) whose spec this apply created or changed: their controller's
    # status is of the previous spec until it reports on this one (kube.rollout_groups).
    changed: list[str] = Field(default_factory=list)


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
    """Atomically, redacted and private (``files.write_record``)."""
    write_record(state_path(dep.name), dep)


# --- recovering state from the cluster: pure functions over API objects -------------------


def _role_rank(role: str) -> tuple[int, str]:
    return (_ROLE_ORDER.index(role) if role in _ROLE_ORDER else len(_ROLE_ORDER), role)


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
        if o.get("kind") in (*WORKLOADS, "Service") and labels_of(o).get(DEPLOYMENT_LABEL) == name
    ]
    if not mine:
        return None
    namespace = _one_namespace(name, mine)
    recipe, plan = _recipe_and_plan(mine)
    by_role, order = _by_role(mine, plan)
    roles = {
        r: str(meta_of(w)["name"])
        for r in order
        for w in [by_role[r].get("Deployment") or by_role[r].get("LeaderWorkerSet")]
        if w is not None
    }
    ns_obj = next(
        (
            o
            for o in objects
            if o.get("kind") == "Namespace" and meta_of(o).get("name") == namespace
        ),
        None,
    )
    created_ns = ns_obj is not None and annotations_of(ns_obj).get(CREATED_BY_ANNOTATION) == name
    applied = _applied_in_order(name, objects, namespace, created_ns, by_role, order)
    entry_role, entry_svc, entry_port = _entry(plan, by_role, order)
    stamps = sorted(
        str(meta_of(o).get("creationTimestamp"))
        for o in mine
        if meta_of(o).get("creationTimestamp")
    )
    deployments = [w for r in order for k in WORKLOADS if (w := by_role[r].get(k)) is not None]
    return KubeDeployment(
        name=name,
        recipe=recipe or str(plan.get("recipe") or ""),
        namespace=namespace,
        created_namespace=created_ns,
        created=stamps[0] if stamps else "1970-01-01T00:00:00+00:00",
        objects=applied,
        roles=roles,
        entry_service=(
            str(meta_of(entry_svc)["name"])
            if entry_svc is not None
            else names.role_object_name(name, entry_role)
        ),
        entry_port=entry_port,
        served_model_name=_served_model_name(plan, by_role, order),
        ready=bool(deployments)
        and all(
            int(d.get("status", {}).get("readyReplicas") or 0)
            >= int(d.get("spec", {}).get("replicas", 1))
            for d in deployments
        ),
        plan=plan,
    )


def _one_namespace(name: str, mine: Sequence[Obj]) -> str:
    namespaces = sorted({str(meta_of(o).get("namespace", "")) for o in mine})
    if len(namespaces) > 1:
        raise UsageError(
            f"deployment {name} has objects in several namespaces ({', '.join(namespaces)}): "
            f"name one with -n, e.g. `-n {namespaces[0]}`."
        )
    return namespaces[0]


def _recipe_and_plan(mine: Sequence[Obj]) -> tuple[str, dict[str, Any]]:
    """The recipe and the plan ``up`` stored in the objects' annotations (the first found
    of each; the plan empty when none parses)."""
    plan: dict[str, Any] = {}
    recipe = ""
    for o in mine:
        ann = annotations_of(o)
        recipe = recipe or ann.get(RECIPE_ANNOTATION, "")
        if not plan and ann.get(PLAN_ANNOTATION):
            with contextlib.suppress(ValueError):
                loaded = json.loads(ann[PLAN_ANNOTATION])
                plan = loaded if isinstance(loaded, dict) else {}
    return recipe, plan


def _by_role(
    mine: Sequence[Obj], plan: dict[str, Any]
) -> tuple[dict[str, dict[str, Obj]], list[str]]:
    """The objects by role and kind, and the roles in the plan's order (then the usual
    order of roles, for a record without a plan)."""
    role_names = [str(r["name"]) for r in plan.get("roles", []) if isinstance(r, dict)]
    by_role: dict[str, dict[str, Obj]] = {}
    for o in mine:
        role = labels_of(o).get(COMPONENT_LABEL, "")
        by_role.setdefault(role, {})[str(o["kind"])] = o

    def rank(role: str) -> tuple[int, tuple[int, str]]:
        return (role_names.index(role) if role in role_names else len(role_names), _role_rank(role))

    return by_role, sorted(by_role, key=rank)


def _applied_in_order(
    name: str,
    objects: Sequence[Obj],
    namespace: str,
    created_ns: bool,
    by_role: dict[str, dict[str, Obj]],
    order: list[str],
) -> list[AppliedObject]:
    """The deployment's objects in apply order: its Namespace (when it created it), what
    the roles use, then each role's workload and Service."""
    applied: list[AppliedObject] = []
    if created_ns:
        applied.append(AppliedObject(apiVersion="v1", kind="Namespace", name=namespace))
    for kind in SUPPORT:  # what the roles use comes before them
        for o in objects:
            if (
                o.get("kind") == kind
                and labels_of(o).get(DEPLOYMENT_LABEL) == name
                and str(meta_of(o).get("namespace", "")) == namespace
            ):
                applied.append(_applied(o, namespace))
    for r in order:
        for kind in (*WORKLOADS, "Service"):
            found = by_role[r].get(kind)
            if found is not None:
                applied.append(_applied(found, namespace))
    return applied


def _entry(
    plan: dict[str, Any], by_role: dict[str, dict[str, Obj]], order: list[str]
) -> tuple[str, Obj | None, int]:
    """The entry role, its Service (None when it has none) and the Service's port."""
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
    return entry_role, entry_svc, entry_port


def _served_model_name(
    plan: dict[str, Any], by_role: dict[str, dict[str, Obj]], order: list[str]
) -> str:
    """The plan's served model name, or the first ``--served-model-name`` in an engine's
    command line."""
    served = str(plan.get("served_model_name") or "")
    if not served:
        for r in order:
            d = by_role[r].get("Deployment")
            for c in (
                (d or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
            ):
                argv = [str(a) for a in [*c.get("command", []), *c.get("args", [])]]
                served = served or flag_value(argv, "--served-model-name") or ""
    return served


def _applied(o: Obj, namespace: str) -> AppliedObject:
    kind = str(o["kind"])
    return AppliedObject(
        apiVersion=str(o.get("apiVersion") or API_VERSIONS.get(kind, "v1")),
        kind=kind,
        name=str(meta_of(o)["name"]),
        namespace=namespace,
    )


def deployments_found(objects: Sequence[Obj]) -> list[Found]:
    """Every servebook deployment the API objects (Deployments, LeaderWorkerSets and
    Services, shaped like the items of ``kubectl get deployments,services -o json``) carry
    the label of, one per (namespace, name), sorted; its roles from its workloads'
    component labels."""
    groups: dict[tuple[str, str], list[Obj]] = {}
    for o in objects:
        if o.get("kind") not in (*WORKLOADS, "Service"):
            continue
        name = labels_of(o).get(DEPLOYMENT_LABEL)
        if not name:
            continue
        groups.setdefault((str(meta_of(o).get("namespace", "")), name), []).append(o)
    out = []
    for (namespace, name), objs in sorted(groups.items()):
        recipe = next(
            (
                annotations_of(o)[RECIPE_ANNOTATION]
                for o in objs
                if RECIPE_ANNOTATION in annotations_of(o)
            ),
            "",
        )
        roles = sorted(
            {
                labels_of(o)[COMPONENT_LABEL]
                for o in objs
                if o.get("kind") in WORKLOADS and COMPONENT_LABEL in labels_of(o)
            },
            key=_role_rank,
        )
        out.append(Found(name, namespace, recipe, tuple(roles)))
    return out


def workload_name(plan: Plan, role: str, name: str) -> str:
    """The name of the object a role is: its Deployment's, or its LeaderWorkerSet's."""
    if plan.role(role).spans_nodes:
        return names.lws_name(name, role)
    return names.object_name(plan, role, name)


def with_plan(objects: list[Obj], plan: Plan, name: str) -> list[Obj]:
    """The objects, the entry role's workload (Deployment or LeaderWorkerSet) annotated
    with the Plan (for recovery)."""
    entry = workload_name(plan, plan.entry_role, name)
    out = []
    for o in objects:
        if o["kind"] in WORKLOADS and o["metadata"]["name"] == entry:
            meta = dict(o["metadata"])
            meta["annotations"] = {
                **meta.get("annotations", {}),
                PLAN_ANNOTATION: plan.model_dump_json(),
            }
            o = {**o, "metadata": meta}
        out.append(o)
    return out


# --- finding a deployment in the cluster -----------------------------------------------------


def cluster_objects(api: Any, name: str | None, namespace: str | None) -> list[Obj]:
    """servebook's objects (of deployment ``name``, or of every deployment): what the roles
    use (ConfigMaps, the router's ServiceAccount, Role and RoleBinding), the roles'
    Deployments, LeaderWorkerSets (where the cluster serves that kind) and Services, in
    ``namespace`` or, when None, every namespace; with the Namespace of each found when
    it can be read.

    A tenant may not list across namespaces: then, as kubectl does without ``-n``, the
    kubeconfig context's namespace is searched instead, and a note on stderr says so."""
    selector = names.deployment_selector(name) if name else DEPLOYMENT_LABEL
    try:
        found = _labelled(api, namespace, selector)
    except UsageError as e:
        if namespace is not None or "refused" not in str(e):
            raise
        context = str(getattr(api, "namespace", None) or "default")
        try:
            found = _labelled(api, context, selector)
        except UsageError:
            raise UsageError(
                f"{e} Listing across namespaces is not allowed with these credentials, nor "
                f"in namespace {context} (the kubeconfig context's): give the deployment's "
                "namespace with -n NAMESPACE."
            ) from e
        from servebook.console import err

        err.print(
            f"note: listing across namespaces is not allowed with these credentials; "
            f"searched namespace {context} (the kubeconfig context's). Give -n NAMESPACE "
            "for another.",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    for ns in sorted({str(meta_of(o).get("namespace", "")) for o in found}):
        with contextlib.suppress(UsageError):  # a namespace we may not read: not ours
            got = namespace_exists(api, ns)
            if got is not None:
                found.append({"apiVersion": "v1", "kind": "Namespace", **got})
    return found


def _labelled(api: Any, namespace: str | None, selector: str) -> list[Obj]:
    found = [
        o
        for kind in (*SUPPORT, "Deployment", "Service")
        for o in list_objects(api, kind, namespace, selector)
    ]
    return found + list_if_served(api, "LeaderWorkerSet", namespace, selector)


def find_deployment(api: Any, name: str, namespace: str | None = None) -> KubeDeployment | None:
    """Deployment ``name`` as the cluster has it (``recover_record`` over its labelled
    objects), in ``namespace``, else the recorded namespace, else any namespace; the local
    record fills in what the cluster cannot say (the plan of an older apply).  Without
    labelled objects, the local record (an older servebook's apply, or an interrupted up)."""
    local = read_state(name)
    ns = namespace or (local.namespace if local else None)
    dep = recover_record(name, cluster_objects(api, name, ns))
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
        got = namespace_exists(api, namespace)
        return annotations_of(got).get(CREATED_BY_ANNOTATION) if got else None
    return None


def not_found(name: str, namespace: str | None) -> UsageError:
    where = f"namespace {namespace}" if namespace else "any namespace"
    return UsageError(
        f"no Kubernetes deployment named {name!r} is recorded on this machine or labelled "
        f"{DEPLOYMENT_LABEL}={name} in {where}. `servebook status --backend kubernetes` "
        "lists the deployments the cluster has."
    )
