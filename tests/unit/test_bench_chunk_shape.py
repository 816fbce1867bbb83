"""Chunks recognised by their bytes (``openai_stream.learn_shape``/``fold_known``): a stream
folded with the learned shape gives exactly the record that parsing every chunk gives,
whatever the chunks hold; only plain one-token chunks are taken by their bytes.

The chunks are vLLM 0.32's (``fixtures/bench/vllm-completions-stream.txt`` is one stream
as sent) and variants of them that a server could send."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servebook.bench.openai_stream import (
    StreamSink,
    apply_data,
    fold_chunks,
    fold_known,
    learn_shape,
)
from servebook.bench.records import RequestRecord

FIXTURES = Path(__file__).parent / "fixtures" / "bench"
STREAM = (FIXTURES / "vllm-completions-stream.txt").read_bytes()
EVENTS = [e + b"\n\n" for e in STREAM.split(b"\n\n") if e]


def completion(text: str, finish: str | None = None, **extra: object) -> bytes:
    """A vLLM completions chunk with ``text`` (the fixture's first chunk, re-encoded)."""
    doc = json.loads(EVENTS[0][6:-2])
    doc["choices"][0]["text"] = text
    doc["choices"][0]["finish_reason"] = finish
    doc.update(extra)
    return b"data: " + json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def chat(content: str | None, **delta: object) -> bytes:
    doc = {
        "id": "chatcmpl-bench-0",
        "object": "chat.completion.chunk",
        "created": 1767225600,
        "model": "tiny",
        "choices": [
            {"index": 0, "delta": {"content": content, **delta}, "logprobs": None,
             "finish_reason": None}
        ],
    }  # fmt: skip
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def record() -> RequestRecord:
    return RequestRecord(0, 0, 0, latency_from="sent", expected_output_tokens=8)


def parsed_one_by_one(events: list[bytes], is_chat: bool = False) -> RequestRecord:
    """The reference: every event parsed in full."""
    rec = record()
    for t, e in enumerate(events, start=1):
        apply_data(rec, t * 1000, e[6:-2], is_chat)
    return rec


def folded(
    events: list[bytes], is_chat: bool = False, per_turn: int = 1
) -> tuple[RequestRecord, StreamSink]:
    """As the load folds them: one event per read, each offered to the sink's ``take``
    first, the rest queued and folded at the end of each loop turn of ``per_turn`` reads."""
    rec = record()
    sink = StreamSink(rec, is_chat)
    queue: list[tuple[StreamSink, int, bytes]] = []
    for t, e in enumerate(events, start=1):
        if not sink.take(t * 1000, e):
            queue.append((sink, t * 1000, e))
        if t % per_turn == 0:
            fold_chunks(queue)
            queue = []
    fold_chunks(queue)
    assert sink.queued == 0
    return rec, sink


def same(a: RequestRecord, b: RequestRecord) -> None:
    assert list(a.chunk_ns) == list(b.chunk_ns)
    assert (a.chunk_tokens is None) == (b.chunk_tokens is None)
    if a.chunk_tokens is not None and b.chunk_tokens is not None:
        assert list(a.chunk_tokens) == list(b.chunk_tokens)
    assert (a.error, a.done, a.usage_output_tokens, a.prompt_tokens) == (
        b.error,
        b.done,
        b.usage_output_tokens,
        b.prompt_tokens,
    )


def test_the_captured_vllm_stream_folds_the_same_and_is_learned() -> None:
    rec, sink = folded(EVENTS)
    same(rec, parsed_one_by_one(EVENTS))
    assert sink.shape is not None  # learned from the first chunk
    assert rec.done and rec.output_tokens == 5 and rec.usage_output_tokens == 5


VARIANTS = {
    "plain": [completion(" a"), completion(" b"), completion("c1 2!#$%&'()*+,-./:;<=>?@[]^_`{|}~")],
    "empty text (no token)": [completion(" a"), completion(""), completion(" b")],
    "escaped quote": [completion(" a"), completion('say "hi"'), completion(" b")],
    "escaped newline": [completion(" a"), completion("\n"), completion("\t")],
    "non-ASCII": [completion(" a"), completion(" é"), completion("日本")],
    "finish reason": [completion(" a"), completion(" b", finish="length")],
    "usage in a chunk": [completion(" a"), completion(" b", usage={"completion_tokens": 2})],
    "token ids": [
        completion(" a"),
        EVENTS[1].replace(b'"text":" os"', b'"text":"xy","token_ids":[5,6]'),
    ],
    "error event": [completion(" a"), b'data: {"error":{"message":"boom","code":500}}\n\n'],
    "raw quote in the text (malformed)": [
        completion(" a"),
        completion(" b").replace(b'" b"', b'" "b"'),
    ],
    "raw control byte (malformed)": [completion(" a"), completion(" b").replace(b" b", b" \x01")],
    "cut short (malformed)": [completion(" a"), completion(" b")[:-5] + b"\n\n"],
    "another id": [completion(" a"), completion(" b").replace(b"cmpl-bench-0", b"cmpl-bench-1")],
    "done": [completion(" a"), b"data: [DONE]\n\n"],
}


@pytest.mark.parametrize("per_turn", [1, 2, 3])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_any_chunk_folds_as_parsing_it_would(name: str, per_turn: int) -> None:
    events = VARIANTS[name] + [completion(" z"), completion(" y"), completion(" x")]
    rec, sink = folded(events, per_turn=per_turn)
    same(rec, parsed_one_by_one(events))
    assert sink.shape is not None


def test_malformed_chunks_in_a_learned_stream_still_fail_the_request() -> None:
    for name in ("raw quote in the text (malformed)", "raw control byte (malformed)"):
        rec, _ = folded(VARIANTS[name])
        assert rec.error is not None and rec.error.startswith("malformed stream event"), name


def test_chat_chunks_are_learned_from_their_content() -> None:
    events = [chat("Hi"), chat(" there"), chat(""), chat(" x", reasoning_content="r"), chat("!")]
    rec, sink = folded(events, is_chat=True)
    same(rec, parsed_one_by_one(events, is_chat=True))
    assert sink.shape is not None and len(rec.chunk_ns) == 4


@pytest.mark.parametrize(
    "event",
    [
        completion(" b", finish="length"),  # the last chunk: its finish reason would stick
        completion(" b", usage={"completion_tokens": 2}),
        completion('"q"'),  # an escape: bytes and text differ
        completion(" é"),
        completion(" b").replace(b'"text":" b"', b'"text": " b"'),  # spaced: not found
        completion(" b", model="text"),  # "text" as a value too: ambiguous
        completion(""),  # nothing to locate the text by
    ],
)
def test_only_plain_one_token_chunks_are_learned(event: bytes) -> None:
    obj = json.loads(event[6:-2])
    assert learn_shape(event, obj, chat=False) is None


def test_a_learned_shape_takes_its_own_chunks_only() -> None:
    event = completion(" a")
    shape = learn_shape(event, json.loads(event[6:-2]), chat=False)
    assert shape is not None
    rec = record()
    assert fold_known(rec, 1, shape, completion(" bcd"))
    assert fold_known(rec, 2, shape, completion(""))
    assert not fold_known(rec, 3, shape, completion("x", finish="length"))
    assert not fold_known(rec, 4, shape, completion("\\"))
    assert not fold_known(rec, 5, shape, completion(" b")[:-3])
    assert list(rec.chunk_ns) == [1]
