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
from tests.four_arms import (
    ARM_ENTRIES,
    LEVELS,
    LOAD,
    PAIRS,
    check_evidence,
    check_pr_report,
    check_schedule,
)
from tests.unit.browser import PROBE, Dom, chromium

pytestmark = pytest.mark.engine

DATASET = Path(__file__).parents[1] / "unit" / "fixtures" / "datasets" / "short-prose.jsonl"
EXPERIMENT = {
    "baseline": "mixed",
    "blocks": 2,
    "variable": ["topology"],
    "values": {"extra_engine_args": "--block-size 32"},
    "arms": ARM_ENTRIES,
    "pairs": PAIRS,
    "load": {**LOAD, "dataset": DATASET.name},
}
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
