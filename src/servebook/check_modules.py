"""Every module that registers checks, named once.

``servebook checks`` and ``docs/checks.md`` list the registry after importing exactly
these modules, so the list of checks does not depend on which commands happened to run
first.  A module that registers a check (``servebook.findings.register`` or a decorator
built on it) and is missing here would be left out of the docs: a unit test walks the
package and fails when this tuple and the source disagree.
"""

from __future__ import annotations

CHECK_MODULES: tuple[str, ...] = (
    "servebook.bench.validity",
    "servebook.lint.docs",
    "servebook.lint.rules.flags",
    "servebook.lint.rules.hostpath",
    "servebook.lint.rules.images",
    "servebook.lint.rules.labels",
    "servebook.lint.rules.namespaces",
    "servebook.lint.rules.pd",
    "servebook.lint.rules.placeholders",
    "servebook.lint.rules.secrets",
    "servebook.preflight.admission",
    "servebook.preflight.cluster",
    "servebook.preflight.nodes",
    "servebook.preflight.probe_checks",
    "servebook.preflight.probe_pod",
    "servebook.preflight.weights_fit",
    "servebook.verify.checks",
    "servebook.verify.rules",
)
