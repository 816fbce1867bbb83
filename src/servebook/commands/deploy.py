"""`servebook up | status | down | run`: deployments on a backend."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer
from rich.markup import escape

from servebook import names, redact
from servebook.backends import registry
from servebook.backends.base import Deployer, Down, Found, Place, refuse_unfit
from servebook.backends.state import bringing_up, state_dir_for
from servebook.commands import (
    KubeconfigOpt,
    app,
    deployment_name,
    port_number,
    print_json,
    say,
    seconds,
)
from servebook.commands.recipes import SetOpt, ValuesOpt
from servebook.commands.verify import ApiKeyOpt, MaxTokensOpt, options
from servebook.console import err, out, styled
from servebook.errors import UsageError
from servebook.recipe.plan import Plan
from servebook.recipe.resolve import resolve

DEFAULT_RECIPE = "tiny-pd"
# The main job's repetition cap (``pipeline.RUN_SWEEP.max_repetitions``, which a unit test
# holds equal; the pipeline is imported only when run runs).
RUN_MAX_REPETITIONS = 20


def _plan_for(
    recipe: str, sets: list[str], values: list[Path], name: str | None, backend: Deployer
) -> tuple[str, Plan]:
    """(deployment name, resolved Plan) of a recipe meant for ``backend``."""
    dep_name = name or names.deployment_name(
        Path(recipe).stem, f"deployment name (from recipe {recipe}; give another with --name)"
    )
    plan = resolve(recipe, sets, values, state_dir=state_dir_for(dep_name))
    refuse_unfit(plan, backend)
    return dep_name, plan


BackendOpt = typer.Option(
    "local",
    "--backend",
    help="local (processes on this machine) or kubernetes (the current KUBECONFIG context).",
)
NameOpt = typer.Option(
    None,
    "--name",
    help=f"Deployment name (default: the recipe's name): {names.RULE}, e.g. {names.EXAMPLE}.",
    callback=deployment_name,
)
NameArg = typer.Argument(
    None, help="Deployment name (default: the only one).", callback=deployment_name
)
TimeoutOpt = typer.Option(
    None,
    "--timeout",
    help="Seconds to wait until the deployment is ready (local: 600, every role answers a "
    "real completion; kubernetes: the recipe's startup_timeout_s + 600, every Pod Ready).",
    callback=seconds,
)


@app.command()
def up(
    recipe: str = typer.Argument(..., help="Built-in recipe name or path to a recipe YAML."),
    backend: str = BackendOpt,
    sets: list[str] = SetOpt,
    values: list[Path] = ValuesOpt,
    name: str | None = NameOpt,
    timeout: float | None = TimeoutOpt,
    port: int | None = typer.Option(
        None, "--port", help="Port of the entry point (local), 1-65535.", callback=port_number
    ),
    kubeconfig: str | None = KubeconfigOpt,
    json_out: bool = typer.Option(False, "--json", help="Print the deployment as JSON."),
) -> None:
    """Bring a recipe up and wait until it is ready.

    Local: each role runs as its own process with its log in the deployment's state
    directory; ready means the entry point completed a real request.  On early death or
    timeout, up fails with the role's last log lines and stops what it started.

    Kubernetes: the recipe is rendered, schema-checked and applied to the current
    context; up then watches every role's Pod and fails as soon as the cluster says it
    cannot become ready (weights directory absent on the node, image not pullable, engine
    crashed, Pod unschedulable for 2 minutes), with that evidence.  The objects are left
    for inspection.

    Then `servebook verify NAME` and `servebook bench NAME` reach it on either backend;
    stop it with `servebook down NAME`.

    Example: servebook up tiny-pd

    Example: servebook up vllm-pd --backend kubernetes -f values.yaml
    """
    chosen = registry.get(backend)
    dep_name, plan = _plan_for(recipe, sets, values, name, chosen)
    with bringing_up(dep_name):
        ready = chosen.up(plan, name=dep_name, timeout_s=timeout, say=say, port=port)
    if json_out:
        print_json(redact.scrub(chosen.status(ready.name))[0])
    else:
        out.print(styled(f"[green]up:[/] {escape(ready.name)} {escape(ready.where)}"))


PlaceOpt = typer.Option(
    None,
    "--backend",
    help="Ask the backend itself, not this machine's records: with kubernetes, the "
    "deployment's objects are found by their servebook.io/deployment label, so it works "
    "from any machine.",
)
NamespaceOpt = typer.Option(
    None,
    "-n",
    "--namespace",
    help="With --backend kubernetes: the namespace to look in (default: the recorded one, "
    "else every namespace the credentials may list).",
)


def _print_found(backend: Place, namespace: str | None, found: list[Found], json_out: bool) -> None:
    if json_out:
        print_json([dataclasses.asdict(f) for f in found])
        return
    where = f"namespace {namespace} on {backend.name}" if namespace else backend.name
    if not found:
        out.print(f"no servebook deployments in {where}.", highlight=False)
        return
    out.print(f"servebook deployments in {where}:", highlight=False)
    for f in found:
        where = f"namespace {f.namespace:16} " if f.namespace else ""
        out.print(
            f"  {f.name:20} {where}recipe {f.recipe or '?':16} roles {','.join(f.roles)}",
            highlight=False,
            markup=False,
        )


@app.command()
def status(
    name: str | None = NameArg,
    json_out: bool = typer.Option(False, "--json", help="Machine-readable."),
    backend: str | None = PlaceOpt,
    namespace: str | None = NamespaceOpt,
    kubeconfig: str | None = KubeconfigOpt,
) -> None:
    """Show a deployment's roles and whether each can serve.

    Local: pid, port, URL, alive and healthy.  Kubernetes: per role its Pod, node, ready,
    restarts since this apply, image, and the evidence of a failure.

    With --backend the deployment is found by that backend, with or without a record on
    this machine; without NAME it lists the deployments the backend has (on Kubernetes:
    name, namespace, recipe and roles, found by label).

    Exit 1 when a role cannot serve (down, or alive but not answering /health), 2 when
    there is no such deployment.

    Example: servebook status tiny-pd --json

    Example: servebook status --backend kubernetes -n moe-pd
    """
    if backend is not None and name is None:
        chosen = registry.get(backend)
        _print_found(chosen, namespace, chosen.found(namespace), json_out)
        return
    owner, dep_name = registry.locate(
        name,
        "Start one with `servebook up RECIPE`; one on Kubernetes brought up elsewhere: "
        "`servebook status --backend kubernetes`.",
        backend=backend,
    )
    # Pasted into issues and chats: a role's command line, environment or URL may carry a
    # secret (a backend reports them as applied).
    st = redact.scrub(owner.status(dep_name, namespace))[0]
    if json_out:
        print_json(st)
    else:
        out.print(
            styled(
                f"[bold]{escape(st['name'])}[/] ({escape(st['recipe'])}, "
                f"{escape(st['backend'])}) entry {escape(str(st['entry']))}"
            ),
            soft_wrap=True,
        )
        for r in st["roles"]:
            colour = (
                "green"
                if r["ok"] and r["state"] in ("healthy", "ready")
                else ("yellow" if r["ok"] or r["state"] == "waiting" else "red")
            )
            out.print(
                styled(
                    f"  {escape(r['name']):8} [{colour}]{escape(r['state']):8}[/] "
                    f"{escape(r['summary'])}"
                ),
                soft_wrap=True,
            )
            if r.get("log"):
                out.print(f"           log: {r['log']}", soft_wrap=True)
    if not all(r["ok"] for r in st["roles"]):
        raise typer.Exit(1)


@app.command()
def down(
    name: str | None = NameArg,
    backend: str | None = PlaceOpt,
    namespace: str | None = NamespaceOpt,
    kubeconfig: str | None = KubeconfigOpt,
) -> None:
    """Stop exactly what a deployment started.

    Local: processes are found by recorded PID (checked against their start time) and
    stopped with their process group; its KV storage is removed.  Kubernetes: the objects
    `up` applied are deleted (the Namespace only if `up` created it).  Idempotent.

    With --backend the deployment is found by that backend, with or without a record on
    this machine (on Kubernetes by label; -n names the namespace).

    Example: servebook down tiny-pd

    Example: servebook down moe --backend kubernetes -n moe-pd
    """
    if backend is not None:
        if name is None:
            raise UsageError(f"down --backend {backend} needs the deployment's NAME.")
        _print_down(registry.get(backend).down(name, namespace))
        return
    if namespace is not None:
        raise UsageError("-n/--namespace goes with --backend kubernetes.")
    found = registry.find(name)
    if found is None:
        out.print(
            f"nothing to stop: no deployment {repr(name) + ' ' if name else ''}is recorded "
            "here (one on Kubernetes brought up elsewhere: `servebook down NAME --backend "
            "kubernetes`).",
            highlight=False,
        )
        return
    owner, dep_name = found
    _print_down(registry.deployer(owner, dep_name, "stop").down(dep_name))


def _print_down(result: Down) -> None:
    for what, done in result.done.items():
        out.print(f"  {what}: {done}")
    if not result.complete:
        err.print(styled("[bold red]some processes did not stop[/]; state kept for another try."))
        raise typer.Exit(1)
    out.print(styled(f"[green]down:[/] {escape(str(result.name))}"))


RUN_HELP = """The main job: [preflight ->] up -> verify -> a short bench sweep -> report -> down.

With no argument it runs the built-in tiny PD recipe on vLLM's CPU build, making the tiny
model first if it is missing.  On Kubernetes it first runs the recipe's preflight (cluster
checks and the node probe) and deploys nothing when a check fails, and its sweep runs in
a load Job next to the servers (as `servebook bench NAME` does there), never through
port-forwards.  The sweep runs only when verify passed.  Exit 0 only when verify passed
and every benchmark point is valid.

The deployment is taken down at the end unless --keep.  Bringing one up again costs: {costs}.
With --keep, `servebook bench NAME` and `servebook verify NAME` reuse it and
`servebook down NAME` removes it.

Example: servebook run

Example: servebook run vllm-pd --backend kubernetes -f values.yaml --keep
"""


@app.command(
    help=RUN_HELP.format(costs="; ".join(f"{b.title}, {b.up_cost}" for b in registry.every()))
)
def run(
    recipe: str = typer.Argument(DEFAULT_RECIPE, help="Recipe (default: the built-in tiny-pd)."),
    backend: str = BackendOpt,
    sets: list[str] = SetOpt,
    values: list[Path] = ValuesOpt,
    name: str | None = NameOpt,
    timeout: float | None = TimeoutOpt,
    max_tokens: int = MaxTokensOpt,
    api_key: str | None = ApiKeyOpt,
    keep: bool = typer.Option(
        False, "--keep", help="Leave the deployment up afterwards (see above for what it costs)."
    ),
    kubeconfig: str | None = KubeconfigOpt,
    out_dir: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        help="Where results and the report go (default: ./servebook-runs/NAME-TIME).",
    ),
    max_repetitions: int = typer.Option(
        RUN_MAX_REPETITIONS,
        "--max-repetitions",
        min=3,
        metavar="N",
        help=(
            "The most times the sweep repeats a level whose 95% interval of tok/s or TPOT is "
            f"still wider than ±2.5% (default {RUN_MAX_REPETITIONS}, at least the 3 every level "
            "gets). Fewer is quicker on a noisy machine; its medians are then less likely to "
            "survive `servebook compare A B --reproduce`."
        ),
    ),
) -> None:
    from servebook import pipeline

    chosen = registry.get(backend)
    # The key verify and bench send, and the one the engines get when the recipe requires
    # one (local: as VLLM_API_KEY in their environment).
    opts = options(120.0, 5.0, max_tokens, "stop,length", api_key)
    dep_name, plan = _plan_for(recipe, sets, values, name, chosen)
    job = pipeline.Job(
        backend=chosen,
        name=dep_name,
        plan=plan,
        recipe=recipe,
        opts=opts,
        timeout_s=timeout,
        keep=keep,
        out_dir=out_dir,
        say=say,
        max_repetitions=max_repetitions,
    )
    with bringing_up(dep_name):
        code = pipeline.run(job)
    raise typer.Exit(code)
