"""Prompts of an exact server-side token count with the deployment's own tokenizer, seeded;
and the JSONL dataset mode with its errors."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from servebook.bench.datasets import load_dataset
from servebook.bench.tokens import (
    HFTokenizer,
    exact_length_prompt,
    load_tokenizer,
    server_token_count,
)
from servebook.bench.workload import RandomPrompts
from servebook.errors import UsageError


def test_the_tiny_tokenizer_adds_bos_which_the_server_counts(tok: HFTokenizer) -> None:
    assert tok.encode("hello world", add_special_tokens=True)[0] == 0  # <s>
    assert server_token_count(tok, "hello world") == (
        len(tok.encode("hello world", add_special_tokens=False)) + 1
    )


@pytest.mark.parametrize("length", [1, 2, 3, 7, 64, 513, 1007])
def test_prompts_have_exactly_the_asked_server_side_length(tok: HFTokenizer, length: int) -> None:
    for seed in range(5):
        text = exact_length_prompt(tok, length, np.random.default_rng([seed, length]))
        assert len(tok.encode(text, add_special_tokens=True)) == length


def test_a_one_token_prompt_is_the_empty_text_because_bos_is_the_one_token(
    tok: HFTokenizer,
) -> None:
    assert exact_length_prompt(tok, 1, np.random.default_rng(0)) == ""


def test_a_prompt_shorter_than_the_servers_own_tokens_is_refused(tok: HFTokenizer) -> None:
    with pytest.raises(UsageError, match="too short"):
        exact_length_prompt(tok, 0, np.random.default_rng(0))


def test_decode_then_encode_does_not_round_trip_so_construction_must_check(
    tok: HFTokenizer,
) -> None:
    # Why the module re-encodes: naive decoding of random ids drifts in length.
    rng = np.random.default_rng(0)
    drifted = 0
    for _ in range(50):
        ids = rng.integers(5, tok.vocab_size, size=100).tolist()
        if len(tok.encode(tok.decode(ids), add_special_tokens=False)) != 100:
            drifted += 1
    assert drifted > 0


def test_construction_that_cannot_converge_fails_clearly() -> None:
    class Stubborn:
        """A tokenizer whose text always re-encodes one token long."""

        vocab_size = 64

        def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
            return [7] * (len(text) + 1)

        def decode(self, ids: Sequence[int]) -> str:
            return "ab" * len(ids)

        def special_ids(self) -> set[int]:
            return set()

        def render_chat(self, content: str) -> str | None:
            return None

    with pytest.raises(UsageError, match="could not build a prompt of exactly 10 tokens"):
        exact_length_prompt(Stubborn(), 10, np.random.default_rng(0))


def test_same_seed_same_prompts_in_any_order_and_across_processes(tiny_dir: Path) -> None:
    a = RandomPrompts(tiny_dir, input_len=32, output_len=8, seed=3)
    b = RandomPrompts(tiny_dir, input_len=32, output_len=8, seed=3)
    forward = [a.get(i).text for i in range(6)]
    backward = [b.get(i).text for i in reversed(range(6))][::-1]
    assert forward == backward
    assert len(set(forward)) == 6  # distinct prompts: no prefix-cache hits between them
    clone = pickle.loads(pickle.dumps(RandomPrompts(tiny_dir, input_len=32, output_len=8, seed=3)))
    assert clone.get(4).text == forward[4]
    other = RandomPrompts(tiny_dir, input_len=32, output_len=8, seed=4)
    assert other.get(0).text != forward[0]
    p = a.get(0)
    assert (p.output_len, p.prompt_tokens) == (8, 32)


def test_random_prompts_record_what_they_are(tiny_dir: Path) -> None:
    d = RandomPrompts(tiny_dir, input_len=16, output_len=4, seed=1).describe()
    assert d["kind"] == "random" and d["input_len"] == 16 and d["seed"] == 1
    assert "special tokens included" in d["input_len_counts"]


def test_dataset_mode_reads_prompts_and_optional_output_len(
    tmp_path: Path, tok: HFTokenizer
) -> None:
    f = tmp_path / "prompts.jsonl"
    f.write_text('{"prompt": "hello world"}\n\n{"prompt": "import os", "output_len": 3}\n')
    ds = load_dataset(f, default_output_len=16, tokenizer=tok)
    assert [p.output_len for p in ds.prompts] == [16, 3]
    assert ds.prompts[0].prompt_tokens == server_token_count(tok, "hello world")
    assert ds.get(2).text == "hello world"  # cycles
    assert ds.describe()["n"] == 2 and len(ds.describe()["sha256"]) == 64


@pytest.mark.parametrize(
    ("content", "where", "what"),
    [
        ('{"prompt": "ok"}\n{"prompt": "x", oops}\n', ":2:", "not JSON"),
        ('{"prompt": "ok"}\n["a list"]\n', ":2:", "expected an object"),
        ('{"text": "no prompt key"}\n', ":1:", '"prompt" must be a non-empty string'),
        ('{"prompt": "x", "output_len": 0}\n', ":1:", '"output_len" must be a positive integer'),
        ('{"prompt": "x", "output_len": "5"}\n', ":1:", '"output_len" must be a positive integer'),
    ],
)
def test_a_bad_dataset_line_names_the_file_and_line(
    tmp_path: Path, content: str, where: str, what: str
) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(UsageError) as e:
        load_dataset(f, default_output_len=8)
    assert f"{f}{where}" in str(e.value)
    assert what in str(e.value)


def test_an_empty_or_missing_dataset_is_a_usage_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(UsageError, match="no prompts"):
        load_dataset(empty, default_output_len=8)
    with pytest.raises(UsageError, match="cannot read"):
        load_dataset(tmp_path / "absent.jsonl", default_output_len=8)


def test_a_missing_tokenizer_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")


def test_chat_prompts_count_the_rendered_template_as_the_server_does(tok: HFTokenizer) -> None:
    pytest.importorskip("transformers")
    text = exact_length_prompt(tok, 40, np.random.default_rng(0), api="chat")
    rendered = tok.render_chat(text)
    assert rendered is not None and rendered.startswith("<s><|user|>")
    # vLLM renders the template (which writes <s>) and encodes without adding specials.
    assert len(tok.encode(rendered, add_special_tokens=False)) == 40
