"""`servebook attach --backend kubernetes` on deployments servebook did not make, whose
engines are real vLLM CPU servers.

No cluster is reachable here, so the Kubernetes API is the stand-in of
tests/unit/kube_standin.py, holding Pods shaped like llm-d's and like NVIDIA Dynamo's
(tests/unit/fixtures/attach, which cite their sources), and each Pod's forwarded port
relays to a real engine of a tiny-pd deployment the local backend runs (prefill and decode
sharing KV through ExampleConnector, vllm-router in front), as tests/engine/
test_kube_view.py does for servebook's own.  The engine containers' argv is the one these
engines run, in the stack's own form (llm-d: `vllm serve` args, decode on 8200 behind the
routing proxy; Dynamo: `python3 -m dynamo.vllm`, counters on the system port 9090).  The
routing proxy's port relays to the router, whose /metrics are not an engine's: reading it
would be wrong, and the test would see it.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from servebook.backends import local
from servebook.recipe.resolve import resolve
from tests.engine.conftest import deployed
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


def _sb(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    code = "from servebook.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
        env=env,
    )  # fmt: skip


def _attach(env: dict[str, str], name: str, ns: str) -> subprocess.CompletedProcess[str]:
    """`servebook attach NAME --backend kubernetes -n NS --json`."""
    code = (
        "import sys; from servebook.commands.attach_kube import attach_kubernetes; "
        "attach_kubernetes(sys.argv[1], sys.argv[2], [], None, None, dry_run=False, "
        "json_out=True)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, name, ns], capture_output=True, text=True, timeout=120,
        env=env,
    )  # fmt: skip


def _items(name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())["items"]
    return copy.deepcopy(items)


def _engine(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] in ("vllm", "main"))


def _llm_d(server: Server, dep: local.Deployment, args: dict[str, list[str]]) -> None:
    """The llm-d fixture with one decode replica, its engines' args those of tiny-pd."""
    items = [i for i in _items("llm-d") if not i["metadata"]["name"].endswith("9zt7w")]
    for pod in [i for i in items if i["kind"] == "Pod"]:
        name, labels = pod["metadata"]["name"], pod["metadata"]["labels"]
        role = labels.get("llm-d.ai/role")
        if role:
            port = "8000" if role == "prefill" else "8200"
            _engine(pod)["args"] = [*args[role], "--port", port]
            server.standin.forward_to[f"pod/{name}:{port}"] = ("127.0.0.1", dep.role(role).port)
            # the routing proxy's port: the router answers there, never an engine
            server.standin.forward_to[f"pod/{name}:8000"] = (
                "127.0.0.1",
                dep.role(role if role == "prefill" else "router").port,
            )
        elif "gateway.networking.k8s.io/gateway-name" in labels:
            server.standin.forward_to[f"pod/{name}:80"] = ("127.0.0.1", dep.role("router").port)
    server.call(lambda st: [st.put(i) for i in items])


def _dynamo(server: Server, dep: local.Deployment, args: dict[str, list[str]]) -> None:
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
            server.standin.forward_to[f"pod/{name}:9090"] = ("127.0.0.1", dep.role(role).port)
        else:  # the frontend
            server.standin.forward_to[f"pod/{name}:8000"] = ("127.0.0.1", dep.role("router").port)
    server.call(lambda st: [st.put(i) for i in items])


def _handoff(findings: list[dict[str, Any]]) -> dict[str, str]:
    return {f["subject"]: f["severity"] for f in findings if f["check"] == "SB302"}


def test_llm_d_and_dynamo_shaped_pd_attached_and_verified_on_real_engines(
    cluster: tuple[Server, dict[str, str]],
) -> None:
    server, env = cluster
    plan = resolve("tiny-pd", state_dir=local.state_dir_for("attach-kube"))
    args = {r: list(plan.role(r).args) for r in ("prefill", "decode")}
    with deployed(plan, "attach-kube") as dep:
        _llm_d(server, dep, args)
        _dynamo(server, dep, args)
        for name, ns, stack in (("lld", "llm-d", "llm-d"), ("dyn", "dynamo", "dynamo")):
            r = _attach(env, name, ns)
            assert r.returncode == 0, r.stdout + r.stderr
            found = json.loads(r.stdout)
            assert found["stack"] == stack and found["recorded"] is True, found
            r = _sb(env, "verify", name, "--json", "--max-tokens", "32")
            assert r.returncode == 0, r.stdout + r.stderr
            findings = json.loads(r.stdout)["findings"]
            handoff = _handoff(findings)
            assert handoff and set(handoff.values()) == {"pass"}, (name, handoff)
            assert "decode" in " ".join(handoff), handoff
