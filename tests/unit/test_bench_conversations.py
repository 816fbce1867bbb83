"""Conversations (``--multi-turn``) and shared prefixes against a scripted OpenAI-style
server on 127.0.0.1 (``recording_server.py``) that records every request's messages and
the reply it gave: a later turn carries the earlier turns and the server's own replies, a
conversation stays on one agent, TTFT is reported per turn; every prefix prompt starts
with one of the prefixes and is exactly its length as the server counts it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servebook.bench.datasets import read_dataset
from servebook.bench.endpoint import Endpoint
from servebook.bench.flags import Warmup
from servebook.bench.openai_stream import reply_text
from servebook.bench.prefixes import PrefixPrompts
from servebook.bench.protocol import (
    PointOutcome,
    PointSpec,
    ProtocolSettings,
    Target,
    run_point,
)
from servebook.bench.sessions import SyntheticSessions, sharegpt_sessions, turn_index
from servebook.bench.sweep import BenchArgs, prompts_from
from servebook.bench.target import workload_of
from servebook.bench.tokens import HFTokenizer
from servebook.bench.workload import PromptSource, RandomPrompts
from servebook.errors import UsageError
from tests.unit.conftest import needs_transformers
from tests.unit.served_app import loose_thresholds

THINK_S = 0.02
TURNS = 3


def start_server(tiny_dir: Path, record: Path) -> tuple[subprocess.Popen[str], str]:
    """``recording_server.py`` in a process of its own, and its URL."""
    script = Path(__file__).parent / "recording_server.py"
    p = subprocess.Popen(
        [sys.executable, str(script), str(tiny_dir), str(record), str(THINK_S)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    return p, f"http://127.0.0.1:{int(p.stdout.readline())}"


@pytest.fixture
def server(tiny_dir: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    record = tmp_path / "requests.jsonl"
    p, url = start_server(tiny_dir, record)
    try:
        yield url, record
    finally:
        p.terminate()
        p.wait(10)


@dataclasses.dataclass
class Conversed:
    src: SyntheticSessions
    out: PointOutcome
    seen: list[dict[str, Any]]


# The turn delay is a timing: this module runs alone, after the parallel unit tests.
pytestmark = pytest.mark.serial

DELAY_S = 0.1


@pytest.fixture(scope="module")
def conversed(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Conversed]:
    """One closed-loop point of synthetic conversations (two agents, two slots, a turn
    delay) against the recording server.  Chat prompts are counted with the chat template
    (transformers), so the point is made once for the tests that read it."""
    needs_transformers()
    record = tmp_path_factory.mktemp("conversed") / "requests.jsonl"
    p, url = start_server(tiny_dir, record)
    try:
        src = sessions(tiny_dir, delay_s=DELAY_S)
        out = one_point(url, src, concurrency=2, workers=2)
        yield Conversed(src, out, rows(record))
    finally:
        p.terminate()
        p.wait(10)


def rows(record: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def one_point(
    url: str, src: PromptSource, *, api: str = "chat", concurrency: int = 2, workers: int = 1
) -> PointOutcome:
    settings = ProtocolSettings(
        concurrencies=(concurrency,),
        repetitions=1,
        warmup=Warmup(None, 2),
        duration_s=0.5,
        min_requests=12,
        thresholds=dataclasses.replace(loose_thresholds(), require_server_evidence=False),
    )
    level = settings.levels()[0]
    target = Target(Endpoint(url, "tiny", api=api))  # type: ignore[arg-type]
    return run_point(target, PointSpec(level, 0), settings, src, workers=workers)


def sessions(tiny_dir: Path, turns: int = TURNS, delay_s: float = 0.0) -> SyntheticSessions:
    inner = RandomPrompts(str(tiny_dir), input_len=40, output_len=4, seed=5, api="chat")
    return SyntheticSessions(inner, turns=turns, turn_delay_s=delay_s)


def test_a_later_turn_carries_the_earlier_turns_and_the_servers_own_replies(
    conversed: Conversed,
) -> None:
    out, seen = conversed.out, conversed.seen
    by_messages = {json.dumps(r["messages"]): r for r in seen}
    later = [r for r in seen if len(r["messages"]) > 1]
    assert later and len(later) >= len(seen) // 2
    for r in later:
        msgs = r["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant"] * (len(msgs) // 2) + ["user"]
        earlier = by_messages[json.dumps(msgs[:-2])]
        # The reply the server gave to the earlier turn, word for word (" r<N> w w w").
        assert msgs[-2] == {"role": "assistant", "content": earlier["reply"]}
        assert earlier["reply"].startswith(" r") and earlier["t"] < r["t"]
    assert max(len(r["messages"]) for r in seen) == 2 * TURNS - 1
    p = out.point
    assert p.valid, p.invalid_reasons
    assert p.ttft_ms_by_turn is not None and set(p.ttft_ms_by_turn) == {"1", "2", "3"}
    assert sum(lat.n for lat in p.ttft_ms_by_turn.values()) == p.requests_ok
    # The first turn is exactly --input-len as the server counts its template; the later
    # ones are not stated, so not checked (SB409 passes).
    assert p.prompt_tokens_mismatch == 0 and p.prompt_tokens_unchecked == 0
    firsts = [r.expected_prompt_tokens for r in out.load.records if r.turn == 0]
    assert firsts and set(firsts) == {40}
    assert {r.expected_prompt_tokens for r in out.load.records if r.turn} == {None}


def test_a_conversation_stays_on_one_agent(conversed: Conversed) -> None:
    src, out = conversed.src, conversed.out
    agents = {x.worker for x in out.load.records}
    assert agents == {0, 1}
    index_of = {src.get(x.index).text: x for x in out.load.records}
    offset = out.load.spec.index_offset
    checked = 0
    for r in conversed.seen:
        users = [m["content"] for m in r["messages"] if m["role"] == "user"]
        recs = [index_of[u] for u in users]
        assert len({x.worker for x in recs}) == 1, [x.worker for x in recs]
        w = recs[0].worker
        j = (recs[0].index - offset - w) // 2 // TURNS
        assert [x.index for x in recs] == [
            turn_index(offset, w, 2, TURNS, j, t) for t in range(len(recs))
        ]
        checked += len(recs) > 1
    assert checked > 0


def test_the_turn_delay_passes_between_a_reply_and_the_next_turn(conversed: Conversed) -> None:
    out = conversed.out
    by_index = {x.index: x for x in out.load.records}
    pairs = [
        (by_index[b.index - 2], b)  # two agents: a conversation's turns are 2 apart
        for b in out.load.records
        if b.turn and b.index - 2 in by_index
    ]
    assert pairs
    for a, b in pairs:
        assert b.turn is not None and a.turn == b.turn - 1
        # What the slot waited from the reply's end to the turn's start (the event loop's
        # timer may wake a millisecond early).
        assert b.turn_delay_ns == b.scheduled_ns - a.end_ns
        assert b.turn_delay_ns >= (DELAY_S - 0.002) * 1e9
    # The slot waiting out the delay is the conversation's: the level holds.
    assert out.point.client.achieved_concurrency is not None
    assert out.point.client.achieved_concurrency > 0.9


def test_sharegpt_conversations_send_their_human_turns_with_the_servers_replies(
    tiny_dir: Path, tok: HFTokenizer, server: tuple[str, Path], tmp_path: Path
) -> None:
    url, record = server
    f = tmp_path / "sg.json"
    convs = [
        {
            "id": "a",
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "Name a colour."},
                {"from": "gpt", "value": "Blue, the colour of the sky."},
                {"from": "human", "value": "Another one?"},
                {"from": "gpt", "value": "Green."},
            ],
        },
        {
            "id": "b",
            "conversations": [
                {"from": "human", "value": "Count to three."},
                {"from": "gpt", "value": "One two three"},
            ],
        },
    ]
    f.write_text(json.dumps(convs))
    src = sharegpt_sessions(
        read_dataset(f, "sharegpt"), default_output_len=4, tok=tok, turns=None, turn_delay_s=0
    )
    assert src.stride == 2 and src.turns_of(0) == 2 and src.turns_of(1) == 1
    one_point(url, src, concurrency=1)
    seen = rows(record)
    second = [r for r in seen if len(r["messages"]) == 4]
    assert second
    for r in second:
        system, user1, reply, user2 = r["messages"]
        assert system == {"role": "system", "content": "Be brief."}
        assert (user1["content"], user2["content"]) == ("Name a colour.", "Another one?")
        assert reply["content"].startswith(" r")  # the server's reply, not the dataset's
    # Output lengths are the dataset's replies' token counts.
    firsts = [r for r in seen if r["messages"][-1]["content"] == "Name a colour."]
    n = len(tok.encode("Blue, the colour of the sky.", add_special_tokens=False))
    assert firsts and {r["max_tokens"] for r in firsts} == {n}
    assert any(r["messages"] == [{"role": "user", "content": "Count to three."}] for r in seen)


def test_every_prefix_prompt_reaches_the_server_with_its_prefix_and_its_exact_length(
    tiny_dir: Path, tok: HFTokenizer, server: tuple[str, Path]
) -> None:
    url, record = server
    src = PrefixPrompts(
        str(tiny_dir), input_len=120, output_len=2, seed=9, prefix_len=48, prefix_count=3
    )
    out = one_point(url, src, api="completions")
    prefixes = src.prefix_texts()
    seen = rows(record)
    assert len(seen) >= 12
    used = set()
    for r in seen:
        (k,) = [k for k, pre in enumerate(prefixes) if r["prompt"].startswith(pre)]
        used.add(k)
        assert len(tok.encode(r["prompt"], add_special_tokens=True)) == 120
    assert len(used) >= 2
    p = out.point
    assert p.prompt_tokens_mismatch == 0 and p.prompt_tokens_unchecked == 0
    wl = workload_of(ProtocolSettings(concurrencies=(1,)), src)
    assert (wl["prefix_len"], wl["prefix_count"]) == (48, 3)


def test_a_conversation_records_its_turns_in_the_workload(tiny_dir: Path) -> None:
    needs_transformers()
    src = prompts_from(
        BenchArgs(api="chat", multi_turn=True, turns=4, turn_delay="500ms"), str(tiny_dir)
    )
    d = src.describe()
    assert (d["multi_turn"], d["turns"], d["turn_delay_s"], d["kind"]) == (
        True,
        4,
        0.5,
        "random",
    )
    assert getattr(src, "shares_prefixes", None) is True


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"multi_turn": True}, "add --api chat"),
        ({"turns": 3}, "--turns shapes conversations"),
        ({"turn_delay": "1s"}, "--turn-delay shapes conversations"),
        ({"multi_turn": True, "api": "chat", "turns": 0}, "--turns 0: give at least 1"),
        ({"multi_turn": True, "api": "chat", "turn_delay": "soon"}, "--turn-delay 'soon'"),
    ],
)
def test_bad_conversation_flags_are_refused_naming_the_flag(
    tiny_dir: Path, over: dict[str, Any], match: str
) -> None:
    if over.get("api") == "chat":
        needs_transformers()
    with pytest.raises(UsageError) as e:
        prompts_from(BenchArgs(**over), str(tiny_dir))
    assert match in f"{e.value} {e.value.hint or ''}"


def test_multi_turn_from_a_trace_is_refused_naming_the_file(tiny_dir: Path, tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    with pytest.raises(UsageError, match=r"t\.jsonl: a mooncake file holds single requests"):
        prompts_from(BenchArgs(api="chat", multi_turn=True, dataset=f), str(tiny_dir))


def test_a_reply_is_read_from_its_stream_even_split_mid_event() -> None:
    events = b"".join(
        b"data: " + json.dumps({"choices": [{"delta": {"content": w}}]}).encode() + b"\n\n"
        for w in ["Hel", "lo", ' "you"']
    )
    usage = b'data: {"choices": [], "usage": {"completion_tokens": 3}}\n\ndata: [DONE]\n\n'
    body = events + usage
    assert reply_text([body[:10], body[10:33], body[33:]], chat=True) == 'Hello "you"'
    text = b'data: {"choices": [{"text": "abc"}]}\n\ndata: [DONE]\n\n'
    assert reply_text([text], chat=False) == "abc"
