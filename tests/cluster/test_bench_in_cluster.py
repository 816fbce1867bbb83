"""Two deployments of the tiny mixed recipe in one namespace (one bring-up each, on 2 cores
the costly part), and on them `bench NAME --agents 2` in the cluster, then `down a`:

* the bench runs its load as an Indexed Job next to the engine, in the engine's own image:
  the results say two agents in that namespace on the cluster's node(s) made the load, over
  the route cluster-service to the entry Service's cluster address, with the per-point
  server evidence read in the cluster, and no object of the bench is left afterwards;
* `down a` leaves `b` serving (status and verify by name), and `a` is gone.

On the test plane, or KUBECONFIG's cluster with vLLM's CPU image in SERVEBOOK_TEST_IMAGE
(tests/cluster/conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servebook.kube import client as kube_client
from servebook.kube import load_job as lj
from servebook.kube.resources import list_objects
from tests.cluster.conftest import UP_S, mixed_sets, sb

pytestmark = pytest.mark.cluster


def _namespace(sets: list[str]) -> str:
    return next(s.split("=", 1)[1] for s in sets if s.startswith("namespace="))


def test_two_in_one_namespace_bench_in_the_cluster_and_down_removes_one(
    where: list[str],
    tmp_path: Path,
) -> None:
    for name in ("a", "b"):
        up = ["up", "tiny-mixed", "--backend", "kubernetes", *mixed_sets(where), "--name", name]
        r = sb(*up, timeout=UP_S)
        assert r.returncode == 0, r.stdout + r.stderr
    ns = _namespace(where)
    dry = tmp_path / "dry"
    r = sb("bench", "b", "--agents", "2", "--dry-run", "-o", str(dry), timeout=300)
    assert r.returncode == 0, r.stderr
    lint = sb("lint", str(dry), timeout=300)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    out = tmp_path / "bench"
    args = [
        *(
            "--agents",
            "2",
            "--concurrency",
            "2",
            "--repetitions",
            "1",
            "--precision",
            "off",
            "--duration",
            "10s",
        ),
        *("--warmup", "2s", "--input-len", "32", "--output-len", "16"),
        # A CPU engine on a laptop node: the verdicts are not what this test is about.
        *("--min-achieved-concurrency", "0.3", "--max-client-lag-ms", "5000"),
    ]
    r = sb("bench", "b", *args, "-o", str(out), timeout=UP_S + 900)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    results = json.loads((out / "results.json").read_text())
    load = results["provenance"]["load"]
    assert load["route"] == "cluster-service" and load["agents"] == 2, load
    assert load["namespace"] == ns and load["nodes"], load
    assert load["target_url"].endswith(f".{ns}.svc:8000"), load
    (point,) = results["points"]
    assert point["requests_ok"] > 0 and point["server"].get("evidence") != "none", point
    api = kube_client.connect()
    for kind in ("Job", "Pod", "ConfigMap", "Secret", "Service"):
        left = list_objects(api, kind, ns, lj.RUN_LABEL)
        assert not [o for o in left if not o["metadata"].get("deletionTimestamp")], (kind, left)

    d = sb("down", "a", timeout=600)
    assert d.returncode == 0, d.stderr
    assert sb("status", "b", timeout=120).returncode == 0
    assert sb("verify", "b", timeout=600).returncode == 0
    assert sb("status", "a", timeout=120).returncode == 2
