"""The engine command line a Pod's container really runs, read from the Pod alone.

Stacks start vLLM three ways (``servebook.kube.stacks`` names where each is seen):

* the argv itself: ``command``/``args`` with ``vllm serve`` or ``python -m ...`` in it;
* one shell string, ``sh -c "python3 -m vllm.entrypoints.openai.api_server --port 8000 ..."``
  (AIBrix's samples);
* a script whose last line is ``eval "exec vllm serve ... ${VLLM_ADDITIONAL_ARGS} $@"``
  with ``--`` and the user's ``args`` after it (KServe's LLMInferenceService templates):
  the flags that matter are in the container's environment and in ``$@``.

``resolve`` expands such a script the way the shell would for the parts that carry flags
(``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``$@``, ``"$@"``, ``eval``), from the
container's own ``env`` values and the positional ``args``, and returns the engine's argv as
a flat list that ``servebook.engines.cmdline.parse_argv`` reads like any other.  What it
cannot know (a variable set from a Secret or a ``$(...)`` substitution) is said, never
guessed.  Pure: plain data in, plain data out.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servebook.engines import cmdline

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# $@ / $* / ${NAME} / ${NAME:-default} / ${NAME-default} / $NAME
_REFERENCE = re.compile(
    r"\$(?:(?P<all>[@*])|\{(?P<braced>" + _NAME + r")(?:(?P<op>:?-)(?P<default>[^}]*))?\}"
    r"|(?P<bare>" + _NAME + r"))"
)
# NAME="value" / NAME='value' / NAME=value, alone on a line (the script's own settings)
_ASSIGNMENT = re.compile(
    r"^\s*(?:export\s+)?(?P<name>" + _NAME + r")=(?P<value>\"[^\"]*\"|'[^']*'|\S*)\s*$", re.M
)


@dataclass
class Resolved:
    """The engine's argv as the container runs it, and what could not be read."""

    argv: list[str]
    engine: cmdline.EngineCommand | None
    # How the argv was found: "argv", "sh -c script", "sh -c script via eval".
    form: str = "argv"
    unknown: list[str] = field(default_factory=list)


def env_values(container: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The container's literal ``env`` values, and the names set from elsewhere
    (``valueFrom``: a Secret, a ConfigMap, a field) whose values a Pod does not show."""
    values: dict[str, str] = {}
    elsewhere: list[str] = []
    for e in container.get("env") or []:
        if not isinstance(e, dict) or "name" not in e:
            continue
        if "value" in e:
            values[str(e["name"])] = str(e["value"])
        elif "valueFrom" in e:
            elsewhere.append(str(e["name"]))
    return values, elsewhere


def _words(items: Any) -> list[str]:
    return [str(x) for x in items] if isinstance(items, list) else []


def _quote_states(script: str) -> list[str]:
    """For each character: ``'`` inside single quotes, ``"`` inside double, else ``""``."""
    states: list[str] = []
    quote = ""
    escaped = False
    for ch in script:
        states.append(quote)
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote == "" and ch in "'\"":
            quote = ch
        elif ch == quote:
            quote = ""
    return states


def _in_double_quotes(text: str) -> str:
    """``text`` as literal content of a double-quoted shell word."""
    return re.sub(r'([\\"$`])', r"\\\1", text)


def _expand(
    script: str, env: Mapping[str, str], positional: Sequence[str], unknown: list[tuple[int, str]]
) -> str:
    """The script with its references replaced as the shell would: in double quotes the
    value is literal text; unquoted, it is split on whitespace into words (no quote
    processing, so each word is re-quoted here).  Inside single quotes nothing changes."""
    states = _quote_states(script)
    own = {m["name"]: m["value"].strip("\"'") for m in _ASSIGNMENT.finditer(script)}

    def value_of(m: re.Match[str]) -> str | None:
        if m["all"]:
            return " ".join(shlex.quote(p) for p in positional)
        name = m["braced"] or m["bare"]
        if name in env:
            value = env[name]
            return value if (value or m["op"] != ":-") else (m["default"] or "").strip("\"'")
        if name in own:
            return own[name]
        if m["op"]:
            default = m["default"] or ""
            quoted = len(default) > 1 and default[0] == default[-1] and default[0] in "'\""
            return default[1:-1] if quoted else default
        unknown.append((m.start(), f"${name} (not a literal env value of the container)"))
        return ""

    out: list[str] = []
    last = 0
    for m in _REFERENCE.finditer(script):
        state = states[m.start()] if m.start() < len(states) else ""
        if state == "'" or (m.start() and script[m.start() - 1] == "\\"):
            continue
        value = value_of(m)
        if value is None:
            continue
        out.append(script[last : m.start()])
        if state == '"':
            if m["all"] == "@":  # "$@": one word per argument
                quoted = " ".join(f'"{_in_double_quotes(p)}"' for p in positional)
                out.append(f'" {quoted} "')
            else:
                out.append(_in_double_quotes(value))
        else:
            words = value.split() if not m["all"] else shlex.split(value)
            out.append(" ".join(shlex.quote(w) for w in words))
        last = m.end()
    out.append(script[last:])
    return "".join(out)


def _engine_in(commands: Sequence[Sequence[str]]) -> tuple[list[str], bool] | None:
    """The engine invocation among simple commands: ``(argv, via eval)``."""
    for words in commands:
        via_eval = False
        if words and words[0] == "eval":
            # eval joins its words and reads them again as shell input.
            again = cmdline.split_shell(" ".join(words[1:]))
            if not again:
                continue
            words, via_eval = again[0], True
        if cmdline.parse_argv(list(words)) is not None:
            return list(words), via_eval
    return None


_PREFIXES = frozenset({"exec", "env", "nohup", "command"})
_SETTING = re.compile(_NAME + "=")


def _command_words(words: Sequence[str]) -> list[str]:
    """The words from the program on: ``exec``, ``env`` and ``NAME=value`` before it go."""
    i = 0
    while i < len(words) and (words[i] in _PREFIXES or _SETTING.match(words[i])):
        i += 1
    return list(words[i:])


_KUBE_REFERENCE = re.compile(r"\$\$|\$\((" + _NAME + r")\)")


def kube_expand(word: str, env: Mapping[str, str]) -> str:
    """What the kubelet does to ``command``/``args`` before the container starts:
    ``$(NAME)`` becomes the container's env value (unknown ones stay as written), ``$$``
    is a literal ``$``."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _KUBE_REFERENCE.sub(one, word)


def resolve(container: Mapping[str, Any]) -> Resolved:
    """The engine argv of a container (see the module docstring).  ``engine`` is None
    when the container does not run vLLM in a shape servebook reads."""
    env, elsewhere = env_values(container)
    command = [kube_expand(w, env) for w in _words(container.get("command"))]
    args = [kube_expand(w, env) for w in _words(container.get("args"))]
    argv = command + args
    container = {**container, "command": command, "args": args}
    shell = cmdline.shell_call(argv)
    if shell is None:
        engine = cmdline.parse_container(container)
        return Resolved(argv=argv, engine=engine)
    script, positional = shell
    refs: list[tuple[int, str]] = []
    expanded = _expand(script, env, positional, refs)
    # Only what the engine's own line refers to matters (a script sets up other things).
    at = min((i for i in (script.rfind("vllm serve"), script.rfind("-m ")) if i >= 0), default=0)
    unknown = [why for pos, why in refs if pos >= at]
    if "$(" in script[at:] or "`" in script[at:]:
        unknown.append("a $(...) command substitution in the engine's line (not run here)")
    commands = cmdline.split_shell(expanded)
    found = _engine_in(commands or [])
    if found is None:
        return Resolved(argv=argv, engine=None, form="sh -c script", unknown=unknown)
    words, via_eval = found
    flat = [w for w in _command_words(words) if w != ""]
    engine = cmdline.parse_argv(flat)
    if engine is not None:
        engine.via_shell = True
    missing = [n for n in elsewhere if n in script[at:]]
    unknown += [
        f"${n} (set from a Secret, ConfigMap or field: not shown in the Pod)" for n in missing
    ]
    form = "sh -c script via eval" if via_eval else "sh -c script"
    return Resolved(argv=flat, engine=engine, form=form, unknown=sorted(set(unknown)))


__all__ = ["Resolved", "env_values", "resolve"]
