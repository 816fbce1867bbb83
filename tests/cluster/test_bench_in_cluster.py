"""Two deployments in one namespace, `a` of tiny-mixed and `b` of tiny-mixed-spec (one
bring-up each, on 2 cores the costly part; `b`'s engine Pod makes the draft beside the
model), and on `b` `bench NAME --agents 2` in the cluster, then `down a`:

* the bench runs its load as an Indexed Job next to the engine, in the engine's own image:
  the results say two agents in that namespace on the cluster's node(s) made the load, over
  the route cluster-service to the entry Service's cluster address, with the per-point
  server evidence read in the cluster, and no object of the bench is left afterwards;
* `down a` leaves `b` serving (status and verify by name, its speculation engaged: SB303
  reads the draft's acceptance from the engine in the Pod), and `a` is gone.

On the test plane, or KUBECONFIG's cluster with vLLM's CPU image in SERVEBOOK_TEST_IMAGE
(tests/cluster/conftest.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from servebook.kube import client as kube_client
from servebook.kube import load_job as lj
from servebook.kube import manifests
from servebook.kube.resources import list_objects
from servebook.preflight.live import check_access
from servebook.recipe.resolve import resolve
from tests.cluster.conftest import (
    PLANE_IMAGE,
    UP_S,
    mixed_sets,
    sb,
    set_tenant_rules,
    tenant_rules_in,
    until_tenant_can,
    without,
)

pytestmark = pytest.mark.cluster


def _namespace(sets: list[str]) -> str:
    return next(s.split("=", 1)[1] for s in sets if s.startswith("namespace="))


def test_two_in_one_namespace_bench_in_the_cluster_and_down_removes_one(
    where: list[str],
    tmp_path: Path,
) -> None:
    for name, recipe in (("a", "tiny-mixed"), ("b", "tiny-mixed-spec")):
        up = ["up", recipe, "--backend", "kubernetes", *mixed_sets(where), "--name", name]
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
    assert point["server"]["spec_acceptance"] > 0, point["server"]  # the draft in the Pod
    api = kube_client.connect()
    for kind in ("Job", "Pod", "ConfigMap", "Secret", "Service"):
        left = list_objects(api, kind, ns, lj.RUN_LABEL)
        assert not [o for o in left if not o["metadata"].get("deletionTimestamp")], (kind, left)

    _each_permission_bench_needs_taken_away_fails_it_at_the_start(ns, args, tmp_path)

    d = sb("down", "a", timeout=600)
    assert d.returncode == 0, d.stderr
    assert sb("status", "b", timeout=120).returncode == 0
    v = sb("verify", "b", "--json", timeout=600)
    assert v.returncode == 0, v.stdout + v.stderr
    found = {f["check"]: f for f in json.loads(v.stdout)["findings"]}
    assert found["SB303"]["severity"] == "pass" and found["SB303"]["evidence"]["drafts"] > 0
    assert sb("status", "a", timeout=120).returncode == 2
    # SERVEBOOK_HOME lost (another machine, a wiped laptop): the cluster is the record, read
    # back from the objects' labels, as the tenant.
    lost = {"SERVEBOOK_HOME": str(tmp_path / "another-home")}
    where_b = ("--backend", "kubernetes", "-n", ns)
    r = sb("status", "b", *where_b, "--json", timeout=120, env=lost)
    assert r.returncode == 0, r.stdout + r.stderr
    status = json.loads(r.stdout)
    assert status["namespace"] == ns and status["recipe"] == "tiny-mixed-spec", status
    r = sb("verify", "b", *where_b, timeout=600, env=lost)
    assert r.returncode == 0, r.stdout + r.stderr
    # Without -n, a tenant may not list across namespaces: as kubectl does, the context's
    # namespace (set as a user sets it) is searched, and a note says so.
    r = sb("status", "--backend", "kubernetes", "--json", timeout=120,
           env={**lost, "KUBECONFIG": str(_in_context(ns, tmp_path))})  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert [(d["name"], d["namespace"]) for d in json.loads(r.stdout)] == [("b", ns)], r.stdout
    if tenant_rules_in(ns) is not None:  # the plane's tenant; a named cluster may allow it
        assert f"searched namespace {ns} (the kubeconfig context's)" in r.stderr, r.stderr


def _in_context(ns: str, tmp_path: Path) -> Path:
    """A copy of KUBECONFIG whose current context's namespace is ``ns`` (`kubectl config
    set-context --current --namespace=NS`)."""
    doc = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
    current = doc["current-context"]
    for c in doc["contexts"]:
        if c["name"] == current:
            c["context"]["namespace"] = ns
    path = tmp_path / "in-context.kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


# (verb, resource, group) that only bench's load Job needs (tests/cluster/test_tenant.py
# takes away what up needs).
BENCH_NEEDS = [("create", "jobs", "batch"), ("create", "secrets", ""), ("delete", "configmaps", "")]


def _each_permission_bench_needs_taken_away_fails_it_at_the_start(
    ns: str, args: list[str], tmp_path: Path
) -> None:
    """On this deployment, each of ``BENCH_NEEDS`` taken from the tenant's Role in turn:
    preflight's access review (SB263, which asks for the load Job's kinds on bench's
    behalf) fails naming it, and `bench` exits 2 at the start naming it, having created
    nothing; then the Role is given back."""
    rules = tenant_rules_in(ns)
    if rules is None:
        return  # a cluster the user named: its Roles are not the tests' to change
    plan = resolve("tiny-mixed", [f"image={PLANE_IMAGE}", f"namespace={ns}"], [])
    for verb, resource, group in BENCH_NEEDS:
        named = f"{verb} {resource}" + (f".{group}" if group else "")
        set_tenant_rules(ns, without(rules, verb, resource, group))
        until_tenant_can(ns, verb, f"{resource}.{group}" if group else resource, want=False)
        try:
            access = check_access(kube_client.connect(), manifests.render(plan), ns, True)
            assert [d["access"] for d in access.evidence["denied"]] == [named], access.evidence
            out = tmp_path / f"denied-{resource}"
            r = sb("bench", "b", *args, "-o", str(out), timeout=300)
            assert r.returncode == 2, r.stdout + r.stderr
            assert named in r.stderr and "Nothing was changed" in r.stderr, r.stderr
            assert not (out / "results.json").exists()
            api = kube_client.connect()
            for kind in ("Job", "ConfigMap", "Secret", "Service"):
                assert list_objects(api, kind, ns, lj.RUN_LABEL) == [], kind
        finally:
            set_tenant_rules(ns, rules)
            until_tenant_can(ns, verb, f"{resource}.{group}" if group else resource)
