"""The load's HTTP/1.1: one streamed POST per keep-alive connection at a time, each body
chunk handed to the caller the moment the event loop reads it.

Why servebook speaks HTTP/1.1 itself here instead of through aiohttp (which the rest of
servebook uses): the load generator's cost per output token is what limits how fast a
server it can measure (``benchmarks/client_capacity.py``).  Profiled at 64 streams with
aiohttp, a third of the client's CPU went to aiohttp's per-request machinery (session,
request and response objects, trace hooks, the writer task) and to its per-chunk
bookkeeping (the Python protocol's ``data_received``, the C parser calling back into
Python three times per chunk), none of which a benchmark needs.  Here a request is one
``transport.write`` of bytes built in one step, and a response is one ``asyncio.Protocol``
whose ``data_received`` decodes the chunked framing of the usual read (one chunk, one SSE
event) with a few slices.

**What it speaks.**  ``POST`` with a ``Content-Length`` body; responses framed by
``Transfer-Encoding: chunked``, by ``Content-Length``, or by the connection's close;
``1xx`` interim responses skipped; ``Connection: close`` and HTTP/1.0 honoured (the
connection is not reused); TLS through ``ssl`` for ``https`` URLs.  No redirects, no
proxies (the load always goes straight to the server under test), no compression (no
``Accept-Encoding`` is sent, so a server sends the body as it is).

**Stamps.**  ``sent_ns`` is taken just before ``transport.write``, which on a connected
socket writes at once: the request is on the wire when it returns.  Every body chunk of
one read gets the read's time (``now_ns`` once per ``data_received``): they arrived
together.  A body chunk is first offered to the exchange's ``take`` (a check of a few
hundred nanoseconds that folds a chunk whose shape it already knows, the usual case);
what it does not take is queued on the pool as ``(exchange.tag, t, data)``, and the pool's
``on_chunks`` gets the whole queue once the loop turn's reads are done, so chunks that
arrived together are stamped microseconds apart, not one parse apart each.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import urlsplit

now_ns = time.monotonic_ns

#: A response head longer than this is not an HTTP server's answer to a benchmark.
MAX_HEAD = 64 * 1024
#: How much of a non-200 body is kept for the error message.
MAX_ERROR_BODY = 2048

# Response states.
_HEAD, _SIZE, _DATA, _CRLF, _TRAILER, _LENGTH, _UNTIL_CLOSE, _IDLE = range(8)


class ExchangeFailed(Exception):
    """The exchange ended without a whole response: the message says how."""


class Exchange:
    """One request's response, as the connection reads it: each piece of the body of a
    200 response (chunked framing removed) is offered to ``take(t, data)``, and what it
    refuses (returns False for) goes to the pool's queue under ``tag``; ``status``,
    ``error_body`` and ``done`` are set as the response goes."""

    __slots__ = ("done", "error_body", "status", "tag", "take")

    def __init__(
        self, tag: Any, take: Callable[[int, bytes], bool] = lambda t, data: False
    ) -> None:
        self.tag = tag
        self.take = take
        self.status = 0
        self.error_body = bytearray()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class Connection(asyncio.Protocol):
    """One keep-alive connection; one exchange at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.state = _IDLE
        self.buf = b""
        self.remaining = 0
        self.keep_alive = True
        self.got_bytes = False
        self.queue = pool.queue
        self.lost = False  # the connection ended (uvloop's is_closing() may not say so)

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool.forget(self)
        self.keep_alive = False
        if self.exchange is None:
            return
        if self.state == _UNTIL_CLOSE:
            self._complete()
            return
        how = f": {exc}" if exc else ""
        where = "mid-response" if self.got_bytes else "before answering"
        self.fail(f"ServerDisconnected: the server closed the connection {where}{how}")

    def eof_received(self) -> bool:
        return False  # close: an HTTP/1.1 server half-closing is done with the connection

    def data_received(self, data: bytes) -> None:  # the per-token hot path: keep it flat
        ex = self.exchange
        if ex is None:
            return  # bytes after a response ended, or on an idle connection: not ours
        t = now_ns()
        self.got_bytes = True
        pos = 0
        n = len(data)
        if self.state == _SIZE and not self.buf and ex.status == 200:
            # The usual read: whole chunks, each queued with one slice.  Anything else (a
            # chunk split across reads, an extension, the last chunk) is left from ``pos``
            # to the general parse (``_rest``).
            queue = self.queue
            tag = ex.tag
            offer = ex.take
            while True:
                i = data.find(b"\r\n", pos)
                if i < 0:
                    break
                try:
                    size = int(data[pos:i], 16)
                except ValueError:
                    break
                end = i + 2 + size
                if size == 0 or end + 2 > n or data[end : end + 2] != b"\r\n":
                    break
                piece = data[i + 2 : end]
                if not offer(t, piece):
                    if not queue:
                        self.pool.schedule()
                    queue.append((tag, t, piece))
                pos = end + 2
                if pos == n:
                    return
        elif self.buf:
            data = self.buf + data
            self.buf = b""
        if self.state == _HEAD:
            pos = self._head(data)
            if pos < 0:
                return
        self._rest(t, data, pos)

    def _rest(self, t: int, data: bytes, pos: int) -> None:
        """The body from ``pos`` on, as the response is framed."""
        if pos >= len(data):
            return
        st = self.state
        if st == _LENGTH:
            self._length_body(t, data, pos)
        elif st == _UNTIL_CLOSE:
            self._body(t, data[pos:])
        else:
            self._chunked(t, data, pos)

    def _chunked(self, t: int, data: bytes, pos: int) -> None:
        """Parse a chunked body from ``pos``: chunk sizes, data, the CRLF after each and the
        trailer; what is cut short waits in ``buf`` for the next read."""
        n = len(data)
        st = self.state
        while pos < n:
            if st == _SIZE:
                i = data.find(b"\r\n", pos)
                if i < 0:
                    self.buf = data[pos:]
                    break
                line = data[pos:i]
                semi = line.find(b";")
                try:
                    size = int(line if semi < 0 else line[:semi], 16)
                except ValueError:
                    self.fail(f"malformed chunk size line: {line[:40]!r}")
                    return
                pos = i + 2
                if size == 0:
                    st = _TRAILER
                else:
                    st = _DATA
                    self.remaining = size
            elif st == _DATA:
                end = pos + self.remaining
                if end <= n:
                    self._body(t, data[pos:end])
                    pos = end
                    st = _CRLF
                else:
                    self._body(t, data[pos:])
                    self.remaining = end - n
                    break
            elif st == _CRLF:
                if n - pos < 2:
                    self.buf = data[pos:]
                    break
                if data[pos : pos + 2] != b"\r\n":
                    self.fail("malformed chunked body: a chunk does not end in CRLF")
                    return
                pos += 2
                st = _SIZE
            elif st == _TRAILER:
                i = data.find(b"\r\n", pos)
                if i < 0:
                    self.buf = data[pos:]
                    break
                if i == pos:
                    self.state = _IDLE
                    self._complete()
                    return
                pos = i + 2
            else:  # pragma: no cover - a state this loop never sets
                break
        self.state = st

    def _length_body(self, t: int, data: bytes, pos: int) -> None:
        """A body framed by ``Content-Length``: up to what is left of it, then complete."""
        take = min(self.remaining, len(data) - pos)
        self._body(t, data[pos : pos + take])
        self.remaining -= take
        if self.remaining == 0:
            self.state = _IDLE
            self._complete()

    # -- response head and body ---------------------------------------------------------

    def _head(self, data: bytes) -> int:
        """Parse the response head; the offset of the body in ``data``, or -1 when the head
        is not whole yet (kept) or the exchange failed."""
        end = data.find(b"\r\n\r\n")
        if end < 0:
            if len(data) > MAX_HEAD:
                self.fail(f"response head over {MAX_HEAD} bytes")
            else:
                self.buf = data
            return -1
        lines = data[:end].split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        try:
            version, status = parts[0], int(parts[1])
        except (IndexError, ValueError):
            self.fail(f"malformed status line: {lines[0][:80]!r}")
            return -1
        if not version.startswith(b"HTTP/1."):
            self.fail(f"not an HTTP/1.x response: {lines[0][:80]!r}")
            return -1
        if 100 <= status < 200:  # an interim response: the real one follows
            off = self._head(data[end + 4 :])
            return off if off < 0 else off + end + 4
        framing = self._framing(lines[1:], keep=version == b"HTTP/1.1")
        if framing is None:
            return -1
        chunked, length, keep = framing
        ex = self.exchange
        assert ex is not None
        ex.status = status
        self.keep_alive = keep
        if chunked:
            self.state = _SIZE
        elif length is not None:
            self.state = _LENGTH
            self.remaining = length
            if length == 0:
                self.state = _IDLE
                self._complete()
                return -1
        else:
            self.state = _UNTIL_CLOSE
            self.keep_alive = False
        return end + 4

    def _framing(self, headers: list[bytes], keep: bool) -> tuple[bool, int | None, bool] | None:
        """From the header lines: whether the body is chunked, its ``Content-Length`` (None
        when not given) and whether the connection is kept; None when the exchange failed
        on a malformed length."""
        chunked = False
        length: int | None = None
        for line in headers:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"transfer-encoding":
                chunked = value.endswith(b"chunked")
            elif name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    self.fail(f"malformed Content-Length: {value[:40]!r}")
                    return None
            elif name == b"connection":
                if b"close" in value:
                    keep = False
                elif b"keep-alive" in value:
                    keep = True
        return chunked, length, keep

    def _body(self, t: int, data: bytes) -> None:
        ex = self.exchange
        if ex is None or not data:
            return
        if ex.status == 200:
            if ex.take(t, data):
                return
            if not self.queue:
                self.pool.schedule()
            self.queue.append((ex.tag, t, data))
        elif len(ex.error_body) < MAX_ERROR_BODY:
            ex.error_body += data[: MAX_ERROR_BODY - len(ex.error_body)]

    def _complete(self) -> None:
        ex, self.exchange = self.exchange, None
        self.state = _IDLE
        if ex is not None and not ex.done.done():
            ex.done.set_result(None)
        if self.keep_alive and self.transport is not None and not self.transport.is_closing():
            self.pool.release(self)
        else:
            self.close()

    def fail(self, message: str) -> None:
        """End the exchange with an error and drop the connection."""
        ex, self.exchange = self.exchange, None
        self.keep_alive = False
        self.close()
        if ex is not None and not ex.done.done():
            ex.done.set_exception(ExchangeFailed(message))

    # -- the caller's side --------------------------------------------------------------

    def start(self, request: bytes, exchange: Exchange) -> int:
        """Send ``request`` and read its response into ``exchange``; the send time."""
        assert self.exchange is None and self.transport is not None
        if self.lost or self.transport.is_closing():
            # The server (or a forward in front of it) closed the connection between its
            # opening and this request: an error of this request, not of the client.
            raise ExchangeFailed(
                "ServerDisconnected: the server closed the connection before the request was sent"
            )
        self.exchange = exchange
        self.state = _HEAD
        self.buf = b""
        self.got_bytes = False
        t = now_ns()
        self.transport.write(request)
        return t

    def close(self) -> None:
        """Drop the connection (a cancelled exchange, an error, the load's end)."""
        self.exchange = None
        self.keep_alive = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


class Origin(NamedTuple):
    """Where an http(s) URL's requests go, and the ``Host`` header that names it."""

    host: str
    port: int
    tls: bool
    host_header: str


def origin(url: str) -> Origin:
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"not an http(s) URL: {url}")
    tls = u.scheme == "https"
    port = u.port or (443 if tls else 80)
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    return Origin(u.hostname, port, tls, host if port == (443 if tls else 80) else f"{host}:{port}")


class Pool:
    """Keep-alive connections to one origin; the most recently used is reused first."""

    def __init__(
        self,
        url: str,
        timeout_s: float,
        on_chunks: Callable[[list[tuple[Any, int, bytes]]], None] = lambda chunks: None,
    ) -> None:
        o = origin(url)
        self.host, self.port, self.host_header = o.host, o.port, o.host_header
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if o.tls else None
        self.timeout_s = timeout_s
        self.idle: list[Connection] = []
        self.all: set[Connection] = set()
        # Body chunks read but not handed over yet: (exchange tag, read time, bytes).
        self.queue: list[tuple[Any, int, bytes]] = []
        self.on_chunks = on_chunks
        self._scheduled = False

    def schedule(self) -> None:
        """Hand the queue over once this loop turn's reads are done (called by the
        connection that queues the first chunk)."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Hand every queued chunk to ``on_chunks`` now (also called by an exchange that
        ends, so its chunks are folded before it is read)."""
        self._scheduled = False
        if self.queue:
            chunks = self.queue[:]
            self.queue.clear()
            self.on_chunks(chunks)

    def forget(self, conn: Connection) -> None:
        self.all.discard(conn)
        if conn in self.idle:
            self.idle.remove(conn)

    def release(self, conn: Connection) -> None:
        self.idle.append(conn)

    async def connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(
                    lambda: Connection(self),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                ),
                self.timeout_s,
            )
        except OSError as e:
            raise ExchangeFailed(
                f"{type(e).__name__}: cannot connect to {self.host}:{self.port}: {e}"
            ) from e
        self.all.add(proto)
        return proto

    async def get(self) -> Connection:
        while self.idle:
            conn = self.idle.pop()
            if conn.transport is not None and not conn.transport.is_closing() and not conn.lost:
                return conn
        return await self.connect()

    async def warm(self, n: int) -> None:
        """Open ``n`` connections now (failures are left for the requests to report)."""
        results = await asyncio.gather(*(self.connect() for _ in range(n)), return_exceptions=True)
        for r in results:
            if isinstance(r, Connection):
                self.release(r)

    def close(self) -> None:
        for conn in list(self.all):
            conn.close()
        self.all.clear()
        self.idle.clear()
