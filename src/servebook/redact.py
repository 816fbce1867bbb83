"""Redaction: no secret in anything servebook writes or prints.

Results files and reports are made to be shared, ``status --json`` is pasted into issues,
and error messages quote command lines, URLs and log lines.  Every one of them passes
through this module first.  What counts as a secret:

* a command-line flag whose name says so (``--api-key``, ``--hf-token``, any flag whose
  last word is token, key, secret, password...), in ``--flag value`` and ``--flag=value``
  forms: the value is replaced, the flag kept, so a reader still sees a key was given;
* credentials in a URL (``https://user:pass@host``) and secret query values
  (``?token=...``, ``&api_key=...``, ``&sig=...``);
* an environment variable whose name says so (``HF_TOKEN``, ``VLLM_API_KEY``), and in
  free text ``NAME=value``, ``"api_key": "..."`` and ``Authorization: Bearer ...``;
* any value servebook itself knows to be secret (an API key it was given or read from
  the environment: ``remember``), wherever it appears, whatever the shape around it.

Names are judged by their words (``--max-num-batched-tokens`` and ``TOKENIZERS_PARALLELISM``
are not secrets; ``--api-key-validation-urls`` is URLs, not a key), so a record keeps every
setting that is not secret.  Each function returns what it redacted, as notes naming
where and what (``roles[decode].command --api-key``), never the value: a results file
carries those notes as ``provenance.redacted``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "<redacted>"

# A name is secret when its last word is one of these (``--api-key``, ``HF_TOKEN``,
# ``access_token``, ``X-Amz-Signature``) ...
_LAST_WORDS = frozenset(
    {
        "token",
        "key",
        "apikey",
        "secret",
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "bearer",
        "signature",
        "sig",
        "cookie",
    }
)
# ... or when any of its words is one of these (``AWS_SECRET_ACCESS_KEY_ID``).
_ANY_WORDS = frozenset(
    {"secret", "password", "passwd", "passphrase", "credential", "credentials", "apikey"}
)
# Known secret values shorter than this are not searched for in text (too many false hits).
_MIN_KNOWN = 4

_known: set[str] = set()

# In prose a flag or a name is often followed by a word, not a value ("pass --api-key or
# set OPENAI_API_KEY", "requires an API key: pass it"): unquoted, these are kept.
_PROSE_WORDS = """a an and are as at be by for from given if in is it missing must not of on
or pass required set the then to was when with"""
_PROSE = frozenset(_PROSE_WORDS.split())


def remember(*values: str | None) -> None:
    """Values known to be secret (an API key servebook was given): from now on they are
    replaced wherever they appear in text this module redacts."""
    for v in values:
        if v and len(v) >= _MIN_KNOWN:
            _known.add(v)


def forget_all() -> None:
    """Forget every remembered value (tests)."""
    _known.clear()


def _words(name: str) -> list[str]:
    # camelCase and snake/kebab/SCREAMING case alike: hfToken, hf_token, HF-TOKEN.
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w.lower() for w in re.split(r"[^A-Za-z0-9]+", spaced) if w]


def is_secret_name(name: str) -> bool:
    """Whether a flag, variable, key or query parameter of this name holds a secret."""
    words = _words(name)
    if not words:
        return False
    return words[-1] in _LAST_WORDS or any(w in _ANY_WORDS for w in words)


# --- text ------------------------------------------------------------------------------------

_URL_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^/\s@?#'\"]+)@")
_QUERY = re.compile(r"([?&;])([A-Za-z0-9_.\-\[\]]+)=([^&;#\s'\"]*)")
# --flag value, --flag=value, and the flag and value as neighbours in a printed list
# ('--api-key', 'x') or JSON array ("--api-key", "x").
_FLAG = re.compile(
    r"(?P<flag>(?<![\w-])--?[A-Za-z][A-Za-z0-9_.-]*)"
    r"(?P<sep>=|['\"]?\s*,\s*['\"]|['\"]?\s+['\"]?)"
    r"(?P<val>[^\s'\",\]\)}]+)"
)
_ENV = re.compile(r"(?<![\w-])(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<val>[^\s'\",;]+)")
# "api_key": "x", 'hf_token': ['x'], api_key: x (YAML)
_KEYED = re.compile(
    r"(?P<q>['\"]?)(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P=q)\s*:\s*"
    r"(?P<open>\[?\s*)(?P<vq>['\"]?)(?P<val>[^\s'\",\]}]+)(?P=vq)"
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+([A-Za-z0-9._~+/=-]{4,})")


def _redact_url_parts(s: str, why: list[str]) -> str:
    def userinfo(m: re.Match[str]) -> str:
        if m.group(2) == REDACTED:
            return m.group(0)
        why.append("credentials in a URL")
        return f"{m.group(1)}{REDACTED}@"

    def query(m: re.Match[str]) -> str:
        if not m.group(3) or m.group(3) == REDACTED or not is_secret_name(m.group(2)):
            return m.group(0)
        why.append(f"URL query {m.group(2)}")
        return f"{m.group(1)}{m.group(2)}={REDACTED}"

    s = _URL_USERINFO.sub(userinfo, s)
    return _QUERY.sub(query, s)


def _text(s: str) -> tuple[str, list[str]]:
    why: list[str] = []
    if not s:
        return s, why
    for v in sorted(_known, key=len, reverse=True):
        if v in s:
            s = s.replace(v, REDACTED)
            why.append("a known secret value")
    s = _redact_url_parts(s, why)

    def flag(m: re.Match[str]) -> str:
        val = m.group("val")
        if val == REDACTED or val.startswith("-") or not is_secret_name(m.group("flag")):
            return m.group(0)
        if m.group("sep").isspace() and val.lower() in _PROSE:
            return m.group(0)
        why.append(m.group("flag"))
        return f"{m.group('flag')}{m.group('sep')}{REDACTED}"

    def env(m: re.Match[str]) -> str:
        if m.group("val").startswith(REDACTED) or not is_secret_name(m.group("name")):
            return m.group(0)
        why.append(m.group("name"))
        return f"{m.group('name')}={REDACTED}"

    def keyed(m: re.Match[str]) -> str:
        val, name = m.group("val"), m.group("name")
        if val in (REDACTED, "Bearer", "Basic") or not is_secret_name(name):
            return m.group(0)
        # Unquoted, only a name that reads as an identifier (api_key: x, HF-TOKEN: x), and
        # not a word of prose after it.
        if not m.group("q") and (not re.search(r"[_.-]", name) or val.lower() in _PROSE):
            return m.group(0)
        why.append(m.group("name"))
        q, vq = m.group("q"), m.group("vq")
        return f"{q}{m.group('name')}{q}: {m.group('open')}{vq}{REDACTED}{vq}"

    def bearer(m: re.Match[str]) -> str:
        if m.group(2) == REDACTED:
            return m.group(0)
        why.append(f"{m.group(1)} credentials")
        return f"{m.group(1)} {REDACTED}"

    s = _BEARER.sub(bearer, s)
    s = _FLAG.sub(flag, s)
    s = _ENV.sub(env, s)
    s = _KEYED.sub(keyed, s)
    return s, why


def text(s: str) -> str:
    """Free text (a log line, an error message, a printed command) with secrets replaced."""
    return _text(s)[0]


def url(u: str) -> str:
    """A URL without credentials or secret query values."""
    return text(u)


# --- structured ------------------------------------------------------------------------------


def argv(args: Iterable[str]) -> tuple[list[str], list[str]]:
    """(a command line with secret flag values replaced, the flags redacted)."""
    items = list(args)
    out: list[str] = []
    notes: list[str] = []
    secret_next = False
    for i, a in enumerate(items):
        if secret_next:
            secret_next = False
            if a != REDACTED:
                out.append(REDACTED)
                notes.append(items[i - 1])
                continue
        if a.startswith("-") and len(a) > 1:
            name, eq, value = a.partition("=")
            if is_secret_name(name):
                if eq:
                    if value != REDACTED:
                        notes.append(name)
                    out.append(f"{name}={REDACTED}")
                    continue
                nxt = items[i + 1] if i + 1 < len(items) else None
                secret_next = nxt is not None and not (nxt.startswith("-") and len(nxt) > 1)
                out.append(a)
                continue
        new, why = _text(a)
        out.append(new)
        notes += why
    return out, _unique(notes)


def env(values: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(an environment with secret values replaced, sorted by name; the names redacted)."""
    out: dict[str, str] = {}
    notes: list[str] = []
    for k, v in sorted(values.items()):
        if is_secret_name(k) and v:
            out[k] = REDACTED
            notes.append(k)
        else:
            out[k], why = _text(v)
            notes += [f"{k} ({w})" for w in why]
    return out, notes


def scrub(obj: Any, where: str = "") -> tuple[Any, list[str]]:
    """Any JSON-shaped value with every secret replaced, and notes ``"WHERE WHAT"``
    (``roles[decode].command --api-key``, ``roles[mixed].env HF_TOKEN``, ``target.url
    credentials in a URL``).  Dict entries whose key is a secret name lose their value;
    lists of strings are read as command lines; strings as text.  Items of a list of
    dicts with a ``name`` are addressed by it (``roles[decode]``)."""
    notes: list[str] = []

    def note(path: str, what: str) -> None:
        notes.append(f"{path} {what}" if path else what)

    def walk(o: Any, path: str) -> Any:
        if isinstance(o, Mapping):
            new: dict[Any, Any] = {}
            for k, v in o.items():
                child = f"{path}.{k}" if path else str(k)
                if (
                    isinstance(k, str)
                    and is_secret_name(k)
                    and isinstance(v, str | int | float | list)
                    and not isinstance(v, bool)
                    and v not in ("", [], REDACTED, [REDACTED])
                ):
                    new[k] = REDACTED if not isinstance(v, list) else [REDACTED]
                    note(path, str(k))
                else:
                    new[k] = walk(v, child)
            return new
        if isinstance(o, list | tuple):
            if o and all(isinstance(x, str) for x in o):
                red, what = argv(o)
                for w in what:
                    note(path, w)
                return red
            out = []
            for i, x in enumerate(o):
                label = x.get("name") if isinstance(x, Mapping) else None
                out.append(walk(x, f"{path}[{label if isinstance(label, str) else i}]"))
            return out
        if isinstance(o, str):
            new_s, why = _text(o)
            for w in why:
                note(path, w)
            return new_s
        return o

    return walk(obj, where), _unique(notes)


def provenance(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A results file's provenance (as a plain dict) with secrets replaced where they may
    be (the target, every role's command line, environment and URL), and ``redacted``
    listing where and what was, after what an earlier pass listed."""
    out = dict(doc)
    out["target"], on_target = scrub(doc.get("target") or {}, "target")
    out["roles"], on_roles = scrub(list(doc.get("roles") or []), "roles")
    out["redacted"] = _unique([*(doc.get("redacted") or []), *on_target, *on_roles])
    return out


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


__all__ = [
    "REDACTED",
    "argv",
    "env",
    "forget_all",
    "is_secret_name",
    "provenance",
    "remember",
    "scrub",
    "text",
    "url",
]
