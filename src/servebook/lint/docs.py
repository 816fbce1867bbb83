"""Lint rules over markdown docs (ids ``SB120``-``SB129``).

Docs are where people copy commands from; a broken fence or a command that hangs is a
production failure one paste away.  Shell blocks are fenced blocks whose info string names
a shell (``sh``, ``bash``, ``shell``, ``zsh``, ``console``, ...).  In ``console`` blocks that
mark commands with a prompt (``$ ...``) only prompt lines are commands and everything else is
output; a ``console`` block with no prompt at all is commands, as vLLM's docs write them
(``kubectl apply ...`` then ``curl ...``, no ``$``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from servebook.findings import Finding, Severity, register
from servebook.lint.loader import MarkdownFile

SHELL_LANGUAGES = frozenset(
    {"sh", "bash", "shell", "zsh", "ksh", "console", "shell-session", "shellsession", "terminal"}
)
_PROMPT_LANGUAGES = frozenset({"console", "shell-session", "shellsession", "terminal"})
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
_ALTERNATIVES = re.compile(r"<[^\s<>|'\"]+(?:\|[^\s<>|'\"]+)+>")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
# `|`, `;`, `&&`, `||`, `&`, but not the `&` of a redirection (`2>&1`, `&>`).
_LIST_OPERATOR = re.compile(r"\|\||&&|\||;|(?<![<>])&(?!>)")
_CURL = re.compile(r"(?<![\w/.-])(?:\S*/)?curl(?![\w.-])")


@dataclass
class CodeBlock:
    """A fenced block: the fence line, its info string, and its content lines."""

    fence_line: int
    info: str
    lines: list[tuple[int, str]] = field(default_factory=list)
    closed: bool = False

    @property
    def language(self) -> str:
        word = self.info.strip().split(maxsplit=1)[0] if self.info.strip() else ""
        return word.strip("{}.").lower()

    @property
    def is_shell(self) -> bool:
        return self.language in SHELL_LANGUAGES


def code_blocks(text: str) -> list[CodeBlock]:
    """Fenced code blocks (CommonMark fences, any indentation so list items count)."""
    blocks: list[CodeBlock] = []
    current: CodeBlock | None = None
    fence = ""
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _FENCE.match(line)
        if current is None:
            if m and not (m.group(2)[0] == "`" and "`" in m.group(3)):
                fence = m.group(2)
                current = CodeBlock(fence_line=lineno, info=m.group(3).strip())
            continue
        if (
            m
            and m.group(2)[0] == fence[0]
            and len(m.group(2)) >= len(fence)
            and not m.group(3).strip()
        ):
            current.closed = True
            blocks.append(current)
            current = None
            continue
        current.lines.append((lineno, line))
    if current is not None:
        blocks.append(current)
    return blocks


def _strip_comment(line: str) -> str:
    """The line without a shell comment (a ``#`` outside quotes, at a word start)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _unquoted(line: str) -> str:
    """The line with quoted text blanked out, so patterns only see what the shell parses."""
    out = []
    quote = ""
    for ch in line:
        if quote:
            out.append(" " if ch != quote else ch)
            if ch == quote:
                quote = ""
        else:
            if ch in "'\"":
                quote = ch
            out.append(ch)
    return "".join(out)


def _is_prompt(stripped: str) -> bool:
    return stripped.startswith("$ ") or stripped == "$"


def shell_commands(block: CodeBlock) -> Iterator[tuple[int, str]]:
    """Logical command lines of a shell block: continuations joined, comments, heredoc
    bodies and (in console blocks) output lines dropped."""
    prompt_only = block.language in _PROMPT_LANGUAGES and any(
        _is_prompt(raw.lstrip()) for _, raw in block.lines
    )
    pending: tuple[int, str] | None = None
    heredoc_end: str | None = None
    in_command = False
    for lineno, raw in block.lines:
        if heredoc_end is not None:
            if raw.strip() == heredoc_end:
                heredoc_end = None
            continue
        line = raw
        if prompt_only and pending is None:
            stripped = line.lstrip()
            if _is_prompt(stripped):
                line = stripped[1:]
                in_command = True
            elif not in_command:
                continue
        line = _strip_comment(line)
        if pending is not None:
            start, text = pending
            text = text + " " + line.strip()
        else:
            start, text = lineno, line.strip()
        if text.endswith("\\"):
            pending = (start, text[:-1])
            continue
        pending = None
        in_command = False
        hd = _HEREDOC.search(_unquoted(text))
        if hd:
            heredoc_end = hd.group(2)
        if text:
            yield start, text
    if pending is not None and pending[1].strip():
        yield pending


def _words(segment: str) -> list[str]:
    try:
        return shlex.split(segment, comments=False)
    except ValueError:
        return segment.split()


def curl_has_timeout(words: list[str]) -> bool:
    for w in words:
        if w in ("--max-time", "-m") or w.startswith("--max-time="):
            return True
        # Short options cluster: -sSm 5, -m5, -fsSLm10
        if re.match(r"^-[A-Za-z]*m", w) and not w.startswith("--"):
            return True
    return False


def _segments(command: str) -> list[str]:
    """Pipeline / list members: curl's options end at the next | ; && ||."""
    unq = _unquoted(command)
    parts = []
    start = 0
    for m in _LIST_OPERATOR.finditer(unq):
        parts.append(command[start : m.start()])
        start = m.end()
    parts.append(command[start:])
    return [p for p in parts if p.strip()]


UNCLOSED_FENCE = register(
    "SB120",
    "Markdown code fence never closed (odd number of fences)",
    "An unclosed fence turns the rest of the document into one code block: the headings, "
    "warnings and steps after it disappear from the rendered page, and a reader copying the "
    "block gets prose pasted into their shell.",
    "Close the fence with the same character (``` or ~~~), at least as long as the opening "
    "one, on a line of its own.",
)


def check_fences(md: MarkdownFile, blocks: list[CodeBlock]) -> list[Finding]:
    findings = []
    fences = sum(2 if b.closed else 1 for b in blocks)
    for b in blocks:
        if not b.closed:
            findings.append(
                UNCLOSED_FENCE.finding(
                    Severity.FAIL,
                    f"{md.path}:{b.fence_line}",
                    f"code fence opened at line {b.fence_line} is never closed "
                    f"({fences} fence lines in the file); everything after it renders as "
                    "code.",
                    evidence={"file": md.path, "line": b.fence_line, "fences": fences},
                )
            )
    return findings


ANGLE_ALTERNATIVES = register(
    "SB121",
    "`<a|b>` alternatives inside a shell block",
    "Pasted into a shell, `<prefill|decode>` is not a choice: `<prefill` redirects input "
    "from a file named prefill and `|decode>` pipes into a command named decode, writing "
    "to whatever follows. The command fails with a confusing error, or runs half of itself "
    "and creates stray files.",
    "Write one concrete command per alternative, or a variable the reader sets first "
    "(`ROLE=decode` then `$ROLE`).",
)
CURL_NO_TIMEOUT = register(
    "SB122",
    "`curl` without --max-time in a shell block",
    "A probe without a bound waits as long as the server lets it: a port-forward whose "
    "local port was taken, or a PD pair that hangs with Pods Ready, keeps the command "
    "(and any script or CI job built from the doc) waiting for tens of minutes, or a piped "
    "check prints nothing and exits 0, a silent pass. Every probe carries an explicit "
    "timeout.",
    "Add `--max-time SECONDS` (or `-m SECONDS`) to every curl, or run it under `timeout SECONDS`.",
)


def check_shell_block(md: MarkdownFile, block: CodeBlock) -> list[Finding]:
    findings = []
    for lineno, command in shell_commands(block):
        for m in _ALTERNATIVES.finditer(_unquoted(command)):
            findings.append(
                ANGLE_ALTERNATIVES.finding(
                    Severity.FAIL,
                    f"{md.path}:{lineno}",
                    f"{m.group(0)} in a {block.language} block is read by the shell as a "
                    "redirect and a pipe, not as a choice.",
                    evidence={"file": md.path, "line": lineno, "text": m.group(0)},
                )
            )
        for segment in _segments(command):
            curl = _CURL.search(_unquoted(segment))
            if not curl:
                continue
            words = _words(segment)
            before = _words(segment[: curl.start()])
            if "timeout" in before or curl_has_timeout(words):
                continue
            shown = segment.strip()
            findings.append(
                CURL_NO_TIMEOUT.finding(
                    Severity.FAIL,
                    f"{md.path}:{lineno}",
                    f"curl without --max-time: `{shown[:100]}`; it can wait forever, and a "
                    "piped check that prints nothing exits 0.",
                    evidence={"file": md.path, "line": lineno, "command": shown},
                )
            )
    return findings


def check_markdown(md: MarkdownFile) -> list[Finding]:
    blocks = code_blocks(md.text)
    findings = check_fences(md, blocks)
    for b in blocks:
        if b.is_shell:
            findings.extend(check_shell_block(md, b))
    return findings


def check(markdown_files: Iterable[MarkdownFile]) -> list[Finding]:
    findings: list[Finding] = []
    for md in markdown_files:
        findings.extend(check_markdown(md))
    return findings


__all__ = [
    "ANGLE_ALTERNATIVES",
    "CURL_NO_TIMEOUT",
    "UNCLOSED_FENCE",
    "CodeBlock",
    "check",
    "check_markdown",
    "code_blocks",
    "curl_has_timeout",
    "shell_commands",
]
