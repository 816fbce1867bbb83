"""Dataset readers (``bench/datasets.py``) on hand-made files shaped like the public ones
(tests/unit/fixtures/datasets/README.md says which), and the refusal of malformed files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web

from servebook.bench.datasets import detect_format, read_dataset
from servebook.bench.tokens import HFTokenizer, server_token_count
from servebook.bench.trace_prompts import TracePrompts, dataset_prompts
from servebook.errors import UsageError
from tests.conftest import CliResult
from tests.unit.served_app import served, served_models

DATA = Path(__file__).parent / "fixtures" / "datasets"


def test_sharegpt_prompts_are_human_turns_with_system_context_and_empties_skipped() -> None:
    ds = read_dataset(DATA / "sharegpt.json", "sharegpt")
    prompts = [t.prompt for t in ds.texts]
    assert prompts == [
        "Write one sentence about the sea.",
        # Opens on the assistant: its greeting is no prompt; the human turn after it is.
        "List three prime numbers.",
        # A system turn is kept as context before the prompt.
        "You answer in French.\n\nSay good morning.",
    ]
    assert [t.reply for t in ds.texts] == [
        "The sea keeps every shore it touches a little restless.",
        "2, 3 and 5.",
        "Bonjour.",
    ]
    assert ds.skipped == {"empty conversation": 1, "no human turn": 1}
    assert ds.describe()["skipped"] == ds.skipped and ds.describe()["format"] == "sharegpt"


def test_sharegpt_output_len_is_the_reply_length_with_a_tokenizer(tok: HFTokenizer) -> None:
    path = DATA / "sharegpt.json"
    src = dataset_prompts(
        path, None, default_output_len=99, tokenizer=tok, api="completions", seed=0
    )
    p = src.get(2)
    assert p.output_len == len(tok.encode("Bonjour.", add_special_tokens=False))
    assert p.prompt_tokens == server_token_count(tok, p.text)
    assert src.describe()["format"] == "sharegpt" and len(src.describe()["sha256"]) == 64


def test_mooncake_rows_keep_hash_ids_blocks_and_the_millisecond_clock() -> None:
    ds = read_dataset(DATA / "mooncake.jsonl", "mooncake")
    assert ds.block_size == 512
    assert [r.hash_ids for r in ds.rows] == [(0, 1), (0, 2, 3), (4,), (0, 5), (6, 7)]
    assert [r.arrival_ns for r in ds.rows] == [0, 0, 120_000_000, 250_000_000, 400_000_000]
    assert [(r.input_len, r.output_len) for r in ds.rows][:2] == [(700, 12), (1100, 7)]


def test_azure_timestamps_keep_all_seven_fractional_digits() -> None:
    ds = read_dataset(DATA / "azure.csv", "azure")
    # Rows 1 and 2 are 100 ns apart: a float of seconds since the epoch (~1.7e9) gets that
    # wrong (its step there is ~240 ns).
    through_float = float("1700158546.6805901") - float("1700158546.6805900")
    assert round(through_float * 1e9) != 100
    assert [r.arrival_ns for r in ds.rows] == [0, 100, 3_492_936_000, 4_313_210_000]
    assert (ds.rows[0].input_len, ds.rows[0].output_len) == (374, 44)


def test_burstgpt_skips_and_counts_failed_rows() -> None:
    ds = read_dataset(DATA / "burstgpt.csv", "burstgpt")
    assert [(r.input_len, r.output_len) for r in ds.rows] == [(472, 18), (417, 276), (1360, 147)]
    assert [r.arrival_ns for r in ds.rows] == [0, 113_000_000_000, 152_000_000_000]
    assert ds.skipped == {"failed (Response tokens 0)": 2}


def test_trace_prompts_have_exact_lengths_and_share_exactly_the_blocks_they_share(
    tok: HFTokenizer,
) -> None:
    ds = read_dataset(DATA / "mooncake.jsonl", "mooncake")
    src = TracePrompts(ds, tok, seed=3)
    texts = [p.text for p in src.prompts]
    for p, row in zip(src.prompts, ds.rows, strict=True):
        assert len(tok.encode(p.text, add_special_tokens=True)) == row.input_len
        assert (p.prompt_tokens, p.output_len) == (row.input_len, row.output_len)

    def block(text: str, k: int) -> str:  # the text of content block k (BOS is not content)
        ids = tok.encode(text, add_special_tokens=False)
        return tok.decode(ids[k * 512 : (k + 1) * 512])

    # Rows 0, 1 and 3 open with hash id 0: the same first block, to the character.
    assert block(texts[0], 0) == block(texts[1], 0) == block(texts[3], 0)
    assert texts[1].startswith(block(texts[0], 0)) and texts[3].startswith(block(texts[0], 0))
    # Distinct ids, distinct content: rows 2 and 4 open otherwise, and row 0's second
    # block (id 1) is not row 1's (id 2).
    assert block(texts[2], 0)[:200] != block(texts[0], 0)[:200]
    assert block(texts[4], 0)[:200] != block(texts[0], 0)[:200]
    assert block(texts[0], 1)[:100] != block(texts[1], 1)[:100]
    # Built again from the same seed: the same prompts.
    assert [p.text for p in TracePrompts(ds, tok, seed=3).prompts] == texts


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("sharegpt.json", "sharegpt"),
        ("mooncake.jsonl", "mooncake"),
        ("azure.csv", "azure"),
        ("burstgpt.csv", "burstgpt"),
    ],
)
def test_format_is_detected_from_the_content(name: str, fmt: str) -> None:
    path = DATA / name
    assert detect_format(path, path.read_bytes()) == fmt


def test_jsonl_is_detected_and_an_unknown_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_text('{"prompt": "hi"}\n')
    assert detect_format(f, f.read_bytes()) == "jsonl"
    f.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(UsageError, match="cannot tell the dataset's format") as e:
        detect_format(f, f.read_bytes())
    assert "--dataset-format" in (e.value.hint or "")


MALFORMED = [
    # (format, file content, line, what the message names)
    ("jsonl", '{"prompt": "ok"}\n{"prompt": ""}\n', 2, '"prompt"'),
    (
        "sharegpt",
        '[\n  {"id": "a", "conversations": [{"from": "human", "value": "hi"}]},\n'
        '  {"id": "b", "conversations": [{"from": "robot", "value": "x"}]}\n]\n',
        3,
        'field "from"',
    ),
    (
        "mooncake",
        '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n'
        '{"timestamp": 5, "input_length": 10, "hash_ids": [1]}\n',
        2,
        'field "output_length"',
    ),
    (
        "azure",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:47.1,many,4\n",
        3,
        'field "ContextTokens"',
    ),
    (
        "burstgpt",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n3,ChatGPT,10,4,14,API log\n",
        3,
        'field "Timestamp"',
    ),
]


@pytest.mark.parametrize(("fmt", "text", "line", "field"), MALFORMED)
def test_a_malformed_file_of_each_format_is_refused_naming_line_and_field(
    tmp_path: Path, fmt: str, text: str, line: int, field: str
) -> None:
    f = tmp_path / f"bad.{fmt}"
    f.write_text(text)
    with pytest.raises(UsageError) as e:
        dataset_prompts(f, fmt, default_output_len=4, tokenizer=None, api="completions", seed=0)
    assert e.value.exit_code == 2
    assert f"{f}:{line}" in str(e.value) and field in str(e.value), str(e.value)


def test_bench_refuses_a_malformed_trace_with_exit_2_before_any_load(
    cli: Callable[..., CliResult], tiny_dir: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "trace.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,12,x\n")
    app = web.Application()
    app.router.add_get("/v1/models", served_models("tiny"))
    out = tmp_path / "out"
    with served(app) as url:
        r = cli(
            "bench", "--url", url, "--model", "tiny", "--tokenizer", str(tiny_dir),
            "--dataset", str(bad), "-o", str(out),
        )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert f"{bad}:2" in r.stderr and '"GeneratedTokens"' in r.stderr, r.stderr
    assert not out.exists()
