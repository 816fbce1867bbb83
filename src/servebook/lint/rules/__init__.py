"""Lint rules over manifests and engine arguments (ids ``SB101``-``SB119``), one module per
subject.

Each rule is a registered ``Check`` (id, title, rationale: what breaks in production,
fix) plus a pure function from parsed documents to ``Finding`` s, registered beside it
(``servebook.lint.rules.registry``).  ``check(lint_set)`` runs every registered rule.  The
markdown rules live in ``servebook.lint.docs``.

What a rule reads (``servebook.lint.rules.objects``): Kubernetes objects and the pod specs
in them, the engine command line of each container, and other YAML (a servebook recipe, a
Helm values file): string values only, for placeholders, and ``image`` keys for the
image-reference rule.
"""

from __future__ import annotations

from servebook.findings import Finding
from servebook.lint.loader import LintSet
from servebook.lint.rules import (
    flags,
    hostpath,
    images,
    labels,
    namespaces,
    pd,
    placeholders,
    secrets,
)
from servebook.lint.rules.objects import engines
from servebook.lint.rules.registry import DOCUMENT_RULES, ENGINE_RULES, PAIR_RULES, SET_RULES
from servebook.lint.rules.templates import template_tool

# The modules whose rules `check` runs: importing one registers its rules.
SUBJECTS = (placeholders, labels, hostpath, flags, pd, namespaces, images, secrets)


def check(lint_set: LintSet) -> list[Finding]:
    """Every manifest and engine-argument rule over everything in ``lint_set``."""
    findings: list[Finding] = []
    for doc in lint_set.documents:
        for _, document_rule in DOCUMENT_RULES:
            findings.extend(document_rule(doc))
    # A template of another tool (SB115) does not run as written: its engine command line
    # is neither checked nor paired.
    all_engines = [e for e in engines(lint_set) if template_tool(e.doc) is None]
    for e in all_engines:
        for _, engine_rule in ENGINE_RULES:
            findings.extend(engine_rule(e))
    # An engine in several pairs (one prefill, two decodes) is reported once per finding.
    seen: set[tuple[str, str, str]] = set()
    for p, d in pd.pairs(all_engines):
        for _, pair_rule in PAIR_RULES:
            for f in pair_rule(p, d):
                if (f.check, f.subject, f.message) not in seen:
                    seen.add((f.check, f.subject, f.message))
                    findings.append(f)
    for _, set_rule in SET_RULES:
        findings.extend(set_rule(lint_set))
    return findings
