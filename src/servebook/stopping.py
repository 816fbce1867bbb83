"""Whether a stop signal (Ctrl-C, SIGTERM, SIGHUP) has asked this command to stop.

``servebook.cli``'s handler records the signal here, then raises ``KeyboardInterrupt`` so
every clean-up written for Ctrl-C runs. Inside an event loop that raise can land in a C
callback (uvloop's transports, mid-``data_received``), where the loop prints a
"Fatal error on transport" traceback, counts one failed request and carries on: bench's
sweep then ran to its end and exited 0 after a Ctrl-C. So a loop that polls (bench's load
polls every 50 ms) runs ``with polled():``; meanwhile the handler only records the signal,
and the loop's own poll raises it with ``raise_if_requested()``, where nothing swallows it."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any] | signal.Handlers

stopped_by: list[signal.Signals] = []  # the signal that stopped this command, once one did
_polling = [0]


def deferred() -> bool:
    """Whether a stop is left to a poll (``polled``) rather than raised at once."""
    return _polling[0] > 0


@contextlib.contextmanager
def polled() -> Iterator[None]:
    """The block's own polls raise a stop signal; the handler does not raise it."""
    _polling[0] += 1
    try:
        yield
    finally:
        _polling[0] -= 1


def raise_if_requested() -> None:
    if stopped_by:
        raise KeyboardInterrupt


def default_handler(sig: signal.Signals) -> Handler:
    """What Python leaves a signal at: Ctrl-C raises ``KeyboardInterrupt``, others kill."""
    return signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL


def take_at_defaults(
    signals: Iterable[signal.Signals], handler: Callable[[int, FrameType | None], Any]
) -> list[signal.Signals]:
    """Install ``handler`` for each signal still at its default, and return those: a
    signal the caller ignores (nohup's SIGHUP) or handles stays as the caller set it."""
    taken = []
    for sig in signals:
        if signal.getsignal(sig) is default_handler(sig):
            signal.signal(sig, handler)
            taken.append(sig)
    return taken
