"""scripts/reliability_rerun.py re-runs the reliability probe's 345 cases (issue 33); a
handful of its fastest rows run here, so that the script cannot rot unseen: its tables
still count the probe's 345 cases, and its cases still build their inputs, run the CLI
and hold on this checkout."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "reliability_rerun.py"

# Rows that need no engine and take about a second each.
FAST = [
    ("Values files and --set", "binary values file"),
    ("Recipe files", "FIFO"),
    ("lint", "100k nested `[`"),
    ("preflight", '`taints: "NoSchedule"`'),
    ("secrets", "redactor probes"),
]


@pytest.fixture(scope="module")
def rerun() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reliability_rerun", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_tables_count_the_probes_345_cases(rerun: ModuleType) -> None:
    by_section = {k: sum(c.n for c in rerun.CASES if c.section == k) for k in rerun.SECTIONS}
    assert by_section == {"1": 266, "3": 25, "piped": 7, "2": 43, "4": 4}


def test_a_handful_of_cases_run_and_hold(rerun: ModuleType) -> None:
    cases = [
        c
        for c in rerun.CASES
        for table, row in FAST
        if c.table.startswith(table) and c.row.startswith(row)
    ]
    assert len(cases) == len(FAST)
    outcomes = rerun.run_cases(cases)
    failed = {o.case.row: o.verdicts for o in outcomes if any(v is not None for v in o.verdicts)}
    assert not failed
    assert rerun.tally(outcomes) == {
        "cases": len(FAST),
        "tried": len(FAST),
        "held": len(FAST),
        "failed": 0,
        "not_rerun": 0,
    }


# The probe's cases that need real vLLM engines (`up`/`run` interrupts, races, tiny-pd's
# timeout, vLLM's own log of a key): re-run only with --engines.
ENGINE_ROWS = {
    "Ctrl-C `up` (before ready)": 1,
    "Ctrl-C `run` during up": 1,
    "Ctrl-C `run` during bench; its partial report marked partial": 2,
    "SIGTERM `up`": 1,
    "SIGKILL `up`": 1,
    "re-run after interrupted `up`/`run`": 1,
    "`up --timeout 5` on tiny-pd": 1,
    "two `up` of one name, model missing": 1,
    "two `up` of one name, model present": 1,
    "same: vLLM's own log (a real engine)": 1,
}


def test_engine_cases_are_declared_and_not_run_without_engines(rerun: ModuleType) -> None:
    engine = [c for c in rerun.CASES if c.needs == "engines"]
    assert {c.row: c.n for c in engine} == ENGINE_ROWS
    assert all(c.fn is not None and c.why_not and "--engines" in c.why_not for c in engine)
    assert not rerun.MODE.engines  # the default: quick, no vLLM
    outcomes = rerun.run_cases(engine)
    assert all(isinstance(v, rerun.Skip) for o in outcomes for v in o.verdicts)
    assert rerun.tally(outcomes)["not_rerun"] == sum(ENGINE_ROWS.values())
