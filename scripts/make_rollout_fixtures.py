"""Build tests/unit/fixtures/rollout/*.json: `kubectl get deployments,replicasets,pods,events
-n NS -o json` as a cluster prints it in each failure the field notes describe, and in each
step of a re-`up` after a change.  The Pod spec is servebook's own render of vllm-pd
(prefill role); status, conditions, ownerReferences, `pod-template-hash` labels,
`deployment.kubernetes.io/revision` annotations and event texts are the shapes and wording
kubelet, the scheduler, the ReplicaSet controller and the Deployment controller write.
Run: `.venv/bin/python scripts/make_rollout_fixtures.py`."""

# The cluster's messages stay verbatim, each on one line.
# ruff: noqa: E501

import copy
import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.chdir(ROOT / "tests/unit/fixtures/render/vllm-pd")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from servebook.commands.render import render_files  # noqa: E402

_, objects, _ = render_files("vllm-pd", [], [Path("values.yaml")])
os.chdir(ROOT)
dep = next(
    o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "vllm-pd-prefill"
)
tmpl = dep["spec"]["template"]
NS = dep["metadata"]["namespace"]
DEP = dep["metadata"]["name"]
DEP_UID = "8e1f0a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
HASH = "6c8d9f7b5"
RS = f"{DEP}-{HASH}"
RS_UID = "5b2a1c3d-7e8f-4a9b-8c7d-6e5f4a3b2c1d"
POD = RS + "-x2k9q"
POD_UID = "0f3c1d2e-8a6b-4c1f-9f27-5d1e2b3a4c5d"
# The previous revision's ReplicaSet and Pod, of the first `up` at 09:10 (a re-`up` at
# 10:00 changed the template).
OLD_HASH = "7f5b8c4d9"
OLD_RS = f"{DEP}-{OLD_HASH}"
OLD_RS_UID = "2d4c6e8a-0b1c-4d2e-9f3a-4b5c6d7e8f90"
OLD_POD = OLD_RS + "-h4tzm"
OLD_POD_UID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
IMAGE = tmpl["spec"]["containers"][0]["image"]
CREATED = "2026-11-30T10:00:05Z"
NODE = "gpu-node-1"


def pod(
    status,
    name=POD,
    deleting=False,
    node=None,
    uid=POD_UID,
    rs=RS,
    rs_uid=RS_UID,
    hash_=HASH,
    created=CREATED,
    deleted_at="2026-11-30T10:00:04Z",
):
    p = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "creationTimestamp": created,
            "generateName": rs + "-",
            "labels": {**tmpl["metadata"]["labels"], "pod-template-hash": hash_},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": rs,
                    "uid": rs_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": copy.deepcopy(tmpl["spec"]),
        "status": status,
    }
    scheduled_ = any(
        c["type"] == "PodScheduled" and c["status"] == "True" for c in status.get("conditions", [])
    )
    node = node or (NODE if scheduled_ else None)
    if node:  # set by the scheduler's binding
        p["spec"]["nodeName"] = node
    if deleting:
        p["metadata"]["deletionTimestamp"] = deleted_at
        p["metadata"]["deletionGracePeriodSeconds"] = 30
    return p


def deployment(
    generation, observed, revision, status, strategy=None, created="2026-11-30T09:10:00Z"
):
    """The role's Deployment as the API returns it (kube-controller-manager's status; the
    status counters are omitted when 0)."""
    d = copy.deepcopy(dep)
    d["metadata"].update(
        {
            "uid": DEP_UID,
            "generation": generation,
            "creationTimestamp": created,
            "resourceVersion": str(48210 + generation * 7 + observed),
            "annotations": {"deployment.kubernetes.io/revision": str(revision)},
        }
    )
    d["spec"] = {
        "progressDeadlineSeconds": 600,
        "replicas": 1,
        "revisionHistoryLimit": 10,
        "selector": d["spec"]["selector"],
        "strategy": strategy or {"type": "Recreate"},
        "template": {
            "metadata": {"creationTimestamp": None, **copy.deepcopy(tmpl["metadata"])},
            "spec": copy.deepcopy(tmpl["spec"]),
        },
    }
    d["status"] = {"observedGeneration": observed, **status}
    return d


def dcond(t, s, reason, message, ts):
    return {
        "type": t,
        "status": s,
        "lastUpdateTime": ts,
        "lastTransitionTime": ts,
        "reason": reason,
        "message": message,
    }


def replicaset(name, hash_, uid, revision, replicas, status, created, generation=1, max_replicas=1):
    """A ReplicaSet the Deployment controller created: owned by the Deployment, labelled and
    selecting by its `pod-template-hash`, annotated with the revision it rolls out."""
    labels = {**tmpl["metadata"]["labels"], "pod-template-hash": hash_}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "annotations": {
                "deployment.kubernetes.io/desired-replicas": "1",
                "deployment.kubernetes.io/max-replicas": str(max_replicas),
                "deployment.kubernetes.io/revision": str(revision),
            },
            "creationTimestamp": created,
            "generation": generation,
            "labels": labels,
            "name": name,
            "namespace": NS,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "blockOwnerDeletion": True,
                    "controller": True,
                    "kind": "Deployment",
                    "name": DEP,
                    "uid": DEP_UID,
                }
            ],
            "resourceVersion": str(48100 + revision * 13 + replicas),
            "uid": uid,
        },
        "spec": {
            "replicas": replicas,
            "selector": {
                "matchLabels": {
                    **dep["spec"]["selector"]["matchLabels"],
                    "pod-template-hash": hash_,
                }
            },
            "template": {
                "metadata": {"creationTimestamp": None, "labels": labels},
                "spec": copy.deepcopy(tmpl["spec"]),
            },
        },
        "status": {"observedGeneration": generation, **status},
    }


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
    kind,
    name,
    reason,
    message,
    typ="Warning",
    count=1,
    ts="2026-11-30T10:00:20Z",
    source="kubelet",
    uid="0f3c1d2e-8a6b-4c1f-9f27-5d1e2b3a4c5d",
):
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            # unique per object, reason and time, as the API server's names are
            "name": f"{name}.{hashlib.sha1(f'{name}/{reason}/{ts}'.encode()).hexdigest()[:16]}",
            "namespace": NS,
            "creationTimestamp": ts,
        },
        "involvedObject": {
            "apiVersion": "v1" if kind == "Pod" else "apps/v1",
            "kind": kind,
            "name": name,
            "namespace": NS,
            "uid": uid,
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


# Each failure above happens on a first `up` (applied at 10:00:00): the Deployment at
# generation 1, observed, revision 1, and its one ReplicaSet.
def first_rollout(kind):
    ts = "2026-11-30T10:00:00Z"
    quota = (
        f'pods "{RS}-x2k9q" is forbidden: exceeded quota: gpu-quota, requested: '
        "requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=8, limited: "
        "requests.nvidia.com/gpu=8"
    )
    if kind == "available":
        dstatus = {
            "availableReplicas": 1,
            "readyReplicas": 1,
            "replicas": 1,
            "updatedReplicas": 1,
            "conditions": [
                dcond(
                    "Available",
                    "True",
                    "MinimumReplicasAvailable",
                    "Deployment has minimum availability.",
                    "2026-11-30T10:09:12Z",
                ),
                dcond(
                    "Progressing",
                    "True",
                    "NewReplicaSetAvailable",
                    f'ReplicaSet "{RS}" has successfully progressed.',
                    "2026-11-30T10:09:12Z",
                ),
            ],
        }
        rstatus = {
            "availableReplicas": 1,
            "fullyLabeledReplicas": 1,
            "readyReplicas": 1,
            "replicas": 1,
        }
    elif kind == "refused":
        dstatus = {
            "unavailableReplicas": 1,
            "conditions": [
                dcond(
                    "Available",
                    "False",
                    "MinimumReplicasUnavailable",
                    "Deployment does not have minimum availability.",
                    ts,
                ),
                dcond(
                    "Progressing",
                    "True",
                    "NewReplicaSetCreated",
                    f'Created new replica set "{RS}"',
                    ts,
                ),
                dcond("ReplicaFailure", "True", "FailedCreate", quota, ts),
            ],
        }
        rstatus = {
            "replicas": 0,
            "conditions": [
                {
                    "type": "ReplicaFailure",
                    "status": "True",
                    "lastTransitionTime": ts,
                    "reason": "FailedCreate",
                    "message": quota,
                }
            ],
        }
    else:
        dstatus = {
            "replicas": 1,
            "unavailableReplicas": 1,
            "updatedReplicas": 1,
            "conditions": [
                dcond(
                    "Available",
                    "False",
                    "MinimumReplicasUnavailable",
                    "Deployment does not have minimum availability.",
                    ts,
                ),
                dcond(
                    "Progressing",
                    "True",
                    "ReplicaSetUpdated",
                    f'ReplicaSet "{RS}" is progressing.',
                    ts,
                ),
            ],
        }
        rstatus = {"fullyLabeledReplicas": 1, "replicas": 1}
    return [
        deployment(1, 1, 1, dstatus, created=ts),
        replicaset(RS, HASH, RS_UID, 1, 1, rstatus, ts),
    ]


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
        *first_rollout("progressing"),
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
        *first_rollout("progressing"),
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
        *first_rollout("progressing"),
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
        *first_rollout("progressing"),
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
        *first_rollout("progressing"),
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
        *first_rollout("available"),
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
        *first_rollout("refused"),
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
# A re-`up` after a change: the first `up` at 09:10 rolled out revision 1 (ReplicaSet
# OLD_RS, Pod OLD_POD, Ready since 09:19); servebook patched the Deployment at 10:00:00,
# which made generation 2.  Each step the Deployment controller goes through:
FIRST = "2026-11-30T09:10:00Z"
running_conds = [
    c if c["type"] != "PodReadyToStartContainers" else cond("PodReadyToStartContainers", "True")
    for c in scheduled
]


def old_pod(ready=True, deleting=False, terminated=False):
    ts = "2026-11-30T09:10:05Z"
    if terminated:  # stopped for the rollout: kubelet gives a deleted Pod a terminal phase
        status = {
            **base,
            "phase": "Succeeded",
            "podIP": "10.244.1.9",
            "startTime": ts,
            "conditions": [
                cond("PodReadyToStartContainers", "False", ts="2026-11-30T10:00:33Z"),
                cond("Initialized", "True", reason="PodCompleted", ts=ts),
                cond("Ready", "False", "PodCompleted", ts="2026-11-30T10:00:33Z"),
                cond("ContainersReady", "False", "PodCompleted", ts="2026-11-30T10:00:33Z"),
                cond("PodScheduled", "True", ts=ts),
            ],
            "containerStatuses": [
                cstatus(
                    {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "startedAt": "2026-11-30T09:10:31Z",
                            "finishedAt": "2026-11-30T10:00:32Z",
                            "containerID": "containerd://a1b2c3d4",
                        }
                    },
                    started=False,
                )
            ],
        }
    else:
        status = {
            **base,
            "phase": "Running",
            "podIP": "10.244.1.9",
            "startTime": ts,
            "conditions": [
                cond("PodReadyToStartContainers", "True", ts=ts),
                cond("Initialized", "True", ts=ts),
                cond("Ready", "True" if ready else "False", ts="2026-11-30T09:19:02Z"),
                cond("ContainersReady", "True" if ready else "False", ts="2026-11-30T09:19:02Z"),
                cond("PodScheduled", "True", ts=ts),
            ],
            "containerStatuses": [
                cstatus(
                    {"running": {"startedAt": "2026-11-30T09:10:31Z"}}, ready=ready, started=True
                )
            ],
        }
    return pod(
        status,
        name=OLD_POD,
        uid=OLD_POD_UID,
        rs=OLD_RS,
        rs_uid=OLD_RS_UID,
        hash_=OLD_HASH,
        created=ts,
        deleting=deleting,
        deleted_at="2026-11-30T10:00:01Z",
    )


def old_rs(replicas, status, generation=1):
    return replicaset(
        OLD_RS, OLD_HASH, OLD_RS_UID, 1, replicas, status, FIRST, generation=generation
    )


def new_rs(status, max_replicas=1):
    return replicaset(
        RS, HASH, RS_UID, 2, 1, status, "2026-11-30T10:00:04Z", max_replicas=max_replicas
    )


available_1 = [
    dcond(
        "Available",
        "True",
        "MinimumReplicasAvailable",
        "Deployment has minimum availability.",
        "2026-11-30T09:19:02Z",
    ),
    dcond(
        "Progressing",
        "True",
        "NewReplicaSetAvailable",
        f'ReplicaSet "{OLD_RS}" has successfully progressed.',
        "2026-11-30T09:19:02Z",
    ),
]
unavailable = dcond(
    "Available",
    "False",
    "MinimumReplicasUnavailable",
    "Deployment does not have minimum availability.",
    "2026-11-30T10:00:01Z",
)
ready_old_rs = {
    "availableReplicas": 1,
    "fullyLabeledReplicas": 1,
    "readyReplicas": 1,
    "replicas": 1,
}
scaled_down = event(
    "Deployment",
    DEP,
    "ScalingReplicaSet",
    f"Scaled down replica set {OLD_RS} from 1 to 0",
    "Normal",
    ts="2026-11-30T10:00:01Z",
    source="deployment-controller",
    uid=DEP_UID,
)
deleted = event(
    "ReplicaSet",
    OLD_RS,
    "SuccessfulDelete",
    f"Deleted pod: {OLD_POD}",
    "Normal",
    ts="2026-11-30T10:00:01Z",
    source="replicaset-controller",
    uid=OLD_RS_UID,
)
killing = event(
    "Pod",
    OLD_POD,
    "Killing",
    "Stopping container engine",
    "Normal",
    ts="2026-11-30T10:00:01Z",
    uid=OLD_POD_UID,
)
scaled_up = event(
    "Deployment",
    DEP,
    "ScalingReplicaSet",
    f"Scaled up replica set {RS} from 0 to 1",
    "Normal",
    ts="2026-11-30T10:00:04Z",
    source="deployment-controller",
    uid=DEP_UID,
)
created_pod = event(
    "ReplicaSet",
    RS,
    "SuccessfulCreate",
    f"Created pod: {POD}",
    "Normal",
    ts="2026-11-30T10:00:05Z",
    source="replicaset-controller",
    uid=RS_UID,
)
loading_pod = pod(
    {
        **base,
        "phase": "Running",
        "podIP": "10.244.1.17",
        "conditions": running_conds,
        "containerStatuses": [
            cstatus({"running": {"startedAt": "2026-11-30T10:00:31Z"}}, started=False)
        ],
    }
)

# 8. the patch is stored, the controller has not acted on it yet: the old Pod is Ready
write(
    "reup-not-observed",
    [
        deployment(
            2,
            1,
            1,
            {
                "availableReplicas": 1,
                "readyReplicas": 1,
                "replicas": 1,
                "updatedReplicas": 1,
                "conditions": available_1,
            },
        ),
        old_rs(1, ready_old_rs),
        old_pod(),
    ],
)
# 9. Recreate: the controller observed generation 2 and scaled the old ReplicaSet to 0; it
# creates the new ReplicaSet only once the old Pod has stopped, and until then the
# Deployment keeps revision 1.  The old Pod is terminating, its Ready condition not yet
# updated.
write(
    "reup-old-terminating",
    [
        deployment(
            2, 2, 1, {"unavailableReplicas": 1, "conditions": [unavailable, available_1[1]]}
        ),
        old_rs(0, {"replicas": 0}, generation=2),
        old_pod(deleting=True),
        scaled_down,
        deleted,
        killing,
    ],
)
# 10. the old Pod still Ready and the new one loading.  Under servebook's Recreate the old
# Pod is gone first; under the default RollingUpdate (a Deployment applied by hand, or
# edited) it serves until the new one is Ready.  The verdict must not depend on it.
write(
    "reup-new-starting",
    [
        deployment(
            2,
            2,
            2,
            {
                "availableReplicas": 1,
                "readyReplicas": 1,
                "replicas": 2,
                "unavailableReplicas": 1,
                "updatedReplicas": 1,
                "conditions": [
                    available_1[0],
                    dcond(
                        "Progressing",
                        "True",
                        "ReplicaSetUpdated",
                        f'ReplicaSet "{RS}" is progressing.',
                        "2026-11-30T10:00:04Z",
                    ),
                ],
            },
            strategy={
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
            },
        ),
        old_rs(1, ready_old_rs),
        new_rs({"fullyLabeledReplicas": 1, "replicas": 1}, max_replicas=2),
        old_pod(),
        loading_pod,
        event(
            "Deployment",
            DEP,
            "ScalingReplicaSet",
            f"Scaled up replica set {RS} from 0 to 1",
            "Normal",
            ts="2026-11-30T10:00:04Z",
            source="deployment-controller",
            uid=DEP_UID,
        ),
        created_pod,
        event(
            "Pod", POD, "Started", "Started container engine", "Normal", ts="2026-11-30T10:00:31Z"
        ),
    ],
)
# 11. Recreate done: revision 2's Pod Ready; the old Pod, stopped, not yet removed
write(
    "reup-ready",
    [
        deployment(
            2,
            2,
            2,
            {
                "availableReplicas": 1,
                "readyReplicas": 1,
                "replicas": 1,
                "updatedReplicas": 1,
                "conditions": [
                    dcond(
                        "Available",
                        "True",
                        "MinimumReplicasAvailable",
                        "Deployment has minimum availability.",
                        "2026-11-30T10:09:12Z",
                    ),
                    dcond(
                        "Progressing",
                        "True",
                        "NewReplicaSetAvailable",
                        f'ReplicaSet "{RS}" has successfully progressed.',
                        "2026-11-30T10:09:12Z",
                    ),
                ],
            },
        ),
        old_rs(0, {"replicas": 0}, generation=2),
        new_rs(
            {"availableReplicas": 1, "fullyLabeledReplicas": 1, "readyReplicas": 1, "replicas": 1}
        ),
        old_pod(deleting=True, terminated=True),
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
        scaled_down,
        deleted,
        killing,
        scaled_up,
        created_pod,
    ],
)


# A re-`up` without a change (generation 1 still, nothing rolled out again) of the Pod
# OLD_POD, whose engine crashed once at 09:31 (before this apply) and was restarted.
def restarted_pod(restarts, state, last, ready):
    ts = "2026-11-30T09:10:05Z"
    ready_ts = "2026-11-30T09:40:11Z"
    p = old_pod()
    p["status"] = {
        **base,
        "phase": "Running",
        "podIP": "10.244.1.9",
        "startTime": ts,
        "conditions": [
            cond("PodReadyToStartContainers", "True", ts=ts),
            cond("Initialized", "True", ts=ts),
            cond("Ready", "True", ts=ready_ts)
            if ready
            else cond(
                "Ready",
                "False",
                "ContainersNotReady",
                "containers with unready status: [engine]",
                ts="2026-11-30T10:03:20Z",
            ),
            cond("ContainersReady", "True", ts=ready_ts)
            if ready
            else cond(
                "ContainersReady",
                "False",
                "ContainersNotReady",
                "containers with unready status: [engine]",
                ts="2026-11-30T10:03:20Z",
            ),
            cond("PodScheduled", "True", ts=ts),
        ],
        "containerStatuses": [
            {
                **cstatus(state, ready=ready, restarts=restarts, last=last, started=ready),
                "containerID": "containerd://c7d8e9f0",
            }
        ],
    }
    return p


settled_1 = [
    deployment(
        1,
        1,
        1,
        {
            "availableReplicas": 1,
            "readyReplicas": 1,
            "replicas": 1,
            "updatedReplicas": 1,
            "conditions": available_1,
        },
    ),
    old_rs(1, ready_old_rs),
]
crash_0931 = {
    "terminated": {
        "exitCode": 1,
        "reason": "Error",
        "startedAt": "2026-11-30T09:10:31Z",
        "finishedAt": "2026-11-30T09:31:02Z",
        "containerID": "containerd://b5c6d7e8",
    }
}
# 12. restarted once before this apply, Ready now
write(
    "restarted-before-apply",
    [
        *settled_1,
        restarted_pod(1, {"running": {"startedAt": "2026-11-30T09:31:13Z"}}, crash_0931, True),
    ],
)
# 13. the same Pod crashed again at 10:03, after this apply, and is backing off
write(
    "crashed-after-apply",
    [
        *settled_1,
        restarted_pod(
            2,
            {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off 20s restarting failed container=engine pod={OLD_POD}_{NS}({OLD_POD_UID})",
                }
            },
            {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "startedAt": "2026-11-30T09:31:13Z",
                    "finishedAt": "2026-11-30T10:03:20Z",
                    "containerID": "containerd://c7d8e9f0",
                }
            },
            False,
        ),
        event(
            "Pod",
            OLD_POD,
            "BackOff",
            f"Back-off restarting failed container engine in pod {OLD_POD}_{NS}({OLD_POD_UID})",
            count=2,
            ts="2026-11-30T10:03:21Z",
            uid=OLD_POD_UID,
        ),
    ],
)
print("ok", NS, IMAGE)
