"""The console script (``servebook``) and ``python -m servebook``.

Importing every command takes about a second, over two on a loaded machine. A stop signal
(Ctrl-C, SIGTERM, SIGHUP) in that time found Python's defaults: a KeyboardInterrupt
traceback, or death by the signal. Nothing has been started yet then, so there is nothing
to clean up: the command ends at once as a shell reports that signal (128 + its number),
with one line and no traceback. ``servebook.cli.main`` takes the signals over once the
commands are imported (``servebook.cli.STOPPING``).
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

from servebook.stopping import default_handler, take_at_defaults

_EARLY = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _before_start(signum: int, _frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    os.write(2, f"interrupted by {name} before the command started: nothing to clean up\n".encode())
    os._exit(128 + signum)


def main() -> None:
    taken = take_at_defaults(_EARLY, _before_start)
    from servebook import cli

    cli.load(sys.argv[1:])
    for sig in taken:
        signal.signal(sig, default_handler(sig))  # cli.main takes them over at their defaults
    cli.main()
