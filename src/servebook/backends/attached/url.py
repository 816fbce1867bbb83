"""``servebook attach NAME --role ROLE=URL ...``: an attached deployment's record made from
URLs, and what attach reports it found.

Each ``--role`` is one replica (a role given twice is two); ``ROLE=URL,metrics=URL`` names
where the engine's own ``/metrics`` is when not at the API's URL.  The command line of each
replica is read from the process that listens on its port when that is on this machine
(``backends.attached.listener``), and its claims from that command line; attach says plainly what
it could not determine.  Attach only reads (``GET /v1/models``, ``GET /metrics``): it
changes nothing on the deployment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from servebook import http, redact, urls
from servebook.backends.attached.listener import Listener, read_listener, url_port
from servebook.backends.attached.record import (
    AttachedDeployment,
    AttachedReplica,
    AttachedRole,
    engine_command,
    roles_problem,
)
from servebook.engines import counters_of
from servebook.engines.cmdline import kv_transfer_config, speculative_config
from servebook.errors import UsageError
from servebook.metrics.scrape import ScrapeError, scrape

ROLE_HELP = "ROLE=URL[,metrics=URL] with ROLE mixed, prefill or decode"


def _base_url(text: str, what: str) -> str:
    """The base URL ``what`` gives; refused (exit 2) when it carries credentials
    (``user:password@``, ``?token=``): servebook sends none from a URL, and its record keeps
    none (``files.write_record``), so attaching by it would keep a URL that reaches nothing."""
    url = urls.server_url(text.strip(), what).rstrip("/").removesuffix("/v1")
    shown = redact.url(url)
    if shown != url:
        raise UsageError(
            f"{what} {shown!r}: credentials in a URL are never sent by servebook nor kept "
            "in its record of the deployment.",
            hint="Give the engine's own URL without them; verify and bench send the engines' "
            "API key as a bearer token (--api-key KEY, or OPENAI_API_KEY).",
        )
    return url


def parse_role(text: str) -> tuple[str, str, str]:
    """``decode=http://h:8200,metrics=http://h:9200`` -> (role, API URL, metrics URL)."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not name or not rest:
        raise UsageError(f"--role {text!r}: write {ROLE_HELP}.")
    api, *extra = rest.split(",")
    metrics = ""
    for item in extra:
        key, sep, value = item.partition("=")
        if key.strip() != "metrics" or not sep:
            raise UsageError(f"--role {text!r}: {item!r} is not metrics=URL; write {ROLE_HELP}.")
        metrics = _base_url(value, f"--role {name} metrics")
    api_url = _base_url(api, f"--role {name}")
    return name, api_url, metrics or api_url


Reader = Callable[[str], Listener]


def roles_from(specs: Sequence[str], read: Reader = read_listener) -> list[AttachedRole]:
    """The roles the ``--role`` options give, each replica's command line read with
    ``read`` (its URL -> the listening process); exit 2 naming what is wrong."""
    if not specs:
        raise UsageError(f"no --role given: {ROLE_HELP}.")
    roles: dict[str, AttachedRole] = {}
    seen: set[str] = set()
    for spec in specs:
        name, api_url, metrics_url = parse_role(spec)
        if api_url in seen:
            raise UsageError(f"--role {spec!r}: {api_url} is given twice; one URL is one replica.")
        seen.add(api_url)
        who = read(api_url)
        _, port = url_port(api_url)
        _, metrics_port = url_port(metrics_url)
        roles.setdefault(name, AttachedRole(name=name)).replicas.append(
            AttachedReplica(
                name=api_url,
                api_url=api_url,
                metrics_url=metrics_url,
                argv=who.argv,
                env=who.env,
                argv_from=who.source,
                argv_unread=who.unread,
                port=port,
                metrics_port=metrics_port,
                scheme="https" if api_url.startswith("https") else "http",
            )
        )
    problem = roles_problem(list(roles.values()))
    if problem:
        raise UsageError(f"--role: {problem}.", hint=f"Give each replica as --role {ROLE_HELP}.")
    order = {"mixed": 0, "prefill": 1, "decode": 2}
    return sorted(roles.values(), key=lambda r: order.get(r.name, 9))


def served_model(entry: str, roles: Sequence[AttachedRole], given: str | None) -> str:
    """``--model``, else what the entry point's ``/v1/models`` lists first, else the
    engines' own ``--served-model-name``; exit 2 when none says."""
    if given:
        return given
    try:
        resp = http.get(entry + "/v1/models", timeout=5.0)
        if resp.status == 200:
            ids = [m.get("id") for m in (resp.json().get("data") or []) if isinstance(m, dict)]
            if ids and isinstance(ids[0], str):
                return ids[0]
    except (http.HTTPError, ValueError, AttributeError):
        pass
    for role in roles:
        for rep in role.replicas:
            cmd = engine_command(rep)
            if cmd is not None and cmd.served_model_names:
                return cmd.served_model_names[0]
    raise UsageError(
        f"could not tell the served model name: {entry}/v1/models did not list one and no "
        "engine command line was read.",
        hint="Pass --model NAME (the name requests use).",
    )


def entry_answers(entry: str) -> None:
    """``UsageError`` (exit 2, nothing recorded) when nothing answers at the entry URL:
    every request verify and bench send goes there, so a deployment attached by an entry
    nobody reaches (a wrong port, a router not started, credentials in the URL that the
    HTTP client cannot use) would be recorded as attached and fail only later."""
    try:
        http.get(entry + "/v1/models", timeout=5.0)
    except http.HTTPError as e:
        raise UsageError(
            f"--entry {entry}: nothing answers there ({e}); nothing was recorded",
            hint="Check the URL (the router's, or the mixed role's) and that it is up, "
            "then attach again.",
        ) from None


def record_from_urls(
    name: str,
    specs: Sequence[str],
    entry: str,
    model: str | None,
    read: Reader = read_listener,
) -> AttachedDeployment:
    roles = roles_from(specs, read)
    entry_url = _base_url(entry, "--entry")
    entry_answers(entry_url)
    notes = [
        f"{r.name} {rep.name}: claims not determined: {rep.argv_unread}"
        for r in roles
        for rep in r.replicas
        if rep.argv_unread
    ]
    return AttachedDeployment(
        name=name,
        backend="url",
        stack="url",
        entry=entry_url,
        served_model_name=served_model(entry_url, roles, model),
        roles=roles,
        notes=notes,
    )


def _counters(url: str) -> dict[str, Any]:
    """What ``url``'s ``/metrics`` is: an engine's counters, or why not (with the port)."""
    _, port = url_port(url)
    try:
        snap = scrape(url, timeout=5.0)
    except ScrapeError as e:
        return {"url": url + "/metrics", "port": port, "engine": None, "error": str(e)}
    engine = counters_of(set(snap.samples))
    if engine is None:
        return {
            "url": url + "/metrics",
            "port": port,
            "engine": None,
            "error": "no engine counters there (a router's or a sidecar's /metrics?)",
        }
    return {"url": url + "/metrics", "port": port, "engine": engine.engine}


def replica_claims(rep: AttachedReplica) -> dict[str, Any]:
    """The replica's claims as its own command line states them (None: not determined)."""
    cmd = engine_command(rep)
    if cmd is None:
        return {"determined": False, "why": rep.argv_unread or "not an engine command line"}
    spec, spec_err = speculative_config(cmd)
    kv, kv_err = kv_transfer_config(cmd)
    return {
        "determined": True,
        "speculative_config": spec if spec_err is None else {"unreadable": spec_err},
        "kv_connector": (kv or {}).get("kv_connector") if kv_err is None else None,
        "kv_role": (kv or {}).get("kv_role") if kv_err is None else None,
        "kv_transfer_config_error": kv_err,
        "served_model_names": list(cmd.served_model_names),
    }


def inspect(dep: AttachedDeployment) -> dict[str, Any]:
    """What attach found, replica by replica, and what it could not determine."""
    undetermined = list(dep.notes)
    roles = []
    for role in dep.roles:
        reps = []
        for rep in role.replicas:
            counters = _counters(rep.metrics_url)
            claims = replica_claims(rep)
            if counters["engine"] is None:
                undetermined.append(
                    f"{role.name} {rep.name}: no engine counters at {counters['url']} (port "
                    f"{counters['port']}): {counters['error']}"
                )
            reps.append(
                {
                    "name": rep.name,
                    "api_url": rep.api_url,
                    "port": rep.port,
                    "metrics": counters,
                    "argv_from": rep.argv_from,
                    "claims": claims,
                }
            )
        roles.append({"name": role.name, "kind": role.kind, "replicas": reps})
    return {
        "name": dep.name,
        "backend": dep.backend,
        "entry": dep.entry,
        "served_model_name": dep.served_model_name,
        "topology": dep.topology,
        "roles": roles,
        "undetermined": undetermined,
    }


__all__ = ["inspect", "parse_role", "record_from_urls", "replica_claims", "roles_from"]
