"""SB103 and SB104: hostPath volumes, which hold whatever the node the Pod lands on holds."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator, Mapping
from typing import Any

from servebook.engines.cmdline import EngineCommand, parse_container
from servebook.findings import Finding, Severity, register
from servebook.lint.loader import Document, KeyPath
from servebook.lint.rules.objects import PodSpec, finding_at, lookup, pod_specs
from servebook.lint.rules.registry import DOCUMENT_RULES

HOSTNAME_LABEL = "kubernetes.io/hostname"
# Host paths that exist on every node and are not data: devices, kernel, runtime sockets.
_SYSTEM_PATHS = (
    "/dev",
    "/sys",
    "/proc",
    "/run",
    "/var/run",
    "/var/lib/kubelet",
    "/var/log",
    "/etc",
    "/lib/modules",
    "/usr",
    "/lib",
    "/opt/cni",
    "/var/lib/containerd",
    "/var/lib/docker",
)
_WEIGHTS_WORD = re.compile(
    r"(?i)(?:^|[/_.-])(models?|weights?|checkpoints?|ckpts?|safetensors|huggingface|hf|"
    r"hf[-_]?(?:cache|home|hub)|hub)(?:[/_.-]|$)"
)
_CACHE_WORD = re.compile(r"(?i)(?:cache|huggingface|hf[-_]?home)")
# Directories that fill themselves: caches, compile caches, KV offload tiers, scratch.
_FILLS_ITSELF_WORD = re.compile(
    r"(?i)(?:cache|offload|kvbm|lmcache|jit|compile|triton|inductor|scratch|tmp)"
)
# Environment variables that name such a directory (HF_HOME, HF_HUB_CACHE,
# VLLM_CACHE_ROOT, TRITON_CACHE_DIR, DYN_KVBM_DISK_CACHE_DIR, LMCACHE_LOCAL_DISK, ...).
_CACHE_ENV = re.compile(r"(?i)(?:CACHE|HF_HOME|XDG_.*_HOME|OFFLOAD|LOCAL_DISK|TMPDIR|SCRATCH)")


def _is_system_path(path: str) -> bool:
    p = posixpath.normpath(path) if path else path
    return any(p == s or p.startswith(s + "/") for s in _SYSTEM_PATHS)


def _one_per_node(spec: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """A required pod anti-affinity on the hostname against the Pod's own labels: no two
    such Pods share a node."""
    terms = lookup(
        spec, "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution"
    )
    for t in terms if isinstance(terms, list) else []:
        match = lookup(t, "labelSelector", "matchLabels") if isinstance(t, dict) else None
        if (
            isinstance(t, dict)
            and t.get("topologyKey") == HOSTNAME_LABEL
            and isinstance(match, dict)
            and match
            and all(str(labels.get(k)) == str(v) for k, v in match.items())
        ):
            return True
    return False


def pinned_node(
    spec: Mapping[str, Any], labels: Mapping[str, Any] | None = None
) -> tuple[bool, str]:
    """Whether a pod spec can only run on one node, and how (for messages).  With the
    Pod's ``labels``, a required node affinity to several nodes counts as pinned when a
    required anti-affinity keeps such Pods one per node (each listed node keeps the data)."""
    node_name = spec.get("nodeName")
    if isinstance(node_name, str) and node_name:
        return True, f"nodeName {node_name}"
    selector = spec.get("nodeSelector")
    if isinstance(selector, dict) and selector.get(HOSTNAME_LABEL) not in (None, ""):
        return True, f"nodeSelector {HOSTNAME_LABEL}={selector[HOSTNAME_LABEL]}"
    terms = lookup(
        spec,
        "affinity",
        "nodeAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        "nodeSelectorTerms",
    )
    why = "no nodeSelector on kubernetes.io/hostname, no nodeName, no required node affinity"
    if isinstance(terms, list) and terms:
        hosts: set[str] = set()
        for term in terms:  # terms are ORed: every one must pin, to the same node
            term_hosts: set[str] | None = None
            if isinstance(term, dict):
                for key, field_name in (
                    ("matchExpressions", HOSTNAME_LABEL),
                    ("matchFields", "metadata.name"),
                ):
                    for expr in term.get(key) or []:
                        if (
                            isinstance(expr, dict)
                            and expr.get("key") == field_name
                            and expr.get("operator") == "In"
                            and isinstance(expr.get("values"), list)
                        ):
                            vals = {str(v) for v in expr["values"]}
                            term_hosts = vals if term_hosts is None else term_hosts & vals
            if term_hosts is None or (len(term_hosts) != 1 and labels is None):
                shown = ", ".join(sorted(term_hosts)) if term_hosts else "any node"
                return False, f"required node affinity allows {shown}"
            hosts |= term_hosts
        if len(hosts) == 1:
            return True, f"required node affinity on {hosts.pop()}"
        if labels is not None and _one_per_node(spec, labels):
            return True, f"one Pod per node of {', '.join(sorted(hosts))}"
        return False, (
            f"required node affinity allows any of {', '.join(sorted(hosts))} and no required "
            "pod anti-affinity on kubernetes.io/hostname keeps its Pods one per node"
        )
    if lookup(spec, "affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution"):
        why = "only a preferred (soft) node affinity, which the scheduler may ignore"
    return False, why


def _cache_mounts(container: Mapping[str, Any]) -> list[str]:
    """Paths the container's environment names as caches (``HF_HOME=/data/hf``,
    ``LMCACHE_LOCAL_DISK=file:///kvcache/``)."""
    paths = []
    for item in container.get("env") or []:
        if not isinstance(item, dict) or not isinstance(item.get("value"), str):
            continue
        value = item["value"].removeprefix("file://")
        if _CACHE_ENV.search(str(item.get("name", ""))) and value.startswith("/"):
            paths.append(value)
    return paths


# A container that fetches a model (AIBrix's aibrix_download, KServe's storage initializer,
# `hf download`, an object-store copy): it fills the volume it writes.
_DOWNLOAD_WORD = re.compile(
    r"(?i)(?:^|[\s/'\"=])(?:\w*download\w*|storage[-_]initializer|huggingface-cli|hf|s5cmd|"
    r"gsutil|aws|rclone|azcopy|modelscope)(?:$|[\s'\"])"
)


def filled_before_start(pod: PodSpec, vol: Mapping[str, Any]) -> bool:
    """Whether a container of the Pod downloads into the volume (mounts it writable and
    runs a downloader): an init container before the engine, or a Pod whose job is the
    download (AIBrix's ModelWarmup). The Pod fills the directory itself on whatever node it
    lands, so an empty or fresh directory there is a cold start, never a missing model."""
    name = str(vol.get("name", ""))
    for _, c in pod.containers():
        writes = any(
            isinstance(m, dict) and m.get("name") == name and not m.get("readOnly")
            for m in c.get("volumeMounts") or []
        )
        words = [str(x) for k in ("command", "args") for x in c.get(k) or []]
        words.append(str(c.get("image", "")))
        if writes and any(_DOWNLOAD_WORD.search(w) for w in words):
            return True
    return False


def fills_itself(pod: PodSpec, vol: Mapping[str, Any]) -> bool:
    """Whether a hostPath volume is a cache that the engine fills at start (a Hugging Face
    cache beside `vllm serve Qwen/Qwen3-8B`, a compile cache, a KV-offload directory),
    not weights: no engine reads its model, tokenizer or draft from under its mount, and
    its name, path, mount or the environment pointing at it says cache."""
    hp = vol.get("hostPath")
    path = hp.get("path") if isinstance(hp, dict) else None
    name = str(vol.get("name", ""))
    mounts: list[tuple[str, Mapping[str, Any]]] = [
        (m["mountPath"], c)
        for _, c in pod.containers()
        for m in c.get("volumeMounts") or []
        if isinstance(m, dict) and m.get("name") == name and isinstance(m.get("mountPath"), str)
    ]
    if not isinstance(path, str) or not mounts:
        return False
    if filled_before_start(pod, vol):
        return True
    for mount, c in mounts:
        cmd = parse_container(c)
        if cmd is not None and any(_under(p, mount) for p in _local_model_paths(cmd)):
            return False
    words = [path, name, *(m for m, _ in mounts)]
    if any(_FILLS_ITSELF_WORD.search(w) for w in words):
        return True
    return any(_under(p, m) for m, c in mounts for p in _cache_mounts(c))


HOSTPATH_UNPINNED = register(
    "SB103",
    "hostPath volume in a Pod that is not pinned to exactly one node",
    "A hostPath is a directory on whichever node the Pod lands on. Without pinning, the "
    "scheduler may place the server and its workers (or a restarted Pod) on different "
    "nodes; on a node where the path exists but is empty or stale, the engine crash-loops "
    "with errors that read like a bad model name. Seen in the field: server and worker "
    "Pods on different nodes, one with an empty weights directory.",
    "Pin every Pod that mounts node-local data to one node: `nodeSelector: "
    "{kubernetes.io/hostname: NODE}`, `nodeName: NODE`, or a required node affinity on "
    "`kubernetes.io/hostname` with exactly one value; Pods of several nodes (replicas, "
    "LeaderWorkerSet workers) may instead be pinned to a list of nodes that all keep the "
    "data, with a required pod anti-affinity on `kubernetes.io/hostname` against their own "
    "labels (one Pod per listed node). DaemonSets, system paths (/dev, /sys, /proc, "
    "/run, /etc, ...) and caches the engine fills itself (a Hugging Face cache, a compile "
    "cache, a KV-offload directory, that no engine reads its model from: the same test "
    "SB104 applies), and a directory a container of the Pod (an init container, a "
    "download job) downloads the model into, are exempt: on another node they start cold, "
    "not wrong.",
)


@DOCUMENT_RULES.add(HOSTPATH_UNPINNED)
def check_hostpath_pinning(doc: Document) -> Iterator[Finding]:
    if doc.kind == "DaemonSet":
        return  # one Pod per node by design: a node-local path is the point
    for pod in pod_specs(doc):
        data_paths: list[str] = []
        first: KeyPath = pod.path
        for vpath, vol in pod.volumes():
            hp = vol.get("hostPath")
            path = hp.get("path") if isinstance(hp, dict) else None
            if isinstance(path, str) and not _is_system_path(path) and not fills_itself(pod, vol):
                if not data_paths:
                    first = vpath
                data_paths.append(f"{vol.get('name', '?')}={path}")
        if not data_paths:
            continue
        pinned, how = pinned_node(pod.spec, pod.labels)
        if pinned:
            continue
        yield finding_at(
            HOSTPATH_UNPINNED,
            Severity.FAIL,
            doc,
            first,
            f"{pod.owner} mounts hostPath {', '.join(data_paths)} but is not pinned to "
            f"one node ({how}); its Pods can land on a node where that path is missing, "
            "empty or different.",
            extra=pod.part,
            evidence={"host_paths": data_paths},
        )


def _under(path: str, mount: str) -> bool:
    p, m = posixpath.normpath(path), posixpath.normpath(mount)
    return p == m or p.startswith(m.rstrip("/") + "/")


def _local_model_paths(cmd: EngineCommand) -> list[str]:
    paths = [cmd.model, cmd.value("--tokenizer"), cmd.value("--download-dir")]
    spec, _ = cmd.json_value("--speculative-config")
    if spec and isinstance(spec.get("model"), str):
        paths.append(spec["model"])
    paths.append(cmd.value("--speculative-model"))
    return [p for p in paths if isinstance(p, str) and p.startswith("/")]


HOSTPATH_CREATES_WEIGHTS = register(
    "SB104",
    "hostPath that should hold model weights may be created empty",
    "With `type: DirectoryOrCreate` or `FileOrCreate` (and, in practice, with no `type`, "
    "because container runtimes create a missing bind-mount source), a typo in the path "
    "or a node without the weights gets a fresh empty directory instead of a mount error. "
    "The fast, obvious failure becomes a slow crash loop minutes later (vLLM: 'not a local "
    "path and HF resolution failed'), and a check that mounted it has mutated what it "
    "checked.",
    "Use `type: Directory` (or `File`) for weights, so a missing path fails at mount time "
    "with the path in the event. Keep `DirectoryOrCreate` for caches that are meant to be "
    "filled at startup, and for a directory a container of the Pod downloads the weights "
    "into (that Pod fills it on any node).",
)


@DOCUMENT_RULES.add(HOSTPATH_CREATES_WEIGHTS)
def check_hostpath_create(doc: Document) -> Iterator[Finding]:
    for pod in pod_specs(doc):
        mounts: dict[str, list[tuple[str, EngineCommand | None]]] = {}
        for _cpath, c in pod.containers():
            cmd = parse_container(c)
            for m in c.get("volumeMounts") or []:
                if isinstance(m, dict) and isinstance(m.get("mountPath"), str):
                    mounts.setdefault(str(m.get("name")), []).append((m["mountPath"], cmd))
        for vpath, vol in pod.volumes():
            hp = vol.get("hostPath")
            if not isinstance(hp, dict) or not isinstance(hp.get("path"), str):
                continue
            htype = hp.get("type") or ""
            if htype not in ("DirectoryOrCreate", "FileOrCreate", ""):
                continue
            name = str(vol.get("name", ""))
            used = mounts.get(name, [])
            # An engine whose local model/draft path lies under this mount: weights, surely.
            holds = [
                p
                for mount, cmd in used
                if cmd is not None
                for p in _local_model_paths(cmd)
                if _under(p, mount)
            ]
            named = [
                s for s in [hp["path"], name, *(m for m, _ in used)] if _WEIGHTS_WORD.search(s)
            ]
            # A cache an engine mounts but does not read its model from is meant to start
            # empty (`hf-cache` beside `vllm serve Qwen/Qwen3-8B`, a compile cache).
            cache = any(cmd is not None for _m, cmd in used) and any(
                _CACHE_WORD.search(s) for s in named
            )
            if (not holds and (not named or cache)) or filled_before_start(pod, vol):
                continue
            if not htype:
                severity = Severity.WARN
                what = (
                    "has no `type`: kubelet checks nothing and the container runtime "
                    "creates a missing directory"
                )
            else:
                severity = Severity.FAIL
                what = f"has type {htype}"
            reason = f"the engine reads {holds[0]} from it" if holds else "its name says weights"
            yield finding_at(
                HOSTPATH_CREATES_WEIGHTS,
                severity,
                doc,
                (*vpath, "hostPath"),
                f"hostPath volume {name} ({hp['path']}) holds model weights ({reason}) "
                f"but {what}: a wrong path or a node without the weights gets an empty "
                "directory, and the engine fails minutes later instead of the mount "
                "failing at once.",
                extra=pod.part,
                evidence={"host_path": hp["path"], "type": htype or None},
            )
