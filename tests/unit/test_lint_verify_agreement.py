"""Rules lint (on the manifests) and verify (on the running engines' command lines) both
judge give the same verdict on the same prefill and decode command lines. SB106 and SB310
judge the KV handoff by one rule (``engines.cmdline.kv_role_problem`` and
``kv_connector_problems``): on the same prefill and decode command lines they give the same
verdict. Before, a pair whose kv_roles were reversed failed lint and passed verify."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from servebook.deployment.view import Claims, RoleView
from servebook.findings import Finding, Severity
from servebook.lint.loader import LintSet, parse_yaml
from servebook.lint.rules import check
from servebook.verify import rules as R

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
