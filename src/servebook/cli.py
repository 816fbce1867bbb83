"""Command line entry point.  Commands live in ``servebook.commands.*``: parse, call, print;
logic lives in the modules they call."""

from __future__ import annotations

import signal
import sys
from types import FrameType

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
from servebook.console import err, styled
from servebook.errors import ServebookError

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


def main() -> None:
    """Console entry point: a command that cannot go on raises ``ServebookError``, and this
    is the one place it is printed (``LABEL: MESSAGE``, then ``fix: HINT`` on its own line)
    and turned into the exit code; nothing else is printed after it."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_interrupt)
    try:
        app()
    except SystemExit as e:
        # Typer ends a command Ctrl-C stopped with exit 130 and no word: say what happened.
        if e.code == EXIT_INTERRUPTED and signal.getsignal(signal.SIGINT) is _still_cleaning:
            err.print(
                "interrupted: stopped by Ctrl-C before it finished; what it had started was "
                "stopped with it (`servebook status` shows any deployment).",
                markup=False,
            )
        raise
    except ServebookError as e:
        # Messages quote URLs, command lines and log lines: never a secret in them.
        message = escape(redact.text(str(e)))
        err.print(styled(f"[bold red]{escape(e.label)}:[/] {message}"), soft_wrap=True)
        if e.hint:
            err.print(f"fix: {redact.text(e.hint)}", soft_wrap=True)
        sys.exit(e.exit_code)


def _on_interrupt(_signum: int, _frame: FrameType | None) -> None:
    """Ctrl-C: say so at once (tearing down what a command started takes seconds), then
    stop as Python does; bench and run say afterwards what was stopped and saved.  A
    second Ctrl-C does not cut the clean-up short."""
    signal.signal(signal.SIGINT, _still_cleaning)
    err.print("Ctrl-C: stopping; first cleaning up what this command started ...", markup=False)
    raise KeyboardInterrupt


def _still_cleaning(_signum: int, _frame: FrameType | None) -> None:
    err.print(
        "still cleaning up (if it is killed, `servebook down` stops what is left)", markup=False
    )


__all__ = ["app", "main"]
