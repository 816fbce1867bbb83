"""KV-transfer fabrics: how a PD deployment's KV cache crosses from prefill to decode.

One table, one profile per fabric.  A profile states everything the Pods need for the
transport it names, so the transport is stated, not implied: the device resource and how
many of it a Pod requests, the Pod annotations that attach secondary networks, the
environment of the transport library (UCX, or libfabric for AWS EFA), the capabilities it
needs, and what the KV connector is told (NIXL's backend, Mooncake's protocol, the KV
buffer device).  Without a profile NIXL silently falls back to TCP when the Pods get no
RDMA device (Dynamo's guide measured TTFT of ~98 s instead of a few hundred ms), and
nothing says so; so PD over TCP is a profile of its own that renders only with an
explicit acknowledgement.  Render, verify and lint read these facts here; the Pod
annotations that attach a profile's secondary networks are Kubernetes' own
(``kube.fabric_networks``).

Sources, read for these profiles (each setting below names the one it follows):

* [dynamo-comm] NVIDIA Dynamo, docs/pages/kubernetes/disagg-communication-guide.md
  (ai-dynamo/dynamo): UCX_TLS for RDMA "rc_x,rc,dc_x,dc,cuda_copy,cuda_ipc"; IPC_LOCK
  "required for RDMA memory pinning"; ``rdma/ib`` from the RDMA device plugin; UCX_LOG_LEVEL
  for diagnosis; "Backend UCX was instantiated" as the sign NIXL runs on UCX; TCP-only
  disaggregation "effectively unusable".
* [dynamo-xprov] NVIDIA Dynamo recipes, the Qwen3-32B 1P1D cross-node family README:
  per provider only the RDMA resource (``vpc.amazonaws.com/efa``, ``rdma/ib`` or
  ``rdma/shared_ib``, or GKE's ``networking.gke.io/interfaces`` annotation instead of a
  resource), the NIXL backend (LIBFABRIC on AWS), and the transport env (AWS:
  FI_PROVIDER=efa, FI_EFA_USE_DEVICE_RDMA=1; IB/RoCE: UCX_TLS, UCX_NET_DEVICES=mlx5_N:1,...)
  differ; IPC_LOCK on every RDMA transport.
* [llm-d-pd] llm-d guides/pd-disaggregation/modelserver/gpu/vllm: ``coreweave``
  (``rdma/ib: 1`` per Pod, a shared InfiniBand device), ``aws`` (``vpc.amazonaws.com/efa``,
  NixlConnector ``kv_connector_extra_config.backends: ["LIBFABRIC"]``, IPC_LOCK), ``gke``
  (RoCE: UCX_IB_ROCE_REACHABILITY_MODE=all), ``base`` (VLLM_NIXL_SIDE_CHANNEL_HOST = the
  Pod IP).
* [vllm-nixl] vLLM's NixlConnector (vllm/distributed/kv_transfer/kv_connector/v1/nixl):
  ``kv_connector_extra_config.backends`` (default ["UCX"]); ``kv_buffer_device`` of
  KVTransferConfig; MooncakeConnector's ``mooncake_protocol`` (default "rdma").
* [multus] Multus CNI / SR-IOV network operator: secondary networks attached with the Pod
  annotation ``k8s.v1.cni.cncf.io/networks`` (a comma list of NetworkAttachmentDefinition
  names; a name may repeat, one interface each), one SR-IOV virtual function per entry.
* [gke-multinet] GKE multi-networking: ``networking.gke.io/default-interface`` and
  ``networking.gke.io/interfaces`` (a JSON list of {"interfaceName","network"}), as on
  A3 Ultra / A4 RoCE nodes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Transport = Literal["rdma", "tcp"]
FabricName = Literal["ib-shared", "ib-sriov", "roce", "efa", "tcp"]

# [dynamo-comm] the RDMA transports plus GPU-memory staging; a UCX_TLS naming GPU memory
# types must include cuda_copy or cuda_ipc for UCX to take GPU buffers at all.
UCX_TLS_RDMA = "rc_x,rc,dc_x,dc,cuda_copy,cuda_ipc"
# TCP, stated: UCX over sockets with GPU memory staged through the host.
UCX_TLS_TCP = "tcp,cuda_copy"
# [dynamo-comm] "info" logs the transports each UCX endpoint uses: how verify reads, from
# the engine log, which transport the KV actually crossed.
UCX_LOG = {"UCX_LOG_LEVEL": "info"}
# The connectors a fabric profile knows how to tell which transport to use.
NIXL_CONNECTORS = frozenset({"NixlConnector", "NixlPullConnector", "NixlPushConnector"})
MOONCAKE_CONNECTORS = frozenset({"MooncakeConnector"})


def ucx_env(tls: str, **extra: str) -> dict[str, str]:
    """UCX's environment: the transports it may use [dynamo-comm], what the fabric adds, and
    the info log verify reads the transport from."""
    return {"UCX_TLS": tls, **extra, **UCX_LOG}


@dataclass(frozen=True)
class Profile:
    """One fabric.  The defaults are what the RDMA fabrics have in common: NIXL over UCX on
    the RDMA transports, Mooncake's rdma protocol, a device per GPU under a name the
    profile does not know, no secondary networks; a profile states where it differs."""

    name: FabricName
    summary: str
    sources: tuple[str, ...]
    transport: Transport = "rdma"
    # The KV connector's transport: NIXL's backend plugin, Mooncake's protocol (None: this
    # fabric has no Mooncake protocol).
    nixl_backend: Literal["UCX", "LIBFABRIC"] = "UCX"
    mooncake_protocol: str | None = "rdma"
    # The device resource a Pod requests by default (None: none, or the cluster's name for
    # it must be given), and whether a Pod requests one per GPU (SR-IOV functions, EFA
    # interfaces) or one in all (a shared device that exposes every HCA).
    default_resource: str | None = None
    resource_required: bool = False
    per_gpu: bool = True
    env: Mapping[str, str] = field(default_factory=lambda: ucx_env(UCX_TLS_RDMA))
    # Secondary networks: none, Multus only, or Multus or GKE (by the networking setting).
    networks: Literal["none", "multus", "multus-or-gke"] = "none"

    @property
    def capabilities(self) -> tuple[str, ...]:
        """IPC_LOCK on every RDMA transport, to pin memory for RDMA ([dynamo-comm],
        [dynamo-xprov], [llm-d-pd aws]); none over TCP."""
        return ("IPC_LOCK",) if self.transport == "rdma" else ()


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="ib-shared",
            summary="InfiniBand through a shared RDMA device plugin: one device per Pod "
            "exposes every HCA of the node",
            # [llm-d-pd coreweave] rdma/ib: "1"; [dynamo-comm] rdma/ib from the device plugin.
            default_resource="rdma/ib",
            per_gpu=False,
            sources=("dynamo-comm", "llm-d-pd coreweave"),
        ),
        Profile(
            name="ib-sriov",
            summary="InfiniBand through SR-IOV: one virtual function (and one Multus network "
            "attachment) per GPU",
            # The SR-IOV device plugin's resource name is the cluster's own choice
            # (resourcePrefix/resourceName in its config): it must be given.
            resource_required=True,
            networks="multus",  # [multus]
            sources=("dynamo-comm", "dynamo-xprov", "multus"),
        ),
        Profile(
            name="roce",
            summary="RoCE v2 on secondary networks attached by Multus, or by GKE "
            "multi-networking (A3 Ultra, A4)",
            # Multus RoCE usually comes with an RDMA device resource (given when it does);
            # GKE attaches the RDMA NICs through the annotation alone [dynamo-xprov].
            # [llm-d-pd gke] reach RoCE peers on any subnet.
            env=ucx_env(UCX_TLS_RDMA, UCX_IB_ROCE_REACHABILITY_MODE="all"),
            networks="multus-or-gke",  # [multus], [gke-multinet]
            sources=("dynamo-comm", "dynamo-xprov", "llm-d-pd gke", "multus", "gke-multinet"),
        ),
        Profile(
            name="efa",
            summary="AWS Elastic Fabric Adapter through libfabric (NIXL's LIBFABRIC backend)",
            # [llm-d-pd aws] backends ["LIBFABRIC"]; [dynamo-comm] UCX over EFA "not
            # recommended for production".
            nixl_backend="LIBFABRIC",
            mooncake_protocol=None,
            default_resource="vpc.amazonaws.com/efa",  # [llm-d-pd aws], [dynamo-xprov]
            env={
                # [dynamo-xprov] AWS transport env.
                "FI_PROVIDER": "efa",
                "FI_EFA_USE_DEVICE_RDMA": "1",
                # NIXL's libfabric plugin logs "Created N rails using provider=efa" at
                # INFO: how verify reads the transport from the engine log.
                "NIXL_LOG_LEVEL": "INFO",
            },
            sources=("llm-d-pd aws", "dynamo-xprov", "dynamo-comm"),
        ),
        Profile(
            name="tcp",
            transport="tcp",
            summary="TCP sockets, GPU memory staged through the host: works anywhere, far "
            "slower (Dynamo measured TTFT of ~98 s where RDMA took a few hundred ms)",
            mooncake_protocol="tcp",
            per_gpu=False,
            env=ucx_env(UCX_TLS_TCP),  # [dynamo-comm] tcp transport
            sources=("dynamo-comm",),
        ),
    )
}


def profile(name: str) -> Profile:
    return PROFILES[name]


def claimed_transport(fabric: str | None) -> Transport | None:
    """What a deployment on ``fabric`` claims its KV transfer uses (None: no claim)."""
    p = PROFILES.get(fabric or "")
    return p.transport if p else None


def device_count(p: Profile, gpus: int, devices: int | None) -> int:
    """Devices one engine Pod requests: as given, else one per GPU or one in all."""
    if devices is not None:
        return devices
    return max(1, gpus) if p.per_gpu else 1


def connector_config(p: Profile, connector: str) -> dict[str, object] | None:
    """What the KV connector is told so that it uses this fabric: extra-config entries
    (None: this connector cannot be told, e.g. it moves KV through files)."""
    if connector in NIXL_CONNECTORS:
        return {"backends": [p.nixl_backend]}  # [vllm-nixl]
    if connector in MOONCAKE_CONNECTORS and p.mooncake_protocol:
        return {"mooncake_protocol": p.mooncake_protocol}  # [vllm-nixl] Mooncake
    return None


# The KV buffer device: KV stays in GPU memory and the transport reads it there (GPUDirect
# RDMA, or UCX's cuda_copy staging over TCP) [vllm-nixl].
KV_BUFFER_DEVICE = "cuda"


def environment(p: Profile, net_devices: str | None) -> dict[str, str]:
    env = dict(p.env)
    if net_devices and p.nixl_backend == "UCX":
        env["UCX_NET_DEVICES"] = net_devices  # [dynamo-xprov] mlx5_0:1,mlx5_1:1,...
    return env


# What an engine's own settings tell its KV connector about the transport, read the same
# way from a manifest (lint SB112) or a command line and environment.  UCX transports that
# move KV by RDMA (UCX_TLS names; "ib" is UCX's alias for all of them); everything else
# (tcp, shared memory, cuda_copy/cuda_ipc) crosses no node by RDMA, except cuda_ipc with
# UCX_CUDA_IPC_ENABLE_MNNVL: on a multi-node NVLink domain (GB200 NVL72) UCX moves GPU
# buffers between nodes over NVLink (NVIDIA's MNNVL tuning guide, UCX), and the tcp beside
# it only bootstraps the connection (llm-d's wide-EP GB200 guides).
_UCX_RDMA = re.compile(r"^\^?(rc|dc|ud|ib|gga|srd)(_[a-z0-9]+)?$")
_UCX_ON = frozenset({"y", "yes", "1", "on", "true"})


def tcp_told(kv_config: Mapping[str, Any] | None, env: Mapping[str, str]) -> str | None:
    """How an engine is told, explicitly, to move KV over TCP, by its KV transfer config
    and its environment (None: it is not)."""
    extra = (kv_config or {}).get("kv_connector_extra_config") or {}
    if isinstance(extra, Mapping) and str(extra.get("mooncake_protocol", "")).lower() == "tcp":
        return "kv_connector_extra_config.mooncake_protocol tcp"
    provider = (env.get("FI_PROVIDER") or "").lower()
    if provider in ("tcp", "sockets"):
        return f"FI_PROVIDER={provider}"
    tls = env.get("UCX_TLS")
    if tls and not tls.startswith("^"):
        names = [t.strip() for t in tls.split(",") if t.strip()]
        mnnvl = (env.get("UCX_CUDA_IPC_ENABLE_MNNVL") or "").strip().lower() in _UCX_ON
        if mnnvl and "cuda_ipc" in names:
            return None
        if "tcp" in names and not any(_UCX_RDMA.match(t) for t in names) and "all" not in names:
            return f"UCX_TLS={tls}"
    return None
