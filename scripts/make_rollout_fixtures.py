"""Build tests/unit/fixtures/rollout/*.json: `kubectl get pods,events -n NS -o json` as a
cluster prints it in each failure the field notes describe.  The Pod spec is servebook's
own render of vllm-pd (prefill role); status, conditions and event texts are the shapes
and wording kubelet, the scheduler and the ReplicaSet controller write.  Run:
`.venv/bin/python scripts/make_rollout_fixtures.py`."""

import copy, json, os, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.chdir(ROOT / "tests/unit/fixtures/render/vllm-pd")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from servebook.commands.render import render_files

_, objects, _ = render_files("vllm-pd", [], [Path("values.yaml")])
os.chdir(ROOT)
dep = [
    o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "vllm-pd-prefill"
][0]
tmpl = dep["spec"]["template"]
NS = dep["metadata"]["namespace"]
RS = "vllm-pd-prefill-6c8d9f7b5"
POD = RS + "-x2k9q"
IMAGE = [c for c in tmpl["spec"]["containers"]][0]["image"]
CREATED = "2026-11-30T10:00:05Z"


def pod(status, name=POD, deleting=False):
    p = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": "0f3c1d2e-8a6b-4c1f-9f27-5d1e2b3a4c5d",
            "creationTimestamp": CREATED,
            "generateName": RS + "-",
            "labels": {**tmpl["metadata"]["labels"], "pod-template-hash": "6c8d9f7b5"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": RS,
                    "uid": "5b2a1c3d-7e8f-4a9b-8c7d-6e5f4a3b2c1d",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": copy.deepcopy(tmpl["spec"]),
        "status": status,
    }
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-11-30T10:00:04Z"
    return p


def cond(t, s, reason=None, message=None, ts="2026-11-30T10:00:05Z"):
    c = {"type": t, "status": s, "lastProbeTime": None, "lastTransitionTime": ts}
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


def cstatus(state, ready=False, restarts=0, last=None, started=False):
    return {
        "name": "engine",
        "image": IMAGE,
        "imageID": "",
        "ready": ready,
        "restartCount": restarts,
        "started": started,
        "state": state,
        "lastState": last or {},
        **({"containerID": "containerd://4f1e2d3c"} if "running" in state or last else {}),
    }


def event(
    kind, name, reason, message, typ="Warning", count=1, ts="2026-11-30T10:00:20Z", source="kubelet"
):
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.18a7c2f3b4d5e6f7", "namespace": NS, "creationTimestamp": ts},
        "involvedObject": {
            "apiVersion": "v1" if kind == "Pod" else "apps/v1",
            "kind": kind,
            "name": name,
            "namespace": NS,
            "uid": "0f3c1d2e-8a6b-4c1f-9f27-5d1e2b3a4c5d",
        },
        "reason": reason,
        "message": message,
        "type": typ,
        "count": count,
        "firstTimestamp": ts,
        "lastTimestamp": ts,
        "source": {"component": source},
        "reportingComponent": source,
        "reportingInstance": "",
    }


def write(name, items):
    Path(f"tests/unit/fixtures/rollout/{name}.json").write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "List",
                "metadata": {"resourceVersion": ""},
                "items": items,
            },
            indent=1,
        )
        + "\n"
    )


scheduled = [
    cond("PodReadyToStartContainers", "False"),
    cond("Initialized", "True"),
    cond("Ready", "False", "ContainersNotReady", "containers with unready status: [engine]"),
    cond(
        "ContainersReady", "False", "ContainersNotReady", "containers with unready status: [engine]"
    ),
    cond("PodScheduled", "True"),
]
base = {
    "phase": "Pending",
    "hostIP": "10.0.4.11",
    "hostIPs": [{"ip": "10.0.4.11"}],
    "qosClass": "Guaranteed",
    "startTime": CREATED,
}

# 1. weights directory absent on the node
write(
    "hostpath-absent",
    [
        pod(
            {
                **base,
                "conditions": scheduled,
                "containerStatuses": [cstatus({"waiting": {"reason": "ContainerCreating"}})],
            }
        ),
        event(
            "Pod",
            POD,
            "Scheduled",
            f"Successfully assigned {NS}/{POD} to gpu-node-1",
            "Normal",
            source="default-scheduler",
        ),
        event(
            "Pod",
            POD,
            "FailedMount",
            'MountVolume.SetUp failed for volume "model" : hostPath type check failed: /data/models/Kimi-K2-Instruct is not a directory',
            count=4,
        ),
    ],
)
# 2. image tag that does not exist
write(
    "image-pull-backoff",
    [
        pod(
            {
                **base,
                "conditions": scheduled,
                "containerStatuses": [
                    cstatus(
                        {
                            "waiting": {
                                "reason": "ImagePullBackOff",
                                "message": f'Back-off pulling image "{IMAGE}"',
                            }
                        }
                    )
                ],
            }
        ),
        event("Pod", POD, "Pulling", f'Pulling image "{IMAGE}"', "Normal"),
        event(
            "Pod",
            POD,
            "Failed",
            f'Failed to pull image "{IMAGE}": rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/{IMAGE}": failed to resolve reference "docker.io/{IMAGE}": docker.io/{IMAGE}: not found',
        ),
        event("Pod", POD, "BackOff", f'Back-off pulling image "{IMAGE}"', "Normal", count=3),
    ],
)
# 3. no node has free GPUs (held by a Pod of another namespace)
unsched = "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes are available: 1 No preemption victims found for incoming pod, 2 Preemption is not helpful for scheduling."
write(
    "unschedulable",
    [
        pod(
            {
                "phase": "Pending",
                "qosClass": "Guaranteed",
                "conditions": [cond("PodScheduled", "False", "Unschedulable", unsched)],
            }
        ),
        event("Pod", POD, "FailedScheduling", unsched, source="default-scheduler", count=5),
    ],
)
# 4. the engine exits (decode-only speculation, say) and crash-loops
running_ts = "2026-11-30T10:06:41Z"
write(
    "crash-loop",
    [
        pod(
            {
                **base,
                "phase": "Running",
                "podIP": "10.244.1.17",
                "conditions": [
                    c
                    if c["type"] != "PodReadyToStartContainers"
                    else cond("PodReadyToStartContainers", "True")
                    for c in scheduled
                ],
                "containerStatuses": [
                    cstatus(
                        {
                            "waiting": {
                                "reason": "CrashLoopBackOff",
                                "message": f"back-off 20s restarting failed container=engine pod={POD}_{NS}(0f3c1d2e-8a6b-4c1f-9f27-5d1e2b3a4c5d)",
                            }
                        },
                        restarts=1,
                        last={
                            "terminated": {
                                "exitCode": 1,
                                "reason": "Error",
                                "startedAt": "2026-11-30T10:00:31Z",
                                "finishedAt": running_ts,
                                "containerID": "containerd://4f1e2d3c",
                            }
                        },
                    )
                ],
            }
        ),
        event(
            "Pod",
            POD,
            "BackOff",
            "Back-off restarting failed container engine in pod "
            + POD
            + f"_{NS}(0f3c1d2e-8a6b-4c1f-9f27-5d1e2b3a4c5d)",
            count=2,
        ),
    ],
)
# 5. the engine is loading weights: Running, startup probe not yet passed
write(
    "loading",
    [
        pod(
            {
                **base,
                "phase": "Running",
                "podIP": "10.244.1.17",
                "conditions": [
                    c
                    if c["type"] != "PodReadyToStartContainers"
                    else cond("PodReadyToStartContainers", "True")
                    for c in scheduled
                ],
                "containerStatuses": [
                    cstatus({"running": {"startedAt": "2026-11-30T10:00:31Z"}}, started=False)
                ],
            }
        ),
        event("Pod", POD, "Started", "Started container engine", "Normal"),
        event(
            "Pod",
            POD,
            "Unhealthy",
            'Startup probe failed: Get "http://10.244.1.17:8000/health": dial tcp 10.244.1.17:8000: connect: connection refused',
            count=12,
        ),
    ],
)
# 6. Ready (and an old Pod of a previous rollout still terminating)
ready_conds = [
    cond("PodReadyToStartContainers", "True"),
    cond("Initialized", "True"),
    cond("Ready", "True", ts="2026-11-30T10:09:12Z"),
    cond("ContainersReady", "True", ts="2026-11-30T10:09:12Z"),
    cond("PodScheduled", "True"),
]
old = pod(
    {
        **base,
        "phase": "Running",
        "conditions": scheduled,
        "containerStatuses": [cstatus({"running": {"startedAt": "2026-11-30T09:40:00Z"}})],
    },
    name=RS + "-old1",
    deleting=True,
)
old["metadata"]["creationTimestamp"] = "2026-11-30T09:39:00Z"
write(
    "ready",
    [
        old,
        pod(
            {
                **base,
                "phase": "Running",
                "podIP": "10.244.1.17",
                "conditions": ready_conds,
                "containerStatuses": [
                    cstatus(
                        {"running": {"startedAt": "2026-11-30T10:00:31Z"}}, ready=True, started=True
                    )
                ],
            }
        ),
    ],
)
# 7. quota refuses the Pod: no Pod at all, the ReplicaSet says why
write(
    "quota-refused",
    [
        event(
            "ReplicaSet",
            RS,
            "FailedCreate",
            f'Error creating: pods "{RS}-x2k9q" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8',
            source="replicaset-controller",
            count=6,
        ),
    ],
)
print("ok", NS, IMAGE)
