"""`servebook attach --backend kubernetes` on deployments servebook did not make, whose
engines are real vLLM CPU servers.

No cluster is reachable here, so the Kubernetes API is the stand-in of
tests/unit/kube_standin.py, holding Pods shaped like llm-d's and like NVIDIA Dynamo's
(tests/unit/fixtures/attach, which cite their sources), and each Pod's forwarded port
relays to a real engine of a tiny-pd deployment the local backend runs (prefill and decode
sharing KV through ExampleConnector, vllm-router in front).  The engine containers' argv
is the one these engines run, in the stack's own form (llm-d: `vllm serve` args, decode
on 8200 behind the routing proxy; Dynamo: `python3 -m dynamo.vllm`, counters on the
system port 9090).  The routing proxy's port relays to the router, whose /metrics are not
an engine's: reading it would be wrong, and the test would see it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from servebook import http
from servebook.backends.local import deployer as local
from servebook.engines import vllm
from servebook.recipe.resolve import resolve
from tests.engine.conftest import Shared, sb
from tests.unit.kube_standin import Server, serve

pytestmark = pytest.mark.engine

FIXTURES = Path(__file__).parents[1] / "unit" / "fixtures" / "attach"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Server, dict[str, str]]]:
    server = serve()
    cfg = server.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield server, {**os.environ, "KUBECONFIG": str(cfg)}
    finally:
        server.stop()


def _items(name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())["items"]
    return copy.deepcopy(items)


def _engine(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] in ("vllm", "main"))


SECOND = "ms-sim-llm-d-modelservice-decode-7c8b9d6f5-9zt7w"  # the fixture's 2nd decode


def _llm_d(
    server: Server,
    ports: dict[str, int],
    args: dict[str, list[str]],
    *,
    ns: str = "llm-d",
    second: tuple[int, list[str]] | None = None,
) -> None:
    """The llm-d fixture, its engines' args those of tiny-pd; its second decode replica
    only when ``second`` gives the (port, args) of the engine it stands for."""
    items = [i for i in _items("llm-d") if second or i["metadata"]["name"] != SECOND]
    for item in items:
        item["metadata"]["namespace"] = ns
    for pod in [i for i in items if i["kind"] == "Pod"]:
        name, labels = pod["metadata"]["name"], pod["metadata"]["labels"]
        role = labels.get("llm-d.ai/role")
        if role:
            port, engine = "8000" if role == "prefill" else "8200", ports[role]
            own = args[role]
            if name == SECOND and second is not None:
                engine, own = second
            _engine(pod)["args"] = [*own, "--port", port]
            server.standin.forward_to[f"pod/{name}:{port}"] = ("127.0.0.1", engine)
            # the routing proxy's port: the router answers there, never an engine
            if role == "decode":
                server.standin.forward_to[f"pod/{name}:8000"] = ("127.0.0.1", ports["router"])
        elif "gateway.networking.k8s.io/gateway-name" in labels:
            server.standin.forward_to[f"pod/{name}:80"] = ("127.0.0.1", ports["router"])
    server.call(lambda st: [st.put(i) for i in items])


def _dynamo(server: Server, ports: dict[str, int], args: dict[str, list[str]]) -> None:
    """The Dynamo fixture, its workers' `python3 -m dynamo.vllm` args those of tiny-pd:
    vLLM's /health and counters are where Dynamo's system port passes them through."""
    items = _items("dynamo")
    for pod in [i for i in items if i["kind"] == "Pod"]:
        name, labels = pod["metadata"]["name"], pod["metadata"]["labels"]
        role = labels.get("nvidia.com/dynamo-sub-component-type")
        if role:
            c = _engine(pod)
            c["command"], c["args"] = ["python3", "-m", "dynamo.vllm"], [
                *args[role], "--disaggregation-mode", role
            ]  # fmt: skip
            server.standin.forward_to[f"pod/{name}:9090"] = ("127.0.0.1", ports[role])
        else:  # the frontend
            server.standin.forward_to[f"pod/{name}:8000"] = ("127.0.0.1", ports["router"])
    server.call(lambda st: [st.put(i) for i in items])


def _handoff(findings: list[dict[str, Any]]) -> dict[str, str]:
    return {f["subject"]: f["severity"] for f in findings if f["check"] == "SB302"}


@pytest.mark.shares("tiny-pd")
def test_llm_d_and_dynamo_shaped_pd_pass_and_a_decode_replica_failing_open_fails(
    cluster: tuple[Server, dict[str, str]], tmp_path: Path, shared: Shared
) -> None:
    server, env = cluster
    dep = shared.get("tiny-pd")
    plan = resolve("tiny-pd", state_dir=local.state_dir_for(dep.name))  # dep's own args
    args = {r: list(plan.role(r).args) for r in ("prefill", "decode")}
    ports = {r: dep.role(r).port for r in ("prefill", "decode", "router")}
    _llm_d(server, ports, args)
    _dynamo(server, ports, args)
    for name, ns, stack in (("lld", "llm-d", "llm-d"), ("dyn", "dynamo", "dynamo")):
        r = sb(env, "attach", name, "--backend", "kubernetes", "-n", ns, "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        found = json.loads(r.stdout)
        assert found["stack"] == stack and found["recorded"] is True, found
        r = sb(env, "verify", name, "--json", "--max-tokens", "32")
        assert r.returncode == 0, r.stdout + r.stderr
        findings = json.loads(r.stdout)["findings"]
        handoff = _handoff(findings)
        assert handoff and set(handoff.values()) == {"pass"}, (name, handoff)
        assert "decode" in " ".join(handoff), handoff

    # Two decode replicas behind one router (round robin); the second reads its KV
    # from a directory prefill never writes: it answers, recomputing every prompt.
    d2_args = list(args["decode"])
    i = d2_args.index("--kv-transfer-config") + 1
    cfg = json.loads(d2_args[i])
    elsewhere = tmp_path / "other-storage"
    elsewhere.mkdir()
    cfg["kv_connector_extra_config"]["shared_storage_path"] = str(elsewhere)
    d2_args[i] = json.dumps(cfg)
    with _by_hand(dep, d2_args, tmp_path) as (d2_port, router_port):
        _llm_d(server, {**ports, "router": router_port}, args, ns="llm-d-2",
               second=(d2_port, d2_args))  # fmt: skip
        r = sb(env, "attach", "two", "--backend", "kubernetes", "-n", "llm-d-2", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        decode = next(x for x in json.loads(r.stdout)["roles"] if x["name"] == "decode")
        assert len(decode["replicas"]) == 2
        r = sb(env, "verify", "two", "--json", "--max-tokens", "16")
        assert r.returncode == 1, r.stdout + r.stderr
        handoff = _handoff(json.loads(r.stdout)["findings"])
        assert handoff.get(f"decode {SECOND}") == "fail", handoff
        first = next(s for s in handoff if s.startswith("decode ") and SECOND not in s)
        assert handoff[first] == "pass", handoff


def _wait_health(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{url}: exited {proc.returncode}"
        try:
            if http.get(url, timeout=2).status == 200:
                return
        except http.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} not healthy in {timeout_s}s")


@contextlib.contextmanager
def _by_hand(
    dep: local.Deployment, d2_args: list[str], tmp_path: Path
) -> Iterator[tuple[int, int]]:
    """A second decode engine and a router over both decodes, started by hand (not through
    `up`); ``(decode port, router port)``.  Both are stopped, by process group, after."""
    d2_port, router_port, metrics_port = (_free_port() for _ in range(3))
    env = {**os.environ, **dict(resolve("tiny-pd").role("decode").env)}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        log = (tmp_path / "d2.log").open("wb")
        procs.append(subprocess.Popen(
            vllm.server_argv(sys.executable, d2_args, "127.0.0.1", d2_port),
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        ))  # fmt: skip
        _wait_health(f"http://127.0.0.1:{d2_port}/health", procs[0], 400)
        router = vllm.router_argv(
            local.router_binary(),
            prefill_url=dep.role("prefill").url,
            decode_url=dep.role("decode").url,
            host="127.0.0.1",
            port=router_port,
            extra=["--decode", f"http://127.0.0.1:{d2_port}", "--decode-policy", "round_robin",
                   "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)],
        )  # fmt: skip
        rlog = (tmp_path / "router2.log").open("wb")
        procs.append(subprocess.Popen(router, stdout=rlog, stderr=subprocess.STDOUT,
                                      start_new_session=True))  # fmt: skip
        _wait_health(f"http://127.0.0.1:{router_port}/readiness", procs[1], 120)
        yield d2_port, router_port
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
