"""The engine command line `servebook render` writes is one vLLM's own argument parser
accepts, with the values servebook meant (no server is started: parsing only).  A flag
vLLM renamed or a JSON value it cannot read would otherwise surface only after the image
pull and a weight load on the cluster."""

from __future__ import annotations

from typing import Any

import pytest

from servebook.commands.render import render_files

pytestmark = pytest.mark.engine

PD = [
    "image=vllm/vllm-openai:v0.11.0",
    "fabric=ib-shared",
    "prefill_node=gpu-node-1",
    "decode_node=gpu-node-2",
    "prefill_model_dir=/data/models/m",
    "decode_model_dir=/mnt/nvme/m",
]


def _parser() -> Any:
    pytest.importorskip("vllm")
    import importlib

    try:  # the module moved between vLLM releases
        mod = importlib.import_module("vllm.entrypoints.launchers.cli_args")
    except ImportError:
        mod = importlib.import_module("vllm.entrypoints.openai.cli_args")
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return mod.make_arg_parser(FlexibleArgumentParser())


@pytest.mark.parametrize(
    ("recipe", "sets"),
    [
        (
            "vllm-pd-spec",
            [*PD, "spec_method=eagle3", "prefill_draft_dir=/a", "decode_draft_dir=/b"],
        ),
        ("vllm-pd", [*PD, "kv_connector=MooncakeConnector", "max_model_len=8192"]),
    ],
)
def test_rendered_engine_arguments_parse_with_vllm(recipe: str, sets: list[str]) -> None:
    parser = _parser()
    _, objects, _ = render_files(recipe, sets)
    engines = [
        o["spec"]["template"]["spec"]["containers"][0]
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"].endswith(("prefill", "decode"))
    ]
    assert len(engines) == 2
    for c in engines:
        assert c["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
        ns = parser.parse_args(c["args"])
        assert (ns.model, ns.host, ns.port, ns.tensor_parallel_size) == (
            "/models/model",
            "0.0.0.0",
            8000,
            8,
        )
        assert ns.kv_transfer_config.kv_role == "kv_both"
        if recipe == "vllm-pd-spec":
            assert ns.speculative_config == {
                "method": "eagle3",
                "model": "/models/draft",
                "num_speculative_tokens": 3,
            }
        else:
            assert ns.kv_transfer_config.kv_connector == "MooncakeConnector"
            assert ns.max_model_len == 8192
            assert ns.speculative_config is None


def test_a_role_spanning_two_nodes_gives_leader_and_worker_arguments_vllm_accepts() -> None:
    """vllm-pd-wide-ep (two nodes per role): the LeaderWorkerSet's leader and its headless
    worker carry the multi-node data-parallel flags, which vLLM's parser reads as meant."""
    from pathlib import Path

    values = Path(__file__).parents[1] / "unit" / "fixtures" / "render" / "vllm-pd-wide-ep"
    parser = _parser()
    _, objects, _ = render_files("vllm-pd-wide-ep", [], [values / "values.yaml"])
    sets = [o for o in objects if o["kind"] == "LeaderWorkerSet"]
    assert len(sets) == 2  # prefill and decode each span two nodes
    for lws in sets:
        tmpl = lws["spec"]["leaderWorkerTemplate"]
        leader = parser.parse_args(tmpl["leaderTemplate"]["spec"]["containers"][0]["args"])
        worker = parser.parse_args(tmpl["workerTemplate"]["spec"]["containers"][0]["args"])
        for ns in (leader, worker):
            assert ns.data_parallel_address == "$(LWS_LEADER_ADDRESS)"
            assert ns.data_parallel_size == 2 * ns.data_parallel_size_local
        assert not leader.headless and worker.headless
        assert worker.data_parallel_start_rank == leader.data_parallel_size_local
