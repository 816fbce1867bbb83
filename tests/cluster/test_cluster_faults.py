"""What went wrong in a cluster, on the real one (issue 43 point 3; these ran only on the
stand-in API server before): a Pod past its ``activeDeadlineSeconds``, load-Job agent Pods
that fail, cannot start or cannot be placed, a Ctrl-C deleting the load Job, an exec
plugin's credential that expires while calls are in flight, and a deployment found again
from its labels once ``SERVEBOOK_HOME`` is lost.

Cheap by design: no vLLM.  The deployment a bench loads is a Pod of a few lines of Python
(``ENGINE``) attached by label; the deployment found from labels is vllm-pd's objects, whose
engines are pinned to nodes the plane does not have (they stay Pending, nothing loads a
model).  The tests that kill a process, or sign a certificate with the plane's CA, run on
the test plane only: a cluster the user named is not theirs to do that to.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from servebook.backends.kubernetes import deployer as kube_backend
from servebook.kube import client as kube_client
from servebook.kube import load_job as lj
from servebook.kube.resources import list_objects
from servebook.preflight.probe_pod import ProbeTarget, container_phase, pod_manifest
from servebook.recipe.resolve import resolve
from tests.cluster.conftest import Cluster, kubectl, sb, until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

Obj = dict[str, Any]
VALUES = Path(__file__).parents[1] / "unit" / "fixtures" / "render" / "vllm-pd" / "values.yaml"


def _pod(ns: str, name: str) -> Obj:
    return dict(json.loads(kubectl("get", "pod", name, "-n", ns, "-o", "json")))


def _plane_only(cluster: Cluster) -> None:
    if not cluster.plane:
        pytest.skip("kills a Pod's process or signs with the cluster's CA: the test plane only")


# --- a Pod's activeDeadlineSeconds ------------------------------------------------------------


def test_pods_past_their_active_deadline_are_ended_by_the_kubelet(tenant_ns: str) -> None:
    """The kubelet ends a Pod once ``activeDeadlineSeconds`` have passed since its start,
    whether its container runs (killed) or never started (servebook's probe Pod, whose
    deadline is the backstop should servebook die, counts the pull and the mount too):
    Failed, reason DeadlineExceeded, which servebook's probe reads as done."""
    ns = tenant_ns
    api = kube_client.connect()
    absent = ProbeTarget(node="gpu-0", roles=("decode",), image="python:3.12-slim",
                         model_dir=f"/models/absent-{uuid.uuid4().hex[:6]}")  # fmt: skip
    probe = pod_manifest(absent, namespace=ns, deadline_s=1, pull_timeout_s=2, script="pass")
    sleeper: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sleeper", "namespace": ns},
        "spec": {
            "restartPolicy": "Always",
            "activeDeadlineSeconds": 3,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "600"]}],
        },
    }
    t0 = time.monotonic()
    for manifest in (probe, sleeper):
        kube_client.call(api, "POST", f"/api/v1/namespaces/{ns}/pods", "creating", body=manifest)
    name = str(probe["metadata"]["name"])

    def phase(pod: str) -> str:
        return str(_pod(ns, pod)["status"].get("phase"))

    until("the sleeper running", lambda: phase("sleeper") == "Running")
    until("both failed", lambda: phase(name) == phase("sleeper") == "Failed", 60)
    assert time.monotonic() - t0 >= 2.5, "ended before its deadline"
    for pod in (name, "sleeper"):
        status = _pod(ns, pod)["status"]
        assert status["reason"] == "DeadlineExceeded", status
        assert status["message"] == "Pod was active on the node longer than the specified deadline"
    (main,) = _pod(ns, "sleeper")["status"]["containerStatuses"]
    assert main["state"]["terminated"]["exitCode"] != 0 and main["restartCount"] == 0, main
    assert container_phase(_pod(ns, name)) == ("done", "DeadlineExceeded")
    events = kubectl("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")
    assert "FailedMount" in events and "DeadlineExceeded" in events, events


# --- the load Job's agent Pods ----------------------------------------------------------------

# A server of a few lines standing in for an engine: it lists one model and serves empty
# counters, and never answers a completion, so that a sweep against it waits.
ENGINE = """\
import http.server, json, sys, time
MODELS = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode()
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        body = MODELS if self.path.startswith("/v1/models") else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        time.sleep(3600)
http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
"""
TIER = "team.example.com/tier"
SWEEP = [
    *("--agents", "2", "--concurrency", "2", "--repetitions", "1", "--precision", "off"),
    *("--duration", "30s", "--warmup", "0s", "--input-len", "8", "--output-len", "4"),
]


def _engine(ns: str) -> None:
    """The team's engine, applied by the platform as plain objects: a Deployment of
    ``ENGINE`` and its Service ``chat``, rolled out."""
    labels = {TIER: "mixed"}
    container = {
        "name": "engine",
        "image": "python:3.12-slim",
        "command": ["python3", "-c", ENGINE, "8000"],
        "ports": [{"containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/v1/models", "port": 8000}, "periodSeconds": 1},
    }
    spec = {"terminationGracePeriodSeconds": 1, "containers": [container]}
    template = {"metadata": {"labels": labels}, "spec": spec}
    objs = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat"},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat"},
         "spec": {"selector": labels, "ports": [{"port": 8000, "targetPort": 8000}]}},
    ]  # fmt: skip
    kubectl("apply", "-n", ns, "-f", "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))  # fmt: skip
    kubectl("rollout", "status", "deployment/chat", "-n", ns, "--timeout=120s")


def _agents(job_prefix: str) -> list[tuple[str, int]]:
    """The load agents' processes of the Jobs named ``job_prefix``...: (their Pod's hostname,
    ``JOB-INDEX``, pid).  The node agent runs each Pod as a process on this machine."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        host = next((e[9:].decode() for e in env if e.startswith(b"HOSTNAME=")), "")
        if b"servebook.bench.in_cluster" in cmd and host.startswith(job_prefix):
            found.append((host, int(pid)))
    return found


def _kill_agent(job_prefix: str, index: int, after_s: float, killed: list[int]) -> None:
    """SIGKILL the load agent ``index``'s process once it has run ``after_s``, as the
    kernel's OOM killer ends a container."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not killed:
        for host, pid in _agents(job_prefix):
            if host.endswith(f"-{index}"):
                time.sleep(after_s)
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.2)


# servebook as a terminal's shell starts it: SIGINT at its default (a shell's background job,
# or the test runner, may hand it down ignored).
INTERRUPTIBLE = (
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "from servebook.cli import main\nmain()"
)
NO_SCHEDULE = "servebook.io/test-no-schedule"


def _interrupted_bench(name: str, out: Path) -> tuple[int, str]:
    """``bench NAME`` in the cluster, sent SIGINT (a Ctrl-C) once both agents' processes
    run; (its exit code, its stderr)."""
    argv = [sys.executable, "-c", INTERRUPTIBLE, "bench", name, *SWEEP, "-o", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        until("both agents running", lambda: len(_agents(f"{name}-bench-")) >= 2, 120)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def _left(ns: str) -> list[str]:
    api = kube_client.connect()
    return [
        f"{kind}/{o['metadata']['name']}"
        for kind in ("Job", "Pod", "ConfigMap", "Secret", "Service")
        for o in list_objects(api, kind, ns, lj.RUN_LABEL)
        if not o["metadata"].get("deletionTimestamp")
    ]


def test_load_agent_pods_that_fail_cannot_start_or_are_interrupted_end_the_bench_naming_why(
    cluster: Cluster, tenant_ns: str, sb_home: Path, tmp_path: Path
) -> None:
    """In the cluster, ``bench`` of an attached deployment: an agent Pod killed mid-sweep
    ends the bench with exit 1 naming the agent, its Pod and its exit code; a Ctrl-C while
    the agents run ends it with exit 130, the Job deleted and its Pods' processes ended;
    agents the scheduler cannot place (every node tainted) end it within
    --load-start-timeout in the scheduler's words; in a namespace whose Pod Security
    refuses the agents' Pods, it fails at once with the API server's words, not after
    --load-start-timeout.  Each time nothing of the Job is left."""
    _plane_only(cluster)
    ns = tenant_ns
    _engine(ns)
    name = f"kf{uuid.uuid4().hex[:6]}"
    r = sb("attach", name, "--backend", "kubernetes", "-n", ns, "--role", f"mixed={TIER}=mixed",
           "--entry", "svc/chat:8000", timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr

    killed: list[int] = []
    killer = threading.Thread(target=_kill_agent, args=(f"{name}-bench-", 1, 2.0, killed))
    killer.start()
    t0 = time.monotonic()
    r = sb("bench", name, *SWEEP, "-o", str(tmp_path / "killed"), timeout=240)
    took = time.monotonic() - t0
    killer.join(10)
    assert killed, r.stdout + r.stderr
    assert r.returncode == 1, r.stdout + r.stderr
    assert "a load agent's Pod failed: load agent 1, Pod " in r.stderr, r.stderr
    assert "container load terminated: Error, exit code 137" in r.stderr, r.stderr
    assert took < 90 and not (tmp_path / "killed" / "results.json").exists(), took
    until("the Job's objects gone", lambda: _left(ns) == [], 30)
    until("its agents' processes ended", lambda: _agents(f"{name}-bench-") == [], 60)

    code, err = _interrupted_bench(name, tmp_path / "interrupted")
    assert code == 130, err
    assert f"deleted Job/{name}-bench-" in err and f"stopped the in-cluster bench of {name}" in err
    assert not (tmp_path / "interrupted" / "results.json").exists()
    until("the Job's objects gone", lambda: _left(ns) == [], 60)
    until("its agents' processes ended", lambda: _agents(f"{name}-bench-") == [], 60)

    kubectl("taint", "nodes", "--all", f"{NO_SCHEDULE}=yes:NoSchedule")
    try:
        r = sb("bench", name, *SWEEP, "--load-start-timeout", "10",
               "-o", str(tmp_path / "unplaced"), timeout=240)  # fmt: skip
    finally:
        kubectl("taint", "nodes", "--all", f"{NO_SCHEDULE}:NoSchedule-")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the load agents' Pods were not all running within 10 s" in r.stderr, r.stderr
    assert "not scheduled: Unschedulable 0/" in r.stderr, r.stderr
    assert "node(s) had untolerated taint(s)" in r.stderr, r.stderr  # the scheduler's words
    until("the Job's objects gone", lambda: _left(ns) == [], 30)

    kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    t0 = time.monotonic()
    r = sb("bench", name, *SWEEP, "--load-start-timeout", "120", "-o", str(tmp_path / "refused"),
           timeout=240)  # fmt: skip
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"the cluster refused to create the load agents' Pods of Job/{name}-bench-" in r.stderr
    assert f'Error creating: pods "{name}-bench-' in r.stderr, r.stderr
    assert 'is forbidden: violates PodSecurity "restricted:latest"' in r.stderr, r.stderr
    assert took < 60, took
    until("the Job's objects gone", lambda: _left(ns) == [], 30)


# --- a credential that expires while calls are in flight --------------------------------------

# An exec credential plugin handing out client certificates signed by the plane's CA for the
# tenant (as Pinniped or Teleport hand out short-lived ones): the first run's certificate is
# valid for FIRST_S seconds, later ones for ten minutes; it counts its runs in a file.
PLUGIN = """\
import datetime as dt, json, pathlib, sys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
runs, pki, first_s = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), float(sys.argv[3])
n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
key = ec.generate_private_key(ec.SECP256R1())
now = dt.datetime.now(dt.UTC)
until = now + dt.timedelta(seconds=first_s if n == 1 else 600)
who = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "servebook-tenant"),
                 x509.NameAttribute(NameOID.ORGANIZATION_NAME, "servebook:tenants")])
cert = (x509.CertificateBuilder().subject_name(who).issuer_name(ca.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(until)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
        .sign(ca_key, hashes.SHA256()))
pem = serialization.Encoding.PEM
key_pem = key.private_bytes(pem, serialization.PrivateFormat.TraditionalOpenSSL,
                            serialization.NoEncryption())
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"clientCertificateData": cert.public_bytes(pem).decode(),
                             "clientKeyData": key_pem.decode(),
                             "expirationTimestamp": until.strftime("%Y-%m-%dT%H:%M:%SZ")}}))
"""
FIRST_S = 4
# The same plugin's part for a bearer token (as EKS's `aws eks get-token`): run N hands out
# the token in file N of its folder.
TOKEN_PLUGIN = """\
import json, pathlib, sys
runs, folder = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": (folder / str(n)).read_text().strip()}}))
"""


def _tokens_bound_to_secrets(ns: str, folder: Path) -> None:
    """Two tokens of a ServiceAccount bound to the tenant's Role in ``ns``, each bound to a
    Secret of its own (``kubectl create token --bound-object-kind Secret``), written to
    FOLDER/1 and FOLDER/2: deleting Secret ``t1`` ends token 1 (the API server refuses a
    bound token whose object is gone), as an expiry would."""
    subject = {"kind": "ServiceAccount", "name": "exec-user", "namespace": ns}
    objs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "exec-user"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "exec-user"}, "subjects": [subject],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"}},
        *({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"t{n}"}} for n in (1, 2)),
    ]  # fmt: skip
    kubectl("create", "-n", ns, "-f", "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))  # fmt: skip
    folder.mkdir()
    for n in (1, 2):
        token = kubectl("create", "token", "exec-user", "-n", ns, "--duration=10m",
                        "--bound-object-kind=Secret", f"--bound-object-name=t{n}")  # fmt: skip
        (folder / str(n)).write_text(token.strip())


def _answer(cfg: Obj, path: str, token: str) -> int:
    """The API server's status for GET ``path`` with bearer ``token`` (the kubeconfig's
    server and CA)."""
    cluster = cfg["clusters"][0]["cluster"]
    ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
    request = urllib.request.Request(
        cluster["server"] + path, headers={"Authorization": f"Bearer {token}"}
    )
    context = ssl.create_default_context(cadata=ca)
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(request, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


@pytest.mark.parametrize("credential", ["certificate", "token"])
def test_a_credential_that_expires_under_concurrent_calls_is_renewed_once_and_none_fails(
    cluster: Cluster, tenant_ns: str, tmp_path: Path, credential: str
) -> None:
    """The exec plugin's first credential ends while the client is in use (a certificate
    valid for FIRST_S seconds; a token whose bound Secret is deleted): the API server answers
    401 to every call made with it; the plugin runs once more, and every one of 64
    concurrent calls succeeds with the new credential (with a certificate, the client kept
    presenting the expired one before the fix, and all 64 failed)."""
    _plane_only(cluster)
    plugin, runs = tmp_path / "plugin.py", tmp_path / "runs"
    if credential == "certificate":
        plugin.write_text(PLUGIN)
        args = [str(Path(cluster.kubeconfig).parent / "pki"), str(FIRST_S)]
    else:
        plugin.write_text(TOKEN_PLUGIN)
        _tokens_bound_to_secrets(tenant_ns, tmp_path / "tokens")
        args = [str(tmp_path / "tokens")]
    cfg = yaml.safe_load(Path(cluster.user).read_text())
    cfg["users"][0]["user"] = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(plugin), str(runs), *args],
            "interactiveMode": "Never",
        }
    }
    path = tmp_path / "exec.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    issued = time.monotonic()
    api = kube_client.connect(str(path))
    assert runs.read_text() == "1"
    listing = f"/api/v1/namespaces/{tenant_ns}/configmaps"
    assert kube_client.send(api, "GET", listing, "before").code == 200
    if credential == "certificate":
        time.sleep(max(0.0, FIRST_S + 1.5 - (time.monotonic() - issued)))  # it has expired
    else:
        kubectl("delete", "secret", "t1", "-n", tenant_ns)
        token = (tmp_path / "tokens" / "1").read_text()
        until("token 1 refused", lambda: _answer(cfg, listing, token) == 401, 30)

    def one(i: int) -> str:
        try:
            kube_client.send(api, "GET", listing, f"listing {i}")
            return "ok"
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(64)))
    assert [r for r in results if r != "ok"] == []
    assert runs.read_text() == "2", "the plugin ran once for the credential that ended"


# --- a deployment found from its labels -------------------------------------------------------


def test_status_and_down_find_the_deployment_from_its_labels_when_servebook_home_is_lost(
    tenant_ns: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deployments of vllm-pd applied from one machine; from another (a SERVEBOOK_HOME
    with no record of them), as the tenant: `status` lists both and reads one back from its
    objects' labels, and `down` of one removes exactly its objects and keeps the namespace
    it did not create."""
    ns = tenant_ns
    monkeypatch.setenv("SERVEBOOK_HOME", str(tmp_path / "first-machine"))
    api = kube_backend._api()
    plan = resolve("vllm-pd", [f"namespace={ns}"], [VALUES])
    for name in ("a", "b"):
        kube_backend.apply_deployment(api, plan, name)
    lost = {"SERVEBOOK_HOME": str(tmp_path / "another-machine")}
    where = ("--backend", "kubernetes", "-n", ns)
    r = sb("status", *where, "--json", timeout=120, env=lost)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout) == [
        {"name": n, "namespace": ns, "recipe": "vllm-pd", "roles": ["prefill", "decode", "router"]}
        for n in ("a", "b")
    ], r.stdout
    # Its engines are pinned to nodes the plane does not have: not ready (exit 1), and
    # status says why in the scheduler's words.
    r = sb("status", "a", *where, "--json", timeout=120, env=lost)
    assert r.returncode == 1, r.stdout + r.stderr
    status = json.loads(r.stdout)
    assert status["namespace"] == ns and status["recipe"] == "vllm-pd", status
    assert [x["name"] for x in status["roles"]] == ["prefill", "decode", "router"], status
    prefill = status["roles"][0]
    assert not prefill["ok"] and "didn't match Pod's node affinity" in prefill["summary"], status
    assert status["entry"] == f"service/a-router port 8000 in namespace {ns}", status

    def names(deployment: str) -> list[str]:
        out = kubectl("get", "deployments,services", "-n", ns, "-l",
                      f"servebook.io/deployment={deployment}", "-o", "name")  # fmt: skip
        return out.split()

    assert len(names("a")) == len(names("b")) == 6
    r = sb("down", "b", *where, timeout=300, env=lost)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"Namespace/{ns}: kept (this deployment did not create it)" in r.stdout, r.stdout
    assert names("b") == [] and len(names("a")) == 6
    r = sb("status", *where, "--json", timeout=120, env=lost)
    assert [d["name"] for d in json.loads(r.stdout)] == ["a"], r.stdout + r.stderr
