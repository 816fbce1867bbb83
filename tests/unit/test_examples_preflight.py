"""The example values files (examples/values/) fit the clusters they are written for:
`servebook preflight RECIPE -f EXAMPLE --snapshot FIXTURE --weights SIZE` passes on four
8xH200 nodes and says "do not fit" (SB262) on the same nodes with 16 GB GPUs.  The sizes
are the checkpoints' own model.safetensors.index.json total_size."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CliResult

Cli = Callable[..., CliResult]
REPO = Path(__file__).resolve().parents[2]
FIX = Path(__file__).parent / "fixtures" / "preflight"
EXAMPLES = [
    # recipe, values file, weights bytes
    ("vllm-mixed", "dense-8b-one-node.yaml", "16060522496"),  # Llama-3.1-8B BF16
    ("vllm-pd", "moe-two-8gpu-nodes.yaml", "688586727753"),  # DeepSeek-R1 FP8
    ("vllm-pd-wide-ep", "kimi-k2-two-nodes-per-role.yaml", "1029174409216"),  # Kimi-K2 FP8
]


def _preflight(cli: Cli, recipe: str, values: str, fixture: str, weights: str) -> CliResult:
    return cli(
        "preflight",
        recipe,
        "-f",
        str(REPO / "examples" / "values" / values),
        "--snapshot",
        str(FIX / fixture),
        "--weights",
        weights,
        "--json",
    )


def _findings(r: CliResult) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(r.stdout)["findings"]
    return found


@pytest.mark.parametrize(("recipe", "values", "weights"), EXAMPLES)
def test_example_passes_preflight_on_a_cluster_that_fits_it(
    cli: Cli, recipe: str, values: str, weights: str
) -> None:
    r = _preflight(cli, recipe, values, "h200-four-nodes.json", weights)
    found = _findings(r)
    assert r.returncode == 0, [f for f in found if f["severity"] in ("fail", "error")]
    fit = [f for f in found if f["check"] == "SB262"]
    assert fit and {f["severity"] for f in fit} == {"pass"}
    assert all("the weights fit" in f["message"] for f in fit)


@pytest.mark.parametrize(("recipe", "values", "weights"), EXAMPLES)
def test_example_does_not_fit_16gb_gpus_and_says_so(
    cli: Cli, recipe: str, values: str, weights: str
) -> None:
    r = _preflight(cli, recipe, values, "t4-four-nodes.json", weights)
    assert r.returncode == 1
    fit = [f for f in _findings(r) if f["check"] == "SB262"]
    assert fit and {f["severity"] for f in fit} == {"fail"}
    assert all("do not fit" in f["message"] for f in fit)


def test_wide_ep_example_splits_the_weights_over_both_nodes_of_a_group(cli: Cli) -> None:
    r = _preflight(cli, *EXAMPLES[2][:2], "h200-four-nodes.json", EXAMPLES[2][2])
    fit = [f for f in _findings(r) if f["check"] == "SB262"]
    assert {f["evidence"]["shards"] for f in fit} == {16}
    # Every listed node is checked for its GPUs, not only each group's leader's.
    free = {f["subject"] for f in _findings(r) if f["check"] == "SB254"}
    assert {"node/gpu-a", "node/gpu-b", "node/gpu-c", "node/gpu-d"} <= free


def test_wide_ep_example_needs_the_leaderworkerset_crd(cli: Cli) -> None:
    r = _preflight(cli, *EXAMPLES[2][:2], "no-namespace-no-lws.json", EXAMPLES[2][2])
    crd = [f for f in _findings(r) if f["check"] == "SB257"]
    assert r.returncode == 1
    assert any(f["severity"] == "fail" and "leaderworkersets" in f["message"] for f in crd)


def test_examples_name_an_engine_that_has_the_counters_verify_reads() -> None:
    for _, values, _ in EXAMPLES:
        text = (REPO / "examples" / "values" / values).read_text(encoding="utf-8")
        assert "v0.11.0" not in text.split("image:", 1)[1].splitlines()[0]
        assert "prompt_tokens_by_source" in text and "Engine version" in text
