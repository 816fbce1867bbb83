"""API keys: where servebook takes one from, how it sends it, and what a refusal means.

A protected server (vLLM started with ``--api-key`` or ``VLLM_API_KEY``, a hosted
endpoint) answers 401 or 403 to a request without the right bearer token.  That is the
caller's missing key, not the server's failure: ``bench``, ``verify``, ``run`` and the
local backend's readiness check stop with ``ApiKeyError`` (exit 2) at the first one,
instead of measuring a sweep of refused requests or blaming the deployment.

The key comes from ``--api-key``, else ``OPENAI_API_KEY``, else ``VLLM_API_KEY`` (the
OpenAI clients' variable first, then vLLM's own).  Every key servebook holds is
remembered by ``servebook.redact``, so it is replaced wherever it would be written or
printed.

vLLM guards only the paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``
(``vllm/entrypoints/serve/middleware/authenticate.py``): ``/health``, ``/metrics``,
``/version`` and ``/tokenize`` answer without a key, so readiness, counters and provenance
work as before; the key matters for completions and ``/v1/models``.
"""

from __future__ import annotations

import os

from servebook import redact
from servebook.errors import UsageError

ENV_VARS = ("OPENAI_API_KEY", "VLLM_API_KEY")
MISSING = "the server requires an API key: pass --api-key or set OPENAI_API_KEY"
REJECTED_STATUSES = (401, 403)

# A key given on servebook's command line (``run --api-key``): the one the engines of a
# recipe that requires a key are started with, before the environment's.
_given: str | None = None


class ApiKeyError(UsageError):
    """The server refused a request for want of the right API key (exit 2)."""


def from_environment() -> str | None:
    """``OPENAI_API_KEY``, else ``VLLM_API_KEY``; None when neither is set (or empty)."""
    for name in ENV_VARS:
        value = os.environ.get(name, "").strip()
        if value:
            redact.remember(value)
            return value
    return None


def resolve(given: str | None) -> str | None:
    """The key a command sends: ``--api-key`` when given, else the environment's."""
    global _given
    if given is not None and given.strip():
        _given = given.strip()
        redact.remember(_given)
        return _given
    return from_environment()


def for_engines() -> str | None:
    """The key engines that require one are started with (local backend): the one given
    on this command's line, else the environment's."""
    return _given or from_environment()


def headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def is_rejection(status: int | None) -> bool:
    return status in REJECTED_STATUSES


def rejected(status: int, where: str, key: str | None) -> ApiKeyError:
    """The error for a 401/403 from ``where`` (a URL; shown without credentials)."""
    at = f"HTTP {status} from {redact.url(where)}"
    if key:
        return ApiKeyError(
            f"the server refused the API key servebook sent ({at}): pass the right one with "
            "--api-key or set OPENAI_API_KEY"
        )
    return ApiKeyError(f"{MISSING} ({at})")


__all__ = [
    "ENV_VARS",
    "MISSING",
    "ApiKeyError",
    "for_engines",
    "from_environment",
    "headers",
    "is_rejection",
    "rejected",
    "resolve",
]
