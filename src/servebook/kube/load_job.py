"""The in-cluster load of `servebook bench NAME` on Kubernetes: the objects that run the
load agents next to the engines (plain data in, plain dicts out; ``backends/kubernetes/job_site``
creates them, waits for them, fetches their results and deletes them, and `bench
--dry-run -o DIR` writes them).

**Where the coordinator runs: in the cluster, in the Job's Pod of index 0.**  Agents in
the cluster cannot dial the bench machine (it is behind the API server, often behind NAT),
and what the coordinator does is part of the measurement: it opens and closes each point's
window on the agents' clock, scrapes the engines' ``/metrics`` at both edges (server
evidence, SB40x) and judges validity.  Run from the bench machine, those scrapes would
cross a port-forward and land on another clock than the load's.  So the whole protocol
(``servebook.bench.sweep.run_bench``: sweep, windows, validity, per-point scrapes of every
engine Pod by its Pod IP) runs in Pod 0 (``bench/in_cluster.py``), which also runs agent 0
as a process beside it; Pods 1..N-1 are agents that dial Pod 0 by its stable name
``JOB-0.SERVICE`` (an Indexed Job's Pods are named by index under the headless Service
named in ``subdomain``), with the one-time token from a Secret.  The load goes to the
entry Service by its cluster DNS name (``SERVICE.NAMESPACE.svc``); each engine's counters
are read at its Pod IP, as Prometheus reads them.

**Results come back as files, never from logs.**  When the sweep ends, Pod 0 serves its
output directory (results.json, and requests/ with ``--save-requests``) on a small HTTP
endpoint of its own (``RESULTS_PORT``); the bench machine reads it through one
port-forward to that port, then tells it to end.  Logs are read only to explain a failure.

**What reaches the Pods.**  The image is the deployment's own engine image (it has Python
and every library the protocol needs: ``tests/unit/test_load_job.py`` and
``test_kube_bench_job.py`` prove that against vLLM's declared requirements) or
``--load-image``.  servebook's code travels as one zip
archive in a ConfigMap (``binaryData``), mounted read-only and put on ``PYTHONPATH``
(Python imports from a zip; the whole package is 4x smaller zipped and fits the 1 MiB an
object may hold), beside the run's settings (``bench.json``: the deployment's roles with
their cluster addresses, the protocol's flags).  The Pods get no Kubernetes API access
(``automountServiceAccountToken: false``, no ServiceAccount or Role): nothing in them needs
the API.  The headless Service exists only when there is more than one agent.

**Bounded.**  ``backoffLimit: 0`` (a failed agent is a failed bench, never a retry that
makes a different load), ``activeDeadlineSeconds`` and ``ttlSecondsAfterFinished`` so a
Job whose bench machine vanished does not load the engines or stay forever.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from servebook.errors import UsageError
from servebook.kube.names import MANAGED_BY, MANAGED_BY_LABEL, name_errors

Obj = dict[str, Any]

AGENT_PORT = 7470  # Pod 0's coordinator, which agents 1..N-1 dial
RESULTS_PORT = 7471  # Pod 0's results endpoint, read once through a port-forward
CODE_MOUNT = "/opt/servebook"
CODE_KEY = "servebook.zip"
SPEC_KEY = "bench.json"
SCRATCH = "/scratch"  # an emptyDir: the results and servebook's home in the Pod
TOKEN_KEY = "token"
API_KEY_KEY = "api-key"  # the Secret's entry for an API key given on the bench machine
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
BENCH_OF_LABEL = "servebook.io/bench-of"  # not servebook.io/deployment: not a role's
RUN_LABEL = "servebook.io/bench-run"
ENTRY_MODULE = "servebook.bench.in_cluster"
# A Job left behind by a bench machine that vanished: it ends after this long ...
ACTIVE_DEADLINE_S = 24 * 3600
# ... and is deleted this long after it finished.
TTL_AFTER_FINISHED_S = 3600
CONFIGMAP_MAX = 1024 * 1024  # what etcd lets one object hold (the API server's limit)
AGENT_REQUESTS = {"cpu": "1", "memory": "1Gi"}
AGENT_LIMITS = {"memory": "4Gi"}
# The kinds ``load_objects`` creates (apiVersion, kind): what preflight's access review asks
# for on bench's behalf before any Job exists (tests/unit/test_load_job.py holds them equal).
LOAD_KINDS = (("v1", "Secret"), ("v1", "ConfigMap"), ("v1", "Service"), ("batch/v1", "Job"))


@dataclass
class LoadJob:
    """What the objects are made from."""

    deployment: str
    namespace: str
    run: str  # a short id: two benches of one deployment do not collide
    image: str
    agents: int
    settings: Obj  # bench.json: what Pod 0 runs (``bench/in_cluster.py``)
    token: str
    # An API key given on the bench machine: it travels in the Job's Secret and the Pods
    # read it as VLLM_API_KEY ("" leaves the entry empty: a --dry-run writes no key).
    api_key: str | None = None
    api_key_env: list[Obj] = field(default_factory=list)  # else: the engines' own Secret refs
    tolerations: list[Obj] = field(default_factory=list)
    image_pull_secrets: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The Job's name, the headless Service's, and the stem of the others'."""
        return f"{self.deployment}-bench-{self.run}"

    @property
    def service(self) -> str:
        return self.name

    @property
    def configmap(self) -> str:
        return f"{self.name}-code"

    @property
    def secret(self) -> str:
        return f"{self.name}-token"

    def pod_host(self, index: int) -> str:
        """Pod ``index``'s name in the cluster's DNS (under the headless Service)."""
        return f"{self.name}-{index}.{self.service}"

    def labels(self) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": "servebook-bench",
            "app.kubernetes.io/instance": self.deployment,
            "app.kubernetes.io/component": "load-agent",
            MANAGED_BY_LABEL: MANAGED_BY,
            BENCH_OF_LABEL: self.deployment,
            RUN_LABEL: self.run,
        }

    def selector(self) -> str:
        return f"{BENCH_OF_LABEL}={self.deployment},{RUN_LABEL}={self.run}"


def code_archive(root: Path | None = None) -> bytes:
    """The part of servebook's package the load Job's Pods run, as a zip (``python -m
    servebook.bench.in_cluster`` works with it on ``PYTHONPATH``): the modules
    ``ENTRY_MODULE`` imports, directly or through others, lazily or not, with their
    packages' ``__init__`` and the data files beside them; in sorted order with fixed times,
    so one version of servebook makes one archive (its hash names it in the Job).  The
    whole package no longer fitted a ConfigMap (1 MiB) with room to spare."""
    base = root or Path(str(resources.files("servebook")))
    files = _closure(base, ENTRY_MODULE)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for path in sorted(files):
            rel = path.relative_to(base)
            info = zipfile.ZipInfo(f"servebook/{rel.as_posix()}", (1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, path.read_bytes())
    return buf.getvalue()


def _module_file(base: Path, module: str) -> Path | None:
    """The file of ``servebook.X.Y`` under ``base`` (a module or a package), if any."""
    rel = Path(*module.split(".")[1:])
    if rel == Path():
        return base / "__init__.py"
    for candidate in (base / rel.with_suffix(".py"), base / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


#: A source file's servebook imports by the SHA-256 of its bytes: parsing and walking the
#: ~70 files of the closure took ~0.3 s of CPU a bench, each time a process (a test worker
#: running bench in-cluster many times) made the same archive again.
_IMPORTS: dict[bytes, frozenset[str]] = {}


def _imported(path: Path) -> set[str]:
    """Every ``servebook`` module ``path`` names in an import statement, anywhere in it."""
    data = path.read_bytes()
    key = hashlib.sha256(data).digest()
    known = _IMPORTS.get(key)
    if known is None:
        known = _IMPORTS[key] = frozenset(_parse_imports(data, path))
    return set(known)


def _parse_imports(data: bytes, path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(data, str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "servebook"}
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "servebook"
        ):
            # ``from servebook.x import y``: y may be a module of the package x
            found |= {str(node.module), *(f"{node.module}.{a.name}" for a in node.names)}
    return found


def _closure(base: Path, entry: str) -> set[Path]:
    files: set[Path] = set()
    todo = [entry]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # its packages
        path = _module_file(base, module)
        if path is None or path in files:
            continue
        files.add(path)
        todo += sorted(_imported(path))
        if path.name == "__init__.py":  # a package's data files (catalogs, templates)
            files |= {
                p for p in path.parent.iterdir() if p.is_file() and p.suffix not in (".py", ".pyc")
            }
    return files


def _meta(job: LoadJob, name: str) -> Obj:
    return {"name": name, "namespace": job.namespace, "labels": job.labels()}


def load_objects(job: LoadJob, code: bytes) -> list[Obj]:
    """The objects, in the order they are created: the Secret and the ConfigMap the Pods
    mount, the headless Service their names live under (more than one agent), the Job."""
    _check(job, code)
    digest = hashlib.sha256(code).hexdigest()
    objects: list[Obj] = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": _meta(job, job.secret),
            "type": "Opaque",
            "stringData": {
                TOKEN_KEY: job.token,
                **({API_KEY_KEY: job.api_key} if job.api_key is not None else {}),
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                **_meta(job, job.configmap),
                "annotations": {"servebook.io/code-sha256": digest},
            },
            "data": {SPEC_KEY: json.dumps(job.settings, indent=1, sort_keys=True) + "\n"},
            "binaryData": {CODE_KEY: base64.b64encode(code).decode("ascii")},
        },
    ]
    if job.agents > 1:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": _meta(job, job.service),
                "spec": {
                    "clusterIP": "None",
                    # Agents dial Pod 0 before anything is Ready (no probe: a load agent
                    # has nothing to be ready for), so its name must resolve at once.
                    "publishNotReadyAddresses": True,
                    "selector": {BENCH_OF_LABEL: job.deployment, RUN_LABEL: job.run},
                    "ports": [{"name": "agents", "port": AGENT_PORT, "targetPort": "agents"}],
                },
            }
        )
    objects.append(_job(job, digest))
    return objects


def _job(job: LoadJob, digest: str) -> Obj:
    env: list[Obj] = [
        {"name": "PYTHONPATH", "value": f"{CODE_MOUNT}/{CODE_KEY}"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "SERVEBOOK_HOME", "value": f"{SCRATCH}/home"},
        {"name": "SERVEBOOK_OUT", "value": f"{SCRATCH}/out"},
        {
            "name": "SERVEBOOK_AGENT_INDEX",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}},
        },
        {
            "name": "SERVEBOOK_AGENT_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": job.secret, "key": TOKEN_KEY}},
        },
        {"name": "SERVEBOOK_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        *(
            job.api_key_env
            if job.api_key is None
            else [
                {
                    "name": "VLLM_API_KEY",
                    "valueFrom": {"secretKeyRef": {"name": job.secret, "key": API_KEY_KEY}},
                }
            ]
        ),
    ]
    container: Obj = {
        "name": "load",
        "image": job.image,
        "command": ["python3", "-m", ENTRY_MODULE, "--settings", f"{CODE_MOUNT}/{SPEC_KEY}"],
        "env": env,
        "ports": [
            {"name": "agents", "containerPort": AGENT_PORT, "protocol": "TCP"},
            {"name": "results", "containerPort": RESULTS_PORT, "protocol": "TCP"},
        ],
        "resources": {"requests": dict(AGENT_REQUESTS), "limits": dict(AGENT_LIMITS)},
        # Ready means "the results are served": only Pod 0 ever is (the others are agents,
        # which serve nothing); the bench machine waits for exactly that.
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "results"},
            "periodSeconds": 2,
            "timeoutSeconds": 5,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "code", "mountPath": CODE_MOUNT, "readOnly": True},
            {"name": "scratch", "mountPath": SCRATCH},
        ],
    }
    pod: Obj = {
        "restartPolicy": "Never",
        # Nothing in the Pod calls the Kubernetes API: it gets no credentials for it.
        "automountServiceAccountToken": False,
        # No Service environment variables: a Service named vllm-* would inject VLLM_*
        # variables that vLLM's own modules (imported by nothing here, but present) read.
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [
            {"name": "code", "configMap": {"name": job.configmap}},
            {"name": "scratch", "emptyDir": {}},
        ],
    }
    if job.agents > 1:
        pod["subdomain"] = job.service
    if job.tolerations:
        pod["tolerations"] = job.tolerations
    if job.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in job.image_pull_secrets]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(job, job.name),
        "spec": {
            "completionMode": "Indexed",
            "completions": job.agents,
            "parallelism": job.agents,
            "backoffLimit": 0,
            "activeDeadlineSeconds": ACTIVE_DEADLINE_S,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "template": {
                "metadata": {
                    "labels": job.labels(),
                    "annotations": {"servebook.io/code-sha256": digest},
                },
                "spec": pod,
            },
        },
    }


def _check(job: LoadJob, code: bytes) -> None:
    """Refuse (exit 2) what the API server would refuse half-way through the creates."""
    if job.agents < 1:
        raise UsageError(f"--agents {job.agents}: give at least 1")
    problems = []
    # A Pod of an Indexed Job is named JOB-INDEX-RANDOM and its hostname JOB-INDEX: a
    # DNS label, so at most 63 characters with the largest index.
    host = f"{job.name}-{job.agents - 1}"
    for text, rule, why in (
        (job.name, "dns1035", f"the name of Job/Service {job.name}"),
        (host, "dns1123-label", f"the hostname of the Job's last Pod, {host}"),
        (job.deployment, "label-value", f"the value of label {BENCH_OF_LABEL}"),
    ):
        problems += [f"{why}: {e}" for e in name_errors(text, rule)]
    if problems:
        raise UsageError(
            f"deployment {job.deployment}: the in-cluster load's names would be refused by "
            "the API server; nothing was created: " + "; ".join(problems),
            hint="Benchmark it with --via port-forward, or give the deployment a shorter name.",
        )
    size = len(base64.b64encode(code)) + len(json.dumps(job.settings))
    if size > CONFIGMAP_MAX:
        raise UsageError(
            f"ConfigMap/{job.configmap}: servebook's code and settings take {size} bytes, "
            f"more than the {CONFIGMAP_MAX} one object may hold; nothing was created.",
            hint="Benchmark it with --via port-forward.",
        )


__all__ = [
    "AGENT_PORT",
    "CODE_KEY",
    "RESULTS_PORT",
    "SPEC_KEY",
    "LoadJob",
    "code_archive",
    "load_objects",
]
