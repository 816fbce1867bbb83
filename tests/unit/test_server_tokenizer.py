"""Exact-length prompts through a server's /tokenize and /detokenize, against a stand-in
server on 127.0.0.1 that answers with vLLM's JSON shapes using the real tiny tokenizer; a
local copy of that tokenizer is the independent judge of every length."""

from __future__ import annotations

import json
import pickle
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servebook.bench.datasets import load_dataset
from servebook.bench.server_tokenizer import CORPUS, SEPARATOR, ServerTokenizer
from servebook.bench.tokens import HFTokenizer, exact_length_prompt, server_token_count
from servebook.bench.workload import RandomPrompts
from servebook.errors import UsageError

MODEL = "tiny"


class StandIn:
    """What the stand-in server received, by path."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self.lock = threading.Lock()

    def total(self) -> int:
        with self.lock:
            return sum(self.hits.values())


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


def _vllm_like_handler(tok: HFTokenizer, seen: StandIn) -> type[BaseHTTPRequestHandler]:
    """vLLM 0.32's serve/tokenize: /tokenize (completion or chat request) and /detokenize,
    its 404 for an unknown model, FastAPI's 404 for an unknown path."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, status: int, doc: Any) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            with seen.lock:
                seen.hits[self.path] = seen.hits.get(self.path, 0) + 1
            if self.path not in ("/tokenize", "/detokenize"):
                return self._answer(404, {"detail": "Not Found"})
            if req.get("model") not in (None, MODEL):
                return self._answer(
                    404,
                    {
                        "error": {
                            "message": f"The model `{req['model']}` does not exist.",
                            "type": "NotFoundError",
                            "param": "model",
                            "code": 404,
                        }
                    },
                )
            if self.path == "/detokenize":
                return self._answer(200, {"prompt": tok.decode(req["tokens"])})
            if "messages" in req:
                # vLLM renders the template and encodes it without adding specials again.
                (msg,) = req["messages"]
                rendered = tok.render_chat(msg["content"])
                assert rendered is not None and req["add_generation_prompt"] is True
                ids = tok.encode(rendered, add_special_tokens=req["add_special_tokens"])
            else:
                ids = tok.encode(req["prompt"], add_special_tokens=req["add_special_tokens"])
            self._answer(
                200, {"count": len(ids), "max_model_len": 2048, "tokens": ids, "token_strs": None}
            )

    return Handler


@pytest.fixture
def stand_in(tok: HFTokenizer) -> Iterator[tuple[str, StandIn]]:
    seen = StandIn()
    for url in _serve(_vllm_like_handler(tok, seen)):
        yield url, seen


@pytest.fixture
def server_tok(stand_in: tuple[str, StandIn]) -> ServerTokenizer:
    # (generous: the first chat template render is slow on a loaded machine; this is about counts)
    return ServerTokenizer(stand_in[0], MODEL, timeout_s=60)


@pytest.mark.parametrize("length", [1, 2, 7, 64, 513, 1007])
def test_completion_prompts_have_exactly_the_asked_server_side_length(
    server_tok: ServerTokenizer, tok: HFTokenizer, length: int
) -> None:
    for seed in range(3):
        text = exact_length_prompt(server_tok, length, np.random.default_rng([seed, length]))
        assert len(tok.encode(text, add_special_tokens=True)) == length
        assert len(server_tok.encode(text, add_special_tokens=True)) == length


@pytest.mark.parametrize("length", [12, 40, 300])
def test_chat_prompts_are_counted_by_the_servers_tokenize_with_messages(
    server_tok: ServerTokenizer, tok: HFTokenizer, stand_in: tuple[str, StandIn], length: int
) -> None:
    pytest.importorskip("transformers")
    prompts = RandomPrompts(server_tok, input_len=length, output_len=4, seed=1, api="chat")
    for i in range(3):
        text = prompts.get(i).text
        rendered = tok.render_chat(text)
        assert rendered is not None and rendered.startswith("<s><|user|>")
        assert len(tok.encode(rendered, add_special_tokens=False)) == length
    assert server_tok.chat_token_count("hello") == server_token_count(tok, "hello", "chat")


def test_a_prompt_takes_a_handful_of_requests(
    server_tok: ServerTokenizer, stand_in: tuple[str, StandIn]
) -> None:
    _, seen = stand_in
    prompts = RandomPrompts(server_tok, input_len=256, output_len=4, seed=0)
    prompts.get(0)
    setup = server_tok.requests
    assert setup <= 15, f"first prompt (vocabulary and overhead included) took {setup} requests"
    n = 20
    prompts.pregenerate(range(1, n + 1))
    per_prompt = (server_tok.requests - setup) / n
    assert per_prompt <= 9, f"{per_prompt:.1f} requests per prompt"
    assert seen.total() == server_tok.requests  # the client's count is what the server saw


def test_sampleable_ids_are_clean_and_checked_in_few_requests(
    server_tok: ServerTokenizer, tok: HFTokenizer
) -> None:
    ids = server_tok.sampleable_ids()
    assert server_tok.requests <= 4  # empty prompt, corpus, separator, one batch decode
    corpus_ids = set(tok.encode(CORPUS, add_special_tokens=False))
    assert set(ids) <= corpus_ids and len(ids) >= 200
    assert not set(ids) & tok.special_ids()
    # The one-request check agrees with decoding every candidate alone.
    alone = {i for i in corpus_ids if (s := tok.decode([i])).strip() and "\ufffd" not in s}
    assert set(ids) == alone
    # The corpus's accented words split into byte pieces here: those are left out.
    assert len(alone) < len(corpus_ids)
    assert SEPARATOR not in CORPUS


def test_same_seed_same_prompts_from_another_tokenizer_object_and_after_pickling(
    stand_in: tuple[str, StandIn],
) -> None:
    url, _ = stand_in
    a = RandomPrompts(ServerTokenizer(url, MODEL), input_len=48, output_len=8, seed=3)
    texts = [a.get(i).text for i in range(4)]
    assert len(set(texts)) == 4
    fresh = RandomPrompts(ServerTokenizer(url, MODEL), input_len=48, output_len=8, seed=3)
    clone = pickle.loads(pickle.dumps(fresh))
    assert [clone.get(i).text for i in reversed(range(4))][::-1] == texts
    # The tokenizer travels as its settings, not its state.
    tok = pickle.loads(pickle.dumps(a.tokenizer))
    assert isinstance(tok, ServerTokenizer)
    assert (tok.base_url, tok.model, tok.timeout_s, tok.requests) == (url, MODEL, 10.0, 0)
    other = RandomPrompts(ServerTokenizer(url, MODEL), input_len=48, output_len=8, seed=4)
    assert other.get(0).text != texts[0]


def test_describe_names_the_server_and_keeps_the_local_fields(
    server_tok: ServerTokenizer, tiny_dir: Path
) -> None:
    d = RandomPrompts(server_tok, input_len=16, output_len=4, seed=1, api="chat").describe()
    assert d["tokenizer"] == f"server /tokenize at {server_tok.base_url} (model {MODEL})"
    assert (d["kind"], d["input_len"], d["output_len"], d["seed"], d["api"]) == (
        "random",
        16,
        4,
        1,
        "chat",
    )
    local_d = RandomPrompts(tiny_dir, input_len=16, output_len=4, seed=1).describe()
    assert local_d["tokenizer"] == str(tiny_dir)
    assert set(d) == set(local_d)


def test_a_dataset_records_the_servers_counts(
    server_tok: ServerTokenizer, tok: HFTokenizer, tmp_path: Path
) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hello world"}\n{"prompt": "import os\\nprint(os.sep)"}\n')
    ds = load_dataset(f, default_output_len=8, tokenizer=server_tok)
    assert [p.prompt_tokens for p in ds.prompts] == [
        server_token_count(tok, "hello world"),
        server_token_count(tok, "import os\nprint(os.sep)"),
    ]


def test_a_server_without_tokenize_is_a_usage_error_naming_it_and_the_fix() -> None:
    seen = StandIn()

    class NoTokenize(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            with seen.lock:
                seen.hits[self.path] = seen.hits.get(self.path, 0) + 1
            body = b'{"detail":"Not Found"}'
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    for url in _serve(NoTokenize):
        tok = ServerTokenizer(url, MODEL, timeout_s=5)
        start = time.monotonic()
        with pytest.raises(UsageError) as e:
            RandomPrompts(tok, input_len=32, output_len=4, seed=0).get(0)
        assert time.monotonic() - start < 5
        msg = str(e.value)
        assert f"{url}/tokenize" in msg and "HTTP 404" in msg and "Not Found" in msg
        assert "pass --tokenizer DIR (the model directory)" in msg
        assert seen.hits == {"/tokenize": 1}  # gave up at the first refusal


def test_a_wrong_model_name_is_the_servers_error_message(stand_in: tuple[str, StandIn]) -> None:
    url, _ = stand_in
    with pytest.raises(UsageError) as e:
        ServerTokenizer(url, "not-served").encode("hi", add_special_tokens=True)
    assert "The model `not-served` does not exist." in str(e.value)
    assert "--tokenizer DIR" in str(e.value)


def test_a_server_that_never_answers_is_a_usage_error_within_the_timeout() -> None:
    # Listening, never accepting: the connection is made by the kernel, no answer comes.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        tok = ServerTokenizer(url, MODEL, timeout_s=0.5)
        start = time.monotonic()
        with pytest.raises(UsageError) as e:
            exact_length_prompt(tok, 16, np.random.default_rng(0))
        elapsed = time.monotonic() - start
    assert elapsed < 3, f"took {elapsed:.1f}s with a 0.5s timeout"
    assert url in str(e.value) and "did not answer" in str(e.value)
    assert "--tokenizer DIR" in str(e.value)


def test_an_answer_that_is_not_vllms_shape_is_a_usage_error() -> None:
    class NotVllm(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = b'{"ids": [1, 2]}' if self.path == "/tokenize" else b"<html>ok</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    for url in _serve(NotVllm):
        tok = ServerTokenizer(url, MODEL, timeout_s=5)
        with pytest.raises(UsageError, match="without a token list"):
            tok.encode("x", add_special_tokens=True)
        with pytest.raises(UsageError, match="not a JSON object"):
            tok.decode([1])


def test_a_url_without_a_scheme_is_refused() -> None:
    with pytest.raises(UsageError, match="http"):
        ServerTokenizer("127.0.0.1:8000", MODEL)
