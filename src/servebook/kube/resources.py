"""Kubernetes objects by kind, through ``kube.client`` (one connection's kubeconfig,
context and timeouts): where a kind's objects live, get, list, and server-side apply.  Every
request is bounded; a refusal is exit 2 naming the request and what servebook needs (a 409
names the conflicting fields and their manager: servebook applies as field manager
``servebook`` and never forces).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Unpack

from servebook.errors import UsageError
from servebook.kube import client as kube_client
from servebook.kube.names import LWS_API_VERSION

FIELD_MANAGER = "servebook"

Obj = dict[str, Any]

# The kinds servebook reads and writes, each with its resource name: for all of these the
# API's plural is the kind in lower case plus "s".
KINDS = (
    "Namespace",
    "Deployment",
    "Service",
    "Pod",
    "Event",
    "ReplicaSet",
    "ConfigMap",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "LeaderWorkerSet",
    "Secret",
    "Job",
)
PLURALS = {kind: kind.lower() + "s" for kind in KINDS}
API_VERSIONS = {
    "Deployment": "apps/v1",
    "ReplicaSet": "apps/v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "LeaderWorkerSet": LWS_API_VERSION,
    "Job": "batch/v1",
}


@dataclass(frozen=True)
class Where:
    """One resource path: kr8s's (version, namespace, url) and how a person reads it."""

    version: str
    namespace: str | None
    url: str

    @property
    def path(self) -> str:
        base = "/api" if self.version == "v1" else "/apis"
        ns = f"/namespaces/{self.namespace}" if self.namespace else ""
        return f"{base}/{self.version}{ns}/{self.url}"


def where_of(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> Where:
    plural = PLURALS[kind]
    ns = None if kind == "Namespace" else namespace
    return Where(api_version, ns, f"{plural}/{name}" if name else plural)


def what_of(obj: Obj) -> str:
    """``Kind/name in namespace NS``, as a message names an object."""
    meta = obj["metadata"]
    return object_text(obj["kind"], meta["name"], meta.get("namespace"))


def object_text(kind: str, name: str, namespace: str | None) -> str:
    return f"{kind}/{name}" + (
        f" in namespace {namespace}" if namespace and kind != "Namespace" else ""
    )


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


def request(
    api: Any,
    method: str,
    where: Where,
    doing: str,
    **options: Unpack[kube_client.CallOptions],
) -> Obj | None:
    """One bounded request (``kube.client.call``, with its options).  The answer's JSON;
    None for a 404 when ``missing_ok``.  Any failure is exit 2 naming ``doing`` and the
    request: a 409 is a ``Conflict`` naming the fields and their manager, a 401/403
    ``Forbidden`` saying what servebook needs."""
    try:
        return kube_client.call(api, method, where.path, doing, **options)
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
        terminating = _terminating_namespace(status)
        if code == 403 and terminating:
            raise NamespaceTerminating(
                f"{doing}: namespace {terminating} is being deleted (Terminating) and the API "
                f"server refuses new objects in it until it is gone ({message}). Wait until "
                f"`kubectl get namespace {terminating}` says NotFound (`servebook down` waits "
                "for it), then up again."
            ) from e
        if code == 404 and not status:
            raise NotServed(_not_served_text(where, doing)) from e
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


class NamespaceTerminating(UsageError):
    """A create refused because its namespace is being deleted (403 NamespaceTerminating)."""


class NotServed(UsageError):
    """The cluster does not serve the API asked (a plain-text 404: a CRD not installed)."""


# Where to get the CRDs of the kinds servebook applies that Kubernetes itself lacks.
INSTALL = {
    "leaderworkersets": "LeaderWorkerSet's CRD and controller "
    "(https://lws.sigs.k8s.io/docs/installation/; `kubectl get crd "
    "leaderworkersets.leaderworkerset.x-k8s.io` shows whether it is there)",
}


def _terminating_namespace(status: Obj) -> str | None:
    """The namespace a 403 names as being terminated (the NamespaceLifecycle admission's
    ``NamespaceTerminating`` cause, or its sentence), else None."""
    causes = (status.get("details") or {}).get("causes") or []
    message = str(status.get("message") or "")
    marker = "unable to create new content in namespace "
    if marker in message and "because it is being terminated" in message:
        return message.split(marker, 1)[1].split(" ", 1)[0]
    for c in causes:
        if isinstance(c, dict) and c.get("reason") == "NamespaceTerminating":
            return str(c.get("message", "")).removeprefix("namespace ").split(" ")[0] or "?"
    return None


def _not_served_text(where: Where, doing: str) -> str:
    plural = where.url.split("/", 1)[0]
    resource = f"{plural}.{where.version.split('/')[0]}" if "/" in where.version else plural
    install = INSTALL.get(plural, f"the CustomResourceDefinition {resource}")
    return (
        f"{doing}: the cluster does not serve {where.version} {plural} (404 on {where.path}: "
        f"no such API). Install {install}, or use a recipe whose roles do not need it."
    )


def get(api: Any, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
    return request(
        api,
        "GET",
        where_of(api_version, kind, namespace, name),
        f"reading {kind}/{name}",
        missing_ok=True,
    )


def list_objects(
    api: Any,
    kind: str,
    namespace: str | None,
    selector: dict[str, str] | str | None = None,
) -> list[Obj]:
    """The items of a list (every namespace when ``namespace`` is None), each with its
    ``kind`` and ``apiVersion`` set as ``kubectl get -o json`` writes them."""
    kind = {v: k for k, v in PLURALS.items()}.get(kind, kind)
    api_version = API_VERSIONS.get(kind, "v1")
    if isinstance(selector, dict):
        selector = ",".join(f"{k}={v}" for k, v in selector.items())
    where = where_of(api_version, kind, namespace)
    doing = f"listing {PLURALS[kind]}" + (f" in namespace {namespace}" if namespace else "")
    got = request(
        api, "GET", where, doing, params={"labelSelector": selector} if selector else None
    )
    items = (got or {}).get("items") or []
    return [{"apiVersion": api_version, "kind": kind, **i} for i in items if isinstance(i, dict)]


def list_if_served(
    api: Any, kind: str, namespace: str | None, selector: dict[str, str] | str | None = None
) -> list[Obj]:
    """``list_objects`` of a kind a CRD adds: none when the cluster does not serve it (404)."""
    try:
        return list_objects(api, kind, namespace, selector)
    except NotServed:
        return []
    except kube_client.ClusterUnreachable as e:
        cause = e.__cause__
        if isinstance(cause, kube_client.RequestFailed) and cause.code == 404:
            return []
        raise


class Forbidden(UsageError):
    """The API server refused a request (401/403): exit 2 naming it."""


def namespace_exists(api: Any, namespace: str) -> Obj | None:
    """The Namespace, or None when it does not exist.  Credentials bound to the namespace
    alone (a Role and RoleBinding in it) may not read the cluster-scoped Namespace; such a
    binding exists only in a namespace that exists, so it is taken as existing and used as
    it is (never applied over, never deleted)."""
    try:
        return get(api, "v1", "Namespace", None, namespace)
    except Forbidden:
        return {"metadata": {"name": namespace}}


def apply(
    api: Any,
    objects: list[Obj],
    say: Callable[[str], None],
    existed: dict[str, bool] | None = None,
) -> list[Obj]:
    """Server-side apply of each object, in order, as field manager ``servebook`` (no
    force: a conflict is a ``Conflict``, exit 2); the objects as the API server answered."""
    answers = []
    for spec in objects:
        meta = spec["metadata"]
        what = what_of(spec)
        got = request(
            api,
            "PATCH",
            where_of(spec["apiVersion"], spec["kind"], meta.get("namespace"), meta["name"]),
            f"applying {what}",
            params={"fieldManager": FIELD_MANAGER},
            body=spec,
            content_type="application/apply-patch+yaml",
        )
        answers.append(got or {})
        say(f"{'configured' if (existed or {}).get(what) else 'created'} {what}")
    return answers


__all__ = [
    "API_VERSIONS",
    "FIELD_MANAGER",
    "PLURALS",
    "Conflict",
    "Forbidden",
    "NamespaceTerminating",
    "NotServed",
    "Where",
    "apply",
    "get",
    "list_if_served",
    "list_objects",
    "namespace_exists",
    "object_text",
    "request",
    "what_of",
    "where_of",
]
