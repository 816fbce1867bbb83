"""The load's HTTP/1.1 (``bench/http1.py``): chunked framing decoded whatever the reads'
boundaries, every way a response can be framed, and every way an exchange can fail, each
against real sockets on 127.0.0.1 (a scripted ``asyncio`` server writes the exact bytes)
except the split test, which feeds one connection the same bytes cut at every offset."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from servebook.bench import http1

EVENTS = [
    b'data: {"choices":[{"index":0,"text":" a"}]}\n\n',
    b'data: {"choices":[{"index":0,"text":"\\r\\n"}]}\n\n',
    b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\n',
    b"data: [DONE]\n\n",
]
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunked(*payloads: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"


class Wire:
    """A transport that records writes, for feeding a connection by hand."""

    def __init__(self) -> None:
        self.closed = False
        self.sent = b""

    def write(self, data: bytes) -> None:
        self.sent += data

    def is_closing(self) -> bool:
        return self.closed

    def abort(self) -> None:
        self.closed = True


def test_chunked_bodies_are_decoded_whatever_the_reads_boundaries() -> None:
    """The same response cut into two reads at every offset, and into one-byte reads:
    every cut gives the events' bytes back in order, completes the exchange once, and
    leaves the connection ready for the next request.  A chunk extension is allowed."""
    response = HEAD + chunked(*EVENTS).replace(b"\r\n", b";ext=1\r\n", 1)
    body = b"".join(EVENTS)

    async def feed(reads: list[bytes]) -> tuple[bytes, http1.Connection, http1.Pool]:
        got: list[bytes] = []
        pool = http1.Pool("http://127.0.0.1:9", 5, lambda cs: got.extend(c for _, _, c in cs))
        conn = http1.Connection(pool)
        conn.connection_made(Wire())
        ex = http1.Exchange("tag")
        conn.start(b"POST / HTTP/1.1\r\n\r\n", ex)
        for r in reads:
            conn.data_received(r)
        await ex.done
        pool.flush()
        assert ex.status == 200
        return b"".join(got), conn, pool

    async def main() -> None:
        cuts = [[response[:i], response[i:]] for i in range(1, len(response))]
        cuts.append([response[i : i + 1] for i in range(len(response))])
        for reads in cuts:
            got, conn, pool = await feed(reads)
            assert got == body, reads
            assert pool.idle == [conn] and conn.exchange is None

    asyncio.run(main())


Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


def exchange_with(script: Script, requests: int = 1) -> list[Any]:
    """Run ``requests`` exchanges, one after the other through one pool, against a server
    that answers each connection with ``script``; each result is ``(status, body bytes,
    error body)`` or the ``ExchangeFailed`` message; then the pool's open connections."""

    async def main() -> list[Any]:
        server = await asyncio.start_server(script, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        out: list[Any] = []
        got: list[bytes] = []
        pool = http1.Pool(f"http://127.0.0.1:{port}", 5, lambda cs: got.extend(c for *_, c in cs))
        try:
            for _ in range(requests):
                got.clear()
                ex = http1.Exchange(None)
                conn = await pool.get()
                conn.start(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", ex)
                try:
                    await asyncio.wait_for(ex.done, 5)
                    pool.flush()
                    out.append((ex.status, b"".join(got), bytes(ex.error_body)))
                except http1.ExchangeFailed as e:
                    out.append(str(e))
                await asyncio.sleep(0.05)  # let a closing connection's close arrive
            out.append(len(pool.idle))
        finally:
            pool.close()
            server.close()
            await server.wait_closed()
        return out

    return asyncio.run(main())


def test_keep_alive_connections_are_reused_and_a_close_is_honoured() -> None:
    conns: list[int] = []

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(1)
        for _ in range(2):
            await _read_request(reader)
            writer.write(HEAD + chunked(EVENTS[0]))
            await writer.drain()
        writer.close()

    assert exchange_with(keep, 2) == [(200, EVENTS[0], b""), (200, EVENTS[0], b""), 0]
    assert len(conns) == 1  # the second request went over the first one's connection

    async def close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(1)
        await _read_request(reader)
        writer.write(HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + chunked(b"x"))
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()

    conns.clear()
    assert exchange_with(close, 2) == [(200, b"x", b""), (200, b"x", b""), 0]
    assert len(conns) == 2


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # Framed by Content-Length.
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", (200, b"hello", b"")),
        # Framed by the connection's close (HTTP/1.0, no length).
        (b"HTTP/1.0 200 OK\r\n\r\nuntil close", (200, b"until close", b"")),
        # An interim response first.
        (b"HTTP/1.1 100 Continue\r\n\r\n" + HEAD + chunked(b"ok"), (200, b"ok", b"")),
        # An error status: its body is kept for the message, not delivered.
        (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\ndead",
            (503, b"", b"dead"),
        ),
    ],
)
def test_every_framing_of_a_response_is_read(answer: bytes, expected: tuple[Any, ...]) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(answer)
        await writer.drain()
        writer.close()

    assert exchange_with(script)[0] == expected


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (HEAD + b"10\r\nonly part", "ServerDisconnected: the server closed the connection mid"),
        (b"", "ServerDisconnected: the server closed the connection before answering"),
        (HEAD + b"zz\r\n", "malformed chunk size line: b'zz'"),
        (HEAD + b"2\r\nabXY", "malformed chunked body: a chunk does not end in CRLF"),
        (b"ICY 200 OK\r\n\r\n", "not an HTTP/1.x response: b'ICY 200 OK'"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "malformed status line: b'SSH-2.0-OpenSSH'"),
    ],
)
def test_a_broken_response_fails_its_exchange_with_what_broke(answer: bytes, message: str) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(answer)
        await writer.drain()
        writer.close()

    result, idle = exchange_with(script)
    assert isinstance(result, str) and result.startswith(message), result
    assert idle == 0  # a failed connection is never reused


def test_a_refused_connection_names_the_address() -> None:
    async def main() -> str:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        try:
            await http1.Pool(f"http://127.0.0.1:{port}", 5).get()
        except http1.ExchangeFailed as e:
            return str(e)
        return "connected"

    assert asyncio.run(main()).startswith("ConnectionRefusedError: cannot connect to 127.0.0.1:")


def test_the_host_header_and_the_url_forms() -> None:
    assert http1.Pool("http://127.0.0.1:8000/v1", 1).host_header == "127.0.0.1:8000"
    assert http1.Pool("https://api.example.com/v1", 1).host_header == "api.example.com"
    assert http1.Pool("https://api.example.com/v1", 1).ssl is not None
    assert http1.Pool("http://[::1]:8000", 1).host_header == "[::1]:8000"
    with pytest.raises(ValueError, match="not an http"):
        http1.Pool("ftp://x", 1)


def test_a_server_that_closes_every_connection_gives_errors_not_a_client_failure() -> None:
    """A server (or a port-forward whose dial failed) that closes each connection as it
    accepts it: every request is an error record; before, writing to the closed uvloop
    transport raised RuntimeError and the whole load ended as a ClientError."""
    import socket
    import threading

    from servebook.bench.control import LoadSpec
    from servebook.bench.coordinator import run_load
    from servebook.bench.endpoint import Endpoint
    from servebook.bench.workload import DatasetPrompts, Prompt

    srv = socket.create_server(("127.0.0.1", 0))

    def refuse() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=refuse, daemon=True).start()
    try:
        res = run_load(
            Endpoint(f"http://127.0.0.1:{srv.getsockname()[1]}", "m"),
            LoadSpec(concurrency=8, num_requests=32),
            DatasetPrompts([Prompt("x", 4)], "memory", "0"),
        )
    finally:
        srv.close()
    assert len(res.records) == 32
    assert all(r.error is not None and "ServerDisconnected" in r.error for r in res.records)
