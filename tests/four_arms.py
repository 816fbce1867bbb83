"""The four tiny topologies' experiment, checked the same way wherever it runs: on the local
backend (tests/engine/test_experiment_real.py) and on the test plane as a tenant
(tests/cluster/test_experiment_on_plane.py).  Every arm ran once per block as a deployment of
its own name, every point valid, every PD point's handoff above its threshold, the evidence
of each arm and level, and a report.md a pull request takes as it is."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from servebook.results.schema import RESULTS_NAME
from servebook.results.store import load_results

ARMS = {
    "mixed": "tiny-mixed",
    "mixed-spec": "tiny-mixed-spec",
    "pd": "tiny-pd",
    "pd-spec": "tiny-pd-spec",
}
LEVELS = [1, 4]
PD_ARMS = ("pd", "pd-spec")
SPEC_ARMS = ("mixed-spec", "pd-spec")
# Each arm declares one accelerator an engine (the CPU build's plan counts none), for the
# report's per-accelerator figures; and speculation's own effect inside PD as a named pair.
ARM_ENTRIES = [
    {"name": name, "recipe": recipe, "accelerators": 2 if name in PD_ARMS else 1}
    for name, recipe in ARMS.items()
]
PAIRS = ["pd-spec:pd"]
# Kept short for CI (2 cores): one repetition per level and block (the blocks are the
# replicates the interval resamples), no precision target, 2 s warm-ups and 5 s windows of
# 16-token outputs, and bench's bounds on client lag and achieved concurrency relaxed as the
# other engine tests relax them on a machine the engines share.  Each test adds its prompts.
LOAD = {
    "concurrency": LEVELS,
    "output-len": 16,
    "warmup": "2s",
    "duration": "5s",
    "min-requests": 4,
    "repetitions": 1,
    "precision": "off",
    "max-client-lag-ms": 250,
    "min-achieved-concurrency": 0.5,
}


def check_schedule(state: dict[str, Any], out: Path) -> None:
    """Every arm ran once per block, each a deployment of its own name, brought up,
    verified, benched and taken down before the next came up; every point valid, every PD
    point's handoff judged and above its threshold."""
    sched = state["schedule"]
    assert sorted((e["block"], e["arm"]) for e in sched) == sorted(
        (b, a) for b in (1, 2) for a in ARMS
    )
    assert [e["outcome"] for e in sched] == ["done"] * 8, sched
    assert [e["verify"] for e in sched] == ["passed"] * 8, sched
    tag = state["tag"]
    assert sorted(e["deployment"] for e in sched) == sorted(
        f"{a}-b{b}-{tag}" for b in (1, 2) for a in ARMS
    )
    for before, after in itertools.pairwise(sched):
        assert before["ended_at"] <= after["started_at"], (before, after)
    for e in sched:
        res = load_results(out / "arms" / e["arm"] / f"block-{e['block']}" / RESULTS_NAME)
        assert res.provenance.target.get("deployment") == e["deployment"]
        points = sorted(res.points, key=lambda p: p.concurrency or 0)
        assert [(p.concurrency, p.valid) for p in points] == [(c, True) for c in LEVELS], [
            p.invalid_reasons for p in points
        ]
        if e["arm"] in PD_ARMS:
            for p in points:
                share = p.server.get("handoff_share")
                assert share is not None and share > 0.7, (e["arm"], p.server)


def check_evidence(state: dict[str, Any]) -> None:
    """Each arm x level carries its server evidence over both blocks: the drafts the
    speculative arms' engines accepted, none on the plain ones, no errors, the PD arms'
    handoff share and no point failed open."""
    rows = {(r["arm"], r["level"]): r for r in state["evidence"]}
    assert sorted(rows) == sorted((a, float(c)) for a in ARMS for c in LEVELS)
    for (arm, _level), r in rows.items():
        assert r["valid"] and r["blocks"] == [1, 2] and r["points"] == r["valid_points"] == 2, r
        assert r["invalid_checks"] == [], r
        assert r["errors"] == 0 and r["error_rate"] == 0, r
        assert r["request_errors"]["max"] == 0, r
        assert r["handoff_failed_open"] == [], r
        assert r["missing"] == [], r
        if arm in PD_ARMS:
            assert r["handoff_share"] is not None, r
        else:
            assert r["handoff_share"] is None, r
        if arm in SPEC_ARMS:
            assert 0 < r["spec_acceptance"]["min"] <= r["spec_acceptance"]["max"] <= 1, r
        else:
            assert r["spec_acceptance"] is None, r
    tok_s = [c for c in state["comparisons"] if c["metric"] == "output_tokens_per_s"]
    assert sorted((c["arm"], c["concurrency"], c["blocks"]) for c in tok_s) == sorted(
        (a, float(c), 2) for a in ARMS if a != "mixed" for c in LEVELS
    )
    assert state["invalid_blocks"] == []


def check_pr_report(out: Path, home: Path, tmp_path: Path) -> None:
    """report.md as a pull request takes it (issue 49, point 6): every arm's provenance
    (engine and version as its servers said, servebook's commit where it ran from a
    checkout), TTFT and TPOT p50 and p99, per-accelerator figures for every arm, the
    pd-spec/pd ratio table, and no path of this machine."""
    from servebook.results.provenance import source_commit

    md = (out / "report.md").read_text()
    sections = {s.split("\n", 1)[0]: s for s in md.split("\n## ")[1:]}
    prov = next(v for k, v in sections.items() if k.startswith("Provenance of each arm"))
    res = load_results(out / "arms" / "pd-spec" / "block-1" / RESULTS_NAME)
    for arm in ARMS:
        row = next(line for line in prov.splitlines() if line.startswith(f"| {arm} |"))
        assert f"vllm {res.provenance.engine_version}" in row, row
        assert "declared on the arm" in row and "recipe tiny-" in row, row
        if source_commit() is not None:
            assert "(commit " in row, row
    arms = next(v for k, v in sections.items() if k.startswith("Every arm at every level"))
    head = arms.splitlines()[2]
    for column in ("Per accelerator", "TTFT p50 (ms)", "TTFT p99 (ms)", "TPOT p50 (ms)",
                   "TPOT p99 (ms)"):  # fmt: skip
        assert column in head, head
    rows = [line.split(" | ") for line in arms.splitlines()[4:] if line.startswith("| ")]
    assert len(rows) == len(ARMS) * len(LEVELS), arms
    for cells in rows:
        per, ttft50, ttft99 = cells[3], cells[4], cells[5]
        assert float(per.replace(",", "")) > 0 and 0 < float(ttft50) <= float(ttft99), cells
    pairs = next(
        v for k, v in sections.items() if k.startswith("Ratios of the named pairs (pd-spec/pd)")
    )
    for level in LEVELS:
        assert f"| pd-spec | pd | c={level} | output tok/s |" in pairs, pairs
        assert f"| pd-spec | pd | c={level} | TPOT" in pairs, pairs
    for where in (str(tmp_path), str(home), "/root/", "/tmp/", "/work/"):
        assert where not in md, where
