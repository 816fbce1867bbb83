"""Prompts for a dataset (``--dataset FILE``): text prompts as given, and prompts of exact
lengths synthesized for traces that give lengths only (Mooncake, Azure, BurstGPT).

**Blocks from hash ids.**  A Mooncake row names its prompt's blocks of 512 tokens by hash
id; rows that share leading ids shared that prefix in production, and the server's prefix
cache should see the same.  So each distinct id gets one block of content token ids, drawn
once from ``default_rng([seed, run, BLOCK_STREAM, id])`` (``run``: the invocation's,
``workload`` "Seeding", so a second run on a warm deployment finds none of them cached)
and reused wherever the id recurs, and distinct ids draw distinct content.  A row's
content is its blocks concatenated and cut at its length; tokens beyond its blocks (a
row of Azure or BurstGPT has no ids), are the row's own
(``default_rng([seed, run, ROW_STREAM, row])``).

**Exact length, as the server counts it.**  The server adds its own tokens (BOS, a chat
template: ``workload._overhead``), so a row of ``input_length`` tokens has ``input_length
- overhead`` content tokens; they are assembled as ids, decoded once, and the text is
counted the server's way.  The ids are the tokenizer's *word tokens* where it has a
checked table (``workload.word_table``: any sequence of them keeps one token a word, so
the count holds and text of shared blocks is a shared prefix), else its clean vocabulary;
a text that counts differently is moved to the exact length at its end only
(``workload.converge``, the one implementation random prompts use too), so its shared
beginning stays.  The server's first block thus holds the BOS and one content token less
than 512; every row is shifted alike, so shared prefixes stay exactly shared.

**Built before the clock starts.**  Every prompt of the file is built when the source is
made (a replay must not wait on a tokenizer), and the source only looks them up during the
load.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from servebook.bench.datasets import (
    Dataset,
    Format,
    load_dataset,
    read_dataset,
    resolve_format,
)
from servebook.bench.tokens import Api, TextTokenizer, _overhead, _vocab, converge, word_table
from servebook.bench.workload import (
    DatasetPrompts,
    Prompt,
    PromptSource,
    _count_many,
    known_lengths,
)
from servebook.errors import UsageError

BLOCK_STREAM = 0xB10C
ROW_STREAM = 0x20F
#: Mooncake's block size when a trace has hash ids but the format did not say.
DEFAULT_BLOCK = 512


class TracePrompts:
    """A trace's prompts, built whole when made (module docstring); request ``i`` is row
    ``i mod n``, and ``arrivals_ns`` is each row's send time after the first."""

    def __init__(
        self,
        dataset: Dataset,
        tok: TextTokenizer,
        *,
        seed: int,
        api: Api = "completions",
        run: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.seed = seed
        self.run = run
        self.api: Api = api
        self.block_size = dataset.block_size or DEFAULT_BLOCK
        self.arrivals_ns = tuple(r.arrival_ns for r in dataset.rows)
        base = (seed,) if run is None else (seed, run)
        self.prompts = build_trace_prompts(
            tok, dataset, seed=base, api=api, block_size=self.block_size
        )

    # A trace's rows share what their hash ids share, and a sweep longer than the file
    # sends its rows again: whether a cache hit is the trace's or a repeat, the point
    # cannot tell (SB412 does not judge it; the hit share is recorded).
    shares_prefixes: bool | None = None

    def get(self, index: int) -> Prompt:
        return self.prompts[index % len(self.prompts)]

    def prompt_lengths(self) -> list[int] | None:
        return known_lengths(self.prompts)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "trace",
            **self.dataset.describe(),
            "block_size": self.block_size,
            "seed": self.seed,
            **({} if self.run is None else {"run": self.run}),
            "api": self.api,
            "input_len_counts": "server-side prompt tokens, special tokens included",
            "prompt_format": "text",
        }


def _block_ids(pool: np.ndarray, seed: tuple[int, ...], key: int, stream: int, n: int) -> list[int]:
    # A seed sequence takes non-negative words: a negative id gets a stream of its own.
    words = [*seed, stream, key] if key >= 0 else [*seed, stream + 1, -key]
    rng = np.random.default_rng(words)
    return [int(x) for x in pool[rng.integers(0, len(pool), size=n)]]


def build_trace_prompts(
    tok: TextTokenizer, dataset: Dataset, *, seed: tuple[int, ...], api: Api, block_size: int
) -> list[Prompt]:
    """One prompt a row, of exactly its ``input_len`` server tokens, ``output_len`` its
    ``max_tokens`` (module docstring)."""
    vocab = _vocab(tok)
    words = word_table(tok, api)
    pool = words.ids if words is not None else vocab.ids
    overhead = _overhead(tok, api, vocab)
    blocks: dict[int, list[int]] = {}
    texts: list[str] = []
    for n, row in enumerate(dataset.rows):
        content = row.input_len - overhead
        if content < 1:
            raise UsageError(
                f"{dataset.path}: row {n + 1} asks for {row.input_len} prompt token(s), but "
                f"the server adds {overhead} of its own to every {api} prompt",
                hint="drop such rows from the trace, or use --api completions",
            )
        ids: list[int] = []
        for h in row.hash_ids:
            if len(ids) >= content:
                break
            if h not in blocks:
                blocks[h] = _block_ids(pool, seed, h, BLOCK_STREAM, block_size)
            ids += blocks[h]
        if len(ids) < content:
            ids += _block_ids(pool, seed, n, ROW_STREAM, content - len(ids))
        texts.append(tok.decode(ids[:content]))
    counts = _count_many(tok, texts, api)
    out = []
    for n, (row, text, got) in enumerate(zip(dataset.rows, texts, counts, strict=True)):
        if got != row.input_len:
            text = _exact(tok, text, row.input_len, seed, n, api, dataset.path)
        out.append(Prompt(text, row.output_len, row.input_len))
    return out


def _exact(
    tok: TextTokenizer,
    text: str,
    target: int,
    seed: tuple[int, ...],
    row: int,
    api: Api,
    path: str,
) -> str:
    own = tok.encode(text, add_special_tokens=False)
    rng = np.random.default_rng([*seed, ROW_STREAM, row, 1])
    fixed, last = converge(tok, own, target, rng, api)
    if fixed is None:
        raise UsageError(
            f"{path}: row {row + 1}: could not build a prompt of exactly {target} tokens "
            f"with this tokenizer (the last try came to {last})"
        )
    return fixed


class SharegptPrompts(DatasetPrompts):
    """A ShareGPT file's first human turns (``datasets.read_sharegpt``)."""

    def __init__(self, prompts: Sequence[Prompt], dataset: Dataset) -> None:
        super().__init__(prompts, dataset.path, dataset.sha256)
        self.dataset = dataset
        self.output_len_from = "--output-len"

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "dataset",
            **self.dataset.describe(),
            "output_len_from": self.output_len_from,
            "prompt_format": "text",
        }


def sharegpt_prompts(
    dataset: Dataset, *, default_output_len: int, tok: TextTokenizer | None, api: Api
) -> SharegptPrompts:
    """Each conversation's prompt; its output length is its reply's token count where a
    tokenizer counts it (vLLM's ShareGPT convention), else ``default_output_len``."""
    out = []
    for t in dataset.texts:
        n_in = _count_many(tok, [t.prompt], api)[0] if tok is not None else None
        n_out = default_output_len
        if tok is not None and t.reply:
            n_out = max(1, len(tok.encode(t.reply, add_special_tokens=False)))
        out.append(Prompt(t.prompt, n_out, n_in))
    src = SharegptPrompts(out, dataset)
    if tok is not None:
        src.output_len_from = "the reply's token count (--output-len without one)"
    return src


def dataset_prompts(
    path: str | Path,
    fmt: str | None,
    *,
    default_output_len: int,
    tokenizer: TextTokenizer | None,
    api: Api,
    seed: int,
    run: int | None = None,
) -> PromptSource:
    """The prompt source of ``--dataset PATH --dataset-format FMT`` (detected when
    ``None``).  A trace of lengths needs a tokenizer to build exact prompts."""
    form: Format = resolve_format(path, fmt)
    if form == "jsonl":
        return load_dataset(
            path, default_output_len=default_output_len, tokenizer=tokenizer, api=api
        )
    ds = read_dataset(path, form)
    if form == "sharegpt":
        return sharegpt_prompts(ds, default_output_len=default_output_len, tok=tokenizer, api=api)
    if tokenizer is None:
        raise UsageError(
            f"{path}: a {form} trace gives lengths only, and building prompts of those "
            "lengths needs the server's tokenizer",
            hint="give --tokenizer DIR (the model's directory)",
        )
    return TracePrompts(ds, tokenizer, seed=seed, api=api, run=run)
