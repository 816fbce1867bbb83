"""`servebook up --backend kubernetes` against a real cluster (skipped without one).

A deploy whose weights directory does not exist on the node must fail within minutes,
naming the path and node (or, on a cluster without the GPU resource, the scheduler's
reason), not hang; `down` must then delete every object it applied.  (`up` straight after
`down`, into the namespace `down` deleted, is in test_tiny_pd_lifecycle.py.)
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from servebook.kube.snapshot import ClusterSnapshot
from tests.cluster.conftest import sb

pytestmark = pytest.mark.cluster


def _gpus(node: dict[str, Any]) -> int:
    return int(node.get("status", {}).get("allocatable", {}).get("nvidia.com/gpu", "0"))


@pytest.mark.admin(
    "up creates the namespace it deploys into (and down deletes it): the path of a caller who "
    "may create namespaces, which a tenant may not"
)
def test_up_with_absent_weights_fails_fast_with_the_reason_and_down_cleans_up(
    live: ClusterSnapshot,
) -> None:
    # A node with the GPUs the recipe asks for (the plane's gpu-0), so that the weights are
    # what is missing: on another node the verdict is the scheduler's, after its grace.
    gpus = [n for n, node in sorted(live.nodes.items()) if _gpus(node) >= 1]
    node = (gpus or sorted(live.nodes))[0]
    ns = f"servebook-test-{int(time.time())}"
    sets = [
        "image=busybox:1.36",
        f"namespace={ns}",
        f"node={node}",
        "model_dir=/servebook-test/absent-weights",
        "gpus=1",
        "tensor_parallel=1",
        "startup_timeout_s=300",
    ]
    args = [a for s in sets for a in ("--set", s)]
    t0 = time.monotonic()
    try:
        r = sb("up", "vllm-mixed", "--backend", "kubernetes", "--name", ns, *args, timeout=600)
        took = time.monotonic() - t0
        assert r.returncode == 1, r.stderr
        assert "cannot become ready" in r.stderr
        if gpus:  # the weights' verdict, naming the path and the node
            assert "/servebook-test/absent-weights is absent" in r.stderr, r.stderr
            assert node in r.stderr, r.stderr
        else:
            assert "could not be scheduled" in r.stderr, r.stderr
        assert took < 300, f"took {took:.0f} s to say so"
    finally:
        d = sb("down", ns, timeout=300)
    assert d.returncode == 0, d.stderr
    assert "deleted" in d.stdout
