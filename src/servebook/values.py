"""Values a person types on the command line that more than one stage reads the same way.

Kept apart from ``bench`` and ``report`` so each can use it without importing the other.
"""

from __future__ import annotations

import math

from servebook.errors import UsageError


def parse_share(text: str, *, flag: str, what: str, also: str = "") -> float:
    """``"5%"`` or ``"0.05"`` -> 0.05: a share strictly between 0 and 1.  Anything else is
    unusable input naming ``flag``, ``what`` the share is of, and (``also``) any other
    accepted word."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        v = math.nan
    if not 0 < v < 1:
        raise UsageError(
            f"{flag} {text!r}: give {what}, e.g. 5% or 0.05 (more than 0, less than 100%)"
            + (f", or {also}" if also else "")
        )
    return v
