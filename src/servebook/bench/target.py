"""What a sweep measures, and the provenance it records: from a servebook deployment, or
from the URL of any OpenAI-compatible server the user already runs.

Provenance is read from the servers themselves where it can be (``/version``, the
deployment's recorded command lines) rather than from what the user says, and passes
through ``servebook.redact`` before it is recorded: a results file is made to be shared,
so secret flags, variables and URL credentials are replaced and ``provenance.redacted``
names what was (never the value).

The target is asked once, before any load, what it serves (``probe``, ``GET /v1/models``
with the key): a refusal is ``auth.ApiKeyError`` (exit 2), not a sweep of refused
requests; a ``--url`` where nothing answers, or where something that is not an
OpenAI-compatible server answers, is unusable input (exit 2) with nothing written; and a
prompt plus output longer than the served model's context is refused (``check_fits``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from servebook import auth, http, redact
from servebook.bench.endpoint import Endpoint
from servebook.bench.protocol import ProtocolSettings, Target
from servebook.bench.server_tokenizer import ServerTokenizer
from servebook.bench.workload import PromptSource
from servebook.deployment.view import DeploymentView
from servebook.engines import counters_of
from servebook.engines.handoff import HandoffThreshold, block_size, threshold
from servebook.errors import UsageError
from servebook.metrics.scrape import ScrapeError, scrape
from servebook.results.provenance import fetch_engine_version, make_provenance
from servebook.results.schema import LoadOrigin, Provenance, RoleProvenance


@dataclass(frozen=True)
class InCluster:
    """Where in-cluster load agents run (``kube/load_job.py``): the Job, its namespace, and
    the entry Service's cluster address the load is sent to."""

    namespace: str
    job: str
    entry_url: str  # http://SERVICE.NAMESPACE.svc:PORT, as the Pods dial it
    nodes: tuple[str, ...] = ()  # filled in by the bench machine once it knows them


@dataclass
class Subject:
    """A benchmark subject: the Target plus what provenance needs to know about it."""

    target: Target
    model_dir: str | None  # the tokenizer/config directory
    roles: list[RoleProvenance]
    engine_version: str | None
    info: dict[str, Any]  # recipe, topology, deployment, url, api
    view: DeploymentView | None = None  # None: a server given by --url
    tokenize_url: str = ""  # an engine's base URL for /tokenize (not a router's)
    max_model_len: int | None = None  # the served model's context (/v1/models), if known
    cluster: InCluster | None = None  # the load runs in the cluster (``bench/in_cluster``)


def pd_min_share(
    decode_url: str | tuple[str, ...], prompt_tokens: Sequence[int]
) -> HandoffThreshold:
    """The verify threshold for prompts of these server-side lengths (``handoff_lengths``):
    a bench point whose handoff share falls below it is invalid (the handoff failed
    open).  ``decode_url``: decode's /metrics base URL, or its replicas' (they share one
    block size)."""
    first = decode_url if isinstance(decode_url, str) else decode_url[0]
    try:
        block = block_size(scrape(first, timeout=5.0))
    except ScrapeError as e:
        raise UsageError(
            f"cannot read decode's /metrics to size the handoff threshold: {e}"
        ) from None
    return threshold(prompt_tokens, block)


def _first_line(body: str, limit: int = 160) -> str:
    """A response body as one short line for a message: its first non-blank line, cut
    (an HTML error page is never pasted whole)."""
    line = next((ln.strip() for ln in body.splitlines() if ln.strip()), "(empty body)")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def probe(endpoint: Endpoint, timeout_s: float = 10.0, *, strict: bool = True) -> int | None:
    """Ask the target once, before any load, what it serves (``GET /v1/models`` with the
    key); returns the served model's context length (``max_model_len``, vLLM's field) when
    the answer gives one.  A 401/403 is ``auth.ApiKeyError``.  ``strict`` (a server given
    by ``--url``): nothing answering, an answer that is not an OpenAI model list, or a
    list without ``endpoint.model`` is ``UsageError`` (exit 2) naming what answered;
    else (a deployment servebook already checked is up) only the key and the length are
    judged."""
    base = endpoint.base_url.rstrip("/")
    url = base + "/v1/models"
    try:
        resp = http.get(url, timeout=timeout_s, headers=auth.headers(endpoint.api_key))
    except http.HTTPError as e:
        if not strict:
            return None
        raise UsageError(
            f"nothing answers at {redact.url(base)} ({e}). Start the server, or give the "
            "--url it listens on; nothing was measured or written."
        ) from None
    if auth.is_rejection(resp.status):
        raise auth.rejected(resp.status, url, endpoint.api_key)
    try:
        doc = resp.json() if resp.status == 200 else None
    except ValueError:
        doc = None
    models = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(models, list):
        if not strict:
            return None
        raise UsageError(
            f"{redact.url(url)} answered {resp.status} "
            f"{_first_line(redact.text(resp.text))!r}, not an OpenAI-compatible model list: "
            "give --url the base URL of an OpenAI-compatible server (vLLM, SGLang, ...); "
            "nothing was measured or written."
        )
    served = {str(m.get("id")): m for m in models if isinstance(m, dict)}
    entry = served.get(endpoint.model)
    if entry is None:
        if not strict:
            return None
        raise UsageError(
            f"--model {endpoint.model!r} is not served at {redact.url(base)} (it serves: "
            f"{', '.join(sorted(served)) or 'no model'}): give --model one of those."
        )
    n = entry.get("max_model_len")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def check_fits(context: int | None, input_len: int, output_len: int, model: str) -> None:
    """A prompt plus its output longer than the served model's context would fail every
    request: ``UsageError`` (exit 2) before any load."""
    if context is not None and input_len + output_len > context:
        raise UsageError(
            f"--input-len {input_len} + --output-len {output_len} = "
            f"{input_len + output_len} tokens, more than the served model {model!r} takes "
            f"(max_model_len {context}, from /v1/models): lower them to at most {context} "
            "together; nothing was measured or written."
        )


def from_deployment(
    view: DeploymentView, *, api: str, request_timeout_s: float, api_key: str | None = None
) -> Subject:
    """A deployment's subject: its entry point, every engine's counters, and provenance
    from the command lines as applied.  A role known to be down is unusable input; a
    deployment that refuses ``api_key`` (a bearer token) is ``auth.ApiKeyError``."""
    dead = view.dead_roles()
    if dead:
        raise UsageError(
            f"deployment {view.name}: role(s) {', '.join(dead)} not running. Run "
            f"`servebook status {view.name}`, then `servebook down {view.name}` and up again."
        )
    plan = view.plan
    engines = view.engines
    metrics: dict[str, str | tuple[str, ...]] = {
        r.name: r.all_metrics_urls if r.replica_metrics_urls else r.metrics_url for r in engines
    }
    version = fetch_engine_version(engines[0].api_url)
    roles = [
        RoleProvenance(
            name=r.name,
            command=list(r.argv),
            env=dict(r.env),  # redacted with the rest of the provenance (``provenance``)
            url=r.api_url,
            engine_version=fetch_engine_version(r.api_url) if r.kind == "engine" else None,
            image=r.image or None,
        )
        for r in view.roles
    ]
    decode = "decode" if plan.topology == "pd" else None
    context = probe(
        Endpoint(view.entry_url, view.served_model_name, api_key=api_key),
        min(10.0, request_timeout_s),
        strict=False,
    )
    target = Target(
        endpoint=Endpoint(
            base_url=view.entry_url,
            model=view.served_model_name,
            api=api,  # type: ignore[arg-type]
            request_timeout_s=request_timeout_s,
            api_key=api_key,
        ),
        metrics_urls=metrics,
        decode_role=decode,
        accelerators_used=view.accelerators,
        problems=lambda: {r.name: r.describe() for r in view.roles if r.alive() is False},
        replica_names={r.name: r.all_replica_names for r in engines if r.replica_metrics_urls},
        speculative=view.claims().speculative,
    )
    return Subject(
        target=target,
        model_dir=view.local_model_dir,
        roles=roles,
        engine_version=version,
        info={
            "deployment": view.name,
            "recipe": view.recipe,
            "topology": plan.topology,
            "speculative": plan.speculative,
            "backend": view.backend,
            "url": view.entry_url,
            "api": api,
        },
        view=view,
        tokenize_url=engines[0].api_url,
        max_model_len=context,
    )


def from_url(
    url: str,
    *,
    model: str,
    tokenizer: str | None,
    api: str,
    request_timeout_s: float,
    api_key: str | None = None,
) -> Subject:
    if not url.startswith(("http://", "https://")):
        raise UsageError(
            f"--url {redact.url(url)!r}: give a base URL such as http://127.0.0.1:8000"
        )
    base = url.rstrip("/").removesuffix("/v1")
    context = probe(Endpoint(base, model, api_key=api_key), min(10.0, request_timeout_s))
    version = fetch_engine_version(base)
    # Any OpenAI-compatible server: its counters are evidence when they are an engine's
    # servebook reads (vLLM's, SGLang's); otherwise points stand on the client's figures
    # and say "no server evidence" (--require-server-evidence makes them invalid).
    engine: str | None = None
    try:
        counters = counters_of(set(scrape(base, timeout=5.0).samples))
        engine = counters.engine if counters is not None else None
    except ScrapeError:
        pass
    metrics = {"server": base} if engine is not None else {}
    target = Target(
        endpoint=Endpoint(
            base_url=base,
            model=model,
            api=api,  # type: ignore[arg-type]
            request_timeout_s=request_timeout_s,
            api_key=api_key,
        ),
        metrics_urls=metrics,
    )
    return Subject(
        target=target,
        model_dir=tokenizer,
        roles=[RoleProvenance(name="server", url=base, engine_version=version)],
        engine_version=version,
        info={"url": base, "api": api, "topology": "external", "engine": engine},
        tokenize_url=base,
        max_model_len=context,
    )


def load_origin(subject: Subject, agents: int) -> LoadOrigin:
    """Where the load comes from (this machine: the bench command's process, or ``agents``
    load agents beside it) and its route: the view's (``DeploymentView.route``: direct,
    or through the port-forwards the view holds), a ``--url`` server's direct."""
    import socket

    if subject.cluster is not None:
        return cluster_origin(subject.cluster, agents, socket.gethostname())
    view = subject.view
    return LoadOrigin(
        agents=agents,
        where="this machine" if agents == 1 else f"{agents} agents on this machine",
        host=socket.gethostname(),
        route=view.route if view is not None else "direct",
        route_detail=view.route_detail if view is not None else None,
        target_url=redact.url(subject.target.endpoint.base_url),
    )


def cluster_origin(c: InCluster, agents: int, host: str) -> LoadOrigin:
    """The load of ``agents`` in-cluster agents: from the Job's Pods to the entry Service's
    cluster address (route ``cluster-service``), no relay between them and the servers."""
    nodes = f" on node(s) {', '.join(c.nodes)}" if c.nodes else ""
    return LoadOrigin(
        agents=agents,
        where=f"{agents} agent(s) in namespace {c.namespace}{nodes} (Job {c.job})",
        host=host,
        route="cluster-service",
        route_detail=f"from the Job's Pods to {c.entry_url}, the entry Service's cluster "
        "address; each engine's counters read at its Pod IP",
        target_url=redact.url(c.entry_url),
        nodes=list(c.nodes),
        namespace=c.namespace,
        job=c.job,
    )


def provenance(
    subject: Subject,
    settings: ProtocolSettings,
    prompts: PromptSource,
    load: LoadOrigin | None = None,
) -> Provenance:
    """The run's provenance as recorded: redacted (module docstring), with
    ``redacted`` listing where and what (``roles[decode].command --api-key``)."""
    prov = make_provenance(
        target=subject.info,
        model_name=subject.target.endpoint.model,
        model_dir=subject.model_dir,
        protocol=settings.to_dict(),
        workload=workload_of(settings, prompts, subject.target.endpoint),
        seed=settings.seed,
        engine="vllm" if subject.engine_version else None,
        engine_version=subject.engine_version,
        roles=subject.roles,
        accelerators_used=subject.target.accelerators_used,
    )
    prov.load = load
    return redacted(prov)


def redacted(prov: Provenance) -> Provenance:
    """Provenance with secrets replaced in what may carry them, and ``redacted`` naming
    what was (``servebook.redact.provenance``)."""
    return Provenance.model_validate(redact.provenance(prov.model_dump()))


def workload_of(
    settings: ProtocolSettings, prompts: PromptSource, endpoint: Endpoint | None = None
) -> dict[str, Any]:
    """What provenance records as the workload: the prompt source, a replay's speed (how
    the trace's clock was sent is the workload, not the protocol), and how its requests
    were salted against the prefix cache (``salted``)."""
    w = prompts.describe()
    if settings.replay_speed is not None:
        w["replay_speed"] = settings.replay_speed
    if endpoint is not None and endpoint.cache_salt is not None:
        w["cache_salt"] = "per request" if endpoint.salt_each else "per run"
    return w


def salted(subject: Subject, prompts: PromptSource, run: int) -> Target:
    """The subject's target with vLLM's ``cache_salt`` on every request (issue 32, finding
    2: no request is served from a cache an earlier request of this run or another filled):
    the run's own salt, per request unless the workload shares prefixes (a prefix pool, a
    conversation: per run, so they share within it).  A server that is not vLLM (no
    ``/version``: provenance's own rule for the engine) gets no salt, nor does an attached
    deployment, whose entry point may be a gateway that refuses a field it does not know."""
    attached = subject.view is not None and subject.view.claimed is not None
    if not subject.engine_version or attached:
        return subject.target
    each = getattr(prompts, "shares_prefixes", None) is not True
    ep = replace(subject.target.endpoint, cache_salt=f"sb{run}", salt_each=each)
    return replace(subject.target, endpoint=ep)


def tokenizer_for(subject: Subject, given: str | None) -> str | ServerTokenizer:
    """What builds the exact-length prompts: ``--tokenizer DIR`` when given (it must hold a
    tokenizer); else the deployment's model directory when it is on this machine; else the
    server's own ``/tokenize`` and ``/detokenize`` (a cluster's weights live on its nodes,
    and a ``--url`` server's anywhere), asked at an engine, not a router."""
    if given is not None:
        if not _has_tokenizer(given):
            raise UsageError(
                f"--tokenizer {given}: no tokenizer.json or tokenizer_config.json there. Pass "
                "the model directory, or leave --tokenizer out to tokenize on the server."
            )
        return given
    if subject.model_dir and _has_tokenizer(subject.model_dir):
        return subject.model_dir
    return ServerTokenizer(subject.tokenize_url, subject.target.endpoint.model)


def _has_tokenizer(d: str) -> bool:
    return (Path(d) / "tokenizer.json").is_file() or (Path(d) / "tokenizer_config.json").is_file()


__all__ = [
    "HandoffThreshold",
    "InCluster",
    "Subject",
    "check_fits",
    "cluster_origin",
    "from_deployment",
    "from_url",
    "load_origin",
    "pd_min_share",
    "probe",
    "provenance",
    "redacted",
    "tokenizer_for",
]
