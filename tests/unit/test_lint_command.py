"""`servebook lint` and `servebook checks` through the command line: exit codes, JSON,
and the generated docs/checks.md that must never drift from the registry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

import servebook.commands.lint as lint_command
from servebook.commands import app
from servebook.findings import REGISTRY

FIXTURES = Path(__file__).parent / "fixtures" / "lint"
REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_docs_checks_md_is_generated_from_the_registry() -> None:
    expected = lint_command.checks_markdown(lint_command.all_checks())
    committed = (REPO / "docs" / "checks.md").read_text(encoding="utf-8")
    assert committed == expected, (
        "docs/checks.md is stale: run `servebook checks --markdown > docs/checks.md`"
    )


def test_checks_markdown_option_prints_the_docs_page() -> None:
    result = runner.invoke(app, ["checks", "--markdown"])
    assert result.exit_code == 0
    assert result.stdout == lint_command.checks_markdown(lint_command.all_checks())


def test_checks_lists_every_registered_check_with_rationale_and_fix() -> None:
    result = runner.invoke(app, ["checks", "--json"])
    assert result.exit_code == 0
    listed = json.loads(result.stdout)
    assert [c["id"] for c in listed] == sorted(REGISTRY)
    assert {"SB101", "SB105", "SB110", "SB120", "SB122"} <= {c["id"] for c in listed}
    assert all(c["title"] and c["rationale"] and c["fix"] for c in listed)
    table = runner.invoke(app, ["checks"])
    assert table.exit_code == 0
    assert all(c["id"] in table.stdout for c in listed)


def test_lint_clean_input_exits_0() -> None:
    clean = FIXTURES / "sb107-pd-settings" / "pass-nixl-hetero-tp.yaml"
    result = runner.invoke(app, ["lint", str(clean)])
    assert result.exit_code == 0, result.stdout
    assert "no findings" in result.stdout


def test_lint_warnings_only_exit_0() -> None:
    result = runner.invoke(app, ["lint", str(FIXTURES / "sb109-namespace" / "fail.yaml")])
    assert result.exit_code == 0
    assert "SB109" in result.stdout


def test_lint_failing_finding_exits_1_and_json_names_file_and_line() -> None:
    path = FIXTURES / "field-notes" / "node-placeholder.yaml"
    result = runner.invoke(app, ["lint", "--json", str(path)])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 1
    [finding] = doc["findings"]
    assert finding["check"] == "SB101"
    assert finding["title"] == REGISTRY["SB101"].title
    assert finding["evidence"]["file"] == str(path)
    assert finding["evidence"]["line"] == 26


def test_lint_findings_are_sorted_by_file_and_line() -> None:
    result = runner.invoke(app, ["lint", "--json", str(FIXTURES / "field-notes")])
    assert result.exit_code == 1
    findings = json.loads(result.stdout)["findings"]
    keys = [(f["evidence"]["file"], f["evidence"]["line"]) for f in findings]
    assert keys == sorted(keys)
    # One set: the namespace one file uses is created by another, so SB109 stays quiet.
    assert len(keys) == 8 and "SB109" not in {f["check"] for f in findings}


def test_lint_unparseable_yaml_is_an_error_finding_naming_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Pod\nmetadata:\n  name: [x\n")
    result = runner.invoke(app, ["lint", "--json", str(bad)])
    assert result.exit_code == 2
    [finding] = json.loads(result.stdout)["findings"]
    assert finding["check"] == "SB100" and finding["severity"] == "error"
    assert finding["subject"] == f"{bad}:4"
    assert finding["message"].startswith(f"{bad} was not linted: YAML does not parse")


def test_lint_missing_path_exits_2_from_the_real_entry_point(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "servebook", "lint", str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "missing.yaml: no such file or directory" in proc.stderr


def _unrendered_helm_template(path: Path) -> None:
    # Shaped like a chart's templates/deployment.yaml (the `{{ include ... }}` and
    # `{{- with .Values... }}` blocks of `helm create`'s scaffold), lying loose in a
    # directory of manifests rather than under a chart's templates/.
    path.write_text(
        "apiVersion: apps/v1\n"
        "kind: Deployment\n"
        "metadata:\n"
        '  name: {{ include "vllm.fullname" . }}\n'
        "spec:\n"
        "  template:\n"
        "    spec:\n"
        "      {{- with .Values.nodeSelector }}\n"
        "      nodeSelector:\n"
        "        {{- toYaml . | nindent 8 }}\n"
        "      {{- end }}\n"
        "      containers:\n"
        "        - name: vllm\n"
        '          image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"\n'
    )


def test_one_unreadable_file_never_hides_the_others_findings(tmp_path: Path) -> None:
    readable = sorted((FIXTURES / "field-notes").glob("*.yaml"))
    for src in readable:
        (tmp_path / src.name).write_text(src.read_text())
    before = runner.invoke(app, ["lint", "--json", str(tmp_path)])
    alone = json.loads(before.stdout)["findings"]
    assert before.exit_code == 1 and len(alone) == 8
    helm = tmp_path / "deployment.yaml"
    _unrendered_helm_template(helm)

    result = runner.invoke(app, ["lint", "--json", str(tmp_path)])
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == 2 and doc["ok"] is False
    found = doc["findings"]
    for f in alone:
        assert f in found
    [bad] = [f for f in found if f not in alone]
    assert bad["severity"] == "error" and bad["evidence"]["file"] == str(helm)
    assert "helm template" in bad["message"] + bad["hint"]

    table = runner.invoke(app, ["lint", str(tmp_path)])
    assert table.exit_code == 2
    rows = [line.split()[1] for line in table.stdout.splitlines() if line[2:4] == "SB"]
    assert sorted(rows) == sorted(f["check"] for f in [*alone, bad])
    assert "9 finding(s): 9 failing" in table.stdout
