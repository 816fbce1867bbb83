"""Schema-check rendered objects against the Kubernetes OpenAPI schema before anything is
written (kubernetes-validate's bundled schemas, strict: an unknown or misspelt field is an
error, as it would be silently dropped by the API server)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import kubernetes_validate

from servebook.errors import UsageError

# The Kubernetes version whose schema every render is checked against.  1.33 is the oldest
# release still widely deployed that has every field servebook writes; the objects use
# only stable APIs (v1, apps/v1), so newer clusters accept them too.
K8S_VERSION = "1.33"


def _describe(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind', '?')}/{meta.get('name', '?')}"


# LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) is a CRD, not in kubernetes-validate's
# bundle.  Its fields as kubernetes-sigs/lws declares them (api/leaderworkerset/v1/
# leaderworkerset_types.go, read at 060ab4da, 2026-08): every key is checked against these,
# the enums and counts too, and each Pod template against the Kubernetes PodTemplateSpec
# schema, so only the CRD's own OpenAPI details (defaults, immutability) go unchecked.
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
_LWS_SPEC = {
    "replicas",
    "leaderWorkerTemplate",
    "rolloutStrategy",
    "startupPolicy",
    "networkConfig",
}
_LWS_TEMPLATE = {
    "leaderTemplate",
    "workerTemplate",
    "size",
    "restartPolicy",
    "subGroupPolicy",
    "volumeClaimTemplates",
    "persistentVolumeClaimRetentionPolicy",
}
_LWS_ENUMS = {
    ("spec", "startupPolicy"): {"LeaderCreated", "LeaderReady"},
    ("spec", "leaderWorkerTemplate", "restartPolicy"): {
        "Default",
        "RecreateGroupOnPodRestart",
        "RecreateGroupAfterStart",
        "None",
    },
}


def _lws_errors(obj: dict[str, Any], version: str) -> list[str]:
    out: list[str] = []
    who = _describe(obj)
    extra = set(obj) - {"apiVersion", "kind", "metadata", "spec", "status"}
    spec = obj.get("spec")
    if extra or not isinstance(spec, dict):
        return [f"{who}: (top level): unknown keys {sorted(extra)} or no spec"]
    lwt = spec.get("leaderWorkerTemplate")
    if set(spec) - _LWS_SPEC:
        out.append(f"{who}: spec: unknown keys {sorted(set(spec) - _LWS_SPEC)}")
    if not isinstance(lwt, dict) or not isinstance(lwt.get("workerTemplate"), dict):
        return [*out, f"{who}: spec.leaderWorkerTemplate.workerTemplate is required"]
    if set(lwt) - _LWS_TEMPLATE:
        out.append(
            f"{who}: spec.leaderWorkerTemplate: unknown keys {sorted(set(lwt) - _LWS_TEMPLATE)}"
        )
    for key, low in ((spec.get("replicas"), 0), (lwt.get("size"), 1)):
        if key is not None and (not isinstance(key, int) or isinstance(key, bool) or key < low):
            out.append(f"{who}: replicas/size {key!r}: expected an integer >= {low}")
    for path, allowed in _LWS_ENUMS.items():
        node: Any = obj
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        if node is not None and node not in allowed:
            out.append(f"{who}: {'.'.join(path)}: {node!r} is not one of {sorted(allowed)}")
    for name in ("leaderTemplate", "workerTemplate"):
        tpl = lwt.get(name)
        if tpl is None:
            continue
        wrapped = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "template"},
            "template": tpl,
        }
        for e in schema_errors([wrapped], version):
            out.append(f"{who}: spec.leaderWorkerTemplate.{name}: {e.split(': ', 1)[1]}")
    return out


def schema_errors(objects: Sequence[dict[str, Any]], version: str = K8S_VERSION) -> list[str]:
    """One message per object that does not match the schema (empty when all match)."""
    errors = []
    for obj in objects:
        if obj.get("apiVersion") == LWS_API_VERSION and obj.get("kind") == "LeaderWorkerSet":
            errors += _lws_errors(obj, version)
            continue
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
