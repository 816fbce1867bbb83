"""What a port-forward needs, asked as the API server authorizes it (issue 23 point 3):
servebook's forwards are WebSockets, whose upgrade is a GET (`get pods/portforward`), and
from Kubernetes 1.35 the server checks `create` as well (KEP-4006, kubernetes#134577).
The stand-in authorizes every request and answers every access review from the Role the
test grants, as RBAC would, so a Role preflight passes is one the forwards work with."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from servebook.findings import Severity
from tests.rbac_rules import CLUSTER_READS, EVERYTHING_BUT_FORWARDS, forward_rules
from tests.unit.kube_standin import Server, StandIn
from tests.unit.preflight_standin import by_check, plan, run

# The probe Pods preflight runs (it needs no more than this on Pods to run them).
PROBE_PODS = {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]}


def role(*forward_verbs: str) -> dict[str, Any]:
    """The test plane's Role (tests/rbac_rules.py): the stand-in has one Role for the
    namespace and the cluster, so the cluster's reads join the namespace's rules."""
    rules = [*forward_rules(*forward_verbs), CLUSTER_READS]
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "rules": rules}


def arrange(server: Server, minor: int, *forward_verbs: str) -> None:
    def go(st: StandIn) -> None:
        st.minor = minor
        st.grant(role(*forward_verbs))

    server.call(go)


@pytest.mark.parametrize(
    ("minor", "verbs", "missing"),
    # From 1.35 (the test plane's 1.37): tests/cluster/test_scenarios.py, against this
    # stand-in and the plane.  Before 1.35 the stand-in alone.
    [(31, ("create",), ["get pods/portforward"])],
)
def test_a_role_without_what_the_forwards_need_fails_preflight_naming_it(
    preflight_cluster: tuple[Server, Path], minor: int, verbs: tuple[str, ...], missing: list[str]
) -> None:
    server, cfg = preflight_cluster
    arrange(server, minor, *verbs)
    (access,) = by_check(run(cfg, plan()), "SB263")
    assert access.severity is Severity.FAIL, access.message
    denied = [d["access"] for d in access.evidence["denied"]]
    assert denied == missing
    assert "WebSocket" in access.message


@pytest.mark.parametrize(("minor", "verbs"), [(31, ("get",))])
def test_a_role_with_what_the_forwards_need_passes(
    preflight_cluster: tuple[Server, Path], minor: int, verbs: tuple[str, ...]
) -> None:
    server, cfg = preflight_cluster
    arrange(server, minor, *verbs)
    (access,) = by_check(run(cfg, plan()), "SB263")
    assert access.severity is Severity.PASS, access.message


async def _upgrade(url: str) -> int:
    """The status of a port-forward WebSocket upgrade (101 when it is let through)."""
    path = "/api/v1/namespaces/servebook/pods/p-1/portforward?ports=8000"
    async with aiohttp.ClientSession() as session:
        try:
            async with session.ws_connect(url + path, protocols=("v4.channel.k8s.io",)) as ws:
                await ws.close()
                return 101
        except aiohttp.WSServerHandshakeError as e:
            return e.status


@pytest.mark.parametrize(
    ("minor", "verbs", "status"),
    [(31, ("get",), 101), (31, ("create",), 403)],  # from 1.35: test_scenarios.py
)
def test_the_stand_in_authorizes_a_forward_as_the_api_server_does(
    preflight_cluster: tuple[Server, Path], minor: int, verbs: tuple[str, ...], status: int
) -> None:
    server, _ = preflight_cluster
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p-1", "namespace": "servebook", "labels": {}},
        "spec": {"containers": [{"name": "c", "image": "i:1"}]},
    }
    server.call(lambda st: st.put(pod))
    arrange(server, minor, *verbs)
    assert asyncio.run(_upgrade(server.standin.url)) == status


def test_the_stand_ins_reviews_answer_from_the_role_granted(
    preflight_cluster: tuple[Server, Path],
) -> None:
    server, cfg = preflight_cluster
    server.call(
        lambda st: st.grant(
            {
                "rules": [
                    CLUSTER_READS,
                    {**EVERYTHING_BUT_FORWARDS, "verbs": ["get", "list"]},
                    PROBE_PODS,
                ]
            }
        )
    )
    (access,) = by_check(run(cfg, plan()), "SB263")
    denied = {d["access"] for d in access.evidence["denied"]}
    assert {"delete services", "patch deployments.apps", "create services"} <= denied
    assert "get services" not in denied and "list pods" not in denied


@pytest.mark.parametrize(
    ("version", "minor"),
    [({"major": "1", "minor": "35"}, 35), ({"major": "1", "minor": "31+"}, 31), ({}, None)],
)
def test_server_minor_reads_managed_clusters_versions(
    version: dict[str, str], minor: int | None
) -> None:
    from servebook.preflight.admission import server_minor

    assert server_minor(version) == minor


def test_an_unknown_server_version_asks_both_forward_verbs() -> None:
    from servebook.preflight.admission import portforward_access

    assert [a.verb for a in portforward_access("ns", None)] == ["get", "create"]
    assert [a.verb for a in portforward_access("ns", 34)] == ["get"]
