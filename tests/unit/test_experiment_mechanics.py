"""The experiment's mechanics on a scripted machine: two URL arms whose true throughput
ratio is known at each level, on a machine that slows down linearly while the experiment
runs (shared by both arms, as a warming box or a noisy neighbour is).  Interleaved in
counterbalanced blocks, the ratios come out within 5% of the truth and the crossover's
interval holds the true crossover; the same arms run one after the other, as the field's
tables were, are biased by the drift, and the test states by how much."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servebook.bench.tokens import HFTokenizer
from servebook.experiment import session, spec
from servebook.experiment.steps import servebook_steps
from tests.unit.conftest import scripted_machine

# Its figures are timings: make test runs it alone, after the unit tests that run in parallel.
pytestmark = pytest.mark.serial

# ms an engine step (alone, loaded, loaded from this many in flight).  The baseline's step
# takes 8 ms whatever its load; the candidate's 4.8 ms while fewer than 3 requests are in
# flight and 12.8 ms from 3 on: faster alone (true tok/s ratio 8 / 4.8), slower under load
# (8 / 12.8).  The true crossover lies between 2 and 3 in flight.
BASE = (8.0, 8.0, 99)
CAND = (4.8, 12.8, 3)
TRUE_RATIO = {1.0: 8 / 4.8, 4.0: 8 / 12.8}
TRUE_CROSSOVER = 2.5
SLOPE = 0.04  # the machine's speed lost a second: ~half of it over the interleaved run
PROMPT = "the same short prompt every time"


def experiment(urls: list[str], tiny_dir: Path, dataset: Path, blocks: int) -> spec.Experiment:
    return spec.parse(
        {
            "baseline": "base",
            "blocks": blocks,
            "arms": [
                {"name": "base", "url": urls[0], "model": "tiny", "accelerators": 1},
                {"name": "cand", "url": urls[1], "model": "tiny", "accelerators": 2},
            ],
            "load": {
                "concurrency": [1, 4],
                # one prompt, looked up: no prompt producer process per point
                "dataset": str(dataset),
                "tokenizer": str(tiny_dir),
                "output-len": 8,
                "warmup": "100ms",
                "duration": "400ms",
                "repetitions": 1,
                "precision": "off",
                "min-requests": 2,
                "max-client-lag-ms": 1000,
                # a point the loaded test machine starved (requests not sent on time) is
                # invalid, so it counts for nothing, as in any bench
                "min-achieved-concurrency": 0.9,
            },
        },
        str(dataset.parent / "mechanics.yaml"),
    )


def ratio(state: dict[str, Any], metric: str, level: float) -> dict[str, Any]:
    return next(
        c for c in state["comparisons"] if c["metric"] == metric and c["concurrency"] == level
    )


def test_interleaved_ratios_hold_the_truth_and_sequential_ones_are_biased(
    tiny_dir: Path, tok: HFTokenizer, tmp_path: Path
) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text(json.dumps({"prompt": PROMPT}) + "\n")
    n_prompt = len(tok.encode(PROMPT, add_special_tokens=True))
    quiet = lambda _line: None  # noqa: E731
    with scripted_machine([BASE, CAND], SLOPE, n_prompt) as (urls, reset):
        exp = experiment(urls, tiny_dir, dataset, blocks=4)
        steps = servebook_steps(exp, quiet, None)
        reset()
        inter = session.execute(exp, tmp_path / "interleaved", steps, quiet)
        # The field's order, two blocks of each arm: every block of the baseline, then
        # every block of the candidate, which so ran on a slower machine.
        reset()
        seq = session.execute(
            exp,
            tmp_path / "sequential",
            steps,
            quiet,
            order=[(1, "base"), (2, "base"), (1, "cand"), (2, "cand")],
            design_name="sequential",
        )

    assert [e["outcome"] for e in inter["schedule"]] == ["done"] * 8
    for level, truth in TRUE_RATIO.items():
        r = ratio(inter, "output_tokens_per_s", level)
        assert r["ratio"] == pytest.approx(truth, rel=0.05), r
        assert r["ci95"][0] <= r["ratio"] <= r["ci95"][1]
        # per accelerator: the candidate declares 2 to the baseline's 1
        per = ratio(inter, "output_tokens_per_s_per_accelerator", level)
        assert per["ratio"] == pytest.approx(r["ratio"] / 2, rel=1e-3)
    assert ratio(inter, "output_tokens_per_s", 1.0)["verdict"] == "better"
    assert ratio(inter, "output_tokens_per_s", 4.0)["verdict"] == "worse"
    # TPOT: lower is better, so the candidate's smaller TPOT alone is "better"
    assert ratio(inter, "tpot_ms", 1.0)["verdict"] == "better"
    assert ratio(inter, "tpot_ms", 4.0)["verdict"] == "worse"
    cross = next(c for c in inter["crossovers"] if c["metric"] == "output_tokens_per_s")
    assert cross["between"][0] < TRUE_CROSSOVER < cross["between"][1]
    assert cross["direction"] == "above to below 1"
    # the machine slowed down under the baseline too, and the drift figure says so
    assert inter["drift"]["change"] < -0.1

    # Sequential: the candidate's benches ran about two benches' time (~3 s) after the
    # baseline's, on a machine ~10% slower, so its ratios are biased low by about that much.
    # Seen on the 2-core test machine, quiet: a bias of -9% to -11% at both levels against
    # an interleaved error of 0.3-1.2%.  (At a load average of 6-9 from other work on those
    # 2 cores, the interleaved error reached 5-7% at c=1 in about half the runs.)  The test
    # asks for a bias beyond -7% and more than twice the interleaved error.
    for level, truth in TRUE_RATIO.items():
        bias = ratio(seq, "output_tokens_per_s", level)["ratio"] / truth - 1
        error = abs(ratio(inter, "output_tokens_per_s", level)["ratio"] / truth - 1)
        print(f"c={level:g}: sequential bias {bias:+.1%}, interleaved error {error:.1%}")
        assert bias < -0.07
        assert abs(bias) > 2 * error
