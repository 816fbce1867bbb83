"""The order an experiment's benches run their load levels in (issue 49, point 1).

Every bench of an experiment had the experiment's seed, so "shuffled" gave every bench the
same order: with seed 0 and two levels, c=1 ran before c=4 in all 48 benches of two
four-arm experiments.  Each block's benches now run their own row of a Williams design over
the levels (``design.level_orders``), each round the next row, recorded in the bench's
protocol and in experiment.json; over the blocks every level runs early and late alike."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from servebook.bench.protocol import round_order
from servebook.bench.sweep import settings_from
from servebook.experiment import design, session, spec, steps
from servebook.experiment import report as exp_report
from servebook.report.comparability import comparability
from servebook.results.store import load_results
from tests.unit.conftest import QUICK_LOAD, scripted_machine

ARMS = ["a", "b", "c", "d"]


def experiment(levels: list[int], blocks: int, repetitions: int = 1, seed: int = 0) -> Any:
    arms = [{"name": n, "url": f"http://127.0.0.1:{i}", "model": "m"} for i, n in enumerate(ARMS)]
    doc = {
        "baseline": "a",
        "blocks": blocks,
        "seed": seed,
        "arms": arms,
        "load": {"concurrency": levels, "repetitions": repetitions},
    }
    return spec.parse(doc, "exp.yaml")


def bench_rounds(exp: Any) -> dict[tuple[int, str], list[list[str]]]:
    """Each bench's rounds as bench's protocol orders them from the settings the
    experiment gives it: (block, arm) -> [labels in run order, per round]."""
    out = {}
    for block in range(1, exp.blocks + 1):
        for arm in exp.arms:
            settings = settings_from(steps.bench_args(exp, arm, block), None)
            reps = settings.repetitions
            out[(block, arm.name)] = [
                [lv.label() for lv in round_order(settings, r)] for r in range(reps)
            ]
    return out


def places(rounds: list[list[str]]) -> dict[str, Counter[int]]:
    """level -> how often it ran at each place of a round."""
    out: dict[str, Counter[int]] = {}
    for labels in rounds:
        for i, label in enumerate(labels):
            out.setdefault(label, Counter())[i] += 1
    return out


@pytest.mark.parametrize("levels", [[1, 4], [1, 4, 16], [1, 2, 4, 8], [1, 2, 4, 8, 16]])
@pytest.mark.parametrize("blocks", [2, 3, 4, 6, 10])
def test_no_level_runs_first_in_every_bench_and_a_full_cycle_balances_every_place(
    levels: list[int], blocks: int
) -> None:
    exp = experiment(levels, blocks)
    benches = bench_rounds(exp)
    every = [r for rounds in benches.values() for r in rounds]
    n = len(levels)
    for label, at in places(every).items():
        assert at[0] < len(every), f"{label} ran first in every bench: {benches}"
        assert at[n - 1] < len(every), f"{label} ran last in every bench: {benches}"
    # the first round of each block's benches: a row of the design, shared by its arms
    for block in range(1, blocks + 1):
        rows = {tuple(benches[(block, a)][0]) for a in ARMS}
        assert len(rows) == 1, f"block {block}: the arms ran different orders {rows}"
    # over a full cycle of rows (n blocks for even n, 2n for odd), every level runs in
    # every place equally often, and so for each arm too
    cycle = n if n % 2 == 0 else 2 * n
    if blocks % cycle == 0:
        for arm in ARMS:
            mine = [benches[(b, arm)][0] for b in range(1, blocks + 1)]
            for label, at in places(mine).items():
                assert set(at.values()) == {blocks // n} and len(at) == n, (label, at)


def test_a_bench_s_rounds_walk_the_rows_and_the_seed_picks_which_level_goes_where() -> None:
    """Three repetitions of two levels in one block: the rounds alternate (not the same
    shuffle three times); and the orders are the seed's, recorded in the protocol."""
    exp = experiment([1, 4], 2, repetitions=3)
    benches = bench_rounds(exp)
    first, second = benches[(1, "a")], benches[(2, "a")]
    assert first[0] != first[1] and first[0] == first[2]
    assert [r[0] for r in first] != [r[0] for r in second]  # block 2 starts on the other row
    settings = settings_from(steps.bench_args(exp, exp.arm("a"), 1), None)
    recorded = settings.to_dict()
    assert recorded["order"] == "counterbalanced"
    assert [list(r) for r in recorded["level_orders"]] == design.level_orders(["c=1", "c=4"], 1, 0)
    seeds = {tuple(design.level_rows(["c=1", "c=4", "c=16"], s)[0]) for s in range(8)}
    assert len(seeds) > 1  # which level takes which symbol is the seed's
    # bench's own flags cannot ask for it without the orders
    from servebook.bench.sweep import BenchArgs
    from servebook.errors import UsageError

    with pytest.raises(UsageError, match="choose shuffled or ascending"):
        settings_from(BenchArgs(concurrency="1,4", order="counterbalanced"), None)


QUICK = {**QUICK_LOAD, "concurrency": [1, 2]}


def test_the_benches_run_the_orders_and_experiment_json_and_the_report_state_them(
    tiny_dir: Path, tok: Any, tmp_path: Path
) -> None:
    prompt = "a prompt"
    dataset = tmp_path / "p.jsonl"
    dataset.write_text(json.dumps({"prompt": prompt}) + "\n")
    n = len(tok.encode(prompt, add_special_tokens=True))
    quiet = lambda _line: None  # noqa: E731
    with scripted_machine([(4.0, 4.0, 99), (3.0, 3.0, 99)], 0.0, n) as (urls, _reset):
        arms = [{"name": n, "url": u, "model": "tiny"} for n, u in zip("ab", urls, strict=True)]
        load = {**QUICK, "dataset": str(dataset), "tokenizer": str(tiny_dir)}
        doc = {"baseline": "a", "blocks": 2, "arms": arms, "load": load}
        exp = spec.parse(doc, str(tmp_path / "exp.yaml"))
        out = tmp_path / "out"
        state = session.execute(exp, out, steps.servebook_steps(exp, quiet, None), quiet)
    planned = {b: design.level_orders(["c=1", "c=2"], b, exp.seed)[0] for b in (1, 2)}
    assert planned[1] != planned[2]
    ran = {(e["block"], e["arm"]): e["rounds"] for e in state["level_orders"]}
    assert ran == {(b, a): [planned[b]] for b in (1, 2) for a in ("a", "b")}
    # what ran is the results' own order, and their protocol records what was asked
    res = load_results(out / "arms" / "b" / "block-2" / "results.json")
    # two blocks' benches of one arm are like for like: the rows they drew differ by
    # design, as two runs' seeds do (compare refused them for "protocol.level_orders")
    other = load_results(out / "arms" / "b" / "block-1" / "results.json")
    same = comparability(other.provenance, res.provenance, ())
    assert same.like_for_like, [d.to_dict() for d in same.differences]
    assert [f"c={p.concurrency}" for p in res.points] == planned[2]
    assert res.provenance.protocol["level_orders"][0] == planned[2]
    assert state["level_positions"] == {
        "c=1": {"first": 2, "last": 2, "rounds": 4},
        "c=2": {"first": 2, "last": 2, "rounds": 4},
    }
    said = exp_report.sentences(state)
    assert (
        "Levels' places over the 4 round(s) of the finished benches: c=1 first in 2 and last "
        "in 2; c=2 first in 2 and last in 2." in said
    )
    assert not any("ran first in every round" in s for s in said)
    (table,) = [t for t in exp_report.tables(state) if t.id == "orders"]
    assert table.rows == [
        ["1", "every arm", " -> ".join(planned[1])],
        ["2", "every arm", " -> ".join(planned[2])],
    ]
    # one block: one order, and the report says what that costs
    state["level_positions"] = {
        "c=1": {"first": 2, "last": 0, "rounds": 2},
        "c=2": {"first": 0, "last": 2, "rounds": 2},
    }
    assert any(s.startswith("c=1 ran first in every round") for s in exp_report.sentences(state))
