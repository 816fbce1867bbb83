"""Shared prefixes (``--prefix-len L --prefix-count P``): every prompt starts with one of
``P`` prefixes of ``L`` tokens and ends with text of its own, so a server with a prefix
cache reuses the prefix's KV blocks and the point's server evidence shows the hits
(``prefix_hit_share``).

**What L counts.**  ``L`` content tokens right after the server's own tokens (BOS, and for
chat the template's opening): the server sees ``overhead + L`` tokens in common, and the
whole prompt is still exactly ``--input-len`` tokens as the server counts it.  The suffix
is at least one token, so no two requests are the same prompt.

**Which prefix.**  Request ``i`` takes prefix ``default_rng([seed, PICK_STREAM, i])``'s
pick, uniform over the ``P`` (vLLM's ``--prefix-repetition-*`` and AIPerf's prefix pool
pick alike; GuideLLM's ``prefix_buckets`` weight buckets, which one bucket of weight 1 is).

**Prefix content.**  Prefix ``p``'s tokens are drawn from its own stream,
``default_rng([seed, run, PREFIX_STREAM, p])``, never from a request's: the same in every
process of a run, apart from every request's own text, and drawn afresh by the next
invocation (its ``run``, ``workload``'s "Seeding"), so a second bench on a warm deployment
does not find the first one's prefixes cached.  Prefix ``p`` starts with the
``p``-th token of a seeded permutation of the sampled vocabulary, so distinct prefixes
differ at their first token and share no cache block (a prefix cache matches whole
blocks from the start).  The suffix is what a random prompt would be
(``workload.RandomPrompts``), built the same way: word tokens where the tokenizer has a
checked table (any sequence of them keeps one token a word, so prefix and suffix join
without a merge), else sampled ids moved to the exact length at their end only
(``workload.converge``), which keeps the prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from servebook.bench.lengths import FIXED, LengthDist
from servebook.bench.tokens import Api, TextTokenizer, _overhead, _vocab, converge
from servebook.bench.workload import Prompt, PromptFormat, RandomPrompts, _count_many
from servebook.errors import UsageError

PREFIX_STREAM = 0x9F1C
PICK_STREAM = 0x91C
FIRST_STREAM = 0xF125


class PrefixPrompts(RandomPrompts):
    """Random prompts of exact length that start with one of ``prefix_count`` shared
    prefixes of ``prefix_len`` content tokens (module docstring)."""

    #: The workload shares prefixes by design: prefix-cache hits are what it measures.
    shares_prefixes: bool | None = True

    def __init__(
        self,
        tokenizer: str | Path | TextTokenizer,
        *,
        input_len: int,
        output_len: int,
        seed: int,
        prefix_len: int,
        prefix_count: int,
        api: Api = "completions",
        prompt_format: PromptFormat = "text",
        input_dist: LengthDist = FIXED,
        output_dist: LengthDist = FIXED,
        run: int | None = None,
    ) -> None:
        if prefix_len < 1:
            raise UsageError(f"--prefix-len {prefix_len}: give at least 1 token")
        if prefix_count < 1:
            raise UsageError(f"--prefix-count {prefix_count}: give at least 1 prefix")
        super().__init__(
            tokenizer,
            input_len=input_len,
            output_len=output_len,
            seed=seed,
            api=api,
            prompt_format=prompt_format,
            input_dist=input_dist,
            output_dist=output_dist,
            run=run,
        )
        self.prefix_len = prefix_len
        self.prefix_count = prefix_count
        self._prefixes: list[list[int]] = []
        self._prefix_texts: list[str] = []

    def _setup(self) -> None:
        if self._ready:
            return
        super()._setup()
        overhead = self._least - 1 if self.prompt_format == "text" else self._least
        least = overhead + self.prefix_len + 1
        if self.input_len < least or (
            self.input_dist.kind != "fixed" and self.input_dist.upper(self.input_len) < least
        ):
            self._ready = False
            raise UsageError(
                f"--input-len {self.input_len} leaves no room for --prefix-len "
                f"{self.prefix_len}: the server adds {overhead} token(s) of its own and each "
                "prompt needs at least one token after its prefix",
                hint=f"give --input-len {least} or more, or a shorter --prefix-len",
            )
        self._least = least
        pool = self._pool()
        if self.prefix_count > len(pool):
            self._ready = False
            raise UsageError(
                f"--prefix-count {self.prefix_count}: this tokenizer has {len(pool)} tokens "
                "to start distinct prefixes with",
                hint=f"give --prefix-count {len(pool)} or fewer",
            )
        firsts = self._stream(FIRST_STREAM).permutation(len(pool))
        self._prefixes = []
        for p in range(self.prefix_count):
            rng = self._stream(PREFIX_STREAM, p)
            rest = pool[rng.integers(0, len(pool), size=self.prefix_len - 1)]
            self._prefixes.append([int(pool[firsts[p]]), *(int(x) for x in rest)])
        self._prefix_texts = self._texts_of(self._prefixes)

    def _stream(self, *words: int) -> np.random.Generator:
        """A generator of this run's prefixes: shared by every request of the run, drawn
        afresh by the next run (``workload``, "Seeding"), apart from every request's own."""
        run = [] if self.run is None else [self.run]
        return np.random.default_rng([self.seed, *run, *words])

    def _pool(self) -> np.ndarray:
        """The ids prefixes are drawn from: the word tokens where there is a checked table
        (so a prefix keeps one token a word beside any suffix), else the clean vocabulary."""
        if self._words is not None:
            return self._words.ids
        if self._sample_ids is not None:
            return self._sample_ids
        return _vocab(self.tokenizer).ids

    def _texts_of(self, prefixes: list[list[int]]) -> list[str]:
        if self.prompt_format == "ids":
            return ["" for _ in prefixes]
        if self._words is not None:
            by_id = dict(zip(self._words.ids.tolist(), self._words.pieces.tolist(), strict=True))
            return ["".join(by_id[i] for i in ids) for ids in prefixes]
        return [self.tokenizer.decode(ids) for ids in prefixes]

    def prefix_of(self, index: int) -> int:
        """Which prefix request ``index`` starts with."""
        rng = np.random.default_rng([self.seed, PICK_STREAM, index])
        return int(rng.integers(0, self.prefix_count))

    def prefix_texts(self) -> list[str]:
        """Each prefix's text (empty strings for ``--prompt-format ids``)."""
        self._setup()
        return list(self._prefix_texts)

    def prefix_ids(self) -> list[list[int]]:
        self._setup()
        return [list(p) for p in self._prefixes]

    def build_many(self, indices: Sequence[int], *, check_every: int = 1) -> list[Prompt]:
        self._setup()
        self.built += len(indices)
        if self.prompt_format == "ids":
            return [self._ids_prompt(i) for i in indices]
        words = self._words
        if words is None:
            return [self._slow(i) for i in indices]
        targets = [self._target(i) for i in indices]
        grow = self._content - self.input_len - self.prefix_len  # -overhead - L
        texts = [
            self._prefix_texts[self.prefix_of(i)] + words.sample(self._rng(i), t + grow)
            for i, t in zip(indices, targets, strict=True)
        ]
        if self._local:
            sample = texts[::check_every]
            counts = _count_many(self.tokenizer, sample, self.api)
            if check_every > 1:
                ok = counts == targets[::check_every]
                counts = targets if ok else _count_many(self.tokenizer, texts, self.api)
        else:
            counts = targets
        return [
            Prompt(t, self._output(i), n) if n == want else self._slow(i)
            for i, t, n, want in zip(indices, texts, counts, targets, strict=True)
        ]

    def _ids_prompt(self, index: int) -> Prompt:
        assert self._sample_ids is not None
        ids = self._sample_ids
        rng = self._rng(index)
        head = self._prefix + self._prefixes[self.prefix_of(index)]
        n = self._target(index) - len(head)
        sent = head + ids[rng.integers(0, len(ids), size=n)].tolist()
        return Prompt("", self._output(index), len(sent), sent)

    def _slow(self, index: int) -> Prompt:
        """Prefix and suffix ids moved to the exact length at their end (``converge``)."""
        tok = self.tokenizer
        rng = self._rng(index)
        target = self._target(index)
        p = self.prefix_of(index)
        vocab = _vocab(tok)
        n = target - _overhead(tok, self.api, vocab) - self.prefix_len
        suffix = vocab.ids[rng.integers(0, len(vocab.ids), size=n)].tolist()
        text, last = converge(tok, self._prefixes[p] + suffix, target, rng, self.api)
        if text is None or not text.startswith(self._prefix_texts[p]):
            raise UsageError(
                f"could not build a prompt of exactly {target} tokens that starts with "
                f"prefix {p} with this tokenizer (the last try came to {last})",
                hint="use --prompt-format ids (completions), which is exact by construction",
            )
        return Prompt(text, self._output(index), target)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "kind": "prefix",
            "prefix_len": self.prefix_len,
            "prefix_count": self.prefix_count,
            "prefix_len_counts": "content tokens after the server's own (BOS, chat template)",
            "prefix_pick": "uniform per request, seeded",
        }
