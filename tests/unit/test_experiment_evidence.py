"""The server evidence per arm and level of an experiment (issue 35): every level of every
arm carries what its points' counters said (PD handoff share, speculative acceptance,
prefix-hit share, errors), a level where an arm's handoff failed open is invalid for that
arm and left out of its ratios, and the report shows both.

The arms' results are the checked-in field-trial runs (``trial-mixed-spec`` against
``trial-pd-spec``: real counters' evidence), one per block; in block 2 one repetition of
pd-spec at c=4 is judged again, its decode having received 2% of its prompt tokens by KV
transfer, by bench's own SB407."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servebook.bench.validity import Thresholds, apply_verdict, judge
from servebook.engines.handoff import threshold
from servebook.experiment import evidence, figures, runner, session, spec
from servebook.experiment import report as exp_report
from servebook.results.schema import Results
from servebook.results.store import load_results
from tests.unit.result_runs import RESULTS

ARMS = {"mixed": RESULTS / "trial-mixed-spec", "pd": RESULTS / "trial-pd-spec"}


def failed_open(res: Results, concurrency: int, repetition: int) -> Results:
    """``res`` with one point whose decode got 2% of its prompt by KV transfer, judged by
    bench's SB407 against the verify threshold (50%)."""
    points = []
    for p in res.points:
        if (p.concurrency, p.repetition) == (concurrency, repetition):
            p = p.model_copy(update={"server": {**p.server, "handoff_share": 0.02}})
            found = judge(
                p,
                duration_s=60,
                min_requests=1,
                thresholds=Thresholds(min_handoff_share=0.5),
                pd=True,
            )
            p = apply_verdict(p, [f for f in found if f.check == "SB407"])
        points.append(p)
    return res.model_copy(update={"points": points})


def with_errors(res: Results, concurrency: int, repetition: int) -> Results:
    """``res`` with one point 10 of whose requests failed (2.2% of its 460), judged by
    bench's SB403 (1% at most)."""
    points = []
    for p in res.points:
        if (p.concurrency, p.repetition) == (concurrency, repetition):
            p = p.model_copy(update={"errors": 10})
            found = judge(p, duration_s=60, min_requests=1, thresholds=Thresholds())
            p = apply_verdict(p, [f for f in found if f.check == "SB403"])
        points.append(p)
    return res.model_copy(update={"points": points})


@pytest.fixture
def experiment_dir(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """An experiment of two blocks whose every entry finished, its figures computed."""
    doc = {
        "baseline": "mixed",
        "blocks": 2,
        "arms": [{"name": n, "url": f"http://127.0.0.1:{i}", "model": "m"}
                 for i, n in enumerate(ARMS, 1)],
    }  # fmt: skip
    exp = spec.parse(doc, str(tmp_path / "exp.yaml"))
    state = runner.new_state(exp, session.order_of(exp), "williams", "c0ffee")
    out = tmp_path / "out"
    for e in state["schedule"]:
        res = load_results(ARMS[e["arm"]] / "results.json")
        if (e["arm"], e["block"]) == ("pd", 2):
            res = failed_open(res, 4, 1)
        if (e["arm"], e["block"]) == ("mixed", 1):
            res = with_errors(res, 4, 0)
        where = runner.results_dir(out, e["arm"], e["block"])
        where.mkdir(parents=True)
        (where / "results.json").write_text(res.to_json())
        e["outcome"] = runner.DONE
    figures.update(state, out)
    runner.save(out, state)
    return state, out


def test_every_arm_and_level_carries_its_server_evidence(
    experiment_dir: tuple[dict[str, Any], Path],
) -> None:
    state, _ = experiment_dir
    rows = {(r["arm"], r["level"]): r for r in state["evidence"]}
    assert sorted(rows) == [("mixed", 1.0), ("mixed", 4.0), ("pd", 1.0), ("pd", 4.0)]
    mixed = rows[("mixed", 1.0)]
    assert mixed["handoff_share"] is None  # no PD handoff to measure
    assert mixed["spec_acceptance"] == {"mean": 0.42, "min": 0.42, "max": 0.42, "n": 6}
    assert mixed["request_errors"]["max"] == 0 and mixed["errors"] == 0
    assert mixed["blocks"] == [1, 2] and mixed["points"] == mixed["valid_points"] == 6
    assert mixed["valid"] and mixed["invalid_reason"] is None
    pd = rows[("pd", 1.0)]
    assert pd["handoff_share"] == {"mean": 0.9, "min": 0.9, "max": 0.9, "n": 6}
    assert pd["spec_acceptance"]["mean"] == 0.42 and pd["valid"]


def test_a_level_whose_handoff_failed_open_is_invalid_for_that_arm_and_left_out_of_its_ratios(
    experiment_dir: tuple[dict[str, Any], Path],
) -> None:
    """One repetition of six failed open: the level is invalid for pd as a whole (its five
    others are the same deployments under the same load), its evidence still shown."""
    state, _ = experiment_dir
    rows = {(r["arm"], r["level"]): r for r in state["evidence"]}
    bad = rows[("pd", 4.0)]
    assert not bad["valid"] and bad["valid_points"] == 5 and bad["points"] == 6
    (opened,) = bad["handoff_failed_open"]
    assert opened["block"] == 2 and opened["repetition"] == 1
    assert opened["reason"] == (
        "SB407: 2.0% of decode's prompt tokens arrived by KV transfer (threshold 50.0%)"
    )
    assert bad["invalid_reason"] == "PD handoff failed open in 1 of 6 point(s) (block 2 rep 1)"
    assert bad["handoff_share"]["min"] == 0.02 and bad["handoff_share"]["max"] == 0.9
    # its figures count nowhere; the level it held up at still does, over both blocks
    assert {c["concurrency"] for c in state["comparisons"]} == {1.0}
    assert {c["blocks"] for c in state["comparisons"]} == {2}
    assert ("pd", 4.0) not in {(r["arm"], r["level"]) for r in state["absolute"]}
    assert ("pd", 4.0) not in {(p["arm"], p["level"]) for p in state["pareto"]["points"]}
    # a point invalid for another reason is left out on its own, as everywhere
    assert ("mixed", 4.0) in {(r["arm"], r["level"]) for r in state["absolute"]}
    mixed = rows[("mixed", 4.0)]
    assert mixed["valid"] and mixed["valid_points"] == 5 and mixed["invalid_checks"] == ["SB403"]
    assert mixed["errors"] == 10 and 0 < mixed["error_rate"] < 0.01  # over all six points


def test_the_report_shows_the_evidence_per_arm_and_level_and_the_invalid_level(
    experiment_dir: tuple[dict[str, Any], Path],
) -> None:
    state, out = experiment_dir
    (table,) = [t for t in exp_report.tables(state) if t.id == "evidence"]
    cells = {(r[0], r[1]): dict(zip([c.title for c in table.columns], r, strict=True))
             for r in table.rows}  # fmt: skip
    assert cells[("mixed", "c=1")]["PD handoff share"] == "n/a"
    assert cells[("mixed", "c=1")]["Speculative acceptance"] == "42.0%"
    assert cells[("mixed", "c=1")]["Validity"] == "valid"
    assert cells[("pd", "c=1")]["PD handoff share"] == "90.0%"
    assert cells[("pd", "c=4")]["PD handoff share"] == "75.3% (2.0%-90.0%)"
    assert cells[("pd", "c=4")]["Valid points"] == "5/6"
    assert cells[("pd", "c=4")]["Validity"] == (
        "INVALID: PD handoff failed open in 1 of 6 point(s) (block 2 rep 1)"
    )
    assert cells[("pd", "c=4")]["Client errors"] == "0"
    assert cells[("mixed", "c=4")]["Validity"] == "valid; 1 invalid point(s) left out (SB403)"
    assert cells[("mixed", "c=4")]["Client errors"].startswith("10 (0.")
    said = exp_report.sentences(state)
    assert (
        "c=4 is invalid for arm pd: PD handoff failed open in 1 of 6 point(s) (block 2 rep 1); "
        "its figures there are left out of every ratio (block 2: SB407: 2.0% of decode's "
        "prompt tokens arrived by KV transfer (threshold 50.0%))."
    ) in said
    page = exp_report.write(out, out).read_text()
    assert 'data-table="evidence"' in page and "c=4 is invalid for arm pd" in page
    md = (out / "report.md").read_text()
    assert "## Server evidence per arm and level" in md
    # the schedule says per entry what was deployed and verified (n/a: URL arms)
    (sched,) = [t for t in exp_report.tables(state) if t.id == "schedule"]
    assert [c.title for c in sched.columns][3:5] == ["Deployment", "Verify"]
    assert {r[3] for r in sched.rows} == {"n/a"}


def test_a_results_file_written_before_evidence_was_gathered_renders(
    experiment_dir: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    """An experiment.json of an earlier servebook (no ``evidence``) still renders."""
    state, out = experiment_dir
    del state["evidence"]
    (out / "experiment.json").write_text(json.dumps(state))
    page = exp_report.write(out, tmp_path / "r").read_text()
    assert 'data-table="evidence"' in page and "c=4 is invalid" not in page


def test_a_level_whose_prompts_are_too_short_to_judge_the_handoff_says_so() -> None:
    """Issue 43: a dataset of ~83-token prompts on 128-token KV blocks, where the connector
    has no whole block to hand over: the level is invalid for the PD arm as one that failed
    open is, but says the handoff was not judged, and why."""
    why = threshold([79, 83, 84], 128).undecidable
    assert why is not None
    res = load_results(ARMS["pd"] / "results.json")
    points = []
    for p in res.points:
        if p.concurrency == 4:
            p = p.model_copy(update={"server": {**p.server, "handoff_share": 0.0}})
            t = Thresholds(min_handoff_share=0.0, handoff_undecidable=why)
            found = judge(p, duration_s=60, min_requests=1, thresholds=t, pd=True)
            p = apply_verdict(p, [f for f in found if f.check == "SB407"])
        points.append(p)
    rows = {
        r["level"]: r
        for r in evidence.per_level({("pd", 1): res.model_copy(update={"points": points})})
    }
    short, fine = rows[4.0], rows[1.0]
    assert fine["valid"] and not short["valid"]
    assert short["invalid_reason"].startswith("PD handoff not judged in 3 of 3 point(s)")
    assert short["handoff_failed_open"][0]["reason"] == (
        "SB407: handoff not judged for these prompts (79-84 tokens): needs >= 258 prompt "
        "tokens (the connector moves whole 128-token blocks, less one of slack); 0.0% "
        "arrived by KV transfer"
    )
