"""The tokenizer side of building prompts: the server's own count of a prompt
(``server_token_count``), the tokenizer's clean vocabulary and word table, and the
exact-length convergence (``exact_length_prompt``, ``converge``) that random, prefix and
trace prompts all use.  How and why is in ``bench.workload``'s docstring ("Exact length")."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from servebook.errors import UsageError

Api = Literal["completions", "chat"]

MAX_PASSES = 16
MAX_RESTARTS = 8


class TextTokenizer(Protocol):
    """What workload generation needs from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def special_ids(self) -> set[int]: ...

    def render_chat(self, content: str) -> str | None:
        """The chat template rendered for one user message with the generation prompt;
        ``None`` when the tokenizer has no chat template."""
        ...


class HFTokenizer:
    """A tokenizer directory: ``tokenizer.json`` through the ``tokenizers`` library (fast,
    no transformers import), or any directory ``transformers.AutoTokenizer`` loads.  The
    chat template, when needed, is rendered with transformers."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fast: Any = None
        self._auto: Any = None
        tj = self.path / "tokenizer.json" if self.path.is_dir() else self.path
        if tj.is_file() and tj.name.endswith(".json"):
            from tokenizers import Tokenizer

            try:
                self._fast = Tokenizer.from_file(str(tj))
            except Exception as e:
                raise UsageError(f"{tj}: not a tokenizers file: {e}") from None
        else:
            self._auto = self._load_auto(
                "no tokenizer.json, and transformers is not installed to load another "
                "tokenizer format"
            )

    def _load_auto(self, why: str) -> Any:
        """transformers' tokenizer of ``self.path``; ``why`` says what needs it, should
        transformers be missing."""
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise UsageError(f"{self.path}: {why} (pip install transformers)") from None
        try:
            return AutoTokenizer.from_pretrained(str(self.path))
        except Exception as e:
            raise UsageError(f"{self.path}: transformers could not load a tokenizer: {e}") from None

    @property
    def vocab_size(self) -> int:
        if self._fast is not None:
            return int(self._fast.get_vocab_size(with_added_tokens=True))
        return len(self._auto)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        if self._fast is not None:
            return list(self._fast.encode(text, add_special_tokens=add_special_tokens).ids)
        return list(self._auto.encode(text, add_special_tokens=add_special_tokens))

    def count_many(self, texts: Sequence[str], *, add_special_tokens: bool) -> list[int]:
        """Token counts of many texts in one call (the Rust tokenizer batches them)."""
        if self._fast is not None:
            enc = getattr(self._fast, "encode_batch_fast", self._fast.encode_batch)
            return [len(e.ids) for e in enc(list(texts), add_special_tokens=add_special_tokens)]
        ids = self._auto(list(texts), add_special_tokens=add_special_tokens)["input_ids"]
        return [len(x) for x in ids]

    def decode(self, ids: Sequence[int]) -> str:
        if self._fast is not None:
            return str(self._fast.decode(list(ids), skip_special_tokens=False))
        return str(self._auto.decode(list(ids), skip_special_tokens=False))

    def special_ids(self) -> set[int]:
        if self._fast is not None:
            return {int(i) for i in self._fast.get_added_tokens_decoder()}
        return set(int(i) for i in self._auto.all_special_ids) | {
            int(i) for i in getattr(self._auto, "added_tokens_decoder", {})
        }

    def render_chat(self, content: str) -> str | None:
        if self._auto is None:
            self._auto = self._load_auto(
                "a chat prompt is counted with the model's chat template, which transformers "
                "renders, and transformers is not installed"
            )
        if not getattr(self._auto, "chat_template", None):
            return None
        return str(
            self._auto.apply_chat_template(
                [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
            )
        )


@runtime_checkable
class CountsChat(Protocol):
    """A tokenizer that counts a chat prompt itself (the server's ``/tokenize`` with
    ``messages``) instead of rendering the chat template here."""

    def chat_token_count(self, content: str) -> int: ...


@runtime_checkable
class HasSampleIds(Protocol):
    """A tokenizer that names the ids prompts are sampled from (already checked to decode
    cleanly), for tokenizers where decoding the whole vocabulary id by id is too slow."""

    def sampleable_ids(self) -> list[int]: ...


def load_tokenizer(path: str | Path) -> HFTokenizer:
    p = Path(path)
    if not p.exists():
        raise UsageError(f"tokenizer path {p} does not exist (pass the model directory)")
    return HFTokenizer(p)


def server_token_count(tok: TextTokenizer, text: str, api: Api = "completions") -> int:
    """Prompt tokens the server counts for ``text`` sent as a completion prompt or as the
    one user message of a chat request."""
    if api == "completions":
        return len(tok.encode(text, add_special_tokens=True))
    if isinstance(tok, CountsChat):
        return tok.chat_token_count(text)
    rendered = tok.render_chat(text)
    if rendered is None:
        raise UsageError(
            "chat requests need the tokenizer's chat template to count prompt tokens, and "
            "this tokenizer has none; use --api completions or a model with a chat template"
        )
    return len(tok.encode(rendered, add_special_tokens=False))


@dataclass
class _Vocab:
    """Ids that are safe to sample: ordinary tokens whose text decodes cleanly (and that
    text, when it was decoded here)."""

    ids: np.ndarray
    overhead: dict[str, int] = field(default_factory=dict)
    pieces: list[str] | None = None
    words: dict[str, Words | None] = field(default_factory=dict)


_VOCAB_CACHE: weakref.WeakKeyDictionary[Any, _Vocab] = weakref.WeakKeyDictionary()


def _vocab(tok: TextTokenizer) -> _Vocab:
    cached = _VOCAB_CACHE.get(tok)
    if cached is not None:
        return cached
    pieces: list[str] | None = None
    if isinstance(tok, HasSampleIds):
        special = tok.special_ids()
        ok = [i for i in tok.sampleable_ids() if i not in special]
    else:
        ok, pieces = _clean_vocab_ids(tok)
    if len(ok) < 16:
        raise UsageError("tokenizer has fewer than 16 ordinary tokens to sample prompts from")
    v = _Vocab(np.asarray(ok, dtype=np.int64), pieces=pieces)
    _VOCAB_CACHE[tok] = v
    return v


def clean_piece(s: str) -> bool:
    """Whether one token's text may be sampled: not blank, and whole characters.  Byte-level
    pieces of multi-byte characters decode to U+FFFD alone; sampled next to each other they
    make text whose length in tokens is unpredictable."""
    return bool(s.strip()) and "\ufffd" not in s


def _clean_vocab_ids(tok: TextTokenizer) -> tuple[list[int], list[str]]:
    """Every id of the vocabulary that decodes, alone, to clean text (one decode per id),
    with that text."""
    special = tok.special_ids()
    ok: list[int] = []
    pieces: list[str] = []
    for i in range(tok.vocab_size):
        if i in special:
            continue
        piece = tok.decode([i])
        if clean_piece(piece):
            ok.append(i)
            pieces.append(piece)
    return ok, pieces


#: Separates pieces when many ids are decoded in one call (``decode_each``).
_SEPARATOR = "|"


def decode_each(tok: TextTokenizer, ids: Sequence[int]) -> list[str]:
    """Each id decoded alone, in one call when the tokenizer gives ``|`` a token of its
    own (``a | b | c`` decoded once and split), else one call per id."""
    sep = tok.encode(_SEPARATOR, add_special_tokens=False)
    if len(sep) == 1 and ids:
        joined: list[int] = []
        for i in ids:
            joined += [int(i), sep[0]]
        parts = tok.decode(joined[:-1]).split(_SEPARATOR)
        if len(parts) == len(ids):
            return parts
    return [tok.decode([int(i)]) for i in ids]


@dataclass(frozen=True)
class Words:
    """Word tokens (module docstring, "fast construction") and their text."""

    ids: np.ndarray
    pieces: np.ndarray  # dtype object: str

    def sample(self, rng: np.random.Generator, n: int) -> str:
        return "".join(self.pieces[rng.integers(0, len(self.pieces), size=n)].tolist())


MIN_WORDS = 64


def is_word(piece: str) -> bool:
    return len(piece) > 1 and piece[0] == " " and piece[1:].isalpha()


def word_table(tok: TextTokenizer, api: Api = "completions") -> Words | None:
    """The tokenizer's word tokens, checked by one count of all of them joined in a seeded
    random order (``None`` when there are too few, or when they do not keep one token each
    in a sequence: then prompts come from ``exact_length_prompt``)."""
    vocab = _vocab(tok)
    if api in vocab.words:
        return vocab.words[api]
    table: Words | None = None
    pieces = vocab.pieces if vocab.pieces is not None else decode_each(tok, vocab.ids.tolist())
    pairs = [(int(i), p) for i, p in zip(vocab.ids.tolist(), pieces, strict=True) if is_word(p)]
    if len(pairs) >= MIN_WORDS:
        order = np.random.default_rng(0x5B11).permutation(len(pairs))
        text = "".join(pairs[k][1] for k in order)
        overhead = _overhead(tok, api, vocab)
        if server_token_count(tok, text, api) == len(pairs) + overhead:
            table = Words(
                np.asarray([i for i, _ in pairs], dtype=np.int64),
                np.asarray([p for _, p in pairs], dtype=object),
            )
    vocab.words[api] = table
    return table


def _overhead(tok: TextTokenizer, api: Api, vocab: _Vocab) -> int:
    """Server-counted tokens a prompt has beyond its content (BOS; the chat template)."""
    if api not in vocab.overhead:
        probe = tok.decode([int(vocab.ids[0])])
        vocab.overhead[api] = server_token_count(tok, probe, api) - len(
            tok.encode(probe, add_special_tokens=False)
        )
    return vocab.overhead[api]


def exact_length_prompt(
    tok: TextTokenizer, target: int, rng: np.random.Generator, api: Api = "completions"
) -> str:
    """Random text that the server counts as exactly ``target`` prompt tokens (module
    docstring: how it converges, and that it raises rather than return a wrong length)."""
    vocab = _vocab(tok)
    overhead = _overhead(tok, api, vocab)
    content = target - overhead
    if content == 0 and server_token_count(tok, "", api) == target:
        # The only prompt the server counts as just its own tokens is the empty text.
        return ""
    if content < 1:
        raise UsageError(
            f"input length {target} is too short: the server adds {overhead} token(s) of its "
            f"own to every {api} prompt (BOS / chat template), so the least is {overhead}"
        )
    last = -1
    for _ in range(MAX_RESTARTS):
        ids = vocab.ids[rng.integers(0, len(vocab.ids), size=content)].tolist()
        text, last = converge(tok, ids, target, rng, api)
        if text is not None:
            return text
    raise UsageError(
        f"could not build a prompt of exactly {target} tokens with this tokenizer "
        f"({MAX_RESTARTS} fresh samples of {MAX_PASSES} passes each; the last came to "
        f"{last}). The tokenizer does not let decoded text keep its length; use --dataset "
        "with prompts of known length instead."
    )


def converge(
    tok: TextTokenizer, ids: list[int], target: int, rng: np.random.Generator, api: Api
) -> tuple[str | None, int]:
    """Content ``ids`` moved to text the server counts as ``target`` tokens (module
    docstring, steps 2-3): trimmed or extended at the end only, so their beginning stays;
    ``(None, last count)`` after ``MAX_PASSES`` passes."""
    vocab = _vocab(tok)
    last = -1
    for _ in range(MAX_PASSES):
        text = tok.decode(ids)
        last = server_token_count(tok, text, api)
        if last == target:
            return text, last
        own = tok.encode(text, add_special_tokens=False)
        if last > target:
            ids = own[: max(1, len(own) - (last - target))]
        else:
            extra = vocab.ids[rng.integers(0, len(vocab.ids), size=target - last)]
            ids = own + extra.tolist()
    return None, last
