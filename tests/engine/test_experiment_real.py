"""`servebook experiment` on real vLLM CPU engines (issues 35, 43, 49): the four tiny
topologies (tiny-mixed, tiny-mixed-spec, tiny-pd, tiny-pd-spec) as a new user runs them, on
a dataset of short prose prompts (tests/unit/fixtures/datasets/short-prose.jsonl: ten
prompts of 79-84 tokens), 2 blocks x 2 concurrency levels, through the CLI.  Every entry of
the schedule is a fresh deployment of its own name (its own up, verify and down, one at a
time), every level carries its server evidence, every PD point's handoff is judged and
valid, the benches ran their levels in more than one order, the TPOT ratios are those of
the judged TPOT, and `servebook report DIR` renders a page that headless Chromium loads
with every plot and table and a report.md a pull request takes as it is (provenance,
TTFT/TPOT p50 and p99, per-accelerator figures, the pd-spec/pd ratios).

The engines run with `--block-size 32` (the experiment's `values:`): ExampleConnector hands
over whole blocks of the prompt less its last token, so on the CPU build's default
128-token blocks nothing of an ~83-token prompt crosses (SB407 then says "handoff not
judged for these prompts", tests/unit/test_bench_protocol.py), and on 32-token blocks 77%
does.

Kept short for CI (2 cores): one repetition per level and block (the blocks are the
replicates the interval resamples), no precision target, 2 s warm-ups and 5 s windows of
16-token outputs, and bench's bounds on client lag and achieved concurrency relaxed as the
other engine tests relax them on a machine the engines share.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from servebook.backends.local import deployer as local
from servebook.results.schema import RESULTS_NAME
from servebook.results.store import load_results
from tests.unit.browser import PROBE, Dom, chromium

pytestmark = pytest.mark.engine

DATASET = Path(__file__).parents[1] / "unit" / "fixtures" / "datasets" / "short-prose.jsonl"
ARMS = {
    "mixed": "tiny-mixed",
    "mixed-spec": "tiny-mixed-spec",
    "pd": "tiny-pd",
    "pd-spec": "tiny-pd-spec",
}
EXPERIMENT = {
    "baseline": "mixed",
    "blocks": 2,
    "variable": ["topology"],
    "values": {"extra_engine_args": "--block-size 32"},
    # The report's per-accelerator figures: the CPU build's plan counts no GPU, so each arm
    # declares one per engine; and speculation's own effect inside PD as a named pair.
    "arms": [
        {"name": name, "recipe": recipe, "accelerators": 2 if name in ("pd", "pd-spec") else 1}
        for name, recipe in ARMS.items()
    ],
    "pairs": ["pd-spec:pd"],
    "load": {
        "concurrency": [1, 4],
        "dataset": DATASET.name,
        "output-len": 16,
        "warmup": "2s",
        "duration": "5s",
        "min-requests": 4,
        "repetitions": 1,
        "precision": "off",
        "max-client-lag-ms": 250,
        "min-achieved-concurrency": 0.5,
    },
}
LEVELS = [1, 4]
PD_ARMS = ("pd", "pd-spec")
SPEC_ARMS = ("mixed-spec", "pd-spec")
BOUND_S = 1500  # 8 ups, 3 processes each for PD; each 40-110 s on 2 cores


def servebook(home: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """The CLI as users run it, in its own process group; past ``timeout`` it gets the
    Ctrl-C a user would send (the experiment takes down what it brought up), then a kill."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "servebook", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SERVEBOOK_HOME": str(home), "COLUMNS": "200"},
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        pytest.fail(f"servebook {args[0]} ran past {timeout:.0f} s:\n{stdout}\n{stderr[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def left_running(home: Path) -> list[str]:
    """Deployments whose state is still under ``home`` (each down removes its own and
    keeps its logs)."""
    d = home / "deployments"
    return sorted(p.name for p in d.iterdir() if (p / "state.json").is_file()) if d.is_dir() else []


def engines_of(home: Path) -> list[int]:
    """Processes whose command line names ``home`` (every engine serves a model there)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(home) in (proc / "cmdline").read_text(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


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


def check_orders(state: dict[str, Any], out: Path) -> None:
    """The benches ran their levels in more than one order (issue 49: one seed gave every
    bench the same shuffle), no level ran first in every bench, every arm of a block in the
    block's order, and each results file says the order it ran."""
    orders = state["level_orders"]
    assert len({tuple(e["rounds"][0]) for e in orders}) > 1, orders
    assert all(r["first"] < r["rounds"] for r in state["level_positions"].values()), state[
        "level_positions"
    ]
    for block in (1, 2):
        assert len({tuple(e["rounds"][0]) for e in orders if e["block"] == block}) == 1, orders
    for e in orders:
        res = load_results(out / "arms" / e["arm"] / f"block-{e['block']}" / RESULTS_NAME)
        protocol = res.provenance.protocol
        assert protocol["order"] == "counterbalanced", protocol
        ran = [f"c={p.concurrency}" for p in res.points if p.repetition == 0]
        assert ran == list(e["rounds"][0]) == list(protocol["level_orders"][0]), (ran, e)


def check_tpot(state: dict[str, Any], out: Path) -> None:
    """Each TPOT ratio is the one of the judged TPOT (the rule bench, report and compare
    use: the level's points of every arm and block judged together), recomputed here from
    the results files."""
    from servebook.results.tpot import figure, judge_together

    points = {
        (e["arm"], e["block"]): load_results(
            out / "arms" / e["arm"] / f"block-{e['block']}" / RESULTS_NAME
        ).points
        for e in state["schedule"]
    }
    tpot = [c for c in state["comparisons"] if c["metric"] == "tpot_ms"]
    assert len(tpot) == 3 * len(LEVELS), tpot
    for c in tpot:
        level = c["concurrency"]
        at = {k: [p for p in ps if p.concurrency == level] for k, ps in points.items()}
        key, same = judge_together([p for ps in at.values() for p in ps])
        assert c["judged_on"] == key == state["tpot_judged_on"][f"{level:g}"], c
        judged = iter(same)
        per = {k: [next(judged) for _ in ps] for k, ps in at.items()}

        def median(arm: str, per: dict[Any, Any] = per, key: str = key) -> float:
            blocks = []
            for b in (1, 2):
                values = [v for p in per[(arm, b)] if (v := figure(p, key)) is not None]
                blocks.append(sum(values) / len(values))
            return float(sum(blocks) / len(blocks))  # the median of two blocks

        assert c["ratio"] == pytest.approx(median(c["arm"]) / median("mixed"), rel=1e-4), c


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


def check_in_browser(out: Path, tmp_path: Path) -> None:
    """report.html as headless Chromium shows it, with the network mapped to nothing:
    every plot's image decoded, every table with its rows (test_report_render's check)."""
    exe = chromium()
    page = out / "report.html"
    probe = out / "probe.html"
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    r = subprocess.run(
        [
            exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000",
            "--dump-dom", probe.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    probe.unlink()
    assert r.returncode == 0, r.stderr[-2000:]
    dom = Dom()
    dom.feed(r.stdout)
    assert dom.body.get("data-probe") == "loaded", r.stdout[:500]
    assert set(dom.plots) == {"ratios", "pareto"} and all(dom.plots.values()), dom.plots
    assert dom.tables.get("evidence") == 8 and dom.tables.get("schedule") == 8, dom.tables
    assert (dom.tables.get("arms") or 0) >= 8, dom.tables
    assert "speculative acceptance" in r.stdout.lower()


def test_the_four_tiny_topologies_on_short_prose_in_two_blocks_of_fresh_deployments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, out = tmp_path / "sbhome", tmp_path / "exp"
    monkeypatch.setenv("SERVEBOOK_HOME", str(home))  # where a stray deployment is downed
    f = tmp_path / "four-topologies.yaml"
    f.write_text(yaml.safe_dump(EXPERIMENT, sort_keys=False))
    shutil.copy(DATASET, tmp_path / DATASET.name)  # beside the experiment file
    started = time.monotonic()
    try:
        r = servebook(home, "experiment", str(f), "-o", str(out), timeout=BOUND_S)
    finally:
        stray = left_running(home)
        for name in stray:
            local.down(name)
    took = time.monotonic() - started
    assert r.returncode == 0, r.stdout + r.stderr[-6000:]
    assert stray == [], f"deployments left up: {stray}"
    assert engines_of(home) == [], "engine processes left running"
    print(f"experiment: {took:.0f} s")
    state = json.loads((out / "experiment.json").read_text())
    check_schedule(state, out)
    check_evidence(state)
    check_orders(state, out)
    check_tpot(state, out)
    rep = servebook(home, "report", str(out), timeout=120)
    assert rep.returncode == 0, rep.stderr
    check_pr_report(out, home, tmp_path)
    check_in_browser(out, tmp_path)
