"""Tests against a real Kubernetes cluster: skipped, with the reason, without one."""

from __future__ import annotations

import pytest

from servebook.kube.snapshot import ClusterSnapshot, ClusterUnreachable, read_live


@pytest.fixture(scope="session")
def live() -> ClusterSnapshot:
    """The cluster of the current KUBECONFIG/context, read once."""
    try:
        return read_live(connect_timeout_s=10)
    except ClusterUnreachable as e:
        pytest.skip(f"no reachable Kubernetes cluster: {e}")
