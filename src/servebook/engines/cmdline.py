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
    call = shell_call(argv)
    return call[0] if call else None


def shell_call(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """``(SCRIPT, positional parameters)`` of ``sh -c SCRIPT [NAME [ARG ...]]``, else
    None; the parameters are what ``$@`` expands to."""
    if not argv or posixpath.basename(argv[0]) not in SHELLS:
        return None
    for i, tok in enumerate(argv[1:], start=1):
        if tok.startswith("-") and not tok.startswith("--") and "c" in tok[1:]:
            return (argv[i + 1], list(argv[i + 3 :])) if i + 1 < len(argv) else None
        if not tok.startswith("-"):
            return None
    return None


_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+)|(@))")


def expand_words(
    words: Sequence[str], env: Mapping[str, str], positional: Sequence[str] = ()
) -> list[str]:
    """Words of a script with ``$NAME``, ``${NAME}`` and ``$@`` expanded from ``env`` as a
    shell would: a word that is one expansion splits on whitespace (``exec vllm serve M
    ${VLLM_ADDITIONAL_ARGS}``), one inside other text is substituted in place, an unset
    name expands to nothing.  Quotes inside a value stay literal, as in a shell."""
    out: list[str] = []
    for w in words:
        whole = _VAR.fullmatch(w)
        if whole:
            if whole.group(3):
                out += list(positional)
            else:
                out += env.get(whole.group(1) or whole.group(2), "").split()
            continue
        if "$" not in w:
            out.append(w)
            continue
        out.append(
            _VAR.sub(
                lambda m: (
                    " ".join(positional) if m.group(3) else env.get(m.group(1) or m.group(2), "")
                ),
                w,
            )
        )
    return out


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


def _with_evals(commands: list[list[str]]) -> list[list[str]]:
    """The commands, each ``eval WORDS...`` followed by the commands its words make once
    joined (the shell's own reading of eval): KServe's LLMInferenceServiceConfig templates
    start the engine as ``eval "exec vllm serve ... ${KV_TRANSFER_ARGS} $@"``."""
    out: list[list[str]] = []
    for words in commands:
        out.append(words)
        if len(words) > 1 and words[0] == "eval":
            out += _with_evals(split_shell(" ".join(words[1:])) or [])
    return out


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


def parse_argv(argv: Sequence[str], env: Mapping[str, str] | None = None) -> EngineCommand | None:
    """The engine command inside a full argv (a direct invocation or a shell script).

    With ``env`` (the process's or container's environment), a script's ``$NAME``,
    ``${NAME}`` and ``$@`` are expanded as the shell would (``expand_words``): KServe's
    ``exec vllm serve ... ${VLLM_ADDITIONAL_ARGS} $@`` reads its flags from the
    environment and the container's args.  Without it they stay as written."""
    shell = shell_call(argv)
    if shell is not None:
        script, params = shell
        commands = _with_evals(split_shell(script) or [])
        for words in commands:
            if env is not None:
                words = expand_words(words, env, params)
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
    if len(arg_list) > 1 and arg_list[0] == "-m":
        # `args: [-m, MODULE, ...]` on a Python entrypoint (Dynamo's runtime images): the
        # module decides; `-m dynamo.frontend` beside the worker is no engine.
        return parse_argv(["python", *arg_list])
    image = container.get("image")
    if arg_list and _looks_like_engine_image(image if isinstance(image, str) else None):
        cmd = parse_engine_args(arg_list, positional_model=False)
        cmd.entrypoint = "image entrypoint"
        return cmd
    return None


# Pre-JSON speculative flags (vLLM before the JSON config) and the key of the config each sets.
LEGACY_SPEC_FLAGS: Mapping[str, str] = {
    "--speculative-model": "model",
    "--num-speculative-tokens": "num_speculative_tokens",
    "--speculative-draft-tensor-parallel-size": "draft_tensor_parallel_size",
    "--ngram-prompt-lookup-max": "prompt_lookup_max",
    "--ngram-prompt-lookup-min": "prompt_lookup_min",
}


def speculative_config(cmd: EngineCommand) -> tuple[dict[str, Any] | None, str | None]:
    """The speculative config a command line sets, as one dict: the JSON flag (either
    spelling, dotted keys applied) plus the pre-JSON flags.  ``(None, None)``: none;
    ``(None, error)``: the JSON cannot be read (the engine refuses it at startup)."""
    config, err = cmd.json_value("--speculative-config")
    if err:
        return None, err
    legacy: dict[str, Any] = {}
    for flag, key in LEGACY_SPEC_FLAGS.items():
        v = cmd.value(flag)
        if v is not None:
            try:
                legacy[key] = json.loads(v)
            except json.JSONDecodeError:
                legacy[key] = v
    if config is None and not legacy:
        return None, None
    merged = dict(config or {})
    merged.update(legacy)
    return merged, None


def kv_transfer_config(cmd: EngineCommand) -> tuple[dict[str, Any] | None, str | None]:
    """The KV-transfer config (``--kv-transfer-config`` or ``--kv_transfer_config``, JSON
    or dotted), as ``json_value`` reads it."""
    return cmd.json_value("--kv-transfer-config")


#: The kv_role each side of a PD pair may load: prefill produces the KV cache, decode
#: consumes it; kv_both does either.  Lint (SB106) and verify (SB310) judge by this rule.
KV_SIDE_ROLES = {"prefill": ("kv_producer", "kv_both"), "decode": ("kv_consumer", "kv_both")}


def kv_role_problem(side: str, cfg: Mapping[str, Any] | None) -> str | None:
    """Why an engine on ``side`` (prefill or decode) with this KV-transfer config hands
    nothing over because of its kv_role, or None (no config: ``kv_connector_problems``)."""
    role = (cfg or {}).get("kv_role")
    ok = KV_SIDE_ROLES[side]
    if isinstance(role, str) and role not in ok:
        return f"its kv_role is {role}; the {side} side must use {' or '.join(ok)}"
    return None


@dataclass(frozen=True)
class KvProblem:
    """A reason no KV cache is handed over between PD engines, and the engines it is about."""

    text: str
    subjects: tuple[str, ...]


def kv_connector_problems(configs: Mapping[str, Mapping[str, Any] | None]) -> list[KvProblem]:
    """PD engines' KV-transfer configs (subject -> config, None without one): an engine
    loading no connector beside one that does, and engines loading different ones, hand no
    KV cache over."""
    loaded = {s: str((c or {}).get("kv_connector") or "") for s, c in configs.items()}
    without = tuple(s for s, c in loaded.items() if not c)  # no config, or none named in it
    names = sorted({c for c in loaded.values() if c})
    problems: list[KvProblem] = []
    # When none names one, the launcher may load a connector of its own (Dynamo's
    # dynamo.vllm loads NIXL unless told otherwise): not a problem of the command lines.
    if without and names:
        others = f" (the others load {', '.join(names)})" if names else ""
        problems.append(
            KvProblem(f"no --kv-transfer-config on {', '.join(without)}{others}", without)
        )
    if len(names) > 1:
        problems.append(
            KvProblem(
                "different connectors: " + ", ".join(f"{s} {c}" for s, c in loaded.items() if c),
                tuple(loaded),
            )
        )
    return problems


@dataclass(frozen=True)
class SpecComparison:
    """Two roles' speculative configs side by side: ``only`` names the role that has one
    when the other has none; ``differences`` lists the keys that differ; ``warnings`` what
    may differ but deserves a look (draft directories named differently)."""

    only: str | None
    differences: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    @property
    def same(self) -> bool:
        return self.only is None and not self.differences


def compare_speculative(
    a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, names: tuple[str, str]
) -> SpecComparison:
    """The one rule lint (SB105) and verify (SB308) judge speculation symmetry by: the
    configs must be identical, key order and formatting aside, except that the draft may
    sit at a different absolute path on each node (a warning when the directories'
    names differ); a draft named any other way (a hub id, a relative path) must match."""
    if a is None and b is None:
        return SpecComparison(None, ())
    if a is None or b is None:
        return SpecComparison(names[1] if a is None else names[0], ())
    a, b = dict(a), dict(b)
    warnings: list[str] = []
    am, bm = a.get("model"), b.get("model")
    if isinstance(am, str) and isinstance(bm, str) and am.startswith("/") and bm.startswith("/"):
        a.pop("model")
        b.pop("model")
        if posixpath.basename(am.rstrip("/")) != posixpath.basename(bm.rstrip("/")):
            warnings.append(
                f"draft model directories differ in name ({am} vs {bm}); make sure both "
                "hold the same draft weights (`servebook probe DIR --draft ...`)"
            )
    missing = "(absent)"
    p, q = names
    diff = [
        f"{k}: {p} {json.dumps(a.get(k, missing))}, {q} {json.dumps(b.get(k, missing))}"
        for k in sorted(set(a) | set(b))
        if a.get(k, missing) != b.get(k, missing)
    ]
    return SpecComparison(None, tuple(diff), tuple(warnings))


__all__ = [
    "LEGACY_SPEC_FLAGS",
    "EngineCommand",
    "Flag",
    "SpecComparison",
    "compare_speculative",
    "expand_words",
    "kv_transfer_config",
    "normalize_flag",
    "parse_argv",
    "parse_container",
    "parse_engine_args",
    "shell_call",
    "speculative_config",
    "split_shell",
]
