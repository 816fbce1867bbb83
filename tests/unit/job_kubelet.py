"""The kubelet's part for an Indexed Job on the stand-in API server
(tests/unit/kube_standin.py), which runs no containers: ``Kubelet`` runs each Pod the
scheduler bound as a local process, as tests/unit/test_kube_bench_job.py's docstring
describes, and ``left_in`` lists what a bench left behind."""

from __future__ import annotations

import base64
import contextlib
import copy
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from servebook.kube import load_job as lj
from tests.unit.engine_standin import free_port
from tests.unit.kube_standin import Server

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


class Kubelet:
    """Runs the Job's Pods as local processes (the module docstring says how)."""

    def __init__(
        self,
        server: Server,
        root: Path,
        *,
        missing: tuple[str, ...] = (),
    ) -> None:
        self.server, self.root = server, root
        self.missing = missing  # modules the image lacks (an image without numpy)
        self.procs: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self.logs: dict[tuple[str, str], Path] = {}
        self.index: dict[tuple[str, str], int] = {}
        self.ended: dict[int, int] = {}  # completion index -> exit code
        self.stopped: list[str] = []  # Pods whose process was ended by their deletion
        self.images: dict[int, str] = {}  # completion index -> the image the Pod names
        self.envs: dict[int, dict[str, str]] = {}  # completion index -> its environment
        self.agent_port, self.results_port = free_port(), free_port()
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
        code = proc.poll()
        phase = (pod.get("status") or {}).get("phase")
        if code is not None and phase == "Running":
            self.ended[index] = code
            reason = "Completed" if code == 0 else "Error"
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


def left_in(server: Server, ns: str = NS) -> list[str]:
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
