"""Protected servers end to end, against a real HTTP server on 127.0.0.1 that guards its
API like vLLM (``/v1/...`` needs ``Authorization: Bearer KEY``; ``/health``, ``/metrics``
and ``/version`` do not): the key reaches every request, a missing or wrong key is its own
exit-2 error before or during a sweep, and no secret of a deployment reaches any file or
line servebook writes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from servebook import auth, redact
from servebook.backends import state
from servebook.backends.local import deployer as local
from servebook.backends.local.processes import log_tail
from servebook.bench import target as tgt
from servebook.bench.control import LoadSpec
from servebook.bench.coordinator import run_load
from servebook.bench.endpoint import Endpoint
from servebook.bench.protocol import ProtocolSettings, Warmup, run_sweep
from servebook.bench.validity import Thresholds
from servebook.bench.workload import DatasetPrompts, Prompt
from servebook.deployment.view import Claims, DeploymentView, RoleView
from servebook.errors import UsageError
from servebook.metrics.scrape import Snapshot, snapshot_from_text
from servebook.recipe.resolve import resolve
from servebook.report.render import write_report
from servebook.results.store import ResultsWriter, load_results
from servebook.verify.smoke import Options, completion
from servebook.verify.smoke import run as verify_run
from tests.conftest import CliResult
from tests.unit.engine_standin import vllm_package
from tests.unit.served_app import served, stream_tokens

KEY = "sk-test-5f0e2c9d41b7a6"  # the API key: servebook knows it
HF = "hf_q8ZrT3vLpW2mNx"  # a hub token in a flag and a variable: servebook never knew it
URL_PW = "pw-9d2b7e41c3"  # a password in a role's URL
FIXTURES = Path(__file__).parent / "fixtures" / "metrics"


class Guarded:
    """Answers like vLLM with ``--api-key KEY``; ``revoke_after`` requests in, the key
    stops being accepted (a rotated key)."""

    def __init__(self) -> None:
        self.key = KEY
        self.revoke_after: int | None = None
        self.seen = 0
        self.auth_headers: list[str | None] = []

    def _ok(self, request: web.Request) -> bool:
        self.auth_headers.append(request.headers.get("Authorization"))
        if self.revoke_after is not None and self.seen >= self.revoke_after:
            return False
        return request.headers.get("Authorization") == f"Bearer {self.key}"

    async def completions(self, request: web.Request) -> web.StreamResponse:
        if not self._ok(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        self.seen += 1
        body = await request.json()
        if not body.get("stream"):
            return web.json_response(
                {
                    "choices": [{"text": "hello", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
                }
            )
        return await stream_tokens(request, int(body["max_tokens"]), 0.001)

    async def models(self, request: web.Request) -> web.Response:
        if not self._ok(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.json_response({"data": [{"id": "tiny"}]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    async def metrics(self, request: web.Request) -> web.Response:
        text = (FIXTURES / "vllm-0.32.0-cpu-pd-spec-decode-before.prom").read_text()
        return web.Response(text=text)


@pytest.fixture
def guarded() -> Iterator[tuple[str, Guarded]]:
    srv = Guarded()
    app_ = web.Application()
    app_.router.add_post("/v1/completions", srv.completions)
    app_.router.add_get("/v1/models", srv.models)
    app_.router.add_get("/health", srv.health)
    app_.router.add_get("/version", srv.version)
    app_.router.add_get("/metrics", srv.metrics)
    with served(app_) as url:
        yield url, srv


pytestmark = pytest.mark.usefixtures("no_secrets_known")


def prompts() -> DatasetPrompts:
    return DatasetPrompts([Prompt("x", 4)], "memory", "0")


# --- keys in -----------------------------------------------------------------------------


def test_bench_checks_the_key_before_any_load_and_a_missing_one_is_its_own_error(
    guarded: tuple[str, Guarded],
) -> None:
    url, srv = guarded
    with pytest.raises(auth.ApiKeyError, match=auth.MISSING):
        tgt.from_url(url, model="tiny", tokenizer=None, api="completions", request_timeout_s=5)
    with pytest.raises(auth.ApiKeyError, match="refused the API key"):
        tgt.from_url(
            url,
            model="tiny",
            tokenizer=None,
            api="completions",
            request_timeout_s=5,
            api_key="wrong-key",
        )
    subject = tgt.from_url(
        url, model="tiny", tokenizer=None, api="completions", request_timeout_s=5, api_key=KEY
    )
    assert subject.target.endpoint.api_key == KEY
    # One bounded GET /v1/models each time, and no completion: nothing was measured.
    assert srv.auth_headers == [None, "Bearer wrong-key", f"Bearer {KEY}"]
    assert srv.seen == 0


def test_every_load_request_carries_the_key_as_a_bearer_token(
    guarded: tuple[str, Guarded],
) -> None:
    url, srv = guarded
    res = run_load(
        Endpoint(url, "tiny", api_key=KEY), LoadSpec(concurrency=2, num_requests=6), prompts()
    )
    assert all(r.error is None for r in res.records), [r.error for r in res.records]
    assert set(srv.auth_headers) == {f"Bearer {KEY}"}


def test_a_sweep_that_starts_getting_401s_stops_at_once_with_the_key_error(
    guarded: tuple[str, Guarded],
) -> None:
    url, srv = guarded
    srv.revoke_after = 3
    t0 = time.monotonic()
    with pytest.raises(auth.ApiKeyError, match="refused the API key"):
        run_load(
            Endpoint(url, "tiny", api_key=KEY),
            LoadSpec(concurrency=2, deadline_s=30),
            prompts(),
        )
    assert time.monotonic() - t0 < 10  # stopped at the refusals, not at the deadline
    assert len(srv.auth_headers) < 500  # not a sweep of refused requests


def test_verify_sends_the_key_and_a_refusal_is_the_key_error_not_a_failed_check(
    guarded: tuple[str, Guarded],
) -> None:
    url, srv = guarded
    targets = [RoleView(name="mixed", kind="engine", api_url=url)]
    claims = Claims(topology="mixed", speculative=False, served_model_name="tiny", entry_url=url)
    with pytest.raises(auth.ApiKeyError, match=auth.MISSING):
        verify_run(targets, claims, Options())
    with pytest.raises(auth.ApiKeyError, match="refused the API key"):
        completion(url, "tiny", "hi", 4, 5.0, "wrong-key")
    rep = verify_run(targets, claims, Options(api_key=KEY))
    smoke = [f for f in rep.findings if f.subject == "entry"]
    assert smoke and not any(f.failed for f in smoke), [f.message for f in smoke]
    assert srv.auth_headers[-1] == f"Bearer {KEY}"


def test_bench_on_the_command_line_exits_2_with_the_message_without_a_key(
    guarded: tuple[str, Guarded], tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    url, srv = guarded
    out = tmp_path / "out"
    r = cli("bench", "--url", url, "--model", "tiny", "-o", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    assert auth.MISSING in " ".join(r.stderr.split())
    assert not out.exists() and srv.seen == 0
    r = cli("bench", "--url", url, "--model", "tiny", "-o", str(out), "--api-key", "nope-nope")
    assert r.returncode == 2 and "refused the API key" in " ".join(r.stderr.split())
    assert "nope-nope" not in r.stdout + r.stderr


def test_local_up_refuses_a_recipe_that_requires_a_key_when_none_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVEBOOK_HOME", str(tmp_path))
    # A stand-in vLLM on the path: the unit tests need no vLLM, and up checks for it first.
    vllm_package(tmp_path / "standin")
    monkeypatch.syspath_prepend(str(tmp_path / "standin"))
    plan = resolve("tiny-mixed", state_dir=tmp_path).model_copy(update={"require_api_key": True})
    with pytest.raises(UsageError, match="requires an API key"):
        local.up(plan, name="k", timeout_s=1)
    assert not (tmp_path / "deployments" / "k").exists()


# --- keys never out ------------------------------------------------------------------------


class _Scrape:
    def __call__(self, urls: object) -> dict[str, Snapshot | str]:
        text = (FIXTURES / "vllm-0.32.0-cpu-pd-spec-decode-before.prom").read_text()
        return {"mixed": snapshot_from_text(text)}


def _secret_view(url: str) -> DeploymentView:
    plan = resolve("tiny-mixed", state_dir=Path("/tmp/sb-unused"))
    argv = [
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--api-key",
        KEY,
        f"--hf-token={HF}",
        "--port",
        "8000",
    ]
    return DeploymentView(
        name="secretive",
        backend="local",
        recipe="tiny-mixed",
        plan=plan,
        served_model_name="tiny",
        entry_url=url,
        roles=[
            RoleView(
                name="mixed",
                kind="engine",
                api_url=url,
                metrics_url=url,
                argv=argv,
                env={"VLLM_API_KEY": KEY, "HF_TOKEN": HF, "VLLM_CPU_KVCACHE_SPACE": "1"},
            ),
            RoleView(
                name="router",
                kind="router",
                api_url=f"http://bench:{URL_PW}@127.0.0.1:9/?token={HF}",
                metrics_url=url,
                argv=["vllm-router", "--api-key", KEY],
                env={"OPENAI_API_KEY": KEY},
            ),
        ],
    )


def _no_secret(text: str, where: str) -> None:
    for s in (KEY, HF, URL_PW):
        assert s not in text, f"{where} carries a secret"


def test_results_reports_status_and_printed_lines_carry_no_secret(
    guarded: tuple[str, Guarded],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    cli: Callable[..., CliResult],
) -> None:
    url, _ = guarded
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    key = auth.resolve(None)  # as `servebook bench` does
    subject = tgt.from_deployment(
        _secret_view(url), api="completions", request_timeout_s=10, api_key=key
    )
    settings = ProtocolSettings(
        concurrencies=(1,),
        repetitions=1,
        warmup=Warmup(0.05, 1),
        duration_s=0.2,
        min_requests=2,
        thresholds=Thresholds(max_send_lag_p99_ms=1000, max_loop_lag_p99_ms=1000),
    )
    out = tmp_path / "run"
    writer = ResultsWriter(out, tgt.provenance(subject, settings, prompts()))
    run_sweep(subject.target, settings, prompts(), writer, scrape_fn=_Scrape())
    write_report([out], out)

    # A state file for `status --json`, with the secret in its URLs and its argv.
    sdir = state.state_dir_for("secretive")
    sdir.mkdir(parents=True)
    leaky = f"http://bench:{URL_PW}@127.0.0.1:9"
    state.write_state(
        state.Deployment(
            name="secretive",
            recipe="tiny-mixed",
            state_dir=str(sdir),
            created="2026-01-01T00:00:00+00:00",
            served_model_name="tiny",
            entry_role="mixed",
            entry_url=leaky,
            roles=[
                state.RoleProcess(
                    name="mixed",
                    kind="engine",
                    pid=2**22 + 1,  # no such process
                    start_ticks=None,
                    port=9,
                    url=leaky,
                    log=str(sdir / "mixed.log"),
                    argv=["python", "--api-key", KEY],
                    env={"HF_TOKEN": HF},
                )
            ],
        )
    )
    (sdir / "mixed.log").write_text(f"INFO starting with --hf-token {HF} and key {KEY}\n")
    # Later commands know no key: patterns alone keep the secrets out.
    redact.forget_all()
    runs = [
        cli("status", "secretive", "--json"),
        cli("status", "secretive"),
        cli("report", str(out), "-o", str(tmp_path / "again")),
    ]
    assert [r.returncode for r in runs] == [1, 1, 0], [r.stderr for r in runs]
    # A log read by a command that holds the key (from OPENAI_API_KEY, as up does).
    auth.from_environment()
    tail = log_tail(sdir / "mixed.log")
    assert "--hf-token <redacted>" in tail
    printed = [
        *(r.stdout + r.stderr for r in runs),
        tail,
        "\n".join(capsys.readouterr()),
    ]
    status = json.loads(runs[0].stdout)
    assert status["entry"] == "http://<redacted>@127.0.0.1:9"

    written = [p for d in (out, tmp_path / "again") for p in d.rglob("*") if p.is_file()]
    names = {p.name for p in written}
    assert {"results.json", "report.md", "report.html"} <= names
    for p in written:
        _no_secret(p.read_bytes().decode("utf-8", "replace"), str(p))
    for i, text in enumerate(printed):
        _no_secret(text, f"printed output {i}")

    prov = load_results(out / "results.json").provenance
    notes = prov.model_dump()["redacted"]
    assert "roles[mixed].command --api-key" in notes
    assert "roles[mixed].command --hf-token" in notes
    assert "roles[mixed].env VLLM_API_KEY" in notes
    assert "roles[router].url credentials in a URL" in notes
    mixed = next(r for r in prov.roles if r.name == "mixed")
    assert mixed.env["VLLM_CPU_KVCACHE_SPACE"] == "1"  # what is not secret is kept
    assert "--port" in mixed.command
