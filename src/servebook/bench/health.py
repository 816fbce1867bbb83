"""Whether a deployment's roles can serve, asked before each point of a sweep
(``not_serving``), and how long a role may fail to answer before it is called silent.

A role whose process is gone is called dead at once.  A role that is running but does not
answer ``/health`` is called silent only after ``TRIES`` asks in a row missed, each given
``TIMEOUT_S``, ``PAUSE_S`` apart: at most ``bound_s()`` (10 s) from the first ask to the
verdict.  One ask was not enough: a router that was alive (its log showed no fault) missed
one 2 s ``/health`` at load 20, as the load of the point before drained, and the sweep
stopped, so the experiment's whole block was invalid (issue 49).  Every miss is kept
(``ServingCheck.misses``, which the experiment records in its state) and told as it
happens, the ones a later ask made good too: never silently.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from servebook import http
from servebook.console import err
from servebook.deployment.view import DeploymentView, RoleView
from servebook.results.provenance import utc_now

TRIES = 3
TIMEOUT_S = 2.0
PAUSE_S = 2.0

Miss = dict[str, Any]


def bound_s(tries: int = TRIES, timeout_s: float = TIMEOUT_S, pause_s: float = PAUSE_S) -> float:
    """The longest a role is asked before it is called silent."""
    return tries * timeout_s + (tries - 1) * pause_s


def told(line: str) -> None:
    """A miss on the terminal (stderr), as it happens."""
    err.print(f"health: {line}", highlight=False, markup=False, soft_wrap=True)


class ServingCheck:
    """``check()``: the roles of ``view`` that cannot serve now, each with why (empty: all
    can).  ``misses``: every ask that missed, in order, each with what came of it
    (``then``: answered at a later ask, not running any more, or called silent)."""

    def __init__(
        self,
        view: DeploymentView,
        *,
        tries: int = TRIES,
        timeout_s: float = TIMEOUT_S,
        pause_s: float = PAUSE_S,
        tell: Callable[[str], None] = told,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.view, self.tries, self.timeout_s, self.pause_s = view, tries, timeout_s, pause_s
        self.tell, self.sleep = tell, sleep
        self.misses: list[Miss] = []

    def __call__(self) -> list[str]:
        dead = self.view.dead_roles()
        if dead:
            return [f"{name} (not running)" for name in dead]
        out = []
        for role in self.view.roles:
            why = self._ask(role)
            if why is not None:
                out.append(f"{role.name} ({why})")
        return out

    def _ask(self, role: RoleView) -> str | None:
        """None when ``role`` answered within the bound, else why it is called silent."""
        streak: list[Miss] = []
        for ask in range(1, self.tries + 1):
            error = _miss(role.api_url, self.timeout_s)
            if error is None:
                for m in streak:
                    m["then"] = f"answered at ask {ask}"
                if streak:
                    self.tell(f"{role.name} answered /health at ask {ask} of {self.tries}")
                return None
            miss: Miss = {
                "role": role.name,
                "url": f"{role.api_url}/health",
                "at": utc_now(),
                "ask": ask,
                "tries": self.tries,
                "error": error,
            }
            streak.append(miss)
            self.misses.append(miss)
            if ask == self.tries:
                break
            self.tell(
                f"{role.name} missed /health (ask {ask} of {self.tries}: {error}); asking "
                f"again in {self.pause_s:g} s"
            )
            self.sleep(self.pause_s)
            if role.name in self.view.dead_roles():
                for m in streak:
                    m["then"] = "not running any more"
                return "not running"
        for m in streak:
            m["then"] = "called silent"
        return (
            f"nothing answers at {role.api_url}/health: {self.tries} asks in a row missed "
            f"within {bound_s(self.tries, self.timeout_s, self.pause_s):g} s, the last: "
            f"{streak[-1]['error']}"
        )


def not_serving(view: DeploymentView, **kw: Any) -> ServingCheck:
    """The roles of ``view`` that cannot serve now: dead, or alive but answering no
    ``/health`` within the bound (being taken down, stopped, hung).  A process-only check
    missed a role `servebook down` had asked to stop: it was still exiting, and bench
    measured one more point of nothing but connection errors."""
    return ServingCheck(view, **kw)


def _miss(url: str, timeout_s: float) -> str | None:
    """None when something answers at ``url``'s /health short of a server error (a
    router without a /health still answers: 404); else what went wrong."""
    t0 = time.monotonic()
    try:
        status = http.get(url + "/health", timeout=timeout_s).status
    except http.HTTPError as e:
        return f"{e} after {time.monotonic() - t0:.1f} s"
    return None if status < 500 else f"HTTP {status}"
