"""Cluster state for ``servebook preflight``: nodes, pods, namespaces and CRDs, read from a
file or from the live cluster.

A snapshot file is exactly what

    kubectl get nodes,pods,namespaces,customresourcedefinitions -A -o json

prints: a ``List`` whose ``items`` mix the four kinds.  ``read_live`` lists the same four
kinds through the Kubernetes API (``kube.client``), honouring the kubeconfig and context,
with explicit timeouts.
Both give a ``ClusterSnapshot`` of plain dicts, which ``servebook.preflight.cluster`` checks
without further I/O.

A snapshot that could not be read is an error (exit 2), never an empty cluster: checks run
over missing pods would report every GPU free, and over missing namespaces every namespace
absent.
"""

from __future__ import annotations

import gc
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servebook import inputs
from servebook.errors import UsageError
from servebook.kube.client import (
    ClusterUnreachable,
    RequestFailed,
    call,
    connect,
    list_items,
    server_of,
)

SNAPSHOT_COMMAND = "kubectl get nodes,pods,namespaces,customresourcedefinitions -A -o json"

Obj = dict[str, Any]

_KINDS = {
    "Node": "nodes",
    "Pod": "pods",
    "Namespace": "namespaces",
    "CustomResourceDefinition": "crds",
}


@dataclass(frozen=True)
class ClusterSnapshot:
    """The cluster objects preflight reads, as API dicts.

    ``nodes``, ``namespaces`` and ``crds`` are keyed by ``metadata.name``; ``pods`` is every
    Pod in every namespace.  ``source`` says where they were read (a file, or a cluster
    server and context), for messages.
    """

    nodes: Mapping[str, Obj]
    pods: Sequence[Obj]
    namespaces: Mapping[str, Obj]
    crds: Mapping[str, Obj]
    source: str = ""
    # Items of other kinds in a snapshot file, by kind (ignored, but counted).
    ignored: Mapping[str, int] = field(default_factory=dict)
    # What the caller may not read, by key of the four lists ("nodes", "pods",
    # "namespaces", "crds"): why, in the API server's words.  A namespace's tenant reads its
    # own namespace and its Pods only (``read_with``); the checks say what they could not
    # decide from what is missing, never that it is absent.
    unread: Mapping[str, str] = field(default_factory=dict)


def _where(source: str, index: int | None) -> str:
    return f"{source}: items[{index}]" if index is not None else source


def build_snapshot(
    *,
    nodes: Iterable[Obj],
    pods: Iterable[Obj],
    namespaces: Iterable[Obj],
    crds: Iterable[Obj],
    source: str,
    ignored: Mapping[str, int] | None = None,
    unread: Mapping[str, str] | None = None,
) -> ClusterSnapshot:
    """A snapshot from the four lists, checking the fields preflight relies on."""

    def keyed(objs: Iterable[Obj], kind: str) -> dict[str, Obj]:
        out: dict[str, Obj] = {}
        for obj in objs:
            out[_object_name(obj, kind, source, None)] = obj
        return out

    pod_list = list(pods)
    for pod in pod_list:
        name = _object_name(pod, "Pod", source, None)
        if not isinstance(pod["metadata"].get("namespace"), str):
            raise UsageError(f"{source}: Pod {name} has no metadata.namespace.")
    return ClusterSnapshot(
        nodes=keyed(nodes, "Node"),
        pods=pod_list,
        namespaces=keyed(namespaces, "Namespace"),
        crds=keyed(crds, "CustomResourceDefinition"),
        source=source,
        ignored=dict(ignored or {}),
        unread=dict(unread or {}),
    )


def _object_name(obj: Any, kind: str, source: str, index: int | None) -> str:
    where = _where(source, index)
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: a {kind} must be a JSON object, got {type(obj).__name__}.")
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise UsageError(f"{where}: {kind} without metadata.name; is this kubectl output?")
    return name


# Where the checks expect an object ({}) or a list of objects ([]) in what they read, by
# kind ("*": every kind); "a.[].b" is b in each item of the list a.  A value of another
# shape (``status: "Ready"``) would end the checks in an AttributeError; absent or null is
# fine (the accessors read it as empty).
_CONTAINER_SHAPES = ("resources", "resources.requests", "resources.limits")
_SHAPES: dict[str, tuple[str, ...]] = {
    "*": ("metadata.labels", "metadata.annotations", "spec", "status", "status.conditions.[]"),
    "Node": ("spec.taints.[]", "status.allocatable", "status.capacity"),
    "Pod": (
        "metadata.ownerReferences.[]",
        "spec.tolerations.[]",
        "spec.overhead",
        "spec.nodeSelector",
        "status.containerStatuses.[]",
        "status.initContainerStatuses.[]",
        *(f"spec.{c}.[]" for c in ("containers", "initContainers")),
        *(f"spec.{c}.[].{f}" for c in ("containers", "initContainers") for f in _CONTAINER_SHAPES),
    ),
    "CustomResourceDefinition": ("spec.versions.[]",),
}


def _shape_problem(value: Any, path: list[str], at: str = "") -> str | None:
    """Where ``value`` (an object) holds something other than an object along ``path``."""
    if not path:
        return None
    key, rest = path[0], path[1:]
    if key == "[]":
        if not isinstance(value, list):
            return f"{at} is {type(value).__name__} {_short(value)}, not a list"
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                return f"{at}[{i}] is {type(item).__name__} {_short(item)}, not an object"
            found = _shape_problem(item, rest, f"{at}[{i}]")
            if found:
                return found
        return None
    child = value.get(key)
    here = f"{at}.{key}" if at else key
    if child is None:
        return None
    if rest and rest[0] == "[]":
        return _shape_problem(child, rest, here)
    if not isinstance(child, dict):
        return f"{here} is {type(child).__name__} {_short(child)}, not an object"
    return _shape_problem(child, rest, here)


def _short(value: Any) -> str:
    text = repr(value)
    return f"({text[:40]}...)" if len(text) > 40 else f"({text})"


_SHAPE_PATHS = {
    kind: [p.split(".") for p in (*_SHAPES["*"], *(_SHAPES.get(kind, ())))] for kind in _KINDS
}


def _check_shape(item: Obj, kind: str, where: str) -> None:
    for path in _SHAPE_PATHS[kind]:
        problem = _shape_problem(item, path)
        if problem:
            raise UsageError(
                f"{where}: {kind} {item['metadata']['name']}: {problem} (kubectl prints "
                "one there).",
                hint=f"Capture the snapshot with `{SNAPSHOT_COMMAND}` rather than editing it.",
            )


def snapshot_from_list(doc: Any, *, source: str) -> ClusterSnapshot:
    """A snapshot from the parsed JSON of ``SNAPSHOT_COMMAND`` (a ``List`` of mixed kinds).

    Raises ``UsageError`` naming ``source`` and what is wrong: not a list of objects, an
    item without kind or name, or a kind preflight needs missing altogether (a real cluster
    always has Nodes, Pods in kube-system and the default Namespace; their absence means the
    command was not the one above).  No CRDs at all is allowed (a bare cluster has none).
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        got = type(doc).__name__ if not isinstance(doc, dict) else f"kind {doc.get('kind')!r}"
        raise UsageError(
            f"{source}: expected a Kubernetes List with 'items' (the output of "
            f"`{SNAPSHOT_COMMAND}`), got {got}."
        )
    groups: dict[str, list[Obj]] = {k: [] for k in _KINDS.values()}
    ignored: dict[str, int] = {}
    for i, item in enumerate(doc["items"]):
        if not isinstance(item, dict):
            raise UsageError(f"{_where(source, i)}: expected an object, got {type(item).__name__}.")
        kind = item.get("kind")
        if not isinstance(kind, str) or not kind:
            raise UsageError(
                f"{_where(source, i)}: item without 'kind'; `kubectl get ... -o json` sets it "
                "on every item."
            )
        _object_name(item, kind, source, i)
        if kind in _KINDS:
            _check_shape(item, kind, _where(source, i))
            if kind == "Pod" and not isinstance(item["metadata"].get("namespace"), str):
                raise UsageError(f"{_where(source, i)}: Pod without metadata.namespace.")
            groups[_KINDS[kind]].append(item)
        else:
            ignored[kind] = ignored.get(kind, 0) + 1
    missing = [k for k in ("Node", "Pod", "Namespace") if not groups[_KINDS[k]]]
    if missing:
        raise UsageError(
            f"{source}: has no {', '.join(missing)} objects, so the cluster checks cannot be "
            f"decided from it. Capture it with `{SNAPSHOT_COMMAND}` (all four kinds, all "
            "namespaces)."
        )
    pod_namespaces = {p["metadata"]["namespace"] for p in groups["pods"]}
    if len(pod_namespaces) == 1 and pod_namespaces != {"kube-system"}:
        # Without -A only the current namespace's pods are listed, and GPUs held by pods in
        # other namespaces would go unseen (field notes: a pod in `default` holding all 8).
        (only,) = pod_namespaces
        raise UsageError(
            f"{source}: every Pod in it is in namespace {only!r}, so it was probably captured "
            "without -A (--all-namespaces); pods in other namespaces that hold GPUs would go "
            f"unseen. Capture it with `{SNAPSHOT_COMMAND}`."
        )
    return ClusterSnapshot(
        nodes={n["metadata"]["name"]: n for n in groups["nodes"]},
        pods=groups["pods"],
        namespaces={n["metadata"]["name"]: n for n in groups["namespaces"]},
        crds={c["metadata"]["name"]: c for c in groups["crds"]},
        source=source,
        ignored=ignored,
    )


_LARGE_SNAPSHOT_CHARS = 32 * 2**20
# A 60,000-pod cluster prints a few hundred MiB.
SNAPSHOT_MAX_BYTES = 1024 * inputs.MiB


def load_snapshot(path: str | os.PathLike[str]) -> ClusterSnapshot:
    """Read a snapshot file (the JSON of ``SNAPSHOT_COMMAND``); ``UsageError`` if unusable.
    It is read through ``servebook.inputs`` (a regular file, bounded, UTF-8, nesting
    bounded), and every object's fields the checks read must have the API's shapes."""
    p = Path(path)
    if not os.path.lexists(p):
        raise UsageError(
            f"{p}: no such file. Capture one with `{SNAPSHOT_COMMAND} > {p.name}`."
        ) from None
    text = inputs.read_text(p, "snapshot", SNAPSHOT_MAX_BYTES)
    # Parsed JSON holds no reference cycles, so the cyclic collector has nothing to find, but
    # it runs again and again while millions of dicts are created: a 60,000-pod snapshot
    # parses several times faster with it paused.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        doc = inputs.parse_json(text, p, "snapshot")
    except json.JSONDecodeError as e:
        hint = " It looks like YAML: use -o json." if text.lstrip().startswith("apiVersion") else ""
        raise UsageError(
            f"{p}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}).{hint}"
        ) from None
    finally:
        if was_enabled:
            gc.enable()
    if len(text) > _LARGE_SNAPSHOT_CHARS:
        # Millions of fresh objects would otherwise be walked by the next few collections
        # (seconds, in the middle of the checks).  Freezing only exempts them from cycle
        # detection; they are still freed by reference counting.
        gc.freeze()
    return snapshot_from_list(doc, source=str(p))


# ---------------------------------------------------------------------------------------
# The live edge: every request through ``kube.client`` (one kubeconfig, context and timeout).

# Small pages keep each request far inside its timeout on a loaded API server.
_PAGE = 100
_LISTS = (
    ("nodes", "/api/v1/nodes"),
    ("pods", "/api/v1/pods"),
    ("namespaces", "/api/v1/namespaces"),
    ("crds", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"),
)


def _unreadable(reason: str) -> ClusterUnreachable:
    return ClusterUnreachable(
        f"cannot read the cluster: {reason}. Check `kubectl get nodes` works with the same "
        f"kubeconfig and context, or pass --snapshot FILE (`{SNAPSHOT_COMMAND} > FILE`).",
        reason=reason,
    )


def read_with(
    api: Any, *, timeout_s: float = 180.0, namespace: str | None = None
) -> ClusterSnapshot:
    """The four lists from a connected ``api`` (``kube.client.connect``), the whole read
    bounded by ``timeout_s`` (pages of ``_PAGE`` objects: 60,000 pods are 600 requests,
    each bounded by the Api's request timeout).

    With ``namespace``, a caller refused (403) a cluster-wide list reads what a tenant of
    that namespace may (``_as_tenant``), and the snapshot's ``unread`` says what it could
    not; without it, a refusal is an error."""
    result: list[ClusterSnapshot] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            lists: dict[str, list[Obj]] = {}
            unread: dict[str, str] = {}
            for key, path in _LISTS:
                try:
                    lists[key] = list_items(
                        api, path, f"listing {path.rsplit('/', 1)[-1]}", page=_PAGE
                    )
                except RequestFailed as e:
                    if namespace is None or e.code != 403:
                        raise
                    lists[key], why = _as_tenant(api, key, namespace, e)
                    if why:
                        unread[key] = why
            result.append(
                build_snapshot(
                    nodes=lists["nodes"],
                    pods=lists["pods"],
                    namespaces=lists["namespaces"],
                    crds=lists["crds"],
                    source=server_of(api),
                    unread=unread,
                )
            )
        except BaseException as e:
            failure.append(e)

    # A daemon thread, so a server that never answers cannot keep the process alive after
    # the deadline; kr8s runs its own event loop in a thread of its own.
    worker = threading.Thread(target=work, name="servebook-read-live", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise _unreadable(
            f"nodes, pods, namespaces and CRDs were not all listed within {timeout_s:g} s "
            "(server unreachable or overloaded)"
        )
    if failure:
        e = failure[0]
        if isinstance(e, RequestFailed):
            why = str(e)
            if e.code in (401, 403):
                why += (
                    "; preflight needs cluster-wide list on nodes, pods, namespaces and "
                    "customresourcedefinitions"
                )
            raise _unreadable(why) from e
        raise e
    return result[0]


def _as_tenant(
    api: Any, key: str, namespace: str, refused: RequestFailed
) -> tuple[list[Obj], str | None]:
    """What a caller refused the cluster-wide list of ``key`` may read of it in
    ``namespace``, and why the rest is unread (None: what the checks need was read): its
    namespace's Pods (not the other namespaces', which hold GPUs too), its Namespace (the
    only one the checks read: absent when the API server says 404); no nodes, no CRDs."""
    why = refused.status.get("message") or str(refused)
    if key == "pods":
        path = f"/api/v1/namespaces/{namespace}/pods"
        return list_items(api, path, f"listing {path}", page=_PAGE), (
            f"{why}; only namespace {namespace}'s Pods were read"
        )
    if key == "namespaces":
        path = f"/api/v1/namespaces/{namespace}"
        try:
            got = call(api, "GET", path, f"reading {path}", missing_ok=True)
        except RequestFailed as e:
            if e.code != 403:
                raise
            return [], f"{why}; namespace {namespace} itself is not readable either"
        return ([got] if got else []), None
    return [], str(why)


def read_live(
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    connect_timeout_s: float = 15.0,
    request_timeout_s: float = 30.0,
    timeout_s: float = 180.0,
) -> ClusterSnapshot:
    """List nodes, pods (all namespaces), namespaces and CRDs from the live cluster.

    Uses ``kubeconfig`` or ``KUBECONFIG`` (or ``~/.kube/config``, or the in-cluster service
    account) and ``context`` (default: the current one), through ``kube.client.connect``.
    Three bounds, all explicit: ``connect_timeout_s`` for loading credentials and the first
    answer (``/version``), ``request_timeout_s`` for each list request after that,
    ``timeout_s`` for the whole read.  Raises ``ClusterUnreachable`` (exit 2) when the
    cluster cannot be read, whatever the reason.
    """
    try:
        api = connect(
            kubeconfig,
            context,
            request_timeout_s=request_timeout_s,
            connect_timeout_s=min(connect_timeout_s, timeout_s),
        )
    except ClusterUnreachable as e:
        raise _unreadable(e.reason) from e
    return read_with(api, timeout_s=timeout_s)


__all__ = [
    "SNAPSHOT_COMMAND",
    "ClusterSnapshot",
    "ClusterUnreachable",
    "build_snapshot",
    "load_snapshot",
    "read_live",
    "read_with",
    "snapshot_from_list",
]
