"""Fixtures several unit-test modules share."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from aiohttp import web

from servebook import auth, redact
from servebook.bench.tokens import HFTokenizer, load_tokenizer
from servebook.kube import stacks
from servebook.models.tiny import tokenizer_files
from servebook.results.schema import (
    ClientEvidence,
    Latency,
    ModelInfo,
    Point,
    Provenance,
    WindowInfo,
)
from tests.conftest import CliResult
from tests.unit.cli_inprocess import run_cli
from tests.unit.kube_engines import Engine
from tests.unit.kube_standin import Kubelet, Server, serve
from tests.unit.preflight_standin import LLAMA_70B_BYTES, load_cluster, probe_output
from tests.unit.served_app import StreamingServer, served, served_models

# A recipe for the local backend only: every built-in recipe also runs on Kubernetes, so the
# Kubernetes commands' refusal of a local recipe needs one of its own.
LOCAL_ONLY_RECIPE = str(Path(__file__).parent / "fixtures" / "recipes" / "local-only.yaml")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's tokenizer files (tokenizer.json adds <s>, as vLLM counts it)."""
    d = tmp_path_factory.mktemp("tiny-tokenizer")
    for name, data in tokenizer_files().items():
        (d / name).write_bytes(data)
    return d


@pytest.fixture(scope="module")
def tok(tiny_dir: Path) -> HFTokenizer:
    return load_tokenizer(tiny_dir)


@pytest.fixture
def no_secrets_known(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No API key in the environment or given, and none remembered by the redactor (it
    remembers for the life of the process): what a test redacts, patterns alone find,
    unless the test hands servebook the key as a command does."""
    for name in auth.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(auth, "_given", None)
    redact.forget_all()
    yield
    redact.forget_all()


def needs_transformers() -> None:
    """Skip unless transformers is installed: a chat prompt is counted with the model's
    chat template, which transformers renders (vLLM installs it; the unit tests need no
    vLLM)."""
    pytest.importorskip("transformers", reason="chat templates are rendered by transformers")


# --- hostile input files (the reliability probe of 2026-12-04, tests/unit/test_cli_bad_files.py
# and test_inputs.py) -------------------------------------------------------------------

# A child process that reads /dev/zero without a bound stops at this much memory
# (MemoryError) instead of taking the machine's.
MEMORY_BOUND = [
    "import resource",
    "resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))",
]


@pytest.fixture
def cli(cli: Callable[..., CliResult], sb_home: Path) -> Callable[..., CliResult]:
    """``servebook ARGS`` as ``tests/conftest.py``'s ``cli`` runs it, in this process
    (``cli_inprocess``: a child's start, servebook imported again, cost about a second of
    CPU each); in a child still where a ``prelude`` must run first (a memory or file size
    bound, a patch) or ``process=True`` asks for one.  ``hide``: modules the command cannot
    import (``["vllm"]``: a check that slipped would end in "vLLM is not installed", never
    in an engine started), as a prelude ``sys.modules[name] = None`` hides them in a child."""
    child = cli

    def run(
        *args: str,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        prelude: Sequence[str] = (),
        process: bool = False,
        hide: Sequence[str] = (),
    ) -> CliResult:
        if prelude or process:
            hiding = ["import sys", *(f"sys.modules[{n!r}] = None" for n in hide)]
            return child(*args, env=env, timeout=timeout, prelude=[*hiding, *prelude])
        env = {"SERVEBOOK_HOME": str(sb_home), "COLUMNS": "200", **(env or {})}
        return run_cli(args, env, hide)

    return run


@pytest.fixture
def bounded_cli(cli: Callable[..., CliResult]) -> Callable[..., CliResult]:
    """``cli`` in a child bounded in memory (``MEMORY_BOUND``) and to 60 s: a read that
    hangs or never ends fails the test instead of holding the machine."""

    def run(*args: str, timeout: float = 60) -> CliResult:
        return cli(*args, timeout=timeout, prelude=MEMORY_BOUND)

    return run


def alias_bomb(levels: int = 9, indent: str = "  ") -> str:
    """YAML lines of anchors, each level aliasing the one before ten times: a few hundred
    bytes that expand to 10**(levels + 1) scalars."""
    lines = [f"{indent}a: &a [x, x, x, x, x, x, x, x, x, x]"]
    prev = "a"
    for i in range(levels):
        lines.append(f"{indent}l{i}: &l{i} [" + ", ".join([f"*{prev}"] * 10) + "]")
        prev = f"l{i}"
    return "\n".join(lines) + "\n"


def nested_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_yaml(depth: int) -> str:
    """Mappings ``depth`` levels deep (the probe's 3000 nested mappings), in flow style so
    that the text stays small."""
    return "k: " + "{k: " * depth + "v" + "}" * depth + "\n"


@pytest.fixture
def hostile(tmp_path: Path) -> Callable[[str, str], Path]:
    """``hostile(kind, name)``: a file ``name`` under a directory of its own, of ``kind``:
    fifo, dev-zero (a symlink to /dev/zero), latin1 (one byte that is not UTF-8), deep-json
    and deep-yaml (100,000 and 3,000 levels), bomb (a YAML alias bomb under a key)."""
    made = tmp_path / "hostile"
    made.mkdir(exist_ok=True)

    def make(kind: str, name: str) -> Path:
        p = made / name
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "dev-zero":
            p.symlink_to("/dev/zero")
        elif kind == "latin1":
            p.write_bytes(b"gpus: caf\xe9\n")
        elif kind == "deep-json":
            p.write_text(nested_json(100_000))
        elif kind == "deep-yaml":
            p.write_text(nested_yaml(3000))
        elif kind == "bomb":
            p.write_text(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata:\n" + alias_bomb()
            )
        else:
            raise ValueError(kind)
        return p

    return make


# --- results documents (tests of results ownership and write failures) ------------------


def a_provenance(**over: Any) -> Provenance:
    """A run's provenance as bench writes it, small."""
    base: dict[str, Any] = dict(
        servebook_version="0.1.0",
        engine="vllm",
        engine_version="0.32.0",
        model=ModelInfo(name="tiny", config_hash="sha256:abc"),
        protocol={"duration_s": 60},
        workload={"input_len": 64},
        seed=0,
        started_at="2026-01-01T00:00:00+00:00",
    )
    base.update(over)
    return Provenance(**base)


def a_point(
    conc: int = 4,
    rep: int = 0,
    tok_s: float = 10.0,
    *,
    p50: float = 1.0,
    valid: bool = True,
    **over: Any,
) -> Point:
    """A point at concurrency ``conc``, repetition ``rep``: ``tok_s`` output tokens a
    second, every latency ``p50`` ms, 10 requests in a 60 s window; an invalid one carries
    the reason SB402.  ``over`` replaces any other field."""
    lat = Latency(p50=p50, p90=p50, p99=p50, mean=p50, n=10)
    base: dict[str, Any] = dict(
        concurrency=conc,
        repetition=rep,
        valid=valid,
        invalid_reasons=[] if valid else ["SB402: too few"],
        requests_ok=10,
        errors=0,
        output_tokens_per_s=tok_s,
        requests_per_s=1.0,
        ttft_ms=lat,
        itl_ms=lat,
        tpot_ms=lat,
        e2e_ms=lat,
        window=WindowInfo(warmup_s=1, duration_s=60, requests_scheduled=10, requests_unfinished=0),
        client=ClientEvidence(workers=1, cpu_fraction=0.1, send_lag_p99_ms=0, loop_lag_p99_ms=0),
    )
    base.update(over)
    return Point(**base)


def a_measured_point(**over: Any) -> Point:
    """A valid point as bench measures one before its verdict: 100 requests at c=4 in a
    60 s window, latencies of a spread (p50 1, p90 2, p99 3 ms), the client well below
    saturation, and server evidence of a mixed role with a 90% handoff share."""
    lat = Latency(p50=1.0, p90=2.0, p99=3.0, mean=1.5, n=100)
    base: dict[str, Any] = dict(
        requests_ok=100,
        output_tokens_per_s=1000.0,
        requests_per_s=10.0,
        ttft_ms=lat,
        itl_ms=lat,
        tpot_ms=lat,
        e2e_ms=lat,
        window=WindowInfo(
            warmup_s=10, duration_s=60, requests_scheduled=104, requests_unfinished=4
        ),
        client=ClientEvidence(
            workers=1, cpu_fraction=0.3, send_lag_p99_ms=0.2, loop_lag_p99_ms=0.5
        ),
        server={"roles": {"mixed": {"scraped": True}}, "handoff_share": 0.9, "missing": []},
    )
    base.update(over)
    return a_point(**base)


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen[bytes]]:
    """A running process that is not this one (another run's pid)."""
    p = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        yield p
    finally:
        p.kill()
        p.wait(10)


def quick_bench(url: str, tiny_dir: Path, out: Path, *extra: str) -> list[str]:
    """``servebook bench`` arguments for a short sweep (c=1,2, one repetition, 1 s
    windows) against a stand-in server at ``url`` serving ``tiny``."""
    return [
        "bench", "--url", url, "--model", "tiny", "--tokenizer", str(tiny_dir),
        "--concurrency", "1,2", "--repetitions", "1", "--precision", "off", "--order", "ascending",
        "--duration", "1s", "--warmup", "2r", "--input-len", "16", "--output-len", "4",
        "--min-requests", "2", "--max-client-lag-ms", "1000",
        "--min-achieved-concurrency", "0.5", "-o", str(out), *extra,
    ]  # fmt: skip


def record_local(name: str, pid: int, url: str) -> Path:
    """A local deployment's record (``state.json``) of one role, mixed, run by ``pid`` at
    ``url``, as ``up`` writes it; returns its state directory.  Uses SERVEBOOK_HOME."""
    from servebook.backends import state

    sdir = state.state_dir_for(name)
    sdir.mkdir(parents=True)
    (sdir / "mixed.log").write_text("INFO started\n")
    port = int(url.rsplit(":", 1)[1])
    state.write_state(
        state.Deployment(
            name=name,
            recipe="tiny-mixed",
            state_dir=str(sdir),
            created="2026-01-01T00:00:00+00:00",
            served_model_name="tiny",
            entry_role="mixed",
            entry_url=url,
            roles=[
                state.RoleProcess(
                    name="mixed",
                    kind="engine",
                    pid=pid,
                    start_ticks=None,
                    port=port,
                    url=url,
                    log=str(sdir / "mixed.log"),
                    argv=["python", "-m", "vllm.entrypoints.openai.api_server"],
                    env={},
                )
            ],
        )
    )
    return sdir


def file_size_limit(n_bytes: int) -> list[str]:
    """Prelude lines for ``cli``: no file the child writes may grow past ``n_bytes`` (a
    write past it fails with EFBIG, as a full disk fails one with ENOSPC)."""
    return [
        "import resource, signal",
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)",
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({n_bytes}, {n_bytes}))",
    ]


# --- a scripted machine for experiments (tests/unit/test_experiment*.py) -----------------

# One process serving every arm of a simulated machine.  Each arm is an engine loop, as a
# batching engine is: every step it sends one token to each request in flight, and a step
# takes ``loaded`` ms once ``loaded_from`` requests are in flight, ``alone`` ms below that
# (a step, not a slope: between two requests of a closed loop at c, c - 1 are in flight),
# divided by the machine's speed, ``1 - slope * (seconds since the last POST /reset)``
# (throughput falls linearly in time; at least 0.2), shared by every arm.  Steps are due
# on the clock (the loop's lateness does not add up), and a request that arrives joins at
# the next step: the true tok/s ratio of two arms at a level is the inverse of their step
# times there (less the gap between one request and the next, ~1 ms on a quiet machine, up
# to ~8 ms on a busy one, which is why a request is 8 steps and not 1).  A process of its
# own, so that the load generator under test does not share its GIL.
_MACHINE = """
import asyncio, json, sys, time
from aiohttp import web
cfg = json.loads(sys.argv[1])
t0 = [time.monotonic()]
def slowdown():
    speed = max(0.2, 1.0 - cfg["slope"] * (time.monotonic() - t0[0]))
    return 1.0 / speed
def app(alone, loaded, loaded_from):
    active = []
    wake = asyncio.Event()
    async def engine():
        due = time.monotonic()
        while True:
            if not active:
                wake.clear()
                await wake.wait()
                due = time.monotonic()
            step = loaded if len(active) >= loaded_from else alone
            due += step * slowdown() / 1000
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            for q in list(active):
                q.put_nowait(1)
    async def models(_r):
        card = {"id": "tiny", "object": "model", "owned_by": "vllm", "max_model_len": 2048}
        return web.json_response({"object": "list", "data": [card]})
    async def reset(_r):
        t0[0] = time.monotonic()
        return web.json_response({})
    async def completions(request):
        body = await request.json()
        n = int(body.get("max_tokens", 8))
        q = asyncio.Queue()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        active.append(q)
        wake.set()
        try:
            for _ in range(n):
                await q.get()
                chunk = {"choices": [{"index": 0, "text": "a", "finish_reason": None}]}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\\n\\n")
            active.remove(q)
            usage = {"prompt_tokens": cfg["prompt_tokens"], "completion_tokens": n}
            chunk = {"choices": [], "usage": usage}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\\n\\n")
            await resp.write(b"data: [DONE]\\n\\n")
        except ConnectionError:
            pass
        finally:
            if q in active:
                active.remove(q)
        return resp
    async def start(_app):
        _app["engine"] = asyncio.get_running_loop().create_task(engine())
    w = web.Application()
    w.on_startup.append(start)
    w.router.add_get("/v1/models", models)
    w.router.add_post("/reset", reset)
    w.router.add_post("/v1/completions", completions)
    return w
async def main():
    for arm, port in zip(cfg["arms"], cfg["ports"]):
        runner = web.AppRunner(app(*arm), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


# An experiment's load: points short enough for a unit test against scripted_machine's
# arms (the tests of tests/unit/test_experiment*.py).
QUICK_LOAD = {
    "concurrency": [2],
    "output-len": 4,
    "warmup": "50ms",
    "duration": "200ms",
    "repetitions": 1,
    "precision": "off",
    "min-requests": 2,
    "max-client-lag-ms": 1000,
    "min-achieved-concurrency": 0.5,
}


@contextlib.contextmanager
def scripted_machine(
    arms: list[tuple[float, float, int]], slope_per_s: float, prompt_tokens: int
) -> Iterator[tuple[list[str], Callable[[], None]]]:
    """Servers of the arms ``[(alone, loaded, loaded_from), ...]`` (ms a step, times the
    machine's speed) on one simulated machine whose speed falls by ``slope_per_s`` each
    second since ``reset()``; a text prompt counts ``prompt_tokens``.  Yields the arms'
    base URLs and ``reset``."""
    import json
    import urllib.request

    from tests.unit.engine_standin import free_port

    ports = [free_port() for _ in arms]
    cfg = {"arms": arms, "ports": ports, "slope": slope_per_s, "prompt_tokens": prompt_tokens}
    proc = subprocess.Popen(
        [sys.executable, "-c", _MACHINE, json.dumps(cfg)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        urls = [f"http://127.0.0.1:{p}" for p in ports]

        def reset() -> None:
            urllib.request.urlopen(urllib.request.Request(urls[0] + "/reset", method="POST"))

        yield urls, reset
    finally:
        proc.terminate()
        proc.wait(10)


# --- a fake place (issue 34): a Deployer over the scripted engine ---------------------------


class FakePlace:
    """A ``backends.base.Deployer`` over the scripted engine (``engine_standin``): ``up``
    starts one stand-in vLLM server for the plan's entry role, ``open`` yields its view
    (``deployment.reach.build``, route direct), ``down`` stops it.  ``calls`` says what
    was asked of it, in order, so ``pipeline.run`` is tested without vLLM or a cluster."""

    name = "fake"
    title = "a fake place"
    recipes_hint = "any recipe"
    up_cost = "nothing"
    loads_here = True

    def __init__(self, **engine: Any) -> None:
        self.engine = engine
        self.calls: list[str] = []
        self.up_: dict[str, tuple[contextlib.ExitStack, str, Any]] = {}

    def recorded(self) -> list[str]:
        return sorted(self.up_)

    def has(self, name: str) -> bool:
        return name in self.up_

    def found(self, namespace: str | None = None) -> list[Any]:
        return []

    def preflight(self, plan: Any) -> list[Any]:
        self.calls.append("preflight")
        return []

    def up(
        self, plan: Any, *, name: str, timeout_s: float | None, say: Any, port: Any = None
    ) -> Any:
        from servebook.backends.base import Ready
        from tests.unit.engine_standin import scripted_engine

        self.calls.append(f"up {name}")
        stack = contextlib.ExitStack()
        url, _ = stack.enter_context(scripted_engine(**self.engine))
        self.up_[name] = (stack, url, plan)
        return Ready(name, f"ready at {url}")

    def status(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        return {"name": name, "backend": self.name, "roles": []}

    def down(self, name: str, namespace: str | None = None) -> Any:
        from servebook.backends.base import Down

        self.calls.append(f"down {name}")
        stack, _, _ = self.up_.pop(name)
        stack.close()
        return Down(name, {"engine": "stopped"})

    @contextlib.contextmanager
    def open(self, name: str, namespace: str | None = None) -> Iterator[Any]:
        from servebook.deployment.reach import (
            Address,
            Reach,
            Record,
            ReplicaRecord,
            RoleRecord,
            build,
        )

        self.calls.append(f"open {name}")
        _, url, plan = self.up_[name]
        role = plan.role(plan.entry_role)
        record = Record(
            name,
            self.name,
            plan.recipe,
            plan,
            plan.served_model_name,
            [RoleRecord(role.name, role.kind, [ReplicaRecord(role.name, ["vllm", "serve"])])],
            entry_role=role.name,
        )
        yield build(record, Reach("direct", {role.name: [Address(url)]}))

    def load_site(self, name: str, namespace: str | None = None) -> Any:
        from servebook.deployment.site import Here

        self.calls.append(f"load_site {name}")
        return Here()


@pytest.fixture
def fake_place() -> Iterator[Callable[..., FakePlace]]:
    """``FakePlace(**scripted_engine options)``; every engine it started is stopped after."""
    made: list[FakePlace] = []

    def make(**engine: Any) -> FakePlace:
        made.append(FakePlace(**engine))
        return made[-1]

    yield make
    for place in made:
        for stack, _, _ in place.up_.values():
            stack.close()


# --- a streaming server (the bench client's tests) --------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, StreamingServer]]:
    """A ``StreamingServer`` on the completions and chat routes, serving ``tiny``; one per
    test module."""
    srv = StreamingServer()
    app = web.Application()
    app.router.add_post("/v1/completions", srv.handle)
    app.router.add_post("/v1/chat/completions", srv.handle)
    app.router.add_get("/v1/models", served_models("tiny"))
    with served(app) as url:
        yield url, srv


# --- live preflight on the stand-in API server (test_preflight_live.py, _rbac.py) -----------


@pytest.fixture
def preflight_cluster(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    """The stand-in holding ``fixtures/preflight/healthy.json``, whose probe Pods report a
    70B model's weights; yields the server and its kubeconfig."""
    server = serve()
    load_cluster(server)
    server.standin.kubelet = Kubelet(logs=probe_output(LLAMA_70B_BYTES))
    try:
        yield server, server.write_kubeconfig(tmp_path / "kubeconfig")
    finally:
        server.stop()


# --- a Kubernetes deployment on the stand-in API server (test_kube_*.py, test_load_job.py) ---


@pytest.fixture
def kube_cluster(
    tmp_path: Path, sb_home: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Server, dict[str, str]]]:
    """The stand-in API server, its Pods Ready at once, forwarding each role's port to a
    stand-in ``Engine``; yields the server and the environment naming its kubeconfig
    (KUBECONFIG is set in this process too)."""
    server = serve()
    server.standin.ready_pods = True
    engines = {role: Engine(role).start() for role in ("prefill", "decode", "router")}
    for role, e in engines.items():
        server.standin.forward_to[f"{role}:8000"] = ("127.0.0.1", e.port)
    # The router's Prometheus port: its counters are not read by verify or bench.
    server.standin.forward_to["router:29000"] = ("127.0.0.1", engines["router"].port)
    cfg = server.write_kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    try:
        yield server, {"KUBECONFIG": str(cfg)}
    finally:
        for e in engines.values():
            e.stop()
        server.stop()


# --- what the in-cluster load may import, and a CLI child that takes signals as a terminal's ---

#: What an agent imports beyond the standard library and servebook: numpy, needed; orjson
#: and uvloop, used when present (each has a standard-library fallback).  vLLM's image has
#: numpy (a dependency of vllm itself), so an agent runs in the engine's own image.
AGENT_NEEDS = {"numpy"}
AGENT_MAY_USE = {"orjson", "uvloop"}


def time_namespaces() -> bool:
    """Whether this machine lets an unprivileged process start in a time namespace."""
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(
        ["unshare", "-rT", "--monotonic", "1000", "true"], capture_output=True, check=False
    )
    return done.returncode == 0


def assert_union_percentiles(point: Point, counted: list[dict[str, Any]]) -> None:
    """The point's TTFT and ITL percentiles are those of the saved requests' union (ITL by
    the records' rule: chunk gaps, and a zero for each token beyond a chunk's first)."""
    ttft = [(q["first_token_ns"] - q["sent_ns"]) / 1e6 for q in counted]
    gaps = [
        np.concatenate([np.diff(q["chunk_ns"]), np.zeros(q["output_tokens"] - len(q["chunk_ns"]))])
        for q in counted
    ]
    itl = np.concatenate(gaps) / 1e6
    # Where the point's stream burst, its headline ITL is the engine's histogram (issue 24
    # point 1) and the client's own figure, the one the records give, is kept beside it.
    client_itl = point.client_latency.get("itl_ms", point.itl_ms)
    assert ("itl_ms" in point.client_latency) == point.latency_source.get("itl_ms", "").startswith(
        "server"
    )
    for q in (50, 90, 99):
        assert getattr(point.ttft_ms, f"p{q}") == pytest.approx(float(np.percentile(ttft, q)))
        assert getattr(client_itl, f"p{q}") == pytest.approx(float(np.percentile(itl, q)))


# The CLI as a terminal's shell starts a command: SIGINT, SIGTERM and SIGHUP at their
# defaults (a shell's background job, or this test's own runner, may hand them down ignored).
START = (
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "signal.signal(signal.SIGTERM, signal.SIG_DFL); signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
    "from servebook.cli import main\nmain()"
)


def requirement_closure(dist: str) -> set[str]:
    """Distribution names ``dist`` needs, transitively (the extras a requirement names
    followed, markers evaluated for this machine); the test skips where ``dist`` is not
    installed (the unit tests run without vLLM), since its requirements are read from its
    installed metadata."""
    from packaging.requirements import Requirement

    try:
        metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{dist} is not installed: what its image holds is read from its metadata")

    def canon(name: str) -> str:
        return name.lower().replace("_", "-")

    done: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str]]] = [(dist, frozenset())]
    while todo:
        name, extras = todo.pop()
        if (canon(name), extras) in done:
            continue
        done.add((canon(name), extras))
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in reqs:
            req = Requirement(text)
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(e) for e in envs):
                todo.append((req.name, frozenset(req.extras)))
    return {n for n, _ in done}


# --- the attached stacks' objects (fixtures/attach) ---------------------------------------

ATTACH_FIX = Path(__file__).parent / "fixtures" / "attach"


def stack_objects(name: str) -> stacks.Objects:
    """The Pods, Services and Deployments of ``fixtures/attach/NAME.yaml``: one stack's
    objects as its operator makes them."""
    items: list[dict[str, Any]] = yaml.safe_load((ATTACH_FIX / f"{name}.yaml").read_text())["items"]
    by = {k: [i for i in items if i["kind"] == k] for k in ("Pod", "Service", "Deployment")}
    return stacks.Objects(by["Pod"], by["Service"], by["Deployment"])
