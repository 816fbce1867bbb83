"""`servebook attach NAME ...` and `servebook detach NAME`: record a deployment servebook did
not make (and forget it), so verify, bench, status and report reach it as they reach
servebook's own.  Nothing on the deployment is touched."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import typer
from rich.markup import escape

from servebook import redact
from servebook.backends import registry
from servebook.backends.attached.record import (
    AttachedDeployment,
    read_record,
    remove_record,
    write_record,
)
from servebook.backends.attached.url import ROLE_HELP, inspect, record_from_urls
from servebook.commands import app, deployment_name, print_json
from servebook.commands.attach_kube import KUBE_HELP, attach_kubernetes
from servebook.console import out
from servebook.errors import UsageError

ATTACH_HELP = f"""Record a deployment servebook did not make, so that `verify NAME`,
`bench NAME`, `status NAME` and `report` work on it as on servebook's own.

Attach changes nothing on the deployment (no apply, no restart, no label): it only reads
(`/v1/models`, `/metrics`, and each engine's command line) and keeps a record on this
machine; `servebook detach NAME` forgets it.

By URL (any machine, any engine process): one `--role {ROLE_HELP}` per replica (a role
given twice is two replicas; prefill and decode state a PD claim; `metrics=URL` where the
engine's own /metrics is not at its API's URL) and `--entry URL` (the router, or the
mixed role's URL).  Give the engines' own ports, never a proxy's: verify and bench read
each replica's counters there, and a replica whose counters cannot be found fails verify,
naming the URL it tried.

Claims come from what the deployment says of itself: each engine's command line, read
from the process that listens on the port when it runs on this machine (/proc).  When it
cannot be read (another machine, another user's process, a container), its claims are
"not determined", said so in attach's output and in verify's, never assumed.

Example: servebook attach prod-pd --role prefill=http://127.0.0.1:8100
--role decode=http://127.0.0.1:8200 --entry http://127.0.0.1:8000

Example: servebook attach one --role mixed=http://10.0.0.5:8000 --entry http://10.0.0.5:8000
--dry-run
"""


def _refuse_taken(name: str) -> None:
    found = registry.find(name)
    if found is not None:
        owner, _ = found
        what = owner.title
        raise UsageError(
            f"a deployment named {name} is already recorded ({what}).",
            hint=f"Choose another NAME, or `servebook detach {name}` first (an attached one).",
        )


def _print_found(found: dict[str, Any], recorded: bool) -> None:
    head = f"{found['name']}: {found['topology']} deployment, entry {found['entry']}, model "
    out.print(escape(head + repr(found["served_model_name"])), highlight=False)
    for role in found["roles"]:
        for rep in role["replicas"]:
            m = rep["metrics"]
            counters = (
                f"{m['engine']} counters at {m['url']}"
                if m["engine"]
                else f"NO engine counters at {m['url']} (port {m['port']})"
            )
            c = rep["claims"]
            if c["determined"]:
                claims = (
                    f"kv_connector {c['kv_connector'] or 'none'}"
                    + (f" ({c['kv_role']})" if c["kv_role"] else "")
                    + f", speculative {c['speculative_config'] or 'none'}"
                )
                source = rep["argv_from"]
            else:
                claims, source = "claims not determined", c["why"]
            out.print(
                escape(f"  {role['name']:8} {rep['name']}  {counters}; {claims}; argv: {source}"),
                highlight=False,
                soft_wrap=True,
            )
    for note in found["undetermined"]:
        out.print(escape(f"  not determined: {note}"), highlight=False, soft_wrap=True)
    if recorded:
        out.print(
            escape(f"attached: {found['name']}; next: `servebook verify {found['name']}`"),
            highlight=False,
        )
    else:
        out.print("dry run: nothing recorded.", highlight=False)


@app.command(help=f"{ATTACH_HELP}\n{KUBE_HELP}")
def attach(
    name: str = typer.Argument(
        ...,
        help="A name for the deployment, as verify and bench use it.",
        callback=deployment_name,
    ),
    roles: list[str] = typer.Option(
        [], "--role", help=f"{ROLE_HELP}; once per replica.", show_default=False
    ),
    entry: str | None = typer.Option(
        None, "--entry", help="Base URL requests enter by (the router, or the mixed role)."
    ),
    model: str | None = typer.Option(
        None, "--model", help="Served model name (default: what the entry's /v1/models lists)."
    ),
    backend: str = typer.Option(
        "url",
        "--backend",
        help="url (the default): the deployment is given by --role URLs; kubernetes: found "
        "in namespace -n NS by its stack's labels (or --role ROLE=SELECTOR).",
    ),
    namespace: str | None = typer.Option(
        None, "--namespace", "-n", help="kubernetes: the namespace the deployment runs in."
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print what was found and what could not be determined; record nothing.",
    ),
    json_out: bool = typer.Option(False, "--json", help="What was found, as JSON."),
) -> None:
    _refuse_taken(name)
    attach_by = {"url": _attach_by_url, "kubernetes": attach_kubernetes}.get(backend)
    if attach_by is None:
        raise UsageError(f"--backend {backend}: attach here knows url (--role ROLE=URL).")
    attach_by(name, namespace, roles, entry, model, dry_run=dry_run, json_out=json_out)


def _attach_by_url(
    name: str,
    namespace: str | None,
    roles: Sequence[str],
    entry: str | None,
    model: str | None,
    *,
    dry_run: bool,
    json_out: bool,
) -> None:
    """``--backend url``: the deployment given by ``--role ROLE=URL`` and ``--entry``."""
    if entry is None:
        raise UsageError("--entry URL is required: the URL requests enter by.")
    dep: AttachedDeployment = record_from_urls(name, list(roles), entry, model)
    found = inspect(dep)
    if not dry_run:
        write_record(dep)
    if json_out:
        print_json(redact.scrub({**found, "recorded": not dry_run})[0])
    else:
        _print_found(redact.scrub(found)[0], recorded=not dry_run)


@app.command()
def detach(
    name: str = typer.Argument(
        ..., help="The attached deployment's name.", callback=deployment_name
    ),
) -> None:
    """Forget an attached deployment: its record on this machine goes; nothing on the
    deployment is touched (servebook never stops what it did not make).

    Example: servebook detach prod-pd
    """
    if read_record(name) is None:
        found = registry.find(name)
        if found is not None:
            raise UsageError(
                f"{name} is not attached: servebook made it ({found[0].title}).",
                hint=f"`servebook down {name}` stops it.",
            )
        raise UsageError(f"no attached deployment named {name!r}.")
    remove_record(name)
    out.print(escape(f"detached: {name} (nothing on it was touched)"), highlight=False)
