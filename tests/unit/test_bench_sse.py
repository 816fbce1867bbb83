"""The SSE parser and how a stream's events become one request's timings and token count.

Event payloads are shaped like vLLM 0.32's streamed completions and chat completions
(``tests/unit/fixtures/bench/vllm-completions-stream.txt`` is one stream as sent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servebook.bench.openai_stream import apply_events, finish_record
from servebook.bench.records import RequestRecord
from servebook.bench.sse import SSEParser

FIXTURES = Path(__file__).parent / "fixtures" / "bench"
STREAM = (FIXTURES / "vllm-completions-stream.txt").read_bytes()
ERROR_STREAM = (FIXTURES / "vllm-completions-error-stream.txt").read_bytes()


def events_of(*chunks: bytes) -> list[tuple[str, bytes]]:
    p = SSEParser()
    out: list[tuple[str, bytes]] = []
    for c in chunks:
        out.extend(p.feed(c))
    return out


def tok(text: str, finish: str = "null", ids: str = "") -> bytes:
    extra = f',"token_ids":[{ids}]' if ids else ""
    return (
        b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"tiny",'
        b'"choices":[{"index":0,"text":"' + text.encode() + b'","logprobs":null,'
        b'"finish_reason":' + finish.encode() + extra.encode() + b',"stop_reason":null}],'
        b'"usage":null}\n\n'
    )


USAGE = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"tiny",'
    b'"choices":[],"usage":{"prompt_tokens":7,"total_tokens":12,"completion_tokens":5}}\n\n'
)
DONE = b"data: [DONE]\n\n"


def test_parser_splits_events_and_drops_comments() -> None:
    evs = events_of(b": ping\n\n" + tok("a") + b": keep-alive\n" + DONE)
    assert [d for _, d in evs][-1] == b"[DONE]"
    assert len(evs) == 2
    assert all(name == "message" for name, _ in evs)


def test_parser_gives_the_same_events_whatever_the_read_boundaries() -> None:
    whole = events_of(STREAM)
    assert len(whole) > 3
    for cut in range(1, len(STREAM)):
        assert events_of(STREAM[:cut], STREAM[cut:]) == whole, cut
    one_byte_reads = events_of(*(STREAM[i : i + 1] for i in range(len(STREAM))))
    assert one_byte_reads == whole


def test_parser_handles_crlf_split_between_cr_and_lf() -> None:
    text = b'data: {"a":1}\r\n\r\ndata: x\r\ndata: y\r\n\r\n'
    want = [("message", b'{"a":1}'), ("message", b"x\ny")]
    assert events_of(text) == want
    for cut in range(1, len(text)):
        assert events_of(text[:cut], text[cut:]) == want, cut


def test_parser_accepts_bare_cr_line_ends_and_data_without_space() -> None:
    assert events_of(b"data:a\r\rdata: b\r\r") == [("message", b"a"), ("message", b"b")]


def test_parser_keeps_the_event_type_and_joins_multiline_data() -> None:
    evs = events_of(b'event: error\ndata: {"message":\ndata: "boom"}\n\n')
    assert evs == [("error", b'{"message":\n"boom"}')]


def test_parser_holds_an_incomplete_event_until_its_blank_line() -> None:
    p = SSEParser()
    assert p.feed(b'data: {"x":') == []
    assert p.feed(b"1}\n") == []
    assert p.feed(b"\n") == [("message", b'{"x":1}')]


def test_a_real_vllm_stream_counts_usage_tokens_and_ignores_the_usage_only_chunk() -> None:
    rec = RequestRecord(index=0, worker=0, scheduled_ns=0, sent_ns=0)
    apply_events(rec, 1_000, events_of(STREAM), chat=False)
    finish_record(rec, 2_000)
    assert rec.ok, rec.error
    assert rec.done
    assert rec.usage_output_tokens == rec.output_tokens
    assert rec.prompt_tokens is not None


def test_one_token_per_chunk_gives_one_gap_per_token() -> None:
    rec = RequestRecord(index=0, worker=0, scheduled_ns=100)
    for i, t in enumerate([1_000, 1_500, 2_500, 2_600]):
        apply_events(rec, t, events_of(tok(f"t{i}")), chat=False)
    apply_events(
        rec,
        2_700,
        events_of(USAGE.replace(b'"completion_tokens":5', b'"completion_tokens":4') + DONE),
        False,
    )
    finish_record(rec, 2_800)
    assert rec.ok
    assert rec.output_tokens == 4
    assert rec.ttft_ns == 900  # from the scheduled time
    assert rec.e2e_ns == 2_500  # to the last token, not to [DONE]
    assert rec.itl_ns().tolist() == [500, 1_000, 100]
    assert rec.tpot_ns == pytest.approx(1_600 / 3)


def test_a_chunk_with_k_tokens_is_one_gap_and_k_minus_1_zero_gaps() -> None:
    rec = RequestRecord(index=0, worker=0, scheduled_ns=0)
    apply_events(rec, 1_000, events_of(tok("a")), chat=False)
    apply_events(rec, 3_000, events_of(tok("bcd", ids="5,6,7")), chat=False)  # 3 tokens
    apply_events(rec, 4_000, events_of(tok("e", finish='"length"')), chat=False)
    apply_events(rec, 4_001, events_of(USAGE, DONE), chat=False)
    finish_record(rec, 4_002)
    assert rec.output_tokens == 5
    itl = rec.itl_ns()
    assert sorted(itl.tolist()) == [0, 0, 1_000, 2_000]
    assert len(itl) == rec.output_tokens - 1
    assert itl.mean() == pytest.approx(rec.tpot_ns)  # the rule keeps mean ITL == TPOT
    assert rec.token_times_ns().tolist() == [1_000, 3_000, 3_000, 3_000, 4_000]


def test_usage_beyond_the_chunks_adds_zero_gaps_without_knowing_which_chunk() -> None:
    # No token ids: 3 chunks, but usage says 5 tokens (two chunks carried 2 each).
    rec = RequestRecord(index=0, worker=0, scheduled_ns=0)
    for t in (1_000, 2_000, 3_000):
        apply_events(rec, t, events_of(tok("x")), chat=False)
    apply_events(rec, 3_001, events_of(USAGE, DONE), chat=False)
    finish_record(rec, 3_002)
    assert rec.output_tokens == 5
    assert rec.itl_ns().tolist() == [1_000, 1_000, 0, 0]
    assert rec.tpot_ns == pytest.approx(500)


def test_events_of_one_read_share_that_reads_timestamp() -> None:
    rec = RequestRecord(index=0, worker=0, scheduled_ns=0)
    apply_events(rec, 7_000, events_of(tok("a") + tok("b") + USAGE + DONE), chat=False)
    assert list(rec.chunk_ns) == [7_000, 7_000]


def test_an_error_event_in_the_stream_makes_the_request_an_error() -> None:
    # vLLM's mid-stream error: a data event {"error": {...}} and then [DONE].
    rec = RequestRecord(index=0, worker=0, scheduled_ns=0)
    apply_events(rec, 1_000, events_of(ERROR_STREAM), chat=False)
    finish_record(rec, 2_000)
    assert rec.done and len(rec.chunk_ns) == 1
    assert not rec.ok
    assert rec.error == "server error event: Internal server error (500)"


def test_an_sse_error_event_type_is_an_error_too() -> None:
    rec = RequestRecord(index=0, worker=0, scheduled_ns=0)
    apply_events(rec, 1, events_of(b"event: error\ndata: overloaded\n\n"), chat=False)
    assert rec.error is not None and "overloaded" in rec.error


def test_a_stream_that_closes_before_done_is_an_error_not_a_short_success() -> None:
    rec = RequestRecord(index=0, worker=0, scheduled_ns=0)
    apply_events(rec, 1_000, events_of(tok("a"), tok("b")), chat=False)
    finish_record(rec, 2_000)
    assert not rec.ok
    assert rec.error == "stream closed before data: [DONE]"


def test_a_stream_with_no_tokens_is_an_error() -> None:
    rec = RequestRecord(index=0, worker=0, scheduled_ns=0)
    apply_events(rec, 1_000, events_of(DONE), chat=False)
    finish_record(rec, 2_000)
    assert rec.error == "stream carried no output tokens"


def test_malformed_json_in_a_data_line_is_recorded_as_an_error() -> None:
    rec = RequestRecord(index=0, worker=0, scheduled_ns=0)
    apply_events(rec, 1, events_of(b"data: {not json\n\n"), chat=False)
    assert rec.error is not None and rec.error.startswith("malformed stream event")


def test_chat_role_chunk_and_finish_chunk_carry_no_token() -> None:
    # vLLM's first chat chunk carries only the role; vllm bench serve counts it as the
    # first token, which makes its chat TTFT too small.
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    content = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    fin = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    rec = RequestRecord(index=0, worker=0, scheduled_ns=0)
    apply_events(rec, 10, events_of(role), chat=True)
    apply_events(rec, 20, events_of(content), chat=True)
    apply_events(rec, 30, events_of(content + fin + usage + DONE), chat=True)
    finish_record(rec, 40)
    assert rec.ok
    assert list(rec.chunk_ns) == [20, 30]
    assert rec.ttft_ns == 20
    assert rec.output_tokens == 2


def test_itl_of_a_record_is_int64_nanoseconds() -> None:
    rec = RequestRecord(index=0, worker=0, scheduled_ns=0)
    apply_events(rec, 5, events_of(tok("a")), chat=False)
    assert rec.itl_ns().dtype == np.int64
