"""Rules lint (on the manifests) and verify (on the running engines' command lines, logs
and claims) or render both judge give the same verdict on the same input, one test per
pair, parametrised over the cases that split them:

* SB106 (lint) and SB310 (verify), the KV handoff: one rule, ``engines.cmdline.
  kv_role_problem`` and ``kv_connector_problems``.  Before, a pair whose kv_roles were
  reversed failed lint and passed verify.
* SB105 (lint) and SB308 (verify), speculation symmetry: ``engines.cmdline.
  compare_speculative``.
* SB112 (lint), SB309 (verify) and render's refusal of unacknowledged PD over TCP: whether
  the KV crosses by TCP, for every fabric profile (``engines.fabrics``) and connector it can
  tell.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from servebook.commands.render import render_files
from servebook.deployment.view import Claims, RoleView
from servebook.engines import fabrics
from servebook.errors import UsageError
from servebook.findings import Finding, Severity
from servebook.lint.loader import LintSet, parse_yaml
from servebook.lint.rules import check
from servebook.verify import rules as R
from servebook.verify.checks import check_kv_transport

SERVE = ["vllm", "serve", "/models/m", "--served-model-name", "m"]


def kv(connector: str | None, role: str | None = "kv_both") -> list[str]:
    if connector is None:
        return []
    cfg: dict[str, str] = {"kv_connector": connector}
    if role is not None:
        cfg["kv_role"] = role
    return ["--kv-transfer-config", json.dumps(cfg)]


def _deployment(role: str, args: list[str]) -> str:
    doc = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"m-{role}", "labels": {"llm-d.ai/role": role}},
        "spec": {
            "selector": {"matchLabels": {"app": role}},
            "template": {
                "metadata": {"labels": {"app": role, "llm-d.ai/role": role}},
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "command": args[:2],
                            "args": args[2:],
                        }
                    ]
                },
            },
        },
    }
    return json.dumps(doc)


def lint_fails(check_id: str, prefill: list[str], decode: list[str]) -> bool:
    text = _deployment("prefill", prefill) + "\n---\n" + _deployment("decode", decode)
    found = check(LintSet([parse_yaml(text, "pd.yaml")], []))
    return any(f.check == check_id and f.severity is Severity.FAIL for f in found)


def verify_fails(
    rule: Callable[[Claims, list[RoleView]], list[Finding]],
    prefill: list[str],
    decode: list[str],
    speculative: bool = False,
) -> bool:
    targets = [
        RoleView("prefill", "engine", "http://p", argv=prefill),
        RoleView("decode", "engine", "http://d", argv=decode),
        RoleView("router", "router", "http://r"),
    ]
    found = rule(Claims("pd", speculative, "m", "http://r"), targets)
    return any(f.severity is Severity.FAIL for f in found)


CASES = {
    "same connector, kv_both": (kv("NixlConnector"), kv("NixlConnector"), False),
    "producer and consumer": (
        kv("NixlConnector", "kv_producer"),
        kv("NixlConnector", "kv_consumer"),
        False,
    ),
    "roles reversed": (
        kv("NixlConnector", "kv_consumer"),
        kv("NixlConnector", "kv_producer"),
        True,
    ),
    "decode as producer": (kv("NixlConnector"), kv("NixlConnector", "kv_producer"), True),
    "decode without one": (kv("NixlConnector"), [], True),
    "prefill without one": ([], kv("NixlConnector"), True),
    "different connectors": (kv("NixlConnector"), kv("LMCacheConnectorV1"), True),
    "no kv_role (vLLM's default)": (kv("NixlConnector", None), kv("NixlConnector", None), False),
    # none on either command line: the launcher may load one (Dynamo's dynamo.vllm does);
    # verify warns and its handoff counters (SB302) decide
    "neither names one": ([], [], False),
}


@pytest.mark.parametrize(("p_kv", "d_kv", "fails"), list(CASES.values()), ids=list(CASES))
def test_lint_and_verify_give_the_same_verdict(
    p_kv: list[str], d_kv: list[str], fails: bool
) -> None:
    prefill, decode = [*SERVE, *p_kv], [*SERVE, *d_kv]
    verdicts = (
        lint_fails("SB106", prefill, decode),
        verify_fails(R.connector_on_every_engine, prefill, decode),
    )
    assert verdicts == (fails, fails)


# SB105 (lint) and SB308 (verify): the speculative configs of prefill and decode, by
# engines.cmdline.compare_speculative.


def spec(n: int | None) -> list[str]:
    if n is None:
        return []
    return ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": n})]


SPEC_CASES = {
    "identical": (spec(3), spec(3), False),
    "neither": (spec(None), spec(None), False),
    "decode only": (spec(None), spec(3), True),
    "prefill only": (spec(3), spec(None), True),
    "different token counts": (spec(3), spec(5), True),
}


@pytest.mark.parametrize(
    ("p_spec", "d_spec", "fails"), list(SPEC_CASES.values()), ids=list(SPEC_CASES)
)
def test_lint_and_verify_judge_speculation_alike(
    p_spec: list[str], d_spec: list[str], fails: bool
) -> None:
    kv_both = kv("NixlConnector")
    prefill, decode = [*SERVE, *kv_both, *p_spec], [*SERVE, *kv_both, *d_spec]
    verdicts = (
        lint_fails("SB105", prefill, decode),
        verify_fails(R.spec_symmetry, prefill, decode, speculative=True),
    )
    assert verdicts == (fails, fails)


# SB112 (lint, on the rendered Pods' transport settings), SB309 (verify, the transport the
# recipe's fabric claims against the engine log) and render's refusal of PD over TCP
# without allow_tcp_kv: one fact, whether the KV crosses by TCP, judged from the fabric
# profile (engines.fabrics) by render and verify and from what the profile renders by lint.

FABRICS = Path(__file__).parent / "fixtures" / "render" / "fabrics"
# A UCX endpoint that moves KV over TCP, as vLLM's NIXL logs it at UCX_LOG_LEVEL=info.
UCX_TCP_LOG = (
    "[1755810012.483920] [gpu-node-2:87   :1]     ucp_worker.c:1951 UCX  INFO  "
    "ucp_context_0 inter-node cfg#1 tag(tcp/eth0) rma(tcp/eth0) am(tcp/eth0) ka(tcp/eth0)"
)
FABRIC_CASES = [
    (values, connector)
    for values in sorted(p.name for p in FABRICS.iterdir())
    for connector in ("NixlConnector", "MooncakeConnector")
    if fabrics.connector_config(
        fabrics.profile(yaml.safe_load((FABRICS / values / "values.yaml").read_text())["fabric"]),
        connector,
    )
    is not None
]


@pytest.mark.parametrize(("values", "connector"), FABRIC_CASES)
def test_lint_render_and_verify_judge_tcp_kv_alike(values: str, connector: str) -> None:
    given = FABRICS / values / "values.yaml"
    fabric = yaml.safe_load(given.read_text())["fabric"]
    sets = [f"kv_connector={connector}", "allow_tcp_kv=true"]
    _, _, files = render_files("vllm-pd", sets, [given])
    docs = [parse_yaml(text, name) for name, text in files.items() if name.endswith(".yaml")]
    lint_says_tcp = any(f.check == "SB112" for f in check(LintSet(docs, [])))
    # verify: a log showing TCP passes only where the fabric claims TCP
    (sb309,) = check_kv_transport("prefill", fabric, UCX_TCP_LOG)
    verify_says_tcp = sb309.severity is Severity.PASS
    # render: PD over TCP is refused unless acknowledged
    try:
        render_files("vllm-pd", [f"kv_connector={connector}", "allow_tcp_kv=false"], [given])
        render_says_tcp = False
    except UsageError as e:
        assert "allow_tcp_kv" in str(e), e
        render_says_tcp = True
    claimed_tcp = fabrics.claimed_transport(fabric) == "tcp"
    assert (lint_says_tcp, verify_says_tcp, render_says_tcp) == (claimed_tcp,) * 3
