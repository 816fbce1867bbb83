"""With no local tokenizer, prompts built through the server's own /tokenize and
/detokenize have the server-counted lengths that prompts built with the model directory
have: real completions on tiny-mixed report ``usage.prompt_tokens`` equal to the target
for both, completions and chat."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from servebook import http
from servebook.backends.local import deployer as local
from servebook.bench.server_tokenizer import ServerTokenizer
from servebook.bench.tokens import load_tokenizer, server_token_count
from servebook.bench.workload import RandomPrompts
from servebook.recipe.resolve import resolve
from servebook.results.schema import RESULTS_NAME
from servebook.results.store import load_results
from tests.engine.conftest import Shared

pytestmark = pytest.mark.engine

LENGTHS = (8, 100, 512)


def prompt_tokens(url: str, model: str, text: str, api: str) -> int:
    """What the server counts for ``text`` sent as a real request (one output token)."""
    body: dict[str, Any] = {"model": model, "max_tokens": 1, "temperature": 0}
    if api == "chat":
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": text}]
    else:
        path = "/v1/completions"
        body["prompt"] = text
    resp = http.post_json(url + path, body, timeout=120)
    assert resp.status == 200, resp.text
    return int(resp.json()["usage"]["prompt_tokens"])


@pytest.mark.shares("tiny-mixed")
def test_server_tokenizer_prompts_have_the_lengths_local_tokenizer_prompts_have(
    tmp_path: Path, shared: Shared
) -> None:
    pytest.importorskip("transformers")  # the local chat path renders the template
    dep = shared.get("tiny-mixed")
    plan = resolve("tiny-mixed", state_dir=local.state_dir_for(dep.name))
    model_dir = plan.engine_roles[0].model_path
    assert model_dir is not None
    url, model = dep.entry_url, dep.served_model_name
    server = ServerTokenizer(url, model, timeout_s=30)
    tok = load_tokenizer(model_dir)
    checked = 0
    for api in ("completions", "chat"):
        for length in LENGTHS:
            via_server = RandomPrompts(server, input_len=length, output_len=1, seed=7, api=api)
            via_dir = RandomPrompts(model_dir, input_len=length, output_len=1, seed=7, api=api)
            for i in range(2):
                s, d = via_server.get(i).text, via_dir.get(i).text
                assert s != d  # different samples, the same length on the server
                got = (prompt_tokens(url, model, s, api), prompt_tokens(url, model, d, api))
                assert got == (length, length), (api, length, i)
                # The local tokenizer agrees with the server about the server's prompt.
                assert server_token_count(tok, s, api) == length
                checked += 1
    assert checked == 2 * len(LENGTHS) * 2
    # A handful of requests per prompt, setup included, on the real server.
    assert server.requests / checked <= 10, server.requests
    described = RandomPrompts(server, input_len=8, output_len=1, seed=7).describe()
    assert described["tokenizer"] == f"server /tokenize at {url} (model {model})"
    # The path users run: `servebook bench --url` with no --tokenizer builds its
    # prompts on the server, says so in the results, and the server counts exactly
    # the workload's prompt length for every request (SB409 holds).
    out = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "servebook",
            "bench",
            "--url",
            url,
            "--model",
            model,
            "--concurrency",
            "2",
            "--repetitions",
            "1",
            "--precision",
            "off",
            "--duration",
            "4s",
            "--warmup",
            "1s",
            "--min-requests",
            "4",
            "--input-len",
            "200",
            "--output-len",
            "8",
            "--max-client-lag-ms",
            "250",
            "--min-achieved-concurrency",
            "0.5",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = load_results(out / RESULTS_NAME)
    assert res.provenance.workload["tokenizer"].startswith("server /tokenize at " + url)
    (point,) = res.points
    assert point.valid and point.requests_ok >= 4 and point.prompt_tokens_mismatch == 0
