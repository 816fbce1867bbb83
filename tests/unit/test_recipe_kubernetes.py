"""What the recipe layer adds for Kubernetes: optional parameters, where each value came
from, every bad parameter named at once, node paths mounted at container paths, and errors
about recipe keys that name the parameter the user actually set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servebook.errors import UsageError
from servebook.recipe.resolve import resolve
from servebook.recipe.source import catalog_names

RECIPE = """\
name: opt
description: a test recipe
backends: [kubernetes]
topology: mixed
parameters:
  node: {type: node, description: The node.}
  model_dir: {type: path, description: Weights on the node.}
  draft_dir: {type: path, optional: true, description: Draft weights on the node.}
  rdma: {type: str, optional: true, description: RDMA resource.}
  method: {type: choice, choices: [eagle3, ngram], description: Method., default: ngram}
model:
  path: ${model_dir}
  container_path: /models/model
  served_name: m
speculative:
  method: ${method}
  model: ${draft_dir}
  container_path: /models/draft
  num_speculative_tokens: 2
roles:
  mixed:
    resources: {gpus: 1, rdma_resource: "${rdma}"}
    placement: {node: "${node}"}
"""


def _write(tmp_path: Path, text: str = RECIPE) -> str:
    p = tmp_path / "r.yaml"
    p.write_text(text)
    return str(p)


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_gpu_recipes_are_in_the_catalog() -> None:
    assert {"vllm-mixed", "vllm-mixed-spec", "vllm-pd", "vllm-pd-spec"} <= set(catalog_names())


def test_unset_optional_parameter_leaves_its_key_out(tmp_path: Path) -> None:
    plan = resolve(_write(tmp_path), ["node=n1", "model_dir=/data/m"])
    role = plan.role("mixed")
    assert role.resources.rdma_resource is None
    assert role.draft_path is None and role.draft_container_path is None
    assert json.loads(_flag(role.args, "--speculative-config")) == {
        "method": "ngram",
        "num_speculative_tokens": 2,
    }
    assert plan.params["rdma"] is None
    assert plan.param_origins["rdma"] == "unset (optional)"


def test_optional_parameter_set_empty_is_unset(tmp_path: Path) -> None:
    plan = resolve(_write(tmp_path), ["node=n1", "model_dir=/data/m", "rdma="])
    assert plan.role("mixed").resources.rdma_resource is None
    assert plan.param_origins["rdma"] == "--set rdma"


def test_engine_is_given_the_container_path_and_the_plan_keeps_the_node_path(
    tmp_path: Path,
) -> None:
    plan = resolve(
        _write(tmp_path), ["node=n1", "model_dir=/data/m", "method=eagle3", "draft_dir=/data/d"]
    )
    role = plan.role("mixed")
    assert (role.model_path, role.model_container_path) == ("/data/m", "/models/model")
    assert (role.draft_path, role.draft_container_path) == ("/data/d", "/models/draft")
    assert _flag(role.args, "--model") == "/models/model"
    assert json.loads(_flag(role.args, "--speculative-config"))["model"] == "/models/draft"


def test_origins_say_default_values_file_or_set(tmp_path: Path) -> None:
    vf = tmp_path / "values.yaml"
    vf.write_text("node: n1\nmodel_dir: /data/m\n")
    plan = resolve(_write(tmp_path), ["node=n2"], [vf])
    assert plan.param_origins["node"] == "--set node"
    assert plan.param_origins["model_dir"] == f"values file {vf}"
    assert plan.param_origins["method"] == "the recipe's default"


def test_optional_parameter_inside_a_larger_value_is_refused_while_unset(
    tmp_path: Path,
) -> None:
    text = RECIPE.replace("served_name: m", "served_name: m-${rdma}")
    with pytest.raises(UsageError, match=r"optional parameter 'rdma' is unset but used inside"):
        resolve(_write(tmp_path, text), ["node=n1", "model_dir=/data/m"])


def test_every_invalid_parameter_is_named_with_the_missing_ones(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        resolve(_write(tmp_path), ["node=<NODE>", "method=medusa"])
    msg = str(e.value)
    assert "parameter 'node'" in msg and "parameter 'method'" in msg
    assert "  model_dir (path)" in msg


def test_relative_node_path_for_a_mounted_directory_names_its_parameter(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"model.path = 'data/m' is mounted.*'model_dir'"):
        resolve(_write(tmp_path), ["node=n1", "model_dir=data/m"])


def test_schema_error_names_the_parameter_behind_the_key(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        resolve(_write(tmp_path), ["node=n1", "model_dir=/data/m", "rdma=has space/x"])
    msg = str(e.value)
    assert "roles.mixed.resources.rdma_resource" in msg
    assert "Set by parameter 'rdma'" in msg
    assert "[" not in msg  # words, not a regex a terminal would mangle


def test_tiny_recipes_keep_node_paths_as_engine_paths(sb_home: Path) -> None:
    # The local backend runs the engine on this machine: no container, no mount.
    plan = resolve("tiny-pd-spec")
    for role in plan.engine_roles:
        assert role.model_container_path is None
        assert _flag(role.args, "--model") == role.model_path
        cfg = json.loads(_flag(role.args, "--speculative-config"))
        assert cfg["model"] == role.draft_path
