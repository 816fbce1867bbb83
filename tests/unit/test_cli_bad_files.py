"""Hostile files at every place a command reads one (the reliability probe of 2026-12-04,
D15-D21, D29): each is refused at once with exit 2 and a message naming the file and what
it is, never a hang, a MemoryError, a RecursionError or a UnicodeDecodeError traceback.

Each case runs the real CLI in a child bounded to 60 s and 3 GiB (``bounded_cli``): on the
code before servebook.inputs a FIFO hung (the child is killed and the test fails), and
/dev/zero ended in MemoryError."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web

from tests.conftest import GPU_PD_SETS, CliResult
from tests.unit.conftest import alias_bomb
from tests.unit.served_app import served, served_models

Cli = Callable[..., CliResult]
Hostile = Callable[[str, str], Path]

PREFLIGHT = Path(__file__).parent / "fixtures" / "preflight"
RESULTS = Path(__file__).parent / "fixtures" / "results" / "tiny-pd-spec-cpu"
MOUNTINFO = Path(__file__).parent / "fixtures" / "probe" / "pod-probe-hostpath-local.mountinfo"
PD_SETS = GPU_PD_SETS

# What each kind of file is called in the refusal.
SAYS = {
    "fifo": "is a FIFO, not a regular file",
    "dev-zero": "is a character device (a symlink to /dev/zero), not a regular file",
    "latin1": "is not UTF-8 text: byte 0xe9 at offset 9 (line 1)",
    "deep-json": "deeper than 100 levels",
    "deep-yaml": "deeper than 100 levels",
    "bomb": "aliases expand",
}


def said(r: CliResult) -> str:
    """What the command printed, with Rich's wrapping undone."""
    return " ".join((r.stdout + r.stderr).split())


def refused(r: CliResult, kind: str, path: Path) -> None:
    text = said(r)
    assert r.returncode == 2, text
    assert "Traceback" not in text
    assert SAYS[kind] in text
    assert str(path) in text


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "latin1", "deep-json", "bomb"])
def test_lint_refuses_a_hostile_file_as_sb100(
    bounded_cli: Cli, hostile: Hostile, kind: str
) -> None:
    bad = hostile(kind, "x.json" if kind == "deep-json" else "x.yaml")
    refused(bounded_cli("lint", str(bad)), kind, bad)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "deep-yaml"])
def test_lint_of_a_directory_refuses_the_hostile_file_in_it(
    bounded_cli: Cli, hostile: Hostile, kind: str
) -> None:
    bad = hostile(kind, "x.yaml")
    (bad.parent / "good.yaml").write_text("a: 1\n")
    r = bounded_cli("lint", str(bad.parent))
    refused(r, kind, bad)
    assert "SB100" in said(r)


def test_lint_of_a_directory_with_two_looping_symlinks_completes(
    bounded_cli: Cli, tmp_path: Path
) -> None:
    d = tmp_path / "d2"
    d.mkdir()
    (d / "a.yaml").write_text("a: 1\n")
    (d / "loop").symlink_to(".")
    (d / "up").symlink_to("../d2")
    t0 = time.monotonic()
    r = bounded_cli("lint", str(d))
    assert r.returncode == 0, said(r)
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "latin1", "deep-yaml", "bomb"])
def test_recipes_show_refuses_a_hostile_recipe_file(
    bounded_cli: Cli, hostile: Hostile, kind: str
) -> None:
    bad = hostile(kind, "r.yaml")
    refused(bounded_cli("recipes", "show", str(bad)), kind, bad)


def test_a_recipe_file_bomb_under_an_unknown_key_is_refused_fast(
    bounded_cli: Cli, tmp_path: Path
) -> None:
    shutil.copy(
        Path(__file__).parents[2] / "src/servebook/recipe/catalog/tiny-mixed.yaml", tmp_path
    )
    recipe = tmp_path / "tiny-mixed.yaml"
    recipe.write_text(recipe.read_text() + "junk:\n" + alias_bomb(8))
    t0 = time.monotonic()
    r = bounded_cli("recipes", "show", str(recipe))
    assert r.returncode == 2 and "aliases expand" in said(r), said(r)
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "latin1", "deep-yaml"])
def test_a_hostile_values_file_is_refused_in_its_own_words(
    bounded_cli: Cli, hostile: Hostile, kind: str
) -> None:
    bad = hostile(kind, "values.yaml")
    r = bounded_cli("recipes", "show", "tiny-pd", "-f", str(bad))
    refused(r, kind, bad)
    assert "does not exist" not in said(r)


def test_a_values_file_over_a_mebibyte_is_refused_naming_the_bound(
    bounded_cli: Cli, tmp_path: Path
) -> None:
    big = tmp_path / "values.yaml"
    big.write_text("# padding\n" * 120_000 + "gpus: 1\n")
    r = bounded_cli("recipes", "show", "tiny-pd", "-f", str(big))
    assert r.returncode == 2, said(r)
    assert f"values file {big} is 1.1 MiB; servebook reads at most 1 MiB of it" in said(r)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "deep-json"])
def test_preflight_refuses_a_hostile_snapshot(
    bounded_cli: Cli, hostile: Hostile, kind: str
) -> None:
    bad = hostile(kind, "cluster.json")
    sets = [a for s in PD_SETS for a in ("--set", s)]
    refused(bounded_cli("preflight", "vllm-pd", "--snapshot", str(bad), *sets), kind, bad)


@pytest.mark.parametrize(
    ("where", "value", "says"),
    [
        ("status", "Ready", "status is str ('Ready'), not an object"),
        ("taints", "NoSchedule", "spec.taints is str ('NoSchedule'), not a list"),
    ],
)
def test_preflight_refuses_a_snapshot_node_of_the_wrong_shape(
    bounded_cli: Cli, tmp_path: Path, where: str, value: str, says: str
) -> None:
    doc = json.loads((PREFLIGHT / "healthy.json").read_text())
    node = next(i for i in doc["items"] if i["kind"] == "Node")
    if where == "status":
        node["status"] = value
    else:
        node["spec"]["taints"] = value
    snap = tmp_path / "cluster.json"
    snap.write_text(json.dumps(doc))
    sets = [a for s in PD_SETS for a in ("--set", s)]
    r = bounded_cli("preflight", "vllm-pd", "--snapshot", str(snap), *sets)
    text = said(r)
    assert r.returncode == 2, text
    assert "Traceback" not in text and "AttributeError" not in text
    assert f"Node {node['metadata']['name']}: {says}" in text and str(snap) in text


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_probe_refuses_a_hostile_mountinfo(bounded_cli: Cli, hostile: Hostile, kind: str) -> None:
    bad = hostile(kind, "mountinfo")
    refused(bounded_cli("probe", "/models/x", "--mountinfo", str(bad)), kind, bad)


def test_probe_find_reports_a_deep_config_and_goes_on(
    bounded_cli: Cli, tmp_path: Path, tiny_dir: Path
) -> None:
    from servebook.models.tiny import make_tiny_model

    good = tmp_path / "root" / "good"
    make_tiny_model(good)
    deep = tmp_path / "root" / "deep"
    shutil.copytree(good, deep)
    (deep / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    r = bounded_cli(
        "probe", "--find", str(tmp_path / "root"), "--mountinfo", str(MOUNTINFO), "--json"
    )
    assert "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    by_path = {c["path"]: c for c in doc["candidates"]}
    assert by_path[str(good)]["complete"] is True
    assert by_path[str(deep)]["complete"] is False
    assert "nested deeper than 100 levels" in by_path[str(deep)]["summary"] + json.dumps(
        doc["findings"]
    )


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "latin1", "deep-json"])
def test_bench_resume_refuses_a_hostile_results_file(
    bounded_cli: Cli, hostile: Hostile, tiny_dir: Path, kind: str
) -> None:
    bad = hostile(kind, "results.json")
    app = web.Application()
    app.router.add_get("/v1/models", served_models("tiny", max_model_len=2048))
    with served(app) as url:
        r = bounded_cli(
            "bench", "--url", url, "--model", "tiny", "--tokenizer", str(tiny_dir),
            "--concurrency", "1", "--input-len", "8", "--output-len", "4",
            "-o", str(bad.parent), "--resume",
        )  # fmt: skip
    refused(r, kind, bad)


@pytest.mark.parametrize("kind", ["latin1", "deep-json"])
def test_report_and_compare_refuse_a_hostile_results_file(
    bounded_cli: Cli, hostile: Hostile, kind: str, tmp_path: Path
) -> None:
    bad = hostile(kind, "results.json")
    refused(bounded_cli("report", str(bad.parent), "-o", str(tmp_path / "r.html")), kind, bad)
    refused(bounded_cli("compare", str(bad.parent), str(RESULTS)), kind, bad)


def test_a_kubeconfig_fifo_is_refused_not_read(bounded_cli: Cli, hostile: Hostile) -> None:
    bad = hostile("fifo", "kubeconfig")
    refused(bounded_cli("status", "--kubeconfig", str(bad)), "fifo", bad)


def test_preflight_refuses_a_deep_weights_index(
    bounded_cli: Cli, hostile: Hostile, tmp_path: Path
) -> None:
    bad = hostile("deep-json", "model.safetensors.index.json")
    sets = [a for s in PD_SETS for a in ("--set", s)]
    snap = str(PREFLIGHT / "healthy.json")
    r = bounded_cli("preflight", "vllm-pd", "--snapshot", snap, "--weights", str(bad), *sets)
    refused(r, "deep-json", bad)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_bench_refuses_a_hostile_dataset_before_any_load(
    bounded_cli: Cli, hostile: Hostile, tmp_path: Path, kind: str
) -> None:
    bad = hostile(kind, "prompts.jsonl")
    out = tmp_path / "out"
    r = bounded_cli(
        "bench", "--url", "http://127.0.0.1:9", "--model", "tiny",
        "--dataset", str(bad), "-o", str(out),
    )  # fmt: skip
    refused(r, kind, bad)
    assert not out.exists()
