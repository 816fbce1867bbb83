"""Tests against a real Kubernetes control plane.

By default they run against the test plane (`scripts/kube-plane`): a real kube-apiserver,
kube-controller-manager, kube-scheduler and etcd built from Kubernetes' own source, whose
node agent runs Pods as processes on this machine. A `KUBECONFIG` in the environment names a
real cluster instead, and takes precedence. A plane that cannot start fails the tests: it is
never a reason to skip them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from servebook.kube.snapshot import ClusterSnapshot, ClusterUnreachable, read_live

REPO = Path(__file__).resolve().parents[2]
PLANE = REPO / "scripts" / "kube-plane"
# On the plane no image is pulled: a container whose command is vLLM's server runs this
# machine's vLLM, whatever the image. The name is the one a CPU cluster would pull.
PLANE_IMAGE = "vllm/vllm-openai-cpu:v0.32.0-x86_64"
UP_S = 1800  # pulling a multi-GB image on a laptop cluster is most of it


def sb(
    *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run servebook as a user would, against the cluster of the test."""
    return subprocess.run(
        [sys.executable, "-m", "servebook", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def kubectl(*args: str, stdin: str | None = None) -> str:
    """kubectl against the cluster of the test (on the plane: the plane's own kubectl)."""
    r = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"kubectl {' '.join(args)}: {r.stderr}"
    return r.stdout


def set_values(where: list[str]) -> list[str]:
    """The NAME=VALUE words of a list of --set arguments."""
    return [where[i + 1] for i in range(0, len(where), 2)]


def mixed_sets(where: list[str]) -> list[str]:
    """tiny-mixed's --set arguments: tiny-pd's without `node` (one Pod, no shared KV)."""
    kept = [s for s in set_values(where) if not s.startswith("node=")]
    return [a for s in kept for a in ("--set", s)]


@dataclass(frozen=True)
class Cluster:
    kubeconfig: str
    plane: bool  # the test plane (Pods as local processes), not a cluster the user named
    bin_dir: str = ""  # the plane's own kubectl, put first on PATH


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster every test here talks to: the user's KUBECONFIG, or a plane of our own,
    started once for the package and stopped after its last test."""
    named = os.environ.get("KUBECONFIG")
    if named:
        yield Cluster(named, plane=False)
        return
    where = tmp_path_factory.mktemp("plane")
    built = subprocess.run([str(PLANE), "build"], capture_output=True, text=True, timeout=3600)
    if built.returncode != 0:
        pytest.fail(f"the test plane did not build:\n{built.stderr}", pytrace=False)
    up = subprocess.run(
        [str(PLANE), "up", str(where)], capture_output=True, text=True, timeout=1800
    )
    try:
        if up.returncode != 0:
            pytest.fail(f"the test plane did not start:\n{up.stdout}\n{up.stderr}", pytrace=False)
        bin_dir = str(Path(built.stdout.strip()).parent)
        yield Cluster(str(where / "kubeconfig"), plane=True, bin_dir=bin_dir)
    finally:
        subprocess.run([str(PLANE), "down", str(where)], capture_output=True, timeout=300)


@pytest.fixture(autouse=True)
def _kubeconfig(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test, and every servebook process it starts, talks to that cluster (and, on
    the plane, uses the plane's kubectl)."""
    monkeypatch.setenv("KUBECONFIG", cluster.kubeconfig)
    if cluster.bin_dir:
        monkeypatch.setenv("PATH", f"{cluster.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture
def live(cluster: Cluster) -> ClusterSnapshot:
    """The cluster, read as preflight reads it."""
    try:
        return read_live(connect_timeout_s=10)
    except ClusterUnreachable as e:
        pytest.fail(f"the cluster in {cluster.kubeconfig} does not answer: {e}", pytrace=False)


@pytest.fixture(scope="module")
def image(cluster: Cluster) -> str:
    """The engine image: any name on the plane (nothing is pulled); on a cluster of the
    user's, vLLM's CPU image that every node can pull (SERVEBOOK_TEST_IMAGE)."""
    named = os.environ.get("SERVEBOOK_TEST_IMAGE")
    if named:
        return named
    if not cluster.plane:
        pytest.skip("set SERVEBOOK_TEST_IMAGE to vLLM's CPU image to run the chain on your cluster")
    return PLANE_IMAGE


@pytest.fixture
def where(live: ClusterSnapshot, image: str) -> Iterator[list[str]]:
    """--set arguments for tiny-pd on this cluster, in a namespace of its own (tiny-mixed
    takes the same but `node`); afterwards nothing labelled by servebook is left there."""
    ready = [
        n
        for n, node in sorted(live.nodes.items())
        if any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in node.get("status", {}).get("conditions", [])
        )
    ]
    assert ready, "the cluster has no Ready node"
    node = "gpu-0" if "gpu-0" in ready else ready[0]  # the plane's first GPU node
    ns = f"sb-chain-{int(time.time())}"
    yield [a for s in (f"image={image}", f"node={node}", f"namespace={ns}") for a in ("--set", s)]
    left = sb("status", "--backend", "kubernetes", "-n", ns, "--json", timeout=120)
    for found in json.loads(left.stdout or "[]"):
        sb("down", found["name"], "--backend", "kubernetes", "-n", ns, timeout=600)
