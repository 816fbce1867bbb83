"""The Typer application, and the two ways every command prints beside its tables
(``servebook.console``): progress lines and ``--json``.  Each module beside this one
attaches one command (or command group) to ``app``; ``servebook.cli`` imports them all."""

from __future__ import annotations

import json
import time
from typing import Any

import typer
from rich.markup import escape

from servebook import __version__, redact
from servebook.console import err, out, styled

app = typer.Typer(
    name="servebook",
    help="Make LLM serving deployments provable: recipe -> running deployment -> "
    "evidence -> reproducible numbers.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def say(msg: str) -> None:
    """A progress line on stderr, with the time (up's and run's steps)."""
    err.print(
        styled(f"[dim]{time.strftime('%H:%M:%S')}[/] {escape(redact.text(msg))}"), soft_wrap=True
    )


def print_json(doc: Any) -> None:
    """``--json`` output, one way for every command: ``doc`` (an object, or JSON text) on
    stdout, indented by 2, non-ASCII as it is, without colour, so a pipe gets exactly what
    a terminal shows."""
    if isinstance(doc, str):
        doc = json.loads(doc)
    typer.echo(json.dumps(doc, indent=2, ensure_ascii=False, default=str))


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
