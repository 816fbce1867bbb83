"""One Pod of an attached deployment read as a replica: which container is the engine,
the port its API listens on, where its counters are (port, scheme, path), its argv; and a
Service read as the deployment's entry.  Pure (see ``servebook.kube.stacks``).

The port is the engine's own: its ``--port`` (vLLM's default 8000 without one).  A
container that proxies to the engine (llm-d's ``routing-proxy`` and KServe's
``llm-d-routing-sidecar``: ``--port`` it listens on, ``--vllm-port`` it forwards to) is
named in the notes and is never where servebook reads counters.  The stack's own metrics
conventions apply on top: Dynamo's worker port ``system`` (9090, ``DYN_SYSTEM_PORT``),
AIBrix's ``model.aibrix.ai/metric-port`` label, OME's ``prometheus.io/port`` and
``prometheus.io/path`` annotations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from servebook.engines import cmdline
from servebook.engines.vllm import flag_value
from servebook.kube import attach_argv
from servebook.kube.objects import annotations_of, is_ready, labels_of, name_of

Obj = dict[str, Any]
VLLM_PORT = 8000
DYNAMO_SYSTEM_PORT = 9090


def _int(value: Any) -> int | None:
    try:
        n = int(str(value).strip().strip('"'))
    except (TypeError, ValueError):
        return None
    return n if 0 < n < 65536 else None


def _argv(c: Mapping[str, Any]) -> list[str]:
    return [str(x) for x in (c.get("command") or []) + (c.get("args") or [])]


def containers(pod: Obj) -> list[Obj]:
    return list(pod.get("spec", {}).get("containers") or [])


def sidecars(pod: Obj) -> list[Obj]:
    """Init containers that keep running beside the others (``restartPolicy: Always``:
    Kubernetes' native sidecars, as llm-d and KServe run their routing proxy)."""
    inits = pod.get("spec", {}).get("initContainers") or []
    return [c for c in inits if c.get("restartPolicy") == "Always"]


def container_ports(c: Mapping[str, Any]) -> list[tuple[str, int]]:
    return [
        (str(p.get("name", "")), n)
        for p in c.get("ports") or []
        if (n := _int(p.get("containerPort"))) is not None
    ]


def engine_container(pod: Obj) -> tuple[Obj, attach_argv.Resolved] | None:
    """The container that runs vLLM (as ``servebook.kube.attach_argv`` reads it)."""
    for c in containers(pod):
        resolved = attach_argv.resolve(c)
        if resolved.engine is not None:
            return c, resolved
    return None


def proxies(pod: Obj, engine: str) -> list[tuple[str, int | None, int]]:
    """``(container, port it listens on, engine port it forwards to)`` of each container
    beside the engine that forwards to a vLLM port (``--vllm-port``)."""
    out: list[tuple[str, int | None, int]] = []
    for c in [*sidecars(pod), *containers(pod)]:
        if c.get("name") == engine:
            continue
        args = _argv(c)
        target = _int(flag_value(args, "--vllm-port"))
        if target is None:
            continue
        listen = _int(flag_value(args, "--port"))
        if listen is None and container_ports(c):
            listen = container_ports(c)[0][1]
        out.append((str(c.get("name", "?")), listen, target))
    return out


def _dynamo_system_port(c: Mapping[str, Any], env: Mapping[str, str]) -> tuple[int, str]:
    for name, n in container_ports(c):
        if name == "system":
            return n, "its port named system"
    if _int(env.get("DYN_SYSTEM_PORT")) is not None:
        return int(env["DYN_SYSTEM_PORT"]), "DYN_SYSTEM_PORT"
    return DYNAMO_SYSTEM_PORT, "Dynamo's default system port"


def _unstated_port(
    stack: str,
    pod: Obj,
    c: Mapping[str, Any],
    engine: cmdline.EngineCommand | None,
    beside: list[tuple[str, int | None, int]],
    notes: list[str],
) -> int:
    """The engine's port when its command line has no ``--port``: the port a proxy beside
    it forwards to, AIBrix's label, the container's first declared port (for an engine
    servebook does not read) or vLLM's default; where it came from goes to ``notes``."""
    targets = [t for _, _, t in beside]
    declared = container_ports(c)
    if targets:
        port = targets[0]
        notes.append(f"engine port {port} from {beside[0][0]}'s --vllm-port")
    elif stack == "aibrix" and _int(labels_of(pod).get("model.aibrix.ai/port")):
        port = int(labels_of(pod)["model.aibrix.ai/port"])
        notes.append(f"engine port {port} from its model.aibrix.ai/port label")
    elif engine is None and declared:
        port = declared[0][1]
        notes.append(f"port {port}: the container's first declared port")
    else:
        port = VLLM_PORT
        if engine is not None and "dynamo" not in engine.entrypoint:
            notes.append(f"no --port: vLLM's default {VLLM_PORT}")
    return port


def read_replica(stack: str, pod: Obj) -> dict[str, Any]:
    """The replica's fields (``servebook.kube.stacks.Replica``) read from one Pod."""
    name = name_of(pod)
    node = str(pod.get("spec", {}).get("nodeName") or "?")
    notes: list[str] = []
    unknown: list[str] = []
    found = engine_container(pod)
    if found is None:
        first = (containers(pod) or [{}])[0]
        shown = " ".join(_argv(first))[:120] or "(the image's entrypoint)"
        unknown.append(
            f"no container runs vLLM in a shape servebook reads (container "
            f"{first.get('name', '?')} runs: {shown}); its counters are read as vLLM's"
        )
        c, resolved = first, attach_argv.resolve(first)
    else:
        c, resolved = found
    env, _ = attach_argv.env_values(c)
    engine = resolved.engine
    unknown += resolved.unknown
    port = _int(engine.value("--port")) if engine else None
    beside = proxies(pod, str(c.get("name", "")))
    if port is None:
        port = _unstated_port(stack, pod, c, engine, beside, notes)
    scheme = "https" if engine is not None and engine.has("--ssl-certfile") else "http"
    api_port, metrics_port, path = port, port, "/metrics"
    if engine is not None and "dynamo.vllm" in engine.entrypoint:
        api_port, why = _dynamo_system_port(c, env)
        metrics_port = api_port
        scheme = "http"
        notes.append(
            f"Dynamo worker: no OpenAI API of its own (requests go through the frontend); "
            f"health and vLLM's counters on its system port {api_port} ({why})"
        )
    elif stack == "aibrix":
        label = labels_of(pod).get("model.aibrix.ai/metric-port")
        if _int(label) is not None:
            metrics_port = int(str(label))
            notes.append(f"metrics port {metrics_port} from its model.aibrix.ai/metric-port label")
    elif stack == "ome":
        anns = annotations_of(pod)
        if _int(anns.get("prometheus.io/port")) is not None:
            metrics_port = int(str(anns["prometheus.io/port"]))
            path = str(anns.get("prometheus.io/path") or "/metrics")
            notes.append(f"metrics at :{metrics_port}{path} from its prometheus.io annotations")
    for proxy, listen, target in beside:
        at = f" on {listen}" if listen else ""
        notes.append(f"{proxy}{at} proxies to {target}: not the engine, never read for counters")
        if target != port:
            unknown.append(f"{proxy} forwards to port {target}, but the engine listens on {port}")
        if listen is not None and metrics_port == listen:
            unknown.append(
                f"the metrics port {listen} named by the stack is {proxy}'s; read the engine's "
                f"{port} instead"
            )
            metrics_port, path = port, "/metrics"
    if scheme == "https":
        notes.append(
            "HTTPS (the engine's --ssl-certfile): servebook checks certificates, so one the "
            "deployment signed itself makes every read fail, naming it; never a pass"
        )
    return {
        "pod": name,
        "node": node,
        "ready": is_ready(pod),
        "container": str(c.get("name", "?")),
        "api": (api_port, scheme, ""),
        "metrics": (metrics_port, scheme, path),
        "argv": resolved.argv,
        "env": env,
        "form": resolved.form,
        "notes": notes,
        "unknown": unknown,
    }


# -- Services ---------------------------------------------------------------------------


def is_headless(svc: Obj) -> bool:
    return svc.get("spec", {}).get("clusterIP") == "None"


def behind(svc: Obj, pods: Iterable[Obj]) -> list[Obj]:
    """The Pods a Service sends to (its selector's labels all equal), Ready ones first."""
    sel = svc.get("spec", {}).get("selector") or {}
    if not sel:
        return []
    hit = [p for p in pods if all(labels_of(p).get(k) == v for k, v in sel.items())]
    return sorted(hit, key=lambda p: (not is_ready(p), name_of(p)))


def services_for(services: Iterable[Obj], pods: Sequence[Obj]) -> list[Obj]:
    """Non-headless Services that send to at least one of ``pods``."""
    names = {name_of(p) for p in pods}
    return [
        s
        for s in services
        if not is_headless(s) and any(name_of(p) in names for p in behind(s, pods))
    ]


def service_port(svc: Obj, want: str | None = None) -> Obj | None:
    """The Service's port named or numbered ``want``; without one, its first port that is
    not gRPC or metrics."""
    ports = list(svc.get("spec", {}).get("ports") or [])
    if want is not None:
        return next((p for p in ports if str(p.get("port")) == want or p.get("name") == want), None)
    skip = ("grpc", "metrics", "health", "status")
    usable = [p for p in ports if not any(s in str(p.get("name", "")) for s in skip)]
    named = [p for p in usable if str(p.get("name", "")).startswith("http")]
    return (named or usable or [None])[0]


def target_port(port: Obj, pod: Obj | None) -> int | None:
    """The Pod port a Service port sends to (a named targetPort is looked up on the Pod)."""
    target = port.get("targetPort", port.get("port"))
    if _int(target) is not None:
        return int(str(target))
    for c in [*sidecars(pod or {}), *containers(pod or {})]:
        for name, n in container_ports(c):
            if name == target:
                return n
    return None


def scheme_at(pod: Obj | None, port: int) -> str:
    """https when what listens on ``port`` in the Pod serves TLS (vLLM's ``--ssl-certfile``,
    the routing sidecar's ``--secure-proxy=true``), else http."""
    for c in [*sidecars(pod or {}), *containers(pod or {})]:
        args = _argv(c)
        listens = {n for _, n in container_ports(c)} | {_int(flag_value(args, "--port"))}
        if port not in listens:
            continue
        if flag_value(args, "--secure-proxy") == "true" or "--ssl-certfile" in " ".join(args):
            return "https"
        resolved = attach_argv.resolve(c)
        if resolved.engine is not None and resolved.engine.has("--ssl-certfile"):
            return "https"
    return "http"


__all__ = [
    "behind",
    "container_ports",
    "engine_container",
    "flag_value",
    "proxies",
    "read_replica",
    "scheme_at",
    "service_port",
    "services_for",
    "sidecars",
    "target_port",
]
