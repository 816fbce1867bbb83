"""Output that survives a pipe: every command run as CI runs it (stdout and stderr piped,
``COLUMNS`` claiming a narrow terminal) prints text from files, servers and messages as it
is (no Rich markup, no emoji codes) and its tables whole (no path, name or message cut or
folded).  Each case runs the real CLI in a subprocess."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import yaml

from servebook.recipe.source import catalog_names, load_source
from tests.conftest import CliResult
from tests.unit.result_runs import RERUN, A

Cli = Callable[..., CliResult]
NARROW = {"COLUMNS": "40"}
LINT = Path(__file__).parent / "fixtures" / "lint"


def _deep(tmp_path: Path) -> Path:
    d = tmp_path / ("a-directory-name-long-enough-to-be-cut-" * 3) / "deploy"
    d.mkdir(parents=True)
    return d


def test_recipes_table_keeps_every_name_and_description_whole(cli: Cli) -> None:
    r = cli("recipes", env=NARROW)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for name in catalog_names():
        first = " ".join(str(load_source(name).data["description"]).split()).split(". ")[0]
        row = [line for line in lines if line.startswith(f"│ {name} ")]
        assert len(row) == 1 and first.rstrip(".") in row[0], (name, row)


def test_lint_prints_file_text_literally_and_whole(cli: Cli, tmp_path: Path) -> None:
    d = _deep(tmp_path)
    manifest = d / "node.yaml"
    text = (LINT / "field-notes" / "node-placeholder.yaml").read_text()
    value = "<NODE> [bold]see notes.md:100:[/bold] :thumbs_up:"
    manifest.write_text(
        text.replace("kubernetes.io/hostname: <NODE>", f"kubernetes.io/hostname: {value!r}")
    )
    r = cli("lint", str(d), env=NARROW)
    assert r.returncode == 1, r.stderr
    [message] = json.loads(cli("lint", "--json", str(d)).stdout)["findings"]
    assert value in message["message"]
    rows = [line for line in r.stdout.splitlines() if "SB101" in line]
    assert len(rows) == 1
    assert message["subject"] in rows[0] and message["message"] in rows[0]
    assert "\N{HUNDRED POINTS SYMBOL}" not in r.stdout and "\N{THUMBS UP SIGN}" not in r.stdout


def test_error_messages_quote_their_input_literally(cli: Cli) -> None:
    ref = "[bold]no-such:100:[/bold]"
    r = cli("recipes", "show", ref, env=NARROW)
    assert r.returncode == 2
    assert f"recipe file {ref} does not exist" in r.stderr
    assert "\N{HUNDRED POINTS SYMBOL}" not in r.stderr


def test_checks_print_each_rationale_on_one_line(cli: Cli) -> None:
    listed = json.loads(cli("checks", "--json").stdout)
    r = cli("checks", env=NARROW)
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    for c in listed:
        assert f"{c['id']}  {c['title']}" in lines
        assert f"  why: {c['rationale']}" in lines


def test_recipes_show_prints_parameter_values_literally(cli: Cli, tmp_path: Path) -> None:
    doc = load_source("tiny-mixed").data
    doc.setdefault("parameters", {})["note"] = {
        "type": "str",
        "default": "[red]x[/red] :100:",
        "description": "A value with markup in it.",
    }
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(doc))
    r = cli("recipes", "show", str(p), env=NARROW)
    assert r.returncode == 0, r.stderr
    assert "  note = [red]x[/red] :100:" in r.stdout.splitlines()


def test_compare_table_and_paths_whole(cli: Cli, tmp_path: Path) -> None:
    d = _deep(tmp_path)
    shutil.copytree(A, d / "run-a")
    shutil.copytree(RERUN, d / "run-b")
    r = cli("compare", str(d / "run-a"), str(d / "run-b"), "--reproduce", env=NARROW)
    assert r.returncode == 0, r.stderr
    header = [line for line in r.stdout.splitlines() if "Load" in line]
    assert len(header) == 1
    for col in ("Metric", "A median", "B vs A", "A's CI covers B", "Level verdict"):
        assert col in header[0]
    assert any("c=16" in line and "reproduces" in line for line in r.stdout.splitlines())
