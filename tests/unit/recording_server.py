"""A scripted OpenAI-style completions server, run as a process of its own
(``python tests/unit/recording_server.py TOKENIZER_DIR RECORD_FILE THINK_S``), that
records when each request arrived and what it asked for, one JSON line a request.  It
counts each prompt with the model's tokenizer, as vLLM does, and streams ``max_tokens``
one-token chunks after ``THINK_S`` seconds.  A chat request (``messages``) is counted as
the tiny model's chat template renders it, and answered with a reply of its own
(`` r<N>`` then `` w`` words: ``N`` counts the server's requests), which its record keeps
beside the messages, so a test can find that reply in a later turn.

**Arrival is the kernel's stamp** (``SO_TIMESTAMPNS``: when the request's bytes reached
the socket, CLOCK_REALTIME), not the time this process got round to reading them: on a
loaded 2-core machine a server process (aiohttp, even alone in its process) was scheduled
80-400 ms late while the client had sent on time, and a test of the client's clock would
have measured the server's.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time
from typing import Any

from tokenizers import Tokenizer

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


def read_request(conn: socket.socket, buf: bytes) -> tuple[int | None, dict[str, Any], bytes]:
    """One request from ``conn`` (``buf``: bytes already read): the kernel's stamp of its
    first bytes (ns, realtime), its JSON body, and what was read beyond it."""
    stamp: int | None = None
    while b"\r\n\r\n" not in buf or len(buf) < _needed(buf):
        data, cmsgs, _, _ = conn.recvmsg(1 << 20, 1024)
        if not data:
            raise ConnectionError("closed")
        for level, kind, payload in cmsgs:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and stamp is None and not buf:
                sec, nsec = struct.unpack("qq", payload[:16])
                stamp = sec * 1_000_000_000 + nsec
        buf += data
    end = _needed(buf)
    head, body = buf[: buf.index(b"\r\n\r\n")], buf[buf.index(b"\r\n\r\n") + 4 : end]
    del head
    return stamp, json.loads(body), buf[end:]


def _needed(buf: bytes) -> int:
    if b"\r\n\r\n" not in buf:
        return 1 << 62
    head, _, _ = buf.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return len(head) + 4


def _event(obj: dict[str, Any]) -> bytes:
    data = b"data: " + json.dumps(obj).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def render_chat(messages: list[dict[str, str]]) -> str:
    """The tiny model's chat template (``servebook.models.tiny.CHAT_TEMPLATE``), rendered
    with the generation prompt."""
    turns = "".join(f"<|{m['role']}|>\n{m['content']}</s>\n" for m in messages)
    return f"<s>{turns}<|assistant|>\n"


_served = [0]


def _answer(body: dict[str, Any], tok: Any, n: int) -> tuple[str, list[bytes], int, str]:
    """The record's prompt key, the stream's token chunks, the prompt's count and the
    reply's text."""
    if "messages" not in body:
        chunk = _event({"choices": [{"index": 0, "text": "a", "finish_reason": None}]})
        return body["prompt"], [chunk] * n, len(tok.encode(body["prompt"]).ids), "a" * n
    rendered = render_chat(body["messages"])
    words = [f" r{_served[0]}"] + [" w"] * (n - 1)
    chunks = [
        _event({"choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]})
        for w in words
    ]
    counted = len(tok.encode(rendered, add_special_tokens=False).ids)
    return rendered, chunks, counted, "".join(words)


def serve(conn: socket.socket, tok: Any, think_s: float, out: Any, lock: threading.Lock) -> None:
    conn.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    buf = b""
    try:
        while True:
            stamp, body, buf = read_request(conn, buf)
            n = int(body["max_tokens"])
            with lock:  # before the answer: the test reads the record once answered
                _served[0] += 1
                prompt, chunks, counted, reply = _answer(body, tok, n)
                row: dict[str, Any] = {"t": stamp, "prompt": prompt, "max_tokens": n}
                if "messages" in body:
                    row["messages"], row["reply"] = body["messages"], reply
                out.write(json.dumps(row))
                out.write("\n")
                out.flush()
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            time.sleep(think_s)
            usage = {"prompt_tokens": counted, "completion_tokens": n}
            chunks.append(_event({"choices": [], "usage": usage}))
            done = b"data: [DONE]\n\n"
            conn.sendall(b"".join(chunks) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
    except (ConnectionError, OSError):
        conn.close()


def main(tokenizer_dir: str, record: str, think_s: float) -> None:
    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    out = open(record, "a", encoding="utf-8")  # noqa: SIM115 - open for the server's life
    lock = threading.Lock()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    print(sock.getsockname()[1], flush=True)
    while True:
        conn, _ = sock.accept()
        args = (conn, tok, think_s, out, lock)
        threading.Thread(target=serve, args=args, daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
