"""`servebook experiment` on real vLLM CPU engines (issue 35): tiny-mixed against
tiny-mixed-spec, 2 blocks x 2 concurrency levels, through the CLI.  Every entry of the
schedule is a fresh deployment (its own up, verify and down, one at a time), every level
carries its server evidence, and `servebook report DIR` renders a page that headless
Chromium loads with every plot and table.

Kept short for CI (2 cores): one repetition per level and block (the blocks are the
replicates the interval resamples), no precision target, 1 s warm-up and 3 s windows of
64-token prompts and 16-token outputs, and bench's bounds on client lag and achieved
concurrency relaxed as the other engine tests relax them on a machine the engines share.
"""

from __future__ import annotations

import itertools
import json
import os
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

EXPERIMENT = {
    "baseline": "mixed",
    "blocks": 2,
    "variable": ["topology"],
    "arms": [
        {"name": "mixed", "recipe": "tiny-mixed"},
        {"name": "spec", "recipe": "tiny-mixed-spec"},
    ],
    "load": {
        "concurrency": [1, 2],
        "input-len": 64,
        "output-len": 16,
        "warmup": "1s",
        "duration": "3s",
        "min-requests": 4,
        "repetitions": 1,
        "precision": "off",
        "max-client-lag-ms": 250,
        "min-achieved-concurrency": 0.5,
    },
}
BOUND_S = 840  # 4 ups; each 40-110 s on 2 cores, the most beside other engines


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
    """Every arm ran once per block, each a deployment of its own, brought up, verified,
    benched and taken down before the next came up."""
    sched = state["schedule"]
    assert sorted((e["block"], e["arm"]) for e in sched) == [
        (1, "mixed"), (1, "spec"), (2, "mixed"), (2, "spec"),
    ]  # fmt: skip
    assert [e["outcome"] for e in sched] == ["done"] * 4, sched
    assert [e["verify"] for e in sched] == ["passed"] * 4, sched
    tag = state["tag"]
    assert sorted(e["deployment"] for e in sched) == [
        f"mixed-b1-{tag}", f"mixed-b2-{tag}", f"spec-b1-{tag}", f"spec-b2-{tag}",
    ]  # fmt: skip
    for before, after in itertools.pairwise(sched):
        assert before["ended_at"] <= after["started_at"], (before, after)
    for e in sched:
        res = load_results(out / "arms" / e["arm"] / f"block-{e['block']}" / RESULTS_NAME)
        assert res.provenance.target.get("deployment") == e["deployment"]
        points = sorted(res.points, key=lambda p: p.concurrency or 0)
        assert [(p.concurrency, p.valid) for p in points] == [(1, True), (2, True)], [
            p.invalid_reasons for p in points
        ]


def check_evidence(state: dict[str, Any]) -> None:
    """Each arm x level carries its server evidence over both blocks: the drafts the
    speculative arm's engine accepted, none on the plain one, no errors, no PD handoff."""
    rows = {(r["arm"], r["level"]): r for r in state["evidence"]}
    assert sorted(rows) == [("mixed", 1.0), ("mixed", 2.0), ("spec", 1.0), ("spec", 2.0)]
    for (arm, _level), r in rows.items():
        assert r["valid"] and r["blocks"] == [1, 2] and r["points"] == r["valid_points"] == 2, r
        assert r["invalid_checks"] == [], r
        assert r["errors"] == 0 and r["error_rate"] == 0, r
        assert r["request_errors"]["max"] == 0, r
        assert r["handoff_share"] is None and r["handoff_failed_open"] == [], r
        assert r["missing"] == [], r
        if arm == "spec":
            assert 0 < r["spec_acceptance"]["min"] <= r["spec_acceptance"]["max"] <= 1, r
        else:
            assert r["spec_acceptance"] is None, r
    tok_s = [c for c in state["comparisons"] if c["metric"] == "output_tokens_per_s"]
    assert [(c["arm"], c["concurrency"], c["blocks"]) for c in tok_s] == [
        ("spec", 1.0, 2), ("spec", 2.0, 2),
    ]  # fmt: skip
    assert state["invalid_blocks"] == []


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
    assert dom.tables.get("arms") == 4 and dom.tables.get("evidence") == 4, dom.tables
    assert dom.tables.get("schedule") == 4, dom.tables
    assert "speculative acceptance" in r.stdout.lower()


def test_tiny_mixed_against_tiny_mixed_spec_in_two_blocks_of_fresh_deployments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, out = tmp_path / "sbhome", tmp_path / "exp"
    monkeypatch.setenv("SERVEBOOK_HOME", str(home))  # where a stray deployment is downed
    f = tmp_path / "spec-vs-mixed.yaml"
    f.write_text(yaml.safe_dump(EXPERIMENT, sort_keys=False))
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
    rep = servebook(home, "report", str(out), timeout=120)
    assert rep.returncode == 0, rep.stderr
    check_in_browser(out, tmp_path)
