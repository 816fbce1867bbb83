"""The attached place: how ``registry`` finds, opens and reports on a deployment
``servebook attach`` recorded (``record``).  A deployment reached by URL is read here; one
on Kubernetes through ``cluster`` (port-forwards per Pod, a load Job beside them).

Apart from ``record`` so that ``cluster``, which builds on the record, is never imported
by it: the place depends on both, neither on the place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from servebook import http
from servebook.backends.attached.record import (
    AttachedDeployment,
    read_record,
    record_path,
    recorded_names,
    reread_commands,
    url_reach,
    view_of,
)
from servebook.backends.base import Found
from servebook.deployment.site import Here, LoadSite
from servebook.deployment.view import DeploymentView
from servebook.errors import UsageError


class AttachedBackend:
    """Deployments recorded by ``servebook attach``: a Place only (open, status, found, its
    load site); it has no up and no down (servebook never changes what it did not make:
    ``registry.deployer`` refuses)."""

    name = "attached"
    title = "an attached deployment"

    def recorded(self) -> list[str]:
        return recorded_names()

    def has(self, name: str) -> bool:
        return record_path(name).is_file()

    def found(self, namespace: str | None = None) -> list[Found]:
        out = []
        for n in recorded_names():
            dep = self._require(n)
            if namespace is None or dep.namespace == namespace:
                out.append(Found(n, dep.namespace, f"attached ({dep.stack})", _role_names(dep)))
        return out

    def status(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        dep = self._require(name)
        with self.open(name) as view:
            return status_of(dep, view)

    def load_site(self, name: str, namespace: str | None = None) -> LoadSite:
        """Here for a deployment reached by URL; on Kubernetes, a load Job beside its Pods
        (``backends/kubernetes/job_site``), as for servebook's own there."""
        dep = self._require(name)
        if dep.backend != "kubernetes":
            return Here()
        from servebook.backends.attached.cluster import cluster_source
        from servebook.backends.kubernetes.job_site import JobSite

        return JobSite(lambda: cluster_source(dep))

    @contextlib.contextmanager
    def open(self, name: str, namespace: str | None = None) -> Iterator[DeploymentView]:
        dep = self._require(name)
        if dep.backend == "url":
            fresh = reread_commands(dep)
            yield view_of(fresh, url_reach(fresh))
            return
        if dep.backend != "kubernetes":
            raise UsageError(
                f"attached deployment {name} is on {dep.backend}, which this servebook cannot "
                "reach."
            )
        from servebook.backends.attached.cluster import open_attached  # port-forwards per Pod

        with open_attached(dep) as view:
            yield view

    def _require(self, name: str) -> AttachedDeployment:
        dep = read_record(name)
        if dep is None:
            raise UsageError(
                f"no attached deployment named {name!r}.",
                hint="`servebook attach NAME --role ...` records one.",
            )
        return dep


def _answers(url: str, path: str) -> str:
    """ "" when ``url + path`` answers 200 within 5 s, else what happened."""
    try:
        resp = http.get(url.rstrip("/") + path, timeout=5.0)
    except http.HTTPError as e:
        return str(e)
    return "" if resp.status == 200 else f"GET {path}: HTTP {resp.status}"


def status_of(dep: AttachedDeployment, view: DeploymentView) -> dict[str, Any]:
    """Each role as ``Backend.status`` reports it: ok when its API answers /health and
    every replica's /metrics answers (the counters verify and bench read)."""
    roles = []
    for r in view.roles:
        problems = [f"{r.api_url}/health: {p}" for p in [_answers(r.api_url, "/health")] if p]
        if r.kind == "engine":
            problems += [
                f"{u}/metrics: {p}" for u in r.all_metrics_urls if (p := _answers(u, "/metrics"))
            ]
        replicas = len(r.all_metrics_urls) if r.kind == "engine" else 1
        roles.append(
            {
                "name": r.name,
                "kind": r.kind,
                "state": "healthy" if not problems else "not answering",
                "ok": not problems,
                "summary": f"{replicas} replica(s) at {r.api_url}"
                + (f"; {'; '.join(problems)}" if problems else ""),
                "replicas": list(r.replica_names) or [r.api_url],
            }
        )
    return {
        "name": dep.name,
        "backend": view.backend,
        "recipe": view.recipe,
        "entry": view.entry_url,
        "namespace": dep.namespace,
        "notes": list(dep.notes),
        "roles": roles,
    }


def _role_names(dep: AttachedDeployment) -> tuple[str, ...]:
    return tuple(r.name for r in dep.roles)


__all__ = ["AttachedBackend", "status_of"]
