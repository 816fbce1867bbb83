"""verify and bench by name on a Kubernetes deployment whose Pods are real vLLM CPU servers.

No cluster is reachable here, so the Kubernetes API is the stand-in of
tests/unit/kube_standin.py (over real HTTP: server-side apply, rollout, port-forward over
v4.channel.k8s.io), and each Pod's forwarded port relays to a real tiny-pd role started
by the local backend: prefill and decode vLLM servers sharing KV through ExampleConnector,
vllm-router in front.  So everything on servebook's side of the API server is what a
cluster deployment gets: the view is opened from the cluster's objects, every role is
reached through a port-forward servebook holds, the tokenizer is the server's own
(/tokenize through the forward), and the handoff is proven per point from decode's
counters read through its forward.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from servebook.results.schema import RESULTS_NAME
from servebook.results.store import load_results
from tests.engine.conftest import Shared, sb
from tests.unit.job_kubelet import Kubelet
from tests.unit.kube_standin import Server, serve

pytestmark = pytest.mark.engine

SETS = ["--set", "image=vllm/vllm-openai-cpu:v0.32.0-x86_64", "--set", "node=kind-control-plane"]
# A one-node kind cluster as `kubectl get nodes,pods,namespaces -A -o json` shows it.
KIND = Path(__file__).parents[1] / "unit" / "fixtures" / "preflight" / "kind-one-node.json"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Server, dict[str, str]]]:
    server = serve()
    server.standin.ready_pods = True
    items = json.loads(KIND.read_text())["items"]
    server.call(lambda st: [st.put(copy.deepcopy(i)) for i in items])
    cfg = server.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield server, {**os.environ, "KUBECONFIG": str(cfg)}
    finally:
        server.stop()


@pytest.mark.shares("tiny-pd")
def test_verify_and_bench_by_name_through_port_forwards_to_real_engines(
    cluster: tuple[Server, dict[str, str]], tmp_path: Path, shared: Shared
) -> None:
    server, env = cluster
    dep = shared.get("tiny-pd")
    r = sb(env, "up", "tiny-pd", "--backend", "kubernetes", "--name", "kpd", *SETS)
    assert r.returncode == 0, r.stderr
    for role in ("prefill", "decode", "router"):
        server.standin.forward_to[f"{role}:8000"] = ("127.0.0.1", dep.role(role).port)
    metrics_port = dep.role("router").metrics_port
    assert metrics_port is not None
    server.standin.forward_to["router:29000"] = ("127.0.0.1", metrics_port)

    r = sb(env, "verify", "kpd", "--json", "--max-tokens", "32")
    assert r.returncode == 0, r.stdout + r.stderr
    findings = json.loads(r.stdout)["findings"]
    handoff = {f["subject"]: f["severity"] for f in findings if f["check"] == "SB302"}
    assert handoff.get("decode") == "pass" and set(handoff.values()) == {"pass"}, handoff

    out = tmp_path / "sweep"
    r = sb(
        env, "bench", "kpd", "--via", "port-forward", "--concurrency", "1,2",
        "--repetitions", "1", "--precision", "off",
        "--duration", "5s", "--warmup", "2s", "--min-requests", "4",
        "--input-len", "512", "--output-len", "16", "--order", "ascending",
        "--max-client-lag-ms", "250", "--min-achieved-concurrency", "0.5", "--seed", "1",
        "-o", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr

    # The main job on Kubernetes, beside kpd in the same namespace: live preflight
    # (the kind node, access review, dry run), up, verify, bench, report, down.  Its
    # sweep's prompts (seed 0) must be new to these engines: prompts decode has cached
    # from an earlier sweep need no transfer, and SB407 would rightly say so.
    # Its sweep runs next to the servers, in a load Job whose Pod the test's kubelet
    # runs as a local process (tests/unit/test_kube_bench_job.py's Kubelet), reaching
    # each engine at its Pod IP and the router by its Service's DNS name.
    ran = tmp_path / "run"
    # (at most three repetitions a level: the flow is under test here, not the figures)
    with Kubelet(server, tmp_path / "kubelet") as kubelet:
        r = sb(env, "run", "tiny-pd", "--backend", "kubernetes", "--name", "krun", *SETS,
                "--max-repetitions", "3", "-o", str(ran))  # fmt: skip
    assert kubelet.ended == {0: 0}, (kubelet.ended, r.stdout[-3000:], r.stderr[-3000:])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SB263" in r.stdout and "SB264" in r.stdout  # preflight ran live first
    assert (ran / "report.html").is_file()
    assert "down:" in r.stdout and "Deployment/krun-decode" in r.stdout
    assert sb(env, "status", "kpd").returncode == 0, "run's down touched kpd"
    main = load_results(ran / RESULTS_NAME)
    assert main.provenance.target["deployment"] == "krun"
    # Measured in the cluster, not through port-forwards from this machine.
    assert main.provenance.load is not None and main.provenance.load.route == "cluster-service"
    assert main.provenance.load.target_url == "http://krun-router.servebook.svc:8000"
    assert all(p.valid and p.server["handoff_share"] > 0 for p in main.points), main.points
    assert sorted(p.concurrency or 0 for p in main.points) == [1, 1, 1, 4, 4, 4]  # the cap held
    res = load_results(out / RESULTS_NAME)
    assert res.provenance.target["backend"] == "kubernetes"
    # No model directory on this machine for a cluster deployment: the server tokenized.
    assert res.provenance.workload["tokenizer"].startswith("server /tokenize at http://127.0.0.1")
    assert [(p.concurrency, p.valid) for p in res.points] == [(1, True), (2, True)]
    threshold = res.provenance.protocol["thresholds"]["min_handoff_share"]
    for p in res.points:
        assert p.server["handoff_share"] >= threshold > 0
        assert p.prompt_tokens_mismatch == 0
    # Command lines as applied come from the Pods, not from the local processes.
    decode = next(r for r in res.provenance.roles if r.name == "decode")
    assert any("/models/model" in a for a in decode.command), decode.command
