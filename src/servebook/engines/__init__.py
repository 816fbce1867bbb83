"""Engines servebook knows: how to start them and what their counters are called.

``counters_of`` is the one place that says which engine a ``/metrics`` page belongs to, so
bench can read vLLM's and SGLang's counters under their own names.
"""

from __future__ import annotations

from dataclasses import dataclass

from servebook.engines import sglang, vllm


@dataclass(frozen=True)
class EngineCounters:
    """One engine's names for the counters a benchmark window is judged by."""

    engine: str
    prompt_tokens: str
    generation_tokens: str
    requests: str  # finished requests
    preemptions: str | None
    required: tuple[str, ...]


VLLM = EngineCounters(
    engine="vllm",
    prompt_tokens=vllm.M.PROMPT_TOKENS,
    generation_tokens=vllm.M.GENERATION_TOKENS,
    requests=vllm.M.REQUEST_SUCCESS,
    preemptions=vllm.M.PREEMPTIONS,
    required=vllm.REQUIRED_METRICS,
)
SGLANG = EngineCounters(
    engine="sglang",
    prompt_tokens=sglang.M.PROMPT_TOKENS,
    generation_tokens=sglang.M.GENERATION_TOKENS,
    requests=sglang.M.REQUESTS,
    preemptions=sglang.M.RETRACTED_REQUESTS,
    required=sglang.REQUIRED_METRICS,
)
ENGINES = (VLLM, SGLANG)


def counters_of(names: set[str] | frozenset[str]) -> EngineCounters | None:
    """The engine whose counters a ``/metrics`` page carries (by its metric names), or
    ``None`` for a page of no engine servebook knows (a proxy, an exporter)."""
    for e in ENGINES:
        if any(n in names for n in e.required):
            return e
    return None
