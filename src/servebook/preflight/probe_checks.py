"""The probe's checks in servebook's registry, and its finding dicts as ``Finding``s.

``preflight/probe.py`` runs inside a probe Pod with nothing but the standard library, so it
cannot import ``servebook.findings``: it declares its checks as plain data and reports
plain dicts.  This module is the one place that turns both into servebook's types, so
``servebook checks`` and the generated docs list the probe's checks beside every other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from servebook.findings import Check, Finding, Severity, register_once
from servebook.preflight import probe as _probe


def _register_all() -> dict[str, Check]:
    checks: dict[str, Check] = {}
    for c in _probe.CHECKS:
        # Importing twice (e.g. module reloads in tests) must not register twice.
        checks[c["id"]] = register_once(c["id"], c["title"], c["rationale"], c["fix"])
    return checks


PROBE_CHECKS: dict[str, Check] = _register_all()


def to_finding(d: Mapping[str, Any]) -> Finding:
    """One probe finding dict (``Finding.to_dict()`` shape) as a ``Finding``."""
    return Finding(
        check=str(d["check"]),
        severity=Severity(d["severity"]),
        subject=str(d["subject"]),
        message=str(d["message"]),
        hint=str(d.get("hint", "")),
        evidence=dict(d.get("evidence") or {}),
    )


def to_findings(ds: Iterable[Mapping[str, Any]]) -> list[Finding]:
    return [to_finding(d) for d in ds]


def probe_script_path() -> Path:
    """The standalone probe script, to copy into a probe Pod (``python3 probe.py DIR --json``)."""
    return Path(_probe.__file__)
