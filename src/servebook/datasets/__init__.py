"""Datasets that ship with servebook, named on the command line as ``--dataset
builtin:NAME``.

* ``spec-text``: 340 prompts of real English text and Python code written for servebook
  (Apache-2.0, as servebook; ``make_spec_text.py`` writes it), each asking for a passage
  back (repeat, copy, rewrite, complete): replies repeat their prompt's text, so n-gram and
  draft-model speculation have tokens to accept (``tiny-mixed-spec``, ``tiny-pd-spec``).
"""

from __future__ import annotations

from pathlib import Path

from servebook.errors import UsageError

PREFIX = "builtin:"
BUILTIN = {"spec-text": "spec-text.jsonl"}


def resolve(value: str) -> Path | None:
    """The file ``builtin:NAME`` names; None when ``value`` names no built-in dataset."""
    if not value.startswith(PREFIX):
        return None
    name = value[len(PREFIX) :]
    if name not in BUILTIN:
        raise UsageError(
            f"--dataset {value}: no built-in dataset {name!r}",
            hint="built-in datasets: " + ", ".join(PREFIX + n for n in sorted(BUILTIN)),
        )
    return Path(__file__).parent / BUILTIN[name]
