"""What the benchmark sends: prompts of an exact server-side token count, or a dataset.

**Length is the server's count.**  ``input_len`` is the number of prompt tokens the
*server* will count for the request (vLLM's ``usage.prompt_tokens``), special tokens
included: the tiny model's tokenizer adds ``<s>`` and vLLM counts it, so a 1007-token
prompt is ``<s>`` plus 1006 content tokens.  For chat requests the count is that of the
rendered chat template (vLLM renders the template, which writes its own BOS, and encodes
the result without adding special tokens again).  ``vllm bench serve --random-input-len``
counts content tokens only, so its prompts are one token longer on the server than asked.

**Construction.**  Decode->encode does not round-trip (a BPE tokenizer may merge across
the boundary of two sampled tokens, or split a sampled token), so a prompt is built from
token ids and checked by re-encoding:

1. sample ``input_len - n_special`` ids from the ordinary vocabulary (special and added
   tokens, and tokens that decode to no text or to broken UTF-8, are never sampled);
2. decode to text and count the text the server's way;
3. too many tokens: keep the first ``target`` ids *of the re-encoded text* (the text's own
   tokenization, whose prefixes are stable) minus the excess; too few: append freshly
   sampled ids; go to 2.

Every pass re-encodes, so the loop only ever moves towards the text's own tokenization and
converges in a few passes (typically 1-3).  After ``MAX_PASSES`` passes it restarts from
a fresh sample drawn from the same seeded generator, and after ``MAX_RESTARTS`` restarts
it raises ``UsageError`` naming the target length and the tokenizer: silently returning a
prompt of the wrong length is the failure this module exists to prevent.

**Without a local tokenizer** (weights on cluster nodes only) the same construction runs
through the server's own ``/tokenize`` and ``/detokenize``
(``servebook.bench.server_tokenizer.ServerTokenizer``): the counts are the server's by
definition, chat prompts are counted by ``/tokenize`` with ``messages``, and ids are
sampled from a checked, built-in set instead of the whole vocabulary (that module's
docstring says which and why).

**Fast construction (what a benchmark uses).**  Building a 1024-token prompt by the loop
above costs milliseconds (several encodes of 5 KB of text); a benchmark at thousands of
requests per second needs more.  So ``RandomPrompts`` first finds, once per tokenizer,
its *word* tokens: ids whose text is one space followed by letters (`` the``, `` house``)
and which, joined together in a long random order, re-encode to exactly one token each
(one encode checks the whole set; a tokenizer for which this fails keeps the loop above).
A pre-tokenizer that splits text at spaces (byte-level BPE, SentencePiece) cannot merge
across two such words, so any sequence of them has as many tokens as words.  A prompt is
then ``input_len - overhead`` words sampled with the prompt's seed and joined, checked
with one count of its own (batched: one ``encode_batch`` for many prompts); a prompt the
check rejects falls back to the loop.  The count is 90% of the cost, so the producer that
builds during a load counts one prompt in 16 and the whole batch when one is off: a word
table that passed its check keeps every prompt exact, and SB409 (the server's count of
every request) stands behind the sample.  Through a server's ``/tokenize`` there is no
per-prompt check (it would be HTTP during the load): the whole-set check, the argument
above, and SB409 (the server's own count of every request) stand for it.

**Token ids** (``prompt_format="ids"``, completions only): the prompt is sent as a list of
token ids, the ids the server adds on its own (BOS) followed by ids sampled from the clean
vocabulary; its length on the server is exact by construction, and nothing is tokenized.

**Building is never done in the sending loop.**  ``pregenerate`` builds a range before a
point's warm-up; the load generator (``client.py``) builds the rest in a process of its
own, ahead of need, when the source is ``producible`` (it needs no I/O: a local tokenizer,
token ids, or a verified word table); a source that is not (a server's ``/tokenize``
without a word table) sends only what was built before the point.  ``built`` counts the
prompts this object built, so a test can show none was built during a load.

**Seeding.**  Prompt ``i``'s text is drawn from ``numpy.random.default_rng([seed, run,
i])`` and its lengths from ``[seed, stream, i]``: the same seed and run give the same
prompts, in any order, from any worker process.  ``run`` is drawn afresh by each
invocation of a sweep (``sweep.prompt_run``) and kept by ``--resume``; a sweep numbers its
requests ``i = position x 10**7 + attempt x 10**6 + n`` by the point's place in it and
how often it ran before (``protocol.run_point``), so no prompt is sent twice, in a point,
a repetition, a point run again or a second ``bench`` on a warm deployment: what is
measured is never the server's prefix cache (issue 32, finding 2) unless the workload says
its prompts share prefixes (``shares_prefixes``).  Every prompt is distinct random
text, so no prompt hits another's prefix cache (except the template's first tokens,
``shared_lead_tokens``).

**Datasets** (JSONL, ShareGPT, traces) are read in ``bench.datasets``; a dataset of text
prompts is a ``DatasetPrompts``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import numpy as np

from servebook.bench.lengths import FIXED, INPUT_STREAM, OUTPUT_STREAM, LengthDist
from servebook.bench.tokens import (  # the tokenizer side, re-exported for its users
    Api,
    HasSampleIds,
    TextTokenizer,
    Words,
    _overhead,
    _vocab,
    exact_length_prompt,
    load_tokenizer,
    server_token_count,
    word_table,
)
from servebook.errors import UsageError

PromptFormat = Literal["text", "ids"]


@dataclass(frozen=True)
class Prompt:
    """One request's input.  ``prompt_tokens`` is the server-side count when known
    (``None`` for dataset prompts read without a tokenizer).  ``token_ids``, when set, is
    sent as the prompt instead of ``text`` (``--prompt-format ids``)."""

    text: str
    output_len: int
    prompt_tokens: int | None = None
    token_ids: list[int] | None = field(default=None, compare=False)


class PromptSource(Protocol):
    """Prompt ``i`` of a run, deterministic in ``i``.  Picklable, so a worker process can
    rebuild it (the tokenizer is loaded lazily in each process)."""

    def get(self, index: int) -> Prompt: ...

    def describe(self) -> dict[str, Any]: ...


@runtime_checkable
class BuildsPrompts(Protocol):
    """A source whose prompts cost work to make (``RandomPrompts``), as opposed to one that
    only looks them up (``DatasetPrompts``).  The load generator never calls ``get`` on it
    during a load: it sends what ``pregenerate`` built before the point, and what another
    process builds with ``build_many`` meanwhile when ``producible``."""

    built: int

    @property
    def producible(self) -> bool: ...

    def cached(self, index: int) -> Prompt | None: ...

    def build_many(self, indices: Sequence[int], *, check_every: int = 1) -> list[Prompt]: ...

    def pregenerate(self, indices: Sequence[int]) -> None: ...

    def detached(self) -> BuildsPrompts: ...


BATCH = 256
# How a sweep's prompts are drawn, in the words its provenance records.
SEEDING = (
    "text of request n of the point at place k in the sweep, run for the a-th time before: "
    "numpy default_rng([seed, run, k x 10**7 + a x 10**6 + n]); lengths: default_rng([seed, "
    "stream, that index]); run: drawn by each invocation, kept by --resume"
)


class RandomPrompts:
    """Random prompts of exactly ``input_len`` server-side tokens, ``output_len`` output
    tokens each (sent with ``ignore_eos``), as text (the default) or as token ids
    (``prompt_format="ids"``, completions only).

    ``tokenizer`` is the model directory (loaded lazily in each process), or a tokenizer
    object that pickles by its settings, such as
    :class:`servebook.bench.server_tokenizer.ServerTokenizer` (the server's own
    ``/tokenize`` and ``/detokenize``, for when the weights are on the cluster only).  What
    a prompt is built from (the word table, the ids to sample, the server's own tokens) is
    worked out once, pickles with the object, and so needs no tokenizer in a process that
    receives it unless prompts are checked there (a local tokenizer)."""

    def __init__(
        self,
        tokenizer: str | Path | TextTokenizer,
        *,
        input_len: int,
        output_len: int,
        seed: int,
        api: Api = "completions",
        prompt_format: PromptFormat = "text",
        input_dist: LengthDist = FIXED,
        output_dist: LengthDist = FIXED,
        run: int | None = None,
    ) -> None:
        if input_len < 1 or output_len < 1:
            raise UsageError(
                f"--input-len and --output-len must be at least 1 (got {input_len}, {output_len})"
            )
        if prompt_format not in get_args(PromptFormat):
            raise UsageError(f"--prompt-format {prompt_format!r}: choose text or ids")
        if prompt_format == "ids" and api != "completions":
            raise UsageError(
                "--prompt-format ids sends token ids, which only the completions API takes; "
                "use --api completions, or --prompt-format text for chat"
            )
        self.tokenizer_dir: str | None = None
        self._given: TextTokenizer | None = None
        if isinstance(tokenizer, str | Path):
            self.tokenizer_dir = str(tokenizer)
        else:
            self._given = tokenizer
        self.input_len = input_len
        self.output_len = output_len
        self.seed = seed
        self.run = run
        self.api: Api = api
        self.prompt_format: PromptFormat = prompt_format
        self.input_dist, self.output_dist = input_dist, output_dist
        self.built = 0
        self._tok: TextTokenizer | None = self._given
        self._cache: dict[int, Prompt] = {}
        self._ready = False
        self._words: Words | None = None
        self._sample_ids: np.ndarray | None = None
        self._prefix: list[int] = []
        self._content = 0
        self._overhead = 0
        self._least = 1  # the shortest prompt the server can count as built here

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # A Rust tokenizer does not travel; each process loads its own.  A given tokenizer
        # object (a server's /tokenize) travels as its settings.
        state["_tok"] = self._given
        return state

    @property
    def tokenizer(self) -> TextTokenizer:
        if self._tok is None:
            assert self.tokenizer_dir is not None
            self._tok = load_tokenizer(self.tokenizer_dir)
        return self._tok

    @property
    def _local(self) -> bool:
        """Counting is in-process (not a server's /tokenize): each prompt is checked."""
        return not isinstance(self.tokenizer, HasSampleIds)

    def _setup(self) -> None:
        """What prompts are built from, worked out once (module docstring)."""
        if self._ready:
            return
        tok = self.tokenizer
        vocab = _vocab(tok)
        overhead = _overhead(tok, self.api, vocab)
        self._overhead = overhead
        self._content = self.input_len - overhead
        if self.prompt_format == "ids":
            if self._content < 0:
                raise UsageError(
                    f"input length {self.input_len} is too short: the server adds {overhead} "
                    f"token(s) of its own to every prompt (BOS), so the least is {overhead}"
                )
            self._prefix = [int(i) for i in tok.encode("", add_special_tokens=True)]
            self._content = self.input_len - len(self._prefix)
            self._sample_ids = vocab.ids
            self._least = len(self._prefix)
        elif self._content >= 1:
            self._words = word_table(tok, self.api)
        if self.prompt_format == "text":
            self._least = overhead + 1
        self._ready = True

    @property
    def producible(self) -> bool:
        """Whether more prompts can be built during a load, in another process, with no
        I/O: not through a server's /tokenize without a word table (module docstring)."""
        self._setup()
        return (
            self.tokenizer_dir is not None
            or self.prompt_format == "ids"
            or self._words is not None
            or self._local
        )

    def cached(self, index: int) -> Prompt | None:
        return self._cache.get(index)

    def get(self, index: int) -> Prompt:
        p = self._cache.get(index)
        if p is None:
            (p,) = self.build_many([index])
            self._cache[index] = p
        return p

    def pregenerate(self, indices: Sequence[int]) -> None:
        """Build prompts ahead of the load so the sending loop does no tokenizer work."""
        todo = [i for i in indices if i not in self._cache]
        for start in range(0, len(todo), BATCH):
            chunk = todo[start : start + BATCH]
            for i, p in zip(chunk, self.build_many(chunk), strict=True):
                self._cache[i] = p

    def detached(self) -> RandomPrompts:
        """This source without the prompts it holds: what a producer process needs."""
        clone = copy.copy(self)
        clone._cache = {}
        clone.built = 0
        return clone

    def build_many(self, indices: Sequence[int], *, check_every: int = 1) -> list[Prompt]:
        """Prompts ``indices``, built now (not cached): one sample each from its own seed,
        and one batched count for all of them where counting is local.  With
        ``check_every = k > 1`` (the producer during a load, where the count is 90% of the
        cost) one prompt in ``k`` is counted, and all of them when any of those is off."""
        self._setup()
        self.built += len(indices)
        if self.prompt_format == "ids":
            assert self._sample_ids is not None
            ids = self._sample_ids
            out = []
            for i in indices:
                rng = self._rng(i)
                n = self._target(i) - len(self._prefix)
                content = ids[rng.integers(0, len(ids), size=n)].tolist()
                sent = self._prefix + content
                out.append(Prompt("", self._output(i), len(sent), sent))
            return out
        words = self._words
        if words is None:
            return [self._slow(i) for i in indices]
        targets = [self._target(i) for i in indices]
        grow = self._content - self.input_len  # -overhead
        texts = [
            words.sample(self._rng(i), t + grow) for i, t in zip(indices, targets, strict=True)
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

    # Random prompts share no prefix: a point whose engines find much of them in their
    # prefix caches measured a cache, not the deployment (SB412).
    shares_prefixes: bool | None = False

    def _rng(self, index: int) -> np.random.Generator:
        """Prompt ``index``'s text's generator (module docstring, "Seeding")."""
        words = [self.seed, index] if self.run is None else [self.seed, self.run, index]
        return np.random.default_rng(words)

    def shared_lead_tokens(self) -> int:
        """At most the tokens every prompt starts with (the chat template's, a BOS), which
        any prefix cache may hold from a request before: the server's own tokens, of
        which some may come after the prompt (an upper bound)."""
        self._setup()
        return self._overhead

    def _target(self, index: int) -> int:
        """Prompt ``index``'s length: ``input_len``, or drawn from ``input_dist`` (never
        below the least prompt built here: the server's own tokens and one more)."""
        n = self.input_dist.draw(self.input_len, self.seed, INPUT_STREAM, index)
        return n if self.input_dist.kind == "fixed" else max(n, self._least)

    def _output(self, index: int) -> int:
        return self.output_dist.draw(self.output_len, self.seed, OUTPUT_STREAM, index)

    def _slow(self, index: int) -> Prompt:
        rng = self._rng(index)
        target = self._target(index)
        text = exact_length_prompt(self.tokenizer, target, rng, self.api)
        return Prompt(text, self._output(index), target)

    def describe(self) -> dict[str, Any]:
        if self.tokenizer_dir is not None:
            which = self.tokenizer_dir
        else:
            which = str(getattr(self._given, "description", type(self._given).__name__))
        return {
            "kind": "random",
            "tokenizer": which,
            "input_len": self.input_len,
            "input_len_counts": "server-side prompt tokens, special tokens included",
            "output_len": self.output_len,
            "seed": self.seed,
            **({} if self.run is None else {"run": self.run, "seeding": SEEDING}),
            "api": self.api,
            "prompt_format": self.prompt_format,
            **self._dists(),
        }

    def _dists(self) -> dict[str, str]:
        """The length distributions, when not fixed (a fixed run records what it did)."""
        d = {}
        if self.input_dist != FIXED:
            d["input_len_dist"] = self.input_dist.describe()
        if self.output_dist != FIXED:
            d["output_len_dist"] = self.output_dist.describe()
        return d


def known_lengths(prompts: Sequence[Prompt]) -> list[int] | None:
    """Each prompt's server-side length, the whole cycle a sweep sends of a file's prompts
    (``prompt_lengths`` of a dataset or trace); None while any is unknown (read without a
    tokenizer)."""
    lengths = [p.prompt_tokens for p in prompts]
    return None if None in lengths else [n for n in lengths if n is not None]


def handoff_lengths(prompts: PromptSource, input_len: int) -> list[int]:
    """The prompt lengths a PD handoff's threshold is for (SB407): a dataset's or trace's
    own (``prompt_lengths``: its 83-token prompts are not ``--input-len``'s default 1024,
    issue 43), else ``input_len``."""
    listed = getattr(prompts, "prompt_lengths", None)
    lengths = listed() if listed is not None else None
    return lengths or [input_len]


def _count_many(tok: TextTokenizer, texts: Sequence[str], api: Api) -> list[int]:
    """Server-side counts of many prompts: one batched encode where the tokenizer has one."""
    many = getattr(tok, "count_many", None)
    if api == "completions" and many is not None:
        return list(many(texts, add_special_tokens=True))
    return [server_token_count(tok, t, api) for t in texts]


class DatasetPrompts:
    """Prompts from a JSONL file, cycled in file order (prompt ``i`` is line ``i mod n``).
    A run longer than the file repeats prompts, which the server's prefix cache will
    notice; ``describe()`` records the file's size so a reader can tell."""

    def __init__(self, prompts: Sequence[Prompt], path: str, sha256: str) -> None:
        if not prompts:
            raise UsageError(f"{path}: no prompts in the dataset")
        self.prompts = list(prompts)
        self.path = path
        self.sha256 = sha256

    # A file's prompts are what they are: whether they share prefixes, and a run longer than
    # the file repeats them, so a cache hit is not judged (SB412); its share is recorded.
    shares_prefixes: bool | None = None

    def get(self, index: int) -> Prompt:
        return self.prompts[index % len(self.prompts)]

    def prompt_lengths(self) -> list[int] | None:
        return known_lengths(self.prompts)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "dataset",
            "path": self.path,
            "sha256": self.sha256,
            "n": len(self.prompts),
            "prompt_format": "text",
        }
