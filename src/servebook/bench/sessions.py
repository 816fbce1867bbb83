"""Conversations (``--multi-turn``): each later turn carries the conversation so far, the
replies the server actually gave included, as chat messages.

**Synthetic sessions** (``--multi-turn --turns N --turn-delay D``): every turn's new user
message is a random prompt of ``--input-len`` tokens (``workload.RandomPrompts``, or
``prefixes.PrefixPrompts`` with shared prefixes), built like any other prompt: before the
point or by the producer, never in the sending loop.  **ShareGPT sessions**
(``--dataset F --multi-turn``): a conversation's human turns are its user messages (a
leading system turn is the first message; the dataset's own replies are not sent: the
server's are), at most ``--turns`` of them when given.

**Where a conversation runs.**  A conversation is sent by one slot of one load agent,
turn after turn (``client.Worker``): the next turn leaves when the previous reply has
ended and ``--turn-delay`` has passed, so its messages can hold that reply.  An agent's
requests are the indices ``offset + agent + k x agents`` (as for any workload), and its
``j``-th conversation takes ``k`` in ``[j x stride, (j + 1) x stride)``: turn ``t`` is
request ``offset + agent + (j x stride + t) x agents``; ``stride`` is the most turns a
conversation has.  So the prompts a producer builds ahead, in the agent's order, are its
conversations' turns in order.  A turn that fails ends its conversation (there is no
reply to carry); the slot starts the next.

**What a turn's length is.**  The first turn of a synthetic session is exactly
``--input-len`` tokens as the server counts it (SB409 checks it); a later turn is the
history plus its own message, whose length depends on the replies, so it is not stated
and not checked.  TTFT is reported per turn (``ttft_ms_by_turn``): a later turn's
prefill finds the earlier turns in the server's prefix cache.

**Turn delay and the closed loop.**  A slot waiting out ``--turn-delay`` is its
conversation's, as a user thinking is: the time counts towards the achieved concurrency
(``figures.achieved_concurrency``), so the level is the number of conversations in
flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from servebook.bench.datasets import Dataset
from servebook.bench.workload import (
    BuildsPrompts,
    Prompt,
    PromptSource,
    TextTokenizer,
)
from servebook.errors import UsageError

Message = dict[str, str]


@runtime_checkable
class Sessions(Protocol):
    """A workload of conversations (module docstring)."""

    stride: int
    turn_delay_s: float

    def turns_of(self, conversation: int) -> int: ...

    def opening(self, conversation: int) -> list[Message]:
        """Messages before the first user turn (a system turn)."""
        ...

    def turn(self, conversation: int, t: int) -> Prompt | None:
        """Turn ``t``'s user message when it is looked up (a dataset); ``None``: it is the
        request's prompt from the feed (a synthetic session)."""
        ...


def turn_index(offset: int, agent: int, agents: int, stride: int, j: int, t: int) -> int:
    """Request index of turn ``t`` of an agent's ``j``-th conversation (module docstring)."""
    return offset + agent + (j * stride + t) * agents


class SyntheticSessions:
    """Conversations of ``turns`` turns whose user messages are ``inner``'s prompts."""

    #: A later turn repeats the conversation so far: prefix-cache hits are its point.
    shares_prefixes: bool | None = True

    def __init__(self, inner: BuildsPrompts, *, turns: int, turn_delay_s: float) -> None:
        check_turns(turns, turn_delay_s)
        self.inner = inner
        self.stride = turns
        self.turn_delay_s = turn_delay_s

    # What the load generator asks of a source that builds prompts: the inner one's.
    @property
    def built(self) -> int:
        return self.inner.built

    @property
    def producible(self) -> bool:
        return self.inner.producible

    def cached(self, index: int) -> Prompt | None:
        return self.inner.cached(index)

    def build_many(self, indices: Sequence[int], *, check_every: int = 1) -> list[Prompt]:
        return self.inner.build_many(indices, check_every=check_every)

    def pregenerate(self, indices: Sequence[int]) -> None:
        self.inner.pregenerate(indices)

    def detached(self) -> SyntheticSessions:
        return SyntheticSessions(
            self.inner.detached(), turns=self.stride, turn_delay_s=self.turn_delay_s
        )

    def get(self, index: int) -> Prompt:
        return self.inner.get(index)  # type: ignore[attr-defined]

    def turns_of(self, conversation: int) -> int:
        return self.stride

    def opening(self, conversation: int) -> list[Message]:
        return []

    def turn(self, conversation: int, t: int) -> Prompt | None:
        return None

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = self.inner.describe()  # type: ignore[attr-defined]
        return {**d, **_described(self.stride, self.turn_delay_s, "random prompts")}


@dataclass(frozen=True)
class Conversation:
    system: str | None
    users: list[Prompt]


class DatasetSessions:
    """A ShareGPT file's conversations (module docstring); conversation ``g`` is the
    file's ``g mod n``-th."""

    shares_prefixes: bool | None = True

    def __init__(
        self,
        conversations: list[Conversation],
        dataset: Dataset,
        *,
        turns: int | None,
        turn_delay_s: float,
    ) -> None:
        check_turns(turns if turns is not None else 1, turn_delay_s)
        if not conversations:
            raise UsageError(f"{dataset.path}: no conversation with a human turn")
        self.conversations = conversations
        self.dataset = dataset
        self.max_turns = turns
        self.stride = max(len(c.users) for c in conversations)
        self.turn_delay_s = turn_delay_s

    def _conv(self, conversation: int) -> Conversation:
        return self.conversations[conversation % len(self.conversations)]

    def get(self, index: int) -> Prompt:
        return self._conv(index).users[0]

    def turns_of(self, conversation: int) -> int:
        return len(self._conv(conversation).users)

    def opening(self, conversation: int) -> list[Message]:
        system = self._conv(conversation).system
        return [{"role": "system", "content": system}] if system else []

    def turn(self, conversation: int, t: int) -> Prompt | None:
        return self._conv(conversation).users[t]

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "dataset",
            **self.dataset.describe(),
            "prompt_format": "text",
            "output_len_from": "the dataset's reply to each turn (--output-len without one)",
            **_described(self.stride, self.turn_delay_s, "the conversations' human turns"),
            "turns_cap": self.max_turns,
        }


def _described(turns: int, delay_s: float, users: str) -> dict[str, Any]:
    return {
        "multi_turn": True,
        "turns": turns,
        "turn_delay_s": delay_s,
        "turn_messages": f"the conversation so far with the server's replies, then {users}",
    }


def check_turns(turns: int, delay_s: float) -> None:
    if turns < 1:
        raise UsageError(f"--turns {turns}: give at least 1 turn a conversation")
    if not delay_s >= 0 or delay_s == float("inf"):
        raise UsageError(f"--turn-delay {delay_s:g} s: give a duration of 0 or more, e.g. 1s")


def sharegpt_sessions(
    dataset: Dataset,
    *,
    default_output_len: int,
    tok: TextTokenizer | None,
    turns: int | None,
    turn_delay_s: float,
) -> DatasetSessions:
    """Every conversation's human turns, each with the length of the dataset's reply to it
    as its ``max_tokens`` where a tokenizer counts it (else ``default_output_len``)."""
    convs = []
    for c in dataset.conversations:
        users = []
        for k, (text, reply) in enumerate(c.turns):
            if turns is not None and k >= turns:
                break
            n_out = default_output_len
            if tok is not None and reply:
                n_out = max(1, len(tok.encode(reply, add_special_tokens=False)))
            users.append(Prompt(text, n_out, None))
        if users:
            convs.append(Conversation(c.system, users))
    return DatasetSessions(convs, dataset, turns=turns, turn_delay_s=turn_delay_s)


def sessions_from(
    inner: PromptSource,
    *,
    turns: int | None,
    turn_delay_s: float,
    api: str,
) -> SyntheticSessions:
    """Synthetic sessions around random prompts (``--multi-turn`` without a dataset)."""
    if api != "chat":
        raise UsageError(
            "--multi-turn sends each turn with the conversation so far as chat messages",
            hint="add --api chat",
        )
    if not isinstance(inner, BuildsPrompts):
        raise UsageError("--multi-turn needs random prompts or a ShareGPT --dataset")
    return SyntheticSessions(inner, turns=2 if turns is None else turns, turn_delay_s=turn_delay_s)
