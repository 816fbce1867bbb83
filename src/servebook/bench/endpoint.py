"""The server the load asks and how (``Endpoint``): what a request is sent to, and what
each load's records name (``records.LoadResult.endpoint``), below both the requests
(``openai_stream``) and the records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servebook.bench.tokens import Api


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server and how to ask it."""

    base_url: str  # e.g. http://127.0.0.1:8000 (no /v1)
    model: str
    api: Api = "completions"
    ignore_eos: bool = True
    temperature: float = 0.0
    api_key: str | None = None
    extra_body: tuple[tuple[str, Any], ...] = ()
    request_timeout_s: float = 600.0
    request_id_prefix: str = "sb-"
    # vLLM's ``cache_salt``: its prefix cache shares nothing between requests of different
    # salts.  Set by the sweep (``sweep.salt_for``) for vLLM only: this run's salt, and,
    # with ``salt_each``, the request's index after it, so no request of this run or an
    # earlier one is served from the cache unless the workload shares prefixes.
    cache_salt: str | None = None
    salt_each: bool = False

    @property
    def url(self) -> str:
        path = "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        return self.base_url.rstrip("/") + path
