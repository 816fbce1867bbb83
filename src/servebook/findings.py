"""Findings: the one shape that lint, preflight and verify all report in.

A *Check* is a registered rule with a stable id (``SB1xx`` lint, ``SB2xx`` preflight,
``SB3xx`` verify, ``SB4xx`` bench validity), a one-line title, a rationale that says what
goes wrong in production when it is ignored, and a fix.  A *Finding* is one verdict of one
check on one subject, with the evidence it was decided from.

Exit codes are shared by every command that prints findings: 0 when every finding passes
(warnings allowed), 1 when any finding fails, 2 when the command could not decide (bad
input, unreachable endpoint).  Never 0 on an error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_UNUSABLE = 2


class Severity(StrEnum):
    PASS = "pass"
    INFO = "info"
    WARN = "warn"
    FAIL = "fail"
    # The check could not decide (unreachable, missing input).  Counts as a failure of the
    # command with exit code 2: "could not run" is never reported as success.
    ERROR = "error"


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    rationale: str
    fix: str

    def finding(
        self,
        severity: Severity,
        subject: str,
        message: str,
        *,
        hint: str = "",
        evidence: dict[str, Any] | None = None,
    ) -> Finding:
        return Finding(
            check=self.id,
            severity=severity,
            subject=subject,
            message=message,
            hint=hint or (self.fix if severity in (Severity.FAIL, Severity.WARN) else ""),
            evidence=evidence or {},
        )


REGISTRY: dict[str, Check] = {}
F = TypeVar("F", bound=Callable[..., Any])


def register(id: str, title: str, rationale: str, fix: str) -> Check:
    """Register a check; ids are unique across the whole tool."""
    if id in REGISTRY:
        raise ValueError(f"check id {id} registered twice")
    check = Check(id=id, title=title, rationale=rationale, fix=fix)
    REGISTRY[id] = check
    return check


def register_once(id: str, title: str, rationale: str, fix: str) -> Check:
    """``register`` for a module that may be imported again (a test reloads it): an id
    already registered is returned as it is, not refused."""
    return REGISTRY.get(id) or register(id, title, rationale, fix)


class Rules(Generic[F]):
    """The functions that decide an area's checks, each added where it is defined::

        WINDOW_SHORT = register("SB401", ...)


        @VERDICTS.add(WINDOW_SHORT)
        def window_long_enough(...): ...

    The area runs what was added instead of wiring its functions by hand.  They run in
    check-id order, so the order of findings does not depend on which module was imported
    first; one function per check."""

    def __init__(self) -> None:
        self._by_id: dict[str, tuple[Check, F]] = {}

    def add(self, check: Check) -> Callable[[F], F]:
        def adding(fn: F) -> F:
            if check.id in self._by_id:
                raise ValueError(f"check id {check.id} decided by two functions")
            self._by_id[check.id] = (check, fn)
            return fn

        return adding

    def __iter__(self) -> Iterator[tuple[Check, F]]:
        return iter([self._by_id[k] for k in sorted(self._by_id)])


@dataclass
class Finding:
    check: str
    severity: Severity
    subject: str
    message: str
    hint: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.severity in (Severity.FAIL, Severity.ERROR)

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "title": REGISTRY[self.check].title if self.check in REGISTRY else "",
            "severity": self.severity.value,
            "subject": self.subject,
            "message": self.message,
            "hint": self.hint,
            "evidence": self.evidence,
        }


def exit_code(findings: Iterable[Finding]) -> int:
    """2 if any check could not decide, else 1 if any failed, else 0."""
    worst = EXIT_OK
    for f in findings:
        if f.severity is Severity.ERROR:
            return EXIT_UNUSABLE
        if f.severity is Severity.FAIL:
            worst = EXIT_FAIL
    return worst


def to_json(findings: Sequence[Finding], **extra: Any) -> str:
    doc: dict[str, Any] = {
        "ok": exit_code(findings) == EXIT_OK,
        "exit_code": exit_code(findings),
        "findings": [f.to_dict() for f in findings],
    }
    doc.update(extra)
    return json.dumps(doc, indent=2, sort_keys=False, default=str)
