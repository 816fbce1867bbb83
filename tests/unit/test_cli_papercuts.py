"""The command line's papercuts (issue 24, point 6), each through the real CLI in a
subprocess: what a new user types, and the exit code and message they get."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from servebook.cli import app
from servebook.recipe.source import catalog_names, load_source
from tests.conftest import CliResult
from tests.unit.result_runs import A

Cli = Callable[..., CliResult]
REPO = Path(__file__).resolve().parents[2]
BENCH = ["bench", "--url", "http://127.0.0.1:9", "--model", "m"]


def _values(tmp_path: Path, text: str) -> str:
    p = tmp_path / "values.yaml"
    p.write_text(text)
    return str(p)


# (arguments, or a function of tmp_path giving them; exit code; words in the output)
CASES: list[tuple[str, Callable[[Path], list[str]], int, list[str]]] = [
    ("checks by id", lambda t: ["checks", "SB302", "sb114"], 0, ["SB302 ", "SB114 ", "2 check(s)"]),
    ("checks by area", lambda t: ["checks", "SB12"], 0, ["SB120 ", "SB122 ", "3 check(s)"]),
    ("unknown check", lambda t: ["checks", "SB999"], 2, ["no such check: 'SB999'"]),
    (
        "port too high",
        lambda t: ["up", "no-such-recipe", "--port", "99999"],
        2,
        ["--port 99999", "1-65535"],
    ),
    ("port zero", lambda t: ["up", "no-such-recipe", "--port", "0"], 2, ["--port 0", "1-65535"]),
    (
        "duplicate key",
        lambda t: [
            "recipes",
            "show",
            "vllm-mixed",
            "-f",
            _values(t, "node: a\nimage: x\nnode: b\n"),
        ],
        2,
        ["values.yaml: line 3: key 'node' is given twice (first at line 1)"],
    ),
    (
        "nested duplicate key",
        lambda t: [
            "recipes",
            "show",
            "vllm-mixed",
            "-f",
            _values(t, "pod_overrides:\n  a: 1\n  a: 2\n"),
        ],
        2,
        ["key 'a' is given twice"],
    ),
    (
        "empty values",
        lambda t: ["recipes", "show", "vllm-mixed", "-f", _values(t, "")],
        2,
        ["is empty"],
    ),
    (
        "comments only",
        lambda t: ["recipes", "show", "vllm-mixed", "-f", _values(t, "# node: a\n")],
        2,
        ["is empty"],
    ),
    (
        "empty level",
        lambda t: [*BENCH, "-o", str(t / "o"), "--concurrency", "1,,4"],
        2,
        ["--concurrency '1,,4'", "empty item"],
    ),
    (
        "trailing comma",
        lambda t: [*BENCH, "-o", str(t / "o"), "--concurrency", "1,4,"],
        2,
        ["empty item"],
    ),
    (
        "empty rate",
        lambda t: [*BENCH, "-o", str(t / "o"), "--rate", "2,,8"],
        2,
        ["--rate '2,,8'", "empty item"],
    ),
    (
        "missing kubeconfig",
        lambda t: ["status", "--kubeconfig", str(t / "nope")],
        2,
        ["--kubeconfig", "no such file"],
    ),
]


@pytest.mark.parametrize(("label", "args", "code", "words"), CASES, ids=[c[0] for c in CASES])
def test_papercut(
    cli: Cli,
    tmp_path: Path,
    label: str,
    args: Callable[[Path], list[str]],
    code: int,
    words: list[str],
) -> None:
    r = cli(*args(tmp_path))
    text = r.stdout + r.stderr
    assert r.returncode == code, text
    for w in words:
        assert w in text, (w, text)
    assert "Traceback" not in text and "NoneType" not in text
    assert not (tmp_path / "o").exists()


def test_report_of_a_results_file_writes_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "runs" / "a"
    shutil.copytree(A, run)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    r = CliRunner().invoke(app, ["report", str(run / "results.json")])
    assert r.exit_code == 0, r.output
    assert (run / "report.html").is_file() and (run / "report.md").is_file()
    assert not any(elsewhere.iterdir())


@pytest.mark.parametrize("command", ["up", "status", "down", "run", "verify", "bench"])
def test_every_command_that_reaches_a_cluster_takes_the_kubeconfig_its_errors_name(
    command: str,
) -> None:
    r = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "--kubeconfig" in r.output


def test_setup_says_what_happens_without_vllm_router() -> None:
    script = (REPO / "scripts" / "setup.sh").read_text()
    assert "own PD router" not in script
    branch = script[script.index('pip[@]}" install vllm-router') :]
    assert "exit 1" in branch.split("fi", 1)[0]


def test_nothing_a_user_reads_cites_the_field_notes(tmp_path: Path) -> None:
    texts = {"README.md": (REPO / "README.md").read_text()}
    for name in catalog_names():
        doc = load_source(name).data
        texts[f"{name} description"] = str(doc.get("description", ""))
        for p, spec in (doc.get("parameters") or {}).items():
            texts[f"{name} {p}"] = yaml.safe_dump(spec)
    for path in (REPO / "tests" / "unit" / "fixtures" / "render").rglob("PARAMETERS.md"):
        texts[str(path)] = path.read_text()
    cited = [k for k, v in texts.items() if "field notes" in v.lower() or "field-notes" in v]
    assert cited == []


def test_status_shows_the_log_path_verify_points_at(cli: Cli, sb_home: Path) -> None:
    from servebook.backends import state

    sdir = state.state_dir_for("gone")
    sdir.mkdir(parents=True)
    log = sdir / "mixed.log"
    log.write_text("INFO engine died\n")
    state.write_state(
        state.Deployment(
            name="gone",
            recipe="tiny-mixed",
            state_dir=str(sdir),
            created="2026-01-01T00:00:00+00:00",
            served_model_name="tiny",
            entry_role="mixed",
            entry_url="http://127.0.0.1:9",
            roles=[
                state.RoleProcess(
                    name="mixed",
                    kind="engine",
                    pid=2**22 + 1,  # no such process
                    start_ticks=None,
                    port=9,
                    url="http://127.0.0.1:9",
                    log=str(log),
                    argv=["python", "-m", "vllm.entrypoints.openai.api_server"],
                    env={},
                )
            ],
        )
    )
    r = cli("status", "gone")
    assert r.returncode == 1, r.stderr
    assert f"log: {log}" in r.stdout


def test_run_caps_its_repetitions_at_the_main_jobs_own_and_refuses_fewer_than_three() -> None:
    """`run --max-repetitions N` shortens the main job on a noisy machine (it repeats a level
    up to 20 times while its interval is wider than +-2.5%); below the 3 every level gets is
    refused before anything starts."""
    from servebook.commands.deploy import RUN_MAX_REPETITIONS
    from servebook.pipeline import RUN_SWEEP

    assert RUN_MAX_REPETITIONS == RUN_SWEEP.max_repetitions == 20
    assert RUN_SWEEP.repetitions == 3
    r = CliRunner().invoke(app, ["run", "--max-repetitions", "2"], env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    assert "--max-repetitions" in r.output
    h = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert "--max-repetitions" in h.output and "default 20" in h.output
