"""`bench NAME` of a deployment attached on Kubernetes (an llm-d P/D deployment servebook
did not make, on the stand-in API server, tests/unit/kube_standin.py): through port-forwards,
as a dry run, and refused when a recorded Pod is gone.  The load Job's own runs (agents in
Pods, failures, Ctrl-C) are on the test plane: tests/cluster/test_bench_in_cluster.py and
tests/cluster/test_cluster_faults.py.
"""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servebook.kube import load_job as lj
from servebook.results.schema import RESULTS_NAME
from servebook.results.store import load_results
from tests.unit.cli_inprocess import run_cli
from tests.unit.kube_engines import Cli, TokenizingEngine
from tests.unit.kube_standin import Server, serve

SWEEP = [
    *("--concurrency", "2", "--repetitions", "1", "--precision", "off", "--duration", "2s"),
    *("--warmup", "0s", "--min-requests", "4", "--input-len", "8", "--output-len", "4"),
    *("--max-client-lag-ms", "5000", "--min-achieved-concurrency", "0.3"),
]


def _bench(env: dict[str, str], *args: str, name: str) -> subprocess.CompletedProcess[str]:
    """``servebook bench NAME ARGS`` in this process (``cli_inprocess``: a child's start
    cost a second of CPU), ``env`` added to the environment."""
    return run_cli(("bench", name, *args), env)


def left_in(server: Server, ns: str) -> list[str]:
    """The objects of a load Job still in the namespace (by their run label)."""

    def read(st: Any) -> list[str]:
        return [
            f"{plural}/{n}"
            for plural in ("jobs", "secrets", "configmaps", "services", "pods")
            for n in st.names(plural, ns)
            if lj.RUN_LABEL in (st.objects[(plural, ns, n)]["metadata"].get("labels") or {})
        ]

    got: list[str] = server.call(read)
    return got


LLMD = "llm-d"
LLMD_ENTRY = "infra-sim-inference-gateway-istio"
LlmD = tuple[Server, dict[str, str], dict[str, TokenizingEngine]]


@pytest.fixture
def llm_d(tmp_path: Path, sb_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LlmD]:
    """An llm-d P/D deployment servebook did not make (tests/unit/fixtures/attach/llm-d.yaml:
    a prefill Pod, two decode Pods behind their routing sidecar, the gateway behind the entry
    Service), each Pod with the address its kubelet reports once it runs, each engine port
    (and the gateway's) a stand-in engine of its own."""
    from tests.unit.conftest import stack_objects
    from tests.unit.kube_standin import pod_ip

    server = serve()
    objs = stack_objects(LLMD)
    engines: dict[str, TokenizingEngine] = {}
    for pod in objs.pods:
        name = pod["metadata"]["name"]
        role = (pod["metadata"].get("labels") or {}).get("llm-d.ai/role")
        port = {"prefill": 8000, "decode": 8200}.get(str(role), 80)
        if role is None and not name.startswith(LLMD_ENTRY):
            continue  # the endpoint picker: nothing of the load reaches it
        engines[name] = TokenizingEngine(str(role or "router"))
        engines[name].start()
        server.standin.forward_to[f"pod/{name}:{port}"] = ("127.0.0.1", engines[name].port)

    def load(st: Any) -> None:
        # The namespace the operator's Pods live in (a real cluster has it: they are there).
        st.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LLMD}})
        for item in [*objs.pods, *objs.services, *objs.deployments]:
            st.put(copy.deepcopy(item))
        for pod in objs.pods:
            pod_ip(st.objects[("pods", LLMD, pod["metadata"]["name"])])

    server.call(load)
    cfg = server.write_kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    try:
        yield server, {"KUBECONFIG": str(cfg)}, engines
    finally:
        for e in engines.values():
            e.stop()
        server.stop()


@pytest.fixture
def attached(cli: Cli, llm_d: LlmD) -> LlmD:
    """llm_d, attached as ``llmd`` (`servebook attach llmd --backend kubernetes -n llm-d`)."""
    done = cli("attach", "llmd", "--backend", "kubernetes", "-n", LLMD, env=llm_d[1])
    assert done.returncode == 0, done.stderr
    return llm_d


def test_bench_via_port_forward_of_an_attached_deployment_runs_and_records_that_route(
    attached: LlmD, tmp_path: Path
) -> None:
    """README: `--via port-forward` measures a deployment on Kubernetes from this machine
    through port-forwards.  One attached there was refused ("reached directly"), and had
    it run, its route would have been recorded as direct: the route is the view's now."""
    server, env, _ = attached
    out = tmp_path / "forwarded"
    done = _bench(env, *SWEEP, "--via", "port-forward", "-o", str(out), name="llmd")
    assert done.returncode in (0, 1), done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    load = load_results(out / RESULTS_NAME).provenance.load
    assert load is not None and load.route == "port-forward", load
    assert load.route_detail and "port-forward" in load.route_detail
    assert load.job is None and left_in(server, LLMD) == []  # no load Job was made
    (point,) = load_results(out / RESULTS_NAME).points
    assert point.errors == 0 and point.requests_ok >= 4, point.error_samples


def test_bench_dry_run_of_an_attached_deployment_writes_no_key(
    attached: LlmD, tmp_path: Path
) -> None:
    _, env, _ = attached
    out = tmp_path / "dry"
    key = "sk-never-in-a-file"
    r = _bench(env, *SWEEP, "--dry-run", "--api-key", key, "-o", str(out), name="llmd")
    assert r.returncode == 0, r.stderr
    text = "".join(f.read_text() for f in sorted(out.iterdir()))
    assert key not in text
    assert "ghcr.io/llm-d/llm-d-cuda:v0.6.0" in text
    assert f"{LLMD_ENTRY}.{LLMD}.svc:80" in text
    assert f"The Secret's {lj.API_KEY_KEY} is left empty" in text


def test_an_attached_pod_gone_since_is_exit_2_naming_it_and_nothing_is_created(
    attached: LlmD, tmp_path: Path
) -> None:
    server, env, _ = attached
    victim = "ms-sim-llm-d-modelservice-decode-7c8b9d6f5-9zt7w"
    server.call(lambda st: st.objects.pop(("pods", LLMD, victim)))
    r = _bench(env, *SWEEP, "-o", str(tmp_path / "o"), name="llmd")
    assert r.returncode == 2, r.stderr
    assert f"role decode Pod {victim} is gone from namespace {LLMD}" in r.stderr, r.stderr
    assert "servebook attach llmd --backend kubernetes -n llm-d" in r.stderr
    created = [s for s in server.standin.requests if s.method in ("PATCH", "POST")]
    assert created == [] and left_in(server, LLMD) == []
