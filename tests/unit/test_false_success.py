"""Smaller false successes (issue 33, D12): a command that said all was well while it was
not.  `status` of a role that answers no /health, `lint` of a Helm template that happens to
parse as YAML, the report of a sweep that was stopped part-way, `attach` by an entry URL
where nothing answers."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

from tests.conftest import CliResult
from tests.unit.conftest import record_local
from tests.unit.engine_standin import scripted_engine

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
