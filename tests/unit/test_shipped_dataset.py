"""The dataset that ships with servebook (``--dataset builtin:spec-text``): it is what its
source writes, it reads as servebook's JSONL, its replies would repeat its prompts' text,
and an unknown built-in name is refused with the names there are."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from servebook import datasets
from servebook.bench.datasets import load_dataset
from servebook.bench.tokens import HFTokenizer
from servebook.datasets import make_spec_text
from servebook.errors import UsageError
from tests.conftest import CliResult


def test_the_shipped_file_is_what_its_source_writes() -> None:
    path = datasets.resolve("builtin:spec-text")
    assert path is not None
    assert path.read_text(encoding="utf-8") == make_spec_text.text()


def test_it_reads_as_several_hundred_prompts_that_each_hold_a_passage_to_repeat(
    tok: HFTokenizer,
) -> None:
    path = datasets.resolve("builtin:spec-text")
    assert path is not None
    src = load_dataset(path, default_output_len=1, tokenizer=tok)
    assert len(src.prompts) >= 300
    passages = [*make_spec_text.PROSE, *(c for c, _ in make_spec_text.CODE)]
    for p in src.prompts:
        assert p.output_len == 128 and p.prompt_tokens is not None
        assert sum(passage in p.text for passage in passages) == 1
    # Short enough for the tiny recipes' context (2048) with the output.
    assert max(p.prompt_tokens or 0 for p in src.prompts) + 128 <= 1024


def test_an_unknown_builtin_is_refused_naming_the_ones_there_are() -> None:
    with pytest.raises(UsageError) as e:
        datasets.resolve("builtin:nope")
    assert "builtin:nope" in str(e.value) and "builtin:spec-text" in (e.value.hint or "")
    assert datasets.resolve(str(Path("plain.jsonl"))) is None


def test_bench_refuses_an_unknown_builtin_dataset_before_anything_runs(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    r = cli("bench", "--url", "http://127.0.0.1:9", "--dataset", "builtin:nope", "-o", str(out))
    assert r.returncode == 2 and "no built-in dataset 'nope'" in r.stderr
    assert not out.exists()
