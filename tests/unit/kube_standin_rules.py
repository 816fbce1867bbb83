"""What the stand-in API server (tests/unit/kube_standin.py) decides as the real one does,
apart from its HTTP: validation (422 Invalid), a Pod's admission (its ServiceAccount) and
RBAC authorization.  Each rule is written here from Kubernetes' own sources
(cited per section), not from servebook's code, so servebook is tested against them.
A refusal is (code, reason, message, details) for the server's Status body.
"""

from __future__ import annotations

import json
import re
from typing import Any

Obj = dict[str, Any]
Refusal = tuple[int, str, str, Obj]


# ---------------------------------------------------------------------------------------
# Validation, as the API server words it (k8s.io/apimachinery pkg/util/validation/
# validation.go for the rules and their messages, pkg/api/errors NewInvalid for the 422
# Status): a Service's name is a DNS-1035 label, a Namespace's a DNS-1123 label, other
# names DNS-1123 subdomains; label values at most 63 characters; a Deployment's
# spec.selector cannot change.  Written here from those rules, not from servebook's.

_LABEL_RE = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NAME_RULES: dict[str, tuple[str, int, str, str]] = {
    "dns1035": (
        r"[a-z]([-a-z0-9]*[a-z0-9])?",
        63,
        "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start "
        "with an alphabetic character, and end with an alphanumeric character",
        "'my-name',  or 'abc-123'",
    ),
    "label": (
        _LABEL_RE,
        63,
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
        "'-', and must start and end with an alphanumeric character",
        "'my-name',  or '123-abc'",
    ),
    "subdomain": (
        rf"{_LABEL_RE}(\.{_LABEL_RE})*",
        253,
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
        "'-' or '.', and must start and end with an alphanumeric character",
        "'example.com'",
    ),
}


def _name_errors(name: str, rule: str) -> list[str]:
    regex, limit, words, example = _NAME_RULES[rule]
    out = []
    if len(name) > limit:
        out.append(f"must be no more than {limit} characters")
    if not re.fullmatch(regex, name):
        out.append(f"{words} (e.g. {example}, regex used for validation is '{regex}')")
    return out


def invalid(
    objects: dict[tuple[str, str, str], Obj], kind: str, group: str, plural: str, ns: str, body: Obj
) -> Refusal | None:
    """422 Invalid for what the API server's validation refuses; None when it passes."""
    meta = body.get("metadata") or {}
    name = str(meta.get("name", ""))
    rule = {"services": "dns1035", "namespaces": "label"}.get(plural, "subdomain")
    causes = [("metadata.name", name, e) for e in _name_errors(name, rule)]
    labels = dict(meta.get("labels") or {})
    for v in labels.values():
        if len(str(v)) > 63:
            causes.append(("metadata.labels", str(v), "must be no more than 63 characters"))
    old = objects.get((plural, ns, name))
    if plural == "deployments" and old is not None:
        before, after = (
            (old.get("spec") or {}).get("selector"),
            (body.get("spec") or {}).get("selector"),
        )
        if after is not None and before != after:
            causes.append(("spec.selector", json.dumps(after), "field is immutable"))
    if not causes:
        return None
    what = f"{kind}.{group}" if group else kind
    errors = [f"{f}: Invalid value: {json.dumps(v)}: {e}" for f, v, e in causes]
    message = f'{what} "{name}" is invalid: ' + (
        errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    )
    details = {
        "name": name,
        "group": group,
        "kind": kind,
        "causes": [
            {
                "reason": "FieldValueInvalid",
                "message": f"Invalid value: {json.dumps(v)}: {e}",
                "field": f,
            }
            for f, v, e in causes
        ],
    }
    return 422, "Invalid", message, details


# ---------------------------------------------------------------------------------------
# Admission of a Pod: the ServiceAccount admission plugin refuses a Pod whose account does
# not exist (plugin/pkg/admission/serviceaccount: "error looking up service account
# NS/NAME"); a dry run stores nothing, so an account dry-run in the same set does not
# count.  The namespace's "default" account is taken as made (its controller makes it).
# (Pod Security Admission runs on the plane: tests/cluster/test_scenarios.py.)


def missing_service_account(
    objects: dict[tuple[str, str, str], Obj], ns: str, pod_spec: Obj
) -> str | None:
    account = str(pod_spec.get("serviceAccountName") or "default")
    if account == "default" or ("serviceaccounts", ns, account) in objects:
        return None
    return account


# ---------------------------------------------------------------------------------------
# Authorization, as the API server's RBAC authorizer decides it (k8s.io/apiserver
# pkg/endpoints/request/requestinfo.go names the verb of a request; plugin/pkg/auth/
# authorizer/rbac matches it against the rules).  Only where ``StandIn.rbac`` is set.
#
# The verb: GET of a named object (or subresource) is ``get``, of a collection ``list``
# (``watch`` with ?watch=true); POST ``create``, PATCH ``patch``, PUT ``update``, DELETE
# ``delete``.  A port-forward's WebSocket upgrade is a GET, so ``get pods/portforward``;
# from Kubernetes 1.35 the server also checks ``create`` on it (KEP-4006, kubernetes
# #134577, feature gate AuthorizePodWebsocketUpgradeCreatePermission, on by default).
# Every authenticated user may create SelfSubjectAccessReviews (system:basic-user) and
# read /version (system:public-info-viewer).

_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def _rule_allows(rule: Obj, verb: str, group: str, resource: str, name: str) -> bool:
    def has(key: str, value: str) -> bool:
        values = rule.get(key) or []
        return "*" in values or value in values

    sub = resource.partition("/")[2]
    names = rule.get("resourceNames") or []
    return (
        has("verbs", verb)
        and has("apiGroups", group)
        and (has("resources", resource) or (bool(sub) and f"*/{sub}" in rule["resources"]))
        and (not names or name in names)
    )


def rbac_allows(rules: list[Obj] | None, verb: str, group: str, resource: str, name: str) -> bool:
    """Whether RBAC rules allow ``verb`` on ``resource`` (``pods/portforward`` for a
    subresource) of ``group``; None: no RBAC arranged, everything allowed."""
    if rules is None:
        return True
    return any(_rule_allows(r, verb, group, resource, name) for r in rules)


def request_attributes(method: str, path: str, query: dict[str, str]) -> tuple[str, ...] | None:
    """(verb, group, resource, name, namespace) of a resource request; None for a
    non-resource path (/version)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return None
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    if len(rest) > 2:
        resource += "/" + rest[2]
    if resource == "namespaces" and namespace and not name:
        resource, name = "namespaces", namespace
    if method == "GET":
        verb = ("watch" if query.get("watch") == "true" else "list") if not name else "get"
    else:
        verb = _VERBS.get(method, method.lower())
    return verb, group, resource, name, namespace


def authorize(
    rbac: list[Obj] | None, minor: int, method: str, path: str, query: dict[str, str]
) -> Refusal | None:
    """403 as the API server words it when RBAC refuses the request; None otherwise."""
    if rbac is None:
        return None
    attrs = request_attributes(method, path, query)
    if attrs is None or attrs[2] == "selfsubjectaccessreviews":
        return None
    verb, group, resource, name, namespace = attrs
    verbs = [verb]
    if resource == "pods/portforward" and minor >= 35:
        verbs.append("create")
    for v in verbs:
        if not rbac_allows(rbac, v, group, resource, name):
            base = resource.split("/")[0]
            what = f'{base} "{name}"' if name else base
            where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
            return (
                403,
                "Forbidden",
                f'{what} is forbidden: User "tester" cannot {v} resource "{resource}" in API '
                f'group "{group}"{where}',
                {"name": name, "group": group, "kind": base},
            )
    return None
