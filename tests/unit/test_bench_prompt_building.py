"""Prompts are built fast, with exact lengths, and never in the sending loop: token-id
prompts, the word-table construction timed, and loads against a real HTTP server on
127.0.0.1 that count, from inside the load, how many prompts were built there."""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import pytest

from servebook.bench import prompt_feed
from servebook.bench.control import ClientError, Decision, LoadSpec, Progress
from servebook.bench.coordinator import run_load
from servebook.bench.endpoint import Endpoint
from servebook.bench.figures import point_from_load
from servebook.bench.tokens import HFTokenizer, server_token_count
from servebook.bench.workload import DatasetPrompts, Prompt, RandomPrompts
from servebook.errors import UsageError
from tests.unit.served_app import StreamingServer


@pytest.fixture
def answering(server: tuple[str, StreamingServer]) -> tuple[str, StreamingServer]:
    """The module's server (its URL and state), answering: not down."""
    server[1].down = False
    return server


# --- token ids -------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 2, 9, 1024])
def test_token_id_prompts_have_exactly_the_asked_length_bos_first(
    tiny_dir: Path, tok: HFTokenizer, length: int
) -> None:
    prompts = RandomPrompts(tiny_dir, input_len=length, output_len=4, seed=2, prompt_format="ids")
    special = tok.special_ids()
    for i in range(5):
        p = prompts.get(i)
        assert p.token_ids is not None and p.text == ""
        assert len(p.token_ids) == p.prompt_tokens == length
        # What the server adds to a text prompt (BOS) is part of the count, once.
        assert p.token_ids[0] == tok.encode("", add_special_tokens=True)[0] == 0
        assert not set(p.token_ids[1:]) & special
    ids = [tuple(prompts.get(i).token_ids or ()) for i in range(5)]
    if length > 8:
        assert len(set(ids)) == 5  # distinct: no prefix-cache hits between prompts
    clone = pickle.loads(pickle.dumps(prompts))
    assert clone.get(3).token_ids == prompts.get(3).token_ids
    assert prompts.describe()["prompt_format"] == "ids"


def test_token_id_prompts_are_for_the_completions_api_only(tiny_dir: Path) -> None:
    with pytest.raises(UsageError, match="only the completions API takes"):
        RandomPrompts(tiny_dir, input_len=8, output_len=4, seed=0, api="chat", prompt_format="ids")


# --- text, fast ------------------------------------------------------------------------------


def test_1024_token_text_prompts_are_exact_distinct_and_built_once(
    tiny_dir: Path, tok: HFTokenizer
) -> None:
    """How fast they are built is benchmarks/prompt_building.py's to measure (a timed test
    on a shared machine only measures the machine)."""
    prompts = RandomPrompts(tiny_dir, input_len=1024, output_len=4, seed=0)
    prompts.pregenerate(range(8))  # the word table, found once per tokenizer
    prompts.pregenerate(range(1000, 1000 + 768))
    # Every one of them has exactly the asked length, by the tokenizer itself.
    texts = [prompts.get(i).text for i in range(1000, 1000 + 768)]
    assert {server_token_count(tok, t) for t in texts} == {1024}
    assert len(set(texts)) == len(texts)
    assert prompts.built == 8 + 768


def test_fast_prompts_are_the_same_whoever_builds_them(tiny_dir: Path) -> None:
    a = RandomPrompts(tiny_dir, input_len=100, output_len=4, seed=5)
    b = pickle.loads(pickle.dumps(RandomPrompts(tiny_dir, input_len=100, output_len=4, seed=5)))
    a.pregenerate(range(10))
    expected = [a.get(i).text for i in range(10)]
    assert [b.build_many([i])[0].text for i in reversed(range(10))][::-1] == expected
    # The producer's way (one count in 16) gives the same prompts.
    assert [p.text for p in b.build_many(range(10), check_every=16)] == expected


# --- no building in the load -----------------------------------------------------------------


class Window:
    """Opens the window after two requests and stops after ``stop_after``; counts the
    prompts the source had built when the window opened."""

    def __init__(self, stop_after: int) -> None:
        self.stop_after = stop_after

    def __call__(self, p: Progress) -> Decision:
        if p.window_start_ns is None:
            return Decision(open_window=p.completed_ok >= 2)
        return Decision(stop=p.completed_ok >= self.stop_after)


@pytest.mark.parametrize("workers", [1, 2])
def test_no_prompt_is_built_in_the_load_yet_every_request_has_its_own(
    answering: tuple[str, StreamingServer],
    tiny_dir: Path,
    tok: HFTokenizer,
    workers: int,
) -> None:
    url, srv = answering
    prompts = RandomPrompts(tiny_dir, input_len=64, output_len=3, seed=9)
    prompts.pregenerate(range(8))  # far fewer than the load sends
    built: dict[str, int] = {}

    def on_window(edge: str) -> None:
        built[edge] = prompts.built

    n_before = len(srv.bodies)
    res = run_load(
        Endpoint(url, "tiny"),
        LoadSpec(concurrency=4, workers=workers),
        prompts,
        Window(stop_after=60),
        on_window=on_window,
    )
    sent = [b["prompt"] for b in srv.bodies[n_before:]]
    assert len(sent) >= 60 > 8
    # Built before the load, by this process: 8.  During it: none (the rest came from
    # the producer processes).
    assert built == {"open": 8, "close": 8} and prompts.built == 8
    # The producers' work is the client's too: their CPU time is recorded.
    assert all(w.producer_cpu_s > 0 for w in res.workers)
    assert len(set(sent)) == len(sent)
    assert {server_token_count(tok, t) for t in sent} == {64}
    by_index = {r.index: r for r in res.records}
    assert all(by_index[i].ok for i in range(8))
    fresh = RandomPrompts(tiny_dir, input_len=64, output_len=3, seed=9)
    assert {fresh.get(i).text for i in by_index} <= set(sent)  # seeded by index, anywhere


def test_token_id_prompts_reach_the_server_as_ids_and_it_counts_the_workloads_length(
    answering: tuple[str, StreamingServer],
    tiny_dir: Path,
) -> None:
    url, srv = answering
    prompts = RandomPrompts(tiny_dir, input_len=300, output_len=3, seed=1, prompt_format="ids")
    prompts.pregenerate(range(4))
    n_before = len(srv.bodies)
    res = run_load(Endpoint(url, "tiny"), LoadSpec(concurrency=2), prompts, Window(20))
    sent = [b["prompt"] for b in srv.bodies[n_before:]]
    assert sent and all(isinstance(p, list) and len(p) == 300 for p in sent)
    assert prompts.built == 4
    ws, we = res.window_start_ns, res.window_end_ns
    assert ws is not None and we is not None
    point = point_from_load(res, window_start_ns=ws, window_end_ns=we, repetition=0)
    assert point.requests_ok > 0 and point.prompt_tokens_mismatch == 0
    assert point.client.achieved_concurrency is not None


class Broken(DatasetPrompts):
    """A source that fails in the worker, as a bug in the client would."""

    def get(self, index: int) -> Prompt:
        raise RuntimeError(f"no prompt {index}")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_worker_is_a_client_error_not_a_crash(
    server: tuple[str, StreamingServer],
    workers: int,
) -> None:
    url, _ = server
    broken: Any = Broken([Prompt("x", 2)], "memory", "0")
    with pytest.raises(ClientError, match="no prompt"):
        run_load(Endpoint(url, "tiny"), LoadSpec(concurrency=2, workers=workers), broken)


def test_a_client_error_ends_bench_with_a_message_and_exit_2_not_a_traceback(
    answering: tuple[str, StreamingServer],
    cli: Any,
    tiny_dir: Path,
    tmp_path: Path,
) -> None:
    url, _ = answering
    # The real CLI against a real server, with a failure injected into the load generator
    # of that process (a worker's bug): what the user sees is the point of the test.
    inject = [
        "import servebook.bench.prompt_feed as f",
        "async def broken(self, index): raise RuntimeError('injected worker failure')",
        "f.PromptFeed.get = broken",
    ]
    r = cli(
        "bench", "--url", url, "--model", "tiny", "--tokenizer", str(tiny_dir),
        "--concurrency", "2", "--repetitions", "1",
        "--precision", "off", "--duration", "1s", "--warmup", "0",
        "--input-len", "16", "--output-len", "2", "-o", str(tmp_path / "out"),
        prelude=inject,
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert "bench could not run" in r.stderr and "injected worker failure" in r.stderr
    assert "Traceback" not in r.stderr


class FailsLater(RandomPrompts):
    """Builds the prompts made before the load, then fails in the producer process, as a
    tokenizer that cannot reach an exact length would (``exact_length_prompt`` raises)."""

    def build_many(self, indices: Any, *, check_every: int = 1) -> list[Prompt]:
        if any(i >= 8 for i in indices):
            raise UsageError("could not build a prompt of exactly 64 tokens")
        return super().build_many(indices, check_every=check_every)


def test_a_producer_that_fails_stops_the_load_with_its_reason(
    answering: tuple[str, StreamingServer],
    tiny_dir: Path,
) -> None:
    url, _ = answering
    prompts = FailsLater(tiny_dir, input_len=64, output_len=2, seed=0)
    prompts.pregenerate(range(8))
    with pytest.raises(ClientError, match="building prompts failed: UsageError: could not"):
        run_load(Endpoint(url, "tiny"), LoadSpec(concurrency=2), prompts, Window(10**6))


class SlowToStart(RandomPrompts):
    """A producer that takes 1.5 s over its first batch, as a fresh interpreter importing
    numpy and the tokenizer did while both cores of a 2-core machine served a load."""

    slept = False

    def build_many(self, indices: Any, *, check_every: int = 1) -> list[Prompt]:
        if min(indices) >= 8 and not self.slept:
            time.sleep(1.5)
            self.slept = True
        return super().build_many(indices, check_every=check_every)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_load_starts_once_the_producer_delivers_so_no_request_waits_for_its_prompt(
    answering: tuple[str, StreamingServer], tiny_dir: Path, workers: int
) -> None:
    url, _ = answering
    prompts = SlowToStart(tiny_dir, input_len=64, output_len=2, seed=0)
    prompts.pregenerate(range(8))  # a fast server sends these in well under 1.5 s
    res = run_load(
        Endpoint(url, "tiny"), LoadSpec(concurrency=4, workers=workers), prompts, Window(40)
    )
    assert sum(r.ok for r in res.records) >= 40
    assert res.prompt_waits == 0


class NeverDelivers(RandomPrompts):
    def build_many(self, indices: Any, *, check_every: int = 1) -> list[Prompt]:
        if min(indices) >= 8:
            time.sleep(30)
        return super().build_many(indices, check_every=check_every)


def test_a_producer_that_delivers_nothing_is_a_bounded_failure_not_a_hang(
    answering: tuple[str, StreamingServer], tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, srv = answering
    monkeypatch.setattr(prompt_feed, "PRODUCER_START_S", 0.5)
    prompts = NeverDelivers(tiny_dir, input_len=64, output_len=2, seed=0)
    prompts.pregenerate(range(8))
    n_before = len(srv.bodies)
    t0 = time.monotonic()
    with pytest.raises(ClientError, match=r"the prompt producer built no prompt in 0\.5 s"):
        run_load(Endpoint(url, "tiny"), LoadSpec(concurrency=2), prompts, Window(10**6))
    assert time.monotonic() - t0 < 10
    assert len(srv.bodies) == n_before  # the load never started
