"""Read what `servebook lint` is pointed at: YAML (one or many documents per file, Helm
``helm template`` output with its ``# Source:`` comments, ``kind: List``), markdown docs,
and directories of both.

Parsing is pure (``parse_yaml``, ``parse_markdown`` take text); only ``load_paths`` touches
the filesystem.  Every value keeps the line it came from, so a finding can say
``deploy/pd.yaml:42`` instead of "somewhere in the decode Deployment".

A path that does not exist, or a directory with nothing to read, is a ``UsageError``
(exit 2).  A file that cannot be read (YAML that does not parse, an unrendered template, a
file that is not text or not readable) never hides the others: ``load_paths`` reads every
other file and records it in ``LintSet.unreadable``, and ``unreadable_findings`` turns each
into an SB100 finding (severity error, so the run exits 2) naming the file, line and why.
Lint never reports "no findings" about a file it could not read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from servebook import inputs
from servebook.errors import UsageError
from servebook.findings import Finding, Severity, register_once

Key = str | int
KeyPath = tuple[Key, ...]

YAML_SUFFIXES = (".yaml", ".yml", ".json")
MARKDOWN_SUFFIXES = (".md", ".markdown")
# Directories never worth descending into when a whole tree is linted.
_SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".tox", ".mypy_cache"}
_HELM_SOURCE = re.compile(r"^#\s*Source:\s*(\S.*?)\s*$")
# A YAML comment starts at '#' at the beginning of a line or after whitespace.
_COMMENT = re.compile(r"(?:^|\s)#(.*)$")
# Go template actions (Helm charts, a controller's config templates): `{{ ... }}`.
_GO_TEMPLATE = re.compile(r"\{\{-?\s*[^}]*\}\}")

UNREADABLE = register_once(
    "SB100",
    "File could not be read",
    "A file lint cannot read is a file nobody checked: an unrendered template, YAML that "
    "does not parse, or a binary or unreadable file would reach the cluster (or fail "
    "there) with none of the other checks applied to it.",
    "Lint what is applied: the output of `helm template` (or of the tool that renders the "
    "file) rather than the template, fix the YAML at the line named, or leave files that "
    "are not YAML or markdown out of the paths given.",
)


@dataclass(frozen=True)
class Comment:
    """One YAML comment: its 1-based line and its text after ``#``."""

    line: int
    text: str


@dataclass
class Document:
    """One YAML document: plain data plus where each value came from."""

    path: str
    index: int
    line: int
    data: Any
    lines: Mapping[KeyPath, int] = field(default_factory=dict)
    # The ``# Source: chart/templates/x.yaml`` comment Helm writes above each document.
    helm_source: str | None = None

    def line_at(self, keypath: Sequence[Key]) -> int:
        """Line of the value at ``keypath``, or of its nearest ancestor that has one."""
        kp = tuple(keypath)
        while kp:
            if kp in self.lines:
                return self.lines[kp]
            kp = kp[:-1]
        return self.line

    def where(self, keypath: Sequence[Key] = ()) -> str:
        return f"{self.path}:{self.line_at(keypath)}"

    @property
    def is_kubernetes(self) -> bool:
        """A Kubernetes object has ``apiVersion`` and ``kind``; anything else (a servebook
        recipe, a Helm values file) is linted for placeholders only."""
        return (
            isinstance(self.data, dict)
            and isinstance(self.data.get("kind"), str)
            and isinstance(self.data.get("apiVersion"), str)
        )

    @property
    def kind(self) -> str:
        return str(self.data.get("kind", "")) if isinstance(self.data, dict) else ""

    @property
    def metadata(self) -> dict[str, Any]:
        md = self.data.get("metadata") if isinstance(self.data, dict) else None
        return md if isinstance(md, dict) else {}

    @property
    def name(self) -> str:
        return str(self.metadata.get("name") or "")

    @property
    def namespace(self) -> str | None:
        ns = self.metadata.get("namespace")
        return str(ns) if ns not in (None, "") else None

    @property
    def label(self) -> str:
        """``Deployment/decode`` for objects, the file's document number otherwise."""
        if self.is_kubernetes:
            return f"{self.kind}/{self.name or '<unnamed>'}"
        return f"document {self.index + 1}"


@dataclass
class YamlFile:
    path: str
    documents: list[Document]
    comments: list[Comment]


@dataclass
class MarkdownFile:
    path: str
    text: str


@dataclass(frozen=True)
class Unreadable:
    """A file lint could not read, and why (``line`` 0 when no line is to blame)."""

    path: str
    line: int
    why: str
    hint: str


@dataclass
class LintSet:
    """Everything one `servebook lint` run looks at."""

    yaml_files: list[YamlFile] = field(default_factory=list)
    markdown_files: list[MarkdownFile] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)

    @property
    def documents(self) -> list[Document]:
        return [d for f in self.yaml_files for d in f.documents]


def _line_map(node: yaml.Node, prefix: KeyPath, out: dict[KeyPath, int]) -> None:
    out[prefix] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                key = key_node.value
                out[(*prefix, key)] = key_node.start_mark.line + 1
                _line_map(value_node, (*prefix, key), out)
                # The key's line is more useful than the value's for block values.
                out[(*prefix, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_map(item, (*prefix, i), out)


def _comments(text: str) -> tuple[list[Comment], list[tuple[int, str]]]:
    """All comments, and the Helm ``# Source:`` ones, with their lines.

    A quoted string containing `` #`` is mistaken for a comment; only the image rule reads
    comments, and it only acts on image references, so that costs nothing in practice."""
    comments: list[Comment] = []
    sources: list[tuple[int, str]] = []
    for i, raw in enumerate(text.splitlines(), start=1):
        m = _COMMENT.search(raw)
        if not m:
            continue
        comments.append(Comment(i, m.group(1).strip()))
        s = _HELM_SOURCE.match(raw.strip())
        if s:
            sources.append((i, s.group(1)))
    return comments, sources


def _yaml_error(path: str, e: yaml.YAMLError) -> UsageError:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context = getattr(e, "context", None)
    detail = f"{context}, {problem}" if context else problem
    return UsageError(
        f"{where}: YAML does not parse ({detail}). Fix the syntax there; if this is an "
        "unrendered Helm template, lint the output of `helm template` instead."
    )


def parse_yaml(text: str, path: str) -> YamlFile:
    """Parse every document in ``text``; raise ``UsageError`` naming file and line.  Depth
    and aliases are bounded (``inputs.BoundedLoader``): past them the file is refused, so
    ``_line_map`` and the rules never walk a bomb's expansion."""
    comments, sources = _comments(text)
    documents: list[Document] = []
    loader = inputs.BoundedLoader(text)
    try:
        index = 0
        prev_end = 0
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            data = loader.construct_document(node)
            lines: dict[KeyPath, int] = {}
            _line_map(node, (), lines)
            start = node.start_mark.line + 1
            # The Source comment Helm writes sits between the previous document and this one.
            helm = [s for ln, s in sources if prev_end < ln <= start]
            prev_end = node.end_mark.line + 1
            for doc_data, doc_lines in _expand_lists(data, lines):
                if doc_data is None:
                    continue
                documents.append(
                    Document(
                        path=path,
                        index=index,
                        line=doc_lines.get((), start),
                        data=doc_data,
                        lines=doc_lines,
                        helm_source=helm[-1] if helm else None,
                    )
                )
                index += 1
    except inputs.YamlTooComplex as e:
        raise UsageError(f"{path}{inputs.yaml_where(e)}: {e.problem}.") from None
    except yaml.YAMLError as e:
        raise _yaml_error(path, e) from None
    finally:
        loader.dispose()
    return YamlFile(path=path, documents=documents, comments=comments)


def _expand_lists(data: Any, lines: dict[KeyPath, int]) -> Iterator[tuple[Any, dict[KeyPath, int]]]:
    """``kind: List`` (what ``kubectl get -o yaml`` prints) becomes one document per item."""
    items = data.get("items") if isinstance(data, dict) else None
    if (
        isinstance(data, dict)
        and isinstance(data.get("kind"), str)
        and data["kind"].endswith("List")
        and isinstance(items, list)
    ):
        for i, item in enumerate(items):
            sub = {k[2:]: v for k, v in lines.items() if k[:2] == ("items", i)}
            yield item, sub
        return
    yield data, lines


def parse_markdown(text: str, path: str) -> MarkdownFile:
    return MarkdownFile(path=path, text=text)


def _is_chart_templates(d: Path) -> bool:
    """Unrendered Helm templates are Go templates, not YAML: lint `helm template` output."""
    return d.name == "templates" and (d.parent / "Chart.yaml").is_file()


def _walk(root: Path, visited: set[tuple[int, int]] | None = None) -> Iterator[Path]:
    """The YAML and markdown files under ``root``.  Directory symlinks are followed, each
    directory once (by device and inode): two links looping back (``loop -> .``,
    ``up -> ../DIR``) would otherwise make 2^depth paths of one tree."""
    visited = set() if visited is None else visited
    try:
        st = root.stat()
    except OSError:
        return
    if (st.st_dev, st.st_ino) in visited:
        return
    visited.add((st.st_dev, st.st_ino))
    for p in sorted(root.iterdir()):
        if p.is_dir():
            if p.name in _SKIP_DIRS or p.name.startswith(".") or _is_chart_templates(p):
                continue
            yield from _walk(p, visited)
        elif p.suffix.lower() in YAML_SUFFIXES + MARKDOWN_SUFFIXES:
            yield p


def _read(p: Path, shown: str) -> str | Unreadable:
    """The file's text (``inputs``: a regular file, bounded, UTF-8), or why not."""
    try:
        data = inputs.read_bytes(p, "file")
    except inputs.InputError as e:
        return Unreadable(shown, 0, e.why, e.fix)
    try:
        return inputs.decode(data, p, "file")
    except inputs.InputError as e:
        return Unreadable(
            shown,
            0,
            f"{e.why[:-1]} (a binary file?); lint reads YAML, JSON and markdown.",
            "Leave it out of the paths given, or convert it to UTF-8.",
        )


def _parse_file(f: Path, shown: str, text: str) -> YamlFile | MarkdownFile | Unreadable:
    if f.suffix.lower() in MARKDOWN_SUFFIXES:
        return parse_markdown(text, shown)
    try:
        return parse_yaml(text, shown)
    except UsageError as e:
        m = re.match(re.escape(shown) + r"(?::(\d+))?(?::\d+)?: ", str(e))
        line = int(m.group(1)) if m and m.group(1) else 0
        why = str(e)[m.end() :] if m else str(e)
        if _GO_TEMPLATE.search(text):
            return Unreadable(
                shown,
                line,
                "an unrendered Go template (Helm, or a controller that fills in `{{ ... }}`), "
                "not YAML yet; lint what the tool renders from it.",
                "Lint the output of `helm template CHART` (or of the tool that renders it).",
            )
        return Unreadable(shown, line, why, "")


def unreadable_findings(lint_set: LintSet) -> list[Finding]:
    """One SB100 finding (severity error: exit 2) per file that could not be read."""
    return [
        UNREADABLE.finding(
            Severity.ERROR,
            f"{u.path}:{u.line}" if u.line else u.path,
            f"{u.path} was not linted: {u.why}",
            hint=u.hint or UNREADABLE.fix,
            evidence={"file": u.path, "line": u.line},
        )
        for u in lint_set.unreadable
    ]


def load_paths(paths: Iterable[str | Path]) -> LintSet:
    """Read files and directories (recursively) into a ``LintSet``.

    A file named explicitly is read whatever its suffix (markdown by ``.md``/``.markdown``,
    YAML otherwise); inside directories only YAML, JSON and markdown files are read."""
    lint_set = LintSet()
    seen: set[Path] = set()
    given = list(paths)
    if not given:
        raise UsageError("nothing to lint: give one or more files or directories.")
    for raw in given:
        p = Path(raw)
        if not p.exists():
            raise UsageError(f"{raw}: no such file or directory.")
        files = list(_walk(p)) if p.is_dir() else [p]
        if not files:
            # "No findings" about an empty directory would be a silent pass.
            raise UsageError(f"{raw}: no YAML, JSON or markdown files found under this directory.")
        for f in files:
            key = f.resolve()
            if key in seen:
                continue
            seen.add(key)
            shown = str(f)
            text = _read(f, shown)
            parsed = text if isinstance(text, Unreadable) else _parse_file(f, shown, text)
            if isinstance(parsed, Unreadable):
                lint_set.unreadable.append(parsed)
            elif isinstance(parsed, MarkdownFile):
                lint_set.markdown_files.append(parsed)
            else:
                lint_set.yaml_files.append(parsed)
    return lint_set


__all__ = [
    "Comment",
    "Document",
    "Key",
    "KeyPath",
    "LintSet",
    "MarkdownFile",
    "Unreadable",
    "YamlFile",
    "load_paths",
    "parse_markdown",
    "parse_yaml",
    "unreadable_findings",
]
