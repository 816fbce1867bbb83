"""`servebook attach --backend kubernetes` over real HTTP: the stand-in API server
(tests/unit/kube_standin.py) holds each stack's Pods and Services (tests/unit/fixtures/
attach, shaped like that stack's), and relays each Pod's forwarded port to a local server
that says which Pod and port it stands for.  So what is pinned is what a cluster would
show: the stack is recognised with no selector given, the record names every replica,
and a later command reaches every replica's engine port (never its sidecar's) and the
entry through port-forwards servebook holds."""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from servebook import http
from servebook.backends.attached.place import AttachedBackend
from servebook.backends.attached.record import read_record
from servebook.commands.attach_kube import attach_kubernetes
from servebook.errors import UsageError
from tests.conftest import CliResult
from tests.unit.conftest import stack_objects
from tests.unit.kube_standin import Server, serve

Cli = Callable[..., CliResult]
# stack fixture -> (namespace, --entry when the stack's own is elsewhere)
STACKS = {
    "llm-d": ("llm-d", None),
    "dynamo": ("dynamo", None),
    "kserve": ("kserve-llm", None),
    "aibrix": ("aibrix", "svc/vllm-1p1d-gw:80"),
    "production-stack": ("prodstack", None),
    "ome": ("ome", None),
    "disaggregatedset": ("lws", "svc/tiny-dset-router:8000"),
}


class Listeners:
    """Local HTTP servers, one per (Pod, port), each answering who it stands for."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._runners: list[web.AppRunner] = []

    def add(self, who: str) -> int:
        async def start() -> int:
            async def answer(request: web.Request) -> web.Response:
                return web.Response(text=f"# {who} {request.path}\n")

            app = web.Application()
            app.router.add_get("/{tail:.*}", answer)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            await web.SockSite(runner, sock).start()
            self._runners.append(runner)
            return int(sock.getsockname()[1])

        return asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)

    def stop(self) -> None:
        async def stop() -> None:
            for r in self._runners:
                await r.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _ports(pod: dict[str, Any]) -> set[int]:
    """Every port a container of the Pod declares or is told to listen on."""
    found: set[int] = set()
    spec = pod["spec"]
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        found |= {int(p["containerPort"]) for p in c.get("ports", [])}
        words = [str(w) for w in c.get("command", []) + c.get("args", [])]
        text = " ".join(words)
        for flag in ("--port", "--port="):
            for part in text.split(flag)[1:]:
                head = part.strip(" =\"'").split()[0].strip("\"'\\")
                if head.isdigit():
                    found.add(int(head))
    return found | {9090, 8000}


@pytest.fixture
def cluster(
    tmp_path: Path, sb_home: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Server, Listeners]]:
    server = serve()
    listeners = Listeners()
    monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        yield server, listeners
    finally:
        listeners.stop()
        server.stop()


def _load(server: Server, listeners: Listeners, stack: str) -> None:
    objs = stack_objects(stack)
    items = [*objs.pods, *objs.services, *objs.deployments]
    if stack == "aibrix":  # a Service of the user's in front of the gateway, for --entry
        gw = copy.deepcopy(objs.pods[0])
        gw["metadata"] = {"name": "envoy-gw-0", "namespace": "aibrix", "labels": {"app": "gw"}}
        gw["spec"] = {"nodeName": "cpu-1", "containers": [{"name": "envoy", "ports": [
            {"containerPort": 10080}]}]}  # fmt: skip
        svc = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "vllm-1p1d-gw", "namespace": "aibrix"},
               "spec": {"clusterIP": "10.1.1.1", "selector": {"app": "gw"},
                        "ports": [{"name": "http", "port": 80, "targetPort": 10080}]}}  # fmt: skip
        items += [gw, svc]
    for pod in [i for i in items if i["kind"] == "Pod"]:
        name = pod["metadata"]["name"]
        for port in _ports(pod) | {10080}:
            server.standin.forward_to[f"pod/{name}:{port}"] = (
                "127.0.0.1",
                listeners.add(f"{name}:{port}"),
            )
    server.call(lambda st: [st.put(copy.deepcopy(i)) for i in items])


def _get(url: str) -> str:
    resp = http.get(url, timeout=10)
    assert resp.status == 200, url
    return resp.text


@pytest.mark.parametrize("stack", list(STACKS))
def test_attach_recognises_the_stack_and_reaches_every_replicas_engine_port(
    cluster: tuple[Server, Listeners], stack: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server, listeners = cluster
    _load(server, listeners, stack)
    ns, entry = STACKS[stack]
    attach_kubernetes("dep", ns, [], entry, None, dry_run=True, json_out=True)
    shown = json.loads(capsys.readouterr().out)
    assert shown["stack"] == stack and shown["recorded"] is False
    assert read_record("dep") is None  # a dry run records nothing
    assert "never against those operators on a real cluster" in shown["tested_on"]

    attach_kubernetes("dep", ns, [], entry, None, dry_run=False, json_out=False)
    assert "attached: dep" in capsys.readouterr().out
    dep = read_record("dep")
    assert dep is not None and dep.backend == "kubernetes" and dep.stack == stack
    want = {r["name"]: [p["pod"] for p in r["replicas"]] for r in shown["roles"]}
    assert {r.name: [p.pod for p in r.replicas] for r in dep.roles} == want

    with AttachedBackend().open("dep") as view:
        for role in view.engines:
            rec = dep.role(role.name)
            assert list(role.all_replica_names) == [p.pod for p in rec.replicas] or (
                len(rec.replicas) == 1 and role.all_replica_names == (role.name,)
            )
            for url, rep in zip(role.all_metrics_urls, rec.replicas, strict=True):
                # the forward lands on the Pod's engine port, never a sidecar's or router's
                body = _get(url.replace("https://", "http://") + "/metrics")
                assert body == f"# {rep.pod}:{rep.metrics_port} /metrics\n"
        entry_body = _get(view.entry_url.replace("https://", "http://") + "/health")
        assert dep.entry.startswith("svc/") and "/health" in entry_body
    if not any(rep.scheme == "https" for r in dep.roles for rep in r.replicas):
        status = AttachedBackend().status("dep")  # status reaches each role the same way
        assert [x["ok"] for x in status["roles"]] == [True] * len(status["roles"]), status


def test_decode_behind_llm_d_sidecar_is_forwarded_to_8200() -> None:
    objs = stack_objects("llm-d")
    from servebook.kube import stacks

    dep_roles = stacks.discover("llm-d", objs).roles
    assert {p.api.port for p in dep_roles[1].replicas} == {8200}


def test_an_unknown_labelling_is_exit_2_naming_the_flags_and_the_flags_attach_it(
    cluster: tuple[Server, Listeners], capsys: pytest.CaptureFixture[str]
) -> None:
    server, listeners = cluster
    _load(server, listeners, "in-house")
    with pytest.raises(UsageError) as e:
        attach_kubernetes("mine", "inhouse", [], None, None, dry_run=True, json_out=False)
    assert e.value.exit_code == 2
    assert "--role prefill=SELECTOR --role decode=SELECTOR --entry svc/NAME:PORT" in str(
        e.value.hint
    )
    roles = ["prefill=team.example.com/tier=prefill", "decode=team.example.com/tier=decode"]
    attach_kubernetes("mine", "inhouse", roles, "svc/chat:80", None, dry_run=False, json_out=False)
    dep = read_record("mine")
    assert dep is not None and dep.stack == "explicit" and dep.entry == "svc/chat:80"
    with AttachedBackend().open("mine") as view:
        assert (
            _get(view.role("decode").metrics_url + "/metrics") == "# chat-decode-0:9000 /metrics\n"
        )
        assert view.claims().speculative is True  # decode's dotted --speculative-config


def test_a_recorded_pod_that_is_gone_fails_naming_it(
    cluster: tuple[Server, Listeners], capsys: pytest.CaptureFixture[str]
) -> None:
    server, listeners = cluster
    _load(server, listeners, "llm-d")
    attach_kubernetes("gone", "llm-d", [], None, None, dry_run=False, json_out=False)
    victim = "ms-sim-llm-d-modelservice-decode-7c8b9d6f5-9zt7w"
    server.call(lambda st: st.objects.pop(("pods", "llm-d", victim)))
    with pytest.raises(UsageError) as e, AttachedBackend().open("gone"):
        pass
    assert victim in str(e.value) and "decode" in str(e.value)


def test_without_an_entry_the_record_is_refused_naming_the_flag(
    cluster: tuple[Server, Listeners],
) -> None:
    server, listeners = cluster
    _load(server, listeners, "disaggregatedset")
    with pytest.raises(UsageError) as e:
        attach_kubernetes("d", "lws", [], None, None, dry_run=False, json_out=False)
    assert "--entry svc/NAME:PORT" in f"{e.value} {e.value.hint}"
    assert read_record("d") is None


def test_the_command_line_dry_run_names_pods_ports_sidecar_and_what_is_not_known(
    cli: Cli, cluster: tuple[Server, Listeners]
) -> None:
    server, listeners = cluster
    _load(server, listeners, "llm-d")
    r = cli("attach", "web", "--backend", "kubernetes", "-n", "llm-d", "--dry-run")
    assert r.returncode == 0, r.stderr
    for pod in ("decode-7c8b9d6f5-4kq2m", "decode-7c8b9d6f5-9zt7w", "prefill-6d9f7c7b8-x2x9q"):
        assert pod in r.stdout
    assert "counters http://:8200/metrics" in r.stdout
    assert "routing-proxy on 8000 proxies to 8200" in r.stdout
    assert "kv_connector NixlConnector (kv_both)" in r.stdout
    assert "dry run: nothing recorded." in r.stdout
    assert "never against those operators on a real cluster" in r.stdout
    assert read_record("web") is None


def test_the_command_line_refuses_an_unknown_labelling_with_exit_2(
    cli: Cli, cluster: tuple[Server, Listeners]
) -> None:
    server, listeners = cluster
    _load(server, listeners, "in-house")
    r = cli("attach", "mine", "--backend", "kubernetes", "-n", "inhouse")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--role prefill=SELECTOR --role decode=SELECTOR --entry svc/NAME:PORT" in r.stderr
    r = cli("attach", "mine", "--backend", "kubernetes")
    assert r.returncode == 2 and "-n NS" in r.stderr, r.stderr


def test_help_says_it_has_not_run_against_the_operators(cli: Cli) -> None:
    r = cli("attach", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "never against those operators on a real cluster" in text
    assert "--backend kubernetes -n NS" in text
