"""Against the cluster of the tests (the test plane by default): what the stand-in was made to copy.

* (`down` then `up` at once, issue 23 point 2, is in test_tiny_pd_lifecycle.py.)
* A Role with `get` but not `create` on pods/portforward, and the reverse, against
  preflight's access review (issue 23 point 3): a WebSocket port-forward is authorized as
  `get`, and from Kubernetes 1.35 as `create` too.  Run as a ServiceAccount bound to the
  Role, with a token from the TokenRequest API (needs kubectl).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servebook.kube.snapshot import ClusterSnapshot
from tests.cluster.conftest import kubectl, sb

pytestmark = pytest.mark.cluster


def _ready_node(live: ClusterSnapshot) -> str:
    for name, node in sorted(live.nodes.items()):
        conditions = node.get("status", {}).get("conditions", [])
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            return name
    pytest.fail("the cluster has no Ready node")


# --- port-forward permissions against preflight ------------------------------------------


@pytest.fixture
def account(live: ClusterSnapshot, tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """A namespace, a ServiceAccount in it with cluster-wide read (preflight's snapshot),
    and a kubeconfig that authenticates as it; (namespace, account, kubeconfig)."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is needed to make the ServiceAccount and its token")
    ns = f"sb-rbac-{int(time.time())}"
    sa = "preflighter"
    kubectl("create", "namespace", ns)
    reader = f"{ns}-reader"
    try:
        kubectl("create", "serviceaccount", sa, "-n", ns)
        kubectl(
            "create", "clusterrole", reader, "--verb=get,list",
            "--resource=nodes,pods,namespaces,customresourcedefinitions.apiextensions.k8s.io",
        )  # fmt: skip
        kubectl(
            "create", "clusterrolebinding", reader, f"--clusterrole={reader}",
            f"--serviceaccount={ns}:{sa}",
        )  # fmt: skip
        token = kubectl("create", "token", sa, "-n", ns, "--duration=20m").strip()
        cfg = json.loads(kubectl("config", "view", "--raw", "--minify", "-o", "json"))
        cfg["users"] = [{"name": sa, "user": {"token": token}}]
        cfg["contexts"][0]["context"]["user"] = sa
        path = tmp_path / "kubeconfig"
        path.write_text(json.dumps(cfg))
        yield ns, sa, path
    finally:
        kubectl("delete", "namespace", ns, "--wait=false")
        kubectl("delete", "clusterrolebinding,clusterrole", reader, "--ignore-not-found")


def _grant(ns: str, sa: str, forward_verbs: str) -> None:
    """Everything `up` and `down` use in the namespace, and ``forward_verbs`` on
    pods/portforward."""
    kubectl(
        "create", "role", "deployer", "-n", ns, "--verb=get,list,watch,create,patch,delete",
        "--resource=services,configmaps,serviceaccounts,pods,pods/log,events,"
        "deployments.apps,replicasets.apps",
    )  # fmt: skip
    kubectl("create", "role", "forwarder", "-n", ns, f"--verb={forward_verbs}",
             "--resource=pods/portforward")  # fmt: skip
    for role in ("deployer", "forwarder"):
        kubectl("create", "rolebinding", role, "-n", ns, f"--role={role}",
                 f"--serviceaccount={ns}:{sa}")  # fmt: skip


def _minor() -> int:
    version = json.loads(kubectl("version", "-o", "json"))["serverVersion"]
    return int("".join(ch for ch in version["minor"] if ch.isdigit()))


@pytest.mark.parametrize(("verbs", "missing"), [("get", "create"), ("create", "get")])
def test_preflight_names_the_forward_verb_a_role_lacks(
    account: tuple[str, str, Path], verbs: str, missing: str
) -> None:
    ns, sa, cfg = account
    _grant(ns, sa, verbs)
    image = "vllm/vllm-openai-cpu:v0.32.0-x86_64"  # not pulled: tiny-mixed probes no node
    r = sb(
        "preflight", "tiny-mixed", "--json", "--set", f"image={image}", "--set", f"namespace={ns}",
        timeout=600, env={"KUBECONFIG": str(cfg)},
    )  # fmt: skip
    (access,) = [f for f in json.loads(r.stdout)["findings"] if f["check"] == "SB263"]
    denied = [d["access"] for d in access["evidence"]["denied"]]
    needs_create = _minor() >= 35
    if missing == "create" and not needs_create:
        assert access["severity"] == "pass", access  # before 1.35 get alone forwards
    else:
        assert access["severity"] == "fail", access
        assert f"{missing} pods/portforward" in denied, access
