"""SB102: Kubernetes label values where a label is expected."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from servebook.findings import Finding, Severity, register
from servebook.lint.loader import Document, KeyPath
from servebook.lint.rules.objects import finding_at, is_label_value, keypath_str, walk
from servebook.lint.rules.placeholders import find_placeholders
from servebook.lint.rules.registry import DOCUMENT_RULES


def _is_label_selector(node: dict[str, Any]) -> bool:
    """A `nodeSelector:` that holds a LabelSelector (`matchLabels` / `matchExpressions`, as
    AIBrix's ModelWarmup targets write it) rather than a Pod's map of node labels."""
    return bool(node) and set(node) <= {"matchLabels", "matchExpressions"}


def _label_maps(doc: Document) -> Iterator[tuple[KeyPath, dict[str, Any]]]:
    for keypath, node in walk(doc.data):
        if not isinstance(node, dict) or not keypath:
            continue
        last = keypath[-1]
        if last == "nodeSelector" and _is_label_selector(node):
            continue  # its matchLabels are visited (and checked) on their own
        if (
            (len(keypath) >= 2 and keypath[-2:] == ("metadata", "labels"))
            or last in ("matchLabels", "nodeSelector")
            or (last == "selector" and doc.kind in ("Service", "ReplicationController"))
        ):
            yield keypath, node


def _label_value_problem(value: Any) -> str | None:
    if isinstance(value, bool | int | float):
        return (
            f"{value!r} is a YAML {type(value).__name__}, not a string; the apply fails "
            "with a type error (quote it)"
        )
    if value is None:
        return None
    if not isinstance(value, str):
        return f"{value!r} is not a string"
    if len(value) > 63:
        return f"{value!r} is {len(value)} characters long; label values allow 63"
    if not is_label_value(value):
        return (
            f"{value!r} is not a valid label value (letters, digits, '-', '_', '.'; "
            "alphanumeric at both ends)"
        )
    return None


LABEL_VALUE = register(
    "SB102",
    "Invalid Kubernetes label value where a label is expected",
    "Label values (metadata.labels, selectors, matchLabels, nodeSelector, matchExpressions "
    "values) must be strings of at most 63 characters, alphanumeric at both ends with only "
    "`-`, `_` and `.` inside. An invalid value in a workload's Pod template is accepted with "
    "the workload, and every Pod the controller then creates is rejected, so nothing runs; "
    "an unquoted number or boolean fails the apply with a type error.",
    'Use a valid label value: quote numbers and booleans (`"1"`, `"true"`), shorten '
    "to 63 characters, and remove characters other than letters, digits, `-`, `_`, `.`.",
)


@DOCUMENT_RULES.add(LABEL_VALUE)
def check_label_values(doc: Document) -> list[Finding]:
    if not doc.is_kubernetes:
        return []
    findings: list[Finding] = []

    def report(keypath: KeyPath, value: Any) -> None:
        if isinstance(value, str) and find_placeholders(value):
            return  # SB101 reports it, with the effect.
        problem = _label_value_problem(value)
        if problem:
            findings.append(
                finding_at(
                    LABEL_VALUE,
                    Severity.FAIL,
                    doc,
                    keypath,
                    f"{keypath_str(keypath)}: {problem}.",
                    evidence={"value": value},
                )
            )

    for keypath, labels in _label_maps(doc):
        for k, v in labels.items():
            report((*keypath, str(k)), v)
    for keypath, node in walk(doc.data):
        if (
            isinstance(node, dict)
            and keypath
            and keypath[-2:-1] == ("matchExpressions",)
            and node.get("operator") in ("In", "NotIn")
            and isinstance(node.get("values"), list)
        ):
            for i, v in enumerate(node["values"]):
                report((*keypath, "values", i), v)
    return findings
