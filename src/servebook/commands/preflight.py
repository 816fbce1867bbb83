"""`servebook preflight RECIPE`: cluster checks plus a probe Pod on each target node."""

from __future__ import annotations

from pathlib import Path

import typer

from servebook.commands import app, out
from servebook.commands.recipes import SetOpt, ValuesOpt
from servebook.findings import Finding, UsageError, exit_code, print_table, to_json
from servebook.kube.snapshot import SNAPSHOT_COMMAND
from servebook.preflight.live import plan_findings
from servebook.recipe.resolve import resolve


def preflight_findings(
    recipe: str,
    sets: list[str],
    values: list[Path],
    snapshot: Path | None,
    kubeconfig: str | None,
    probe_deadline: int,
) -> list[Finding]:
    plan = resolve(recipe, sets, values)
    if "kubernetes" not in plan.backends:
        raise UsageError(
            f"recipe {plan.recipe} runs on the local backend only; preflight checks a "
            "Kubernetes cluster for a Kubernetes recipe (e.g. vllm-pd)."
        )
    return plan_findings(
        plan, snapshot=snapshot, kubeconfig=kubeconfig, probe_deadline=probe_deadline
    )


@app.command()
def preflight(
    recipe: str = typer.Argument(..., help="A Kubernetes recipe (e.g. vllm-pd) or its YAML."),
    sets: list[str] = SetOpt,
    values: list[Path] = ValuesOpt,
    snapshot: Path | None = typer.Option(
        None, "--snapshot", help=f"Read cluster state from this file: {SNAPSHOT_COMMAND}"
    ),
    kubeconfig: str | None = typer.Option(None, "--kubeconfig", help="Default: KUBECONFIG."),
    probe_deadline: int = typer.Option(120, "--probe-deadline", help="Seconds per probe Pod."),
    json_out: bool = typer.Option(False, "--json", help="Findings as JSON."),
) -> None:
    """Check a cluster for a recipe before deploying: in seconds, and changing nothing.

    Target nodes exist, are Ready, not cordoned, with tolerated taints; enough free
    accelerators counting every Pod that holds them in every namespace; namespace, CRDs,
    RDMA. Live, it then runs the read-only weights probe in a Pod on each target node.

    Exit 0 all pass, 1 a failing check, 2 could not run.

    Example: servebook preflight vllm-pd -f values.yaml --snapshot cluster.json
    """
    findings = preflight_findings(recipe, sets, values, snapshot, kubeconfig, probe_deadline)
    if json_out:
        out.print_json(to_json(findings))
    else:
        print_table(findings, title=f"servebook preflight {recipe}", console=out)
    code = exit_code(findings)
    if code:
        raise typer.Exit(code)
