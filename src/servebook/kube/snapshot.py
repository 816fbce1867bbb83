"""Cluster state for ``servebook preflight``: nodes, pods, namespaces and CRDs, read from a
file or from the live cluster.

A snapshot file is exactly what

    kubectl get nodes,pods,namespaces,customresourcedefinitions -A -o json

prints: a ``List`` whose ``items`` mix the four kinds.  ``read_live`` lists the same four
kinds through the Kubernetes API (kr8s), honouring ``KUBECONFIG``, with explicit timeouts.
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
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servebook.findings import UsageError

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


class ClusterUnreachable(UsageError):
    """The cluster could not be read (no kubeconfig, unreachable, refused, timed out).

    Exit code 2, like any input the command cannot use: "could not check" is never a pass.
    """


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


def load_snapshot(path: str | os.PathLike[str]) -> ClusterSnapshot:
    """Read a snapshot file (the JSON of ``SNAPSHOT_COMMAND``); ``UsageError`` if unusable."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(
            f"{p}: no such file. Capture one with `{SNAPSHOT_COMMAND} > {p.name}`."
        ) from None
    except IsADirectoryError:
        raise UsageError(f"{p}: is a directory; --snapshot takes the JSON file.") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start}).") from None
    except OSError as e:
        raise UsageError(f"{p}: cannot read it ({e.strerror}).") from None
    # Parsed JSON holds no reference cycles, so the cyclic collector has nothing to find, but
    # it runs again and again while millions of dicts are created: a 60,000-pod snapshot
    # parses several times faster with it paused.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        doc = json.loads(text)
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
# The live edge.

_SERVICEACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def _kubeconfig_paths(kubeconfig: str | None) -> list[Path]:
    raw = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p]


def _credentials_problem(kubeconfig: str | None) -> str | None:
    """Why no cluster can be addressed at all, or None when there is a config to try."""
    paths = _kubeconfig_paths(kubeconfig)
    if any(p.is_file() for p in paths):
        return None
    if os.environ.get("KUBERNETES_SERVICE_HOST") and _SERVICEACCOUNT_TOKEN.is_file():
        return None
    if kubeconfig:
        where = f"--kubeconfig {kubeconfig}"
    elif os.environ.get("KUBECONFIG"):
        where = f"KUBECONFIG={os.environ['KUBECONFIG']}"
    else:
        where = "~/.kube/config (KUBECONFIG is unset)"
    return f"no kubeconfig: {where} does not exist, and this is not a Pod in a cluster"


def _describe(err: BaseException, doing: str) -> str:
    """One line for a failed read of the cluster, naming what was being done."""
    from kr8s import APITimeoutError, ServerError

    if isinstance(err, ServerError):
        response = getattr(err, "response", None)
        code = getattr(response, "status_code", None)
        if code in (401, 403):
            return (
                f"the API server refused {doing} ({code}: {err}); preflight needs "
                "cluster-wide list on nodes, pods, namespaces and customresourcedefinitions"
            )
        return f"the API server answered {code or 'an error'} {doing}: {err}"
    if isinstance(err, APITimeoutError):
        return f"timed out {doing}: {err}"
    name = type(err).__name__
    return f"{name} {doing}: {err}" if str(err) else f"{name} {doing}"


def _read_with_kr8s(
    kubeconfig: str | None,
    context: str | None,
    request_timeout_s: float,
    connected: threading.Event,
) -> ClusterSnapshot:
    import httpx
    import kr8s
    from kr8s.objects import CustomResourceDefinition, Namespace, Node, Pod

    doing = "loading the kubeconfig and asking the server for its version"
    # kr8s caches one Api per set of arguments (and, with no arguments, hands back any
    # cached one): name the kubeconfig explicitly, so a changed KUBECONFIG is honoured.
    paths = [str(p) for p in _kubeconfig_paths(kubeconfig) if p.is_file()]
    config = os.pathsep.join(paths) or None
    try:
        api = kr8s.api(kubeconfig=config, context=context)
        connected.set()
        api.timeout = httpx.Timeout(request_timeout_s)
        server = api.auth.server
        active = api.auth.active_context
        lists: dict[str, list[Obj]] = {}
        for key, cls, ns in (
            ("nodes", Node, None),
            ("pods", Pod, kr8s.ALL),
            ("namespaces", Namespace, None),
            ("crds", CustomResourceDefinition, None),
        ):
            doing = f"listing {cls.plural}"
            lists[key] = [dict(o) for o in api.get(cls, namespace=ns, raw=True)]
    except Exception as e:  # every failure of the edge is "could not read", exit 2
        raise ClusterUnreachable(
            f"cannot read the cluster: {_describe(e, doing)}. Check `kubectl get nodes` works "
            f"with the same KUBECONFIG/context, or pass --snapshot FILE "
            f"(`{SNAPSHOT_COMMAND} > FILE`)."
        ) from e
    finally:
        connected.set()
    source = f"cluster {server}" + (f" (context {active})" if active else "")
    return build_snapshot(
        nodes=lists["nodes"],
        pods=lists["pods"],
        namespaces=lists["namespaces"],
        crds=lists["crds"],
        source=source,
    )


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
    account) and ``context`` (default: the current one).  Three bounds, all explicit:
    ``connect_timeout_s`` for loading credentials and the first answer (``/version``, which
    kr8s asks before a request timeout can be set), ``request_timeout_s`` for each list
    request after that, ``timeout_s`` for the whole read (kr8s pages lists 100 objects a
    request, so 60,000 pods are 600 requests).  Raises ``ClusterUnreachable`` (exit 2) when
    the cluster cannot be read, whatever the reason.
    """
    problem = _credentials_problem(kubeconfig)
    if problem:
        raise ClusterUnreachable(
            f"cannot read the cluster: {problem}. Point KUBECONFIG at the cluster's config, "
            f"or pass --snapshot FILE (`{SNAPSHOT_COMMAND} > FILE`)."
        )
    result: list[ClusterSnapshot] = []
    failure: list[BaseException] = []
    connected = threading.Event()

    def work() -> None:
        try:
            result.append(_read_with_kr8s(kubeconfig, context, request_timeout_s, connected))
        except BaseException as e:
            failure.append(e)

    def gave_up(after: float, what: str) -> ClusterUnreachable:
        return ClusterUnreachable(
            f"cannot read the cluster: {what} within {after:g} s (server unreachable or "
            "overloaded). Check `kubectl get nodes` works with the same KUBECONFIG/context, "
            f"or pass --snapshot FILE (`{SNAPSHOT_COMMAND} > FILE`)."
        )

    # A daemon thread, so a server that never answers cannot keep the process alive after
    # the deadline; kr8s runs its own event loop in a thread of its own.
    started = time.monotonic()
    worker = threading.Thread(target=work, name="servebook-read-live", daemon=True)
    worker.start()
    if not connected.wait(min(connect_timeout_s, timeout_s)):
        raise gave_up(min(connect_timeout_s, timeout_s), "no answer from the API server")
    worker.join(max(0.0, timeout_s - (time.monotonic() - started)))
    if worker.is_alive():
        raise gave_up(timeout_s, "nodes, pods, namespaces and CRDs were not all listed")
    if failure:
        raise failure[0]
    return result[0]


__all__ = [
    "SNAPSHOT_COMMAND",
    "ClusterSnapshot",
    "ClusterUnreachable",
    "build_snapshot",
    "load_snapshot",
    "read_live",
    "snapshot_from_list",
]
