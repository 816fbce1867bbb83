"""An experiment whose recipe arms run on Kubernetes, planned and refused without a
cluster.  The run itself (each arm brought up in turn, benched with the in-cluster load,
verified and brought down, then Ctrl-C and ``--resume``) runs on the test plane:
tests/cluster/test_experiment_on_plane.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from servebook.experiment import spec
from servebook.experiment.values import resolve_arm
from servebook.kube import manifests
from tests.conftest import CliResult
from tests.unit.conftest import LOCAL_ONLY_RECIPE

# --- the four topologies as Kubernetes arms, planned -----------------------------------------

# The seed's comparison on a cluster (issue 43): the four tiny recipes, each brought up on
# Kubernetes per block, with the values the cluster tests give them (tests/cluster/conftest.py:
# vLLM's CPU image, the plane's first GPU node, a tenant's namespace).
FOUR_ARMS: list[dict[str, Any]] = [
    {"name": name, "recipe": recipe, "backend": "kubernetes"}
    for name, recipe in [
        ("mixed", "tiny-mixed"),
        ("mixed-spec", "tiny-mixed-spec"),
        ("pd", "tiny-pd"),
        ("pd-spec", "tiny-pd-spec"),
    ]
]
FOUR_TOPOLOGIES: dict[str, Any] = {
    "baseline": "mixed",
    "blocks": 2,
    "variable": ["topology"],
    "values": {
        "image": "vllm/vllm-openai-cpu:v0.32.0-x86_64",
        "node": "gpu-0",
        "namespace": "tenant-a",
    },
    "arms": FOUR_ARMS,
    "load": {"concurrency": [1, 4], "duration": "15s", "warmup": "5s"},
}


def _dry_run(cli: Callable[..., CliResult], tmp_path: Path, doc: dict[str, Any]) -> CliResult:
    f = tmp_path / "four.yaml"
    f.write_text(yaml.safe_dump(doc))
    return cli("experiment", str(f), "-o", str(tmp_path / "out"), "--dry-run", "--json")


def test_the_four_topology_experiment_on_kubernetes_plans_and_each_arm_renders(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    r = _dry_run(cli, tmp_path, FOUR_TOPOLOGIES)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["fresh_deployments"] == 8
    assert sorted((d["arm"], d["block"]) for d in plan["deployments"]) == sorted(
        (a, b) for a in ("mixed", "mixed-spec", "pd", "pd-spec") for b in (1, 2)
    )
    assert not (tmp_path / "out").exists()
    # What each arm's up would apply: the experiment's values reach every recipe, and the
    # spec arms' engine Pods make the draft they speculate with.
    exp = spec.parse(FOUR_TOPOLOGIES, str(tmp_path / "four.yaml"))
    for arm in exp.arms:
        objects = manifests.render(resolve_arm(exp, arm), name=f"{arm.name}-b1")
        pods = [
            o["spec"]["template"]["spec"]
            for o in objects
            if o["kind"] == "Deployment" and not o["metadata"]["name"].endswith("-router")
        ]
        assert len(pods) == (2 if arm.name.startswith("pd") else 1), arm.name
        assert {o["metadata"]["namespace"] for o in objects if "namespace" in o["metadata"]} == {
            "tenant-a"
        }
        for pod in pods:
            inits = [c["name"] for c in pod["initContainers"]]
            assert ("make-draft" in inits) == arm.name.endswith("-spec"), (arm.name, inits)
            if arm.name.startswith("pd"):
                assert pod["nodeSelector"] == {"kubernetes.io/hostname": "gpu-0"}


LOCAL_ONLY_ARM = {"name": "pd-spec", "recipe": LOCAL_ONLY_RECIPE, "backend": "kubernetes"}


@pytest.mark.parametrize(
    ("change", "words"),
    [
        # the image left out of values: every arm needs it on Kubernetes
        (
            {"values": {"node": "gpu-0"}},
            ["arms[mixed] (recipe tiny-mixed, backend kubernetes)", "image (str)", "values:"],
        ),
        # a recipe for this machine only, as a Kubernetes arm
        (
            {"arms": [*FOUR_ARMS[:3], LOCAL_ONLY_ARM]},
            ["arms[pd-spec]", "is for local, not Kubernetes"],
        ),
    ],
)
def test_a_kubernetes_arm_its_backend_cannot_bring_up_is_refused_before_anything_starts(
    cli: Callable[..., CliResult], tmp_path: Path, change: dict[str, Any], words: list[str]
) -> None:
    r = _dry_run(cli, tmp_path, {**FOUR_TOPOLOGIES, **change})
    assert r.returncode == 2, r.stdout + r.stderr
    said = " ".join(r.stderr.split())
    for w in words:
        assert w in said, said
    assert not (tmp_path / "out").exists()
