"""SB114: secrets written in clear in a manifest (flags, environment variables, chart
values), and secret variables written `$VAR`, which Kubernetes never expands."""

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
from servebook.lint.rules.objects import finding_at, keypath_str, pod_specs, walk
from servebook.lint.rules.placeholders import find_placeholders
from servebook.lint.rules.registry import DOCUMENT_RULES

# A reference to a value kept elsewhere, not a value: Kubernetes' $(VAR), the shell's
# ${VAR} and $VAR, a <placeholder> (SB101's business), and what redaction left.
_SECRET_REFERENCE = re.compile(r"\$\(\w+\)|\$\{[^}]+\}|\$\w+|<[^<>]+>")
# `$HF_TOKEN` (no braces, no parentheses): a shell variable, which Kubernetes passes on as
# the literal text; `${HF_TOKEN}` is SB101's (a placeholder).
_SHELL_VARIABLE = re.compile(r"\$[A-Za-z_]\w*")
# Words that make a secret-named key a reference to a Secret, not the secret itself:
# `secretName`, `secretKey`, `authSecretName`, `hfTokenSecretRef`, `tokenFile`.
_REFERENCE_WORDS = frozenset({"secret", "name", "ref", "file", "path", "dir"})


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
    "(`$(VAR)`, `${VAR}`, a `<placeholder>`) is not a secret and is not flagged. Two "
    "relatives are: a secret-named key of a Helm values file given a literal value "
    '(`vllmApiKey: "..."`), which the chart writes into the objects it renders; and '
    "`value: $HF_TOKEN` in an env entry: Kubernetes expands only `$(VAR)`, so the process "
    "gets the literal text, and the documented `envsubst < file | kubectl apply -f -` "
    "writes the real token into the object in clear.",
    "Keep the value in a Secret and reference it: `env: [{name: VLLM_API_KEY, valueFrom: "
    "{secretKeyRef: {name: NAME, key: api-key}}}]` (vLLM reads VLLM_API_KEY itself, so "
    "drop `--api-key`; servebook render: the api_key_secret parameter), or for another "
    "flag pass `$(VAR)` with VAR from a secretKeyRef.",
)


@DOCUMENT_RULES.add(SECRET_IN_CLEAR)
def check_secrets_in_clear(doc: Document) -> list[Finding]:
    """Secret flags with literal values, secret-named env vars with a literal or `$VAR`
    value, and secret-named keys of values files with a literal value."""
    findings: list[Finding] = list(_values_secrets(doc))
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
    findings.extend(_env_secrets(doc))
    return findings


def _env_secrets(doc: Document) -> Iterator[Finding]:
    """Secret-named env entries anywhere in an object (containers, a CR's pod override)
    with a literal value or a `$VAR` Kubernetes will not expand."""
    if not doc.is_kubernetes:
        return
    for keypath, node in walk(doc.data):
        if keypath[-1:] != ("env",) or not isinstance(node, list):
            continue
        for i, item in enumerate(node):
            if not isinstance(item, dict):
                continue
            name, value = item.get("name"), item.get("value")
            if not (isinstance(name, str) and redact.is_secret_name(name)):
                continue
            if not isinstance(value, str | int | float):
                continue
            text = str(value).strip().strip("'\"")
            if _SHELL_VARIABLE.fullmatch(text):
                message = (
                    f"{keypath_str(keypath)} sets {name}={text}: Kubernetes expands only "
                    f"$(VAR), so the process gets the literal text {text!r}; run through "
                    "envsubst, the real secret is written into the object in clear. Take it "
                    "from a Secret (valueFrom.secretKeyRef)."
                )
            elif _literal(text):
                message = (
                    f"{keypath_str(keypath)} sets {name}={redact.REDACTED} with the value "
                    "written in the manifest: take it from a Secret (valueFrom."
                    "secretKeyRef) instead of value."
                )
            else:
                continue
            yield finding_at(
                SECRET_IN_CLEAR,
                Severity.FAIL,
                doc,
                (*keypath, i),
                message,
                evidence={"env": name},
            )


def _key_words(name: str) -> set[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return {w.lower() for w in re.split(r"[^A-Za-z0-9]+", spaced) if w}


def _values_secrets(doc: Document) -> Iterator[Finding]:
    """Secret-named keys of a values file (not a Kubernetes object, not a servebook recipe)
    given a literal value: `vllmApiKey: "abc..."`, `hf_token: "hf_..."`."""
    if doc.is_kubernetes or not isinstance(doc.data, dict) or "parameters" in doc.data:
        return
    for keypath, node in walk(doc.data):
        if isinstance(node, list) and all(isinstance(x, str) for x in node):
            # `extraArgs: ["--api-key", "sk-..."]`: engine flags the chart passes on.
            for flag in _secret_flags(node):
                yield finding_at(
                    SECRET_IN_CLEAR,
                    Severity.FAIL,
                    doc,
                    keypath,
                    f"{keypath_str(keypath)} passes {' '.join(redact.argv(flag)[0])} with the "
                    "secret written into the values; the chart renders it onto the engine's "
                    "command line: take it from a Secret instead.",
                    evidence={"flag": flag[0].partition("=")[0]},
                )
        if not isinstance(node, dict) or any(k in node for k in ("secretName", "secretKeyRef")):
            continue
        for key, value in node.items():
            words = _key_words(str(key))
            # A bare `key:` is a lookup key (tolerations, `{name: s, key: k}` references):
            # ``redact.is_secret_name`` says so.
            if not redact.is_secret_name(str(key)) or words & _REFERENCE_WORDS:
                continue
            if not isinstance(value, str) or len(value.strip()) < 6 or find_placeholders(value):
                continue
            if "{{" in value or "${" in value:
                continue  # an expression of whatever reads the file (CI, a template)
            if not _literal(value) or any(c.isspace() for c in value.strip()):
                continue
            yield finding_at(
                SECRET_IN_CLEAR,
                Severity.FAIL,
                doc,
                (*keypath, str(key)),
                f"{keypath_str((*keypath, str(key)))} = {redact.REDACTED}: a secret written "
                "into chart values is rendered into the objects in clear (and sits in git); "
                "point the chart at an existing Secret instead (production-stack: "
                "vllmApiKey: {secretName: ..., secretKey: ...}).",
                evidence={"key": keypath_str((*keypath, str(key)))},
            )
