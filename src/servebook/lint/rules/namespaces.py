"""SB109: objects in a namespace that nothing in the set creates."""

from __future__ import annotations

from servebook.findings import Finding, Severity, register
from servebook.lint.loader import Document, LintSet
from servebook.lint.rules.objects import finding_at
from servebook.lint.rules.placeholders import find_placeholders
from servebook.lint.rules.registry import SET_RULES

CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "Node",
        "PersistentVolume",
        "ClusterRole",
        "ClusterRoleBinding",
        "StorageClass",
        "CustomResourceDefinition",
        "PriorityClass",
        "IngressClass",
        "RuntimeClass",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "APIService",
        "CSIDriver",
        "CSINode",
        "VolumeSnapshotClass",
        "ClusterIssuer",
        "GatewayClass",
    }
)
BUILTIN_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})


NAMESPACE_NOT_CREATED = register(
    "SB109",
    "Objects in a namespace that nothing in the set creates",
    'Applying objects into a namespace that does not exist fails (`namespaces "x" not '
    "found`), part-way through a multi-object apply. This is a warning, not a failure: the "
    "namespace may already exist on the cluster.",
    "Add a `kind: Namespace` object to the set (servebook render emits one), or make sure "
    "the namespace exists (servebook preflight checks it).",
)


@SET_RULES.add(NAMESPACE_NOT_CREATED)
def check_namespaces(lint_set: LintSet) -> list[Finding]:
    documents = lint_set.documents
    created = {d.name for d in documents if d.is_kubernetes and d.kind == "Namespace"}
    users: dict[str, list[Document]] = {}
    for d in documents:
        if not d.is_kubernetes or d.kind in CLUSTER_SCOPED:
            continue
        ns = d.namespace
        if find_placeholders(ns or ""):
            continue  # a templated or placeholder namespace: SB101 / SB115 say so
        if ns and ns not in created and ns not in BUILTIN_NAMESPACES:
            users.setdefault(ns, []).append(d)
    findings = []
    for ns, docs in sorted(users.items()):
        first = docs[0]
        names = ", ".join(d.label for d in docs[:5]) + (" ..." if len(docs) > 5 else "")
        findings.append(
            finding_at(
                NAMESPACE_NOT_CREATED,
                Severity.WARN,
                first,
                ("metadata", "namespace"),
                f"{len(docs)} object(s) go into namespace {ns!r} ({names}), and no object "
                "in the set creates it; the apply fails unless it already exists.",
                evidence={"namespace": ns, "objects": [d.label for d in docs]},
            )
        )
    return findings
