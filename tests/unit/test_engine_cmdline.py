from __future__ import annotations

from servebook.engines.cmdline import parse_argv, parse_container, split_shell


def test_vllm_serve_takes_the_model_as_first_positional() -> None:
    cmd = parse_container(
        {
            "command": ["vllm", "serve"],
            "args": ["/models/llama", "--port", "8000", "--enforce-eager"],
        }
    )
    assert cmd is not None
    assert cmd.entrypoint == "vllm serve"
    assert cmd.model == "/models/llama"
    assert cmd.value("--port") == "8000"
    assert cmd.has("--enforce-eager") and cmd.value("--enforce-eager") is None


def test_boolean_flag_does_not_swallow_the_model_after_it() -> None:
    cmd = parse_argv(["vllm", "serve", "--trust-remote-code", "/models/kimi", "--dtype", "auto"])
    assert cmd is not None
    assert cmd.model == "/models/kimi"
    assert cmd.value("--dtype") == "auto"


def test_api_server_module_reads_model_from_flag_only() -> None:
    cmd = parse_argv(
        ["python3", "-u", "-m", "vllm.entrypoints.openai.api_server", "--model=/m", "extra"]
    )
    assert cmd is not None
    assert cmd.entrypoint == "python -m vllm.entrypoints.openai.api_server"
    assert cmd.model == "/m"
    assert cmd.positional_model is None


def test_equals_and_space_forms_and_aliases_normalize_to_one_name() -> None:
    cmd = parse_argv(
        ["vllm", "serve", "m", "--tensor_parallel_size=2", "-tp", "4", "--max-model-len", "8"]
    )
    assert cmd is not None
    assert cmd.value("--tensor-parallel-size") == "4"  # argparse: the last one wins
    assert set(cmd.duplicates()) == {"--tensor-parallel-size"}


def test_no_prefix_is_the_same_setting_as_the_flag() -> None:
    cmd = parse_argv(
        ["vllm", "serve", "m", "--enable-prefix-caching", "--no-enable-prefix-caching"]
    )
    assert cmd is not None
    assert list(cmd.duplicates()) == ["--enable-prefix-caching"]


def test_positional_model_and_model_flag_are_a_duplicate() -> None:
    cmd = parse_argv(["vllm", "serve", "a/b", "--model", "c/d"])
    assert cmd is not None
    dups = cmd.duplicates()
    assert [f.value for f in dups["--model"]] == ["a/b", "c/d"]


def test_repeatable_and_multi_value_flags_are_not_duplicates() -> None:
    cmd = parse_argv(
        ["vllm", "serve", "m", "--middleware", "a.B", "--middleware", "c.D",
         "--served-model-name", "x", "y", "--port", "1"]
    )  # fmt: skip
    assert cmd is not None
    assert cmd.duplicates() == {}
    assert cmd.served_model_names == ("x", "y")
    assert cmd.value("--port") == "1"


def test_json_flags_parse_and_dotted_keys_merge() -> None:
    cmd = parse_argv(
        [
            "vllm", "serve", "m",
            "--kv-transfer-config", '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}',
            "--kv-transfer-config.kv_role", "kv_consumer",
            "--kv-transfer-config.kv_connector_extra_config.backends", '["UCX"]',
        ]
    )  # fmt: skip
    assert cmd is not None
    config, err = cmd.json_value("--kv-transfer-config")
    assert err is None
    assert config == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"backends": ["UCX"]},
    }
    assert cmd.duplicates() == {}


def test_invalid_json_is_reported_not_guessed() -> None:
    cmd = parse_argv(["vllm", "serve", "m", "--speculative-config", "{method: ngram}"])
    assert cmd is not None
    config, err = cmd.json_value("--speculative-config")
    assert config is None
    assert err is not None and "not valid JSON" in err


def test_shell_script_with_continuations_redirects_and_several_commands() -> None:
    script = (
        "set -e\n"
        "ray start --head --port=6379 2>&1 | tee /tmp/ray.log\n"
        "exec env FOO=1 vllm serve /models/llama \\\n"
        "  --tensor-parallel-size 8 \\\n"
        '  --speculative-config \'{"method": "ngram", "num_speculative_tokens": 3}\' \\\n'
        "  -tp 4 > /tmp/vllm.log 2>&1 &\n"
        "wait\n"
    )
    cmd = parse_container({"command": ["/bin/bash", "-ec"], "args": [script]})
    assert cmd is not None and cmd.via_shell
    assert cmd.model == "/models/llama"
    assert [f.value for f in cmd.duplicates()["--tensor-parallel-size"]] == ["8", "4"]
    spec, err = cmd.json_value("--speculative-config")
    assert err is None and spec == {"method": "ngram", "num_speculative_tokens": 3}


def test_split_shell_drops_redirections_but_keeps_arguments_before_them() -> None:
    assert split_shell("vllm serve m --port 8 > log 2>&1; echo done") == [
        ["vllm", "serve", "m", "--port", "8"],
        ["echo", "done"],
    ]


def test_args_only_in_a_vllm_image_are_engine_arguments() -> None:
    cmd = parse_container(
        {"image": "vllm/vllm-openai:v0.11.0", "args": ["--model", "Qwen/Qwen3-8B", "-O3"]}
    )
    assert cmd is not None
    assert cmd.entrypoint == "image entrypoint"
    assert cmd.model == "Qwen/Qwen3-8B"
    assert cmd.value("--compilation-config") == "3"


def test_non_engine_containers_are_not_engines() -> None:
    assert parse_container({"image": "busybox", "command": ["sh", "-c", "ls /models"]}) is None
    assert parse_container({"image": "ghcr.io/llm-d/routing-sidecar", "args": ["--port=8"]}) is None
    assert parse_container({"image": "vllm/vllm-openai:v0.11.0"}) is None


def test_dynamo_worker_module_is_an_engine() -> None:
    cmd = parse_container(
        {
            "command": ["/bin/sh", "-c"],
            "args": ["python3 -m dynamo.vllm --model m --is-prefill-worker 2>&1 | tee log"],
        }
    )
    assert cmd is not None
    assert cmd.model == "m"
    assert cmd.has("--is-prefill-worker")


def test_unquoted_json_in_yaml_is_read_as_the_json_it_meant() -> None:
    cmd = parse_container(
        {
            "command": ["vllm", "serve", "m"],
            "args": ["--kv-transfer-config", {"kv_role": "kv_both"}],
        }
    )
    assert cmd is not None
    assert cmd.json_value("--kv-transfer-config") == ({"kv_role": "kv_both"}, None)


def test_the_vllm_helpers_read_every_spelling_through_the_one_parser() -> None:
    from servebook.engines import vllm

    assert vllm.parallel_size(["-tp=2", "--pipeline_parallel_size", "2", "-dp", "3"]) == 12
    assert vllm.parallel_size(["--enforce-eager"]) == 1
    assert vllm.kv_connector_of(["--kv-transfer-config.kv_connector", "NixlConnector"]) == (
        "NixlConnector"
    )
    assert vllm.kv_connector_of(['--kv-transfer-config={"kv_connector":"X"}']) == "X"
    assert vllm.kv_connector_of(["--kv-transfer-config", "{not json"]) is None
    assert vllm.flag_value(
        ["--max_model_len", "512", "--max-model-len=1024"], "--max-model-len"
    ) == ("1024")
    assert vllm.duplicate_flags(["-q", "fp8", "--quantization", "awq"]) == ["--quantization"]
