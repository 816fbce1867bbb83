"""bench asks its target before any load: a ``--url`` where nothing answers, one where
something that is not an OpenAI-compatible server answers, and a workload longer than the
served model's context are each exit 2 with nothing measured or written (bench/target.py
``probe``); and what bench prints before and during a sweep says what it counts."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from servebook.bench.control import Progress
from servebook.bench.protocol import ProtocolSettings, Warmup
from servebook.bench.sweep import BenchArgs, live_counters, plan_text
from tests.conftest import CliResult
from tests.unit.served_app import served, served_models

# The first lines of the page nginx answers an unknown path with (its default 404).
HTML_404 = (
    "<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n"
    "<center><h1>404 Not Found</h1></center>\r\n<hr><center>nginx</center>\r\n"
    "</body>\r\n</html>\r\n"
)


def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (bound, never listened, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Counting:
    def __init__(self) -> None:
        self.completions = 0

    async def complete(self, _request: web.Request) -> web.Response:
        self.completions += 1
        return web.json_response({"error": "should not be asked"}, status=500)


@pytest.fixture
def html_server() -> Iterator[tuple[str, Counting]]:
    c = Counting()
    app = web.Application()

    async def page(_request: web.Request) -> web.Response:
        return web.Response(text=HTML_404, status=404, content_type="text/html")

    app.router.add_get("/v1/models", page)
    app.router.add_post("/v1/completions", c.complete)
    with served(app) as url:
        yield url, c


@pytest.fixture
def small_context() -> Iterator[tuple[str, Counting]]:
    c = Counting()
    app = web.Application()
    app.router.add_get("/v1/models", served_models("tiny", max_model_len=2048))
    app.router.add_post("/v1/completions", c.complete)
    with served(app) as url:
        yield url, c


def words(r: CliResult) -> str:
    return " ".join(r.stderr.split())


@pytest.mark.parametrize("with_tokenizer", [True, False])
def test_nothing_listening_is_exit_2_with_nothing_written(
    cli: Callable[..., CliResult], tmp_path: Path, tiny_dir: Path, with_tokenizer: bool
) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    out = tmp_path / "out"
    extra = ["--tokenizer", str(tiny_dir)] if with_tokenizer else []
    r = cli("bench", "--url", url, "--model", "tiny", *extra, "--duration", "2s", "-o", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"nothing answers at {url}" in words(r)
    assert "tokeniz" not in words(r).lower()  # never blamed on the tokenizer
    assert "Traceback" not in r.stderr
    assert not out.exists()


def test_a_server_that_is_not_openai_compatible_is_named_by_status_and_first_line(
    cli: Callable[..., CliResult], tmp_path: Path, html_server: tuple[str, Counting]
) -> None:
    url, srv = html_server
    out = tmp_path / "out"
    r = cli("bench", "--url", url, "--model", "tiny", "-o", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    msg = words(r)
    assert "answered 404" in msg and "<html>" in msg
    assert "404 Not Found</title>" not in msg and "nginx" not in msg  # not the whole page
    assert "not an OpenAI-compatible" in msg
    assert not out.exists() and srv.completions == 0


def test_a_workload_longer_than_the_served_context_is_refused_before_any_load(
    cli: Callable[..., CliResult], tmp_path: Path, small_context: tuple[str, Counting]
) -> None:
    url, srv = small_context
    out = tmp_path / "out"
    r = cli("bench", "--url", url, "--model", "tiny", "--input-len", "5000", "-o", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    msg = words(r)
    assert "5000 + --output-len 128 = 5128 tokens" in msg and "max_model_len 2048" in msg
    assert not out.exists() and srv.completions == 0
    # a model the server does not serve is named with what it does serve
    r = cli("bench", "--url", url, "--model", "big", "-o", str(out))
    assert r.returncode == 2 and "--model 'big' is not served" in words(r)
    assert "it serves: tiny" in words(r)


def test_the_plan_names_levels_repetitions_windows_workload_and_time() -> None:
    settings = ProtocolSettings(
        concurrencies=(1, 4), repetitions=2, warmup=Warmup(3.0, None), duration_s=8.0
    )
    text = plan_text(settings, BenchArgs(input_len=512, output_len=64))
    assert text.startswith("c=1,4; 2 repetitions, shuffled; 8 s windows after a warm-up")
    assert "512 prompt and 64 output tokens a request" in text
    assert text.endswith("about 56 s")  # 2 levels x 2 repetitions x (3 + 8 + 3) s


def test_live_counters_say_what_they_count() -> None:
    settings = ProtocolSettings(concurrencies=(4,), duration_s=8.0)
    base = dict(sent=30, errors=0, output_tokens=1480, workers_done=0)
    warm = Progress(now_ns=5 * 10**9, start_ns=0, window_start_ns=None, completed_ok=10,
                    window_ok=0, window_errors=0, **base)  # fmt: skip
    assert live_counters(warm, settings) == (
        "warm-up 5 s (discarded), 10 finished, 296 output tok/s since the load started"
    )
    win = Progress(now_ns=10 * 10**9, start_ns=0, window_start_ns=4 * 10**9, completed_ok=26,
                   window_ok=16, window_errors=1, **base)  # fmt: skip
    assert live_counters(win, settings) == (
        "window 6/8 s, 16 ok and 1 failed of the requests it scheduled, "
        "148 output tok/s since the load started"
    )
