"""lint (SB105) and verify (SB308) read an engine's command line through one parser and
judge speculation symmetry by one rule: the same two command lines get the same verdict
from both.  The first two pairs passed verify and failed lint before they shared it."""

from __future__ import annotations

import json

import pytest

from servebook.findings import Finding, Severity
from servebook.lint import rules
from servebook.lint.loader import LintSet, parse_yaml
from servebook.verify import checks as C

SERVE = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m"]
KV = ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']


def spec(cfg: dict[str, object]) -> list[str]:
    return ["--speculative-config", json.dumps(cfg)]


EAGLE = {"method": "eagle3", "num_speculative_tokens": 3}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
PAIRS = {
    # drafts named by hub id, not by path: two different draft models
    "different hub drafts": (
        spec({**EAGLE, "model": "org/eagle-a"}),
        spec({**EAGLE, "model": "org/eagle-b"}),
        Severity.FAIL,
    ),
    # a pre-JSON flag overrides the JSON on one side
    "legacy flag on decode": (
        spec(NGRAM),
        [*spec(NGRAM), "--num-speculative-tokens", "5"],
        Severity.FAIL,
    ),
    "dotted against JSON": (
        spec(NGRAM),
        [
            "--speculative_config.method=ngram",
            "--speculative-config.num_speculative_tokens=3",
            "--speculative-config.prompt_lookup_max",
            "4",
        ],
        Severity.PASS,
    ),
    "same draft, other node path": (
        spec({**EAGLE, "model": "/n1/eagle"}),
        spec({**EAGLE, "model": "/n2/eagle"}),
        Severity.PASS,
    ),
    "decode only": ([], spec(NGRAM), Severity.FAIL),
}


def lint_verdict(prefill: list[str], decode: list[str]) -> Severity:
    docs = [
        "apiVersion: v1\nkind: Pod\n"
        f"metadata: {{name: m-{role}, labels: {{llm-d.ai/role: {role}}}}}\n"
        "spec:\n  containers:\n    - name: vllm\n      image: vllm/vllm-openai:v0.11.0\n"
        f"      command: {json.dumps([*SERVE, *KV, *args])}\n"
        for role, args in (("prefill", prefill), ("decode", decode))
    ]
    found = rules.check(LintSet([parse_yaml("---\n".join(docs), "pd.yaml")], []))
    return _worst([f for f in found if f.check == "SB105"])


def verify_verdict(prefill: list[str], decode: list[str]) -> Severity:
    found = C.check_spec_symmetry(
        {"prefill": [*SERVE, *KV, *prefill], "decode": [*SERVE, *KV, *decode]}
    )
    return _worst(found)


def _worst(found: list[Finding]) -> Severity:
    return Severity.FAIL if any(f.failed for f in found) else Severity.PASS


@pytest.mark.parametrize("case", list(PAIRS))
def test_lint_and_verify_give_the_same_verdict_on_the_same_command_lines(case: str) -> None:
    prefill, decode, expected = PAIRS[case]
    assert (lint_verdict(prefill, decode), verify_verdict(prefill, decode)) == (expected, expected)
