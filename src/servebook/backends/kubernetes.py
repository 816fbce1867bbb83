"""Kubernetes backend: apply a Plan's rendered objects and wait, boundedly, for them.

``up`` renders the Plan (``kube.manifests``), checks every object against the Kubernetes
schema, applies them in order through the API (kr8s: create, or patch what exists, so a
second ``up`` is idempotent), records what it applied in the deployment's state
directory, then polls each role's Pods and the namespace's events.  The verdict is
``kube.rollout``'s: it fails as soon as the cluster says the rollout cannot succeed (an
absent weights directory, an image that cannot be pulled, a crashed engine, a Pod the
scheduler cannot place for two minutes), with that evidence and, for a crashed engine, the
last lines of its previous log and any known failure signature.  ``--timeout`` bounds the
whole wait; a timeout is a failure with the last state of every role.

``down`` deletes exactly the objects ``up`` applied (the Namespace only when ``up``
created it).  Every API request has a timeout.

``open_view`` is how verify, bench and run reach the deployment: a port-forward that
servebook opens and holds (``kube.portforward``) to each role's Ready Pod for the length of
the command, and the command lines and environment read from those Pods.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from servebook.backends.base import Down, Ready
from servebook.backends.local import KUBE_STATE_FILE as STATE_FILE
from servebook.backends.local import UpFailed, deployments_dir, state_dir_for
from servebook.deployment import DeploymentView, RoleView
from servebook.engines import vllm
from servebook.files import read_model, write_atomic
from servebook.findings import Finding, UsageError
from servebook.kube import manifests
from servebook.kube.rollout import RoleState, overall, role_state
from servebook.kube.validate import schema_errors
from servebook.recipe.plan import Plan

POLL_S = 5.0
REQUEST_TIMEOUT_S = 30.0


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


def _api(request_timeout_s: float = REQUEST_TIMEOUT_S, connect_timeout_s: float = 15.0) -> Any:
    """A kr8s client for the current KUBECONFIG/context, with a timeout on every request.
    Connecting (kr8s asks the server for its version first) is bounded too: a server that
    never answers is "cannot reach", exit 2, not a hang."""
    from servebook.kube.snapshot import ClusterUnreachable, _credentials_problem, _describe

    problem = _credentials_problem(None)
    if problem:
        raise ClusterUnreachable(
            f"cannot reach the cluster: {problem}. Point KUBECONFIG at the cluster's config."
        )
    import httpx
    import kr8s

    got: list[Any] = []
    failed: list[BaseException] = []

    def connect() -> None:
        try:
            got.append(kr8s.api())
        except BaseException as e:
            failed.append(e)

    worker = threading.Thread(target=connect, name="servebook-kube-connect", daemon=True)
    worker.start()
    worker.join(connect_timeout_s)
    if failed or not got:
        why = (
            _describe(failed[0], "connecting")
            if failed
            else f"no answer within {connect_timeout_s:g} s"
        )
        raise ClusterUnreachable(
            f"cannot reach the cluster: {why}. Check `kubectl get nodes` works with the same "
            "KUBECONFIG and context."
        ) from (failed[0] if failed else None)
    api = got[0]
    api.timeout = httpx.Timeout(request_timeout_s)
    return api


def _call(doing: str, fn: Callable[[], Any]) -> Any:
    """One request to the cluster; any failure is "could not run" (exit 2) naming it."""
    from servebook.kube.snapshot import ClusterUnreachable, _describe

    try:
        return fn()
    except UsageError:
        raise
    except Exception as e:
        raise ClusterUnreachable(f"the cluster request failed: {_describe(e, doing)}") from e


def _raw(obj: Any) -> dict[str, Any]:
    return dict(obj.raw) if hasattr(obj, "raw") else dict(obj)


def _list(
    api: Any, kind: str, namespace: str, selector: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    return [_raw(o) for o in api.get(kind, namespace=namespace, label_selector=selector)]


def apply(api: Any, objects: list[dict[str, Any]], say: Callable[[str], None]) -> None:
    """Create each object, or patch it where it exists (an idempotent apply)."""
    from kr8s.objects import object_from_spec

    for spec in objects:
        obj = object_from_spec(spec, api=api)
        what = f"{spec['kind']}/{spec['metadata']['name']}"
        if _call(f"reading {what}", obj.exists):
            _call(f"patching {what}", partial(obj.patch, spec))
            say(f"configured {what}")
        else:
            _call(f"creating {what}", obj.create)
            say(f"created {what}")


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
    ns = dep.namespace
    events = _call(f"listing events in {ns}", partial(_list, api, "events", ns))
    out = []
    for role, deployment_name in dep.roles.items():
        selector = manifests.selector_for(dep.recipe, role)
        pods = _call(
            f"listing the Pods of {role}",
            partial(_list, api, "pods", ns, selector),
        )
        out.append(
            role_state(role, deployment_name, pods, events, now=datetime.now(UTC), started=started)
        )
    return out


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
    objects = manifests.render(plan)
    errors = schema_errors(objects)
    if errors:
        raise UsageError(
            "the rendered objects do not match the Kubernetes schema:\n" + "\n".join(errors)
        )
    k8s = manifests.settings(plan)
    api = _api()
    from kr8s.objects import Namespace

    existed = _call(f"reading Namespace/{k8s.namespace}", Namespace(k8s.namespace, api=api).exists)
    entry = plan.role(plan.entry_role)
    started = datetime.now(UTC)
    dep = KubeDeployment(
        name=name,
        recipe=plan.recipe,
        namespace=k8s.namespace,
        created_namespace=not existed and any(o["kind"] == "Namespace" for o in objects),
        created=started.isoformat(),
        objects=[
            AppliedObject(
                apiVersion=o["apiVersion"],
                kind=o["kind"],
                name=o["metadata"]["name"],
                namespace=o["metadata"].get("namespace"),
            )
            for o in objects
        ],
        roles={r.name: manifests.object_name(plan, r.name) for r in plan.roles},
        entry_service=manifests.object_name(plan, entry.name),
        entry_port=manifests.ROUTER_PORT if entry.kind == "router" else manifests.ENGINE_PORT,
        served_model_name=plan.served_model_name,
        plan=plan.model_dump(mode="json"),
    )
    write_state(dep)  # before applying: `down` can clean up an interrupted `up`
    try:
        apply(api, objects, say)
    except UsageError as e:
        raise type(e)(
            f"{e} Whatever was applied before it is recorded: `servebook down {name}` deletes it."
        ) from e
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


def down(name: str) -> dict[str, str]:
    """Delete what ``up`` applied, in reverse order; idempotent."""
    dep = read_state(name)
    if dep is None:
        return {}
    api = _api()
    from kr8s.objects import object_from_spec

    result: dict[str, str] = {}
    for o in reversed(dep.objects):
        what = f"{o.kind}/{o.name}"
        if o.kind == "Namespace" and not dep.created_namespace:
            result[what] = "kept (it existed before up)"
            continue
        spec: dict[str, Any] = {
            "apiVersion": o.apiVersion,
            "kind": o.kind,
            "metadata": {"name": o.name},
        }
        if o.namespace:
            spec["metadata"]["namespace"] = o.namespace
        obj = object_from_spec(spec, api=api)
        if _call(f"reading {what}", obj.exists):
            _call(f"deleting {what}", partial(obj.delete, propagation_policy="Foreground"))
            result[what] = "deleted"
        else:
            result[what] = "not found"
    state_path(name).unlink(missing_ok=True)
    return result


def status(name: str) -> dict[str, Any]:
    dep = read_state(name)
    if dep is None:
        raise UsageError(f"no Kubernetes deployment named {name!r} is recorded.")
    states = _states(_api(), dep, datetime.fromisoformat(dep.created))
    roles = [
        {
            "name": s.role,
            "kind": "router" if s.role == "router" else "engine",
            "state": s.state,
            "ok": s.state == "ready",
            "summary": s.summary,
            "pod": s.pod,
            "evidence": s.evidence,
        }
        for s in states
    ]
    return {
        "name": dep.name,
        "backend": dep.backend,
        "recipe": dep.recipe,
        "namespace": dep.namespace,
        "entry": f"service/{dep.entry_service} port {dep.entry_port} in namespace {dep.namespace}",
        "roles": roles,
    }


# --- the deployment view: port-forwards held for the length of a command ------------------


def _ready_pod(api: Any, dep: KubeDeployment, role: str) -> dict[str, Any]:
    """The role's newest Ready Pod that is not being deleted; unusable (exit 2) without one."""
    pods = _call(
        f"listing the Pods of {role}",
        partial(_list, api, "pods", dep.namespace, manifests.selector_for(dep.recipe, role)),
    )
    ready = [
        p
        for p in pods
        if not p.get("metadata", {}).get("deletionTimestamp")
        and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in p.get("status", {}).get("conditions", [])
        )
    ]
    if not ready:
        raise UsageError(
            f"deployment {dep.name}: role {role} has no Ready Pod in namespace "
            f"{dep.namespace} ({len(pods)} Pod(s) found). Run `servebook status {dep.name}`."
        )
    return max(ready, key=lambda p: str(p["metadata"].get("creationTimestamp", "")))


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
def open_view(name: str, *, forward_timeout_s: float = 10.0) -> Iterator[DeploymentView]:
    """The deployment as a command reaches it: a port-forward servebook holds to each
    role's Ready Pod (engine API and metrics; router API and metrics) for the body of the
    with-block.  A forward that dies or a Pod replaced meanwhile makes that role not alive,
    with the reason in its description; the view's users fail naming the role."""
    from servebook.kube.portforward import Forwards, Kr8sDialer, kr8s_pod_identity

    dep = read_state(name)
    if dep is None:
        raise UsageError(f"no Kubernetes deployment named {name!r} is recorded.")
    if not dep.plan:
        raise UsageError(
            f"deployment {name} was recorded by an older servebook without its plan: "
            f"`servebook down {name}`, then up again."
        )
    plan = Plan.model_validate(dep.plan)
    api = _api()
    pods = {r.name: _ready_pod(api, dep, r.name) for r in plan.roles}
    with Forwards(
        Kr8sDialer(api), pod_identity=kr8s_pod_identity(api), timeout_s=forward_timeout_s
    ) as fw:
        roles: list[RoleView] = []
        for r in plan.roles:
            pod = pods[r.name]
            pod_name = str(pod["metadata"]["name"])
            node = pod.get("spec", {}).get("nodeName", "?")
            container = _container(pod, "router" if r.kind == "router" else "engine")
            api_url = fw.open(
                role=r.name,
                pod=pod_name,
                namespace=dep.namespace,
                remote_port=manifests.ROUTER_PORT if r.kind == "router" else manifests.ENGINE_PORT,
            )
            metrics_url = (
                fw.open(
                    role=r.name,
                    pod=pod_name,
                    namespace=dep.namespace,
                    remote_port=manifests.ROUTER_METRICS_PORT,
                )
                if r.kind == "router"
                else api_url
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
        gpus = sum(manifests.gpu_count(r) for r in plan.engine_roles)
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
        budget = manifests.settings(plan).startup_timeout_s + 600.0
        dep = up(plan, name=name, timeout_s=timeout_s if timeout_s is not None else budget, say=say)
        return Ready(
            dep.name,
            f"ready: service/{dep.entry_service} port {dep.entry_port} in namespace "
            f"{dep.namespace} (model '{dep.served_model_name}'). `servebook verify {dep.name}` "
            f"and `servebook bench {dep.name}` reach it through port-forwards of their own.",
        )

    def status(self, name: str) -> dict[str, Any]:
        return status(name)

    def down(self, name: str) -> Down:
        return Down(name, down(name))

    def open(self, name: str) -> contextlib.AbstractContextManager[DeploymentView]:
        return open_view(name)
