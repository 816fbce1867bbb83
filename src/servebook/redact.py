"""Redaction: no secret in anything servebook writes or prints.

Results files and reports are made to be shared, ``status --json`` is pasted into issues,
and error messages quote command lines, URLs and log lines.  Every one of them passes
through this module first.  What counts as a secret:

* a command-line flag whose name says so (``--api-key``, ``--hf-token``, any flag whose
  last word is token, key, secret, password, pass...), in ``--flag value`` and
  ``--flag=value`` forms, a quoted value whole and a value starting with ``-`` too: the
  value is replaced, the flag kept, so a reader still sees a key was given;
* credentials in a URL (``https://user:pass@host``, to the last ``@``) and secret query
  values (``?token=...``, ``&api_key=...``, ``&sig=...``);
* an environment variable whose name says so (``HF_TOKEN``, ``VLLM_API_KEY``,
  ``DB_PASS``, ``OPENAI_API_KEYS``), and in free text ``NAME=value``, ``api-key=value``,
  ``"api_key": "..."``, a Kubernetes ``{name: HF_TOKEN, value: ...}`` and an
  ``Authorization:`` header of any scheme;
* any value servebook itself knows to be secret (an API key it was given or read from
  the environment: ``remember``), wherever it appears, whatever the shape around it.

Names are judged by their words (``--max-num-batched-tokens`` and ``TOKENIZERS_PARALLELISM``
are not secrets; ``--api-key-validation-urls`` is URLs, not a key; ``secretName`` and
``api_key_secret`` say where a secret is kept), and a value that only refers to a secret
(``$(VLLM_API_KEY)``, ``<redacted>``, a usage line's ``NAME``) is kept, so a record keeps
every setting that is not secret and a hint stays readable.  Redacting twice changes
nothing.  Each function returns what it redacted, as notes naming
where and what (``roles[decode].command --api-key``), never the value: a results file
carries those notes as ``provenance.redacted``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

REDACTED = "<redacted>"

# A name is secret when its last word is one of these (``--api-key``, ``HF_TOKEN``,
# ``access_token``, ``X-Amz-Signature``, ``DB_PASS``) ...
_LAST_WORDS = frozenset(
    {
        "token",
        "key",
        "apikey",
        "secret",
        "password",
        "passwords",
        "passwd",
        "pwd",
        "pass",
        "pw",
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
# ... or when any of its words is one of these (``AWS_SECRET_ACCESS_KEY_ID``) ...
_ANY_WORDS = frozenset(
    {"secret", "password", "passwd", "passphrase", "credential", "credentials", "apikey"}
)
# ... or a plural after a word that makes it one (``OPENAI_API_KEYS``, ``--api-keys``,
# ``ACCESS_TOKENS``; not ``--max-num-batched-tokens`` or ``sort_keys``).
_PLURALS = frozenset({"keys", "tokens"})
_PLURAL_QUALIFIERS = frozenset(
    {"api", "access", "auth", "bearer", "private", "refresh", "secret", "session"}
)
# Not a secret but where one is kept: a name ending in one of these (``secretName``,
# ``tokenFile``, ``hfTokenSecretRef``), and a secret named for what it holds
# (``api_key_secret``: the Kubernetes Secret holding the key).  A bare ``key`` is a lookup
# key (a toleration's, a secretKeyRef's, ``KEY=VALUE``), except in a URL's query
# (``?key=``: an API key, ``_URL_KEYS``).
_REFERENCE_LAST = frozenset({"name", "names", "ref", "file", "path", "dir"})
_HELD = frozenset({"key", "token", "password", "credentials", "apikey"})
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
        # Not one that is part of what redaction writes (it would redact its own mark).
        if v and len(v) >= _MIN_KNOWN and v not in REDACTED:
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
    if not words or words == ["key"] or words[-1] in _REFERENCE_LAST:
        return False
    if len(words) > 1 and words[-1] == "secret" and words[-2] in _HELD:
        return False
    if words[-1] in _PLURALS:
        return len(words) > 1 and words[-2] in _PLURAL_QUALIFIERS
    return words[-1] in _LAST_WORDS or any(w in _ANY_WORDS for w in words)


# A value that names where a secret is, or stands for one, is no secret: ``$(VAR)``,
# ``${VAR}``, ``$VAR`` (upper case: a password may start with ``$``), a ``<placeholder>``
# (``<redacted>`` itself), a mask (``***``) and the metavariables of a usage line
# (``--set api_key_secret=NAME``, ``KEY=VALUE``, ``NAME/KEY``).
_REFERENCE = re.compile(
    r"\$\([A-Z_][A-Z0-9_]*\)|\$\{[^}]*\}|\$[A-Z_][A-Z0-9_]*|<[^<>]*>|\*+|\.\.\.|"
    r"(?:NAME|VALUE|KEY|TOKEN|SECRET|PASSWORD)(?:/(?:NAME|KEY|VALUE))?"
)


def is_reference(value: str) -> bool:
    """Whether a secret-named setting's value only refers to or stands for a secret."""
    return bool(_REFERENCE.fullmatch(value.strip()))


# --- text ------------------------------------------------------------------------------------

# The user information of a URL runs to the last '@' of its authority: a password may hold
# one (``http://admin:p@ss@host``).
_URL_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^/\s?#'\"]+)@")
_QUERY = re.compile(r"([?&;])([A-Za-z0-9_.\-\[\]]+)=([^&;#\s'\"]*)")
# Query parameters that are API keys though their name alone would not say so.
_URL_KEYS = frozenset({"key"})
# A value: quoted (spaces and all, to its closing quote), or a run of non-space characters
# (a stray opening quote kept).  NAME is the group prefix.
_QUOTED = r"(?P<{n}q>['\"])(?P<{n}qval>(?:(?!(?P={n}q))[^\n])*)(?P={n}q)"
_BARE = r"(?P<{n}oq>['\"]?)(?P<{n}val>{chars})"


def _value(prefix: str, chars: str) -> str:
    return f"(?:{_QUOTED.format(n=prefix)}|{_BARE.format(n=prefix, chars=chars)})"


# --flag value, --flag=value, and the flag and value as neighbours in a printed list
# ('--api-key', 'x') or JSON array ("--api-key", "x").  A value may start with '-', but a
# long flag after a flag is the next flag, not its value (``--api-key --port 8000``).
_FLAG = re.compile(
    r"(?P<flag>(?<![\w-])--?[A-Za-z][A-Za-z0-9_.-]*)"
    r"(?P<sep>=|['\"]?\s*,\s*(?=['\"])|['\"]?\s+)(?!['\"]?--)" + _value("", r"[^\s'\",\]\)}]+")
)
# NAME=value, name-with-dashes=value
_ENV = re.compile(r"(?<![\w.-])(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)=" + _value("", r"[^\s'\",;]+"))
# "api_key": "x", 'hf_token': ['x'], api_key: x (YAML)
_KEYED = re.compile(
    r"(?P<nq>['\"]?)(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P=nq)\s*:\s*(?P<open>\[?\s*)"
    + _value("", r"[^\s'\",\]}]+")
)
# An HTTP credentials header, whatever its scheme: ``Authorization: Token abc``.
_AUTH_HEADER = re.compile(
    r"(?i)(?P<head>\b(?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?)"
    r"(?P<scheme>(?:bearer|basic|token|digest|negotiate|apikey|key)\s+)?"
    r"(?P<val>[^\s'\",;]+)"
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+([A-Za-z0-9._~+/=-]{4,})")


class _Value:
    """The value a pattern found (``_value``): its text, and how to write it back."""

    def __init__(self, m: re.Match[str]) -> None:
        self.quote = m.group("q") or ""
        self.text = m.group("qval") if self.quote else m.group("val")
        self.open_quote = "" if self.quote else m.group("oq")

    def kept(self) -> bool:
        """No secret to replace: empty, a reference or placeholder, or redacted already."""
        return not self.text.strip() or is_reference(self.text) or REDACTED in self.text

    def replaced(self) -> str:
        return f"{self.quote or self.open_quote}{REDACTED}{self.quote}"


def _redact_url_parts(s: str, why: list[str]) -> str:
    def userinfo(m: re.Match[str]) -> str:
        if is_reference(m.group(2)):
            return m.group(0)
        why.append("credentials in a URL")
        return f"{m.group(1)}{REDACTED}@"

    def query(m: re.Match[str]) -> str:
        name = m.group(2)
        secret = is_secret_name(name) or name.lower() in _URL_KEYS
        if not m.group(3) or is_reference(m.group(3)) or not secret:
            return m.group(0)
        why.append(f"URL query {m.group(2)}")
        return f"{m.group(1)}{m.group(2)}={REDACTED}"

    s = _URL_USERINFO.sub(userinfo, s)
    return _QUERY.sub(query, s)


def _prose(word: str) -> bool:
    """A word of prose where a value would be ("pass --api-key or set ...", "Remove
    --api-key (or the secret)")."""
    return word.lower() in _PROSE or word.startswith("(")


def _text(s: str) -> tuple[str, list[str]]:
    why: list[str] = []
    if not s:
        return s, why
    for v in sorted(_known, key=len, reverse=True):
        if v in s:
            s = s.replace(v, REDACTED)
            why.append("a known secret value")
    s = _redact_url_parts(s, why)
    for pattern, replace in _SHAPES:
        s = pattern.sub(partial(replace, why), s)
    return s, why


# Each replacement below gets ``why`` (what was redacted, appended to) and one match, and
# returns the match's text with its secret replaced, or unchanged where it is none.


def _header(why: list[str], m: re.Match[str]) -> str:
    val = m.group("val")
    if is_reference(val) or REDACTED in val or (not m.group("scheme") and _prose(val)):
        return m.group(0)
    why.append("Authorization credentials")
    return f"{m.group('head')}{m.group('scheme') or ''}{REDACTED}"


def _bearer(why: list[str], m: re.Match[str]) -> str:
    if is_reference(m.group(2)):
        return m.group(0)
    why.append(f"{m.group(1)} credentials")
    return f"{m.group(1)} {REDACTED}"


def _flag(why: list[str], m: re.Match[str]) -> str:
    v = _Value(m)
    if v.kept() or not is_secret_name(m.group("flag")):
        return m.group(0)
    if m.group("sep").isspace() and not v.quote and _prose(v.text):
        return m.group(0)
    why.append(m.group("flag"))
    return f"{m.group('flag')}{m.group('sep')}{v.replaced()}"


def _env(why: list[str], m: re.Match[str]) -> str:
    v = _Value(m)
    if v.kept() or not is_secret_name(m.group("name")):
        return m.group(0)
    why.append(m.group("name"))
    return f"{m.group('name')}={v.replaced()}"


def _keyed(why: list[str], m: re.Match[str]) -> str:
    v, name = _Value(m), m.group("name")
    if v.kept() or v.text in ("Bearer", "Basic") or not is_secret_name(name):
        return m.group(0)
    # Unquoted, only a name that reads as an identifier (api_key: x, HF-TOKEN: x), and
    # not a word of prose after it.
    if not m.group("nq") and (not re.search(r"[_.-]", name) or _prose(v.text)):
        return m.group(0)
    why.append(name)
    nq = m.group("nq")
    return f"{nq}{name}{nq}: {m.group('open')}{v.replaced()}"


# The shapes a secret takes in free text, in the order they are replaced.
_SHAPES: tuple[tuple[re.Pattern[str], Callable[[list[str], re.Match[str]], str]], ...] = (
    (_AUTH_HEADER, _header),
    (_BEARER, _bearer),
    (_FLAG, _flag),
    (_ENV, _env),
    (_KEYED, _keyed),
)


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
            if not is_reference(a):
                out.append(REDACTED)
                notes.append(items[i - 1])
                continue
        if a.startswith("-") and len(a) > 1:
            name, eq, value = a.partition("=")
            if is_secret_name(name):
                if eq:
                    if is_reference(value):
                        out.append(a)
                    else:
                        notes.append(name)
                        out.append(f"{name}={REDACTED}")
                    continue
                # Its value is the next word, whatever it starts with (``-k3y``), unless
                # that is the next long flag (``--api-key --port 8000``: no value).
                nxt = items[i + 1] if i + 1 < len(items) else None
                secret_next = nxt is not None and not nxt.startswith("--")
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
        if is_secret_name(k) and v and not is_reference(v):
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
    so does a ``{name: NAME, value: VALUE}`` pair (a Kubernetes env entry) whose name is;
    lists of strings are read as command lines; strings as text.  Items of a list of
    dicts with a ``name`` are addressed by it (``roles[decode]``)."""
    notes: list[str] = []

    def note(path: str, what: str) -> None:
        notes.append(f"{path} {what}" if path else what)

    def walk(o: Any, path: str) -> Any:
        if isinstance(o, Mapping):
            new: dict[Any, Any] = {}
            pair = o.get("name") if isinstance(o.get("value"), str) else None
            for k, v in o.items():
                child = f"{path}.{k}" if path else str(k)
                if k == "value" and isinstance(pair, str) and _holds_secret(pair, v):
                    new[k] = REDACTED
                    note(path, pair)
                elif isinstance(k, str) and _holds_secret(k, v):
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


def _holds_secret(name: str, value: Any) -> bool:
    """Whether ``value``, kept under ``name``, is a secret to replace whole."""
    if not is_secret_name(name) or isinstance(value, bool):
        return False
    if isinstance(value, str):
        return bool(value) and not is_reference(value)
    if isinstance(value, list):
        return any(not (isinstance(x, str) and is_reference(x)) for x in value)
    return isinstance(value, int | float)


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
    "is_reference",
    "is_secret_name",
    "provenance",
    "remember",
    "scrub",
    "text",
    "url",
]
