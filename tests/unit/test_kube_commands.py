"""verify, bench and status by name on a Kubernetes deployment, over real HTTP: a stand-in
API server (tests/unit/kube_standin.py) that applies, rolls out and port-forwards as the
real one does, relaying each Pod's ports to a local stand-in engine that serves the
endpoints servebook reads (/health, /version, /metrics with counters captured from vLLM
0.32.0, streaming /v1/completions).

What is pinned: a forward that fails and a Pod replaced mid-command each end the command
naming the role, within its bound; status shows each role's Pod, node, readiness, restarts
and image.  Real engines behind the forwards, and a re-up after a change waiting for its new
Pods, on the plane: tests/cluster/test_tiny_pd_lifecycle.py."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from servebook.backends.kubernetes import deployer as kube
from servebook.kube.engine_pod import gpu_count
from servebook.recipe.resolve import resolve
from servebook.results.schema import RESULTS_NAME
from servebook.results.store import load_results
from tests.unit.kube_engines import UP, VALUES, Cli
from tests.unit.kube_standin import Server


def _pod(server: Server, role: str) -> dict[str, Any]:
    pods: list[dict[str, Any]] = server.call(lambda st: st.pods_of(role))
    (pod,) = pods
    return pod


def test_status_shows_each_roles_pod_node_readiness_restarts_and_image(
    cli: Cli, kube_cluster: tuple[Server, dict[str, str]]
) -> None:
    server, env = kube_cluster
    r = cli(*UP, env=env)
    assert r.returncode == 0, r.stderr
    r = cli("status", "vllm-pd", "--json", env=env)
    assert r.returncode == 0, r.stderr
    roles = {x["name"]: x for x in json.loads(r.stdout)["roles"]}
    assert set(roles) == {"prefill", "decode", "router"}
    for role, x in roles.items():
        assert x["state"] == "ready" and x["ok"] and x["ready"] is True
        assert x["pod"] == _pod(server, role)["metadata"]["name"]
        assert x["node"] == "node-1" and x["restarts_since_apply"] == 0
        assert x["image"] and x["image"] in r.stdout
    r = cli("status", "vllm-pd", env=env)
    assert r.returncode == 0 and "restarts since apply 0" in r.stdout, r.stdout


def test_verify_names_the_role_whose_forward_fails_within_its_bound(
    cli: Cli, kube_cluster: tuple[Server, dict[str, str]]
) -> None:
    server, env = kube_cluster
    assert cli(*UP, env=env).returncode == 0
    server.standin.forward_to.pop("decode:8000")  # nothing listens on decode's port
    t0 = time.monotonic()
    r = cli("verify", "vllm-pd", "--json", "--timeout", "10", "--health-timeout", "3", env=env)
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stdout + r.stderr
    assert took < 60, took
    failed = [f for f in json.loads(r.stdout)["findings"] if f["severity"] == "fail"]
    assert {f["subject"] for f in failed} >= {"decode"}, failed
    (reach,) = [f for f in failed if f["subject"] == "decode" and f["check"] == "SB305"]
    # The role's description carries the forward's failure: its Pod and the kubelet's word.
    pod = _pod(server, "decode")["metadata"]["name"]
    assert pod in reach["message"] and "error forwarding port 8000" in reach["message"], reach
    assert {f["subject"] for f in failed if f["check"] == "SB305"} == {"decode"}, failed


def test_bench_stops_naming_the_role_whose_pod_was_replaced(
    cli: Cli, kube_cluster: tuple[Server, dict[str, str]], tmp_path: Path, sb_home: Path
) -> None:
    """A Pod replaced mid-sweep: the point in flight is invalid naming the role (SB410),
    the sweep stops with exit 1 naming it, and nothing waits past the bound."""
    from servebook.models.tiny import make_tiny_model

    server, env = kube_cluster
    assert cli(*UP, env=env).returncode == 0
    tok = tmp_path / "tok"
    make_tiny_model(tok)
    out = tmp_path / "sweep"
    args = [
        *("--via", "port-forward", "--tokenizer", str(tok), "--concurrency", "1,2"),
        *("--repetitions", "3", "--precision", "off"),
        *("--duration", "2s", "--warmup", "0s", "--min-requests", "1", "--input-len", "8"),
        *("--output-len", "4", "--order", "ascending", "--max-client-lag-ms", "1000"),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "servebook", "bench", "vllm-pd", *args, "-o", str(out)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    results = out / RESULTS_NAME
    while not (results.exists() and load_results(results).points):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no point finished in 60 s"
        time.sleep(0.2)
    replaced_at = time.monotonic()
    saved = len(load_results(results).points)
    old = _pod(server, "decode")["metadata"]["name"]
    server.call(lambda st: st.replace_pod("decode"))
    stdout, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - replaced_at < 30
    assert proc.returncode == 1, stdout + stderr
    assert "bench stopped" in stderr and "decode" in stderr, stderr
    res = load_results(results)
    assert len(res.points) < 6
    last = res.points[-1]
    named = any(r.startswith("SB410: decode") and old in r for r in last.invalid_reasons)
    # Or the Pod went between a point's save and the check after it (seen under load): the
    # sweep then stopped after that point, naming decode, before another began.
    between = len(res.points) == saved and "role(s) decode" in stderr
    assert named or between, (saved, last.invalid_reasons, stderr)


def test_open_view_reads_argv_and_env_from_the_pods_as_applied(
    kube_cluster: tuple[Server, dict[str, str]],
) -> None:
    server, _ = kube_cluster
    plan = resolve("vllm-pd", [], [VALUES])
    kube.up(plan, name="vllm-pd", timeout_s=30, poll_s=0.1)
    with kube.open_view("vllm-pd") as view:
        assert [r.name for r in view.roles] == [r.name for r in plan.roles]
        decode = view.role("decode")
        container = _pod(server, "decode")["spec"]["containers"][0]
        assert decode.argv == [*container.get("command", []), *container.get("args", [])]
        assert decode.alive() is True and decode.api_url.startswith("http://127.0.0.1:")
        assert view.entry_url == view.role("router").api_url
        assert view.local_model_dir is None and view.accelerators
        assert "node-1" in decode.describe()
        port = int(decode.api_url.rsplit(":", 1)[1])
    with socket.socket() as s:  # the forwards are closed: their ports are free again
        s.bind(("127.0.0.1", port))


def test_tiny_pd_comes_up_with_its_model_generator_and_goes_down_without_a_record(
    cli: Cli, kube_cluster: tuple[Server, dict[str, str]], sb_home: Path
) -> None:
    """The tiny recipe for any cluster: its ConfigMap (the model generator) is applied
    before the roles that mount it, each engine Pod makes the model in an init container,
    and `down` found by label removes the ConfigMap too."""
    server, env = kube_cluster
    sets = ["--set", "image=vllm/vllm-openai-cpu:v0.32.0-x86_64", "--set", "node=node-1"]
    r = cli("up", "tiny-pd", "--backend", "kubernetes", "--name", "tpd", *sets, env=env)
    assert r.returncode == 0, r.stderr
    st = server.standin
    assert "tpd-model-generator" in st.names("configmaps", "servebook")
    kinds = [(s.method, s.path.rsplit("/", 2)[-2]) for s in st.requests if s.method == "PATCH"]
    assert kinds.index(("PATCH", "configmaps")) < kinds.index(("PATCH", "deployments"))
    pod = _pod(server, "decode")
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["make-model"]
    shutil.rmtree(sb_home / "deployments" / "tpd")
    r = cli("down", "tpd", "--backend", "kubernetes", "-n", "servebook", env=env)
    assert r.returncode == 0, r.stderr
    assert "ConfigMap/tpd-model-generator" in r.stdout and st.names("configmaps", "servebook") == []


def test_a_role_with_replicas_is_read_over_every_replica(
    kube_cluster: tuple[Server, dict[str, str]],
) -> None:
    """Three decode replicas behind one Service (the router spreads requests over them):
    the view forwards to each one's /metrics, and the role's counters are their sum, so a
    handoff served by any replica counts."""
    from servebook.metrics.scrape import scrape, scrape_replicas
    from servebook.recipe.resolve import resolve as resolve_recipe

    wide = Path(__file__).parent / "fixtures" / "render" / "vllm-pd-wide-ep-replicas"
    plan = resolve_recipe(
        "vllm-pd-wide-ep",
        ["decode_nodes_per_replica=1", "decode_replicas=3"],
        [wide / "values.yaml"],
    )
    assert (plan.role("decode").replicas, plan.role("prefill").replicas) == (3, 2)
    kube.up(plan, name="wide", timeout_s=30, poll_s=0.1)
    with kube.open_view("wide") as view:
        decode = view.role("decode")
        assert len(decode.replica_metrics_urls) == 2
        assert len(view.role("prefill").all_metrics_urls) == 2
        one = scrape(decode.metrics_url).value("vllm:prompt_tokens_total")
        every = scrape_replicas(decode.all_metrics_urls).value("vllm:prompt_tokens_total")
        assert one and every == 3 * one
        (target,) = [t for t in view.roles if t.name == "decode"]
        assert list(target.replica_metrics_urls) == list(decode.replica_metrics_urls)
        assert view.accelerators == sum(gpu_count(r) * r.replicas for r in plan.engine_roles)
