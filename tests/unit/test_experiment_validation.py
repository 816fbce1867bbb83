"""One validation before anything starts (issue 44, point 2; hostile probe of
``shared/reference/hostile-probe-2026-12-07.md``): D14, unusable ``load:`` values and arms
passed ``--dry-run`` and were refused only when their bench came up, after other arms had
run; D12, a malformed experiment file and ``load: {agents: N}`` ended in tracebacks; and a
new user's ``dataset: builtin:spec-text`` failed "cannot read the dataset"."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from servebook.experiment import spec
from servebook.experiment.steps import bench_args
from tests.conftest import CliResult

GOOD = """baseline: a
blocks: 2
arms:
  - {name: a, url: "http://127.0.0.1:9", model: tiny}
  - {name: b, url: "URL_B", model: tiny}
load: {concurrency: [1, 2], duration: 2s, precision: "off"LOAD}
"""


def exp_file(tmp_path: Path, load: str = "", url_b: str = "http://127.0.0.1:10") -> Path:
    f = tmp_path / "exp.yaml"
    f.write_text(GOOD.replace("LOAD", load).replace("URL_B", url_b))
    return f


@pytest.mark.parametrize(
    ("load", "key"),
    [
        (", api: foo", "load.api"),
        (", prompt-format: xml", "load.prompt-format"),
        (", input-len: 0", "load.input-len"),
        (", output-len: -3", "load.output-len"),
        (", dataset: missing.jsonl", "load.dataset"),
        (", tokenizer: /no/such/model", "load.tokenizer"),
        (", request-timeout: 0", "load.request-timeout"),
        (", request-timeout: -1", "load.request-timeout"),
        (", request-timeout: .nan", "load.request-timeout"),
    ],
)
def test_d14_a_load_value_bench_would_refuse_is_refused_at_dry_run(
    tmp_path: Path, cli: Callable[..., CliResult], load: str, key: str
) -> None:
    f = exp_file(tmp_path, load)
    r = cli("experiment", str(f), "-o", str(tmp_path / "out"), "--dry-run")
    assert r.returncode == 2, (load, r.stdout, r.stderr)
    said = " ".join(r.stderr.split())
    assert f"{f}: {key}" in said or (key == "load.dataset" and "load.dataset file" in said), said
    assert "Traceback" not in r.stderr


def test_d14_the_real_run_refuses_before_any_arm_is_benched(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    out = tmp_path / "out"
    for load, url_b, key in (
        (", api: foo", "http://127.0.0.1:10", "load.api"),
        ("", "ftp://127.0.0.1:abc", "arms[b].url"),
    ):
        r = cli("experiment", str(exp_file(tmp_path, load, url_b)), "-o", str(out))
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert key in " ".join(r.stderr.split()), r.stderr
        assert not out.exists()  # nothing written, nothing benched


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("baseline: a\nblocks: 2\narms: [\n  {name: a\n", "malformed YAML"),
        ("baseline: a\nbaseline: b\n", "key 'baseline' is given twice"),
        ("x: " + "[" * 100_000 + "]" * 100_000 + "\n", "exp.yaml"),
    ],
)
def test_d12a_a_malformed_experiment_file_is_exit_2_naming_it(
    tmp_path: Path, cli: Callable[..., CliResult], text: str, said: str
) -> None:
    f = tmp_path / "exp.yaml"
    f.write_text(text)
    r = cli("experiment", str(f), "-o", str(tmp_path / "out"), "--dry-run")
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.stdout, r.stderr[-2000:])
    assert said in " ".join(r.stderr.split())


def test_d12b_agents_is_a_number_and_builtin_datasets_work_in_an_experiment(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    from servebook import datasets

    f = exp_file(tmp_path, ", agents: 2, dataset: builtin:spec-text")
    exp = spec.load(f)
    a = bench_args(exp, exp.arm("a"))
    assert a.agents == 2 and a.dataset == datasets.resolve("builtin:spec-text")
    assert a.dataset is not None and a.dataset.is_file()
    r = cli("experiment", str(f), "-o", str(tmp_path / "out"), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "dataset: prompts from builtin:spec-text" in r.stdout and "agents: 2" in r.stdout


@pytest.mark.parametrize(
    ("given", "key"),
    [("concurrency: [1, 2]", "concurrency: []"), ("concurrency: [1, 2]", 'concurrency: ""'),
     ("duration: 2s", "duration: null")],
)  # fmt: skip
def test_d16_an_empty_load_value_is_refused_not_read_as_bench_s_default(
    tmp_path: Path, cli: Callable[..., CliResult], given: str, key: str
) -> None:
    """D16: ``concurrency: []`` or ``""`` silently became bench's default levels."""
    f = exp_file(tmp_path)
    f.write_text(f.read_text().replace(given, key))
    r = cli("experiment", str(f), "-o", str(tmp_path / "out"), "--dry-run")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"load.{key.split(':')[0]}: empty" in " ".join(r.stderr.split()), r.stderr


def test_d12d_a_state_entry_without_an_outcome_is_refused_on_resume(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    import json

    f = exp_file(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    exp = spec.load(f)
    from servebook.experiment import runner, session

    state = runner.new_state(exp, session.order_of(exp), "williams", "c0ffee")
    del state["schedule"][1]["outcome"]
    (out / "experiment.json").write_text(json.dumps(state))
    r = cli("experiment", str(f), "-o", str(out), "--resume")
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    assert "schedule[1] is not an entry (block, arm, outcome)" in " ".join(r.stderr.split())
