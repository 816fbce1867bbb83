"""The one error type a command ends with, and how it is printed.

A ``ServebookError`` carries what went wrong (``message``: the file, key, role or URL and
why), what to do about it (``hint``: the next command or setting; may be None) and the
command's exit code.  ``cli.main`` catches every one and prints it the same way, redacted:
``LABEL: MESSAGE`` and, on a line of its own, ``fix: HINT``.  Nothing else prints an
error and exits: a command raises, the handler prints.

Exit codes are the ones findings use (``servebook.findings``): 1 when the thing checked
failed (a deployment that did not become ready, a sweep stopped by a dead role), 2 when
the command could not run (unusable input, an unreachable endpoint).
"""

from __future__ import annotations


class ServebookError(Exception):
    """An error a command ends with: ``message``, ``hint`` and ``exit_code`` (see the
    module docstring).  ``str(e)`` is the message alone; ``label`` is the word printed
    before it."""

    exit_code: int = 2  # findings.EXIT_UNUSABLE
    label: str = "error"

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        exit_code: int | None = None,
        label: str | None = None,
    ) -> None:
        super().__init__(message)
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code
        if label is not None:
            self.label = label


class UsageError(ServebookError):
    """Unusable input: the command prints this message and exits 2, having started and
    written nothing.  The message names the file, key or value; the hint, the fix."""


__all__ = ["ServebookError", "UsageError"]
