"""Engines servebook knows: how to start them and what their counters are called.

``counters_of`` is the one place that says which engine a ``/metrics`` page belongs to, so
bench can read vLLM's and SGLang's counters under their own names.
"""

from __future__ import annotations

from dataclasses import dataclass

from servebook.engines import sglang, vllm


@dataclass(frozen=True)
class EngineCounters:
    """One engine's name and the counters its ``/metrics`` page must carry (any of them
    names the engine: ``counters_of``).  A window's counters are read under each engine's
    own names in ``results.evidence``."""

    engine: str
    required: tuple[str, ...]


VLLM = EngineCounters(
    engine="vllm",
    required=vllm.REQUIRED_METRICS,
)
SGLANG = EngineCounters(
    engine="sglang",
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
