"""SGLang: what its ``/metrics`` counters are called and what they mean.

Names are read from SGLang's source, ``python/sglang/srt/metrics/collector.py``
(sgl-project/sglang at commit 00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538):
``TokenizerMetricsCollector`` defines the request and token counters below, and
``SchedulerMetricsCollector`` the retraction counter.  SGLang exposes them only when the
server is started with ``--enable-metrics``, every sample labelled with the model
(``model_name``) and, depending on the version, ranks.  Keep every SGLang-specific
string in this module.
"""

from __future__ import annotations


class M:
    """SGLang metric names as exposed on /metrics (counters carry ``_total``)."""

    # "Number of prefill tokens processed." (prompt tokens, cache hits included)
    PROMPT_TOKENS = "sglang:prompt_tokens_total"
    # "Number of generation tokens processed."
    GENERATION_TOKENS = "sglang:generation_tokens_total"
    # "Number of cached prompt tokens." (radix-cache hits)
    CACHED_TOKENS = "sglang:cached_tokens_total"
    # "Number of requests processed." (finished, whatever the outcome)
    REQUESTS = "sglang:num_requests_total"
    # "Number of requests aborted."
    ABORTED_REQUESTS = "sglang:num_aborted_requests_total"
    # "Total number of retracted requests." (SGLang's preemption: KV memory ran out)
    RETRACTED_REQUESTS = "sglang:num_retracted_requests_total"


# Metrics an SGLang server must expose for its counters to be evidence of a window.
REQUIRED_METRICS = (M.PROMPT_TOKENS, M.GENERATION_TOKENS, M.REQUESTS)
