"""A stand-in Kubernetes API server over real HTTP, for unit tests of the Kubernetes code
that run in milliseconds.  Everything it does that the test plane also shows has a plane
test (tests/cluster; the README's "What has run on what" lists what runs only here): where
the two disagreed, the plane was right and this was changed to answer as it does.

Objects in memory; ``GET /version`` (``minor``: 1.31 by default, whose port-forward needs
``get`` alone, ``create`` too from 35); GET, LIST (``labelSelector``), server-side apply
(``application/apply-patch+yaml``, ``fieldManager``), POST and DELETE, with ``Status``
bodies as the API server words them.  ``requests`` records what it saw.  A test arranges:
``forbidden`` (method and path prefix answered 403); ``ready_pods`` (a Deployment's
ReplicaSet and Ready Pods, as its controller and kubelet make them); ``forward_to``
(``ROLE:PORT`` or ``pod/NAME:PORT``: the local address a ``v4.channel.k8s.io``
port-forward relays to; none, the kubelet's error-channel error);
``replace_pod``; ``kubelet`` (runs a created Pod: a pull of ``pull_s`` or ``pull_error``,
``run_s`` of running, ``logs``); ``denied`` and ``grant`` (access reviews and RBAC,
``kube_standin_rules``); ``refuse`` (a dry run refused as a quota or webhook would);
``serves_lws``.  Names, labels, selectors and ServiceAccounts are validated as the API
server does, dry runs included.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from tests.unit import kube_standin_rules as rules
from tests.unit.kube_standin_rules import rbac_allows

#: PyYAML's safe loader in C where it has one: the same documents as ``yaml.safe_load``
#: (the resolver is the same), ~40 times faster on an apply's body (a load Job's ConfigMap
#: of ~360 KB took 0.2 s of CPU through the pure-Python scanner).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _body(text: str) -> Any:
    """An apply's body (YAML, or JSON, which YAML reads), as the server reads it."""
    return yaml.load(text, Loader=_LOADER)


Obj = dict[str, Any]
# plural -> (apiVersion, kind, group for Status details)
KINDS = {
    "namespaces": ("v1", "Namespace", ""),
    "services": ("v1", "Service", ""),
    "configmaps": ("v1", "ConfigMap", ""),
    "pods": ("v1", "Pod", ""),
    "events": ("v1", "Event", ""),
    "deployments": ("apps/v1", "Deployment", "apps"),
    "replicasets": ("apps/v1", "ReplicaSet", "apps"),
    "serviceaccounts": ("v1", "ServiceAccount", ""),
    "roles": ("rbac.authorization.k8s.io/v1", "Role", "rbac.authorization.k8s.io"),
    "rolebindings": ("rbac.authorization.k8s.io/v1", "RoleBinding", "rbac.authorization.k8s.io"),
    "leaderworkersets": (
        "leaderworkerset.x-k8s.io/v1",
        "LeaderWorkerSet",
        "leaderworkerset.x-k8s.io",
    ),
    "secrets": ("v1", "Secret", ""),
    "jobs": ("batch/v1", "Job", "batch"),
    "nodes": ("v1", "Node", ""),
    "customresourcedefinitions": (
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        "apiextensions.k8s.io",
    ),
}
PORTFORWARD_PROTOCOL = "v4.channel.k8s.io"
REVISION = "deployment.kubernetes.io/revision"


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]


@dataclass
class Kubelet:
    """How created Pods run (see the module's docstring)."""

    pull_s: float = 0.0
    run_s: float = 0.0
    logs: Callable[[Obj], str] = lambda pod: ""
    pull_error: str = ""


@dataclass
class StandIn:
    url: str = ""
    # (plural, namespace or "", name) -> object
    objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    # (method, path prefix) pairs answered 403; a prefix ending in "$" is one exact path
    forbidden: list[tuple[str, str]] = field(default_factory=list)
    ready_pods: bool = False
    # Whether the LeaderWorkerSet CRD is installed (its API answers 404 otherwise).
    serves_lws: bool = True
    forward_to: dict[str, tuple[str, int]] = field(default_factory=dict)
    kubelet: Kubelet | None = None
    # (verb, resource, subresource) the access reviews deny
    denied: set[tuple[str, str, str]] = field(default_factory=set)
    # "Kind/name" -> (code, reason, message) for a dry run
    refuse: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    # the Pods created through POST, ever: (namespace, name)
    created_pods: list[tuple[str, str]] = field(default_factory=list)
    # deletions and rollouts due at the next request (the Lifecycle section)
    life: Lifecycle = field(default_factory=lambda: Lifecycle())
    # RBAC (see "Authorization" below): the rules of the Roles and ClusterRoles granted to
    # the test's user; None: everything is allowed but ``denied``.
    rbac: list[Obj] | None = None
    # The server's minor version (``/version``); from 35 a port-forward's WebSocket upgrade
    # is also authorized as ``create``.
    minor: int = 31
    _started: dict[tuple[str, str], float] = field(default_factory=dict)
    _rv: Iterator[int] = field(default_factory=lambda: itertools.count(100))

    def grant(self, role: Obj) -> None:
        """Bind a Role or ClusterRole (its ``rules``) to the test's user."""
        self.rbac = [*(self.rbac or []), *copy.deepcopy(role.get("rules") or [])]

    def pods_of(self, role: str) -> list[Obj]:
        return [
            o
            for (p, _, _), o in sorted(self.objects.items())
            if p == "pods"
            and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == role
        ]

    def replace_pod(self, role: str) -> str:
        """Delete the role's Pod and start another from the same ReplicaSet (a new uid and
        name, as after an eviction); returns the new Pod's name."""
        (old,) = self.pods_of(role)
        meta = old["metadata"]
        del self.objects[("pods", meta["namespace"], meta["name"])]
        rs = next(
            o
            for (p, _, _), o in self.objects.items()
            if p == "replicasets"
            and any(r["uid"] == o["metadata"]["uid"] for r in meta["ownerReferences"])
        )
        return _start_pod(self, rs, suffix="new")

    def put(self, obj: Obj) -> None:
        """Put an object as if someone else had made it."""
        kind = obj["kind"]
        plural = next(p for p, (_, k, _) in KINDS.items() if k == kind)
        meta = obj["metadata"]
        self._stamp(obj)
        self.objects[(plural, meta.get("namespace", ""), meta["name"])] = obj

    def names(self, plural: str, namespace: str = "") -> list[str]:
        """The names a list would show now (what the controllers have done since the last
        request included: a deleted object whose grace has passed is gone)."""
        _advance(self)
        return sorted(n for (p, ns, n) in self.objects if p == plural and ns == namespace)

    def _stamp(self, obj: Obj) -> None:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        meta["resourceVersion"] = str(next(self._rv))


def _status(code: int, reason: str, message: str, details: Obj | None = None) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details or {},
        "code": code,
    }
    return web.json_response(body, status=code)


def _resource(plural: str) -> str:
    group = KINDS[plural][2]
    return f"{plural}.{group}" if group else plural


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k.rstrip("=")) != v:
                return False
        elif term not in labels:
            return False
    return True


def _app(st: StandIn) -> web.Application:
    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        st.requests.append(
            Seen(
                request.method,
                request.path,
                dict(request.query),
            )
        )
        _advance(st)
        if "/leaderworkerset.x-k8s.io/" in request.path and not st.serves_lws:
            return _not_served()
        for method, prefix in st.forbidden:
            exact = prefix.endswith("$")  # "PATH$": that path alone, not what is below it
            if request.method == method and (
                request.path == prefix[:-1] if exact else request.path.startswith(prefix)
            ):
                verb = {"GET": "get", "PATCH": "patch", "DELETE": "delete", "POST": "create"}[
                    method
                ]
                return _status(
                    403,
                    "Forbidden",
                    f'{request.path} is forbidden: User "tester" cannot {verb} this resource',
                )
        refused = _authorize(st, request)
        if refused is not None:
            return refused
        return await handler(request)

    async def version(request: web.Request) -> web.Response:
        minor = str(st.minor)
        return web.json_response(
            {"major": "1", "minor": minor, "gitVersion": f"v1.{minor}.2", "platform": "linux/amd64"}
        )

    def where(request: web.Request) -> tuple[str, str, str | None]:
        m = request.match_info
        return m["plural"], m.get("ns", ""), m.get("name")

    async def list_(request: web.Request) -> web.Response:
        plural, ns, _ = where(request)
        if plural not in KINDS:
            return _status(404, "NotFound", "the server could not find the requested resource")
        selector = request.query.get("labelSelector", "")
        only = request.query.get("fieldSelector", "").removeprefix("metadata.name=")
        items = [
            copy.deepcopy(o)
            for (p, n, name), o in sorted(st.objects.items())
            if p == plural
            and (not ns or n == ns)
            and (not only or name == only)
            and _matches(o["metadata"].get("labels") or {}, selector)
        ]
        for i in items:  # the real server's list items carry no kind/apiVersion
            i.pop("kind", None)
            i.pop("apiVersion", None)
        api_version, kind, _ = KINDS[plural]
        return web.json_response(
            {
                "kind": f"{kind}List",
                "apiVersion": api_version,
                "metadata": {"resourceVersion": "99"},
                "items": items,
            }
        )

    def not_found(plural: str, name: str) -> web.Response:
        return _status(
            404,
            "NotFound",
            f'{_resource(plural)} "{name}" not found',
            {"name": name, "group": KINDS[plural][2], "kind": plural},
        )

    async def get(request: web.Request) -> web.Response:
        plural, ns, name = where(request)
        obj = st.objects.get((plural, ns, name or ""))
        return web.json_response(obj) if obj else not_found(plural, name or "")

    async def delete(request: web.Request) -> web.Response:
        plural, ns, name = where(request)
        text = await request.text()
        options = json.loads(text) if text else {}
        policy = request.query.get("propagationPolicy") or options.get("propagationPolicy", "")
        obj = _delete(st, (plural, ns, name or ""), policy)
        if obj is None:
            return not_found(plural, name or "")
        return web.json_response(obj)

    async def apply(request: web.Request) -> web.Response:
        plural, ns, name = where(request)
        name = name or ""
        if request.query.get("dryRun") == "All":
            return await dry_run(request, _body(await request.text()), plural, ns)
        if request.content_type != "application/apply-patch+yaml":
            return _status(
                415, "UnsupportedMediaType", "the body of the request was in an unknown format"
            )
        manager = request.query.get("fieldManager")
        if not manager:
            return _status(
                422, "Invalid", "PatchOptions.meta.k8s.io is invalid: fieldManager: Required"
            )
        body = _body(await request.text())
        api_version, kind, _ = KINDS[plural]
        if body.get("kind") != kind or body.get("metadata", {}).get("name") != name:
            return _status(400, "BadRequest", "the name or kind of the object does not match")
        invalid = validate(st, plural, ns, body)
        if invalid is not None:
            return invalid
        key = (plural, ns, name)
        old = st.objects.get(key)
        if old is None and (refused := _refuse_namespace(st, plural, ns, name)) is not None:
            return refused
        obj = copy.deepcopy(body)
        if plural == "secrets" and "stringData" in obj:  # the API server stores only data
            data = obj.setdefault("data", {})
            for k, v in obj.pop("stringData").items():
                data[k] = base64.b64encode(str(v).encode()).decode()
        meta = obj["metadata"]
        if ns:
            meta["namespace"] = ns
        if old is not None:
            for k in ("uid", "creationTimestamp"):
                meta[k] = old["metadata"][k]
        if plural in ("deployments", "leaderworkersets"):
            generation = int((old or {}).get("metadata", {}).get("generation", 0))
            changed = old is None or old.get("spec") != obj.get("spec")
            meta["generation"] = generation + 1 if changed else generation
            if old is not None:
                obj["status"] = old.get("status", {})
                anns = old["metadata"].get("annotations", {})
                if REVISION in anns:
                    meta.setdefault("annotations", {})[REVISION] = anns[REVISION]
        st._stamp(obj)
        meta["managedFields"] = [
            {"manager": manager, "operation": "Apply", "apiVersion": api_version}
        ]
        st.objects[key] = obj
        ready = plural == "deployments" and st.ready_pods
        if ready and key not in st.life.rollouts:
            st.life.rollouts.append(key)  # the controller acts after the apply
        return web.json_response(obj, status=200 if old else 201)

    async def portforward(request: web.Request) -> web.StreamResponse:
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = st.objects.get(("pods", ns, name))
        if pod is None:
            return not_found("pods", name)
        role = pod["metadata"].get("labels", {}).get("app.kubernetes.io/component", "")
        port = int(request.query.get("ports", "0"))
        ws = web.WebSocketResponse(protocols=(PORTFORWARD_PROTOCOL,))
        await ws.prepare(request)
        prefix = port.to_bytes(2, "little")
        await ws.send_bytes(b"\x00" + prefix)
        await ws.send_bytes(b"\x01" + prefix)
        # A Pod servebook did not make (an attached deployment's) is named by its own name.
        address = st.forward_to.get(f"{role}:{port}") or st.forward_to.get(f"pod/{name}:{port}")
        if address is None:  # nothing listens there: the kubelet's words
            message = (
                f"error forwarding port {port} to pod {pod['metadata']['uid']}, uid : failed "
                f"to execute portforward in network namespace: failed to connect to "
                f"localhost:{port} inside namespace: connect: connection refused"
            )
            await ws.send_bytes(b"\x01" + message.encode())
            await ws.close()
            return ws
        try:
            reader, writer = await asyncio.open_connection(*address)
        except OSError as e:
            await ws.send_bytes(b"\x01" + f"error forwarding port {port}: {e}".encode())
            await ws.close()
            return ws

        await relay_port(ws, reader, writer)
        return ws

    async def dry_run(request: web.Request, body: Obj, plural: str, ns: str) -> web.Response:
        kind = KINDS.get(plural, ("", plural, ""))[1]
        name = str((body.get("metadata") or {}).get("name", ""))
        if ns and ("namespaces", "", ns) not in st.objects:
            return _status(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns})
        if f"{kind}/{name}" in st.refuse:
            code, reason, message = st.refuse[f"{kind}/{name}"]
            return _status(code, reason, message)
        invalid = validate(st, plural, ns, body)
        if invalid is not None:
            return invalid
        if kind == "Pod":  # the ServiceAccount admission plugin
            missing = rules.missing_service_account(st.objects, ns, body.get("spec") or {})
            if missing:
                return _status(
                    403,
                    "Forbidden",
                    f'pods "{name}" is forbidden: error looking up service account '
                    f'{ns}/{missing}: serviceaccount "{missing}" not found',
                )
        obj = copy.deepcopy(body)
        obj.setdefault("metadata", {})["uid"] = str(uuid.uuid4())
        return web.json_response(obj, status=201)

    async def create(request: web.Request) -> web.Response:
        plural, ns, _ = where(request)
        body = json.loads(await request.text())
        if request.query.get("dryRun") == "All":
            return await dry_run(request, body, plural, ns)
        meta = body.setdefault("metadata", {})
        name = str(meta.get("name", ""))
        invalid = validate(st, plural, ns, body)
        if invalid is not None:
            return invalid
        if (refused := _refuse_namespace(st, plural, ns, name)) is not None:
            return refused
        if (plural, ns, name) in st.objects:
            return _status(
                409,
                "AlreadyExists",
                f'{_resource(plural)} "{name}" already exists',
                {"name": name, "kind": plural},
            )
        if ns:
            meta["namespace"] = ns
        if plural == "pods":
            body["status"] = {"phase": "Pending"}
            st._started[(ns, name)] = time.monotonic()
            st.created_pods.append((ns, name))
        if plural == "namespaces":
            body["status"] = {"phase": "Active"}
        st.put(body)
        return web.json_response(body, status=201)

    async def get_pod(request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = st.objects.get(("pods", ns, name))
        if pod is None:
            return not_found("pods", name)
        if st.kubelet is not None and (ns, name) in st._started:
            _run_pod(st.kubelet, pod, time.monotonic() - st._started[(ns, name)])
        return web.json_response(pod)

    async def pod_log(request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = st.objects.get(("pods", ns, name))
        if pod is None:
            return not_found("pods", name)
        text = st.kubelet.logs(pod) if st.kubelet is not None else ""
        return web.Response(text=text, content_type="text/plain")

    async def access_review(request: web.Request) -> web.Response:
        body = json.loads(await request.text())
        attrs = (body.get("spec") or {}).get("resourceAttributes") or {}
        key = (attrs.get("verb", ""), attrs.get("resource", ""), attrs.get("subresource", ""))
        allowed = key not in st.denied and rbac_allows(
            st.rbac,
            key[0],
            attrs.get("group", ""),
            key[1] + (f"/{key[2]}" if key[2] else ""),
            attrs.get("name", ""),
        )
        body["status"] = {"allowed": allowed}
        if not allowed:
            body["status"]["reason"] = ""  # RBAC says nothing when it denies
        return web.json_response(body, status=201)

    app = web.Application(middlewares=[record])
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/portforward", portforward)
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/log", pod_log)
    app.router.add_get("/api/v1/namespaces/{ns}/{plural:pods}/{name}", get_pod)
    app.router.add_post("/api/v1/namespaces/{ns}/{plural}", create)
    app.router.add_post("/apis/apps/v1/namespaces/{ns}/{plural}", create)
    app.router.add_post("/api/v1/{plural:namespaces}", create)
    app.router.add_post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", access_review)
    app.router.add_get("/apis/apiextensions.k8s.io/v1/{plural}", list_)
    app.router.add_get("/version", version)
    app.router.add_get("/version/", version)  # kr8s asks with the slash
    for prefix in (
        "/api/v1",
        "/apis/apps/v1",
        "/apis/rbac.authorization.k8s.io/v1",
        "/apis/leaderworkerset.x-k8s.io/v1",
        "/apis/batch/v1",
    ):
        app.router.add_get(prefix + "/namespaces/{ns}/{plural}", list_)
        app.router.add_get(prefix + "/namespaces/{ns}/{plural}/{name}", get)
        app.router.add_patch(prefix + "/namespaces/{ns}/{plural}/{name}", apply)
        app.router.add_delete(prefix + "/namespaces/{ns}/{plural}/{name}", delete)
        app.router.add_get(prefix + "/{plural}", list_)
    app.router.add_get("/api/v1/{plural:namespaces}/{name}", get)
    app.router.add_patch("/api/v1/{plural:namespaces}/{name}", apply)
    app.router.add_delete("/api/v1/{plural:namespaces}/{name}", delete)

    async def unserved(request: web.Request) -> web.Response:
        return _not_served()

    # Any other group (a CRD not installed): the mux's plain-text 404, as the test plane's
    # API server answers it (aiohttp's own was "404: Not Found").
    app.router.add_route("*", "/apis/{rest:.*}", unserved)
    return app


def _run_pod(kubelet: Kubelet, pod: Obj, elapsed: float) -> None:
    """The Pod's status after ``elapsed`` seconds, as the kubelet would report it."""
    status = pod.setdefault("status", {})
    if status.get("phase") in ("Succeeded", "Failed"):
        return
    image = pod["spec"]["containers"][0]["image"]
    name = pod["spec"]["containers"][0]["name"]
    finished = kubelet.pull_s + kubelet.run_s
    if kubelet.pull_error:
        state: Obj = {
            "waiting": {
                "reason": kubelet.pull_error,
                "message": f'Back-off pulling image "{image}"',
            }
        }
    elif elapsed < kubelet.pull_s:
        state = {"waiting": {"reason": "ContainerCreating"}}
    elif elapsed < finished:
        state = {"running": {"startedAt": "2025-06-18T14:30:00Z"}}
    else:
        state = {"terminated": {"exitCode": 0, "reason": "Completed"}}
        status["phase"] = "Succeeded"
    if "phase" not in status or status["phase"] == "Pending":
        status["phase"] = "Running" if "running" in state else "Pending"
    status["containerStatuses"] = [
        {"name": name, "image": image, "ready": "running" in state, "state": state}
    ]


def _owner(obj: Obj) -> Obj:
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _roll_out(st: StandIn, dep: Obj) -> None:
    """What the Deployment controller and the kubelet do with a Deployment: a ReplicaSet of
    its Pod template (named by its ``pod-template-hash``, revision 1), its Pods, and the
    Deployment's status observing its generation.  A changed template's rollout (Recreate,
    the next revision) runs on the plane (tests/cluster/test_tiny_pd_lifecycle.py)."""
    meta = dep["metadata"]
    template = dep["spec"]["template"]
    digest = _digest(template)
    labels = {**template["metadata"]["labels"], "pod-template-hash": digest}
    rs: Obj = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"{meta['name']}-{digest}",
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": {REVISION: "1"},
            "ownerReferences": [_owner(dep)],
        },
        "spec": {
            "replicas": int(dep["spec"].get("replicas", 1)),
            "selector": {"matchLabels": labels},
            "template": {**copy.deepcopy(template), "metadata": {"labels": labels}},
        },
    }
    mine = [o for o in st.objects.values() if o["kind"] == "ReplicaSet" and _owned_by(o, dep)]
    changed = [o for o in mine if o["metadata"]["name"] != rs["metadata"]["name"]]
    assert not changed, "a changed Pod template: its rollout is tested on the plane, not here"
    if not mine:
        st.put(rs)
    rs = mine[0] if mine else rs
    running = [o for o in st.objects.values() if _owned_by(o, rs)]
    want = rs["spec"]["replicas"]
    for i in range(len(running), want):
        _start_pod(st, rs, suffix=f"{digest[:5]}{i}")
    meta.setdefault("annotations", {})[REVISION] = "1"
    dep["status"] = {
        "observedGeneration": meta["generation"],
        "replicas": want,
        "updatedReplicas": want,
        "readyReplicas": want,
        "availableReplicas": want,
    }


def _owned_by(obj: Obj, owner: Obj) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("uid") == owner["metadata"]["uid"] for r in refs)


def _start_pod(st: StandIn, rs: Obj, suffix: str) -> str:
    """A Ready Pod of ReplicaSet ``rs``, on node-1; returns its name."""
    template = rs["spec"]["template"]
    name = f"{rs['metadata']['name']}-{suffix}-{next(st._rv)}"
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": rs["metadata"]["namespace"],
            "labels": dict(rs["metadata"]["labels"]),
            "ownerReferences": [_owner(rs)],
        },
        "spec": copy.deepcopy(template["spec"]),
        "status": {"phase": "Pending"},
    }
    st.put(pod)
    st.life.born.add(pod["metadata"]["uid"])  # the kubelet runs it (``_progress``)
    return name


async def relay_port(
    ws: web.WebSocketResponse, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """What the kubelet does for a port-forward stream, after the port prefixes: bytes
    from the container's port go out on data channel 0, and channel 0's frames go in,
    until either side ends."""

    async def pod_to_client() -> None:
        while data := await reader.read(65536):
            await ws.send_bytes(b"\x00" + data)
        await ws.close()

    relay = asyncio.ensure_future(pod_to_client())
    try:
        async for msg in ws:
            if msg.type == web.WSMsgType.BINARY and msg.data[:1] == b"\x00":
                writer.write(msg.data[1:])
                await writer.drain()
    finally:
        relay.cancel()
        writer.close()


KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: standin
  cluster: {{server: "{server}"}}
users:
- name: tester
  user: {{token: "{token}"}}
contexts:
- name: c
  context: {{cluster: standin, user: tester{namespace}}}
current-context: c
"""


def kubeconfig(server: str, token: str = "t", namespace: str | None = None) -> str:
    """A kubeconfig of one cluster at ``server``, whose user has the bearer ``token``, and
    one context, current (in ``namespace`` when given)."""
    ns = f", namespace: {namespace}" if namespace else ""
    return KUBECONFIG.format(server=server, token=token, namespace=ns)


@dataclass
class Server:
    """The stand-in served on 127.0.0.1 from a thread of its own; ``stop()`` ends it."""

    standin: StandIn
    _loop: asyncio.AbstractEventLoop
    _thread: threading.Thread
    _runner: web.AppRunner

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def call(self, fn: Any) -> Any:
        """Run ``fn(standin)`` on the server's own thread (objects change only there)."""

        async def run() -> Any:
            _advance(self.standin)
            return fn(self.standin)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(kubeconfig(self.standin.url))
        return path


def serve() -> Server:
    st = StandIn()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(_app(st), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        sockets = site._server.sockets  # type: ignore[union-attr]
        st.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        box["runner"] = runner

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="kube-standin", daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("the stand-in API server did not start")
    return Server(st, loop, thread, box["runner"])


def validate(st: StandIn, plural: str, ns: str, body: Obj) -> web.Response | None:
    """422 Invalid for what the API server's validation refuses (kube_standin_rules)."""
    _, kind, group = KINDS.get(plural, ("", plural, ""))
    refusal = rules.invalid(st.objects, kind, group, plural, ns, body)
    return None if refusal is None else _status(*refusal)


def _authorize(st: StandIn, request: web.Request) -> web.Response | None:
    """403 when the RBAC rules granted to the test refuse the request (kube_standin_rules)."""
    refusal = rules.authorize(st.rbac, st.minor, request.method, request.path, dict(request.query))
    return None if refusal is None else _status(*refusal)


def dump(st: StandIn) -> str:
    """The stored objects, for a failing assertion's message."""
    return json.dumps(sorted(f"{p}/{ns}/{n}" for p, ns, n in st.objects), indent=1)


# ---------------------------------------------------------------------------------------
# Lifecycle: what a real API server and its controllers do over time, run on every request
# (``_advance``) so it happens between requests, never inside the one that asked.
#
# * DELETE (``_delete``): a Pod gets a ``deletionTimestamp`` and goes at the next request;
#   anything else goes at once, a Namespace's content and an object's dependents
#   (``ownerReferences``) with it.  (Grace periods and Terminating namespaces run on the
#   plane.)
# * A create into an absent namespace is 404 (the NamespaceLifecycle admission plugin).
# * Pods (``_progress``): a controller's new Pod is on node-1, Running and Ready at the next
#   request (its phases over time run on the plane); a Deployment rolls out at the next
#   request after its apply.  (A LeaderWorkerSet is stored, never rolled out: its
#   controller runs on the plane.)


@dataclass
class Lifecycle:
    born: set[str] = field(default_factory=set)  # Pod uids the kubelet has yet to start
    deleting: set[tuple[str, str, str]] = field(default_factory=set)
    rollouts: list[tuple[str, str, str]] = field(default_factory=list)  # queued applies


def _digest(template: Obj) -> str:
    """A template's hash, as a ``pod-template-hash`` label."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _refuse_namespace(st: StandIn, plural: str, ns: str, name: str) -> web.Response | None:
    """The NamespaceLifecycle admission plugin, for a create into ``ns``."""
    if not ns or plural == "namespaces":
        return None
    space = st.objects.get(("namespaces", "", ns))
    if space is None:
        return _status(
            404,
            "NotFound",
            f'namespaces "{ns}" not found',
            {"name": ns, "kind": "namespaces"},
        )
    return None


def _not_served() -> web.Response:
    """What the API server answers for a group it does not serve: its mux's plain 404."""
    return web.Response(status=404, text="404 page not found\n", content_type="text/plain")


def _dependents(st: StandIn, uid: str) -> list[tuple[str, str, str]]:
    return [
        k
        for k, o in st.objects.items()
        if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or ())
    ]


def _delete(st: StandIn, key: tuple[str, str, str], policy: str = "") -> Obj | None:
    """Begin deleting ``key`` as the API server does (see the section's notes); the object
    as the DELETE answers it, None when there is none."""
    obj = st.objects.get(key)
    if obj is None:
        return None
    meta = obj["metadata"]
    if meta.get("deletionTimestamp"):
        return copy.deepcopy(obj)
    plural = key[0]
    if plural == "pods":
        meta["deletionTimestamp"] = _now_text()
        meta["deletionGracePeriodSeconds"] = int(
            obj["spec"].get("terminationGracePeriodSeconds", 30)
        )
        st.life.deleting.add(key)
    elif plural == "namespaces":  # with its content (Terminating runs on the plane)
        for k in [k for k in st.objects if k[1] == key[2]]:
            _delete(st, k)
        del st.objects[key]
    else:
        del st.objects[key]
        if policy != "Orphan":
            for dep in _dependents(st, meta["uid"]):
                _delete(st, dep)
    st._stamp(obj)
    return copy.deepcopy(obj)


def _progress(st: StandIn, pod: Obj) -> None:
    """A new Pod of a controller's, as the scheduler and kubelet write it once it is Ready."""
    meta = pod["metadata"]
    if meta.get("uid") not in st.life.born or meta.get("deletionTimestamp"):
        return
    st.life.born.discard(meta["uid"])
    stamp = _now_text()
    pod["spec"].setdefault("nodeName", "node-1")
    pod_ip(pod)
    kinds = ("Initialized", "PodScheduled", "ContainersReady", "Ready")
    conditions = [{"type": k, "status": "True", "lastTransitionTime": stamp} for k in kinds]
    pod["status"].update(phase="Running", startTime=stamp, conditions=conditions)
    pod["status"]["containerStatuses"] = [
        {
            "name": c["name"],
            "image": c["image"],
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": stamp}},
        }
        for c in pod["spec"]["containers"]
    ]


def pod_ip(pod: Obj) -> str:
    """The Pod's address on the cluster network, as the kubelet reports it once the Pod's
    sandbox runs (``status.podIP``, ``status.podIPs``): one per Pod, from 10.244.0.0/16."""
    status = pod.setdefault("status", {})
    if not status.get("podIP"):
        h = int(hashlib.sha256(pod["metadata"]["uid"].encode()).hexdigest()[:8], 16)
        ip = f"10.244.{h % 250}.{(h >> 8) % 250 + 2}"
        status["podIP"], status["podIPs"] = ip, [{"ip": ip}]
    return str(status["podIP"])


def _advance(st: StandIn) -> None:
    """Everything the controllers and kubelets have done since the last request."""
    for key in st.life.deleting:  # the kubelet: a Pod being deleted goes
        st.objects.pop(key, None)
    st.life.deleting.clear()
    for key in st.life.rollouts:
        obj = st.objects.get(key)
        if obj is not None and not obj["metadata"].get("deletionTimestamp"):
            _roll_out(st, obj)
    st.life.rollouts.clear()
    for key, obj in st.objects.items():
        if key[0] == "pods":
            _progress(st, obj)
