"""`servebook attach` by URL on deployments servebook did not make: prefill and decode
started by hand as plain `python -m vllm.entrypoints.openai.api_server` processes behind
vllm-router (not through `up`), attached, verified and benched; the same with decode
started without a connector fails SB302 naming decode; one plain vLLM server with ngram
speculation.  Each test stops exactly the processes it started."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from servebook import http
from servebook.backends.local import deployer as local
from servebook.engines import vllm
from servebook.recipe.resolve import resolve
from servebook.results.schema import RESULTS_NAME
from servebook.results.store import load_results
from tests.engine.conftest import SWEEP
from tests.unit.engine_standin import free_port

pytestmark = pytest.mark.engine

HOST = "127.0.0.1"


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servebook", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def _wait(url: str, path: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{url} exited: {log.read_text()[-3000:]}"
        with contextlib.suppress(http.HTTPError):
            if http.get(url + path, timeout=2.0).status == 200:
                return
        time.sleep(1.0)
    raise AssertionError(
        f"{url}{path} did not answer in {timeout:.0f} s: {log.read_text()[-3000:]}"
    )


@contextlib.contextmanager
def started(
    argv: Sequence[str], log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """One process in a session of its own, stopped with its group afterwards."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _without_connector(args: list[str]) -> list[str]:
    i = args.index("--kv-transfer-config")
    return args[:i] + args[i + 2 :]


@contextlib.contextmanager
def hand_started_pd(tmp: Path, *, decode_connector: bool = True) -> Iterator[dict[str, str]]:
    """The tiny-pd recipe's engines and router, started by hand: URLs of each."""
    plan = resolve("tiny-pd", state_dir=tmp / "state")
    local.ensure_models(plan, print)
    urls: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        engines = {}
        for role in plan.engine_roles:
            port = free_port()
            args = (
                role.args
                if decode_connector or role.name != "decode"
                else _without_connector(role.args)
            )
            log = tmp / f"{role.name}.log"
            argv = vllm.server_argv(sys.executable, args, HOST, port)
            engines[role.name] = (stack.enter_context(started(argv, log, role.env)), log)
            urls[role.name] = f"http://{HOST}:{port}"
        for name, (proc, log) in engines.items():
            _wait(urls[name], "/health", proc, log, 480)
        port = free_port()
        router = vllm.router_argv(
            local.router_binary(),
            prefill_url=urls["prefill"],
            decode_url=urls["decode"],
            host=HOST,
            port=port,
            extra=plan.role("router").args,
        )
        log = tmp / "router.log"
        proc = stack.enter_context(started(router, log))
        urls["router"] = f"http://{HOST}:{port}"
        _wait(urls["router"], vllm.ROUTER_READINESS_PATH, proc, log, 120)
        yield urls


def _attach(name: str, urls: dict[str, str]) -> dict[str, object]:
    r = _cli(
        "attach",
        name,
        "--role",
        f"prefill={urls['prefill']}",
        "--role",
        f"decode={urls['decode']}",
        "--entry",
        urls["router"],
        "--json",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return dict(json.loads(r.stdout))


def test_hand_started_pd_behind_vllm_router_attaches_verifies_and_benches(tmp_path: Path) -> None:
    with hand_started_pd(tmp_path) as urls:
        found = _attach("hand-pd", urls)
        assert found["topology"] == "pd" and found["undetermined"] == []
        roles = {r["name"]: r for r in found["roles"]}  # type: ignore[attr-defined]
        assert roles["decode"]["replicas"][0]["claims"]["kv_connector"] == "ExampleConnector"
        v = _cli("verify", "hand-pd", "--json")
        assert v.returncode == 0, v.stdout + v.stderr
        checks = {
            (f["check"], f["subject"]): f["severity"] for f in json.loads(v.stdout)["findings"]
        }
        assert (
            checks[("SB302", "decode")] == "pass" and checks[("SB310", "prefill,decode")] == "pass"
        )
        out = tmp_path / "sweep"
        b = _cli(
            "bench",
            "hand-pd",
            *SWEEP,
            "--concurrency",
            "1",
            "--repetitions",
            "1",
            "--precision",
            "off",
            "-o",
            str(out),
        )
        assert b.returncode == 0, b.stdout + b.stderr
        st = _cli("status", "hand-pd")
        assert st.returncode == 0, st.stdout + st.stderr
    res = load_results(out / RESULTS_NAME)
    threshold = res.provenance.protocol["thresholds"]["min_handoff_share"]
    [point] = res.points
    assert point.valid and point.server["handoff_share"] >= threshold > 0
    assert res.provenance.target["backend"] == "attached (url)"
    assert {r.name for r in res.provenance.roles} == {"prefill", "decode", "router"}
    decode = next(r for r in res.provenance.roles if r.name == "decode")
    assert "--kv-transfer-config" in decode.command  # read from /proc, not from a recipe
    assert _cli("detach", "hand-pd").returncode == 0


def test_decode_started_without_a_connector_fails_verify_naming_decode(tmp_path: Path) -> None:
    with hand_started_pd(tmp_path, decode_connector=False) as urls:
        _attach("hand-open", urls)
        v = _cli("verify", "hand-open", "--json")
    assert v.returncode == 1, v.stdout + v.stderr
    failing = {
        (f["check"], f["subject"])
        for f in json.loads(v.stdout)["findings"]
        if f["severity"] == "fail"
    }
    assert ("SB302", "decode") in failing
    assert ("SB310", "prefill,decode") in failing
    assert _cli("detach", "hand-open").returncode == 0


def test_one_plain_vllm_with_ngram_speculation_attaches_and_verifies(tmp_path: Path) -> None:
    plan = resolve("tiny-pd", state_dir=tmp_path / "state")
    local.ensure_models(plan, print)
    prefill = plan.role("prefill")
    # the underscore spelling, the dotted form with = and with a separate value
    ngram = ["--speculative_config.method=ngram", "--speculative-config.num_speculative_tokens=3"]
    args = [
        *_without_connector(prefill.args),
        *ngram,
        "--speculative-config.prompt_lookup_max",
        "3",
    ]
    port = free_port()
    url = f"http://{HOST}:{port}"
    log = tmp_path / "mixed.log"
    with started(vllm.server_argv(sys.executable, args, HOST, port), log, prefill.env) as proc:
        _wait(url, "/health", proc, log, 480)
        r = _cli("attach", "hand-spec", "--role", f"mixed={url}", "--entry", url, "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        [role] = json.loads(r.stdout)["roles"]
        spec = role["replicas"][0]["claims"]["speculative_config"]
        assert spec == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
        v = _cli("verify", "hand-spec", "--json")
    assert v.returncode == 0, v.stdout + v.stderr
    found = {f["check"]: f for f in json.loads(v.stdout)["findings"]}
    assert found["SB303"]["severity"] == "pass" and found["SB303"]["evidence"]["drafts"] > 0
    assert _cli("detach", "hand-spec").returncode == 0
