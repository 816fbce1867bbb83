"""Recipe resolution: parameters, substitution, validation, and the Plan it yields."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from servebook.errors import UsageError
from servebook.recipe.resolve import resolve
from servebook.recipe.source import catalog_names
from tests.conftest import CliResult

Cli = Callable[..., CliResult]

TINY = ["tiny-mixed", "tiny-mixed-spec", "tiny-pd", "tiny-pd-spec"]


def _write(tmp_path: Path, text: str, name: str = "r.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


MINIMAL = """\
name: mine
description: a test recipe
backends: [kubernetes]
topology: mixed
parameters:
  node:
    type: node
    description: The node that holds the weights.
  gpus:
    type: int
    description: GPUs for the server.
    default: 8
    min: 1
model:
  path: /models/m
  served_name: m
roles:
  mixed:
    engine_args: [--tensor-parallel-size, "${gpus}"]
    placement: {node: "${node}"}
    resources: {gpus: "${gpus}"}
"""


def test_catalog_lists_the_four_tiny_recipes() -> None:
    assert set(TINY) <= set(catalog_names())


@pytest.mark.parametrize("name", TINY)
def test_every_tiny_recipe_resolves_with_defaults(name: str, sb_home: Path) -> None:
    plan = resolve(name)
    assert plan.recipe == name
    for role in plan.engine_roles:
        assert role.model_path == str(sb_home / "models" / "tiny")
        assert "--enforce-eager" in role.args
        assert role.env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_speculative_config_is_identical_on_both_pd_roles(sb_home: Path) -> None:
    plan = resolve("tiny-pd-spec", ["num_speculative_tokens=5"])
    pre = _flag(plan.role("prefill").args, "--speculative-config")
    dec = _flag(plan.role("decode").args, "--speculative-config")
    assert pre is not None and pre == dec
    cfg = json.loads(pre)
    assert cfg == {
        "method": "draft_model",
        "model": str(sb_home / "models" / "tiny-draft"),
        "num_speculative_tokens": 5,
    }


def test_pd_roles_share_the_connector_storage_of_their_deployment(tmp_path: Path) -> None:
    plan = resolve("tiny-pd", state_dir=tmp_path / "dep")
    cfgs = [json.loads(_flag(r.args, "--kv-transfer-config") or "") for r in plan.engine_roles]
    assert cfgs[0] == cfgs[1]
    assert cfgs[0]["kv_connector"] == "ExampleConnector"
    assert cfgs[0]["kv_connector_extra_config"]["shared_storage_path"] == str(
        tmp_path / "dep" / "kv"
    )
    assert plan.kv_storage == [str(tmp_path / "dep" / "kv")]
    assert [r.name for r in plan.roles] == ["prefill", "decode", "router"]


def test_whole_string_reference_keeps_the_parameter_type(tmp_path: Path) -> None:
    plan = resolve(_write(tmp_path, MINIMAL), ["node=gpu-1", "gpus=4"])
    role = plan.role("mixed")
    assert role.resources.gpus == 4
    assert role.placement.node == "gpu-1"
    assert _flag(role.args, "--tensor-parallel-size") == "4"


def test_values_file_is_overridden_by_set(tmp_path: Path) -> None:
    vf = tmp_path / "values.yaml"
    vf.write_text("node: from-file\ngpus: 2\n")
    plan = resolve(_write(tmp_path, MINIMAL), ["gpus=3"], [vf])
    assert plan.role("mixed").placement.node == "from-file"
    assert plan.role("mixed").resources.gpus == 3


def test_unresolved_parameter_is_named_with_where_it_is_used(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        resolve(_write(tmp_path, MINIMAL))
    msg = str(e.value)
    assert "node (node)" in msg
    assert "roles.mixed.placement.node" in msg
    assert "--set node=VALUE" in msg


@pytest.mark.parametrize(
    ("value", "why"),
    [("<NODE>", "placeholder"), ("node_with_trailing-", "label value"), ("a" * 64, "label")],
)
def test_invalid_node_value_is_refused(tmp_path: Path, value: str, why: str) -> None:
    with pytest.raises(UsageError) as e:
        resolve(_write(tmp_path, MINIMAL), [f"node={value}"])
    assert "parameter 'node'" in str(e.value)
    assert why in str(e.value)


def test_int_parameter_bounds(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"'gpus' = '0'.*must be >= 1"):
        resolve(_write(tmp_path, MINIMAL), ["node=n1", "gpus=0"])
    with pytest.raises(UsageError, match="expected an integer"):
        resolve(_write(tmp_path, MINIMAL), ["node=n1", "gpus=eight"])


def test_unknown_set_key_lists_the_declared_parameters(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"no parameter named 'gpu'.*gpus, node"):
        resolve(_write(tmp_path, MINIMAL), ["gpu=1", "node=n"])


def test_reference_to_an_undeclared_parameter_is_an_error(tmp_path: Path) -> None:
    text = MINIMAL.replace("path: /models/m", "path: ${model_dir}")
    with pytest.raises(UsageError, match=r"'\$\{model_dir\}' used at model.path"):
        resolve(_write(tmp_path, text), ["node=n"])


def test_speculative_flag_in_role_engine_args_is_refused(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        'engine_args: [--tensor-parallel-size, "${gpus}"]',
        'engine_args: [\'--speculative-config={"method":"ngram"}\']',
    )
    with pytest.raises(UsageError, match=r"roles.mixed.engine_args sets --speculative-config"):
        resolve(_write(tmp_path, text), ["node=n"])


def test_duplicate_engine_flag_is_refused(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        'engine_args: [--tensor-parallel-size, "${gpus}"]',
        "engine_args: [--dtype, bfloat16, --enforce-eager, --dtype=float16]",
    )
    with pytest.raises(UsageError, match=r"gives --dtype more than once"):
        resolve(_write(tmp_path, text), ["node=n"])


@pytest.mark.parametrize(
    ("args", "words"),
    [
        # the same setting spelled two ways: argparse keeps the last, silently
        ("[-tp, '2', --tensor-parallel-size, '4']", "gives --tensor-parallel-size more than"),
        ("[--enable-prefix-caching, --no-enable-prefix-caching]", "--enable-prefix-caching more"),
        # a reserved flag in another spelling is still reserved
        ("[--served_model_name, other]", "sets --served_model_name, which servebook sets from"),
        ("['-sc', '{\"method\":\"ngram\"}']", "sets -sc, which servebook sets from"),
    ],
)
def test_engine_flags_are_read_in_every_spelling_argparse_accepts(
    tmp_path: Path, args: str, words: str
) -> None:
    text = MINIMAL.replace(
        'engine_args: [--tensor-parallel-size, "${gpus}"]', f"engine_args: {args}"
    )
    with pytest.raises(UsageError, match=words):
        resolve(_write(tmp_path, text), ["node=n"])


def test_pd_without_connector_is_refused(tmp_path: Path) -> None:
    text = MINIMAL.replace("topology: mixed", "topology: pd").replace(
        "  mixed:\n", "  prefill: {}\n  decode:\n"
    )
    with pytest.raises(UsageError, match="needs 'kv_connector:'"):
        resolve(_write(tmp_path, text), ["node=n"])


ARGS_PARAM = """\
  extra:
    type: args
    description: More engine flags.
    default: ""
"""


def test_an_args_parameter_splices_into_a_list_and_only_there(tmp_path: Path) -> None:
    spliced = MINIMAL.replace("  gpus:\n", ARGS_PARAM + "  gpus:\n", 1).replace(
        '[--tensor-parallel-size, "${gpus}"]', '[--tensor-parallel-size, "${gpus}", "${extra}"]'
    )
    plan = resolve(_write(tmp_path, spliced), ["node=n", "extra=--a 'b c' --d"])
    args = plan.role("mixed").args
    i = args.index("--a")
    assert args[i : i + 3] == ["--a", "b c", "--d"]
    assert args[i - 2 : i] == ["--tensor-parallel-size", "8"]
    default = resolve(_write(tmp_path, spliced, "d.yaml"), ["node=n"])
    assert "--a" not in default.role("mixed").args
    inside = spliced.replace('"${extra}"]', '"--x=${extra}"]')
    with pytest.raises(UsageError, match="'extra' holds arguments but is used inside"):
        resolve(_write(tmp_path, inside, "i.yaml"), ["node=n", "extra=--a"])


@pytest.mark.parametrize("name", TINY)
def test_tiny_recipes_take_extra_engine_args_after_their_own(name: str, sb_home: Path) -> None:
    """(issue 32, finding 7) A one-flag A/B on the local recipes: every engine role gets
    the flags, after the recipe's own; unset, nothing is added."""
    plan = resolve(name, ["extra_engine_args=--max-num-seqs 8 --block-size 32"])
    for role in plan.engine_roles:
        assert role.args[-7:] == [
            "--dtype",
            "bfloat16",
            "--enforce-eager",
            "--max-num-seqs",
            "8",
            "--block-size",
            "32",
        ], role.name
    assert {r.args[-1] for r in resolve(name).engine_roles} == {"--enforce-eager"}


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("--dtype float32", "roles.mixed.engine_args gives --dtype more than once"),
        ("--served-model-name other", "sets --served-model-name, which servebook sets from"),
        ("--max_model_len 64", "sets --max_model_len, which servebook sets from model.max"),
    ],
)
def test_tiny_extra_engine_args_that_collide_exit_2_naming_the_parameter(
    cli: Cli, value: str, words: str
) -> None:
    """(issue 32, finding 7) Refused where it collides, by the rule the GPU recipes use."""
    r = cli("recipes", "show", "tiny-mixed", "--set", f"extra_engine_args={value}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert words in r.stderr and "Set by parameter 'extra_engine_args'" in r.stderr, r.stderr
