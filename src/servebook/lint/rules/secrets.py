"""SB114: secrets written in clear in a manifest (flags and environment variables)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from servebook import redact
from servebook.engines.cmdline import _shell_script as shell_script
from servebook.engines.cmdline import _word as cmdline_word
from servebook.engines.cmdline import split_shell
from servebook.findings import Finding, Severity, register
from servebook.lint.loader import Document
from servebook.lint.rules.objects import finding_at, pod_specs
from servebook.lint.rules.registry import DOCUMENT_RULES

# A reference to a value kept elsewhere, not a value: Kubernetes' $(VAR), the shell's
# ${VAR} and $VAR, a <placeholder> (SB101's business), and what redaction left.
_SECRET_REFERENCE = re.compile(r"\$\(\w+\)|\$\{[^}]+\}|\$\w+|<[^<>]+>")


def _literal(value: str) -> bool:
    v = value.strip().strip("'\"")
    return bool(v) and not _SECRET_REFERENCE.fullmatch(v)


def _command_lines(container: Mapping[str, Any]) -> list[list[str]]:
    """The container's command and args as word lists: one, or each simple command of a
    ``sh -c`` script."""
    words = [
        cmdline_word(x)
        for key in ("command", "args")
        if isinstance(container.get(key), list)
        for x in container[key]
    ]
    script = shell_script(words)
    if script is not None:
        return split_shell(script) or []
    return [words]


def _secret_flags(words: Sequence[str]) -> Iterator[list[str]]:
    """Each secret flag given a literal value, as its words (``--api-key VALUE`` or
    ``--api-key=VALUE``)."""
    for i, w in enumerate(words):
        if not w.startswith("-") or len(w) < 2:
            continue
        name, eq, value = w.partition("=")
        if not redact.is_secret_name(name):
            continue
        if eq:
            if _literal(value):
                yield [w]
        elif i + 1 < len(words):
            nxt = words[i + 1]
            if not (nxt.startswith("-") and len(nxt) > 1) and _literal(nxt):
                yield [w, nxt]


SECRET_IN_CLEAR = register(
    "SB114",
    "Secret written in clear in a manifest",
    "A container flag whose name says it is secret (`--api-key`, `--hf-token`, anything "
    "ending in token, key, secret or password) given a literal value, or an environment "
    "variable of such a name with a literal `value:`, puts the secret in the manifest: in "
    "git, in every render and review, in `kubectl get -o yaml` for anyone who may read the "
    "object, and on the engine's command line, where `ps` on the node shows it. A reference "
    "(`$(VAR)`, `${VAR}`, `$VAR`, a `<placeholder>`) is not a secret and is not flagged.",
    "Keep the value in a Secret and reference it: `env: [{name: VLLM_API_KEY, valueFrom: "
    "{secretKeyRef: {name: NAME, key: api-key}}}]` (vLLM reads VLLM_API_KEY itself, so "
    "drop `--api-key`; servebook render: the api_key_secret parameter), or for another "
    "flag pass `$(VAR)` with VAR from a secretKeyRef.",
)


@DOCUMENT_RULES.add(SECRET_IN_CLEAR)
def check_secrets_in_clear(doc: Document) -> list[Finding]:
    """Secret flags with literal values, and secret-named env vars with a literal value."""
    findings: list[Finding] = []
    for pod in pod_specs(doc):
        for cpath, container in pod.containers():
            cname = container.get("name", "?")
            for words in _command_lines(container):
                for flag in _secret_flags(words):
                    shown = " ".join(redact.argv(flag)[0])
                    findings.append(
                        finding_at(
                            SECRET_IN_CLEAR,
                            Severity.FAIL,
                            doc,
                            cpath,
                            f"container {cname} is given {shown} with the secret written in "
                            "the manifest: keep it in a Secret (vLLM's API key: VLLM_API_KEY "
                            "from a secretKeyRef, no --api-key).",
                            extra=pod.part,
                            evidence={"flag": flag[0].partition("=")[0]},
                        )
                    )
            env = container.get("env")
            for i, item in enumerate(env if isinstance(env, list) else []):
                if not isinstance(item, dict):
                    continue
                name, value = item.get("name"), item.get("value")
                if not (isinstance(name, str) and redact.is_secret_name(name)):
                    continue
                if isinstance(value, str | int | float) and _literal(str(value)):
                    findings.append(
                        finding_at(
                            SECRET_IN_CLEAR,
                            Severity.FAIL,
                            doc,
                            (*cpath, "env", i),
                            f"container {cname} sets {name}={redact.REDACTED} with the value "
                            "written in the manifest: take it from a Secret (valueFrom."
                            "secretKeyRef) instead of value.",
                            extra=pod.part,
                            evidence={"env": name},
                        )
                    )
    return findings
