"""bench through port-forwards on the stand-in API server (tests/unit/kube_standin.py), at
a concurrency above httpx's default pool of 100 connections: every forwarded connection
holds one WebSocket (and so one of the dialer's pooled connections) for its life, so a
pool of 100 made the 101st dial wait and time out (issue 21)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from servebook.results.schema import RESULTS_NAME
from servebook.results.store import load_results
from tests.unit.kube_engines import UP, Cli
from tests.unit.kube_standin import Server

LEVEL = 256


def test_bench_via_port_forward_opens_256_streams_through_one_roles_forwards(
    cli: Cli,
    kube_cluster: tuple[Server, dict[str, str]],
    tmp_path: Path,
) -> None:
    from servebook.models.tiny import make_tiny_model

    _, env = kube_cluster
    assert cli(*UP, env=env).returncode == 0
    tok = tmp_path / "tok"
    make_tiny_model(tok)
    out = tmp_path / "sweep"
    args = [
        *("--via", "port-forward", "--tokenizer", str(tok), "--concurrency", str(LEVEL)),
        *("--repetitions", "1", "--precision", "off", "--duration", "3s", "--warmup", "0s"),
        *("--min-requests", str(LEVEL), "--input-len", "8", "--output-len", "16"),
        *("--max-client-lag-ms", "5000", "--min-achieved-concurrency", "0.5"),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "servebook", "bench", "vllm-pd", *args, "-o", str(out)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (out / RESULTS_NAME).exists(), done.stdout[-2000:] + done.stderr[-3000:]
    res = load_results(out / RESULTS_NAME)
    (point,) = res.points
    # Every request of the level went through the entry role's forwards, none timed out.
    assert point.errors == 0, (point.error_samples, done.stderr[-2000:])
    assert point.requests_ok >= LEVEL
    assert point.client.achieved_concurrency is not None
    assert point.client.achieved_concurrency > LEVEL / 2
    assert res.provenance.load is not None and res.provenance.load.route == "port-forward"
