"""Exact-length prompts with no local tokenizer: the server's own ``/tokenize`` and
``/detokenize``.

On Kubernetes the weights (and so the tokenizer files) live on the cluster nodes only.
:class:`ServerTokenizer` implements ``workload.TextTokenizer`` over HTTP, so the
construction of ``workload.exact_length_prompt`` (sample ids, decode, count, correct, count
again) runs unchanged, with every count made by the server that will serve the prompt:

* ``encode`` is ``POST /tokenize {"model", "prompt", "add_special_tokens"}`` and reads
  ``"tokens"``; ``decode`` is ``POST /detokenize {"model", "tokens"}`` and reads
  ``"prompt"`` (vLLM's ``serve/tokenize/protocol.py``; the server decodes with the
  tokenizer's defaults, special tokens kept, as ``HFTokenizer.decode`` does).
* A chat prompt is counted by ``POST /tokenize {"model", "messages",
  "add_generation_prompt": true, "add_special_tokens": false}``: the server renders its own
  chat template (its ``--chat-template`` if it was given one) exactly as for
  ``/v1/chat/completions``, so no template is rendered here.

**What the server path samples from.**  The local path samples uniformly from every id of
the vocabulary that decodes alone to clean text, which takes one decode per id: cheap in
process, but one HTTP request per id through a server (150k requests for a real model).
The server path samples uniformly from the distinct ids the server's tokenizer produces for
:data:`CORPUS`, a fixed built-in text of ordinary English, numbers, code and punctuation,
less the ids the server adds on its own (BOS), each checked to decode cleanly (not blank,
no U+FFFD).  The check decodes all candidates in one ``/detokenize`` request, separated by
the one token of :data:`SEPARATOR` (a character the corpus does not contain), and splits
the text on it; if the tokenizer does not give the separator one token of its own, or the
split does not come out one piece per candidate, it falls back to one request per candidate
(hundreds, not the whole vocabulary).  The ids are common tokens of real text, so the
prompts read less like noise than the local path's, and the set depends only on the
server's tokenizer and this module: the same seed gives the same prompts from the same
server.  They are not the local path's prompts for that seed (a different set to sample
from); their server-side lengths are the same, which is what a benchmark's workload is.

**Requests.**  Once per tokenizer object (so once per worker process): about four to find
the sampleable ids and three to measure the server's own overhead.  Then each pass of the
construction costs a decode, a count and (when the count is off) a re-encode: a prompt
typically takes 2 to 9 requests.  ``requests`` counts them.

Every request has an explicit timeout.  A server that does not answer, has no
``/tokenize``, or answers with an error is a ``UsageError`` naming the URL and saying how to
do without the server's tokenizer.  The object pickles as its base URL, model name and
timeout (``RandomPrompts`` carries it to worker processes), never a connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from servebook import http
from servebook.bench.tokens import clean_piece
from servebook.errors import UsageError

FIX = "to build prompts with a local tokenizer instead, pass --tokenizer DIR (the model directory)"

#: The character whose token separates candidates in the one-request check.  Not in CORPUS.
SEPARATOR = "|"
#: Candidates decoded per /detokenize request in the check.
DECODE_BATCH = 4096

#: Ordinary text whose tokens (as the server's tokenizer splits it) are sampled.  Fixed: the
#: sampleable ids, and so the prompts of a seed, depend on it.  Changing it changes prompts.
CORPUS = """\
The morning train to the coast was late again, so we waited on the platform with coffee
and a newspaper. A woman beside us was reading about the weather: rain in the north,
sunshine in the south, and strong winds along the river valley by the afternoon.
When the train finally arrived, every seat was taken, and we stood near the door
watching fields, farms, small villages and old stone bridges pass by the window.

In the kitchen, she measured two cups of flour, one teaspoon of salt and a little sugar.
The recipe said to mix the dry ingredients first, then add warm water slowly, stirring
until the dough was smooth. After an hour it had doubled in size. She baked the bread
at 220 degrees for thirty-five minutes, until the crust was golden brown and crisp.

Scientists measured the temperature of the lake every day for twelve years. Their data
show that the water warms earlier each spring, and that the ice now melts about nine days
sooner than it did in 1990. Fish move to deeper, colder water; birds arrive earlier.
The report explains the method, the uncertainty of each measurement, and what remains
unknown about the effects on plants, insects and the animals that feed on them.

Please send the invoice to our office before Friday. The total is $1,284.50, including
tax and shipping; payment is due within 30 days. If you have any questions, call us at
555-0142 or write to the address below. Thank you for your business!

def average(values):
    # Return the mean of a non-empty list of numbers.
    total = 0
    for value in values:
        total += value
    return total / len(values)

print(average([3, 5, 8, 13, 21]))  # prints 10.0

Why do people enjoy long walks in the mountains? Some say it is the quiet, others the
view from the top, and many simply like being tired at the end of a good day. On the way
down we met a shepherd, his dog and about forty sheep crossing the path, slowly, one by
one, as if they had all the time in the world. "Where are you going?" he asked. "Home,"
we said, "before it gets dark." He laughed, pointed at the clouds and wished us luck.

History teaches that cities grow near water: ports, rivers and lakes made trade easy.
Markets, schools, libraries and hospitals followed. Today about half of the world's
population lives in cities, and that share is expected to rise to two thirds by 2050.
Planning good housing, clean air, safe streets and public transport is hard work.

Notes from the meeting: (1) the new website goes live on 14 March; (2) Maria will update
the user guide; (3) the budget for next year is approved, with 8% more for training;
(4) next meeting: Tuesday at 10:30 in room B-204. Questions? Ask Tom or Priya.

A café in the old town serves a naïve but delicious crème brûlée, and the owner, José,
likes to talk about football, music and the price of olive oil - or of anything else.
"""


class ServerTokenizer:
    """``workload.TextTokenizer`` through a vLLM server's ``/tokenize`` and ``/detokenize``
    at ``base_url`` (e.g. ``http://127.0.0.1:8000``) for the served model name ``model``;
    every request times out after ``timeout_s`` seconds."""

    def __init__(self, base_url: str, model: str, *, timeout_s: float = 10.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise UsageError(f"server tokenizer URL {base_url!r} must start with http(s)://")
        if timeout_s <= 0:
            raise UsageError(f"server tokenizer timeout must be positive (got {timeout_s})")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = float(timeout_s)
        self.requests = 0
        self._special: set[int] | None = None
        self._candidates: list[int] | None = None
        self._sampleable: list[int] | None = None

    # Pickles as its settings: a worker process asks the server again.
    def __getstate__(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "model": self.model, "timeout_s": self.timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["base_url"], state["model"], timeout_s=state["timeout_s"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"ServerTokenizer({self.base_url!r}, {self.model!r}, timeout_s={self.timeout_s})"

    @property
    def description(self) -> str:
        """What ``RandomPrompts.describe()`` records as the tokenizer."""
        return f"server /tokenize at {self.base_url} (model {self.model})"

    # --- HTTP -----------------------------------------------------------------------------

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.base_url + path
        self.requests += 1
        try:
            r = http.post_json(url, body, timeout=self.timeout_s)
        except http.HTTPError as e:
            raise UsageError(
                f"{e} (timeout {self.timeout_s:g}s): the server's tokenizer at {url} did not "
                f"answer; {FIX}"
            ) from None
        if r.status != 200:
            what = "has no such endpoint" if r.status in (404, 405) else "answered an error"
            raise UsageError(
                f"POST {url} {what} (HTTP {r.status}: {_server_message(r)}); the server's "
                f"tokenizer cannot build the prompts; {FIX}"
            )
        try:
            doc = r.json()
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise UsageError(
                f"POST {url} answered {r.text[:120]!r}, not a JSON object as vLLM's {path} "
                f"does; {FIX}"
            )
        return doc

    def _tokenize(self, body: dict[str, Any]) -> list[int]:
        doc = self._post("/tokenize", body)
        toks = doc.get("tokens")
        if not isinstance(toks, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in toks
        ):
            raise UsageError(
                f"POST {self.base_url}/tokenize answered without a token list (vLLM's "
                f'{{"tokens": [...], "count": N}}); {FIX}'
            )
        return toks

    def _chat_body(self, content: str) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "add_generation_prompt": True,
            "add_special_tokens": False,
        }

    # --- workload.TextTokenizer ---------------------------------------------------------

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return self._tokenize(
            {"model": self.model, "prompt": text, "add_special_tokens": add_special_tokens}
        )

    def decode(self, ids: Sequence[int]) -> str:
        doc = self._post("/detokenize", {"model": self.model, "tokens": [int(i) for i in ids]})
        text = doc.get("prompt")
        if not isinstance(text, str):
            raise UsageError(
                f'POST {self.base_url}/detokenize answered without a "prompt" string; {FIX}'
            )
        return text

    def special_ids(self) -> set[int]:
        """The ids the server adds to a prompt on its own (what it puts around an empty
        text, e.g. BOS).  The vocabulary's other special tokens cannot be listed over HTTP;
        they are never sampled because sampling draws from the corpus's tokens only."""
        if self._special is None:
            self._special = set(self.encode("", add_special_tokens=True))
        return set(self._special)

    @property
    def vocab_size(self) -> int:
        """A lower bound: one more than the largest id of the corpus's tokens.  (The real
        size is not served; nothing here needs it.)"""
        return max(self._corpus_ids(), default=-1) + 1

    def render_chat(self, content: str) -> str | None:
        """The server's rendering of one user message with the generation prompt, as the
        server's tokens decoded back to text.  Counting goes through
        :meth:`chat_token_count` instead, which needs no round trip through text."""
        return self.decode(self._tokenize(self._chat_body(content)))

    # --- what workload.py asks of a tokenizer that is expensive to walk --------------------

    def chat_token_count(self, content: str) -> int:
        """Prompt tokens the server counts for ``content`` as the one user message of a
        chat request (``workload.CountsChat``)."""
        return len(self._tokenize(self._chat_body(content)))

    def sampleable_ids(self) -> list[int]:
        """The corpus's token ids that decode alone to clean text, ascending
        (``workload.HasSampleIds``; module docstring: what and why)."""
        if self._sampleable is None:
            special = self.special_ids()
            candidates = [i for i in self._corpus_ids() if i not in special]
            pieces = self._decode_each(candidates)
            kept = zip(candidates, pieces, strict=True)
            self._sampleable = [i for i, s in kept if clean_piece(s)]
        return list(self._sampleable)

    def _corpus_ids(self) -> list[int]:
        if self._candidates is None:
            self._candidates = sorted(set(self.encode(CORPUS, add_special_tokens=False)))
        return self._candidates

    def _decode_each(self, ids: list[int]) -> list[str]:
        """Each id decoded alone, in few requests: ``a SEP b SEP c`` decoded once and split
        on SEP, one request per id if that does not come out one piece per id."""
        sep = self.encode(SEPARATOR, add_special_tokens=False)
        if len(sep) == 1:
            pieces: list[str] = []
            for start in range(0, len(ids), DECODE_BATCH):
                chunk = ids[start : start + DECODE_BATCH]
                joined: list[int] = []
                for i in chunk:
                    joined += [i, sep[0]]
                parts = self.decode(joined[:-1]).split(SEPARATOR)
                if len(parts) != len(chunk):
                    break
                pieces += parts
            else:
                return pieces
        return [self.decode([i]) for i in ids]


def _server_message(r: http.Response) -> str:
    """vLLM's ``{"error": {"message": ...}}``, FastAPI's ``{"detail": ...}``, or the text."""
    try:
        doc = r.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if doc.get("detail"):
            return str(doc["detail"])[:300]
    return r.text.strip()[:300] or "(empty body)"


__all__ = ["CORPUS", "SEPARATOR", "ServerTokenizer"]
