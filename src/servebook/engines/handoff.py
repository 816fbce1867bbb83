"""The PD handoff arithmetic: how many of decode's prompt tokens must have arrived over
the KV connector for a handoff to count as done, and which counter says how many did.

verify (SB302, its own prompts) and bench (SB407, each point's prompt length) judge the
same handoff against the same threshold, so both take it from here: the connector moves
whole KV blocks (``block_size``, from the engine's cache config), less one block of slack
per request, since connectors differ in how they round the last block.  A prompt too
short to hold more than that slack cannot be judged (the threshold would be 0, a check
that cannot fail).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servebook.engines import vllm
from servebook.engines.vllm import M
from servebook.metrics.scrape import Snapshot

# One block of slack per request: connectors differ in how they round the last block.
SLACK_BLOCKS_PER_REQUEST = 1
# How every "cannot be judged" verdict begins (SB302, SB407): prompts too short for whole
# blocks, where no share is evidence either way (not a handoff that failed open).
NOT_JUDGED = "handoff not judged"


def block_size(snap: Snapshot, default: int = 16) -> int:
    """The KV block size an engine reports in its cache config (``default`` if none)."""
    for labels in snap.label_sets(M.CACHE_CONFIG_INFO):
        try:
            return int(labels.get("block_size", ""))
        except ValueError:
            continue
    return default


def handoff_required_tokens(prompt_tokens: Sequence[int], block: int) -> int:
    """Least number of tokens decode must receive by transfer for these prompts: the whole
    blocks each prompt has, less one block of slack per request."""
    expected = sum(vllm.align_to_block(n, block) for n in prompt_tokens)
    return max(0, expected - SLACK_BLOCKS_PER_REQUEST * block * len(prompt_tokens))


def handoff_min_prompt_tokens(block: int) -> int:
    """The shortest prompt whose handoff :func:`handoff_required_tokens` can judge (more
    than the slack in whole blocks): below it the threshold is 0 and cannot fail."""
    return next(n for n in range(2, 64 * max(block, 1) + 4) if handoff_required_tokens([n], block))


def handoff_not_judged(block: int, prompt_tokens: Sequence[int] = ()) -> str:
    """Why a handoff cannot be judged on ``block``-token blocks; ``prompt_tokens``, when
    they are several lengths (a dataset's prompts), are named by their range."""
    lo, hi = (min(prompt_tokens), max(prompt_tokens)) if prompt_tokens else (0, 0)
    which = f"for these prompts ({lo}-{hi} tokens)" if lo != hi else "at this length"
    return (
        f"{NOT_JUDGED} {which}: needs >= {handoff_min_prompt_tokens(block)} "
        f"prompt tokens (the connector moves whole {block}-token blocks, less one of slack)"
    )


@dataclass(frozen=True)
class HandoffThreshold:
    """What SB407 judges a PD point's handoff share against, for prompts of one length:
    ``share`` (verify's threshold), or ``undecidable``, the reason it cannot be judged
    at that length (the share would be 0, a check that cannot fail)."""

    share: float
    block: int
    undecidable: str | None = None


def threshold(prompt_tokens: Sequence[int], block: int) -> HandoffThreshold:
    """The verify threshold for a workload whose prompts have these server-side lengths
    (one for fixed-length prompts; each prompt of a dataset, the cycle a sweep sends) on
    ``block``-token blocks, as a share of their tokens."""
    required = handoff_required_tokens(prompt_tokens, block)
    why = None if required else handoff_not_judged(block, prompt_tokens)
    return HandoffThreshold(required / max(1, sum(prompt_tokens)), block, why)


def transferred_tokens(by_transfer: float | None, external_hits: float | None) -> float | None:
    """Decode's prompt tokens that arrived over the KV connector: vLLM's count of prompt
    tokens by source (external), else, on a vLLM without it, the connector's external
    prefix-cache hits (None: neither is there)."""
    return by_transfer if by_transfer is not None else external_hits


__all__ = [
    "NOT_JUDGED",
    "SLACK_BLOCKS_PER_REQUEST",
    "HandoffThreshold",
    "block_size",
    "handoff_min_prompt_tokens",
    "handoff_not_judged",
    "handoff_required_tokens",
    "threshold",
    "transferred_tokens",
]
