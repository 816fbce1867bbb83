"""Lint on the field corpus (tests/unit/fixtures/lint/corpus): exactly the findings its
verdicts call true, in every file run and every directory run, none of the false ones,
every miss class caught; scored by benchmarks/lint_corpus.py through `servebook lint
--json`, so a rule that regresses on the field's manifests fails here."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "lint_corpus", REPO / "benchmarks" / "lint_corpus.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["lint_corpus"] = module
    spec.loader.exec_module(module)
    return module


bench = _benchmark()
VERDICTS = bench.load_verdicts()


@pytest.fixture(scope="module")
def runs() -> list:
    return bench.score(VERDICTS)


def test_corpus_is_large_and_from_many_projects() -> None:
    files = bench.corpus_files()
    assert len(files) >= 50
    assert len({f.split("/")[0] for f in files}) >= 6
    assert set(files) == set(VERDICTS["files"]), "every corpus file has a verdict entry"
    for name, v in VERDICTS["files"].items():
        assert v.get("source"), f"{name} names the original it is shaped like"


def test_verdicts_table_is_rendered_from_the_yaml() -> None:
    assert bench.TABLE.read_text(encoding="utf-8") == bench.render_table(VERDICTS), (
        "VERDICTS.md is stale: run `python benchmarks/lint_corpus.py --write-table`"
    )


def test_precision_and_every_miss_class(runs: list) -> None:
    s = bench.summary(runs, VERDICTS)
    assert s["precision"] >= bench.PRECISION_TARGET, s
    for cls, v in s["miss_classes"].items():
        assert v["expected"] > 0 and v["missed"] == 0, (cls, v)
    for cls, n in s["false_classes"].items():
        assert n == 0, f"false class {cls} reported {n} time(s)"


@pytest.mark.parametrize("mode", ["file", "dir"])
def test_each_run_reports_exactly_its_true_findings(runs: list, mode: str) -> None:
    wrong = []
    for r in runs:
        if r.mode != mode:
            continue
        if r.false_hits or r.misses:
            wrong.append((r.target, r.false_hits, r.misses))
    assert wrong == []


def test_severities_match_the_verdicts(runs: list) -> None:
    """A template (SB115) is information and script-assembled flags (SB117) a warning:
    neither fails a run where the file is what it legitimately is."""
    pinned = {
        (name, e["check"], int(e["line"])): e["severity"]
        for name, v in VERDICTS["files"].items()
        for e in v.get("findings") or []
        if e.get("severity")
    }
    seen: Counter[str] = Counter()
    for r in runs:
        for key, severity in r.severities.items():
            if key in pinned:
                assert severity == pinned[key], (r.target, key)
                seen[key[1]] += 1
    assert seen["SB115"] and seen["SB117"]


def test_a_template_alone_does_not_fail_the_run(runs: list) -> None:
    by_target = {(r.mode, r.target): r for r in runs}
    run = by_target[("file", "kserve/config-llm-template.yaml")]
    assert run.exit_code == 0 and run.true_hits


def test_unreadable_files_are_the_ones_the_verdicts_name(runs: list) -> None:
    unreadable = {n for n, v in VERDICTS["files"].items() if v.get("unreadable")}
    got = {r.target for r in runs if r.mode == "file" and (r.unreadable or r.exit_code == 2)}
    assert got == unreadable


# --- the held-out corpus: assembled and judged independently of the rules' author ---------

HELDOUT_VERDICTS = bench.load_verdicts(bench.HELDOUT / bench.VERDICTS_NAME)


@pytest.fixture(scope="module")
def heldout_runs() -> list:
    return bench.score(HELDOUT_VERDICTS, bench.HELDOUT)


def test_heldout_corpus_is_from_many_projects_and_fully_judged() -> None:
    files = bench.corpus_files(bench.HELDOUT)
    assert len(files) >= 25
    assert len({f.split("/")[0] for f in files}) >= 6
    assert set(files) == set(HELDOUT_VERDICTS["files"]), "every held-out file has a verdict"
    for name, v in HELDOUT_VERDICTS["files"].items():
        assert v.get("source"), f"{name} names the original it is shaped like"
        text = (bench.HELDOUT / name).read_text(encoding="utf-8")
        assert "Held-out lint fixture" in text, f"{name} says what it is and where from"
    table = (bench.HELDOUT / bench.TABLE_NAME).read_text(encoding="utf-8")
    assert table == bench.render_table(HELDOUT_VERDICTS), (
        "heldout VERDICTS.md is stale: run `python benchmarks/lint_corpus.py --write-table`"
    )


def test_heldout_precision_and_every_expected_finding(heldout_runs: list) -> None:
    s = bench.summary(heldout_runs, HELDOUT_VERDICTS)
    assert s["precision"] >= bench.PRECISION_TARGET, s
    assert s["missed"] == 0, [(r.target, r.misses) for r in heldout_runs if r.misses]
    assert bench.passes(s)


def test_heldout_directory_with_a_helm_template_keeps_every_other_finding(
    heldout_runs: list,
) -> None:
    run = {(r.mode, r.target): r for r in heldout_runs}[("dir", "prodstack")]
    assert not run.unreadable and run.exit_code == 2
    assert {c for _, c, _ in run.reported} == {"SB100", "SB101", "SB114"}
