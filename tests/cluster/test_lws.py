"""vllm-pd-wide-ep through the real LeaderWorkerSet controller (issue 31): its roles judged
as their Pods become ready, or fail, and `down` removing everything.

On the test plane the LeaderWorkerSet controller is LWS v0.9.0's own, with its webhooks;
the StatefulSets, Pods, Services and scheduling are Kubernetes' own. The recipe's engines
cannot run here (no GPUs, and no NIXL in this machine's vLLM CPU build), so two of the three
`up`s replace the engine container through the recipe's documented `pod_overrides`
parameter with a small Python program: one that answers /health once the group leader's
address (LWS_LEADER_ADDRESS, which the controller's webhook sets) resolves through the
headless Service the controller made, and one whose workers exit with code 3. The third
`up` keeps vLLM's own command, with a weights directory that is absent on the nodes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from servebook.kube import client as kube_client
from servebook.kube.snapshot import ClusterSnapshot
from tests.cluster.conftest import ADMIN_ENV, sb

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]
LWS_API = "/apis/leaderworkerset.x-k8s.io/v1"
PREP_NS = "default"
# What an up of the recipe makes, itself or through the controllers.
MADE = {
    "LeaderWorkerSet": LWS_API + "/namespaces/{ns}/leaderworkersets",
    "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "ControllerRevision": "/apis/apps/v1/namespaces/{ns}/controllerrevisions",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Pod": "/api/v1/namespaces/{ns}/pods",
}
NAME = "wide"

# Serves /health once the leader's name resolves: the webhook's env, the headless Service
# the controller made and the Pod's hostname and subdomain, as a worker dialing its leader.
SERVES = """
import http.server, os, socket, time
leader = os.environ["LWS_LEADER_ADDRESS"]
while True:
    try:
        socket.getaddrinfo(leader, 8000)
        break
    except OSError:
        time.sleep(0.5)
print("resolved", leader, flush=True)
time.sleep(2)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
http.server.HTTPServer(("", 8000), H).serve_forever()
"""
# A group whose workers fail while loading: the leader waits, each worker exits with 3.
CRASHES = """
import os, sys, time
time.sleep(3)
if os.environ["LWS_WORKER_INDEX"] != "0":
    print("rank failed to load", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(3600)
"""


def _engine(script: str) -> Obj:
    """pod_overrides replacing the engine container (the merge replaces lists whole)."""
    return {
        "containers": [
            {
                "name": "engine",
                "image": "python:3.12-slim",
                "command": ["python3", "-c", script],
                "ports": [{"name": "http", "containerPort": 8000}],
                "readinessProbe": {
                    "httpGet": {"path": "/health", "port": "http"},
                    "periodSeconds": 1,
                },
            }
        ]
    }


def _up(tmp: Path, ns: str, nodes: str, *, engine: str | None, model_dir: str) -> Any:
    values: Obj = {
        "image": "vllm/vllm-openai:v0.20.0",
        "namespace": ns,
        "model_dir": model_dir,
        "prefill_nodes": nodes,
        "decode_nodes": nodes,
        "fabric": "tcp",
        "allow_tcp_kv": True,
        "gpus": 1,
        "data_parallel_per_node": 1,
        "cpu": "100m",
        "memory": "256Mi",
        "shm_size": "64Mi",
        "startup_timeout_s": 120,
    }
    if engine is not None:
        values["pod_overrides"] = _engine(engine)
    f = tmp / f"{ns}.yaml"
    f.write_text(yaml.safe_dump(values))
    args = ["up", "vllm-pd-wide-ep", "--backend", "kubernetes", "--name", NAME, "-f", str(f)]
    t0 = time.monotonic()
    r = sb(*args, timeout=300)
    return r, time.monotonic() - t0


def _down_and_gone(ns: str, *, ours: bool = True) -> None:
    """``down``; then the namespace is gone when servebook created it (``ours``), else it is
    kept and nothing the deployment or the controllers made is left in it."""
    d = sb("down", NAME, "--backend", "kubernetes", "-n", ns, timeout=300)
    assert d.returncode == 0, d.stdout + d.stderr
    api = kube_client.connect()
    if ours:
        assert _get(api, f"/api/v1/namespaces/{ns}") is None, "the namespace is still there"
        return
    left = [
        f"{kind}/{o['metadata']['name']}"
        for kind, path in MADE.items()
        for o in _items(api, path.format(ns=ns))
    ]
    assert left == [], left


def _get(api: Any, path: str) -> Obj | None:
    return kube_client.call(api, "GET", path, "reading", missing_ok=True)


def _items(api: Any, path: str) -> list[Obj]:
    return kube_client.list_items(api, path, "listing")


def _gpu_nodes(live: ClusterSnapshot) -> str:
    """Two nodes with a free nvidia.com/gpu each (the plane's gpu-0 and gpu-1)."""
    found = sorted(
        n
        for n, node in live.nodes.items()
        if int((node.get("status", {}).get("allocatable") or {}).get("nvidia.com/gpu", 0)) >= 2
    )
    if len(found) < 2:
        pytest.skip("needs two nodes with nvidia.com/gpu (the test plane has gpu-0 and gpu-1)")
    return ",".join(found[:2])


@pytest.fixture
def weights(live: ClusterSnapshot) -> str:
    """A directory on both nodes, as a node's own path is there (a Pod per node makes it
    with a DirectoryOrCreate hostPath): the fake engines mount it and read nothing.  Made
    as the cluster's administrator, who puts weights on nodes."""
    path = "/servebook-test/lws-weights"
    api = kube_client.connect(os.environ[ADMIN_ENV])
    pods = f"/api/v1/namespaces/{PREP_NS}/pods"
    names = []
    for node in _gpu_nodes(live).split(","):
        name = f"sb-lws-mkdir-{node}-{int(time.time())}"
        volume = {"name": "d", "hostPath": {"path": path, "type": "DirectoryOrCreate"}}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": PREP_NS},
            "spec": {
                "nodeName": node,
                "restartPolicy": "Never",
                "tolerations": [{"operator": "Exists"}],
                "volumes": [volume],
                "containers": [
                    {
                        "name": "mkdir",
                        "image": "busybox:1.36",
                        "command": ["true"],
                        "volumeMounts": [{"name": "d", "mountPath": "/d"}],
                    }
                ],
            },
        }
        kube_client.call(api, "POST", pods, "creating a Pod", body=pod)
        names.append(name)
    deadline = time.monotonic() + 120
    for name in names:
        while ((_get(api, f"{pods}/{name}") or {}).get("status") or {}).get("phase") != "Succeeded":
            assert time.monotonic() < deadline, f"Pod {name} did not make {path}"
            time.sleep(1)
        kube_client.call(api, "DELETE", f"{pods}/{name}", "deleting a Pod", missing_ok=True)
    return path


def _owner(obj: Obj) -> tuple[str, str]:
    (ref,) = [r for r in obj["metadata"]["ownerReferences"] if r.get("controller")]
    return ref["kind"], ref["name"]


def test_the_controllers_pods_are_judged_ready_as_they_become_ready(
    live: ClusterSnapshot, weights: str, tmp_path: Path, tenant_ns: str
) -> None:
    nodes = _gpu_nodes(live)
    ns = tenant_ns
    try:
        r, took = _up(tmp_path, ns, nodes, engine=SERVES, model_dir=weights)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        for role in ("prefill", "decode"):
            # Judged from the Pods: waiting while they start, then ready.
            waiting = out.find(f"{role}: waiting")
            ready = out.find(f"{role}: ready: 1 of 1 group(s) Ready, every one of their 2 Pods")
            assert 0 <= waiting < ready, out
        assert took < 240, f"up took {took:.0f} s"
        _check_made_by_the_controller(kube_client.connect(), ns)
        st = sb("status", NAME, "--backend", "kubernetes", "-n", ns, "--json", timeout=120)
        roles = {x["name"]: x for x in json.loads(st.stdout)["roles"]}
        assert roles["decode"]["state"] == "ready", st.stdout
        assert roles["decode"]["pod"] == f"{NAME}-decode-lws-0", st.stdout
        # A change rolls the groups out again: the old Ready groups are never this up's.
        again = SERVES.replace("time.sleep(2)", "time.sleep(6)")
        r, _ = _up(tmp_path, ns, nodes, engine=again, model_dir=weights)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert "configured LeaderWorkerSet" in out, out
        for role in ("prefill", "decode"):
            assert 0 <= out.find(f"{role}: waiting") < out.find(f"{role}: ready"), out
        pods = _items(kube_client.connect(), f"/api/v1/namespaces/{ns}/pods")
        members = [p for p in pods if "leaderworkerset.sigs.k8s.io/name" in p["metadata"]["labels"]]
        assert len(members) == 4, [p["metadata"]["name"] for p in members]
        for p in members:
            assert "time.sleep(6)" in p["spec"]["containers"][0]["command"][2], p["metadata"]
    finally:
        _down_and_gone(ns, ours=False)


def _check_made_by_the_controller(api: Any, ns: str) -> None:
    """The LeaderWorkerSets report their group ready; their Pods came from the StatefulSets
    the controller made, with its labels and environment, and reached the leader by name."""
    for role in ("prefill", "decode"):
        lws = f"{NAME}-{role}-lws"
        got = _get(api, f"{LWS_API}/namespaces/{ns}/leaderworkersets/{lws}")
        assert got is not None
        status = got["status"]
        assert status["readyReplicas"] == status["updatedReplicas"] == 1, status
        assert {c["type"]: c["status"] for c in status["conditions"]}["Available"] == "True"
        sts = {
            s["metadata"]["name"]: s
            for s in _items(api, f"/apis/apps/v1/namespaces/{ns}/statefulsets")
        }
        assert _owner(sts[lws]) == ("LeaderWorkerSet", lws)
        assert _owner(sts[f"{lws}-0"]) == ("Pod", f"{lws}-0")  # the group's workers
        leader = _get(api, f"/api/v1/namespaces/{ns}/pods/{lws}-0")
        worker = _get(api, f"/api/v1/namespaces/{ns}/pods/{lws}-0-1")
        assert leader is not None and worker is not None
        assert _owner(leader) == ("StatefulSet", lws)
        assert _owner(worker) == ("StatefulSet", f"{lws}-0")
        labels = worker["metadata"]["labels"]
        assert labels["leaderworkerset.sigs.k8s.io/group-index"] == "0"
        assert labels["leaderworkerset.sigs.k8s.io/worker-index"] == "1"
        assert labels["servebook.io/deployment"] == NAME
        env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
        address = f"{lws}-0.{lws}.{ns}"
        assert env["LWS_LEADER_ADDRESS"] == address and env["LWS_GROUP_SIZE"] == "2", env
        assert (worker["spec"]["hostname"], worker["spec"]["subdomain"]) == (f"{lws}-0-1", lws)
        log = kube_client.send(api, "GET", f"/api/v1/namespaces/{ns}/pods/{lws}-0-1/log", "log")
        assert f"resolved {address}" in log.text, log.text


@pytest.mark.admin(
    "up creates the namespace it deploys into and down deletes it: the path of a caller who "
    "may create namespaces, which a tenant may not"
)
def test_a_group_whose_workers_crash_fails_at_once_naming_them(
    live: ClusterSnapshot, weights: str, tmp_path: Path
) -> None:
    """The controller recreates a group the moment a member restarts; up fails on the
    first recreation, naming the worker, not after waiting through them."""
    nodes = _gpu_nodes(live)
    ns = f"sb-lws-crash-{int(time.time())}"
    try:
        r, took = _up(tmp_path, ns, nodes, engine=CRASHES, model_dir=weights)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "cannot become ready" in r.stderr, r.stderr
        named = [f"Pod {NAME}-{role}-lws-0-1" in r.stderr for role in ("prefill", "decode")]
        assert any(named), r.stderr
        assert "RecreateGroupOnPodRestart" in r.stderr, r.stderr
        assert "is the LeaderWorkerSet controller running" not in r.stderr
        assert took < 90, f"took {took:.0f} s to say so"
    finally:
        _down_and_gone(ns)


def test_absent_weights_fail_naming_the_directory_and_node(
    live: ClusterSnapshot, tmp_path: Path, tenant_ns: str
) -> None:
    """vLLM's own command, its weights directory absent on the nodes: the kubelet's mount
    failure names it, on a member of a group.  In a namespace that was there before, down
    keeps it and leaves nothing in it, the controllers' StatefulSets and Service included."""
    nodes = _gpu_nodes(live)
    ns = tenant_ns  # a namespace the tenant was given
    api = kube_client.connect()
    try:
        r, took = _up(tmp_path, ns, nodes, engine=None, model_dir="/servebook-test/absent-weights")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "/servebook-test/absent-weights is absent on node" in r.stderr, r.stderr
        assert "(group 0, member " in r.stderr, r.stderr
        assert took < 120, f"took {took:.0f} s to say so"
        # each set's leaders, and its group's workers (made once the leader Pod exists)
        deadline = time.monotonic() + 60
        while len(made := _items(api, MADE["StatefulSet"].format(ns=ns))) < 4:
            assert time.monotonic() < deadline, [m["metadata"]["name"] for m in made]
            time.sleep(1)
    finally:
        _down_and_gone(ns, ours=False)
