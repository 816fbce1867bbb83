"""How long `servebook preflight`'s cluster checks take on a large cluster.

Builds a synthetic 2,000-node, 60,000-pod cluster in memory (realistic API dicts: GPU nodes
with 8 GPUs and RDMA, taints, a few cordoned and NotReady nodes; pods in 40 namespaces with
containers, init containers, tolerations, volumes and statuses, of which some are Pending,
Succeeded or Failed) and times ``check_cluster`` for a PD recipe whose prefill node is full,
so that the search for alternative nodes walks every node (the slowest path).  Then it
writes the same cluster as the JSON ``kubectl get nodes,pods,namespaces,
customresourcedefinitions -A -o json`` prints (4-space indent) and times ``load_snapshot``.

Target: the checks in under 5 s.

Run: ``.venv/bin/python benchmarks/preflight_scale.py [--nodes 2000] [--pods 60000]
[--no-json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from typing import Any

from servebook.kube.snapshot import ClusterSnapshot, load_snapshot, snapshot_from_list
from servebook.preflight.cluster import check_cluster
from servebook.preflight.requirements import LWS_CRD, ClusterRequirements, NodeAsk

GPU = "nvidia.com/gpu"
RDMA = "rdma/ib"
TARGET_SECONDS = 5.0


def make_node(i: int, rng: random.Random) -> dict[str, Any]:
    name = f"gpu-{i:04d}"
    ready = rng.random() > 0.01
    taints = [{"effect": "NoSchedule", "key": GPU, "value": "present"}]
    cordoned = rng.random() < 0.02
    if cordoned:
        taints.append(
            {
                "effect": "NoSchedule",
                "key": "node.kubernetes.io/unschedulable",
                "timeAdded": "2025-06-18T09:30:12Z",
            }
        )
    if rng.random() < 0.05:
        taints.append({"effect": "NoExecute", "key": "dedicated", "value": "training"})
    spec: dict[str, Any] = {"podCIDR": f"10.{i // 250}.{i % 250}.0/24", "taints": taints}
    if cordoned:
        spec["unschedulable"] = True
    alloc = {
        "cpu": "224",
        "ephemeral-storage": "3321454862893",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": "2113498728Ki",
        GPU: "8",
        "pods": "110",
        RDMA: "1k",
    }
    cond = {
        "lastHeartbeatTime": "2025-06-18T14:21:07Z",
        "lastTransitionTime": "2025-06-02T07:40:19Z",
        "message": "kubelet is posting ready status",
        "reason": "KubeletReady",
        "status": "True" if ready else "False",
        "type": "Ready",
    }
    pressure = [
        {
            "lastHeartbeatTime": "2025-06-18T14:21:07Z",
            "lastTransitionTime": "2025-02-03T09:12:44Z",
            "message": f"kubelet has no {t}",
            "reason": f"KubeletHasNo{t}",
            "status": "False",
            "type": t,
        }
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "creationTimestamp": "2025-02-03T09:12:44Z",
            "labels": {
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            },
            "name": name,
            "resourceVersion": str(40000000 + i),
            "uid": f"00000000-0000-4000-8000-{i:012d}",
        },
        "spec": spec,
        "status": {
            "addresses": [{"address": f"10.1.{i // 250}.{i % 250}", "type": "InternalIP"}],
            "allocatable": alloc,
            "capacity": dict(alloc),
            "conditions": [*pressure, cond],
            "nodeInfo": {
                "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "v1.30.5",
                "osImage": "Ubuntu 22.04.5 LTS",
            },
        },
    }


def make_pod(j: int, node: str, ns: str, gpus: int, phase: str, init_gpus: int) -> dict[str, Any]:
    name = f"work-{j:06d}"

    def container(cname: str, n: int) -> dict[str, Any]:
        res: dict[str, Any] = {
            "limits": {"memory": "64Gi"},
            "requests": {"cpu": "8", "memory": "64Gi"},
        }
        if n:
            res["limits"][GPU] = str(n)
            res["requests"][GPU] = str(n)
        return {
            "image": "vllm/vllm-openai:v0.11.0",
            "imagePullPolicy": "IfNotPresent",
            "name": cname,
            "resources": res,
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
            "volumeMounts": [
                {
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    "name": "kube-api-access-abcde",
                    "readOnly": True,
                }
            ],
        }

    spec: dict[str, Any] = {
        "containers": [container("main", gpus), container("sidecar-logs", 0)],
        "dnsPolicy": "ClusterFirst",
        "nodeName": node,
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30,
        "tolerations": [
            {"effect": "NoSchedule", "key": GPU, "operator": "Exists"},
            {
                "effect": "NoExecute",
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "tolerationSeconds": 300,
            },
        ],
        "volumes": [
            {
                "name": "kube-api-access-abcde",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}
                    ],
                },
            }
        ],
    }
    if init_gpus:
        spec["initContainers"] = [container("warmup", init_gpus)]
    state: dict[str, Any] = (
        {"waiting": {"reason": "ContainerCreating"}}
        if phase == "Pending"
        else {"running": {"startedAt": "2025-06-18T13:55:02Z"}}
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "creationTimestamp": "2025-06-18T13:55:02Z",
            "labels": {"app": f"app-{j % 97}", "pod-template-hash": "5f7c9d6b8"},
            "name": name,
            "namespace": ns,
            "ownerReferences": [
                {"apiVersion": "apps/v1", "controller": True, "kind": "ReplicaSet", "name": "rs"}
            ],
            "resourceVersion": str(50000000 + j),
            "uid": f"11111111-0000-4000-8000-{j:012d}",
        },
        "spec": spec,
        "status": {
            "conditions": [
                {"lastTransitionTime": "2025-06-18T13:55:02Z", "status": "True", "type": t}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {"image": "vllm/vllm-openai:v0.11.0", "name": "main", "ready": True, "state": state}
            ],
            "hostIP": "10.1.0.1",
            "phase": phase,
            "podIP": "10.244.0.1",
            "qosClass": "Burstable",
            "startTime": "2025-06-18T13:55:02Z",
        },
    }


def make_cluster(n_nodes: int, n_pods: int, seed: int = 7) -> dict[str, Any]:
    rng = random.Random(seed)
    nodes = [make_node(i, rng) for i in range(n_nodes)]
    namespaces = [f"team-{k:02d}" for k in range(38)] + ["default", "kube-system"]
    pods = []
    per_node = n_pods // n_nodes
    j = 0
    for i in range(n_nodes):
        node = nodes[i]["metadata"]["name"]
        budget = 8 if i else 0  # gpu-0000 is left with nothing free by its last pod
        for k in range(per_node):
            phase = rng.choices(["Running", "Pending", "Succeeded", "Failed"], [85, 5, 8, 2])[0]
            gpus = 0
            if k < 4 and budget:
                gpus = rng.choice([0, 1, 1, 2])
                budget -= gpus
            if i == 0 and k == per_node - 1:
                gpus, phase = 8, "Running"
            init = 1 if k == 5 else 0
            pods.append(make_pod(j, node, namespaces[j % len(namespaces)], gpus, phase, init))
            j += 1
    ns_objs = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"labels": {"kubernetes.io/metadata.name": n}, "name": n, "uid": n},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }
        for n in [*namespaces, "servebook"]
    ]
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": LWS_CRD, "uid": "crd"},
        "spec": {"group": "leaderworkerset.x-k8s.io", "versions": [{"name": "v1", "served": True}]},
        "status": {"conditions": [{"type": "Established", "status": "True"}]},
    }
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [*nodes, *pods, *ns_objs, crd],
        "metadata": {"resourceVersion": ""},
    }


def requirements() -> ClusterRequirements:
    tol = ({"key": GPU, "operator": "Exists", "effect": "NoSchedule"},)
    return ClusterRequirements(
        crds=(LWS_CRD,),
        nodes=(
            # Full: its failure triggers the search for alternatives over every node.
            NodeAsk("gpu-0000", ("prefill",), 8, GPU, RDMA, tol),
            NodeAsk("gpu-0001", ("decode",), 4, GPU, RDMA, tol),
        ),
    )


def time_checks(snapshot: ClusterSnapshot, repeat: int) -> list[float]:
    req = requirements()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        findings = check_cluster(snapshot, req)
        times.append(time.perf_counter() - t0)
    free = next(f for f in findings if f.check == "SB254")
    assert free.failed and "Nodes with 8 free" in free.hint, free
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--pods", type=int, default=60000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-json", action="store_true", help="skip the JSON write/load timing")
    args = ap.parse_args()

    t0 = time.perf_counter()
    doc = make_cluster(args.nodes, args.pods)
    built = time.perf_counter() - t0
    snapshot = snapshot_from_list(doc, source="synthetic")
    print(
        f"synthetic cluster: {len(snapshot.nodes)} nodes, {len(snapshot.pods)} pods, "
        f"{len(snapshot.namespaces)} namespaces (built in {built:.1f} s)"
    )
    times = time_checks(snapshot, args.repeat)
    best, median = min(times), statistics.median(times)
    verdict = "OK" if max(times) < TARGET_SECONDS else "OVER TARGET"
    print(
        f"check_cluster: median {median:.3f} s, best {best:.3f} s, worst {max(times):.3f} s "
        f"over {args.repeat} runs (target < {TARGET_SECONDS:g} s: {verdict})"
    )
    if not args.no_json:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "snapshot.json")
            with open(path, "w") as f:
                json.dump(doc, f, indent=4, sort_keys=True)
            size = os.path.getsize(path) / 2**20
            del doc
            t0 = time.perf_counter()
            loaded = load_snapshot(path)
            load_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            check_cluster(loaded, requirements())
            check_s = time.perf_counter() - t0
        print(
            f"load_snapshot: {load_s:.2f} s for a {size:.0f} MiB kubectl-style JSON file; "
            f"load + check: {load_s + check_s:.2f} s"
        )
    return 0 if max(times) < TARGET_SECONDS else 1


if __name__ == "__main__":
    raise SystemExit(main())
