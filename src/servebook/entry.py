"""The console script (``servebook``) and ``python -m servebook``.

Importing a command takes up to a second (bench, experiment, report: numpy, pydantic, the
Kubernetes client), over two on a loaded machine. A stop signal (Ctrl-C, SIGTERM, SIGHUP)
in that time found Python's defaults: a KeyboardInterrupt traceback, or death by the
signal. Nothing has been started yet then, so there is nothing to clean up: the command
ends at once as a shell reports that signal (128 + its number), with one line and no
traceback. ``servebook.cli.main`` takes the signals over once the command is imported
(``servebook.cli.STOPPING``).  ``servebook --version`` imports no command line at all.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

from servebook import version_line
from servebook.stopping import default_handler, take_at_defaults

_EARLY = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _before_start(signum: int, _frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    os.write(2, f"interrupted by {name} before the command started: nothing to clean up\n".encode())
    os._exit(128 + signum)


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        # As the command line prints it (servebook.commands), without importing it: a fifth
        # of the CPU time, and the version is what scripts and bug reports ask first.
        try:
            print(version_line(), flush=True)
        except BrokenPipeError:  # the reader went: exit 1 and no traceback, as click ends
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        return
    taken = take_at_defaults(_EARLY, _before_start)
    from servebook import cli

    cli.load(sys.argv[1:])
    for sig in taken:
        signal.signal(sig, default_handler(sig))  # cli.main takes them over at their defaults
    cli.main()
