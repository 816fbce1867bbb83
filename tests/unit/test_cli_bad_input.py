"""Bad input: exit 2, one clear message naming the thing and the fix, nothing started or
written.  Each case runs the real CLI in a subprocess."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult
from tests.unit.engine_standin import vllm_package

Cli = Callable[..., CliResult]


def _no_state(home: Path) -> None:
    deployments = home / "deployments"
    assert not deployments.exists() or not any(deployments.rglob("state.json"))


def test_malformed_yaml_names_file_and_line(cli: Cli, tmp_path: Path, sb_home: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nroles:\n  mixed: [unclosed\n")
    r = cli("up", str(bad))
    assert r.returncode == 2
    assert f"{bad}: line" in r.stderr and "malformed YAML" in r.stderr
    _no_state(sb_home)


def test_unknown_recipe_name_lists_builtins(cli: Cli, sb_home: Path) -> None:
    r = cli("up", "tiny-pdd")
    assert r.returncode == 2
    assert "unknown recipe 'tiny-pdd'" in r.stderr
    assert "tiny-pd" in r.stderr and "servebook recipes" in r.stderr
    _no_state(sb_home)


def test_unknown_key_is_an_error_not_ignored(cli: Cli, tmp_path: Path, sb_home: Path) -> None:
    from servebook.recipe.resolve import load_source

    text = load_source("tiny-mixed").data
    import yaml

    text["roles"]["mixed"]["enviroment"] = {"A": "1"}
    p = tmp_path / "typo.yaml"
    p.write_text(yaml.safe_dump(text))
    r = cli("up", str(p))
    assert r.returncode == 2
    assert "roles.mixed.enviroment: unknown key" in r.stderr
    _no_state(sb_home)


def test_wrong_type_names_the_key(cli: Cli, tmp_path: Path) -> None:
    p = tmp_path / "type.yaml"
    p.write_text(
        "name: t\ndescription: d\nbackends: [local]\ntopology: mixed\n"
        "model: {path: /m, served_name: m, max_model_len: lots}\nroles: {mixed: {}}\n"
    )
    r = cli("recipes", "show", str(p))
    assert r.returncode == 2
    assert "model.max_model_len" in r.stderr and "valid integer" in r.stderr


def test_unresolved_parameter_names_it_and_how_to_supply(cli: Cli, tmp_path: Path) -> None:
    p = tmp_path / "param.yaml"
    p.write_text(
        "name: t\ndescription: d\nbackends: [local]\ntopology: mixed\n"
        "parameters:\n  model_dir: {type: path, description: Where the weights are.}\n"
        "model: {path: '${model_dir}', served_name: m}\nroles: {mixed: {}}\n"
    )
    r = cli("up", str(p))
    assert r.returncode == 2
    assert "model_dir (path)" in r.stderr
    assert "Used at: model.path" in r.stderr
    assert "--set model_dir=VALUE" in r.stderr


def test_wrong_parameter_value_type(cli: Cli) -> None:
    r = cli("recipes", "show", "tiny-pd-spec", "--set", "num_speculative_tokens=three")
    assert r.returncode == 2
    assert "'num_speculative_tokens' = 'three'" in r.stderr and "integer" in r.stderr


def test_port_already_taken(cli: Cli, sb_home: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = cli("up", "tiny-mixed", "--port", str(port), env=vllm_package(tmp_path / "vllm"))
    assert r.returncode == 2
    assert f"port {port} on 127.0.0.1 is already taken" in r.stderr
    _no_state(sb_home)
    assert not (sb_home / "models").exists()  # nothing generated either


def test_vllm_not_installed(cli: Cli, sb_home: Path) -> None:
    # sys.modules[name] = None is the import system's own "this module is absent".
    r = cli("up", "tiny-mixed", hide=["vllm"])
    assert r.returncode == 2
    assert "vLLM is not installed" in r.stderr and "scripts/setup.sh" in r.stderr
    _no_state(sb_home)


@pytest.mark.parametrize("recipe", ["tiny-mixed", "tiny-pd"])
def test_missing_model_directory_is_reported_not_created(
    cli: Cli, tmp_path: Path, sb_home: Path, recipe: str
) -> None:
    missing = tmp_path / "no-such-model"
    # A stand-in vLLM and vllm-router (tiny-pd's entry point): up checks for both before it
    # reads the model directory, and neither runs.
    env = vllm_package(tmp_path / "vllm")
    router = tmp_path / "bin" / "vllm-router"
    router.parent.mkdir()
    router.write_text("#!/bin/sh\nexit 1\n")
    router.chmod(0o755)
    env["PATH"] = f"{router.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    r = cli("up", recipe, "--set", f"model_dir={missing}", env=env)
    assert r.returncode == 2
    assert f"model directory {missing}" in r.stderr and "does not exist" in r.stderr
    assert not missing.exists()
    _no_state(sb_home)


def test_set_without_equals(cli: Cli) -> None:
    r = cli("recipes", "show", "tiny-pd", "--set", "model_dir")
    assert r.returncode == 2
    assert "expected NAME=VALUE" in r.stderr


def test_down_with_nothing_up_is_a_noop(cli: Cli) -> None:
    r = cli("down", "tiny-pd")
    assert r.returncode == 0
    assert "nothing to stop" in r.stdout


def test_status_of_unknown_deployment_exits_2(cli: Cli) -> None:
    r = cli("status", "nope")
    assert r.returncode == 2
    assert "no deployment named 'nope'" in r.stderr
