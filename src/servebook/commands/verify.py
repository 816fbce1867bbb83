"""`servebook verify [DEPLOYMENT]`: prove a deployment works from server-side counters."""

from __future__ import annotations

import typer

from servebook import auth
from servebook.backends import registry
from servebook.commands import KubeconfigOpt, app, deployment_name, print_json, seconds
from servebook.console import print_report
from servebook.deployment.view import DeploymentView
from servebook.errors import UsageError
from servebook.findings import REGISTRY, exit_code, to_json
from servebook.verify import checks as _checks  # noqa: F401  (registers SB3xx)
from servebook.verify.smoke import Options, Report
from servebook.verify.smoke import verify as verify_view


def _checks_help() -> str:
    lines = [f"  {c.id}  {c.title}" for c in REGISTRY.values() if c.id.startswith("SB3")]
    return "\n\n".join(lines)


def verify_deployment(view: DeploymentView, opts: Options) -> Report:
    return verify_view(view, opts)


def options(
    timeout: float,
    health_timeout: float,
    max_tokens: int,
    finish: str,
    api_key: str | None = None,
) -> Options:
    """verify's options; ``api_key`` is ``--api-key`` as given (None: the environment's)."""
    reasons = tuple(r.strip() for r in finish.split(",") if r.strip())
    if not reasons:
        raise UsageError("--finish-reason: give one or more of stop,length")
    if max_tokens < 1:
        raise UsageError("--max-tokens must be at least 1")
    return Options(
        request_timeout_s=timeout,
        health_timeout_s=health_timeout,
        max_tokens=max_tokens,
        finish_reasons=reasons,
        api_key=auth.resolve(api_key),
    )


TimeoutOpt = typer.Option(
    120.0, "--timeout", help="Seconds each verify request may take.", callback=seconds
)
HealthOpt = typer.Option(
    5.0, "--health-timeout", help="Seconds for /health and /metrics.", callback=seconds
)
MaxTokensOpt = typer.Option(
    1024,
    "--max-tokens",
    help="Smoke request length: enough for a reasoning model to reach its answer.",
)
FinishOpt = typer.Option(
    "stop,length",
    "--finish-reason",
    help="Accepted finish reasons of the smoke request (use 'stop' to insist the model "
    "finished its answer).",
)


ApiKeyOpt = typer.Option(
    None,
    "--api-key",
    help="Bearer token for a server that requires one (default: $OPENAI_API_KEY, else "
    "$VLLM_API_KEY). Never written to results, reports or logs. A server that refuses "
    "the request (401/403) ends the command with exit 2.",
    show_default=False,
)


PlaceOpt = typer.Option(
    None,
    "--backend",
    help="Find the deployment on this backend, with or without a record on this machine "
    "(kubernetes: by its label in the cluster).",
)
NamespaceOpt = typer.Option(
    None, "-n", "--namespace", help="With --backend kubernetes: the namespace to look in."
)


VERIFY_HELP = (
    "Prove a deployment works, from the servers' own counters.\n\n"
    "Sends a real generation through the entry point (and, for PD, a long prompt that "
    "must arrive at decode by KV transfer), reads every role's /metrics before and after, "
    "and judges.\n\n"
    "Exit 0 only when every check passes, 1 on a failing check, 2 when verify could not "
    "run. Every call has a timeout; a role that does not answer fails, it never passes."
    "\n\nOn Kubernetes every role is reached through a port-forward servebook opens to its "
    "Ready Pod for the length of the command; a forward that breaks or a Pod replaced "
    "meanwhile fails that role, named."
    "\n\nChecks:\n\n" + _checks_help() + "\n\nExample: servebook verify tiny-pd --json"
)


@app.command(help=VERIFY_HELP)
def verify(
    name: str | None = typer.Argument(
        None, help="Deployment name (default: the only one).", callback=deployment_name
    ),
    json_out: bool = typer.Option(False, "--json", help="Findings as JSON."),
    timeout: float = TimeoutOpt,
    health_timeout: float = HealthOpt,
    max_tokens: int = MaxTokensOpt,
    finish: str = FinishOpt,
    api_key: str | None = ApiKeyOpt,
    backend: str | None = PlaceOpt,
    namespace: str | None = NamespaceOpt,
    kubeconfig: str | None = KubeconfigOpt,
) -> None:
    opts = options(timeout, health_timeout, max_tokens, finish, api_key)
    owner, dep_name = registry.locate(name, backend=backend)
    with owner.open(dep_name, namespace) as view:
        rep = verify_deployment(view, opts)
    if json_out:
        doc = to_json(rep.findings, deployment=dep_name, elapsed_s=rep.elapsed_s)
        print_json(doc)
    else:
        print_report(rep, dep_name)
    code = exit_code(rep.findings)
    if code:
        raise typer.Exit(code)
