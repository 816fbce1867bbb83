"""The Typer application and its consoles.  Each module beside this one attaches one
command (or command group) to ``app``; ``servebook.cli`` imports them all."""

from __future__ import annotations

import typer
from rich.console import Console

from servebook import __version__

app = typer.Typer(
    name="servebook",
    help="Make LLM serving deployments provable: recipe -> running deployment -> "
    "evidence -> reproducible numbers.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

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
