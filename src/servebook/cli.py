"""Command line entry point.  Commands live in ``servebook.commands.*``: parse, call, print;
logic lives in the modules they call."""

from __future__ import annotations

import sys

from rich.markup import escape

from servebook import redact
from servebook.commands import app
from servebook.commands import attach as _attach  # noqa: F401  (registers commands)
from servebook.commands import bench as _bench  # noqa: F401
from servebook.commands import deploy as _deploy  # noqa: F401
from servebook.commands import lint as _lint  # noqa: F401
from servebook.commands import model as _model  # noqa: F401
from servebook.commands import preflight as _preflight  # noqa: F401
from servebook.commands import probe as _probe  # noqa: F401
from servebook.commands import recipes as _recipes  # noqa: F401
from servebook.commands import render as _render  # noqa: F401
from servebook.commands import report as _report  # noqa: F401
from servebook.commands import verify as _verify  # noqa: F401
from servebook.console import err
from servebook.errors import ServebookError


def main() -> None:
    """Console entry point: a command that cannot go on raises ``ServebookError``, and this
    is the one place it is printed (``LABEL: MESSAGE``, then ``fix: HINT`` on its own line)
    and turned into the exit code; nothing else is printed after it."""
    try:
        app()
    except ServebookError as e:
        # Messages quote URLs, command lines and log lines: never a secret in them.
        message = escape(redact.text(str(e)))
        err.print(f"[bold red]{e.label}:[/] {message}", highlight=False, soft_wrap=True)
        if e.hint:
            err.print(f"fix: {escape(redact.text(e.hint))}", highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)


__all__ = ["app", "main"]
