"""Tests against a real Kubernetes control plane.

By default they run against the test plane (`scripts/kube-plane`): a real kube-apiserver,
kube-controller-manager, kube-scheduler and etcd built from Kubernetes' own source, whose
node agent runs Pods as processes on this machine. A `KUBECONFIG` in the environment names a
real cluster instead, and takes precedence. A plane that cannot start fails the tests: it is
never a reason to skip them.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from servebook.kube.snapshot import ClusterSnapshot, ClusterUnreachable, read_live

REPO = Path(__file__).resolve().parents[2]
PLANE = REPO / "scripts" / "kube-plane"
# On the plane no image is pulled: a container whose command is vLLM's server runs this
# machine's vLLM, whatever the image. The name is the one a CPU cluster would pull.
Obj = dict[str, Any]
PLANE_IMAGE = "vllm/vllm-openai-cpu:v0.32.0-x86_64"
UP_S = 1800  # pulling a multi-GB image on a laptop cluster is most of it


def sb(
    *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run servebook as a user would, against the cluster of the test."""
    return subprocess.run(
        [sys.executable, "-m", "servebook", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def kubectl(*args: str, stdin: str | None = None) -> str:
    """kubectl against the cluster of the test (on the plane: the plane's own kubectl)."""
    r = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"kubectl {' '.join(args)}: {r.stderr}"
    return r.stdout


def set_values(where: list[str]) -> list[str]:
    """The NAME=VALUE words of a list of --set arguments."""
    return [where[i + 1] for i in range(0, len(where), 2)]


def mixed_sets(where: list[str]) -> list[str]:
    """tiny-mixed's --set arguments: tiny-pd's without `node` (one Pod, no shared KV)."""
    kept = [s for s in set_values(where) if not s.startswith("node=")]
    return [a for s in kept for a in ("--set", s)]


@dataclass(frozen=True)
class Cluster:
    kubeconfig: str
    plane: bool  # the test plane (Pods as local processes), not a cluster the user named
    bin_dir: str = ""  # the plane's own kubectl, put first on PATH


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster every test here talks to: the user's KUBECONFIG, or a plane of our own,
    started once for the package and stopped after its last test."""
    named = os.environ.get("KUBECONFIG")
    if named:
        yield Cluster(named, plane=False)
        return
    where = tmp_path_factory.mktemp("plane")
    built = subprocess.run([str(PLANE), "build"], capture_output=True, text=True, timeout=3600)
    if built.returncode != 0:
        pytest.fail(f"the test plane did not build:\n{built.stderr}", pytrace=False)
    up = subprocess.run(
        [str(PLANE), "up", str(where)], capture_output=True, text=True, timeout=1800
    )
    try:
        if up.returncode != 0:
            pytest.fail(f"the test plane did not start:\n{up.stdout}\n{up.stderr}", pytrace=False)
        bin_dir = str(Path(built.stdout.strip()).parent)
        yield Cluster(str(where / "kubeconfig"), plane=True, bin_dir=bin_dir)
    finally:
        subprocess.run([str(PLANE), "down", str(where)], capture_output=True, timeout=300)


@pytest.fixture(autouse=True)
def _kubeconfig(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test, and every servebook process it starts, talks to that cluster (and, on
    the plane, uses the plane's kubectl)."""
    monkeypatch.setenv("KUBECONFIG", cluster.kubeconfig)
    if cluster.bin_dir:
        monkeypatch.setenv("PATH", f"{cluster.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture
def live(cluster: Cluster) -> ClusterSnapshot:
    """The cluster, read as preflight reads it."""
    try:
        return read_live(connect_timeout_s=10)
    except ClusterUnreachable as e:
        pytest.fail(f"the cluster in {cluster.kubeconfig} does not answer: {e}", pytrace=False)


@pytest.fixture(scope="module")
def image(cluster: Cluster) -> str:
    """The engine image: any name on the plane (nothing is pulled); on a cluster of the
    user's, vLLM's CPU image that every node can pull (SERVEBOOK_TEST_IMAGE)."""
    named = os.environ.get("SERVEBOOK_TEST_IMAGE")
    if named:
        return named
    if not cluster.plane:
        pytest.skip("set SERVEBOOK_TEST_IMAGE to vLLM's CPU image to run the chain on your cluster")
    return PLANE_IMAGE


@pytest.fixture
def where(live: ClusterSnapshot, image: str) -> Iterator[list[str]]:
    """--set arguments for tiny-pd on this cluster, in a namespace of its own (tiny-mixed
    takes the same but `node`); afterwards nothing labelled by servebook is left there."""
    ready = [
        n
        for n, node in sorted(live.nodes.items())
        if any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in node.get("status", {}).get("conditions", [])
        )
    ]
    assert ready, "the cluster has no Ready node"
    node = "gpu-0" if "gpu-0" in ready else ready[0]  # the plane's first GPU node
    ns = f"sb-chain-{int(time.time())}"
    yield [a for s in (f"image={image}", f"node={node}", f"namespace={ns}") for a in ("--set", s)]
    left = sb("status", "--backend", "kubernetes", "-n", ns, "--json", timeout=120)
    for found in json.loads(left.stdout or "[]"):
        sb("down", found["name"], "--backend", "kubernetes", "-n", ns, timeout=600)


# --- one scenario, two API servers (test_scenarios.py) ---------------------------------------
#
# A scenario of the stand-in's (tests/unit/kube_standin.py) runs once against the stand-in and
# once against the cluster above, with ONE body: ``kube`` is a small facade over either.  What
# the body does through servebook (its client, `servebook` commands) goes over HTTP to the API
# server of the facade's ``kubeconfig`` (KUBECONFIG names it); what the facade arranges as a
# cluster's administrator it does through the stand-in's own API on the stand-in and through
# kubectl on the plane.  Where the two disagree, the plane is right.

# A Pod's container: an HTTP server on the port it is given that answers "pod-answer PATH",
# and exits after answering /exit (its container then restarts).  On the plane the node
# agent runs it as the Pod's process; on the stand-in the facade runs it and plays the kubelet.
POD_SERVER = """\
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        body = f"pod-answer {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        if self.path == "/exit":
            os._exit(0)
http.server.ThreadingHTTPServer((sys.argv[2], int(sys.argv[1])), H).serve_forever()
"""
POD_PORT = 8000
# The plane's Kubernetes release, which the stand-in answers as: its /version and the
# port-forward authorization that depends on it (`create` too from 1.35).
STANDIN_MINOR = 37


def pod_server(namespace: str, name: str, grace_s: int = 1) -> dict[str, Any]:
    """A Pod running ``POD_SERVER`` on ``POD_PORT``, Ready once it answers."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": grace_s,
            "containers": [
                {
                    "name": "server",
                    "image": "python:3.12-slim",
                    "command": ["python3", "-c", POD_SERVER, str(POD_PORT), "0.0.0.0"],
                    "ports": [{"containerPort": POD_PORT}],
                    "readinessProbe": {
                        "httpGet": {"path": "/ready", "port": POD_PORT},
                        "periodSeconds": 1,
                    },
                }
            ],
        },
    }


class Kube:
    """What a scenario arranges as the cluster's administrator (see above)."""

    name = ""
    kubeconfig = ""

    def namespace(self, labels: dict[str, str] | None = None, create: bool = True) -> str:
        """A namespace of this test's own (created unless ``create`` is False: then only
        its name, deleted afterwards if something made it)."""
        raise NotImplementedError

    def grant(self, namespace: str, rules: list[Obj], cluster_rules: list[Obj]) -> str:
        """A kubeconfig whose identity may do what ``rules`` allow in ``namespace`` (a Role)
        and ``cluster_rules`` everywhere (a ClusterRole), and nothing else."""
        raise NotImplementedError

    def names(self, plural: str, namespace: str) -> list[str]:
        """The names of the objects of ``plural`` in ``namespace``."""
        raise NotImplementedError

    def run_pod(self, namespace: str, name: str) -> None:
        """``pod_server``'s Pod, Ready."""
        raise NotImplementedError

    def set_replicas(self, namespace: str, deployment: str, replicas: int) -> str:
        """`kubectl patch` of a Deployment's replicas (a merge patch, an Update by another
        field manager, which then owns them); that manager's name.  (`kubectl scale` goes
        through the scale subresource, which on the plane takes no ownership: a later
        apply sets the replicas back without a conflict.)"""
        raise NotImplementedError


def _unique(prefix: str = "sb-sc") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class PlaneKube(Kube):
    """The cluster of the tests, administered with kubectl."""

    name = "plane"

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        self.kubeconfig = cluster.kubeconfig
        self._tmp = tmp
        self._namespaces: list[str] = []
        self._cluster_scoped: list[str] = []

    def namespace(self, labels: dict[str, str] | None = None, create: bool = True) -> str:
        ns = _unique()
        self._namespaces.append(ns)
        if create:
            meta = {"name": ns, "labels": labels or {}}
            kubectl(
                "create",
                "-f",
                "-",
                stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": meta}),
            )
        return ns

    def grant(self, namespace: str, rules: list[Obj], cluster_rules: list[Obj]) -> str:
        sa = "tester"
        subject = {"kind": "ServiceAccount", "name": sa, "namespace": namespace}
        rbac = "rbac.authorization.k8s.io/v1"
        objs: list[Obj] = [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": sa, "namespace": namespace},
            },
            {
                "apiVersion": rbac,
                "kind": "Role",
                "metadata": {"name": sa, "namespace": namespace},
                "rules": rules,
            },
            {
                "apiVersion": rbac,
                "kind": "RoleBinding",
                "metadata": {"name": sa, "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
                "subjects": [subject],
            },
        ]
        if cluster_rules:
            self._cluster_scoped.append(namespace)
            objs += [
                {
                    "apiVersion": rbac,
                    "kind": "ClusterRole",
                    "metadata": {"name": namespace},
                    "rules": cluster_rules,
                },
                {
                    "apiVersion": rbac,
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": namespace},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": namespace,
                    },
                    "subjects": [subject],
                },
            ]
        kubectl(
            "create",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}),
        )
        token = kubectl("create", "token", sa, "-n", namespace, "--duration=20m").strip()
        cfg = json.loads(kubectl("config", "view", "--raw", "--minify", "-o", "json"))
        cfg["users"] = [{"name": sa, "user": {"token": token}}]
        cfg["contexts"][0]["context"]["user"] = sa
        path = self._tmp / f"kubeconfig-{namespace}"
        path.write_text(json.dumps(cfg))
        return str(path)

    def names(self, plural: str, namespace: str) -> list[str]:
        out = kubectl("get", plural, "-n", namespace, "-o", "jsonpath={.items[*].metadata.name}")
        return sorted(out.split())

    def run_pod(self, namespace: str, name: str) -> None:
        kubectl("create", "-f", "-", stdin=json.dumps(pod_server(namespace, name)))
        kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", namespace, "--timeout=120s")

    def set_replicas(self, namespace: str, deployment: str, replicas: int) -> str:
        patch = json.dumps({"spec": {"replicas": replicas}})
        kubectl("patch", f"deployment/{deployment}", "-n", namespace, "-p", patch)
        got = kubectl(
            "get", f"deployment/{deployment}", "-n", namespace, "-o", "json",
            "--show-managed-fields",
        )  # fmt: skip
        (manager,) = [
            m["manager"]
            for m in json.loads(got)["metadata"]["managedFields"]
            if "f:replicas" in json.dumps(m.get("fieldsV1", {})) and m["manager"] != "servebook"
        ]
        return str(manager)

    def close(self) -> None:
        for ns in self._namespaces:
            subprocess.run(
                ["kubectl", "delete", "namespace", ns, "--wait=false", "--ignore-not-found"],
                capture_output=True, timeout=120,
            )  # fmt: skip
        for name in self._cluster_scoped:
            subprocess.run(
                ["kubectl", "delete", "clusterrolebinding,clusterrole", name, "--ignore-not-found"],
                capture_output=True, timeout=120,
            )  # fmt: skip


class StandInKube(Kube):
    """The stand-in API server (tests/unit/kube_standin.py), answering as Kubernetes
    ``STANDIN_MINOR``; its Pods come up, and stop within their grace periods, in real time
    (a Pod is scheduled, created and started within a second), and a Pod of ``run_pod``
    runs here as a process, restarted as a kubelet restarts a container that exits."""

    name = "stand-in"

    def __init__(self, tmp: Path) -> None:
        from tests.unit.kube_standin import Timing, serve

        self.server = serve()
        st = self.server.standin
        st.minor = STANDIN_MINOR
        st.ready_pods = True
        st.life.timing = Timing(
            scale=1.0, schedule_s=0.2, create_s=0.3, start_s=0.3, namespace_s=0.5
        )
        self.kubeconfig = str(self.server.write_kubeconfig(tmp / "kubeconfig"))
        self._pods: list[tuple[subprocess.Popen[bytes] | None, threading.Event]] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()

    def namespace(self, labels: dict[str, str] | None = None, create: bool = True) -> str:
        ns = _unique()
        if create:
            obj = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": labels or {}},
            }
            self.server.call(lambda st: st.put({**obj, "status": {"phase": "Active"}}))
        return ns

    def grant(self, namespace: str, rules: list[Obj], cluster_rules: list[Obj]) -> str:
        # The stand-in has one user, the kubeconfig's: from now on it may do this only.
        self.server.call(lambda st: st.grant({"rules": [*rules, *cluster_rules]}))
        return self.kubeconfig

    def names(self, plural: str, namespace: str) -> list[str]:
        got: list[str] = self.server.call(lambda st: st.names(plural, namespace))
        return got

    def run_pod(self, namespace: str, name: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        pod = pod_server(namespace, name)
        pod["spec"]["nodeName"] = "node-1"
        pod["status"] = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {"name": "server", "ready": True, "restartCount": 0, "state": {"running": {}}}
            ],
        }

        def put(st: Any) -> None:
            st.put(pod)
            st.forward_to[f"pod/{name}:{POD_PORT}"] = ("127.0.0.1", port)

        self.server.call(put)
        started = threading.Event()
        threading.Thread(
            target=self._kubelet, args=(namespace, name, port, started), daemon=True
        ).start()
        assert started.wait(30), f"the stand-in's Pod {name} did not answer"

    def _kubelet(self, namespace: str, name: str, port: int, started: threading.Event) -> None:
        """Run the Pod's container here; when it exits, count a restart and run it again."""
        restarts = 0
        while not self._stop.is_set():
            argv = pod_server(namespace, name)["spec"]["containers"][0]["command"]
            proc = subprocess.Popen([sys.executable, *argv[1:-2], str(port), "127.0.0.1"])
            self._procs.append(proc)
            while not started.is_set() and proc.poll() is None:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), 0.2),
                ):
                    started.set()
                time.sleep(0.05)
            proc.wait()
            if self._stop.is_set():
                return
            restarts += 1
            status = {
                "name": "server",
                "ready": True,
                "restartCount": restarts,
                "state": {"running": {}},
            }
            self.server.call(
                lambda st, s=status: st.set_pod_status(namespace, name, {"containerStatuses": [s]})
            )

    def set_replicas(self, namespace: str, deployment: str, replicas: int) -> str:
        key = ("deployments", namespace, deployment)

        def patch(st: Any) -> None:
            st.objects[key]["spec"]["replicas"] = replicas
            st.owned_by_other[key] = {".spec.replicas": "kubectl-patch"}

        self.server.call(patch)
        return "kubectl-patch"

    def close(self) -> None:
        self._stop.set()
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.server.stop()


@pytest.fixture(params=["stand-in", "plane"])
def kube(
    request: pytest.FixtureRequest,
    cluster: Cluster,
    tmp_path: Path,
    sb_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Kube]:
    """The API server of a scenario: the stand-in, or the cluster of the tests; KUBECONFIG
    names it for the test and every servebook process it starts."""
    made: StandInKube | PlaneKube
    made = StandInKube(tmp_path) if request.param == "stand-in" else PlaneKube(cluster, tmp_path)
    monkeypatch.setenv("KUBECONFIG", made.kubeconfig)
    try:
        yield made
    finally:
        made.close()
