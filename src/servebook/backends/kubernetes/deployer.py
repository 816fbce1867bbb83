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
deployment is left in it), and waits, bounded and saying what is left, until they are
gone: a DELETE only starts a deletion (``kubernetes.settle``).  ``up`` likewise waits for a
namespace or object of its own that an earlier ``down`` is still deleting before it
applies anything.  Every API request goes through kr8s's ``Api.call_api`` and has a
timeout.

``open_view`` is how verify, ``bench --via port-forward`` and run's verify reach the
deployment: a port-forward that servebook opens and holds (``kube.portforward``) to each
role's Ready Pod for the length of the command, and the command lines and environment read
from those Pods.  A sweep (``bench NAME``, run's) runs in the cluster instead
(``job_site``).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from rich.markup import escape

from servebook.backends.base import Down, Found, Ready, UpFailed
from servebook.backends.kubernetes.record import (
    AppliedObject,
    KubeDeployment,
    cluster_objects,
    deployments_found,
    find_deployment,
    not_found,
    read_state,
    recorded_names,
    state_path,
    with_plan,
    workload_name,
    write_state,
)
from servebook.backends.kubernetes.settle import Ref, grace_bound_s, wait_gone, wait_settled
from servebook.backends.kubernetes.view import open_view
from servebook.deployment.site import LoadSite
from servebook.deployment.view import DeploymentView
from servebook.engines import vllm
from servebook.errors import UsageError
from servebook.findings import Finding
from servebook.kube import client as kube_client
from servebook.kube import manifests, names
from servebook.kube.names import CREATED_BY_ANNOTATION, DEPLOYMENT_LABEL
from servebook.kube.objects import annotations_of, labels_of, meta_of
from servebook.kube.resources import (
    NotServed,
    apply,
    get,
    list_objects,
    namespace_exists,
    request,
    what_of,
    where_of,
)
from servebook.kube.rollout import RoleState, overall, restart_counts, role_state
from servebook.kube.rollout_groups import group_state
from servebook.kube.validate import schema_errors
from servebook.preflight.admission import required_access
from servebook.preflight.live import require_access
from servebook.recipe.plan import Plan

POLL_S = 5.0
REQUEST_TIMEOUT_S = 30.0
# How long up waits for what an earlier down is still deleting (a Terminating namespace).
SETTLE_S = 900.0

Obj = dict[str, Any]


def _api(request_timeout_s: float = REQUEST_TIMEOUT_S, connect_timeout_s: float = 15.0) -> Any:
    """A kr8s client for the current KUBECONFIG/context (``kube.client.connect``: a timeout
    on every request, and connecting bounded too)."""
    return kube_client.connect(
        request_timeout_s=request_timeout_s, connect_timeout_s=connect_timeout_s
    )


def live_objects(api: Any, objects: list[Obj]) -> dict[str, Obj | None]:
    """Each object (by ``what_of``) as the cluster has it, None where it has not."""
    return {
        what_of(o): get(
            api, o["apiVersion"], o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]
        )
        for o in objects
    }


def check_ownership(
    api: Any,
    objects: list[Obj],
    name: str,
    generations: dict[str, int] | None = None,
    live: dict[str, Obj | None] | None = None,
) -> dict[str, bool]:
    """Whether each object (by ``what_of``) exists (its ``metadata.generation`` into
    ``generations``; ``live``: as ``live_objects`` read them); unusable (exit 2), before
    anything is applied, when one exists and is not deployment ``name``'s: servebook never
    adopts an object of another deployment or one it did not make."""
    existed: dict[str, bool] = {}
    live = live if live is not None else live_objects(api, objects)
    for spec in objects:
        what = what_of(spec)
        got = live.get(what)
        existed[what] = got is not None
        if got is None:
            continue
        if generations is not None:
            generations[what] = int(meta_of(got).get("generation") or 0)
        owner = labels_of(got).get(DEPLOYMENT_LABEL)
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
    ns_obj = namespace_exists(api, k8s.namespace)
    require_access(
        api,
        lambda minor: required_access(objects, k8s.namespace, ns_obj is not None, minor),
        k8s.namespace,
        f"up {name}",
    )
    workloads = [o for o in objects if o["kind"] != "Namespace"]
    # Read even into an absent namespace: a kind the cluster does not serve is refused
    # here (``NotServed``), before anything is applied.
    live = live_objects(api, workloads)
    there = [o for o in live.values() if o is not None]
    if wait_settled(api, k8s.namespace, ns_obj, there, timeout_s=SETTLE_S, say=say):
        ns_obj = namespace_exists(api, k8s.namespace)
        live = live_objects(api, workloads)
    created_ns = any(o["kind"] == "Namespace" for o in objects) and (
        ns_obj is None or annotations_of(ns_obj).get(CREATED_BY_ANNOTATION) == name
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
    before: dict[str, int] = {}
    existed = check_ownership(api, workloads, name, before, live)
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
        roles={r.name: workload_name(plan, r.name, name) for r in plan.roles},
        entry_service=names.object_name(plan, entry.name, name),
        entry_port=names.ROUTER_PORT if entry.kind == "router" else names.ENGINE_PORT,
        served_model_name=plan.served_model_name,
        plan=plan.model_dump(mode="json"),
        restart_baseline=restart_counts(
            list_objects(api, "Pod", k8s.namespace, names.deployment_selector(name))
            if ns_obj is not None
            else []
        ),
    )
    write_state(dep)  # before applying: `down` can clean up an interrupted `up`
    try:
        answers = apply(api, to_apply, say, existed)
    except UsageError as e:
        raise type(e)(
            f"{e} Whatever was applied before it is recorded: `servebook down {name}` deletes it."
        ) from e
    dep.changed = [
        str(meta_of(a).get("name"))
        for o, a in zip(to_apply, answers, strict=True)
        if meta_of(a).get("generation") is not None
        and int(meta_of(a)["generation"]) != before.get(what_of(o), 0)
    ]
    write_state(dep)
    return dep


def list_deployments(namespace: str | None = None) -> list[Found]:
    """servebook's deployments in the cluster, found by their label."""
    return deployments_found(cluster_objects(_api(), None, namespace))


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
    events = list_objects(api, "Event", ns)
    selector = names.deployment_selector(dep.name)
    deployments = {
        str(meta_of(d).get("name")): d for d in list_objects(api, "Deployment", ns, selector)
    }
    replicasets = list_objects(api, "ReplicaSet", ns, selector)
    plan = Plan.model_validate(dep.plan) if dep.plan else None
    groups = [r for r in (plan.roles if plan else []) if r.spans_nodes]
    sets = (
        {str(meta_of(o).get("name")): o for o in list_objects(api, "LeaderWorkerSet", ns, selector)}
        if groups
        else {}
    )
    out = []
    for role, deployment_name in dep.roles.items():
        pods = list_objects(api, "Pod", ns, names.selector_for(dep.name, role))
        group = next((r for r in groups if r.name == role), None)
        judge = (
            # A LeaderWorkerSet: ready when every member of every group is.
            partial(
                group_state,
                replicas=group.replicas,
                size=group.nodes_per_replica,
                lws=sets.get(deployment_name),
                changed=deployment_name in dep.changed,
            )
            if group is not None
            else partial(
                role_state, deployment=deployments.get(deployment_name), replicasets=replicasets
            )
        )
        out.append(
            judge(
                role,
                deployment_name,
                pods,
                events,
                now=datetime.now(UTC),
                started=started,
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
    poll_s: float | None = None,
) -> KubeDeployment:
    name = name or plan.recipe
    poll_s = POLL_S if poll_s is None else poll_s
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
        # the last poll at the deadline, not a whole poll past it (--timeout 2 took 5 s)
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def down(
    name: str,
    namespace: str | None = None,
    *,
    say: Callable[[str], None] = lambda s: None,
    wait_s: float | None = None,
) -> dict[str, str]:
    """Delete deployment ``name``'s objects, found in the cluster by its label (and in the
    local record), in reverse apply order, and wait until they are gone (``kubernetes.settle``:
    bounded by ``wait_s``, default the longest grace period of its Pods plus a margin); an
    object still there at the bound is reported "still terminating" and the record is
    kept.  Idempotent.  An object carrying another deployment's label is never touched; the
    Namespace goes only when this deployment created it and no other servebook deployment
    is left in it."""
    local = read_state(name)
    api = _api()
    dep = find_deployment(api, name, namespace)
    if dep is None:
        return {}
    result: dict[str, str] = {}
    deleted_any = False
    selector = names.deployment_selector(name)
    bound = (
        wait_s
        if wait_s is not None
        else grace_bound_s(list_objects(api, "Pod", dep.namespace, selector))
    )
    deleted: list[Ref] = []
    for o in reversed(dep.objects):
        what = o.what
        if o.kind == "Namespace":
            continue
        try:
            got = get(api, o.apiVersion, o.kind, o.namespace, o.name)
        except NotServed:
            result[what] = f"not found (the cluster does not serve {o.kind} any more)"
            continue
        if got is None:
            result[what] = "not found"
            continue
        owner = labels_of(got).get(DEPLOYMENT_LABEL)
        if owner is not None and owner != name:
            result[what] = f"kept (it belongs to deployment {owner})"
            continue
        request(
            api,
            "DELETE",
            where_of(o.apiVersion, o.kind, o.namespace, o.name),
            f"deleting {what}",
            body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"},
            missing_ok=True,
        )
        result[what] = "deleted"
        deleted.append(Ref(o.apiVersion, o.kind, o.name, o.namespace))
        deleted_any = True
    ns_what = f"Namespace/{dep.namespace}"
    if dep.created_namespace:
        others = sorted(
            {
                f.name
                for f in deployments_found(cluster_objects(api, None, dep.namespace))
                if f.name != name
            }
        )
        if others:
            result[ns_what] = f"kept (deployment {', '.join(others)} is in it)"
        else:
            gone = request(
                api,
                "DELETE",
                where_of("v1", "Namespace", None, dep.namespace),
                f"deleting {ns_what}",
                body={
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "propagationPolicy": "Foreground",
                },
                missing_ok=True,
            )
            result[ns_what] = "deleted" if gone is not None else "not found"
            if gone is not None:
                deleted.append(Ref("v1", "Namespace", dep.namespace, None))
    elif any(o.kind == "Namespace" for o in dep.objects) or deleted_any:
        result[ns_what] = "kept (this deployment did not create it)"
    left = wait_gone(api, deleted, timeout_s=bound, say=say, pods=(dep.namespace, selector))
    for r in deleted:
        if any(x.startswith(r.what + " (") for x in left):
            result[r.what] = f"still terminating after {bound:.0f} s"
    if left:
        result["left"] = "; ".join(left)
    elif local is not None and local.namespace == dep.namespace:
        state_path(name).unlink(missing_ok=True)
    return result


def status(name: str, namespace: str | None = None) -> dict[str, Any]:
    api = _api()
    dep = find_deployment(api, name, namespace)
    if dep is None:
        raise not_found(name, namespace)
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


class KubernetesBackend:
    """The ``Deployer`` for a Kubernetes cluster (module docstring)."""

    name = "kubernetes"
    title = "Kubernetes"
    recipes_hint = "Use a vllm-* or tiny-* recipe (`servebook recipes`), or --backend local."
    up_cost = (
        "for a GPU deployment of a large model 10-40 minutes (image pull, weight load from "
        "the node's disk, compilation) before the first request"
    )
    loads_here = False  # a load Job beside the engines (``job_site``)

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
        from servebook.console import err

        def say(line: str) -> None:
            err.print(escape(line), highlight=False, soft_wrap=True)

        done = down(name, namespace, say=say)
        return Down(name, done, complete="left" not in done)

    def found(self, namespace: str | None = None) -> list[Found]:
        """servebook's deployments in the cluster (by label), not this machine's records."""
        return list_deployments(namespace)

    def open(
        self, name: str, namespace: str | None = None
    ) -> contextlib.AbstractContextManager[DeploymentView]:
        return open_view(name, namespace=namespace)

    def load_site(self, name: str, namespace: str | None = None) -> LoadSite:
        """A load Job beside the engines, so the measuring path crosses no port-forward."""
        from servebook.backends.kubernetes.job_site import JobSite, own_source

        return JobSite(lambda: own_source(name, namespace))
