"""vLLM engine command lines: find one inside a container, read its flags.

This is servebook's one reader of engine command lines: the recipe resolver (reserved and
repeated flags), the manifest renderer (KV connector, parallel sizes), verify (the
speculative config each role really started with) and lint all use it.

A container runs vLLM in one of these shapes, all seen in real manifests:

* ``command: [vllm, serve, MODEL, --flag, ...]`` (or the flags in ``args``);
* ``command: [python3, -m, vllm.entrypoints.openai.api_server, --model, MODEL, ...]``;
* ``command: [/bin/sh, -c]`` with ``args: ["... && exec vllm serve MODEL \\\\n --flag ..."]``
  (a shell script; read with ``shlex``, line continuations joined);
* no ``command`` at all, ``args`` only, in an image whose entrypoint is the engine
  (``vllm/vllm-openai``).

Flags are read the way vLLM's argparse reads them: ``--flag value`` and ``--flag=value``,
underscores equal to dashes (``--tensor_parallel_size``), the short aliases (``-tp``),
``--no-X`` as the negation of ``X``, and the dotted form that sets one key of a JSON flag
(``--kv-transfer-config.kv_connector NixlConnector``).  When a flag is given twice argparse
keeps the last value silently; ``duplicates()`` finds exactly that.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# `python -m MODULE` entry points that take vLLM engine arguments.  dynamo.vllm (NVIDIA
# Dynamo's worker) passes its arguments through to vLLM's engine arguments.
ENGINE_MODULES = frozenset(
    {
        "vllm.entrypoints.openai.api_server",
        "vllm.entrypoints.cli.main",
        "dynamo.vllm",
    }
)
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ash", "ksh"})

# vLLM's short aliases (vllm/engine/arg_utils.py).  Unknown short options stay as written.
SHORT_ALIASES: Mapping[str, str] = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-dcp": "--decode-context-parallel-size",
    "-dpl": "--data-parallel-size-local",
    "-dpr": "--data-parallel-rank",
    "-dpa": "--data-parallel-address",
    "-dpp": "--data-parallel-rpc-port",
    "-dpb": "--data-parallel-backend",
    "-sc": "--speculative-config",
    "-q": "--quantization",
    "-O": "--compilation-config",
}

# Flags that take no value: the next token is never theirs (it may be the model).
BOOLEAN_FLAGS = frozenset(
    {
        "--enforce-eager",
        "--trust-remote-code",
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--disable-log-requests",
        "--enable-log-requests",
        "--disable-log-stats",
        "--enable-expert-parallel",
        "--enable-auto-tool-choice",
        "--enable-lora",
        "--enable-sleep-mode",
        "--disable-custom-all-reduce",
        "--disable-sliding-window",
        "--disable-frontend-multiprocessing",
        "--enable-request-id-headers",
        "--enable-prompt-tokens-details",
        "--enable-force-include-usage",
        "--enable-server-load-tracking",
        "--async-scheduling",
        "--headless",
        "--skip-tokenizer-init",
        "--is-prefill-worker",
        "--disable-uvicorn-access-log",
        "--return-tokens-as-token-ids",
    }
)
# Flags that take one or more values (argparse nargs="+").
MULTI_VALUE_FLAGS = frozenset({"--served-model-name", "--lora-modules", "--allowed-origins"})
# Flags argparse accumulates (action="append"): repeating them is not an override.
REPEATABLE_FLAGS = frozenset({"--middleware"})
_PUNCTUATION = frozenset(";&|()<>\n")
# The file-descriptor number glued to a redirection (``2>&1``, ``2>/dev/null``).
_FD_REDIRECT = re.compile(r"(?<![^\s;&|])\d+(?=[<>])")
_NUMBER = re.compile(r"^-\d")


@dataclass(frozen=True)
class Flag:
    """One engine flag as given: normalized name, values, position among the args."""

    name: str
    values: tuple[str, ...]
    written: str
    position: int
    # For the dotted form (``--kv-transfer-config.kv_connector X``): the key path.
    subkey: str = ""

    @property
    def value(self) -> str | None:
        return " ".join(self.values) if self.values else None

    @property
    def setting(self) -> str:
        """What the flag sets: ``--no-enable-x`` and ``--enable-x`` set the same thing."""
        base = self.name
        if base.startswith("--no-"):
            base = "--" + base[len("--no-") :]
        return f"{base}.{self.subkey}" if self.subkey else base


@dataclass
class EngineCommand:
    """The engine invocation found in a container, and its flags."""

    entrypoint: str
    args: list[str]
    flags: list[Flag] = field(default_factory=list)
    positional_model: str | None = None
    # Set when the command came from a shell script, for messages.
    via_shell: bool = False

    def last(self, name: str) -> Flag | None:
        """The flag argparse would use: the last occurrence (dotted forms excluded)."""
        found = [f for f in self.flags if f.name == name and not f.subkey]
        return found[-1] if found else None

    def has(self, name: str) -> bool:
        return any(f.name == name for f in self.flags)

    def value(self, name: str) -> str | None:
        f = self.last(name)
        return f.value if f else None

    @property
    def model(self) -> str | None:
        return self.value("--model") or self.positional_model

    @property
    def served_model_names(self) -> tuple[str, ...]:
        f = self.last("--served-model-name")
        if f and f.values:
            return f.values
        return (self.model,) if self.model else ()

    def json_value(self, name: str) -> tuple[dict[str, Any] | None, str | None]:
        """The JSON object a flag sets, with any dotted ``--name.key value`` applied.

        Returns ``(config, error)``: ``(None, None)`` when the flag is absent; ``error``
        says why the JSON could not be read (the engine would refuse it at startup)."""
        base = self.last(name)
        dotted = [f for f in self.flags if f.name == name and f.subkey]
        if base is None and not dotted:
            return None, None
        config: dict[str, Any] = {}
        if base is not None:
            text = base.value or ""
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as e:
                return None, f"{name} value is not valid JSON ({e.msg} at column {e.colno})"
            if not isinstance(parsed, dict):
                return None, f"{name} value is JSON but not an object"
            config = parsed
        for f in dotted:
            node = config
            parts = f.subkey.split(".")
            for part in parts[:-1]:
                nxt = node.get(part)
                if not isinstance(nxt, dict):
                    nxt = {}
                    node[part] = nxt
                node = nxt
            raw = f.value or ""
            try:
                node[parts[-1]] = json.loads(raw)
            except json.JSONDecodeError:
                node[parts[-1]] = raw
        return config, None

    def duplicates(self) -> dict[str, list[Flag]]:
        """Settings given more than once; argparse silently keeps the last one."""
        by_setting: dict[str, list[Flag]] = {}
        for f in self.flags:
            if f.name in REPEATABLE_FLAGS:
                continue
            by_setting.setdefault(f.setting, []).append(f)
        if self.positional_model is not None and "--model" in by_setting:
            by_setting["--model"].insert(
                0, Flag("--model", (self.positional_model,), "(positional)", -1)
            )
        return {k: v for k, v in by_setting.items() if len(v) > 1}


def normalize_flag(token: str) -> tuple[str, str]:
    """``--tensor_parallel_size`` -> ``--tensor-parallel-size``; ``-tp`` -> its long name.

    Returns ``(name, subkey)``; the subkey is the part after the first dot in the dotted
    JSON form, kept as written (JSON keys use underscores)."""
    if token.startswith("--"):
        head, _, sub = token[2:].partition(".")
        return "--" + head.replace("_", "-"), sub
    if token in SHORT_ALIASES:
        return SHORT_ALIASES[token], ""
    return token, ""


def parse_engine_args(tokens: Sequence[str], *, positional_model: bool) -> EngineCommand:
    """Read flags from the tokens that follow the engine entry point."""
    cmd = EngineCommand(entrypoint="", args=list(tokens))
    i = 0
    n = len(tokens)
    while i < n:
        tok = tokens[i]
        is_flag = tok.startswith("-") and tok != "-" and not _NUMBER.match(tok)
        if not is_flag:
            if positional_model and cmd.positional_model is None:
                cmd.positional_model = tok
            i += 1
            continue
        written = tok
        inline: str | None = None
        if "=" in tok:
            tok, inline = tok.split("=", 1)
        elif tok.startswith("-O") and len(tok) > 2 and not tok.startswith("--"):
            tok, inline = "-O", tok[2:]  # -O3 is --compilation-config 3
        name, subkey = normalize_flag(tok)
        values: list[str] = []
        if inline is not None:
            values.append(inline)
            i += 1
        elif name in BOOLEAN_FLAGS or name.startswith("--no-"):
            i += 1
        else:
            i += 1
            while i < n and not (
                tokens[i].startswith("-") and tokens[i] != "-" and not _NUMBER.match(tokens[i])
            ):
                values.append(tokens[i])
                i += 1
                if name not in MULTI_VALUE_FLAGS:
                    break
        cmd.flags.append(Flag(name, tuple(values), written, len(cmd.flags), subkey))
    return cmd


def _shell_script(argv: Sequence[str]) -> str | None:
    """The script of ``sh -c SCRIPT`` (also ``-ec``, ``-lc``, ``-x -c``), else None."""
    if not argv or posixpath.basename(argv[0]) not in SHELLS:
        return None
    for i, tok in enumerate(argv[1:], start=1):
        if tok.startswith("-") and not tok.startswith("--") and "c" in tok[1:]:
            return argv[i + 1] if i + 1 < len(argv) else None
        if not tok.startswith("-"):
            return None
    return None


def split_shell(script: str) -> list[list[str]] | None:
    """Simple commands of a shell script, as word lists; None if it cannot be tokenized.

    Redirections are dropped (``2>&1``, ``> log``); separators are ``; && || | & ( )`` and
    newlines.  ``$VAR`` is left as written: lint reads the script, it does not run it."""
    text = script.replace("\\\r\n", " ").replace("\\\n", " ")
    text = _FD_REDIRECT.sub("", text)
    lex = shlex.shlex(text, posix=True, punctuation_chars=";&|()<>\n")
    lex.whitespace = " \t\r"
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        tokens = list(lex)
    except ValueError:
        return None
    commands: list[list[str]] = []
    current: list[str] = []
    skip_next = False
    for tok in tokens:
        if skip_next:
            skip_next = False
            continue
        if tok and set(tok) <= _PUNCTUATION:
            if "<" in tok or ">" in tok:
                skip_next = True  # a redirection and its target
                continue
            if current:
                commands.append(current)
            current = []
            continue
        current.append(tok)
    if current:
        commands.append(current)
    return commands


def _find_invocation(words: Sequence[str]) -> tuple[str, list[str], bool] | None:
    """``(entrypoint, engine args, model-is-positional)`` if ``words`` runs the engine."""
    for i, w in enumerate(words):
        base = posixpath.basename(w)
        if base == "vllm" and i + 1 < len(words) and words[i + 1] == "serve":
            return "vllm serve", list(words[i + 2 :]), True
        if w == "-m" and i + 1 < len(words) and words[i + 1] in ENGINE_MODULES:
            module = words[i + 1]
            rest = list(words[i + 2 :])
            if module == "vllm.entrypoints.cli.main":
                if rest[:1] != ["serve"]:
                    continue
                return f"python -m {module} serve", rest[1:], True
            return f"python -m {module}", rest, False
    return None


def _looks_like_engine_image(image: str | None) -> bool:
    if not image:
        return False
    repo = image.split("@", 1)[0].rsplit(":", 1)[0] if "/" in image else image
    return "vllm" in repo.lower().rsplit("/", 1)[-1]


def parse_argv(argv: Sequence[str]) -> EngineCommand | None:
    """The engine command inside a full argv (a direct invocation or a shell script)."""
    script = _shell_script(argv)
    if script is not None:
        commands = split_shell(script)
        for words in commands or []:
            found = _find_invocation(words)
            if found:
                entry, rest, positional = found
                cmd = parse_engine_args(rest, positional_model=positional)
                cmd.entrypoint = entry
                cmd.via_shell = True
                return cmd
        return None
    found = _find_invocation(argv)
    if found:
        entry, rest, positional = found
        cmd = parse_engine_args(rest, positional_model=positional)
        cmd.entrypoint = entry
        return cmd
    return None


def _word(item: Any) -> str:
    """One argv word.  An unquoted ``{"a": 1}`` in YAML arrives as a mapping (which the API
    server rejects; lint reports it separately); read it as the JSON it was meant to be."""
    if isinstance(item, dict | list):
        return json.dumps(item)
    return str(item)


def parse_container(container: Mapping[str, Any]) -> EngineCommand | None:
    """The engine command of a Kubernetes container (``command`` + ``args``), or None.

    With no ``command``, the image's entrypoint runs: for vLLM images that is the engine
    (``vllm serve`` in current images, the api_server module in older ones), so ``args``
    are engine arguments."""
    command = container.get("command")
    args = container.get("args")
    cmd_list = [_word(x) for x in command] if isinstance(command, list) else []
    arg_list = [_word(x) for x in args] if isinstance(args, list) else []
    if cmd_list:
        return parse_argv(cmd_list + arg_list)
    found = parse_argv(arg_list) if arg_list else None
    if found:
        return found
    image = container.get("image")
    if arg_list and _looks_like_engine_image(image if isinstance(image, str) else None):
        cmd = parse_engine_args(arg_list, positional_model=False)
        cmd.entrypoint = "image entrypoint"
        return cmd
    return None


__all__ = [
    "EngineCommand",
    "Flag",
    "normalize_flag",
    "parse_argv",
    "parse_container",
    "parse_engine_args",
    "split_shell",
]
