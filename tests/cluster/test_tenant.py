"""servebook as a tenant of a shared cluster (issue 43 point 2): the plane's
`tenant.kubeconfig` is a user bound to a Role in the namespaces it was given, and no more
(no cluster-scoped writes, no namespace creation, no reading nodes or CRDs).

* The plane's tenant is what it says: it may not create namespaces or read nodes.
* Preflight as the tenant: what it may not read (nodes, CRDs, other namespaces' Pods) is
  "not checked", never passed, and SB263 passes with the Role it was given.
* Each permission `up` needs, taken from the Role in turn: preflight's SB263 fails naming
  exactly it, and `up` exits 2 at the start naming it, having applied nothing.  (Those only
  bench's load Job needs are taken away in test_bench_in_cluster.py, on its deployment.)
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from servebook.findings import Severity
from servebook.kube import client as kube_client
from servebook.kube import manifests
from servebook.kube.names import DEPLOYMENT_LABEL
from servebook.preflight.live import check_access
from servebook.recipe.resolve import resolve
from tests.cluster.conftest import (
    PLANE_IMAGE,
    Cluster,
    give_tenant,
    kubectl,
    sb,
    take_back,
    tenant_rules,
    without,
)

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]


@pytest.fixture
def tenant(cluster: Cluster) -> Cluster:
    if not cluster.tenant_namespaces:
        pytest.skip("the tenant is the test plane's (scripts/kube-plane up writes it)")
    return cluster


def can_i(cluster: Cluster, *args: str) -> bool:
    r = subprocess.run(
        ["kubectl", "--kubeconfig", cluster.user, "auth", "can-i", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return r.stdout.strip() == "yes"


def test_the_planes_tenant_has_a_role_in_its_namespaces_and_nothing_cluster_wide(
    tenant: Cluster,
) -> None:
    first = tenant.tenant_namespaces[0]
    assert can_i(tenant, "create", "deployments.apps", "-n", first)
    assert can_i(tenant, "create", "jobs.batch", "-n", first)
    assert can_i(tenant, "create", "pods/portforward", "-n", first)
    assert not can_i(tenant, "create", "namespaces")
    assert not can_i(tenant, "list", "nodes")
    assert not can_i(tenant, "list", "customresourcedefinitions.apiextensions.k8s.io")
    assert not can_i(tenant, "list", "pods", "--all-namespaces")
    assert not can_i(tenant, "create", "deployments.apps", "-n", "default")
    cfg = yaml.safe_load(Path(tenant.user).read_text())
    assert cfg["contexts"][0]["context"]["namespace"] == first


def _findings(out: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(f["check"], f["subject"]): f for f in json.loads(out)["findings"]}


def test_preflight_as_the_tenant_says_what_it_could_not_check(
    tenant: Cluster, tenant_ns: str
) -> None:
    sets = ["image=" + PLANE_IMAGE, f"namespace={tenant_ns}", "node=gpu-0"]
    r = sb(
        "preflight", "tiny-pd", "--json", *[a for s in sets for a in ("--set", s)],
        "--probe-deadline", "60", timeout=600,
    )  # fmt: skip
    assert r.returncode in (0, 1), r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    found = _findings(r.stdout)
    node = found[("SB250", "node/gpu-0")]
    assert node["severity"] == "warn" and node["message"].startswith("not checked: "), node
    assert "forbidden" in node["message"] and "--snapshot FILE" in node["hint"], node
    # Nothing about the node is passed as if it had been read.
    assert not [k for k, f in found.items() if k[1] == "node/gpu-0" and f["severity"] == "pass"]
    assert found[("SB263", f"namespace/{tenant_ns}")]["severity"] == "pass"
    assert found[("SB256", f"namespace/{tenant_ns}")]["severity"] == "pass"


@pytest.fixture
def denied_ns(request: pytest.FixtureRequest, tenant: Cluster) -> Iterator[str]:
    """A namespace given to the tenant with its Role less ``request.param``."""
    verb, resource, group = request.param
    ns = f"sb-deny-{uuid.uuid4().hex[:8]}"
    give_tenant(tenant, ns, without(tenant_rules(tenant), verb, resource, group))
    try:
        yield ns
    finally:
        take_back(tenant, ns)


# (verb, resource, group) up needs for tiny-mixed, one of each kind and each watch.
UP_NEEDS = [
    ("patch", "deployments", "apps"),
    ("create", "services", ""),
    ("delete", "services", ""),
    ("list", "pods", ""),
    ("get", "pods/log", ""),
    ("get", "pods/portforward", ""),
    ("create", "pods/portforward", ""),
    ("list", "replicasets", "apps"),
    ("list", "events", ""),
]


@pytest.mark.parametrize("denied_ns", UP_NEEDS, indirect=True, ids=lambda p: " ".join(p[:2]))
def test_each_permission_up_needs_taken_away_fails_preflight_and_up_naming_it(
    denied_ns: str,
    request: pytest.FixtureRequest,
) -> None:
    verb, resource, group = request.node.callspec.params["denied_ns"]
    named = f"{verb} {resource}" + (f".{group}" if group else "")
    ns = denied_ns
    sets = [f"image={PLANE_IMAGE}", f"namespace={ns}"]
    plan = resolve("tiny-mixed", sets, [])
    # Preflight's access review, as the tenant.
    access = check_access(kube_client.connect(), manifests.render(plan), ns, True)
    assert access.severity is Severity.FAIL, access.message
    assert [d["access"] for d in access.evidence["denied"]] == [named], access.evidence
    # up refuses before it applies anything, naming it.
    r = sb("up", "tiny-mixed", "--backend", "kubernetes",
           *[a for s in sets for a in ("--set", s)], timeout=300)  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert named in r.stderr and f"namespace {ns}" in r.stderr, r.stderr
    assert "Nothing was changed" in r.stderr, r.stderr
    kinds = "deployments,services,configmaps,serviceaccounts,roles,rolebindings"
    made = kubectl("get", kinds, "-n", ns, "-l", DEPLOYMENT_LABEL, "-o", "name")
    assert made.strip() == "", made
