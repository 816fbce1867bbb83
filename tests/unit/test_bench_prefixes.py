"""Shared-prefix prompts (``--prefix-len L --prefix-count P``): each prompt starts with one
of P prefixes of L tokens, is exactly its length as the server counts it, distinct
prefixes differ from their first block, and the settings are the workload's provenance."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from servebook.bench.prefixes import PrefixPrompts
from servebook.bench.sweep import BenchArgs, prompts_from
from servebook.bench.tokens import HFTokenizer, server_token_count
from servebook.errors import UsageError
from tests.unit.conftest import needs_transformers

#: vLLM's KV-cache block size: a prefix cache shares whole blocks from the start.
BLOCK = 16


def prefix_prompts(tiny_dir: Path, **over: object) -> PrefixPrompts:
    kw: dict[str, object] = {
        "input_len": 200,
        "output_len": 8,
        "seed": 3,
        "prefix_len": 64,
        "prefix_count": 4,
    }
    kw.update(over)
    return PrefixPrompts(str(tiny_dir), **kw)  # type: ignore[arg-type]


def test_every_prompt_starts_with_one_of_the_prefixes_and_has_the_exact_server_length(
    tiny_dir: Path, tok: HFTokenizer
) -> None:
    src = prefix_prompts(tiny_dir)
    prefixes = src.prefix_texts()
    assert len(prefixes) == 4 and len(set(prefixes)) == 4
    used = set()
    for i in range(120):
        p = src.get(i)
        assert server_token_count(tok, p.text) == 200 == p.prompt_tokens
        (which,) = [k for k, pre in enumerate(prefixes) if p.text.startswith(pre)]
        used.add(which)
        # The prefix is the first L content tokens the server sees after its BOS.
        ids = tok.encode(p.text, add_special_tokens=True)
        assert ids[1 : 1 + 64] == src.prefix_ids()[which]
    assert used == {0, 1, 2, 3}
    assert len({src.get(i).text for i in range(120)}) == 120  # the suffixes are the request's


def test_distinct_prefixes_differ_from_their_first_block(tiny_dir: Path) -> None:
    src = prefix_prompts(tiny_dir, prefix_count=32)
    firsts = [ids[0] for ids in src.prefix_ids()]
    assert len(set(firsts)) == 32  # differ at the first token, so in the first block
    blocks = {tuple(ids[: BLOCK - 1]) for ids in src.prefix_ids()}
    assert len(blocks) == 32


def test_prefix_ids_are_sent_as_token_ids_with_bos_first(tiny_dir: Path) -> None:
    src = prefix_prompts(tiny_dir, prompt_format="ids", prefix_count=2)
    heads = [[0, *ids] for ids in src.prefix_ids()]
    for i in range(20):
        p = src.get(i)
        assert p.token_ids is not None and len(p.token_ids) == 200
        assert p.token_ids[:65] in heads


def test_chat_prompts_keep_their_length_as_the_template_counts_it(
    tiny_dir: Path, tok: HFTokenizer
) -> None:
    needs_transformers()
    src = prefix_prompts(tiny_dir, api="chat")
    for i in range(10):
        p = src.get(i)
        assert server_token_count(tok, p.text, "chat") == 200
        assert any(p.text.startswith(pre) for pre in src.prefix_texts())


def test_the_same_seed_gives_the_same_prefixes_in_another_process_and_another_seed_others(
    tiny_dir: Path,
) -> None:
    a = prefix_prompts(tiny_dir)
    b = pickle.loads(pickle.dumps(prefix_prompts(tiny_dir)))
    assert [a.get(i).text for i in (5, 0, 9)] == [b.get(i).text for i in (5, 0, 9)]
    other = prefix_prompts(tiny_dir, seed=4)
    assert not set(a.prefix_texts()) & set(other.prefix_texts())


def test_the_workload_records_its_prefixes_and_says_it_shares_them(tiny_dir: Path) -> None:
    src = prefix_prompts(tiny_dir)
    d = src.describe()
    assert (d["kind"], d["prefix_len"], d["prefix_count"], d["input_len"]) == (
        "prefix",
        64,
        4,
        200,
    )
    assert src.shares_prefixes is True


def test_a_prefix_that_leaves_no_room_for_a_suffix_is_refused(tiny_dir: Path) -> None:
    src = prefix_prompts(tiny_dir, input_len=65, prefix_len=64)  # BOS + 64: no suffix left
    with pytest.raises(UsageError, match="--input-len 65 leaves no room for --prefix-len 64"):
        src.get(0)


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"prefix_len": 8}, "--prefix-len alone"),
        ({"prefix_count": 2}, "--prefix-count alone"),
        ({"prefix_len": 0, "prefix_count": 2}, "--prefix-len 0: give at least 1"),
        ({"prefix_len": 8, "prefix_count": 0}, "--prefix-count 0: give at least 1"),
    ],
)
def test_bad_prefix_flags_are_refused_naming_the_flag(
    tiny_dir: Path, over: dict[str, int], match: str
) -> None:
    with pytest.raises(UsageError, match=match):
        prompts_from(BenchArgs(**over), str(tiny_dir))  # type: ignore[arg-type]


def test_prefixes_with_a_dataset_are_refused(tiny_dir: Path, tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hi"}\n')
    with pytest.raises(UsageError, match="a --dataset brings its own text"):
        prompts_from(BenchArgs(dataset=f, prefix_len=8, prefix_count=2), str(tiny_dir))


def test_prefixes_are_shared_within_a_run_and_drawn_afresh_by_the_next(tiny_dir: Path) -> None:
    first, again = prefix_prompts(tiny_dir, run=11), prefix_prompts(tiny_dir, run=11)
    assert first.prefix_texts() == again.prefix_texts()
    assert first.get(3).text == again.get(3).text
    nxt = prefix_prompts(tiny_dir, run=12)
    # A second bench on a warm deployment finds none of the first one's prefixes cached.
    assert not {tuple(p[:BLOCK]) for p in first.prefix_ids()} & {
        tuple(p[:BLOCK]) for p in nxt.prefix_ids()
    }
    assert first.describe()["run"] == 11
