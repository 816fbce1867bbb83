"""The name of a deployment: one rule for every command that takes one.

A deployment's name becomes a directory under ``$SERVEBOOK_HOME/deployments``, the name
(or prefix) of its Kubernetes objects and the value of its ``servebook.io/deployment``
label, so it is a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting
and ending with a letter or digit.  That leaves no '/', '.' or '..' to climb out of the
state directory with (the reliability probe of 2026-12-04: ``up --name ../../victim``
deleted ``victim/kv`` outside ``SERVEBOOK_HOME``).
"""

from __future__ import annotations

import re

from servebook.errors import UsageError

MAX_LENGTH = 63
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
EXAMPLE = "tiny-pd-2"
RULE = (
    f"a deployment name is a DNS-1123 label: at most {MAX_LENGTH} lowercase letters, digits "
    "and '-', starting and ending with a letter or digit"
)


def is_deployment_name(name: str) -> bool:
    return len(name) <= MAX_LENGTH and _LABEL.fullmatch(name) is not None


def deployment_name(name: str, given_as: str = "deployment name") -> str:
    """``name`` when it is a deployment name; else unusable input (exit 2) saying the rule,
    with an example.  ``given_as`` is how the user gave it (``--name``, ``NAME``)."""
    if is_deployment_name(name):
        return name
    raise UsageError(
        f"{given_as} {name!r}: {RULE}, e.g. {EXAMPLE}.",
        hint=f"Choose a name such as {EXAMPLE}; nothing was started or written.",
    )


__all__ = ["EXAMPLE", "MAX_LENGTH", "RULE", "deployment_name", "is_deployment_name"]
