"""Command line: parse, call, print.  Logic lives in the modules it calls."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from servebook import __version__
from servebook.findings import UsageError

app = typer.Typer(
    name="servebook",
    help="Make LLM serving deployments provable: recipe -> running deployment -> "
    "evidence -> reproducible numbers.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
model_app = typer.Typer(help="Make models for demos and tests (nothing is downloaded).",
                        no_args_is_help=True)
app.add_typer(model_app, name="model")

out = Console()
err = Console(stderr=True)


def _version_callback(value: bool) -> None:
    if value:
        out.print(f"servebook {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    """servebook turns recipes into running deployments, proves them from server-side
    counters, and measures them with a protocol whose numbers survive a re-run."""


def main() -> None:
    """Console entry point: unusable input exits 2 with one clear message."""
    try:
        app()
    except UsageError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)


__all__ = ["Path", "app", "err", "main", "out"]
