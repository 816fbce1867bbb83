"""Tests against a real Kubernetes control plane.

By default they run against the test plane (`scripts/kube-plane`): a real kube-apiserver,
kube-controller-manager, kube-scheduler and etcd built from Kubernetes' own source, whose
node agent runs Pods as processes on this machine. A `KUBECONFIG` in the environment names a
real cluster instead, and takes precedence. A plane that cannot start fails the tests: it is
never a reason to skip them.

servebook runs as its users run it on a shared cluster: as a tenant (the plane's
`tenant.kubeconfig`: a user with a Role in a few namespaces, no cluster-scoped rights; the
README lists its rules).  `KUBECONFIG` names the tenant for every test and every servebook
process it starts; what a test arranges as the platform team (namespaces, labels, other
teams' Pods, faults) goes through `kubectl()`, which is the administrator.  A test whose
point is an admin-only path says why with `@pytest.mark.admin("why")`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
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


def until(what: str, check: Callable[[], Any], within_s: float = 60.0) -> Any:
    """``check()``'s first truthy answer, asked every 0.1 s; an AssertionError naming
    ``what`` when none came within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {within_s} s: {what}")


ADMIN_ENV = "SERVEBOOK_TEST_ADMIN_KUBECONFIG"


def admin_kubectl() -> list[str]:
    """kubectl as the cluster's administrator (on the plane: its admin kubeconfig)."""
    admin = os.environ.get(ADMIN_ENV)
    return ["kubectl", *(["--kubeconfig", admin] if admin else [])]


def kubectl(*args: str, stdin: str | None = None) -> str:
    """kubectl against the cluster of the test as its administrator (on the plane: the
    plane's own kubectl and its admin kubeconfig)."""
    argv = [*admin_kubectl(), *args]
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
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
    kubeconfig: str  # the administrator's
    plane: bool  # the test plane (Pods as local processes), not a cluster the user named
    bin_dir: str = ""  # the plane's own kubectl, put first on PATH
    # The identity servebook runs as, and the namespaces its Role is in; on a cluster the
    # user named: that kubeconfig, which may create namespaces of its own.
    tenant: str = ""
    tenant_namespaces: tuple[str, ...] = ()

    @property
    def user(self) -> str:
        return self.tenant or self.kubeconfig


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
        record = json.loads((where / "plane.json").read_text())
        yield Cluster(
            str(where / "kubeconfig"),
            plane=True,
            bin_dir=bin_dir,
            tenant=record["tenantKubeconfig"],
            tenant_namespaces=tuple(record["tenantNamespaces"]),
        )
    finally:
        subprocess.run([str(PLANE), "down", str(where)], capture_output=True, timeout=300)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "admin(why): the test runs servebook as the cluster's administrator, not "
        "as the tenant, for the reason given",
    )  # fmt: skip


@pytest.fixture(autouse=True)
def _kubeconfig(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Every test, and every servebook process it starts, talks to that cluster as the
    tenant (as the administrator where the test is marked ``admin`` with its reason);
    ``kubectl()`` is the administrator; on the plane, the plane's kubectl is used."""
    admin = request.node.get_closest_marker("admin")
    if admin is not None:
        assert admin.args and str(admin.args[0]).strip(), "@pytest.mark.admin needs a reason"
    monkeypatch.setenv("KUBECONFIG", cluster.kubeconfig if admin else cluster.user)
    monkeypatch.setenv(ADMIN_ENV, cluster.kubeconfig)
    if cluster.bin_dir:
        monkeypatch.setenv("PATH", f"{cluster.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture
def live(cluster: Cluster) -> ClusterSnapshot:
    """The cluster, read as preflight reads it with the administrator's credentials."""
    try:
        return read_live(kubeconfig=cluster.kubeconfig, connect_timeout_s=10)
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


TENANT_ROLE = "tenant"  # the Role (and RoleBinding) of the plane's tenant in each namespace


def give_tenant(cluster: Cluster, ns: str, rules: list[Obj] | None = None) -> None:
    """What a platform team does for a team: a namespace ``ns`` with the tenant's Role in it
    (the plane's, or ``rules``) bound to the tenant.  On a cluster the user named, the
    namespace only."""
    kubectl("create", "namespace", ns)
    give_role(cluster, ns, rules)


def give_role(cluster: Cluster, ns: str, rules: list[Obj] | None = None) -> None:
    """The tenant's Role (or one of ``rules``) and its RoleBinding in namespace ``ns``."""
    if not cluster.tenant_namespaces:
        return
    first = cluster.tenant_namespaces[0]
    for kind in ("role", "rolebinding"):
        obj = json.loads(kubectl("get", kind, TENANT_ROLE, "-n", first, "-o", "json"))
        obj["metadata"] = {"name": TENANT_ROLE, "namespace": ns}
        if kind == "role" and rules is not None:
            obj["rules"] = rules
        kubectl("create", "-f", "-", stdin=json.dumps(obj))
    until_tenant_can(ns, "get", "roles.rbac.authorization.k8s.io")


TENANT_USER = "servebook-tenant"  # the plane's tenant (plane/cmd/kube-plane/plane_tenant.go)


def tenant_can(ns: str, verb: str, resource: str) -> bool:
    """``kubectl auth can-i`` for the tenant, asked by the administrator as the tenant."""
    r = subprocess.run(
        [*admin_kubectl(), "auth", "can-i", verb, resource, "-n", ns, f"--as={TENANT_USER}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return r.stdout.strip() == "yes"


def until_tenant_can(ns: str, verb: str, resource: str, want: bool = True) -> None:
    """RBAC's authorizer reads Roles from a cache: wait until a change is in force."""
    deadline = time.monotonic() + 20
    while tenant_can(ns, verb, resource) != want:
        assert time.monotonic() < deadline, f"the tenant's {verb} {resource} in {ns} != {want}"
        time.sleep(0.2)


def set_tenant_rules(ns: str, rules: list[Obj]) -> None:
    """The tenant's Role in ``ns`` made ``rules`` (a merge patch replaces the list)."""
    kubectl("patch", "role", TENANT_ROLE, "-n", ns, "--type=merge", "-p",
            json.dumps({"rules": rules}))  # fmt: skip


def tenant_rules_in(ns: str) -> list[Obj] | None:
    """The rules of the tenant's Role in ``ns``; None when it has none there (a cluster the
    user named, whose Roles are not the tests' to change)."""
    r = subprocess.run(
        [*admin_kubectl(), "get", "role", TENANT_ROLE, "-n", ns, "-o", "json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return list(json.loads(r.stdout)["rules"]) if r.returncode == 0 else None


def without(rules: list[Obj], verb: str, resource: str, group: str) -> list[Obj]:
    """``rules`` less ``verb`` on ``resource`` (split out of the rule that grants it)."""
    out: list[Obj] = []
    for rule in rules:
        if group not in rule["apiGroups"] or resource not in rule["resources"]:
            out.append(rule)
            continue
        assert rule["apiGroups"] == [group], rule
        rest = [r for r in rule["resources"] if r != resource]
        if rest:
            out.append({**rule, "resources": rest})
        verbs = [v for v in rule["verbs"] if v != verb]
        assert len(verbs) < len(rule["verbs"]), (verb, rule)
        if verbs:
            out.append({**rule, "resources": [resource], "verbs": verbs})
    return out


def tenant_rules(cluster: Cluster) -> list[Obj]:
    """The rules of the tenant's Role, as the plane made them."""
    first = cluster.tenant_namespaces[0]
    role = json.loads(kubectl("get", "role", TENANT_ROLE, "-n", first, "-o", "json"))
    return list(role["rules"])


def take_back(cluster: Cluster, ns: str) -> None:
    """The namespace deleted (not waited for)."""
    subprocess.run(
        ["kubectl", "--kubeconfig", cluster.kubeconfig, "delete", "namespace", ns,
         "--wait=false", "--ignore-not-found"],
        capture_output=True, timeout=120,
    )  # fmt: skip


@pytest.fixture
def tenant_ns(cluster: Cluster) -> Iterator[str]:
    """A namespace the tenant was given (its Role in it), deleted afterwards."""
    ns = f"sb-tenant-{uuid.uuid4().hex[:8]}"
    give_tenant(cluster, ns)
    try:
        yield ns
    finally:
        take_back(cluster, ns)


@pytest.fixture
def where(live: ClusterSnapshot, image: str, tenant_ns: str) -> Iterator[list[str]]:
    """--set arguments for tiny-pd on this cluster, in a namespace the tenant was given
    (tiny-mixed takes the same but `node`); afterwards nothing labelled by servebook is left
    there."""
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
    ns = tenant_ns
    yield [a for s in (f"image={image}", f"node={node}", f"namespace={ns}") for a in ("--set", s)]
    left = sb("status", "--backend", "kubernetes", "-n", ns, "--json", timeout=120)
    for found in json.loads(left.stdout or "[]"):
        sb("down", found["name"], "--backend", "kubernetes", "-n", ns, timeout=600)


# --- scenarios (test_scenarios.py) ----------------------------------------------------------
#
# These ran once against the stand-in API server (tests/unit/kube_standin.py) and once against
# the cluster, with one body; where the two disagreed the plane was right, and they now run on
# the cluster alone.  ``kube`` is what a scenario arranges as the cluster's administrator
# (kubectl); what the body does through servebook goes to the API server of the facade's
# ``kubeconfig`` (KUBECONFIG names it).

# A Pod's container: an HTTP server on the port it is given that answers "pod-answer PATH",
# and exits after answering /exit (its container then restarts); the node agent runs it.
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

    def __init__(self, cluster: Cluster, tmp: Path, admin: bool = False) -> None:
        # servebook talks as the tenant, in namespaces given to it, unless the test is
        # marked admin; the arrangements are kubectl's, the administrator's.
        self.kubeconfig = cluster.kubeconfig if admin else cluster.user
        self._cluster = cluster if not admin else None
        self._admin = cluster.kubeconfig
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
            if self._cluster is not None and self._cluster.tenant_namespaces:
                give_role(self._cluster, ns)
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
        admin = ["kubectl", "--kubeconfig", self._admin, "delete"]
        for ns in self._namespaces:
            subprocess.run(
                [*admin, "namespace", ns, "--wait=false", "--ignore-not-found"],
                capture_output=True, timeout=120,
            )  # fmt: skip
        for name in self._cluster_scoped:
            subprocess.run(
                [*admin, "clusterrolebinding,clusterrole", name, "--ignore-not-found"],
                capture_output=True, timeout=120,
            )  # fmt: skip


@pytest.fixture
def kube(
    request: pytest.FixtureRequest,
    cluster: Cluster,
    tmp_path: Path,
    sb_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Kube]:
    """The API server of a scenario: the cluster of the tests (as the tenant, in namespaces
    given to it, unless the test is marked admin); KUBECONFIG names it for the test and every
    servebook process it starts."""
    admin = request.node.get_closest_marker("admin") is not None
    made = PlaneKube(cluster, tmp_path, admin=admin)
    monkeypatch.setenv("KUBECONFIG", made.kubeconfig)
    try:
        yield made
    finally:
        made.close()
