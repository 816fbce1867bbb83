"""A fixture cluster on the stand-in API server for live preflight (tests/unit/
test_preflight_live.py, test_preflight_rbac.py): the nodes of ``fixtures/preflight``, a
probe kubelet that reports a model's weights, and the calls that run preflight on it."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servebook.findings import Finding
from servebook.preflight import probe as P
from servebook.preflight.live import LiveOptions, plan_findings
from servebook.recipe.plan import Plan
from servebook.recipe.resolve import resolve
from tests.conftest import GPU_PD_SETS
from tests.unit.kube_standin import Server, StandIn

FIX = Path(__file__).parent / "fixtures" / "preflight"
LLAMA_70B_BYTES = 141_107_412_992  # a 70B model in BF16: its index's total_size
KIMI_K2_FP8_BYTES = 1_029_174_409_216  # a 1T-parameter MoE in FP8


def probe_output(weights_bytes: int) -> Callable[[dict[str, Any]], str]:
    """What the probe prints on a node: the probe's own document, with its SB204 finding
    (the weight files' bytes) as it reports a complete directory."""

    def logs(pod: dict[str, Any]) -> str:
        f = P.finding(
            "SB204",
            P.PASS,
            "/servebook-probe/model",
            "30 weight file(s), " + P._human_bytes(weights_bytes),
            {
                "files": [f"model-{i:05d}-of-00030.safetensors" for i in range(30)],
                "bytes": weights_bytes,
            },
        )
        return json.dumps(P.to_document([f]))

    return logs


def load_cluster(server: Server, fixture: str = "healthy.json") -> None:
    doc = json.loads((FIX / fixture).read_text())

    def put(st: StandIn) -> None:
        for item in doc["items"]:
            st.put(copy.deepcopy(item))

    server.call(put)


def plan(*extra: str) -> Plan:
    return resolve("vllm-pd", [*GPU_PD_SETS, *extra], [])


def run(cfg: Path, p: Plan, **kw: Any) -> list[Finding]:
    opts = LiveOptions(kubeconfig=str(cfg), poll_s=0.05, **kw)
    return plan_findings(p, options=opts)


def by_check(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]
