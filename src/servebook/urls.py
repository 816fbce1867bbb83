"""A server URL as a user gives it (``bench --url``, ``attach --role``/``--entry``): one
check, so that a URL no HTTP client can use is refused as input, naming the flag, rather
than ending a command in a traceback (``http://127.0.0.1:abc``, ``http://[::1``, a pasted
newline: the reliability probe of 2026-12-04) or reading as a server that does not answer.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from servebook import redact
from servebook.errors import UsageError

EXAMPLE = "http://127.0.0.1:8000"


def server_url(text: str, flag: str) -> str:
    """``text`` when it is an http(s) URL of a host (scheme in any case, written back in
    lower case), with a port of 1-65535 if one is given and no whitespace or control
    character anywhere; else unusable input (exit 2) naming ``flag`` and why."""

    def bad(why: str) -> UsageError:
        return UsageError(f"{flag} {redact.url(text)!r}: {why}; give a base URL such as {EXAMPLE}.")

    if any(c.isspace() or not c.isprintable() for c in text):
        raise bad("it holds whitespace or a control character (a pasted newline?)")
    try:
        parts = urlsplit(text)
    except ValueError as e:
        raise bad(f"not a URL ({e})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise bad("not an http:// or https:// URL")
    if not parts.hostname:
        raise bad("it names no host")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise bad(f"port {parts.netloc.rpartition(':')[2]!r} is not a TCP port (1-65535)")
    return parts._replace(scheme=parts.scheme.lower()).geturl()


__all__ = ["EXAMPLE", "server_url"]
