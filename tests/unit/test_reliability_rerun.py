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
