"""Incremental parsing of a ``text/event-stream`` body (the load's responses)."""

from __future__ import annotations


class SSEParser:
    """Incremental ``text/event-stream`` parser (WHATWG HTML, "Event stream
    interpretation"): bytes in, ``(event_type, data)`` pairs out.

    Lines end in LF, CRLF or CR, and a line may be split anywhere across reads, including
    between the CR and LF of one CRLF.  ``:`` lines are comments (keep-alive pings).  An
    event is dispatched at a blank line; its data is its ``data:`` lines joined by LF; an
    event with no ``data:`` line is not dispatched.  ``id`` and ``retry`` are ignored (a
    benchmark never reconnects).  ``data: [DONE]`` is an ordinary event here: the caller
    gives it its OpenAI meaning."""

    __slots__ = ("_buf", "_data", "_event", "_skip_lf")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._event = ""
        self._skip_lf = False

    @property
    def idle(self) -> bool:
        """Nothing pending: the next byte starts a line of a new event."""
        return not self._buf and not self._data and not self._skip_lf and not self._event

    def feed(self, chunk: bytes) -> list[tuple[str, bytes]]:
        # Fast path, the shape of nearly every read from an OpenAI server: exactly one
        # complete "data: ..." event with LF line ends and nothing pending.
        if (
            chunk[:6] == b"data: "
            and chunk[-2:] == b"\n\n"
            and self.idle
            and chunk.count(b"\n") == 2
            and b"\r" not in chunk
        ):
            return [("message", chunk[6:-2])]
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            # A CR at the very end ends a line now; an LF starting the next read is the
            # second half of a CRLF, not a blank line.
            if buf[-1:] == b"\r":
                self._skip_lf = True
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        out: list[tuple[str, bytes]] = []
        data = self._data
        for line in lines:
            if line[:6] == b"data: ":
                data.append(line[6:])
            elif not line:
                if data:
                    out.append((self._event or "message", b"\n".join(data)))
                    data.clear()
                self._event = ""
            elif line[:1] == b":":
                continue
            else:
                name, _, value = line.partition(b":")
                if value[:1] == b" ":
                    value = value[1:]
                if name == b"data":
                    data.append(value)
                elif name == b"event":
                    self._event = value.decode("utf-8", "replace")
        return out
