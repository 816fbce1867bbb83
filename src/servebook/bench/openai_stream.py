"""The OpenAI-compatible side of the load: what a request asks (``request_body``, for an
``Endpoint``) and how its streamed events fold into its ``RequestRecord``.

**Errors are records.**  A non-200 status, an ``{"error": ...}`` event, a stream that
closes before ``data: [DONE]``, a stream with no tokens: each sets the record's ``error``;
nothing is dropped.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from servebook.bench.endpoint import Endpoint
from servebook.bench.sse import SSEParser

if TYPE_CHECKING:
    from servebook.bench.records import RequestRecord

try:  # orjson parses a stream chunk several times faster; json is the fallback.
    import orjson

    loads: Callable[[bytes], Any] = orjson.loads
    dumps: Callable[[Any], bytes] = orjson.dumps
except ImportError:  # pragma: no cover - depends on the environment
    loads = json.loads

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj).encode()


def request_body(
    endpoint: Endpoint,
    prompt: str | list[int],
    max_tokens: int,
    history: Sequence[dict[str, str]] = (),
    index: int | None = None,
) -> dict[str, Any]:
    """The request for one prompt: text, or (completions only) a list of token ids;
    ``history``: a conversation's messages before it (chat only); ``index``: the request's
    number in the sweep (its cache salt, ``Endpoint.salt_each``)."""
    body: dict[str, Any] = {"model": endpoint.model}
    if endpoint.api == "chat":
        if not isinstance(prompt, str):
            raise ValueError("the chat API takes text, not token ids")
        body["messages"] = [*history, {"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(
        {
            "max_tokens": max_tokens,
            "temperature": endpoint.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    if endpoint.ignore_eos:
        body["ignore_eos"] = True
    if endpoint.cache_salt is not None:
        each = endpoint.salt_each and index is not None
        body["cache_salt"] = f"{endpoint.cache_salt}-{index}" if each else endpoint.cache_salt
    body.update(dict(endpoint.extra_body))
    return body


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        msg = err.get("message") or json.dumps(err)[:300]
        code = err.get("code") or err.get("type")
        return f"server error event: {msg}" + (f" ({code})" if code else "")
    return f"server error event: {str(err)[:300]}"


def _choice_tokens(choice: Any, chat: bool) -> int:
    """Tokens a streamed choice carries (0 for role-only or finish-only chunks)."""
    if not isinstance(choice, dict):
        return 0
    ids = choice.get("token_ids")
    if ids:
        return len(ids)
    if chat:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            return 1
        return 1 if delta.get("tool_calls") else 0
    return 1 if choice.get("text") else 0


def apply_events(
    rec: RequestRecord, t: int, events: Sequence[tuple[str, bytes]], chat: bool
) -> None:
    """Fold SSE events that arrived at ``t`` into ``rec``."""
    for name, data in events:
        if name == "error":
            rec.error = rec.error or _error_text(data.decode("utf-8", "replace"))
        else:
            apply_data(rec, t, data, chat)


def apply_data(rec: RequestRecord, t: int, data: bytes, chat: bool) -> dict[str, Any] | None:
    """Fold one ``message`` event's data (a JSON chunk or ``[DONE]``) into ``rec``; the
    chunk's object when it was one.  This is the per-token hot path: keep it flat."""
    if data == b"[DONE]":
        rec.done = True
        return None
    try:
        obj = loads(data)
    except ValueError:
        rec.error = rec.error or f"malformed stream event: {data[:200]!r}"
        return None
    if type(obj) is not dict:
        rec.error = rec.error or f"unexpected stream event: {data[:200]!r}"
        return None
    err = obj.get("error")
    if err is not None:
        rec.error = rec.error or _error_text(err)
        return None
    model = obj.get("model")
    if model is not None:
        rec.answered_model = str(model)
    choices = obj.get("choices")
    if choices:
        c0 = choices[0]
        if not chat and type(c0) is dict:  # completions, inlined
            ids = c0.get("token_ids")
            k = len(ids) if ids else 1 if c0.get("text") else 0
        else:
            k = _choice_tokens(c0, chat)
        if k:
            rec.chunk_ns.append(t)
            if k != 1 or rec.chunk_tokens is not None:
                if rec.chunk_tokens is None:
                    rec.chunk_tokens = array("i", [1] * (len(rec.chunk_ns) - 1))
                rec.chunk_tokens.append(k)
    usage = obj.get("usage")
    if usage:
        ct = usage.get("completion_tokens")
        if isinstance(ct, int):
            rec.usage_output_tokens = ct
        pt = usage.get("prompt_tokens")
        if isinstance(pt, int):
            rec.prompt_tokens = pt
    return obj


# --- chunks that repeat the stream's shape -------------------------------------------------
#
# Within one stream a server sends the same chunk again and again with only the token's
# text changed: the same id, creation time, model, null fields, in the same order.  Once
# one such chunk has been parsed, the next ones are recognised by its bytes before and
# after the text, which saves the JSON parse (half the client's per-token work).  A chunk
# is taken this way only when it is the learned chunk to the letter but for a text that is
# plain printable ASCII with no quote or backslash: such a text is a valid JSON string
# with the same value as its bytes, so the chunk parses to the learned object with that
# text, and it folds exactly as ``apply_data`` would fold it.  Anything else (an escape,
# non-ASCII text, a finish reason, usage, an error, malformed bytes) goes the general way.

# A byte that a text must not hold to be taken by its bytes: outside printable ASCII, a
# quote, or a backslash.
_NOT_PLAIN = re.compile(rb"[^\x20\x21\x23-\x5b\x5d-\x7e]").search


class Shape(NamedTuple):
    """A learned chunk: its whole SSE event (``data: ...\\n\\n``) but the text."""

    head: bytes
    tail: bytes
    bare: int  # len(head) + len(tail): the event's length with an empty text


def learn_shape(event: bytes, obj: dict[str, Any], chat: bool) -> Shape | None:
    """The shape of ``event`` (one whole ``data: <json>\\n\\n`` event, parsed to
    ``obj``) when it is a plain one-token chunk: one choice, a non-empty plain text, no
    token ids, no finish reason, no usage; else None."""
    choices = obj.get("choices")
    if type(choices) is not list or len(choices) != 1 or obj.get("usage"):
        return None
    c0 = choices[0]
    if type(c0) is not dict or c0.get("finish_reason") or c0.get("token_ids"):
        return None
    if chat:
        delta = c0.get("delta")
        if type(delta) is not dict or any(
            delta.get(k) for k in ("tool_calls", "reasoning_content", "reasoning")
        ):
            return None
        text, key = delta.get("content"), b'"content"'
    else:
        text, key = c0.get("text"), b'"text"'
    # The key once in the whole event (as a key or a value), written without spaces.
    at = event.find(key + b':"')
    if type(text) is not str or not text or at < 0 or event.count(key) != 1:
        return None
    start = at + len(key) + 2
    stop = event.find(b'"', start)
    raw = event[start:stop]
    if _NOT_PLAIN(raw) or raw.decode("ascii") != text:
        return None
    return Shape(event[:start], event[stop:], start + len(event) - stop)


def fold_known(rec: RequestRecord, t: int, shape: Shape, event: bytes) -> bool:
    """Fold ``event`` if it is ``shape`` with another plain text; False if it is not
    (then nothing was done).  The per-token hot path: keep it flat."""
    head, tail, bare = shape
    n = len(event)
    if (
        n < bare
        or not event.startswith(head)
        or not event.endswith(tail)
        or _NOT_PLAIN(event, len(head), n - len(tail))
    ):
        return False
    if n != bare:  # a non-empty text: one token
        rec.chunk_ns.append(t)
        if rec.chunk_tokens is not None:
            rec.chunk_tokens.append(1)
    return True


def finish_record(rec: RequestRecord, t: int, model: str | None = None) -> None:
    """Close a stream that ended normally: a stream must end with [DONE] and carry tokens,
    and, where its chunks name a model, name ``model`` (the one asked for): a server that
    answers as another model (a gateway's fallback, a wrong route) measures that model,
    not this one."""
    rec.end_ns = t
    if rec.error is None:
        if not rec.done:
            rec.error = "stream closed before data: [DONE]"
        elif rec.output_tokens == 0:
            rec.error = "stream carried no output tokens"
        elif model is not None and rec.answered_model not in (None, model):
            rec.error = (
                f"the server answered as model {rec.answered_model!r}, not {model!r} "
                "(the model asked for): its tokens are another model's"
            )


def reply_text(body: Sequence[bytes], chat: bool) -> str:
    """The text a stream carried (a conversation's reply, sent back in its next turn): its
    events parsed again once it has ended, off the per-token path."""
    parser = SSEParser()
    parts: list[str] = []
    for data in body:
        for name, event in parser.feed(data):
            if name == "error" or event == b"[DONE]":
                continue
            try:
                obj = json.loads(event)
            except ValueError:
                continue
            choices = obj.get("choices") if isinstance(obj, dict) else None
            c0 = choices[0] if isinstance(choices, list) and choices else None
            if not isinstance(c0, dict):
                continue
            piece = (c0.get("delta") or {}).get("content") if chat else c0.get("text")
            if isinstance(piece, str):
                parts.append(piece)
    return "".join(parts)


# --- reading the body --------------------------------------------------------------------------
#
# The connection (``http1.Connection``) stamps each body chunk inside its ``data_received``
# and offers it to the request's sink (``StreamSink.take``), which folds a chunk of a known
# shape at once; the rest is queued, and once the loop turn's reads are done the queue
# comes here (``fold_chunks``), to each request's SSE parser.  The request's coroutine only
# waits for the response's end.


class StreamSink:
    """Where one response's body goes.  ``busy``: its SSE parser holds part of an event
    (then every chunk goes through the parser).  ``shape``: the stream's plain chunk, once
    one has been parsed (``learn_shape``); ``tries``: chunks left to learn it
    from.  ``queued``: its chunks waiting in the pool's queue for ``fold_chunks``."""

    __slots__ = ("busy", "chat", "parser", "queued", "rec", "shape", "tries")

    def __init__(self, rec: RequestRecord, chat: bool) -> None:
        self.rec, self.parser, self.chat, self.busy = rec, SSEParser(), chat, False
        self.shape: Shape | None = None
        self.tries = _LEARN_TRIES
        self.queued = 0

    def take(self, t: int, data: bytes) -> bool:
        """Fold a chunk of the learned shape now, in the read (``http1.Exchange.take``);
        False leaves it to the queue and ``fold_chunks``.  Once one chunk is queued, the next
        ones queue behind it, so the record keeps the order they came in."""
        if self.rec.body is not None:
            self.rec.body.append(data)
        shape = self.shape
        if shape is None or self.queued or self.busy or not fold_known(self.rec, t, shape, data):
            self.queued += 1
            return False
        return True


# Chunks of a stream parsed in full before giving up on learning its shape (a server whose
# chunks all differ, e.g. with usage in every chunk, pays the attempt only this often).
_LEARN_TRIES = 4


def fold_chunks(chunks: list[tuple[StreamSink, int, bytes]]) -> None:
    """Parse the chunks the connections read in one loop turn (``http1.Pool.on_chunks``).
    This is the per-token hot path: keep it flat."""
    for sink, t, data in chunks:
        if sink.queued > 0:
            sink.queued -= 1
        try:
            shape = sink.shape
            if shape is not None and not sink.busy and fold_known(sink.rec, t, shape, data):
                continue
            # One whole event per chunk, the usual case ("data: ...\n\n", no other line
            # end): skip the general parser.
            if (
                not sink.busy
                and data[:6] == b"data: "
                and data.find(b"\n") == len(data) - 2
                and data[-1] == 10
                and b"\r" not in data
            ):
                obj = apply_data(sink.rec, t, data[6:-2], sink.chat)
                if obj is not None and shape is None and sink.tries:
                    sink.tries -= 1
                    sink.shape = learn_shape(data, obj, sink.chat)
            else:
                p = sink.parser
                events = p.feed(data)
                sink.busy = not p.idle
                if events:
                    apply_events(sink.rec, t, events, sink.chat)
        except Exception as e:  # a bad chunk fails its request, never the load
            sink.rec.error = sink.rec.error or f"client failed to read the stream: {e!r}"[:500]
