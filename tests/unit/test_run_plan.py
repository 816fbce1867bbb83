"""`servebook run` says its plan before it starts anything (issue 32, finding 8), as the
README promises ("It prints its plan with an estimated time first"): before, the sweep's
plan came after up and verify had taken their minutes, and not at all when verify failed.
Run here on the local backend with a stand-in vLLM (``engine_standin.vllm_package``), which
has no /tokenize: the job stops at its sweep's first prompt and takes the stand-in down."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.unit.engine_standin import vllm_package


def test_run_prints_its_whole_plan_before_up_and_verify(sb_home: Path, tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    out = tmp_path / "run"
    env = {**os.environ, **vllm_package(tmp_path / "vllm"), "SERVEBOOK_HOME": str(sb_home)}
    r = subprocess.run(
        [
            *(sys.executable, "-m", "servebook", "run", "tiny-mixed", "-o", str(out)),
            *("--set", f"model_dir={tmp_path / 'model'}", "--max-repetitions", "5"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "COLUMNS": "200"},
    )
    lines = r.stderr.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("plan: ")), None)
    started = next(i for i, line in enumerate(lines) if "started mixed" in line)
    assert first is not None and first < started, r.stderr
    plan = " ".join(lines[first:started])
    assert "up tiny-mixed (role mixed) on the local backend" in plan, plan
    assert "verify it from its servers' counters" in plan, plan
    # the sweep as bench states it, with its time, and what comes after
    assert "c=1,4; 3 repetitions, shuffled; 15 s windows after a warm-up of 3 s" in plan, plan
    assert "at most 5 repetitions" in plan and "about 2 min to 4 min" in plan, plan
    assert f"report in {out}" in plan and "then down" in plan, plan
    assert "mixed stopped" in r.stdout, r.stdout
