"""`servebook attach --backend kubernetes` on deployments applied as plain manifests with
kubectl, shaped like llm-d's and like NVIDIA Dynamo's (tests/cluster/fixtures, which cite
their sources and say what differs): the stack is recognised by its own labels, and verify
proves the KV handoff from the engines' own counters, read through port-forwards the API
server authorizes. A decode engine started without the KV connector is caught, naming
decode.

Plane only: the stacks' images need GPUs and registries. On the plane their programs run
as this machine's: vLLM's server for `vllm serve`, and the plane's stand-ins for llm-d's
routing sidecar and Dynamo's `dynamo.vllm` worker and `dynamo.frontend`
(plane/cmd/kube-plane/agent_standins.go).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import REPO, Cluster, give_tenant, kubectl, sb

pytestmark = pytest.mark.cluster

FIXTURES = Path(__file__).parent / "fixtures"
GENERATOR = REPO / "src" / "servebook" / "models" / "tiny.py"
ROLLOUT_S = 900


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    if not cluster.plane:
        pytest.skip("the stacks' images need GPUs: these run on the test plane only")
    ns = f"sb-attach-{os.getpid()}-{int(time.time() * 1000) % 10**7}"
    give_tenant(
        cluster, ns
    )  # the operator's objects are applied by the admin; attach is the tenant's
    kubectl(
        "create", "configmap", "tiny-model-generator", "-n", ns,
        f"--from-file=tiny_model.py={GENERATOR}",
    )  # fmt: skip
    yield ns
    kubectl("delete", "namespace", ns, "--wait=false")


def _apply(fixture: str, ns: str) -> list[str]:
    """Apply a fixture in ns, the engines on gpu-0; the names of its Deployments."""
    text = (FIXTURES / fixture).read_text().replace("${NS}", ns).replace("${NODE}", "gpu-0")
    kubectl("apply", "-n", ns, "-f", "-", stdin=text)
    out = kubectl("get", "deployments", "-n", ns, "-o", "jsonpath={.items[*].metadata.name}")
    return out.split()


def _rolled_out(ns: str, deployments: list[str]) -> None:
    for d in deployments:
        wait = [f"deployment/{d}", "-n", ns, f"--timeout={ROLLOUT_S}s"]
        r = subprocess.run(
            ["kubectl", "rollout", "status", *wait],
            capture_output=True, text=True, timeout=ROLLOUT_S + 60,
        )  # fmt: skip
        if r.returncode != 0:
            pods = subprocess.run(
                ["kubectl", "describe", "pods", "-n", ns],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            raise AssertionError(f"{d} did not roll out: {r.stdout}{r.stderr}\n{pods.stdout}")


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's records in a home of its own."""
    monkeypatch.setenv("SERVEBOOK_HOME", str(tmp_path / "home"))


def _attach(name: str, ns: str) -> dict[str, Any]:
    r = sb("attach", name, "--backend", "kubernetes", "-n", ns, "--json", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    found: dict[str, Any] = json.loads(r.stdout)
    return found


def _verify(name: str) -> tuple[int, list[dict[str, Any]]]:
    r = sb("verify", name, "--json", "--max-tokens", "16", timeout=600)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)["findings"]


def _by_check(findings: list[dict[str, Any]], check: str) -> dict[str, str]:
    return {f["subject"]: f["severity"] for f in findings if f["check"] == check}


def test_llm_d_shaped_pd_is_attached_and_verified_and_decode_without_the_connector_fails(
    namespace: str,
) -> None:
    ns = namespace
    _rolled_out(ns, _apply("llm-d-pd.yaml", ns))
    found = _attach("lld", ns)
    assert found["stack"] == "llm-d" and found["recorded"] is True, found
    roles = {r["name"]: r for r in found["roles"]}
    assert set(roles) == {"prefill", "decode"}, found
    (decode,) = roles["decode"]["replicas"]
    # The engine behind the routing sidecar is read on its own port, never the sidecar's.
    assert decode["metrics"] == "http://:8200/metrics", decode
    assert "routing-proxy" in " ".join(decode["notes"]), decode
    assert found["entry"]["service"] == "infra-sim-inference-gateway-istio", found["entry"]
    code, findings = _verify("lld")
    handoff = _by_check(findings, "SB302")
    assert code == 0, findings
    assert handoff and set(handoff.values()) == {"pass"}, handoff
    assert handoff.get("decode") == "pass", handoff

    # The decode engine restarted without --kv-transfer-config: it still answers (it
    # recomputes every prompt), Ready as before.
    d = "ms-sim-llm-d-modelservice-decode"
    engine = "jsonpath={.spec.template.spec.containers[0].args}"
    args = json.loads(kubectl("get", f"deployment/{d}", "-n", ns, "-o", engine))
    i = args.index("--kv-transfer-config")
    del args[i : i + 2]
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}]
    kubectl("patch", f"deployment/{d}", "-n", ns, "--type=json", "-p", json.dumps(patch))
    _rolled_out(ns, [d])
    _wait_one_pod(ns, "llm-d.ai/role=decode")
    _attach("lld-open", ns)
    code, findings = _verify("lld-open")
    assert code == 1, findings
    failed = [f for f in findings if f["severity"] == "fail"]
    connector = [f for f in failed if "kv-transfer-config" in f["message"]]
    assert connector and "decode" in connector[0]["message"], failed
    assert not any("prefill" in f["message"].split(":")[0] for f in connector), connector


def test_dynamo_shaped_pd_is_attached_and_verified(namespace: str) -> None:
    ns = namespace
    _rolled_out(ns, _apply("dynamo-pd.yaml", ns))
    found = _attach("dyn", ns)
    assert found["stack"] == "dynamo" and found["recorded"] is True, found
    roles = {r["name"]: r for r in found["roles"]}
    assert set(roles) == {"prefill", "decode"}, found
    for role in roles.values():
        (replica,) = role["replicas"]
        # The workers' system port, where Dynamo passes vLLM's counters through.
        assert replica["metrics"] == "http://:9090/metrics", replica
    assert found["entry"]["service"] == "vllm-disagg-frontend", found["entry"]
    code, findings = _verify("dyn")
    handoff = _by_check(findings, "SB302")
    assert code == 0, findings
    assert handoff and set(handoff.values()) == {"pass"}, handoff
    assert handoff.get("decode") == "pass", handoff


def _wait_one_pod(ns: str, selector: str) -> None:
    """Until the old Pod of a rollout is gone (rollout status returns while it terminates)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        out = kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "name")
        if len(out.split()) == 1:
            return
        time.sleep(1)
    raise AssertionError(f"{selector}: more than one Pod after 180 s:\n{out}")
