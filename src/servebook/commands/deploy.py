"""`servebook up | status | down | run`: deployments on a backend."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import typer

from servebook.backends import kubernetes as kube
from servebook.backends import local
from servebook.commands import app, err, out
from servebook.commands.bench import BenchArgs
from servebook.commands.recipes import SetOpt, ValuesOpt
from servebook.commands.verify import MaxTokensOpt
from servebook.findings import UsageError, exit_code
from servebook.kube import manifests
from servebook.recipe.plan import Plan
from servebook.recipe.resolve import resolve

DEFAULT_RECIPE = "tiny-pd"


def _say(msg: str) -> None:
    err.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {msg}", highlight=False, soft_wrap=True)


BACKENDS = ("local", "kubernetes")


def _kube_name(name: str | None) -> str | None:
    """The Kubernetes deployment a name-less or named status/down means, if any: the named
    one, or the only deployment recorded when it runs on Kubernetes."""
    if name:
        return name if kube.read_state(name) is not None else None
    kube_names = kube.recorded_names()
    local_names = [d.name for d in local.list_deployments()]
    if len(kube_names) + len(local_names) > 1:
        raise UsageError(
            "several deployments are recorded: "
            + ", ".join(sorted([*kube_names, *local_names]))
            + ". Name one, e.g. `servebook down "
            + sorted([*kube_names, *local_names])[0]
            + "`."
        )
    return kube_names[0] if kube_names else None


def _backend_ok(backend: str) -> None:
    if backend not in BACKENDS:
        raise UsageError(f"--backend {backend}: choose one of {', '.join(BACKENDS)}.")


# Per backend: what a recipe for the other one is called in the refusal, and what to use.
_OTHER_BACKEND = {
    "local": ("not the local backend", "Use a tiny-* recipe locally (`servebook recipes`)."),
    "kubernetes": (
        "not Kubernetes",
        "Use a vllm-* recipe (`servebook recipes`), or --backend local.",
    ),
}


def _plan_for(
    recipe: str, sets: list[str], values: list[Path], name: str | None, backend: str
) -> tuple[str, Plan]:
    """(deployment name, resolved Plan) of a recipe meant for ``backend``."""
    dep_name = name or Path(recipe).stem
    plan = resolve(recipe, sets, values, state_dir=local.state_dir_for(dep_name))
    if backend not in plan.backends:
        not_this, use = _OTHER_BACKEND[backend]
        raise UsageError(
            f"recipe {plan.recipe} is for {', '.join(plan.backends)}, {not_this}. {use}"
        )
    return dep_name, plan


@contextlib.contextmanager
def _up_failed_exits() -> Iterator[None]:
    """A deployment that did not become ready: its evidence on stderr, exit 1."""
    try:
        yield
    except local.UpFailed as e:
        err.print(f"[bold red]up failed:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None


def _up_kubernetes(
    recipe: str, sets: list[str], values: list[Path], name: str | None, timeout: float | None
) -> kube.KubeDeployment:
    dep_name, plan = _plan_for(recipe, sets, values, name, "kubernetes")
    # The engines' own startup budget, plus time to pull the image and schedule.
    startup = manifests.settings(plan).startup_timeout_s
    with _up_failed_exits():
        return kube.up(
            plan,
            name=dep_name,
            timeout_s=timeout if timeout is not None else startup + 600.0,
            say=_say,
        )


def _up(
    recipe: str,
    sets: list[str],
    values: list[Path],
    name: str | None,
    timeout: float | None,
    port: int | None,
) -> local.Deployment:
    dep_name, plan = _plan_for(recipe, sets, values, name, "local")
    with _up_failed_exits():
        return local.up(
            plan,
            name=dep_name,
            timeout_s=timeout if timeout is not None else 600.0,
            entry_port=port,
            say=_say,
        )


NameOpt = typer.Option(None, "--name", help="Deployment name (default: the recipe's name).")
TimeoutOpt = typer.Option(
    None,
    "--timeout",
    help="Seconds to wait until the deployment is ready (local: 600, every role answers a "
    "real completion; kubernetes: the recipe's startup_timeout_s + 600, every Pod Ready).",
)


@app.command()
def up(
    recipe: str = typer.Argument(..., help="Built-in recipe name or path to a recipe YAML."),
    backend: str = typer.Option(
        "local",
        "--backend",
        help="local (processes on this machine) or kubernetes (the current KUBECONFIG context).",
    ),
    sets: list[str] = SetOpt,
    values: list[Path] = ValuesOpt,
    name: str | None = NameOpt,
    timeout: float | None = TimeoutOpt,
    port: int | None = typer.Option(None, "--port", help="Port of the entry point (local)."),
    json_out: bool = typer.Option(False, "--json", help="Print the deployment as JSON."),
) -> None:
    """Bring a recipe up and wait until its entry point completes a real request.

    Local: each role runs as its own process with its log in the deployment's state
    directory; on early death or timeout, up fails with the role's last log lines and
    stops what it started.

    Kubernetes: the recipe is rendered, schema-checked and applied to the current
    context; up then watches every role's Pod and fails as soon as the cluster says it
    cannot become ready (weights directory absent on the node, image not pullable, engine
    crashed, Pod unschedulable for 2 minutes), with that evidence.  The objects are left
    for inspection.  Stop either with `servebook down`.

    Example: servebook up tiny-pd
    Example: servebook up vllm-pd --backend kubernetes -f values.yaml
    """
    _backend_ok(backend)
    if backend == "kubernetes":
        if port is not None:
            raise UsageError("--port is for the local backend; a Kubernetes entry is a Service.")
        kdep = _up_kubernetes(recipe, sets, values, name, timeout)
        st = kube.status(kdep.name)
        if json_out:
            out.print_json(json.dumps(st))
        else:
            out.print(
                f"[green]up:[/] {kdep.name} ready: {st['entry']} in namespace {kdep.namespace} "
                f"(model '{kdep.served_model_name}'). To benchmark it: `kubectl -n "
                f"{kdep.namespace} port-forward service/{kdep.entry_service} 8000:"
                f"{kdep.entry_port}`, then `servebook bench --url http://127.0.0.1:8000 ...`"
            )
        return
    dep = _up(recipe, sets, values, name, timeout, port)
    if json_out:
        out.print_json(json.dumps(local.status(dep)))
    else:
        out.print(
            f"[green]up:[/] {dep.name} ready at {dep.entry_url} "
            f"(model '{dep.served_model_name}'); state in {dep.state_dir}"
        )


@app.command()
def status(
    name: str | None = typer.Argument(None, help="Deployment name (default: the only one)."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable."),
) -> None:
    """Show a deployment's roles: pid, port, URL, alive and healthy.

    Exit 1 when a role is down, 2 when there is no such deployment.

    Example: servebook status tiny-pd --json
    """
    kname = _kube_name(name)
    if kname is not None:
        st = kube.status(kname)
        if json_out:
            out.print_json(json.dumps(st))
        else:
            out.print(f"[bold]{st['name']}[/] ({st['recipe']}, kubernetes) entry {st['entry']}")
            for r in st["roles"]:
                out.print(f"  {r['name']:8} {r['state']:8} {r['summary']}", highlight=False)
        if not all(r["state"] == "ready" for r in st["roles"]):
            raise typer.Exit(1)
        return
    dep = local.require_deployment(name)
    st = local.status(dep)
    if json_out:
        out.print_json(json.dumps(st))
    else:
        out.print(
            f"[bold]{st['name']}[/] ({st['recipe']}, {st['backend']}) entry {st['entry_url']}"
        )
        for r in st["roles"]:
            state = (
                "[green]healthy[/]"
                if r["healthy"]
                else ("[yellow]alive, not healthy[/]" if r["alive"] else "[red]down[/]")
            )
            out.print(f"  {r['name']:8} pid {r['pid']:>7}  {r['url']}  {state}", highlight=False)
    if not all(r["alive"] for r in st["roles"]):
        raise typer.Exit(1)


@app.command()
def down(
    name: str | None = typer.Argument(None, help="Deployment name (default: the only one)."),
) -> None:
    """Stop exactly what a deployment started.

    Local: processes are found by recorded PID (checked against their start time) and
    stopped with their process group; its KV storage is removed.  Kubernetes: the objects
    `up` applied are deleted (the Namespace only if `up` created it).  Idempotent.

    Example: servebook down tiny-pd
    """
    kname = _kube_name(name)
    if kname is not None:
        for what, done in kube.down(kname).items():
            out.print(f"  {what}: {done}")
        out.print(f"[green]down:[/] {kname}")
        return
    dep, result = local.down(name)
    if dep is None:
        out.print(f"nothing to stop: no deployment {repr(name) + ' ' if name else ''}is up.")
        return
    for role, what in result.items():
        out.print(f"  {role}: {what}")
    if any(v == "still running" for v in result.values()):
        err.print("[bold red]some processes did not stop[/]; state kept for another try.")
        raise typer.Exit(1)
    out.print(f"[green]down:[/] {dep.name}")


# The main job's sweep: short windows that a 2-core machine running both servers can
# finish in about a minute; the relaxed client-lag bound is recorded in the results.
RUN_SWEEP = BenchArgs(
    concurrency="1,4",
    repetitions=2,
    duration="8s",
    warmup="3s",
    min_requests=4,
    input_len=512,
    output_len=64,
    max_client_lag_ms=250.0,
)


@app.command()
def run(
    recipe: str = typer.Argument(DEFAULT_RECIPE, help="Recipe (default: the built-in tiny-pd)."),
    sets: list[str] = SetOpt,
    values: list[Path] = ValuesOpt,
    name: str | None = NameOpt,
    timeout: float | None = TimeoutOpt,
    max_tokens: int = MaxTokensOpt,
    out_dir: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        help="Where results and the report go (default: ./servebook-runs/NAME-TIME).",
    ),
) -> None:
    """The main job: up -> verify -> a short bench sweep -> report -> down.

    With no argument it runs the built-in tiny PD recipe on vLLM's CPU build, making the
    tiny model first if it is missing. The sweep runs only when verify passed. Exit 0 only
    when verify passed and every benchmark point is valid.

    Example: servebook run
    """
    from servebook.bench import target as tgt
    from servebook.commands.bench import print_points, run_bench
    from servebook.commands.verify import options, print_report, verify_deployment
    from servebook.report.render import write_report

    opts = options(120.0, 5.0, max_tokens, "stop,length")
    dep = _up(recipe, sets, values, name, timeout, None)
    out_dir = out_dir or Path("servebook-runs") / f"{dep.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    rc = 0
    try:
        _say(f"verifying {dep.name} from server-side counters")
        rep = verify_deployment(dep, opts)
        print_report(rep, dep.name)
        rc = exit_code(rep.findings)
        if rc == 0:
            _say(f"benchmarking {dep.name}: {RUN_SWEEP}")
            subject = tgt.from_deployment(
                dep.name, api="completions", request_timeout_s=120.0, input_len=512
            )
            results, path = run_bench(
                subject,
                RUN_SWEEP,
                out_dir,
                resume=False,
                tokenizer=None,
            )
            print_points(results, path)
            if not all(p.valid for p in results.points):
                rc = 1
            html = write_report([out_dir], out_dir)
            out.print(f"report: {html}", highlight=False, markup=False)
    finally:
        _, result = local.down(dep.name)
        out.print("down: " + ", ".join(f"{k} {v}" for k, v in result.items()))
    raise typer.Exit(rc)
