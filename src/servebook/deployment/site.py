"""Where bench's load runs for a deployment: its place says (``Place.load_site``).

``Here``: in this process (and load agents beside it), reaching the servers by the view's
route (``DeploymentView.route``: directly, or through port-forwards the view holds).  A
place may offer another site instead, chosen by default because the measuring path then
never crosses a relay: on Kubernetes, an Indexed Job next to the engines
(``backends/kubernetes/job_site.JobSite``), whose route is ``cluster-service``.  bench, run and the
experiment runner ask the site, never the place's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class LoadSite(Protocol):
    """Where the load runs: ``here`` (this process) or elsewhere, and the route it takes
    from there ("" where it is the view's own)."""

    @property
    def here(self) -> bool: ...

    @property
    def route(self) -> str: ...


@dataclass(frozen=True)
class Here:
    """This process, by the view's route."""

    here: bool = True
    route: str = ""


__all__ = ["Here", "LoadSite"]
