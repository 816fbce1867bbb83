"""Command line entry point.  Commands live in ``servebook.commands.*``: parse, call, print;
logic lives in the modules they call."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from rich.markup import escape

from servebook import commands, stopping
from servebook.commands.index import COMMANDS
from servebook.console import err, styled
from servebook.errors import ServebookError


def load(argv: Sequence[str] | None = None) -> None:
    """Import the module of the command ``argv`` names (its first word that is not an
    option), before the command line is parsed; when it names none (--help, --version, a
    typo, nothing), none: ``commands.CommandGroup`` lists them all from ``index.COMMANDS``.
    ``argv`` None: every command (``servebook.cli.app``)."""
    if argv is None:
        wanted: Sequence[str] = list(COMMANDS)
    else:
        wanted = [w for w in argv if not w.startswith("-")][:1]
    for name in wanted:
        if name in COMMANDS:
            commands.import_command(name)


def __getattr__(name: str) -> Any:
    """``servebook.cli.app``: the application with every command imported (tests run it
    in-process)."""
    if name == "app":
        load()
        return commands.app
    raise AttributeError(name)


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped

#: The signals that stop a command the way Ctrl-C does: what it started is cleaned up, what
#: it measured is kept, and it exits 128 + the signal.  SIGTERM is what CI runners,
#: `timeout`, `kill` and systemd send; SIGHUP what a closing terminal or SSH session sends.
#: Measured before they were handled: a `timeout 600 servebook run` left tiny-pd's prefill,
#: decode and router running, and `status` called them healthy.
STOPPING = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
_stopped_by = stopping.stopped_by  # the signal that stopped this command, once one did


def main() -> None:
    """Console entry point: a command that cannot go on raises ``ServebookError``, and this
    is the one place it is printed (``LABEL: MESSAGE``, then ``fix: HINT`` on its own line)
    and turned into the exit code; nothing else is printed after it."""
    load(sys.argv[1:])  # before the handlers: a signal now finds entry's, or the defaults
    stopping.take_at_defaults(STOPPING, _on_stop)
    try:
        commands.app()
    except SystemExit as e:
        # Typer ends a command a stop signal interrupted with exit 130 and no word: say
        # what happened, and exit as a shell reports that signal.
        if e.code == EXIT_INTERRUPTED and _stopped_by:
            err.print(
                f"interrupted: stopped by {STOPPING[_stopped_by[0]]} before it finished; what "
                "it had started was stopped with it (`servebook status` shows any deployment).",
                markup=False,
            )
            sys.exit(_exit_code(EXIT_INTERRUPTED))
        raise
    except ServebookError as e:
        # Messages quote URLs, command lines and log lines: ``err`` redacts what it prints.
        message = escape(str(e))
        err.print(styled(f"[bold red]{escape(e.label)}:[/] {message}"), soft_wrap=True)
        if e.hint:
            err.print(f"fix: {e.hint}", soft_wrap=True)
        sys.exit(_exit_code(e.exit_code))


def _exit_code(code: int) -> int:
    """130 (stopped) is 128 + the signal that stopped the command."""
    return 128 + _stopped_by[0] if code == EXIT_INTERRUPTED and _stopped_by else code


def _on_stop(signum: int, _frame: FrameType | None) -> None:
    """A stop signal: say so at once (tearing down what a command started takes seconds),
    then stop as Python stops on Ctrl-C, so every clean-up written for Ctrl-C runs; bench
    and run say afterwards what was stopped and saved.  A second signal of any of them
    does not cut the clean-up short."""
    sig = signal.Signals(signum)
    _stopped_by.append(sig)
    for other in STOPPING:
        signal.signal(other, _still_cleaning)
    # A closed terminal (SIGHUP) may take stderr with it: the clean-up matters more.
    with contextlib.suppress(OSError):
        err.print(
            f"{STOPPING[sig]}: stopping; first cleaning up what this command started ...",
            markup=False,
        )
    if not stopping.deferred():  # else the running load's next poll raises it
        raise KeyboardInterrupt


def _still_cleaning(_signum: int, _frame: FrameType | None) -> None:
    with contextlib.suppress(OSError):
        err.print(
            "still cleaning up (if it is killed, `servebook down` stops what is left)",
            markup=False,
        )


__all__ = ["load", "main"]
