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

**Seeding.**  Prompt ``i`` of a workload is drawn from ``numpy.random.default_rng([seed,
i])``: the same seed gives the same prompts, in any order, from any worker process.  Every
prompt is distinct random text, so no prompt hits another's prefix cache (except the BOS).

**Dataset mode** reads JSONL: one object per line with ``"prompt"`` (a string) and an
optional ``"output_len"`` (a positive integer); blank lines are skipped.  A bad line is a
``UsageError`` naming the file and line.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from servebook.findings import UsageError

Api = Literal["completions", "chat"]

MAX_PASSES = 16
MAX_RESTARTS = 8


@dataclass(frozen=True)
class Prompt:
    """One request's input.  ``prompt_tokens`` is the server-side count when known
    (``None`` for dataset prompts read without a tokenizer)."""

    text: str
    output_len: int
    prompt_tokens: int | None = None


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
            self._auto = self._load_auto()

    def _load_auto(self) -> Any:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise UsageError(
                f"{self.path}: no tokenizer.json, and transformers is not installed to "
                "load another tokenizer format (pip install transformers)"
            ) from None
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
            self._auto = self._load_auto()
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
    """Ids that are safe to sample: ordinary tokens whose text decodes cleanly."""

    ids: np.ndarray
    overhead: dict[str, int] = field(default_factory=dict)


_VOCAB_CACHE: weakref.WeakKeyDictionary[Any, _Vocab] = weakref.WeakKeyDictionary()


def _vocab(tok: TextTokenizer) -> _Vocab:
    cached = _VOCAB_CACHE.get(tok)
    if cached is not None:
        return cached
    if isinstance(tok, HasSampleIds):
        special = tok.special_ids()
        ok = [i for i in tok.sampleable_ids() if i not in special]
    else:
        ok = _clean_vocab_ids(tok)
    if len(ok) < 16:
        raise UsageError("tokenizer has fewer than 16 ordinary tokens to sample prompts from")
    v = _Vocab(np.asarray(ok, dtype=np.int64))
    _VOCAB_CACHE[tok] = v
    return v


def clean_piece(s: str) -> bool:
    """Whether one token's text may be sampled: not blank, and whole characters.  Byte-level
    pieces of multi-byte characters decode to U+FFFD alone; sampled next to each other they
    make text whose length in tokens is unpredictable."""
    return bool(s.strip()) and "\ufffd" not in s


def _clean_vocab_ids(tok: TextTokenizer) -> list[int]:
    """Every id of the vocabulary that decodes, alone, to clean text (one decode per id)."""
    special = tok.special_ids()
    ok = []
    for i in range(tok.vocab_size):
        if i in special:
            continue
        if clean_piece(tok.decode([i])):
            ok.append(i)
    return ok


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
        for _ in range(MAX_PASSES):
            text = tok.decode(ids)
            last = server_token_count(tok, text, api)
            if last == target:
                return text
            own = tok.encode(text, add_special_tokens=False)
            if last > target:
                ids = own[: max(1, len(own) - (last - target))]
            else:
                extra = vocab.ids[rng.integers(0, len(vocab.ids), size=target - last)]
                ids = own + extra.tolist()
    raise UsageError(
        f"could not build a prompt of exactly {target} tokens with this tokenizer "
        f"({MAX_RESTARTS} fresh samples of {MAX_PASSES} passes each; the last came to "
        f"{last}). The tokenizer does not let decoded text keep its length; use --dataset "
        "with prompts of known length instead."
    )


class PromptSource(Protocol):
    """Prompt ``i`` of a run, deterministic in ``i``.  Picklable, so a worker process can
    rebuild it (the tokenizer is loaded lazily in each process)."""

    def get(self, index: int) -> Prompt: ...

    def describe(self) -> dict[str, Any]: ...


class RandomPrompts:
    """Random prompts of exactly ``input_len`` server-side tokens, ``output_len`` output
    tokens each (sent with ``ignore_eos``).

    ``tokenizer`` is the model directory (loaded lazily in each process), or a tokenizer
    object that pickles by its settings, such as
    :class:`servebook.bench.server_tokenizer.ServerTokenizer` (the server's own
    ``/tokenize`` and ``/detokenize``, for when the weights are on the cluster only)."""

    def __init__(
        self,
        tokenizer: str | Path | TextTokenizer,
        *,
        input_len: int,
        output_len: int,
        seed: int,
        api: Api = "completions",
    ) -> None:
        if input_len < 1 or output_len < 1:
            raise UsageError(
                f"--input-len and --output-len must be at least 1 (got {input_len}, {output_len})"
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
        self.api: Api = api
        self._tok: TextTokenizer | None = self._given
        self._cache: dict[int, Prompt] = {}

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

    def get(self, index: int) -> Prompt:
        p = self._cache.get(index)
        if p is None:
            rng = np.random.default_rng([self.seed, index])
            text = exact_length_prompt(self.tokenizer, self.input_len, rng, self.api)
            p = Prompt(text, self.output_len, self.input_len)
            self._cache[index] = p
        return p

    def pregenerate(self, indices: range) -> None:
        """Build prompts ahead of the load so the sending loop does no tokenizer work."""
        for i in indices:
            self.get(i)

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
            "api": self.api,
        }


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

    def get(self, index: int) -> Prompt:
        return self.prompts[index % len(self.prompts)]

    def describe(self) -> dict[str, Any]:
        return {"kind": "dataset", "path": self.path, "sha256": self.sha256, "n": len(self.prompts)}


def load_dataset(
    path: str | Path,
    *,
    default_output_len: int,
    tokenizer: TextTokenizer | None = None,
    api: Api = "completions",
) -> DatasetPrompts:
    """Read a JSONL dataset; with a tokenizer each prompt's server-side length is recorded."""
    import hashlib

    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise UsageError(f"{p}: cannot read the dataset: {e.strerror or e}") from None
    prompts: list[Prompt] = []
    for lineno, line in enumerate(raw.decode("utf-8", "replace").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{where}: not JSON ({e.msg}); each line must be one object") from None
        if not isinstance(obj, dict):
            raise UsageError(f'{where}: expected an object with a "prompt", got {obj!r:.60}')
        text = obj.get("prompt")
        if not isinstance(text, str) or not text:
            raise UsageError(f'{where}: "prompt" must be a non-empty string')
        out = obj.get("output_len", default_output_len)
        if isinstance(out, bool) or not isinstance(out, int) or out < 1:
            raise UsageError(f'{where}: "output_len" must be a positive integer, got {out!r}')
        n = server_token_count(tokenizer, text, api) if tokenizer is not None else None
        prompts.append(Prompt(text, out, n))
    return DatasetPrompts(prompts, str(p), hashlib.sha256(raw).hexdigest())
