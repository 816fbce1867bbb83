"""SB262: do the model's weights fit the GPUs they are split across?  Pure arithmetic over
what preflight already has.

* The weights' bytes: from the node probe (its SB204 finding counts the bytes of the weight
  files in the model directory, and of the draft's), else from ``--weights``: a local copy
  of the model directory or its ``model.safetensors.index.json`` (``metadata.total_size``,
  the tensors' bytes), or a size such as ``640Gi``.
* Each GPU's memory: feature discovery's ``nvidia.com/gpu.memory`` label on the target node
  (MiB; under MIG strategy ``single`` it is the slice's, which is what a Pod gets).
* How many GPUs share them: the role's ``--tensor-parallel-size`` times
  ``--pipeline-parallel-size`` (with ``--enable-expert-parallel`` and
  ``--data-parallel-size``, the experts are split across the data-parallel ranks too, so
  the data-parallel size counts as well: an estimate, the attention weights are copied).

vLLM takes ``--gpu-memory-utilization`` (0.9 unless set) of each GPU and keeps what the
weights leave of it for activations and the KV cache.  The finding states every number it
used, so a reader can redo the sum.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servebook import inputs
from servebook.engines.vllm import flag_value
from servebook.errors import UsageError
from servebook.findings import Finding, Severity, register_once
from servebook.kube.objects import BadObject, parse_quantity
from servebook.preflight.cluster import GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL
from servebook.preflight.nodes import resolve_node
from servebook.preflight.requirements import NodeAsk

Obj = Mapping[str, Any]

WEIGHTS_FIT = register_once(
    "SB262",
    "Model weights fit the GPUs they are split across",
    "vLLM loads every weight into GPU memory before it serves: weights larger than the "
    "GPUs' share (memory times --gpu-memory-utilization, over the tensor- and "
    "pipeline-parallel size) fail the load with CUDA out of memory after minutes of "
    "reading, and weights that barely fit leave no room for the KV cache, so the engine "
    "refuses to start or serves a handful of sequences at a time.",
    "Split the model over more GPUs (a larger --tensor-parallel-size, or pipeline "
    "parallelism across nodes), use nodes with larger GPUs, or a quantized checkpoint "
    "(FP8 halves BF16's bytes).",
)

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# Less than this share of a GPU left after the weights: too little KV cache to serve.
KV_MARGIN = 0.10
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class WeightsSize:
    bytes: int
    source: str  # where the number came from, for the finding


@dataclass(frozen=True)
class Parallelism:
    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    expert: bool = False
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION

    @property
    def shards(self) -> int:
        """How many GPUs one copy of the weights is split across."""
        n = self.tensor * self.pipeline
        return n * self.data if self.expert else n

    def text(self) -> str:
        parts = [f"TP {self.tensor}"]
        if self.pipeline > 1:
            parts.append(f"PP {self.pipeline}")
        if self.expert and self.data > 1:
            parts.append(f"DP {self.data} with expert parallel")
        return " x ".join(parts)


def _positive_int(value: str | None, default: int) -> int:
    try:
        n = int(value) if value is not None else default
    except ValueError:
        return default
    return n if n > 0 else default


def parallelism(args: Sequence[str]) -> Parallelism:
    """The engine arguments' parallel sizes (vLLM's long and short spellings)."""
    util = flag_value(args, "--gpu-memory-utilization")
    try:
        fraction = float(util) if util is not None else DEFAULT_GPU_MEMORY_UTILIZATION
    except ValueError:
        fraction = DEFAULT_GPU_MEMORY_UTILIZATION
    return Parallelism(
        tensor=_positive_int(flag_value(args, "--tensor-parallel-size"), 1),
        pipeline=_positive_int(flag_value(args, "--pipeline-parallel-size"), 1),
        data=_positive_int(flag_value(args, "--data-parallel-size"), 1),
        expert="--enable-expert-parallel" in args or "-ep" in args,
        gpu_memory_utilization=fraction if 0 < fraction <= 1 else DEFAULT_GPU_MEMORY_UTILIZATION,
    )


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}


def parse_size(text: str) -> int | None:
    """``640Gi``, ``1.03TB``, ``688G``, ``123456`` as bytes; None if it is not a size."""
    m = _SIZE.match(text)
    if not m:
        return None
    number, unit = float(m.group(1)), (m.group(2) or "").upper().rstrip("B")
    if unit.endswith("I"):
        return int(number * 2 ** (10 * "KMGTP".index(unit[0]) + 10))
    return int(number * _UNITS[unit])


def weights_size(source: str) -> WeightsSize:
    """``--weights``: a size, a model directory (its safetensors index's total_size, else
    its *.safetensors files' sizes), or an index file.  ``UsageError`` when unusable."""
    size = parse_size(source)
    if size is not None:
        return WeightsSize(size, f"--weights {source}")
    path = Path(source).expanduser()
    if path.is_dir():
        index = path / INDEX_NAME
        if index.is_file():
            return _from_index(index)
        shards = sorted(path.glob("*.safetensors"))
        if not shards:
            raise UsageError(
                f"--weights {source}: no {INDEX_NAME} and no *.safetensors files in it; give "
                "the model directory, its index, or a size such as 640Gi."
            )
        total = sum(p.stat().st_size for p in shards)
        return WeightsSize(total, f"{len(shards)} safetensors file(s) in {path}")
    if path.is_file():
        return _from_index(path)
    raise UsageError(
        f"--weights {source}: neither a size (e.g. 640Gi, 1.03TB) nor an existing directory "
        "or index file."
    )


def _from_index(path: Path) -> WeightsSize:
    doc = inputs.load_json(path, "safetensors index")
    total = (doc.get("metadata") or {}).get("total_size") if isinstance(doc, dict) else None
    if not isinstance(total, int | float) or isinstance(total, bool) or total <= 0:
        raise UsageError(
            f"{path}: no metadata.total_size (the tensors' bytes); give the model directory "
            "or a size such as 640Gi instead."
        )
    return WeightsSize(int(total), f"{path.name} metadata.total_size")


def size_from_probe(findings: Sequence[Finding], node: str) -> WeightsSize | None:
    """The bytes of the weight files the probe on ``node`` found (model and draft), from
    its passing SB204 findings; None when it found none."""
    total = 0
    files = 0
    for f in findings:
        if f.check == "SB204" and f.severity is Severity.PASS and f.subject.startswith(node + ":"):
            n = f.evidence.get("bytes")
            if isinstance(n, int) and not isinstance(n, bool):
                total += n
                files += len(f.evidence.get("files") or ())
    if not total:
        return None
    return WeightsSize(total, f"the probe on node {node} ({files} weight file(s))")


@dataclass(frozen=True)
class RoleWeights:
    """What one engine role loads, and where: ``ask`` is the node's ask (how its Pods
    select the node), ``size`` None when unknown."""

    role: str
    ask: NodeAsk
    gpus: int
    parallel: Parallelism
    size: WeightsSize | None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_weights_fit(nodes: Mapping[str, Obj], rw: RoleWeights) -> Finding:
    subject = f"role/{rw.role}"
    node, _ = resolve_node(nodes, rw.ask)
    if rw.size is None:
        return WEIGHTS_FIT.finding(
            Severity.INFO,
            subject,
            f"not checked for role {rw.role}: the weights' size is unknown (no probe ran, and "
            "no --weights was given)",
            hint="Pass --weights with the model directory, its model.safetensors.index.json, "
            "or a size such as 640Gi; a live preflight reads it from the node probe.",
        )
    if node is None:
        return WEIGHTS_FIT.finding(
            Severity.INFO,
            subject,
            f"not checked for role {rw.role}: node {rw.ask.node} is not in the cluster (SB250)",
        )
    name = str((node.get("metadata") or {}).get("name"))
    labels = (node.get("metadata") or {}).get("labels") or {}
    raw = labels.get(GPU_MEMORY_LABEL)
    p = rw.parallel
    evidence: dict[str, Any] = {
        "weights_bytes": rw.size.bytes,
        "weights_source": rw.size.source,
        "node": name,
        "gpu_product": labels.get(GPU_PRODUCT_LABEL),
        "gpu_memory_label": raw,
        "tensor_parallel": p.tensor,
        "pipeline_parallel": p.pipeline,
        "data_parallel": p.data,
        "expert_parallel": p.expert,
        "shards": p.shards,
        "gpu_memory_utilization": p.gpu_memory_utilization,
    }
    try:
        mib = parse_quantity(raw, f"node {name} label {GPU_MEMORY_LABEL}") if raw else None
    except BadObject:
        mib = None
    if not mib:
        return WEIGHTS_FIT.finding(
            Severity.INFO,
            subject,
            f"not checked for role {rw.role}: node {name} has no {GPU_MEMORY_LABEL} label "
            "(NVIDIA GPU feature discovery sets it), so its GPUs' memory is unknown; the "
            f"weights are {_gib(rw.size.bytes)} over {p.shards} GPU(s) ({p.text()})",
            evidence=evidence,
        )
    gpu_bytes = int(mib) * 2**20
    per_gpu = rw.size.bytes / p.shards
    budget = gpu_bytes * p.gpu_memory_utilization
    left = budget - per_gpu
    evidence.update(
        gpu_memory_bytes=gpu_bytes,
        weights_per_gpu_bytes=int(per_gpu),
        left_per_gpu_bytes=int(left),
    )
    approx = " (an estimate: with expert parallelism the attention weights are copied)"
    sums = (
        f"{_gib(rw.size.bytes)} of weights ({rw.size.source}) over {p.shards} GPU(s) "
        f"({p.text()}) is {_gib(per_gpu)} per GPU{approx if p.expert and p.data > 1 else ''}; "
        f"node {name}'s GPUs have {_gib(gpu_bytes)} each ({GPU_MEMORY_LABEL}={raw} MiB"
        + (f", {labels[GPU_PRODUCT_LABEL]}" if labels.get(GPU_PRODUCT_LABEL) else "")
        + f"), of which vLLM uses {p.gpu_memory_utilization:g}: {_gib(budget)}"
    )
    if p.shards > rw.gpus:
        sums += f"; note the role requests {rw.gpus} GPU(s) for {p.shards} shards"
    if left < 0:
        return WEIGHTS_FIT.finding(
            Severity.FAIL,
            subject,
            f"the weights do not fit role {rw.role}'s GPUs: {sums}, {_gib(-left)} short per GPU "
            "before any KV cache",
            hint=WEIGHTS_FIT.fix,
            evidence=evidence,
        )
    margin = gpu_bytes * KV_MARGIN
    if left < margin:
        return WEIGHTS_FIT.finding(
            Severity.WARN,
            subject,
            f"the weights barely fit role {rw.role}'s GPUs: {sums}, leaving {_gib(left)} per "
            f"GPU for activations and the KV cache (under {KV_MARGIN:.0%} of the GPU)",
            hint=WEIGHTS_FIT.fix,
            evidence=evidence,
        )
    return WEIGHTS_FIT.finding(
        Severity.PASS,
        subject,
        f"the weights fit role {rw.role}'s GPUs: {sums}, leaving {_gib(left)} per GPU for "
        "activations and the KV cache",
        evidence=evidence,
    )


def role_weights(
    plan: Any,
    asks: Sequence[NodeAsk],
    sizes: Mapping[str, WeightsSize | None],
) -> list[RoleWeights]:
    """One ``RoleWeights`` per engine role pinned to a node with GPUs; ``sizes`` by role."""
    by_node = {a.node: a for a in asks}
    out = []
    for r in plan.engine_roles:
        # A role on several nodes: the leader's (first listed) node speaks for the group;
        # SB250-SB255 check every listed node.
        nodes = getattr(r.placement, "all_nodes", None) or [r.placement.node]
        node = nodes[0]
        if not node or node not in by_node:
            continue
        gpus = r.resources.gpus
        count = int(gpus) if isinstance(gpus, int) or str(gpus).isdigit() else 0
        if count <= 0:
            continue
        out.append(
            RoleWeights(
                role=r.name,
                ask=by_node[node],
                gpus=count,
                parallel=parallelism(r.cluster_args),
                size=sizes.get(r.name),
            )
        )
    return out


__all__ = [
    "WEIGHTS_FIT",
    "Parallelism",
    "RoleWeights",
    "WeightsSize",
    "check_weights_fit",
    "parallelism",
    "parse_size",
    "role_weights",
    "size_from_probe",
    "weights_size",
]
