"""Small blocking HTTP helpers for probes and control calls.  Every call has an explicit
timeout (field notes: a probe without one once hung, another silently passed)."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from servebook import redact
from servebook.errors import ServebookError


@dataclass
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class HTTPError(Exception):
    """The request did not produce an HTTP response (refused, timed out, reset)."""


def request(
    method: str,
    url: str,
    *,
    timeout: float,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> Response:
    data = None
    hdrs = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Response(resp.status, resp.read())
    except urllib.error.HTTPError as e:
        return Response(e.code, e.read() if e.fp is not None else b"")
    except (TimeoutError, urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise HTTPError(redact.text(f"{method} {url}: {reason}")) from None
    except ValueError as e:  # http.client.InvalidURL: a URL no client can use
        raise HTTPError(redact.text(f"{method} {url!r}: not a usable URL ({e})")) from None


def get(url: str, *, timeout: float, headers: dict[str, str] | None = None) -> Response:
    return request("GET", url, timeout=timeout, headers=headers)


def post_json(
    url: str, body: Any, *, timeout: float, headers: dict[str, str] | None = None
) -> Response:
    return request("POST", url, timeout=timeout, body=body, headers=headers)


def hold_free_port(host: str, avoid: Container[int] = (), tries: int = 50) -> socket.socket:
    """A socket holding a free port (``hold_port(host, 0)``) that is none of ``avoid``.
    The kernel's choice can itself fail (EADDRINUSE from a bind to port 0, seen while
    engines took ephemeral ports fast during ``up``): each failure is retried, and only
    ``tries`` of them end it as a ``ServebookError`` naming the host, never a traceback."""
    last: OSError | None = None
    for _ in range(tries):
        try:
            s = hold_port(host, 0)
        except OSError as e:
            last = e
            time.sleep(0.01)
            continue
        if s.getsockname()[1] not in avoid:
            return s
        s.close()
    raise ServebookError(
        f"no free port could be held on {host}: {tries} tries failed"
        + (f" (last: {last.strerror or last})" if last is not None else "")
        + "; nothing more was started",
        hint="free some ports (or widen net.ipv4.ip_local_port_range), then run it again",
    )


def hold_port(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A socket bound (not listening) to the port, 0 for any free one: while it is open the
    kernel gives the port to no one else.  Close it just before the real server binds.
    Raises OSError when the port is taken."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Like the servers: connections in TIME_WAIT from an earlier server do not count.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError:
        s.close()
        raise
    return s
