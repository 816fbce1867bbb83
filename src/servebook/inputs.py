"""Reading a file a user hands servebook: bounded, and refused in words that name it.

Every file servebook reads on a user's say-so (a recipe, a values file, what `lint` is
pointed at, a cluster snapshot, a ``results.json``, a node's mountinfo) is read here,
because a read that trusts its input can hang or exhaust the machine (the reliability
probe of 2026-12-04: a FIFO blocked `lint` for ever, a symlink to ``/dev/zero`` read
until MemoryError, a 400-byte YAML alias bomb took 2.2 GB):

* Only a regular file is read (symlinks are followed to one).  A FIFO, a device, a socket
  or a directory is refused at once in its own words ("is a FIFO, not a regular file"),
  never as "does not exist".  The file is opened non-blocking and checked again once open,
  so one swapped for a FIFO between the check and the open cannot block either.
* At most ``max_bytes`` are read (``MAX_BYTES`` unless the caller names another bound);
  the bound is named in the refusal.
* Text is UTF-8; a byte that is not is named with its line and offset.
* JSON and YAML nest at most ``MAX_DEPTH`` levels (deeper is refused: a RecursionError
  never reaches anyone), and YAML aliases may add at most ``MAX_ALIAS_NODES`` nodes to a
  document (a few hundred bytes of nested aliases otherwise expand to billions).

Every refusal is an ``InputError``: a ``UsageError`` (exit 2) naming the file, what is
wrong with it and the fix; ``why`` and ``fix`` are also kept apart for callers that report
a file among others (`lint`'s SB100).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from servebook.errors import UsageError

MiB = 2**20
MAX_BYTES = 64 * MiB
MAX_DEPTH = 100
MAX_ALIAS_NODES = 100_000

Pathish = str | os.PathLike[str]

# What a path is when it is not a regular file, in the words a refusal uses.
_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class InputError(UsageError):
    """A file that cannot be read as ``what``: the message is ``WHAT PATH WHY``, the hint
    ``fix``; ``path``, ``why`` and ``fix`` are kept for callers that word it their way."""

    def __init__(self, path: Pathish, what: str, why: str, fix: str) -> None:
        super().__init__(f"{what} {os.fspath(path)} {why}", hint=fix)
        self.path = os.fspath(path)
        self.why = why
        self.fix = fix


def _kind(mode: int) -> str:
    return next((word for test, word in _NOT_REGULAR if test(mode)), "not a regular file")


def _through(path: Pathish) -> str:
    """' (a symlink to TARGET)' when ``path`` is a symlink, for messages."""
    try:
        return f" (a symlink to {os.readlink(path)})" if os.path.islink(path) else ""
    except OSError:
        return ""


def check_regular(path: Pathish, what: str) -> os.stat_result:
    """The ``stat`` of ``path`` when it is (or links to) a regular file; ``InputError``
    saying what it is instead, or that it is absent or cannot be read."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        why = f"does not exist{_through(path)}."
        raise InputError(path, what, why, "Check the path.") from None
    except OSError as e:
        why = f"cannot be read ({e.strerror})."
        raise InputError(path, what, why, "Make it readable, or give another file.") from None
    if not stat.S_ISREG(st.st_mode):
        why = f"is {_kind(st.st_mode)}{_through(path)}, not a regular file."
        fix = f"Give the {what} as a regular file (a copy: `cat {os.fspath(path)} > FILE`)."
        if stat.S_ISDIR(st.st_mode):
            fix = f"Give the {what} itself, not a directory."
        raise InputError(path, what, why, fix)
    return st


def _too_large(path: Pathish, what: str, size: int, max_bytes: int) -> InputError:
    got = f"{size / MiB:.1f} MiB" if size >= 0 else "larger than that"
    why = f"is {got}; servebook reads at most {max_bytes / MiB:g} MiB of it."
    return InputError(path, what, why, f"Is this the right file? A {what} is never that large.")


def read_bytes(path: Pathish, what: str, max_bytes: int = MAX_BYTES) -> bytes:
    """The content of the regular file ``path`` (``what`` it is, for messages), at most
    ``max_bytes`` of it; ``InputError`` otherwise (module docstring)."""
    st = check_regular(path, what)
    if st.st_size > max_bytes:
        raise _too_large(path, what, st.st_size, max_bytes)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        why = f"cannot be read ({e.strerror})."
        raise InputError(path, what, why, "Make it readable, or give another file.") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise InputError(path, what, "changed while it was opened.", "Try again.")
        try:
            data = f.read(max_bytes + 1)
        except OSError as e:
            why = f"cannot be read ({e.strerror})."
            raise InputError(path, what, why, "Make it readable.") from None
    if len(data) > max_bytes:
        raise _too_large(path, what, -1, max_bytes)
    return data


def decode(data: bytes, path: Pathish, what: str) -> str:
    """``data`` as UTF-8 text, or ``InputError`` naming the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        why = f"is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} (line {line})."
        fix = "Save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`), or give the right file."
        raise InputError(path, what, why, fix) from None


def read_text(path: Pathish, what: str, max_bytes: int = MAX_BYTES) -> str:
    """``read_bytes`` decoded as UTF-8 (``decode``)."""
    return decode(read_bytes(path, what, max_bytes), path, what)


# --- JSON ------------------------------------------------------------------------------

_KEEP = frozenset(b'"[]{}')
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in _KEEP)
_INNERMOST = re.compile(rb"\[\]|\{\}")


def json_deeper_than(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether the *valid* JSON ``text`` nests arrays and objects more than ``limit`` deep,
    decided without recursion and at C speed (about half a ``json.loads``): escapes are
    dropped, then everything but quotes and brackets; what lies between quotes is string
    content; the rest loses its innermost pairs once per level."""
    raw = text.encode("utf-8", "surrogatepass")
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    rest = b"".join(raw.split(b'"')[0::2])
    for _ in range(limit):
        rest = _INNERMOST.sub(b"", rest)
        if not rest:
            return False
    return True


def too_deep(path: Pathish, what: str, limit: int = MAX_DEPTH) -> InputError:
    why = f"nests deeper than {limit} levels; servebook reads at most {limit}."
    return InputError(path, what, why, "Is this the right file? Real ones nest a few levels.")


def parse_json(text: str, path: Pathish, what: str) -> Any:
    """``json.loads(text)`` with its depth bounded (``InputError``); a
    ``json.JSONDecodeError`` is the caller's to word."""
    try:
        doc = json.loads(text)
    except RecursionError:
        raise too_deep(path, what) from None
    if json_deeper_than(text):
        raise too_deep(path, what)
    return doc


def load_json(path: Pathish, what: str, max_bytes: int = MAX_BYTES) -> Any:
    """A JSON document from the file ``path``, read and parsed within every bound."""
    text = read_text(path, what, max_bytes)
    try:
        return parse_json(text, path, what)
    except json.JSONDecodeError as e:
        why = f"is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})."
        raise InputError(path, what, why, "Fix the JSON there, or give the right file.") from None


# --- YAML ------------------------------------------------------------------------------


class YamlTooComplex(yaml.MarkedYAMLError):
    """A YAML document past a bound: nested deeper than ``MAX_DEPTH``, or aliases that
    expand it past ``MAX_ALIAS_NODES`` more nodes.  ``problem`` says which, in words."""


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` within ``MAX_DEPTH`` and ``MAX_ALIAS_NODES`` (``YamlTooComplex``
    otherwise).  Both are decided on the composed nodes, before any Python object is built:
    nesting as each node is composed, and each document's size with its aliases expanded
    by a walk that visits every node once (so a bomb costs what its text costs)."""

    def __init__(self, stream: str | bytes) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YamlTooComplex(
                    problem=f"nested deeper than {MAX_DEPTH} levels; servebook reads at most "
                    f"{MAX_DEPTH}",
                    problem_mark=mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        _check_expansion(node)
        return node


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _measure(node: yaml.Node, memo: dict[int, tuple[int, int]], depth: int) -> tuple[int, int]:
    """(nodes, levels) of ``node`` with its aliases expanded, each node measured once."""
    known = memo.get(id(node))
    if known is not None:
        return known
    if depth > MAX_DEPTH:  # also where an alias refers to its own ancestor (a cycle)
        raise YamlTooComplex(
            problem=f"nested deeper than {MAX_DEPTH} levels once its aliases are expanded "
            f"(or an alias refers to a node that holds it); servebook reads at most {MAX_DEPTH}",
            problem_mark=node.start_mark,
        )
    size, height = 1, 0
    for child in _children(node):
        s, h = _measure(child, memo, depth + 1)
        size, height = size + s, max(height, h)
    memo[id(node)] = (size, height + 1)
    return size, height + 1


def _check_expansion(root: yaml.Node | None) -> None:
    if root is None:
        return
    memo: dict[int, tuple[int, int]] = {}
    expanded, levels = _measure(root, memo, 1)
    if levels > MAX_DEPTH:
        raise YamlTooComplex(
            problem=f"nested deeper than {MAX_DEPTH} levels once its aliases are expanded; "
            f"servebook reads at most {MAX_DEPTH}",
            problem_mark=root.start_mark,
        )
    if expanded - len(memo) > MAX_ALIAS_NODES:
        raise YamlTooComplex(
            problem=f"its aliases expand {len(memo):,} nodes to {expanded:,}; servebook lets "
            f"aliases add at most {MAX_ALIAS_NODES:,} (an 'alias bomb' exhausts memory)",
            problem_mark=root.start_mark,
        )


def yaml_where(e: yaml.MarkedYAMLError) -> str:
    """':LINE' of a YAML error's mark, or ''."""
    mark = e.problem_mark or e.context_mark
    return f":{mark.line + 1}" if mark is not None else ""


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` within the bounds (``YamlTooComplex``, a ``yaml.YAMLError``)."""
    return yaml.load(text, Loader=BoundedLoader)  # a SafeLoader


def is_regular(path: Path) -> bool:
    """Whether ``path`` is (or links to) a regular file; never blocks, never raises."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


__all__ = [
    "MAX_ALIAS_NODES",
    "MAX_BYTES",
    "MAX_DEPTH",
    "BoundedLoader",
    "InputError",
    "YamlTooComplex",
    "check_regular",
    "decode",
    "is_regular",
    "json_deeper_than",
    "load_json",
    "parse_json",
    "read_bytes",
    "read_text",
    "safe_load",
    "too_deep",
    "yaml_where",
]
