"""Schema-check rendered objects against the Kubernetes OpenAPI schema before anything is
written (kubernetes-validate's bundled schemas, strict: an unknown or misspelt field is an
error, as it would be silently dropped by the API server)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import kubernetes_validate

from servebook.findings import UsageError

# The Kubernetes version whose schema every render is checked against.  1.33 is the oldest
# release still widely deployed that has every field servebook writes; the objects use
# only stable APIs (v1, apps/v1), so newer clusters accept them too.
K8S_VERSION = "1.33"


def _describe(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind', '?')}/{meta.get('name', '?')}"


def schema_errors(objects: Sequence[dict[str, Any]], version: str = K8S_VERSION) -> list[str]:
    """One message per object that does not match the schema (empty when all match)."""
    errors = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(p) for p in e.path) or "(top level)"
            errors.append(f"{_describe(obj)}: {where}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(f"{_describe(obj)}: {e.message}")
    return errors


def check_schema(objects: Sequence[dict[str, Any]], version: str = K8S_VERSION) -> None:
    """Raise (exit 2, nothing written) unless every object matches the schema."""
    errors = schema_errors(objects, version)
    if errors:
        raise UsageError(
            f"{len(errors)} rendered object(s) do not match the Kubernetes {version} schema; "
            "nothing was written:\n" + "\n".join(f"  {e}" for e in errors)
        )
