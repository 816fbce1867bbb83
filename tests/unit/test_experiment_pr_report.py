"""A report a pull request can take (issue 49, point 6): provenance per arm, TTFT and p99
columns, the ratio of any pair of arms (``pairs:``, ``report --pair``), per-accelerator
figures for every arm that has a count, every arm in the table even when all its points are
invalid, and a report.md with no path of the measuring machine, ready to paste."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from servebook.errors import UsageError
from servebook.experiment import report as exp_report
from servebook.experiment import spec
from servebook.report.render import public
from servebook.results.provenance import source_commit
from tests.unit.result_runs import TRIAL_MIXED, TRIAL_PD, experiment_of, variant


def all_invalid(doc: dict[str, Any]) -> None:
    for p in doc["points"]:
        p["valid"] = False
        p["invalid_reasons"] = ["SB404: achieved concurrency 61% of the level (needs 98%)"]


@pytest.fixture
def four_arms(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """mixed (baseline), pd-spec, pd and a broken arm, three blocks each: pd runs the
    baseline's own results, so pd-spec/pd must equal pd-spec/mixed; broken's every point
    is invalid.  pd-spec and pd declare their accelerator counts, mixed does not."""
    broken = variant(tmp_path, TRIAL_MIXED, "broken", all_invalid)
    state = experiment_of(
        tmp_path,
        {"mixed": TRIAL_MIXED, "pd-spec": TRIAL_PD, "pd": TRIAL_MIXED, "broken": broken},
        blocks=3,
        arm_keys={"pd-spec": {"accelerators": 2}, "pd": {"accelerators": 2}},
        pairs=["pd-spec:pd"],
    )
    return state, tmp_path / "out"


def test_a_named_pair_is_computed_as_the_baseline_ratios_are(
    four_arms: tuple[dict[str, Any], Path],
) -> None:
    state, _ = four_arms
    assert state["pairs"] == [["pd-spec", "pd"]]
    pair = {(c["concurrency"], c["metric"]): c for c in state["pair_comparisons"]}
    base = {
        (c["concurrency"], c["metric"]): c for c in state["comparisons"] if c["arm"] == "pd-spec"
    }
    # both declare 2 accelerators: the pair has a per-accelerator ratio (mixed has no count)
    per = "output_tokens_per_s_per_accelerator"
    assert set(pair) == set(base) | {(1.0, per), (4.0, per)}
    for level in (1.0, 4.0):
        tok = pair[(level, "output_tokens_per_s")]
        assert pair[(level, per)]["ratio"] == pytest.approx(tok["ratio"], rel=1e-4)
    for key, c in pair.items():
        assert (c["arm"], c["baseline"]) == ("pd-spec", "pd")
        if key not in base:
            continue
        # pd ran the baseline's results: the same blocks, the same ratio and interval
        for field in ("ratio", "ci95", "blocks", "verdict", "judged_on"):
            assert c.get(field) == base[key].get(field), (key, field)


def test_every_arm_is_in_the_table_with_ttft_p99_and_per_accelerator_figures(
    four_arms: tuple[dict[str, Any], Path],
) -> None:
    state, _ = four_arms
    rows = {(r["arm"], r["level"]): r for r in state["absolute"]}
    (broken,) = [r for r in state["absolute"] if r["arm"] == "broken"]
    assert broken["level"] is None and broken["why"].startswith("no valid point: ")
    assert "SB404" in broken["why"]
    for arm in ("mixed", "pd-spec", "pd"):
        for level in (1.0, 4.0):
            r = rows[(arm, level)]
            assert r["ttft_ms_p50"] and r["ttft_ms_p99"] >= r["ttft_ms_p50"]
    # per accelerator: the declared count divides; mixed has none and says n/a
    assert rows[("pd", 4.0)]["output_tokens_per_s_per_accelerator"] == pytest.approx(
        rows[("pd", 4.0)]["output_tokens_per_s"] / 2, rel=1e-3
    )
    assert rows[("mixed", 4.0)]["output_tokens_per_s_per_accelerator"] is None
    prov = {p["arm"]: p for p in state["arm_provenance"]}
    assert prov["pd"]["accelerators"] == 2 and prov["pd"]["accelerators_from"] == "declared"
    assert prov["mixed"]["accelerators"] is None
    assert prov["pd-spec"]["engine"] == "vllm" and prov["pd-spec"]["engine_version"]
    # broken's benches finished (its points are what is invalid): what its servers said is
    # its provenance all the same
    assert prov["broken"]["measured"] and prov["broken"]["engine_version"]
    (table,) = [t for t in exp_report.tables(state) if t.id == "arms"]
    titles = [c.title for c in table.columns]
    for col in ("TTFT p50 (ms)", "TTFT p99 (ms)", "TPOT p50 (ms)", "TPOT p99 (ms)"):
        assert col in titles
    (shown,) = [r for r in table.rows if r[0] == "broken"]
    assert "SB404" in shown[1]


def test_report_md_holds_provenance_pairs_and_no_machine_path(
    four_arms: tuple[dict[str, Any], Path], cli: Any, tmp_path: Path
) -> None:
    _, out = four_arms
    r = cli("report", str(out), "--pair", "pd:mixed")
    assert r.returncode == 0, r.stderr
    md = (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    for head in ("## Provenance of each arm", "## Load and workload", "## Ratios of the named "
                 "pairs (pd-spec/pd, pd/mixed)", "## Every arm at every level"):  # fmt: skip
        assert head in md, head
    assert "vllm 0.32.0" in md and "TTFT p99 (ms)" in md and "TPOT p99 (ms)" in md
    assert "2 (declared on the arm)" in md
    pair_table = md.split("## Ratios of the named pairs")[1].split("\n## ")[0]
    assert "| pd-spec | pd | c=4 |" in pair_table and "| pd | mixed | c=1 |" in pair_table
    # nothing of the machine that measured: not its home, the fixtures' or this test's dirs
    for text in (md, page):
        for where in ("/root/", "/work/", "/tmp/", str(tmp_path)):
            assert where not in text, where
    assert "…/tiny-llama" in md  # the model's directory by its name (the role's flags)
    assert "![" not in md and "`plots/ratios.png`" in md  # pasted, no broken images
    # the file's pairs stay when --pair adds one; a stranger's name is refused
    bad = cli("report", str(out), "--pair", "nope:mixed")
    assert bad.returncode == 2 and "'nope' is not an arm's name" in bad.stderr
    runs = cli("report", str(TRIAL_MIXED), "-o", str(tmp_path / "r"), "--pair", "a:b")
    assert runs.returncode == 2 and "not an experiment's directory" in runs.stderr


def test_pairs_in_the_file_name_two_different_arms() -> None:
    arms = [{"name": "a", "url": "http://h:1", "model": "m"},
            {"name": "b", "url": "http://h:2", "model": "m"}]  # fmt: skip
    exp = spec.parse({"baseline": "a", "arms": arms, "pairs": "b:a"}, "e.yaml")
    assert exp.pairs == (("b", "a"),)
    for pairs, said in (
        (["a:a"], "divides an arm by itself"),
        (["a:c"], "'c' is not an arm's name"),
        (["ab"], "'ab'"),
    ):
        with pytest.raises(UsageError, match=re.escape(said)) as e:
            spec.parse({"baseline": "a", "arms": arms, "pairs": pairs}, "e.yaml")
        assert str(e.value).startswith("e.yaml: pairs[0]: ")
    # a recipe arm may declare its accelerator count (a CPU recipe's plan counts none)
    recipe = {"baseline": "a",
              "arms": [{"name": "a", "recipe": "tiny-mixed", "accelerators": 1},
                       {"name": "b", "recipe": "tiny-pd", "accelerators": 2}]}  # fmt: skip
    assert [a.accelerators for a in spec.parse(recipe, "e.yaml").arms] == [1, 2]


def test_public_text_keeps_names_urls_and_rates_but_no_directories() -> None:
    assert public("model_dir=/root/.cache/servebook/tiny, 4/s") == "model_dir=…/tiny, 4/s"
    assert public('{"path":"/srv/kv/x"}') == '{"path":"…/x"}'
    assert public("http://127.0.0.1:8000/v1/completions") == "http://127.0.0.1:8000/v1/completions"
    assert public("pd-spec / pd and a/b") == "pd-spec / pd and a/b"


def test_results_record_the_commit_servebook_ran_from(tmp_path: Path) -> None:
    assert source_commit(tmp_path) is None  # not a git checkout: no commit, not a guess
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    pkg = tmp_path / "src" / "servebook"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert source_commit(pkg) == head.strip()[:12]
    (pkg / "a.py").write_text("x = 2\n")
    assert source_commit(pkg) == head.strip()[:12] + "+dirty"
