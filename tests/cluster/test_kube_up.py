"""`servebook up --backend kubernetes` against a real cluster (skipped without one).

A deploy whose weights directory does not exist on the node must fail within minutes,
naming the path and node (or, on a cluster without the GPU resource, the scheduler's
reason), not hang; `down` must then delete every object it applied.
"""

from __future__ import annotations

import time

import pytest

from servebook.kube.snapshot import ClusterSnapshot
from tests.cluster.conftest import sb

pytestmark = pytest.mark.cluster


def test_up_with_absent_weights_fails_fast_with_the_reason_and_down_cleans_up(
    live: ClusterSnapshot,
) -> None:
    node = sorted(live.nodes)[0]
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
        assert "/servebook-test/absent-weights is absent" in r.stderr or (
            "could not be scheduled" in r.stderr
        ), r.stderr
        assert took < 300, f"took {took:.0f} s to say so"
    finally:
        d = sb("down", ns, timeout=300)
    assert d.returncode == 0, d.stderr
    assert "deleted" in d.stdout


def test_down_then_up_at_once_reaches_the_same_verdict_not_a_terminating_namespace(
    live: ClusterSnapshot,
) -> None:
    """Issue 23 point 2: down waits until its objects (and the namespace it created) are
    gone, so an up straight after it applies into a fresh namespace."""
    node = sorted(live.nodes)[0]
    ns = f"servebook-again-{int(time.time())}"
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
    up = ["up", "vllm-mixed", "--backend", "kubernetes", "--name", ns, *args]
    try:
        first = sb(*up, timeout=600)
        assert first.returncode == 1, first.stderr
        d = sb("down", ns, timeout=900)
        assert d.returncode == 0, d.stderr
        again = sb(*up, timeout=600)
        assert again.returncode == 1, again.stderr
        assert "cannot become ready" in again.stderr, again.stderr
        assert "being terminated" not in again.stderr and "RBAC" not in again.stderr
    finally:
        sb("down", ns, timeout=900)
