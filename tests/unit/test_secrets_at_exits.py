"""No secret leaves servebook: every place text leaves it (results, reports, saved requests,
state records, the terminal, ``--json``) goes through one redaction, fed by the keys
servebook was given.  Each test is a case of the reliability probe of 2026-12-04 (section
"Secret leaks", D3-D7) that leaked before; the redactor's own gaps (D8) are pinned in
test_redact.py."""

from __future__ import annotations

import gzip
import json
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web

import servebook
from servebook import auth
from servebook.backends import state
from servebook.backends.attached import record as attached
from servebook.backends.kubernetes import record as kube_record
from servebook.backends.local import deployer as local
from servebook.console import print_report
from servebook.findings import Finding, Severity
from servebook.recipe.resolve import resolve
from servebook.redact import REDACTED
from servebook.verify.smoke import Report
from tests.conftest import CliResult
from tests.unit.engine_standin import engine
from tests.unit.served_app import served, served_models, stream_tokens

Cli = Callable[..., CliResult]
ECHOED = "ECHOEDKEY4242"  # the probe's key, which its fault server echoed back
RECIPE_KEY = "RECIPEKEY4321"
RECIPE_TOKEN = "hf_RECIPETOKEN77"
CATALOG = Path(servebook.__file__).parent / "recipe" / "catalog"

pytestmark = pytest.mark.usefixtures("no_secrets_known")


def leaks(secret: str, *where: Path | str) -> list[str]:
    """The files under each path (gzip read through) and the texts holding ``secret``."""
    found = []
    for w in where:
        if isinstance(w, str):
            found += ["output"] if secret in w else []
            continue
        for f in [w] if w.is_file() else sorted(p for p in w.rglob("*") if p.is_file()):
            data = f.read_bytes()
            data = gzip.decompress(data) if f.suffix == ".gz" else data
            found += [str(f)] if secret.encode() in data else []
    return found


def private(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) == 0o600


# --- D3: a key a server echoes in its errors ------------------------------------------------


@pytest.fixture
def echoing() -> Iterator[str]:
    """A server that answers every other completion with HTTP 500 quoting the request's
    Authorization header, as a gateway or a proxy does (the probe's ``echo500``)."""
    n = {"requests": 0}

    async def completions(request: web.Request) -> web.StreamResponse:
        n["requests"] += 1
        body = await request.json()
        if n["requests"] % 2 == 0:
            said = request.headers.get("Authorization", "")
            key = said.removeprefix("Bearer ")
            message = f"upstream refused the request: {said} key={key}"
            return web.json_response({"error": {"message": message, "code": 500}}, status=500)
        return await stream_tokens(request, int(body["max_tokens"]), 0.001)

    app = web.Application()
    app.router.add_get("/v1/models", served_models("tiny"))
    app.router.add_post("/v1/completions", completions)
    with served(app) as url:
        yield url


def test_d3_a_key_echoed_in_server_errors_reaches_no_results_report_request_file_or_line(
    cli: Cli, echoing: str, tiny_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "echo"
    bench = cli(
        "bench", "--url", echoing, "--model", "tiny", "--tokenizer", str(tiny_dir),
        "--api-key", ECHOED, "--concurrency", "2", "--repetitions", "1",
        "--precision", "off", "--warmup", "0",
        "--duration", "1s", "--input-len", "8", "--output-len", "2", "--save-requests",
        "-o", str(out),
    )  # fmt: skip
    assert bench.returncode in (0, 1), bench.stdout + bench.stderr
    # The errors were recorded, with the key replaced where it stood.
    (point,) = json.loads((out / "results.json").read_text())["points"]
    assert point["errors"] > 0 and point["error_samples"], point
    assert f"Bearer {REDACTED}" in point["error_samples"][0]
    report = cli("report", str(out), "-o", str(out))
    assert report.returncode == 0, report.stderr
    assert (out / "report.md").is_file() and list((out / "requests").glob("*.jsonl.gz"))
    said = bench.stdout + bench.stderr + report.stdout + report.stderr
    assert leaks(ECHOED, out, said) == []


def test_d3_a_results_file_written_before_redaction_is_reported_without_its_key(
    cli: Cli, tmp_path: Path
) -> None:
    """A results file an older servebook wrote with the key in its error samples: the
    report of it (another process, which was never given the key) shows none."""
    out = tmp_path / "old"
    fixture = Path(__file__).parent / "fixtures" / "results" / "mixed-tp2" / "results.json"
    doc = json.loads(fixture.read_text())
    sample = f'HTTP 500: {{"error":{{"message":"upstream refused: Bearer {ECHOED}"}}}}'
    doc["points"][0].update(
        valid=False,
        error_samples=[sample],
        invalid_reasons=[f"SB402: 1 of 40 requests failed; first error: {sample}"],
    )
    out.mkdir()
    (out / "results.json").write_text(json.dumps(doc))
    r = cli("report", str(out), "-o", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    # Bearer's shape is caught; the bare value nowhere else is the remembered key's job.
    assert leaks(f"Bearer {ECHOED}", tmp_path / "rep", r.stdout + r.stderr) == []


# --- D4: a deployment's state file ----------------------------------------------------------


@pytest.fixture
def keyed_recipe(tmp_path: Path) -> Path:
    """The probe's seckey.yaml: tiny-mixed with ``--api-key KEY`` in its engine arguments,
    and a hub token in the role's environment."""
    text = (CATALOG / "tiny-mixed.yaml").read_text()
    text = text.replace("name: tiny-mixed", "name: seckey", 1)
    text = text.replace("--enforce-eager,", f"--enforce-eager, --api-key, {RECIPE_KEY},", 1)
    text = text.replace(
        '      VLLM_CPU_KVCACHE_SPACE: "1"\n',
        f'      VLLM_CPU_KVCACHE_SPACE: "1"\n      HF_TOKEN: {RECIPE_TOKEN}\n',
        1,
    )
    assert RECIPE_KEY in text and RECIPE_TOKEN in text
    path = tmp_path / "seckey.yaml"
    path.write_text(text)
    return path


def test_d4_state_files_keep_no_recipe_key_and_only_their_owner_reads_them(
    sb_home: Path, keyed_recipe: Path
) -> None:
    plan = resolve(str(keyed_recipe))
    argv = plan.command_lines()["mixed"]
    assert RECIPE_KEY in argv  # what the engine is started with
    sdir = state.state_dir_for("sec2")
    sdir.mkdir(parents=True)
    dep = state.Deployment(
        name="sec2",
        recipe=plan.recipe,
        state_dir=str(sdir),
        created="2026-12-04T10:00:00+00:00",
        served_model_name=plan.served_model_name,
        entry_role="mixed",
        entry_url="http://127.0.0.1:8100",
        roles=[
            state.RoleProcess(
                name="mixed",
                kind="engine",
                pid=2**22 + 1,  # no such process
                start_ticks=None,
                port=8100,
                url="http://127.0.0.1:8100",
                log=str(sdir / "logs" / "mixed.log"),
                argv=argv,
                env=dict(plan.role("mixed").env),
            )
        ],
        plan=plan.model_dump(mode="json"),
    )
    state.write_state(dep)
    kube = kube_record.KubeDeployment(
        name="sec3",
        recipe=plan.recipe,
        namespace="servebook",
        created_namespace=True,
        created="2026-12-04T10:00:00+00:00",
        plan=plan.model_dump(mode="json"),
    )
    kube_record.write_state(kube)
    files = [sdir / state.STATE_FILE, kube_record.state_path("sec3")]
    assert leaks(RECIPE_KEY, *files) == [] and leaks(RECIPE_TOKEN, *files) == []
    assert all(private(f) for f in files)
    # The record still serves every command that reads it: the flag says a key was given.
    back = state.read_state("sec2")
    assert back is not None and back.role("mixed").argv[argv.index(RECIPE_KEY)] == REDACTED
    view = local.view(back)
    assert view.plan.role("mixed").env["HF_TOKEN"] == REDACTED
    read_kube = kube_record.read_state("sec3")
    assert read_kube is not None and read_kube.plan["recipe"] == "seckey"


# --- D5: an attached deployment's record, and verify's table --------------------------------


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("http://admin:ATTACHPW9876@127.0.0.1:{port}", "ATTACHPW9876"),
        ("http://127.0.0.1:{port}/?token=ATTACHTOK5432", "ATTACHTOK5432"),
    ],
)
def test_d5_attach_refuses_url_credentials_naming_the_flag_and_records_nothing(
    cli: Cli, sb_home: Path, url: str, secret: str
) -> None:
    with engine() as m:
        given = url.format(port=m.rsplit(":", 1)[1])
        r = cli("attach", "att2", "--role", f"mixed={given}", "--entry", m, "--model", "tiny")
    assert r.returncode == 2, r.stdout + r.stderr
    said = " ".join(r.stderr.split())
    assert "--role mixed" in said and "credentials in a URL" in said and "--api-key" in said
    assert "Traceback" not in r.stderr
    assert leaks(secret, r.stdout + r.stderr) == []
    assert not attached.record_path("att2").exists()


def test_d5_an_attached_record_keeps_no_engine_key_and_only_its_owner_reads_it(
    cli: Cli, sb_home: Path
) -> None:
    """The engine's own command line, read from /proc, holds its --api-key."""
    with engine(["--api-key", "ENGINEKEY5150"]) as m:
        r = cli("attach", "one", "--role", f"mixed={m}", "--entry", m)
        assert r.returncode == 0, r.stdout + r.stderr
        path = attached.record_path("one")
        assert leaks("ENGINEKEY5150", path, r.stdout + r.stderr) == [] and private(path)
        rec = attached.read_record("one")
        assert rec is not None
        argv = rec.role("mixed").replicas[0].argv
        assert argv[argv.index("--api-key") + 1] == REDACTED
        status = cli("status", "one", "--json")
        assert status.returncode == 0 and "ENGINEKEY5150" not in status.stdout, status.stderr


def test_d5_verify_table_redacts_the_subject_and_hint_columns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A record an older servebook kept with the token in a replica's URL: verify names the
    replica (``ROLE URL``) in the subject column and quotes it in the hint."""
    auth.resolve("KNOWNKEY8080")  # given with --api-key: remembered
    replica = "http://127.0.0.1:18001/?token=ATTACHTOK5432"
    rep = Report(
        findings=[
            Finding(
                check="SB301",
                severity=Severity.FAIL,
                subject=f"mixed {replica}",
                message=f"no engine counters at {replica}/metrics",
                hint=f"curl -H 'Authorization: Token KNOWNKEY8080' {replica}/metrics",
            )
        ],
        elapsed_s=1.0,
    )
    print_report(rep, "att2")
    shown = capsys.readouterr().out
    assert "ATTACHTOK5432" not in shown and "KNOWNKEY8080" not in shown
    assert f"mixed http://127.0.0.1:18001/?token={REDACTED}" in shown
    assert "fix: curl" in shown


# --- D6: recipes show -----------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_d6_recipes_show_prints_no_engine_key_or_secret_env_value(
    cli: Cli, keyed_recipe: Path, as_json: bool
) -> None:
    r = cli("recipes", "show", str(keyed_recipe), *(["--json"] if as_json else []))
    assert r.returncode == 0, r.stderr
    assert leaks(RECIPE_KEY, r.stdout + r.stderr) == []
    assert leaks(RECIPE_TOKEN, r.stdout + r.stderr) == []
    if as_json:
        (role,) = json.loads(r.stdout)["roles"]
        assert role["args"][role["args"].index("--api-key") + 1] == REDACTED
        assert role["env"] == {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": REDACTED}
    else:
        # Still the command line to read: the flag and the variable are there.
        assert f"--api-key '{REDACTED}'" in r.stdout and f"HF_TOKEN='{REDACTED}'" in r.stdout
        assert "--enforce-eager" in r.stdout and "VLLM_CPU_KVCACHE_SPACE=1" in r.stdout


# --- D7: lint ---------------------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_d7_lint_prints_no_token_it_quotes_from_a_doc(
    cli: Cli, tmp_path: Path, as_json: bool
) -> None:
    doc = tmp_path / "d.md"
    doc.write_text('```sh\ncurl -H "Authorization: Bearer LINTDOCBEARER1212" http://x\n```\n')
    r = cli("lint", str(doc), *(["--json"] if as_json else []))
    assert r.returncode == 1, r.stdout + r.stderr  # the finding itself: curl without --max-time
    assert "curl without --max-time" in " ".join(r.stdout.split())
    assert leaks("LINTDOCBEARER1212", r.stdout + r.stderr) == []
    assert f"Bearer {REDACTED}" in r.stdout
