"""Smaller false successes (issue 33, D12): a command that said all was well while it was
not.  `status` of a role that answers no /health, `lint` of a Helm template that happens to
parse as YAML, the report of a sweep that was stopped part-way, `attach` by an entry URL
where nothing answers."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

from servebook.bench.sweep import Interrupted
from servebook.pipeline import interrupted_bench
from servebook.results.schema import RESULTS_NAME
from tests.conftest import CliResult
from tests.unit.conftest import record_local
from tests.unit.engine_standin import free_port, scripted_engine
from tests.unit.result_runs import CPU

Cli = Callable[..., CliResult]
CORPUS = Path(__file__).parent / "fixtures" / "lint" / "corpus"


def test_status_of_a_role_alive_but_not_answering_health_exits_1(cli: Cli, sb_home: Path) -> None:
    with scripted_engine() as (url, proc):
        record_local("one", proc.pid, url)
        assert cli("status", "one").returncode == 0  # healthy
        os.kill(proc.pid, signal.SIGSTOP)  # alive, answering nothing
        try:
            r = cli("status", "one", "--json")
        finally:
            os.kill(proc.pid, signal.SIGCONT)
    assert r.returncode == 1, r.stdout + r.stderr
    role = json.loads(r.stdout)["roles"][0]
    assert role["state"] == "alive, not healthy" and role["ok"] is False


def test_lint_of_a_helm_template_that_parses_as_yaml_is_not_a_pass(cli: Cli) -> None:
    r = cli("lint", str(CORPUS / "prodstack" / "chart-template-quoted.yaml"), "--json")
    assert r.returncode == 2, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is False
    sb115 = [f for f in doc["findings"] if f["check"] == "SB115"]
    assert [f["severity"] for f in sb115] == ["error"]
    assert "helm template" in sb115[0]["message"]
    # A controller's template is an object of its own: information, as before.
    r = cli("lint", str(CORPUS / "kserve" / "config-llm-template.yaml"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_report_of_a_sweep_stopped_part_way_says_it_is_incomplete(tmp_path: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(CPU, out)
    doc = json.loads((out / RESULTS_NAME).read_text())
    doc["points"] = doc["points"][:2]  # the main job was stopped after its second point
    (out / RESULTS_NAME).write_text(json.dumps(doc))
    interrupted_bench(
        Interrupted("stopped at c=2 rep 0 (...)", path=None, points=2), out, "tiny-pd"
    )
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    said = " ".join(md.split())
    assert "INCOMPLETE:" in said and "holds 2 of the 6 points its sweep planned" in said
    assert "c=2 rep 0" in said and "rate=0.5/s rep 1" in said
    assert "INCOMPLETE:" in html
    # The whole sweep's report says nothing of the kind.
    whole = tmp_path / "whole"
    shutil.copytree(CPU, whole)
    interrupted_bench(Interrupted("stopped", path=None, points=6), whole, "tiny-pd")
    assert "INCOMPLETE" not in (whole / "report.md").read_text()


def test_attach_by_an_entry_where_nothing_answers_is_exit_2_and_records_nothing(
    cli: Cli, sb_home: Path
) -> None:
    with scripted_engine() as (url, _):
        nothing = f"http://127.0.0.1:{free_port()}"
        r = cli("attach", "one", "--role", f"mixed={url}", "--entry", nothing, "--model", "tiny")
    assert r.returncode == 2, r.stdout + r.stderr
    said = " ".join(r.stderr.split())
    assert f"--entry {nothing}: nothing answers there" in said and "nothing was recorded" in said
    assert "attached: one" not in r.stdout
    assert not list(sb_home.rglob("attached.json"))
