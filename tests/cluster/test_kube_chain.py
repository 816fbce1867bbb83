"""A handoff that fails open, on the cluster (the test plane, or KUBECONFIG's cluster with vLLM's
CPU image in SERVEBOOK_TEST_IMAGE). Each test brings the tiny recipes up on the first Ready
node, in a namespace of its own, and takes everything down again:

* a handoff that fails open (decode reads KV from another directory) is caught by verify
  through its port-forwards (SB302 names decode).

`run` (the whole chain), a re-up after a change and up straight after down are in
test_tiny_pd_lifecycle.py, on one deployment; two deployments in one namespace in
test_bench_in_cluster.py.
"""

from __future__ import annotations

import json

import pytest

from servebook.backends.kubernetes import deployer as kube
from servebook.recipe.resolve import resolve
from tests.cluster.conftest import UP_S, sb, set_values

pytestmark = pytest.mark.cluster


def test_a_handoff_that_fails_open_is_caught_by_verify_through_the_forwards(
    where: list[str],
) -> None:
    plan = resolve("tiny-pd", set_values(where), [])
    # The Pods' arguments (cluster_args), not the local backend's: on the test plane the
    # test changed only the latter and the handoff worked. A directory inside the shared
    # mount, so no Pod writes outside its volumes.
    args = plan.role("decode").cluster_args
    i = args.index("--kv-transfer-config") + 1
    cfg = json.loads(args[i])
    cfg["kv_connector_extra_config"]["shared_storage_path"] += "/elsewhere"
    args[i] = json.dumps(cfg)
    kube.up(plan, name="failopen", timeout_s=UP_S)
    r = sb("verify", "failopen", "--json", timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    bad = [f for f in json.loads(r.stdout)["findings"] if f["severity"] == "fail"]
    assert [(f["check"], f["subject"]) for f in bad if f["check"] == "SB302"] == [
        ("SB302", "decode")
    ], bad
