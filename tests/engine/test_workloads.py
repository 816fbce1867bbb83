"""Issue 36's workloads on real vLLM (tiny-mixed-spec, one deployment for every bench): a
shared-prefix workload's server evidence shows prefix-cache hits that random prompts do
not; the shipped text (``builtin:spec-text``) gives speculation accepted tokens, reported
per point; a multi-turn conversation reports TTFT per turn."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servebook.results.schema import RESULTS_NAME, Point
from servebook.results.store import load_results
from tests.engine.conftest import Shared

pytestmark = pytest.mark.engine

# One short point each: a 2-core machine runs the server and the client.
SHORT = [
    "--concurrency",
    "2",
    "--repetitions",
    "1",
    "--precision",
    "off",
    "--duration",
    "5s",
    "--warmup",
    "2s",
    "--min-requests",
    "4",
    "--output-len",
    "16",
    "--max-client-lag-ms",
    "250",
    "--min-achieved-concurrency",
    "0.5",
]


def bench(name: str, out: Path, *extra: str) -> Point:
    proc = subprocess.run(
        [sys.executable, "-m", "servebook", "bench", name, *SHORT, *extra, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (out / RESULTS_NAME).exists(), proc.stderr[-3000:]
    (point,) = load_results(out / RESULTS_NAME).points
    print(extra, point.server, point.invalid_reasons)  # the figures, for the log
    return point


@pytest.mark.shares("tiny-mixed-spec")
def test_prefixes_hit_the_cache_random_prompts_do_not_and_shipped_text_is_accepted(
    tmp_path: Path, shared: Shared
) -> None:
    name = shared.get("tiny-mixed-spec").name
    rand = bench(name, tmp_path / "random", "--input-len", "512")
    prefixed = bench(
        name,
        tmp_path / "prefix",
        "--input-len",
        "512",
        "--prefix-len",
        "448",
        "--prefix-count",
        "2",
    )
    text = bench(name, tmp_path / "text", "--dataset", "builtin:spec-text")
    chat = bench(
        name,
        tmp_path / "chat",
        "--input-len",
        "128",
        "--api",
        "chat",
        "--multi-turn",
        "--turns",
        "3",
    )
    hit_random = rand.server.get("prefix_hit_share")
    hit_shared = prefixed.server.get("prefix_hit_share")
    assert hit_shared is not None and hit_random is not None
    assert hit_shared > 0.5 and hit_random < 0.1, (hit_shared, hit_random)
    acceptance = text.server.get("spec_acceptance")
    assert acceptance is not None and acceptance > 0, text.server
    assert text.output_tokens_per_s
    assert chat.ttft_ms_by_turn is not None and set(chat.ttft_ms_by_turn) == {"1", "2", "3"}
