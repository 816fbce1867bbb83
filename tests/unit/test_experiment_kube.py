"""An experiment whose recipe arms run on Kubernetes, on the stand-in API server
(tests/unit/kube_standin.py) with the kubelet of tests/unit/test_kube_bench_job.py that
runs the load Job's Pods as local processes: each arm in turn is brought up (server-side
apply, rollout), benched with the in-cluster load (an Indexed Job next to the engines, its
results fetched and its objects deleted), and brought down, down returning once the
cluster has deleted its objects, before the next arm comes up."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from servebook.experiment import session, spec
from servebook.experiment.runner import Steps
from servebook.experiment.spec import Arm
from servebook.experiment.steps import servebook_steps
from servebook.experiment.values import resolve_arm
from servebook.kube import manifests
from servebook.results.schema import RESULTS_NAME
from servebook.results.store import load_results
from tests.conftest import CliResult
from tests.unit.conftest import LOCAL_ONLY_RECIPE
from tests.unit.job_kubelet import NS, SWEEP, Kubelet, left_in
from tests.unit.kube_engines import VALUES
from tests.unit.kube_standin import Server

# bench's flags of SWEEP (job_kubelet.py), as an experiment's load: keys.
LOAD = {SWEEP[i].removeprefix("--"): SWEEP[i + 1] for i in range(0, len(SWEEP), 2)}


def _deployment_objects(server: Server, name: str) -> list[str]:
    """What the cluster still holds of deployment ``name`` (by servebook's label)."""

    def read(st: Any) -> list[str]:
        return [
            f"{plural}/{n}"
            for (plural, ns, n), o in st.objects.items()
            if (o["metadata"].get("labels") or {}).get("servebook.io/deployment") == name
        ]

    got: list[str] = server.call(read)
    return got


def test_two_kubernetes_arms_come_up_are_benched_in_the_cluster_and_go_down_in_turn(
    job_cluster: tuple[Server, dict[str, str]], tmp_path: Path
) -> None:
    server, _env = job_cluster
    f = tmp_path / "exp.yaml"
    exp = spec.parse(
        {
            "baseline": "plain",
            "blocks": 1,
            "variable": ["engine_args"],
            "values": str(VALUES),
            "arms": [
                {"name": "plain", "recipe": "vllm-pd", "backend": "kubernetes"},
                {
                    "name": "seqs",
                    "recipe": "vllm-pd",
                    "backend": "kubernetes",
                    "set": {"extra_engine_args": "--max-num-seqs 64"},
                },
            ],
            "load": LOAD,
        },
        str(f),
    )
    session.prepare(exp)
    log: list[str] = []
    real = servebook_steps(exp, log.append, None)
    events: list[str] = []
    brought: list[str] = []

    def up(arm: Arm, name: str) -> str:
        # the arm before this one is gone from the cluster: one deployment at a time
        assert all(_deployment_objects(server, n) == [] for n in brought)
        brought.append(name)
        name = real.up(arm, name)
        events.append(f"up {name}: {len(_deployment_objects(server, name))} objects")
        return name

    verdicts: dict[str, str | None] = {}

    def verify(arm: Arm, name: str) -> str | None:
        # verify's own pass through the deployment's port-forwards; its verdict is kept
        # here, not acted on: the stand-in engines serve one fixed scrape of vLLM's
        # counters, so no counter moves in a window and SB302 (the handoff's evidence)
        # cannot pass on them (real engines: tests/engine, tests/cluster)
        verdicts[name] = real.verify(arm, name)
        return None

    def bench(arm: Arm, name: str | None, where: Path) -> None:
        real.bench(arm, name, where)
        events.append(f"benched {name}: {left_in(server)}")

    def down(arm: Arm, name: str) -> None:
        real.down(arm, name)
        events.append(f"down {name}: {_deployment_objects(server, name)}")

    with Kubelet(server, tmp_path / "kubelet") as kubelet:
        t0 = time.monotonic()
        state = session.execute(
            exp, tmp_path / "out", Steps(up, real.warm, verify, bench, down), log.append
        )
        took = time.monotonic() - t0
    order = [e["arm"] for e in state["schedule"]]
    names = [f"{a}-b1-{state['tag']}" for a in order]  # each its own, named for the experiment
    assert [e.split(":")[0] for e in events] == [
        f"{step} {n}" for n in names for step in ("up", "benched", "down")
    ], (events, state["schedule"], log[-20:])
    # each came up with its objects, its load Job's objects were deleted after its bench,
    # and down returned once the cluster had deleted every object of the deployment
    assert all(e.endswith(": []") for e in events if not e.startswith("up")), events
    assert all(int(e.split(": ")[1].split()[0]) > 0 for e in events if e.startswith("up"))
    # verify reached every role of each deployment (no SB305: each forward answered); what
    # it found wanting is only the counters that the fixed scrape cannot move
    assert set(verdicts) == set(names), verdicts
    for said in verdicts.values():
        assert said is not None and said.startswith("SB302 decode: no evidence of the handoff")
        assert "SB305" not in said, said
    outcomes = {e["arm"]: e["outcome"] for e in state["schedule"]}
    assert outcomes == {"plain": "done", "seqs": "done"}, (outcomes, log[-20:])
    # the load ran in the cluster: two Jobs' Pods, each ended on its own
    assert len(kubelet.ended) >= 1 and set(kubelet.ended.values()) == {0}, kubelet.ended
    for arm in ("plain", "seqs"):
        res = load_results(tmp_path / "out" / "arms" / arm / "block-1" / RESULTS_NAME)
        load = res.provenance.load
        assert load is not None and load.route == "cluster-service" and load.namespace == NS
        assert load.target_url == f"http://{arm}-b1-{state['tag']}-router.{NS}.svc:8000"
        (point,) = res.points
        assert point.errors == 0 and point.requests_ok >= 4, point.error_samples
    saved = json.loads((tmp_path / "out" / "experiment.json").read_text())
    assert [e["outcome"] for e in saved["schedule"]] == ["done", "done"]
    print(f"two Kubernetes arms in turn: {took:.1f} s")


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
