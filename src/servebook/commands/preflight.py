"""`servebook preflight RECIPE`: cluster checks plus a probe Pod on each target node."""

from __future__ import annotations

from pathlib import Path

import typer

from servebook.commands import app, print_json
from servebook.commands.recipes import SetOpt, ValuesOpt
from servebook.console import out, print_findings
from servebook.errors import UsageError
from servebook.findings import Finding, exit_code, to_json
from servebook.kube.snapshot import SNAPSHOT_COMMAND
from servebook.preflight.live import LiveOptions, plan_findings
from servebook.recipe.resolve import resolve


def preflight_findings(
    recipe: str,
    sets: list[str],
    values: list[Path],
    snapshot: Path | None,
    kubeconfig: str | None,
    probe_deadline: int,
    *,
    context: str | None = None,
    weights: str | None = None,
    probe_image: str | None = None,
    pull_timeout: int = 900,
) -> list[Finding]:
    plan = resolve(recipe, sets, values)
    if "kubernetes" not in plan.backends:
        raise UsageError(
            f"recipe {plan.recipe} runs on the local backend only; preflight checks a "
            "Kubernetes cluster for a Kubernetes recipe (e.g. vllm-pd)."
        )
    options = LiveOptions(
        kubeconfig=kubeconfig,
        context=context,
        probe_deadline_s=probe_deadline,
        pull_timeout_s=pull_timeout,
        probe_image=probe_image,
    )
    return plan_findings(plan, snapshot=snapshot, weights=weights, options=options)


@app.command()
def preflight(
    recipe: str = typer.Argument(..., help="A Kubernetes recipe (e.g. vllm-pd) or its YAML."),
    sets: list[str] = SetOpt,
    values: list[Path] = ValuesOpt,
    snapshot: Path | None = typer.Option(
        None, "--snapshot", help=f"Read cluster state from this file: {SNAPSHOT_COMMAND}"
    ),
    kubeconfig: str | None = typer.Option(None, "--kubeconfig", help="Default: KUBECONFIG."),
    context: str | None = typer.Option(
        None, "--context", help="Kubeconfig context (default: its current one)."
    ),
    probe_deadline: int = typer.Option(
        120, "--probe-deadline", help="Seconds each probe may run, from its container's start."
    ),
    pull_timeout: int = typer.Option(
        900, "--pull-timeout", help="Seconds a probe Pod may take to pull its image and start."
    ),
    probe_image: str | None = typer.Option(
        None,
        "--probe-image",
        help="Image of the probe Pods (any with python3; default: the engine's image).",
    ),
    weights: str | None = typer.Option(
        None,
        "--weights",
        help="The weights' size where no probe runs (--snapshot): a size such as 640Gi, or "
        "a local copy of the model directory or its model.safetensors.index.json.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Findings as JSON."),
) -> None:
    """Check a cluster for a recipe before deploying: in seconds, and changing nothing.

    Target nodes exist, are Ready, not cordoned, with tolerated taints; enough free
    accelerators and RDMA devices counting every Pod that holds them in every namespace;
    whole GPUs, not MIG slices; namespace, CRDs; whether the weights fit the GPUs. Live, it
    also asks what the caller may do, dry-runs the rendered set on the server, and runs the
    read-only weights probe in a Pod on each target node (in a temporary namespace when the
    recipe's does not exist yet, deleted afterwards).

    Exit 0 all pass, 1 a failing check, 2 could not run.

    Example: servebook preflight vllm-pd -f values.yaml --snapshot cluster.json
    """
    findings = preflight_findings(
        recipe,
        sets,
        values,
        snapshot,
        kubeconfig,
        probe_deadline,
        context=context,
        weights=weights,
        probe_image=probe_image,
        pull_timeout=pull_timeout,
    )
    if json_out:
        print_json(to_json(findings))
    else:
        print_findings(findings, title=f"servebook preflight {recipe}", console=out)
    code = exit_code(findings)
    if code:
        raise typer.Exit(code)
