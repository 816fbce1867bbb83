"""A stand-in Kubernetes API server over real HTTP, for the kubernetes backend's tests.

It keeps objects in memory and speaks the part of the REST API servebook uses, the way the
real API server answers it: ``GET /version``; GET, server-side apply (PATCH with
``application/apply-patch+yaml`` and ``?fieldManager=``) and DELETE on namespaces and on
namespaced deployments, services, pods and events; lists (namespaced and across
namespaces) with ``labelSelector``; and ``Status`` bodies for 404, 409 and 403.

What a test arranges: ``owned_by_other`` (a field another field manager owns, so an apply
that changes it is a 409 FieldManagerConflict), ``forbidden`` (method and path prefix that
answer 403), and ``ready_pods`` (a Deployment applied gets a Ready Pod, as its controller
and the kubelet would make one).  ``requests`` records every request the server saw.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

Obj = dict[str, Any]
# plural -> (apiVersion, kind, group for Status details)
KINDS = {
    "namespaces": ("v1", "Namespace", ""),
    "services": ("v1", "Service", ""),
    "pods": ("v1", "Pod", ""),
    "events": ("v1", "Event", ""),
    "deployments": ("apps/v1", "Deployment", "apps"),
}


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    content_type: str


@dataclass
class StandIn:
    url: str = ""
    # (plural, namespace or "", name) -> object
    objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    # (plural, namespace, name) -> {dotted field path: manager}
    owned_by_other: dict[tuple[str, str, str], dict[str, str]] = field(default_factory=dict)
    # (method, path prefix) pairs answered 403
    forbidden: list[tuple[str, str]] = field(default_factory=list)
    ready_pods: bool = False
    _rv: Iterator[int] = field(default_factory=lambda: itertools.count(100))

    def put(self, obj: Obj) -> None:
        """Put an object as if someone else had made it."""
        kind = obj["kind"]
        plural = next(p for p, (_, k, _) in KINDS.items() if k == kind)
        meta = obj["metadata"]
        self._stamp(obj)
        self.objects[(plural, meta.get("namespace", ""), meta["name"])] = obj

    def names(self, plural: str, namespace: str = "") -> list[str]:
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


def _get_path(obj: Any, path: str) -> Any:
    for part in path.strip(".").split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _app(st: StandIn) -> web.Application:
    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        st.requests.append(
            Seen(
                request.method,
                request.path,
                dict(request.query),
                request.headers.get("Content-Type", ""),
            )
        )
        for method, prefix in st.forbidden:
            if request.method == method and request.path.startswith(prefix):
                verb = {"GET": "get", "PATCH": "patch", "DELETE": "delete"}[method]
                return _status(
                    403,
                    "Forbidden",
                    f'{request.path} is forbidden: User "tester" cannot {verb} this resource',
                )
        return await handler(request)

    async def version(request: web.Request) -> web.Response:
        return web.json_response(
            {"major": "1", "minor": "31", "gitVersion": "v1.31.2", "platform": "linux/amd64"}
        )

    def where(request: web.Request) -> tuple[str, str, str | None]:
        m = request.match_info
        return m["plural"], m.get("ns", ""), m.get("name")

    async def list_(request: web.Request) -> web.Response:
        plural, ns, _ = where(request)
        if plural not in KINDS:
            return _status(404, "NotFound", "the server could not find the requested resource")
        selector = request.query.get("labelSelector", "")
        items = [
            copy.deepcopy(o)
            for (p, n, _), o in sorted(st.objects.items())
            if p == plural
            and (not ns or n == ns)
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
        obj = st.objects.pop((plural, ns, name or ""), None)
        if obj is None:
            return not_found(plural, name or "")
        if plural == "namespaces":
            for key in [k for k in st.objects if k[1] == name]:
                del st.objects[key]
        if plural == "deployments":
            for key, o in list(st.objects.items()):
                refs = o["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == obj["metadata"]["uid"] for r in refs):
                    del st.objects[key]
        return web.json_response(obj)

    async def apply(request: web.Request) -> web.Response:
        plural, ns, name = where(request)
        name = name or ""
        if request.content_type != "application/apply-patch+yaml":
            return _status(
                415, "UnsupportedMediaType", "the body of the request was in an unknown format"
            )
        manager = request.query.get("fieldManager")
        if not manager:
            return _status(
                422, "Invalid", "PatchOptions.meta.k8s.io is invalid: fieldManager: Required"
            )
        body = yaml.safe_load(await request.text())
        api_version, kind, group = KINDS[plural]
        if body.get("kind") != kind or body.get("metadata", {}).get("name") != name:
            return _status(400, "BadRequest", "the name or kind of the object does not match")
        key = (plural, ns, name)
        old = st.objects.get(key)
        force = request.query.get("force") == "true"
        conflicts = [
            (path, who)
            for path, who in st.owned_by_other.get(key, {}).items()
            if who != manager
            and _get_path(body, path) is not None
            and _get_path(body, path) != _get_path(old, path)
        ]
        if conflicts and not force:
            n = len(conflicts)
            return _status(
                409,
                "Conflict",
                f"Apply failed with {n} conflict{'s' if n > 1 else ''}: "
                + "; ".join(f'conflict with "{w}" using {api_version}: {p}' for p, w in conflicts),
                {
                    "name": name,
                    "group": group,
                    "kind": plural,
                    "causes": [
                        {
                            "reason": "FieldManagerConflict",
                            "message": f'conflict with "{w}" using {api_version}',
                            "field": p,
                        }
                        for p, w in conflicts
                    ],
                },
            )
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        if ns:
            meta["namespace"] = ns
        if old is not None:
            for k in ("uid", "creationTimestamp"):
                meta[k] = old["metadata"][k]
        st._stamp(obj)
        meta["managedFields"] = [
            {"manager": manager, "operation": "Apply", "apiVersion": api_version}
        ]
        st.objects[key] = obj
        if plural == "deployments" and st.ready_pods:
            _make_ready_pod(st, obj)
        return web.json_response(obj, status=200 if old else 201)

    app = web.Application(middlewares=[record])
    app.router.add_get("/version", version)
    app.router.add_get("/version/", version)  # kr8s asks with the slash
    for prefix in ("/api/v1", "/apis/apps/v1"):
        app.router.add_get(prefix + "/namespaces/{ns}/{plural}", list_)
        app.router.add_get(prefix + "/namespaces/{ns}/{plural}/{name}", get)
        app.router.add_patch(prefix + "/namespaces/{ns}/{plural}/{name}", apply)
        app.router.add_delete(prefix + "/namespaces/{ns}/{plural}/{name}", delete)
        app.router.add_get(prefix + "/{plural}", list_)
    app.router.add_get("/api/v1/{plural:namespaces}/{name}", get)
    app.router.add_patch("/api/v1/{plural:namespaces}/{name}", apply)
    app.router.add_delete("/api/v1/{plural:namespaces}/{name}", delete)
    return app


def _make_ready_pod(st: StandIn, dep: Obj) -> None:
    """The Pod a Deployment's controller would start, Ready (replacing an older one)."""
    meta = dep["metadata"]
    ns = meta["namespace"]
    for key, o in list(st.objects.items()):
        refs = o["metadata"].get("ownerReferences") or []
        if key[0] == "pods" and any(r.get("uid") == meta["uid"] for r in refs):
            del st.objects[key]
    template = dep["spec"]["template"]
    name = f"{meta['name']}-{meta['resourceVersion']}-abcde"
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    containers = template["spec"]["containers"]
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": dict(template["metadata"]["labels"]),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": meta["name"],
                    "uid": meta["uid"],
                }
            ],
        },
        "spec": {**copy.deepcopy(template["spec"]), "nodeName": "node-1"},
        "status": {
            "phase": "Running",
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("Initialized", "PodScheduled", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c["image"],
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for c in containers
            ],
        },
    }
    st.put(pod)


KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: standin
  cluster: {{server: "{url}"}}
users:
- name: tester
  user: {{token: "t"}}
contexts:
- name: c
  context: {{cluster: standin, user: tester}}
current-context: c
"""


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

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(KUBECONFIG.format(url=self.standin.url))
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


def dump(st: StandIn) -> str:
    """The stored objects, for a failing assertion's message."""
    return json.dumps(sorted(f"{p}/{ns}/{n}" for p, ns, n in st.objects), indent=1)
