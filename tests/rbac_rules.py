"""The Role servebook needs, less the port-forward subresource, as RBAC rules: what the
stand-in's access reviews (tests/unit/test_preflight_rbac.py) and the test plane's
(tests/cluster/test_scenarios.py) are granted, one set for both, so that a Role the
stand-in judges is the Role the real API server judges."""

from __future__ import annotations

from typing import Any

Rule = dict[str, Any]

# Everything `up`, `bench` (its load Job), `down` and preflight use in the namespace, but the
# port-forward subresource.
EVERYTHING_BUT_FORWARDS: Rule = {
    "apiGroups": ["", "apps", "batch", "rbac.authorization.k8s.io", "leaderworkerset.x-k8s.io"],
    "resources": [
        "services",
        "configmaps",
        "secrets",
        "jobs",
        "serviceaccounts",
        "pods",
        "pods/log",
        "events",
        "deployments",
        "replicasets",
        "roles",
        "rolebindings",
        "leaderworkersets",
    ],
    "verbs": ["get", "list", "watch", "create", "patch", "delete"],
}
# What preflight reads of the cluster (its snapshot).
CLUSTER_READS: Rule = {
    "apiGroups": ["", "apiextensions.k8s.io"],
    "resources": ["nodes", "namespaces", "pods", "customresourcedefinitions"],
    "verbs": ["get", "list"],
}


def forward_rules(*verbs: str) -> list[Rule]:
    """The namespace's rules: everything but the forwards, and ``verbs`` on
    ``pods/portforward`` (none: no rule for it)."""
    rules = [EVERYTHING_BUT_FORWARDS]
    if verbs:
        rules.append({"apiGroups": [""], "resources": ["pods/portforward"], "verbs": list(verbs)})
    return rules
