"""Which Pods of a namespace are which role of a deployment someone else made, by the
labels its own operator or chart puts on them; where each engine listens and where its
counters are.  Pure: it takes the namespace's Pods, Services and Deployments as the API
server lists them and returns plain data (``Found``); ``servebook attach`` does the I/O.

What each stack does, as read from its own source (kept in the fixtures' comments too):

========================  ========================================  =======================
stack                     roles by                                  engine port, metrics
========================  ========================================  =======================
KServe LLMInferenceSvc    ``app.kubernetes.io/component=llminfer-   decode vLLM on 8001
(kserve/kserve config/    enceservice-workload[-prefill]`` and      behind
llmisvcconfig/config-     ``llm-d.ai/role``                         ``llm-d-routing-sidecar``
llm-decode-template.yaml)                                           on 8000; HTTPS with TLS
llm-d (llm-d-incubation/  ``llm-d.ai/role=prefill|decode``          decode vLLM on
llm-d-modelservice                                                  ``--vllm-port`` (8200)
templates/_helpers.tpl)                                             behind ``routing-proxy``
NVIDIA Dynamo (ai-dynamo/ ``nvidia.com/dynamo-component-type``      worker port ``system``
dynamo deploy/operator/   ``prefill|decode``, or ``worker`` +       9090: vLLM's counters
internal/consts)          ``nvidia.com/dynamo-sub-component-type``  pass through
AIBrix StormService       ``role-name`` (and ``storm-service-name``) ``model.aibrix.ai/metric-
(vllm-project/aibrix)                                               port`` (default 8000)
production-stack (vllm-   ``model`` as the router's ``--prefill-    engine ``--port`` (8000);
project/production-stack  model-labels``/``--decode-model-labels``  the router is never read
helm/templates)                                                     (its vllm: series)
OME (sgl-project/ome      ``component=engine|decoder``              ``prometheus.io/port``
pkg/constants)                                                      annotation
LeaderWorkerSet /         ``disaggregatedset.x-k8s.io/role``;       the engine's ``--port``
DisaggregatedSet          only the leader serves (``worker-index``
                          ``=0``)
========================  ========================================  =======================

Whatever the stack, the engine's port is read from the engine's own argv (``--port``), and
a container that proxies to it (``--vllm-port``) is named and never scraped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servebook.engines.vllm import flag_value
from servebook.errors import UsageError
from servebook.kube import attach_pods
from servebook.kube.objects import is_terminating, labels_of, name_of

Obj = dict[str, Any]
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
VLLM_PORT = 8000  # vLLM's own default --port
EXPLICIT_FLAGS = "--role prefill=SELECTOR --role decode=SELECTOR --entry svc/NAME:PORT"


@dataclass(frozen=True)
class Objects:
    """A namespace's objects as the API server lists them."""

    pods: Sequence[Obj]
    services: Sequence[Obj] = ()
    deployments: Sequence[Obj] = ()


@dataclass(frozen=True)
class Endpoint:
    port: int
    scheme: str = "http"
    path: str = ""  # "/metrics" for a metrics endpoint


@dataclass
class Replica:
    """One Pod of a role: where its engine listens, where its counters are, its argv."""

    pod: str
    node: str
    ready: bool
    container: str
    api: Endpoint
    metrics: Endpoint
    argv: list[str]
    env: dict[str, str]
    form: str  # how the argv was found: argv, sh -c script, ... via eval
    notes: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


@dataclass
class Role:
    name: str  # prefill | decode | mixed
    selector: str  # label selector of its Pods (the record keeps this, not Pod names)
    replicas: list[Replica]


@dataclass
class Entry:
    service: str
    port: int  # the Service's port
    target_port: int  # the port on the Pods behind it
    scheme: str
    pods: list[str]  # Ready Pods behind it first


@dataclass
class Found:
    stack: str
    namespace: str
    roles: list[Role]
    entry: Entry | None
    unknown: list[str] = field(default_factory=list)

    @property
    def topology(self) -> str:
        names = {r.name for r in self.roles}
        return "pd" if {"prefill", "decode"} <= names else "mixed"

    def undetermined(self) -> list[str]:
        """Everything that could not be determined, the deployment's and each Pod's."""
        out = list(self.unknown)
        for r in self.roles:
            out += [f"{r.name} Pod {p.pod}: {u}" for p in r.replicas for u in p.unknown]
        return out


@dataclass(frozen=True)
class Stack:
    name: str
    # Pods of this stack -> {role: selector} (roles by its labels), or None if not it.
    roles: Callable[[Objects], dict[str, str] | None]
    # The label naming one instance (one deployment) of the stack, when it has one.
    instance: str = ""
    # The label whose value tells a Pod's role, for messages.
    labels: str = ""


# -- label selectors (equality-based, as servebook writes them) -------------------------


def parse_selector(text: str) -> list[tuple[str, str, str | None]]:
    """``a=b,c!=d,e,!f`` -> ``[(a, "=", b), (c, "!=", d), (e, "exists", None), (f, "absent",
    None)]``; a term of
    another form is unusable input (exit 2)."""
    terms: list[tuple[str, str, str | None]] = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            terms.append((k.strip(), "!=", v.strip()))
        elif term.startswith("!"):
            terms.append((term[1:].strip(), "absent", None))
        elif "=" in term:
            k, v = term.split("=", 1)
            terms.append((k.strip().rstrip("="), "=", v.strip()))
        elif term.replace("/", "").replace(".", "").replace("-", "").replace("_", "").isalnum():
            terms.append((term, "exists", None))
        else:
            raise UsageError(
                f"label selector {text!r}: term {term!r} is not KEY=VALUE, KEY!=VALUE or KEY.",
                hint="e.g. --role decode=app=my-decode,tier=gpu",
            )
    if not terms:
        raise UsageError(f"label selector {text!r} is empty.", hint="e.g. --role decode=app=x")
    return terms


def matches(labels: Mapping[str, str], selector: str) -> bool:
    for key, op, value in parse_selector(selector):
        if op == "exists" and key not in labels:
            return False
        if op == "absent" and key in labels:
            return False
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
    return True


def selector_of(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def select(pods: Iterable[Obj], selector: str) -> list[Obj]:
    return [p for p in pods if matches(labels_of(p), selector)]


# -- which Pods: the stacks -------------------------------------------------------------


def _serving(pods: Iterable[Obj]) -> list[Obj]:
    """Pods that serve: not being deleted, and of a multi-node group only the leader."""
    return [p for p in pods if not is_terminating(p) and labels_of(p).get(WORKER_INDEX, "0") == "0"]


def _by_label(
    objs: Objects, key: str, roles: Mapping[str, str], *, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Roles of the Pods whose ``key`` label has a value in ``roles`` (value -> role)."""
    out: dict[str, str] = {}
    for p in _serving(objs.pods):
        labels = labels_of(p)
        if base and any(labels.get(k) != v for k, v in base.items()):
            continue
        value = labels.get(key)
        if value is not None and value in roles:
            out.setdefault(roles[value], selector_of({**(base or {}), key: value}))
    return out


_PD = {"prefill": "prefill", "decode": "decode"}
_LLMD_ROLE = "llm-d.ai/role"
_LLMD_ROLES = {**_PD, "both": "mixed", "prefill-decode": "mixed"}
_KSERVE_COMPONENT = "app.kubernetes.io/component"
_KSERVE_WORKLOADS = ("llminferenceservice-workload", "llminferenceservice-workload-prefill")


def _kserve(objs: Objects) -> dict[str, str] | None:
    out: dict[str, str] = {}
    for workload in _KSERVE_WORKLOADS:
        base = {_KSERVE_COMPONENT: workload}
        for role, sel in _by_label(objs, _LLMD_ROLE, _LLMD_ROLES, base=base).items():
            out.setdefault(role, sel)
    return out or None


def _llm_d(objs: Objects) -> dict[str, str] | None:
    return _by_label(objs, _LLMD_ROLE, _LLMD_ROLES) or None


_DYN_TYPE = "nvidia.com/dynamo-component-type"
_DYN_SUB = "nvidia.com/dynamo-sub-component-type"


def _dynamo(objs: Objects) -> dict[str, str] | None:
    # v1beta1: the type is the role; older: type "worker" and the sub-component type.
    out = _by_label(objs, _DYN_TYPE, _PD)
    older = _by_label(objs, _DYN_SUB, _PD, base={_DYN_TYPE: "worker"})
    for role, sel in older.items():
        out.setdefault(role, sel)
    if not out:
        workers = [p for p in _serving(objs.pods) if labels_of(p).get(_DYN_TYPE) == "worker"]
        if workers:  # an aggregated worker: no sub-component type
            out["mixed"] = f"{_DYN_TYPE}=worker,!{_DYN_SUB}"
    return out or None


def _aibrix(objs: Objects) -> dict[str, str] | None:
    pods = [p for p in _serving(objs.pods) if "storm-service-name" in labels_of(p)]
    names = sorted({labels_of(p).get("role-name", "") for p in pods} - {""})
    if not names:
        return None
    pd = {r: f"role-name={r}" for r in names if r in _PD}
    if pd:
        return pd
    return {"mixed": f"role-name={names[0]}"} if len(names) == 1 else None


_PS_MODEL = "model"
_PS_RELEASE = "helm-release-name"


def _router_args(objs: Objects) -> list[str] | None:
    """The production-stack router's argv (its Deployment's container), if there is one:
    the router's CLI is the one with ``--service-discovery`` and ``--routing-logic``."""
    for d in objs.deployments:
        for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            args = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
            flat = " ".join(args)
            if "--service-discovery" in flat and "--routing-logic" in flat:
                return args
    return None


def _production_stack(objs: Objects) -> dict[str, str] | None:
    router = _router_args(objs)
    engines = [
        p for p in _serving(objs.pods) if _PS_MODEL in labels_of(p) and _PS_RELEASE in labels_of(p)
    ]
    if router is None and not engines:
        return None
    scope = flag_value(router or [], "--k8s-label-selector") or ""
    if scope:
        engines = [p for p in engines if matches(labels_of(p), scope)]
    models = sorted({labels_of(p)[_PS_MODEL] for p in engines})
    prefill = (flag_value(router or [], "--prefill-model-labels") or "").split(",")
    decode = (flag_value(router or [], "--decode-model-labels") or "").split(",")
    out: dict[str, str] = {}
    for role, wanted in (("prefill", prefill), ("decode", decode)):
        hit = [m for m in models if m in wanted]
        if hit:
            out[role] = selector_of({_PS_MODEL: hit[0]})
    if not out and len(models) == 1:
        out["mixed"] = selector_of({_PS_MODEL: models[0]})
    return out or None


def _ome(objs: Objects) -> dict[str, str] | None:
    found = _by_label(objs, "component", {"engine": "prefill", "decoder": "decode"})
    if "decode" not in found and "prefill" in found:  # engine alone: aggregated
        found = {"mixed": found["prefill"]}
    return found or None


def _disaggregated_set(objs: Objects) -> dict[str, str] | None:
    return _by_label(objs, "disaggregatedset.x-k8s.io/role", _PD) or None


def _leader_worker_set(objs: Objects) -> dict[str, str] | None:
    names = sorted(
        {
            labels_of(p)["leaderworkerset.sigs.k8s.io/name"]
            for p in _serving(objs.pods)
            if "leaderworkerset.sigs.k8s.io/name" in labels_of(p)
        }
    )
    if len(names) != 1:  # LWS alone has no roles: one group set is one mixed role
        return None
    return {"mixed": f"leaderworkerset.sigs.k8s.io/name={names[0]},{WORKER_INDEX}=0"}


# Checked in this order: KServe's Pods carry llm-d's role label too, llm-d's may be LWS's.
STACKS: tuple[Stack, ...] = (
    Stack("kserve", _kserve, "app.kubernetes.io/name", _LLMD_ROLE),
    Stack("llm-d", _llm_d, "", _LLMD_ROLE),
    Stack("dynamo", _dynamo, "nvidia.com/dynamo-graph-deployment-name", _DYN_TYPE),
    Stack("aibrix", _aibrix, "storm-service-name", "role-name"),
    Stack("production-stack", _production_stack, _PS_RELEASE, _PS_MODEL),
    Stack("ome", _ome, "ome.io/inferenceservice", "component"),
    Stack("disaggregatedset", _disaggregated_set, "disaggregatedset.x-k8s.io/name"),
    Stack("leaderworkerset", _leader_worker_set, "", WORKER_INDEX),
)
STACK_NAMES = (*(s.name for s in STACKS), "explicit")


# -- the whole deployment ---------------------------------------------------------------


def _replica(stack: str, pod: Obj) -> Replica:
    r = attach_pods.read_replica(stack, pod)
    return Replica(
        pod=r["pod"],
        node=r["node"],
        ready=r["ready"],
        container=r["container"],
        api=Endpoint(*r["api"]),
        metrics=Endpoint(*r["metrics"]),
        argv=r["argv"],
        env=r["env"],
        form=r["form"],
        notes=r["notes"],
        unknown=r["unknown"],
    )


def roles_of(stack: str, objs: Objects, selectors: Mapping[str, Sequence[str]]) -> list[Role]:
    """Each role's replicas now: every serving Pod its selectors match, read as ``stack``
    reads them.  A record keeps the selectors; this is how a command finds the Pods."""
    pods = _serving(objs.pods)
    out: list[Role] = []
    for role, sels in selectors.items():
        seen: dict[str, Obj] = {}
        for sel in sels:
            for p in select(pods, sel):
                seen.setdefault(name_of(p), p)
        replicas = [_replica(stack, p) for _, p in sorted(seen.items())]
        out.append(Role(role, " | ".join(sels), replicas))
    return out


def _pod_labels(objs: Objects) -> str:
    keys = sorted({k for p in objs.pods for k in labels_of(p)})
    return ", ".join(keys[:20]) + (" ..." if len(keys) > 20 else "") if keys else "(none)"


def unrecognised(namespace: str, objs: Objects) -> UsageError:
    known = ", ".join(f"{s.name} ({s.labels})" for s in STACKS if s.labels)
    return UsageError(
        f"namespace {namespace}: no Pods labelled the way a known stack labels them "
        f"(looked for {known}); {len(objs.pods)} Pod(s) found, with labels {_pod_labels(objs)}.",
        hint=f"name the roles yourself: `servebook attach NAME --backend kubernetes -n "
        f"{namespace} {EXPLICIT_FLAGS}` (or --role mixed=SELECTOR for one aggregated role).",
    )


def _instances(stack: Stack, objs: Objects, roles: Mapping[str, str]) -> list[str]:
    if not stack.instance:
        return []
    pods = [p for sel in roles.values() for p in select(_serving(objs.pods), sel)]
    return sorted({labels_of(p).get(stack.instance, "") for p in pods} - {""})


def _entry_pods(stack: str, objs: Objects, role_pods: list[Obj]) -> list[Obj]:
    """The Pods the stack's entry Service sends to (its router or gateway)."""
    pods = _serving(objs.pods)
    if stack == "dynamo":
        return [p for p in pods if labels_of(p).get(_DYN_TYPE) == "frontend"]
    if stack == "production-stack":
        routers = [
            d
            for d in objs.deployments
            if any(
                "--routing-logic" in " ".join(map(str, (c.get("args") or [])))
                for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers")
                or []
            )
        ]
        want = [
            d.get("spec", {}).get("template", {}).get("metadata", {}).get("labels") or {}
            for d in routers
        ]
        return [
            p
            for p in pods
            if any(w and selector_of(w) and matches(labels_of(p), selector_of(w)) for w in want)
        ]
    if stack == "ome":
        routers = [p for p in pods if labels_of(p).get("component") == "router"]
        return routers or role_pods
    if stack == "llm-d":
        return pods  # the gateway's Pods: any Pod a gateway Service sends to
    return role_pods


def _entry_service(stack: str, objs: Objects, role_pods: list[Obj]) -> tuple[Obj | None, str]:
    """The Service in front of the deployment, or None and why not."""
    if stack == "aibrix":
        return None, "AIBrix routes through its Envoy gateway (in another namespace)"
    candidates = attach_pods.services_for(objs.services, _entry_pods(stack, objs, role_pods))
    candidates = [s for s in candidates if attach_pods.service_port(s) is not None]
    if stack == "llm-d":  # the Gateway's Service, else the EPP's where it serves HTTP
        gateway = [s for s in candidates if "inference-gateway" in name_of(s)]
        candidates = gateway or [s for s in candidates if name_of(s).endswith("-epp")]
    if stack == "kserve":
        named = [s for s in candidates if name_of(s).endswith("-kserve-workload-svc")]
        candidates = named or candidates
    if len(candidates) == 1:
        return candidates[0], ""
    if not candidates:
        return None, "no Service in front of its Pods was found"
    names = ", ".join(sorted(name_of(s) for s in candidates))
    return None, f"several Services could be it ({names})"


def entry_of(objs: Objects, svc: Obj, want: str | None = None) -> Entry | None:
    """The entry through Service ``svc`` (port ``want``, else its first HTTP port)."""
    port = attach_pods.service_port(svc, want)
    if port is None:
        return None
    pods = attach_pods.behind(svc, _serving(objs.pods))
    first = pods[0] if pods else None
    target = attach_pods.target_port(port, first)
    if target is None:
        return None
    scheme = "https" if str(port.get("name", "")).startswith("https") else "http"
    scheme = "https" if attach_pods.scheme_at(first, target) == "https" else scheme
    return Entry(name_of(svc), int(port.get("port", 0)), target, scheme, [name_of(p) for p in pods])


def parse_entry(text: str) -> tuple[str, str | None]:
    """``svc/NAME:PORT`` (or ``service/NAME``) -> ``(NAME, PORT or None)``."""
    kind, _, rest = text.partition("/")
    name, _, port = rest.partition(":")
    if kind not in ("svc", "service") or not name:
        raise UsageError(
            f"--entry {text}: on Kubernetes the entry is a Service, as svc/NAME:PORT.",
            hint="e.g. --entry svc/my-router:80",
        )
    return name, port or None


def _given_entry(namespace: str, objs: Objects, text: str) -> Entry:
    name, port = parse_entry(text)
    svc = next((s for s in objs.services if name_of(s) == name), None)
    if svc is None:
        have = ", ".join(sorted(name_of(s) for s in objs.services)) or "none"
        raise UsageError(
            f"--entry {text}: no Service {name} in namespace {namespace} (Services: {have})."
        )
    entry = entry_of(objs, svc, port)
    if entry is None:
        ports = [str(p.get("port")) for p in svc.get("spec", {}).get("ports") or []]
        raise UsageError(
            f"--entry {text}: Service {name} has no port {port or '(HTTP)'} that resolves to a "
            f"Pod port (its ports: {', '.join(ports) or 'none'})."
        )
    return entry


def _finish(
    stack: str,
    namespace: str,
    objs: Objects,
    selectors: Mapping[str, Sequence[str]],
    entry_text: str | None,
) -> Found:
    order = {r: i for i, r in enumerate(ROLE_NAMES)}
    selectors = dict(sorted(selectors.items(), key=lambda kv: order.get(kv[0], 9)))
    roles = roles_of(stack, objs, selectors)
    unknown: list[str] = []
    for r in roles:
        if not r.replicas:
            unknown.append(f"role {r.name}: no Pod matches {r.selector}")
    role_pods = [
        p
        for sel in (s for v in selectors.values() for s in v)
        for p in select(_serving(objs.pods), sel)
    ]
    if entry_text is not None:
        entry: Entry | None = _given_entry(namespace, objs, entry_text)
    else:
        svc, why = _entry_service(stack, objs, role_pods)
        entry = entry_of(objs, svc) if svc is not None else None
        if svc is not None and entry is None:
            why = f"Service {name_of(svc)} has no HTTP port that resolves to a Pod port"
        if entry is None:
            unknown.append(f"the entry: {why}; give --entry svc/NAME:PORT")
    return Found(stack, namespace, roles, entry, unknown)


def discover(namespace: str, objs: Objects, *, entry: str | None = None) -> Found:
    """The deployment in ``namespace`` as its stack labels it; unusable input (exit 2)
    naming the explicit flags when no known labelling is found, and naming the instances
    when the namespace holds several of one stack."""
    for stack in STACKS:
        roles = stack.roles(objs)
        if not roles:
            continue
        instances = _instances(stack, objs, roles)
        if len(instances) > 1:
            example = f"{stack.instance}={instances[0]}"
            raise UsageError(
                f"namespace {namespace} holds {len(instances)} {stack.name} deployments "
                f"({', '.join(instances)}): which one?",
                hint=f"name its roles: {EXPLICIT_FLAGS}, e.g. --role decode="
                f"{roles.get('decode', roles.get('mixed', ''))},{example}",
            )
        if instances:
            roles = {r: f"{sel},{stack.instance}={instances[0]}" for r, sel in roles.items()}
        return _finish(stack.name, namespace, objs, {r: [s] for r, s in roles.items()}, entry)
    raise unrecognised(namespace, objs)


ROLE_NAMES = ("prefill", "decode", "mixed")


def explicit(
    namespace: str, objs: Objects, roles: Sequence[tuple[str, str]], entry: str | None
) -> Found:
    """The deployment as the user names it: ``--role ROLE=SELECTOR`` (a role given twice
    is the union of its selectors) and ``--entry svc/NAME:PORT``."""
    selectors: dict[str, list[str]] = {}
    for role, sel in roles:
        if role not in ROLE_NAMES:
            raise UsageError(
                f"--role {role}={sel}: the role is one of {', '.join(ROLE_NAMES)}.",
                hint=f"e.g. {EXPLICIT_FLAGS}",
            )
        parse_selector(sel)
        selectors.setdefault(role, []).append(sel)
    if "mixed" in selectors and len(selectors) > 1:
        raise UsageError(
            "--role mixed is one aggregated role: give it alone, or prefill and decode."
        )
    if ("prefill" in selectors) != ("decode" in selectors):
        raise UsageError(
            "a PD deployment has both roles: give --role prefill=SELECTOR and "
            "--role decode=SELECTOR.",
            hint=EXPLICIT_FLAGS,
        )
    found = _finish("explicit", namespace, objs, selectors, entry)
    empty = [r for r in found.roles if not r.replicas]
    if empty:
        raise UsageError(
            f"namespace {namespace}: "
            + "; ".join(f"--role {r.name}={r.selector} matches no Pod" for r in empty)
            + f" (Pod labels here: {_pod_labels(objs)}).",
        )
    return found
