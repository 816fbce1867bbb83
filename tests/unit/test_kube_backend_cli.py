"""`servebook up|status|down --backend kubernetes` without a usable cluster: every way it
cannot run is exit 2 with a message naming the fix, and nothing is recorded."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from servebook.recipe.resolve import resolve
from tests.conftest import CliResult
from tests.unit.conftest import LOCAL_ONLY_RECIPE

Cli = Callable[..., CliResult]
VALUES = Path(__file__).parent / "fixtures" / "render" / "vllm-pd" / "values.yaml"
MIXED = Path(__file__).parent / "fixtures" / "render" / "vllm-mixed" / "values.yaml"

# A cluster that refuses connections: a real kubeconfig, a server on a closed port.
REFUSING = """\
apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: "t"}
contexts:
- name: c
  context: {cluster: nowhere, user: u}
current-context: c
"""


@pytest.fixture
def refusing(tmp_path: Path) -> dict[str, str]:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(REFUSING)
    return {"KUBECONFIG": str(cfg)}


def test_up_on_an_unreachable_cluster_exits_2_and_records_nothing(
    cli: Cli, sb_home: Path, refusing: dict[str, str]
) -> None:
    r = cli("up", "vllm-pd", "--backend", "kubernetes", "-f", str(VALUES), env=refusing)
    assert r.returncode == 2, r.stderr
    assert "cannot reach the cluster" in r.stderr and "KUBECONFIG" in r.stderr
    assert not (sb_home / "deployments").exists()


def test_up_without_any_kubeconfig_says_so(cli: Cli, tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(tmp_path / "absent"), "KUBERNETES_SERVICE_HOST": ""}
    r = cli("up", "vllm-pd", "--backend", "kubernetes", "-f", str(VALUES), env=env)
    assert r.returncode == 2, r.stderr
    assert "no kubeconfig" in r.stderr and str(tmp_path / "absent") in r.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([LOCAL_ONLY_RECIPE, "--backend", "kubernetes"], "not Kubernetes"),
        (["vllm-pd", "-f", str(VALUES), "--backend", "kubernetes", "--port", "8000"], "--port is"),
        (["vllm-pd", "-f", str(VALUES), "--backend", "nomad"], "choose one of local, kubernetes"),
        (["vllm-mixed", "-f", str(MIXED), "--backend", "local"], "not the local backend"),
    ],
)
def test_a_recipe_or_flag_for_the_other_backend_is_refused(
    cli: Cli, refusing: dict[str, str], args: list[str], words: str
) -> None:
    r = cli("up", *args, env=refusing)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr


def test_a_recorded_kubernetes_deployment_is_found_by_status_down_and_verify(
    cli: Cli, sb_home: Path, refusing: dict[str, str]
) -> None:
    d = sb_home / "deployments" / "moe"
    d.mkdir(parents=True)
    state = {
        "name": "moe",
        "recipe": "vllm-pd",
        "namespace": "moe-pd",
        "created_namespace": True,
        "created": "2026-11-30T10:00:00+00:00",
        "roles": {"prefill": "vllm-pd-prefill"},
    }
    (d / "kube-state.json").write_text(json.dumps(state))
    for args in (["status", "moe"], ["down", "moe"], ["down"], ["status"]):
        r = cli(*args, env=refusing)
        # the only deployment recorded is found without its name too: never "nothing to stop"
        assert r.returncode == 2 and "cannot reach the cluster" in r.stderr, (args, r.stderr)
    assert (d / "kube-state.json").exists(), "down kept the record when it could not delete"
    # verify and bench reach it through the backend contract: without its plan recorded
    # (an older servebook's record), unusable; with it, they ask the cluster.
    for args in (["verify", "moe"], ["bench", "moe", "-o", str(sb_home / "out")]):
        r = cli(*args, env=refusing)
        assert r.returncode == 2 and "up again" in r.stderr, (args, r.stderr)
    state["plan"] = resolve("vllm-pd", [], [VALUES]).model_dump(mode="json")
    (d / "kube-state.json").write_text(json.dumps(state))
    for args in (["verify", "moe"], ["bench", "moe", "-o", str(sb_home / "out")]):
        r = cli(*args, env=refusing)
        assert r.returncode == 2 and "cannot reach the cluster" in r.stderr, (args, r.stderr)
    assert not (sb_home / "out").exists(), "bench wrote results for a deployment it never reached"
