"""The four-topology experiment where its users run it (issue 43): `servebook experiment`
with the four tiny recipes as `backend: kubernetes` arms, run as the plane's tenant in a
namespace it was given.  Each entry of the schedule is a fresh deployment (real vLLM CPU
engines in Pods, vllm-router in front of the PD arms, the model made in the Pods), warmed
up, verified from the engines' own counters through port-forwards (the PD arms' handoff,
the spec arms' acceptance), benched by a load Job beside the engines and taken down before
the next comes up.  Half-way through the run gets the Ctrl-C a user sends: it takes down
the deployment it was bringing up, and `--resume` brings that one up again under the same
name at once and finishes the schedule on the cluster.

Then the same checks as the local engine test (tests/four_arms.py): every verify passed,
every point valid, every PD point's handoff above its threshold, the evidence and the
ratios of every arm and level, and a report.md whose provenance names the Pods' image.

The prompts are random 256-token ones: a dataset of this machine cannot reach the Pods.
The engines run with `--block-size 32` as in the local test (ExampleConnector hands over
whole blocks of the prompt less its last token).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from servebook.results.schema import RESULTS_NAME
from servebook.results.store import load_results
from tests.cluster.conftest import sb
from tests.four_arms import (
    ARM_ENTRIES,
    ARMS,
    LOAD,
    PAIRS,
    check_evidence,
    check_pr_report,
    check_schedule,
)

pytestmark = pytest.mark.cluster

BOUND_S = 1800  # 8 bring-ups (12 engines, 4 routers) on a shared 2-core machine
STOP_AT = "[6/8]"  # the Ctrl-C comes while the sixth deployment is being applied


def _values(where: list[str]) -> dict[str, str]:
    """The `--set NAME=VALUE` words of ``where`` as an experiment's `values:`."""
    pairs = (where[i + 1].split("=", 1) for i in range(0, len(where), 2))
    return dict(pairs)


def _interrupted(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """`servebook ARGS` until its output says the sixth entry's Deployment was created,
    then SIGINT; ``(exit code, output)``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "servebook", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + BOUND_S
    sixth = False
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=5)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        sixth = sixth or STOP_AT in line
        if sixth and "created Deployment/" in line:
            proc.send_signal(signal.SIGINT)
            break
    try:
        proc.wait(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the experiment did not end within 600 s of its Ctrl-C:\n" + "".join(seen))
    while (line := lines.get(timeout=30)) is not None:
        seen.append(line)
    assert sixth, "the schedule never reached its sixth entry:\n" + "".join(seen)
    return proc.returncode, "".join(seen)


def _left(ns: str) -> list[dict[str, Any]]:
    r = sb("status", "--backend", "kubernetes", "-n", ns, "--json", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return list(json.loads(r.stdout or "[]"))


@pytest.mark.timeout(2 * BOUND_S)
def test_the_four_tiny_topologies_as_kubernetes_arms_interrupted_and_resumed(
    where: list[str], image: str, tenant_ns: str, tmp_path: Path
) -> None:
    values = {**_values(where), "extra_engine_args": "--block-size 32"}
    experiment = {
        "baseline": "mixed",
        "blocks": 2,
        "variable": ["topology"],
        "values": values,
        "arms": [{**arm, "backend": "kubernetes"} for arm in ARM_ENTRIES],
        "pairs": PAIRS,
        "load": {**LOAD, "input-len": 256},
    }
    f = tmp_path / "four-topologies-on-kubernetes.yaml"
    f.write_text(yaml.safe_dump(experiment, sort_keys=False))
    out, home = tmp_path / "exp", tmp_path / "sbhome"
    env = {"SERVEBOOK_HOME": str(home), "COLUMNS": "200"}
    started = time.monotonic()

    code, said = _interrupted(["experiment", str(f), "-o", str(out)], env)
    assert code != 0, said
    assert "--resume" in said, said  # it says how to go on
    left = _left(tenant_ns)
    assert left == [], f"the interrupted entry's deployment was left up: {left}\n{said[-3000:]}"

    r = sb("experiment", str(f), "-o", str(out), "--resume", timeout=BOUND_S, env=env)
    took = time.monotonic() - started
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    assert "resuming: 5 of 8 benches finished, 3 to go" in r.stdout + r.stderr, r.stderr[:3000]
    assert _left(tenant_ns) == [], "the experiment left deployments up"
    print(f"experiment on the plane, interrupted and resumed: {took:.0f} s")

    state = json.loads((out / "experiment.json").read_text())
    check_schedule(state, out)
    check_evidence(state)
    for e in state["schedule"]:
        res = load_results(out / "arms" / e["arm"] / f"block-{e['block']}" / RESULTS_NAME)
        assert res.provenance.target["backend"] == "kubernetes"
        load = res.provenance.load
        assert load is not None and load.route == "cluster-service", load
        assert load.namespace == tenant_ns, load
        images = {r.name: r.image for r in res.provenance.roles}
        assert images.pop("router", "vllm-router") and set(images.values()) == {image}, images
    pairs = [c for c in state["pair_comparisons"] if c["metric"] == "output_tokens_per_s"]
    assert sorted(c["concurrency"] for c in pairs) == [1.0, 4.0], pairs

    rep = sb("report", str(out), timeout=120, env=env)
    assert rep.returncode == 0, rep.stderr
    check_pr_report(out, home, tmp_path)
    md = (out / "report.md").read_text()
    for arm in ARMS:
        row = next(line for line in md.splitlines() if line.startswith(f"| {arm} | recipe "))
        assert image in row and "on kubernetes" in row, row
