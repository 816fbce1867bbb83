"""Datasets and traces as people bring them: ``--dataset FILE --dataset-format FMT``.

Each reader turns a file into plain rows and refuses a file that is not what its format
says with a ``UsageError`` (exit 2) naming the file, the line (a CSV's header is line 1, a
JSON array's element is counted from 1) and the field, and what the format expects.
A format not given is detected from the content (:func:`detect_format`).

**Forms** (the shapes come from the public files and the tools that read them; no code or
data of theirs is copied here):

* ``jsonl``: servebook's own, one ``{"prompt": ..., "output_len": ...}`` a line
  (``workload.load_dataset`` reads it; only its detection is here).
* ``sharegpt``: a JSON array of ``{"id", "conversations": [{"from", "value"}]}``, the
  shape of ``ShareGPT_V3_unfiltered_cleaned_split.json`` that ``vllm bench serve
  --dataset-name sharegpt`` reads.  The prompt is the first ``human`` turn (never an
  assistant one); its output length is the reply after it, counted with the tokenizer
  when one is given (vLLM's convention), else ``--output-len``.  A ``system`` turn before
  it is kept as context, prepended to the prompt; assistant (``gpt``) turns before the
  first human turn are dropped.  Empty conversations, and those with no human turn, are
  skipped and counted.
* ``mooncake``: JSONL of ``{"timestamp" (ms from the first), "input_length",
  "output_length", "hash_ids"}``, as in Mooncake's FAST'25 traces
  (kvcache-ai/Mooncake ``mooncake_trace.jsonl``; described in ai-dynamo/dynamo
  ``benchmarks/data_generator/README.md`` and AIPerf's ``trace_replay.md``).  Each hash id
  names one block of 512 tokens (``MOONCAKE_BLOCK``); rows that share leading ids share
  that prefix.
* ``azure``: the Azure LLM inference trace (Azure/AzurePublicDataset,
  ``AzureLLMInferenceTrace_code.csv`` / ``_conv.csv``): ``TIMESTAMP,ContextTokens,
  GeneratedTokens`` with timestamps such as ``2023-11-16 18:15:46.6805900`` (7 fractional
  digits: 100 ns).  They are read as integers of nanoseconds, never through a float of
  seconds since the epoch (a double keeps ~0.2 us there, and the differences the replay
  schedules are what matters).
* ``burstgpt``: BurstGPT's CSV (HPMLL/BurstGPT ``BurstGPT_1.csv``: ``Timestamp,Model,
  Request tokens,Response tokens,Total tokens,Log Type``), ``Timestamp`` in seconds from
  the trace's start.  Rows whose ``Response tokens`` is 0 are the trace's failed requests
  (its README says so): skipped and counted.

Rows with a clock (mooncake, azure, burstgpt) keep their arrival as an offset in
nanoseconds from the first row, in file order (a trace out of order is refused: replaying
it would reorder requests silently).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

from servebook.bench.tokens import Api, TextTokenizer, server_token_count
from servebook.bench.workload import DatasetPrompts, Prompt
from servebook.errors import UsageError

Format = Literal["jsonl", "sharegpt", "mooncake", "azure", "burstgpt"]
FORMATS: tuple[Format, ...] = ("jsonl", "sharegpt", "mooncake", "azure", "burstgpt")
#: Tokens per hash id in Mooncake's traces (their README; AIPerf and GuideLLM use 512 too).
MOONCAKE_BLOCK = 512

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


@dataclass(frozen=True)
class TextRequest:
    """A request given as text (sharegpt).  ``reply``: the dataset's own answer, whose
    length sets the output length where a tokenizer counts it (else ``--output-len``)."""

    prompt: str
    reply: str | None = None


@dataclass(frozen=True)
class TextConversation:
    """A whole conversation (sharegpt, for ``--multi-turn``): its system turn, and each
    human turn with the dataset's reply to it (``None`` when none followed)."""

    system: str | None
    turns: list[tuple[str, str | None]]


@dataclass(frozen=True)
class TraceRequest:
    """A request given by lengths (mooncake, azure, burstgpt): its arrival as nanoseconds
    after the trace's first row, and the hash ids of its prompt's blocks (mooncake)."""

    arrival_ns: int
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()


@dataclass
class Dataset:
    """A dataset file, read: text requests or trace rows, what was skipped and why."""

    path: str
    format: Format
    sha256: str
    texts: list[TextRequest] = field(default_factory=list)
    conversations: list[TextConversation] = field(default_factory=list)
    rows: list[TraceRequest] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    block_size: int | None = None

    def describe(self) -> dict[str, Any]:
        """What provenance records of the file (its path is a place, its hash the
        content)."""
        d: dict[str, Any] = {
            "format": self.format,
            "path": self.path,
            "sha256": self.sha256,
            "rows": len(self.texts) + len(self.rows),
            "skipped": dict(self.skipped),
        }
        if self.block_size is not None:
            d["block_size"] = self.block_size
        return d


def _bad(where: str, what: str, fmt: str) -> UsageError:
    return UsageError(
        f"{where}: {what}",
        hint=f"fix that line, or check that the file is {fmt} (--dataset-format; "
        "`servebook bench --help` shows each format's shape)",
    )


def _count(v: Any, where: str, name: str, fmt: str, *, least: int = 0) -> int:
    """A non-negative (or at least ``least``) integer field; a CSV's text is parsed."""
    if isinstance(v, str):
        try:
            v = int(v.strip())
        except ValueError:
            raise _bad(where, f'field "{name}": {v!r} is not an integer', fmt) from None
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise _bad(where, f'field "{name}" must be an integer >= {least}, got {v!r}', fmt)
    return v


# --- detection ------------------------------------------------------------------------------


def detect_format(path: Path, raw: bytes) -> Format:
    """The format a file's content says: a JSON array is ShareGPT; JSON lines with
    ``hash_ids`` or ``input_length`` are Mooncake, with ``prompt`` servebook's JSONL; a CSV
    header with ``TIMESTAMP,ContextTokens`` is Azure's, with ``Request tokens`` BurstGPT's."""
    text = raw.decode("utf-8", "replace").lstrip("\ufeff")
    head = text.lstrip()
    if head.startswith("["):
        return "sharegpt"
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    if head.startswith("{"):
        try:
            obj = json.loads(first)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and ("hash_ids" in obj or "input_length" in obj):
            return "mooncake"
        if isinstance(obj, dict) and "prompt" in obj:
            return "jsonl"
    cols = {c.strip() for c in first.split(",")}
    if set(AZURE_COLUMNS) <= cols:
        return "azure"
    if set(BURSTGPT_COLUMNS) <= cols:
        return "burstgpt"
    raise UsageError(
        f"{path}: cannot tell the dataset's format from its first line {first[:80]!r}",
        hint="name it with --dataset-format " + "|".join(FORMATS),
    )


# --- readers --------------------------------------------------------------------------------


def _json_lines(path: Path, text: str, fmt: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise _bad(where, f"not JSON ({e.msg}); each line must be one object", fmt) from None
        if not isinstance(obj, dict):
            want = 'an object with a "prompt"' if fmt == "jsonl" else "one JSON object"
            raise _bad(where, f"expected {want}, got {obj!r:.60}", fmt)
        yield where, obj


def read_mooncake(path: Path, text: str, ds: Dataset) -> None:
    ds.block_size = MOONCAKE_BLOCK
    first: Decimal | None = None
    last = Decimal(0)
    for where, obj in _json_lines(path, text, "mooncake"):
        for name in ("timestamp", "input_length", "output_length", "hash_ids"):
            if name not in obj:
                raise _bad(where, f'field "{name}" is missing', "mooncake")
        ts = _decimal(obj["timestamp"], where, "timestamp", "mooncake")
        ids = obj["hash_ids"]
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise _bad(where, 'field "hash_ids" must be a list of integers', "mooncake")
        n_in = _count(obj["input_length"], where, "input_length", "mooncake", least=1)
        first = ts if first is None else first
        last = _in_order(ts, last, where, "timestamp", "mooncake")
        ds.rows.append(
            TraceRequest(
                _ns(ts - first, Decimal(1_000_000)),
                n_in,
                _count(obj["output_length"], where, "output_length", "mooncake", least=1),
                tuple(ids),
            )
        )


def _decimal(v: Any, where: str, name: str, fmt: str) -> Decimal:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise _bad(where, f'field "{name}" must be a number, got {v!r:.40}', fmt)
    try:
        d = Decimal(str(v).strip())
    except InvalidOperation:
        raise _bad(where, f'field "{name}": {v!r:.40} is not a number', fmt) from None
    if not d.is_finite() or d < 0:
        raise _bad(where, f'field "{name}" must be a number >= 0, got {v!r:.40}', fmt)
    return d


def _in_order(ts: Decimal, last: Decimal, where: str, name: str, fmt: str) -> Decimal:
    if ts < last:
        raise _bad(
            where,
            f'field "{name}" goes back in time ({ts} after {last}); a trace is replayed '
            "in file order, so its rows must be sorted by time",
            fmt,
        )
    return ts


def _ns(d: Decimal, per_unit_ns: Decimal) -> int:
    return int(d * per_unit_ns)


def _csv_rows(
    path: Path, text: str, columns: tuple[str, ...], fmt: str
) -> Iterator[tuple[str, dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(text))
    have = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in columns if c not in have]
    if missing:
        raise _bad(
            f"{path}:1",
            f"the header lacks column(s) {', '.join(missing)} (it has {', '.join(have)})",
            fmt,
        )
    for row in reader:
        where = f"{path}:{reader.line_num}"
        clean = {(k or "").strip(): (v or "") for k, v in row.items()}
        if any(clean.get(c, "") == "" for c in columns):
            empty = next(c for c in columns if clean.get(c, "") == "")
            raise _bad(where, f'field "{empty}" is empty or missing', fmt)
        yield where, clean


def azure_time_ns(text: str, where: str) -> int:
    """``2023-11-16 18:15:46.6805900`` (UTC) as integer nanoseconds since the epoch, every
    fractional digit kept (datetime itself stops at microseconds)."""
    whole, _, frac = text.strip().partition(".")
    try:
        t = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        raise _bad(
            where,
            f'field "TIMESTAMP": {text!r} is not a time like 2023-11-16 18:15:46.6805900',
            "azure",
        ) from None
    if frac and (not frac.isdigit() or len(frac) > 9):
        raise _bad(where, f'field "TIMESTAMP": fraction {frac!r} is not 1-9 digits', "azure")
    return int(t.timestamp()) * 1_000_000_000 + int((frac or "0").ljust(9, "0"))


def read_azure(path: Path, text: str, ds: Dataset) -> None:
    first: int | None = None
    last = 0
    for where, row in _csv_rows(path, text, AZURE_COLUMNS, "azure"):
        t = azure_time_ns(row["TIMESTAMP"], where)
        first = t if first is None else first
        last = int(_in_order(Decimal(t), Decimal(last), where, "TIMESTAMP", "azure"))
        ds.rows.append(
            TraceRequest(
                t - first,
                _count(row["ContextTokens"], where, "ContextTokens", "azure", least=1),
                _count(row["GeneratedTokens"], where, "GeneratedTokens", "azure", least=1),
            )
        )


def read_burstgpt(path: Path, text: str, ds: Dataset) -> None:
    first: Decimal | None = None
    last = Decimal(0)
    for where, row in _csv_rows(path, text, BURSTGPT_COLUMNS, "burstgpt"):
        ts = _decimal(row["Timestamp"], where, "Timestamp", "burstgpt")
        n_in = _count(row["Request tokens"], where, "Request tokens", "burstgpt")
        n_out = _count(row["Response tokens"], where, "Response tokens", "burstgpt")
        last = _in_order(ts, last, where, "Timestamp", "burstgpt")
        if n_out == 0:
            ds.skipped["failed (Response tokens 0)"] = (
                ds.skipped.get("failed (Response tokens 0)", 0) + 1
            )
            continue
        if n_in == 0:
            raise _bad(where, 'field "Request tokens" must be at least 1, got 0', "burstgpt")
        first = ts if first is None else first
        ds.rows.append(TraceRequest(_ns(ts - first, Decimal(1_000_000_000)), n_in, n_out))


def _sharegpt_turns(conv: Any, where: str) -> list[tuple[str, str]]:
    turns = conv.get("conversations") if isinstance(conv, dict) else None
    if not isinstance(turns, list):
        raise _bad(where, 'field "conversations" must be a list of turns', "sharegpt")
    out = []
    for k, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict) or not isinstance(turn.get("from"), str):
            raise _bad(where, f'conversations[{k}]: field "from" must be a string', "sharegpt")
        if not isinstance(turn.get("value"), str):
            raise _bad(where, f'conversations[{k}]: field "value" must be a string', "sharegpt")
        role = turn["from"]
        if role not in SHAREGPT_ROLES:
            raise _bad(
                where,
                f'conversations[{k}]: field "from" is {role!r}; ShareGPT roles are '
                + ", ".join(sorted(SHAREGPT_ROLES)),
                "sharegpt",
            )
        out.append((SHAREGPT_ROLES[role], turn["value"]))
    return out


#: ShareGPT's speaker names, and the role each is.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "assistant": "assistant",
    "system": "system",
}


def _skip(ds: Dataset, why: str) -> None:
    ds.skipped[why] = ds.skipped.get(why, 0) + 1


def _array_items(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """The elements of a JSON array with the line each starts on."""
    dec = json.JSONDecoder()
    i = len(text) - len(text.lstrip())
    if not text.startswith("[", i):
        raise _bad(f"{path}:1", "expected a JSON array of conversations", "sharegpt")
    i += 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        line = text.count("\n", 0, i) + 1
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise _bad(f"{path}:{e.lineno}", f"not JSON ({e.msg})", "sharegpt") from None
        yield line, obj


def read_sharegpt(path: Path, text: str, ds: Dataset) -> None:
    for line, conv in _array_items(path, text):
        ident = conv.get("id") if isinstance(conv, dict) else None
        where = f"{path}:{line}" + (f" (conversation {ident!r})" if ident is not None else "")
        turns = _sharegpt_turns(conv, where)
        context = [v for r, v in turns if r == "system"]
        chat = [(r, v) for r, v in turns if r != "system"]
        while chat and chat[0][0] == "assistant":
            chat.pop(0)  # a conversation opening on the assistant: its first reply is no prompt
        if not turns:
            _skip(ds, "empty conversation")
            continue
        if not chat or not chat[0][1].strip():
            _skip(ds, "no human turn")
            continue
        prompt = "\n\n".join([*context, chat[0][1]])
        reply = chat[1][1] if len(chat) > 1 and chat[1][0] == "assistant" else None
        ds.texts.append(TextRequest(prompt, reply))
        ds.conversations.append(TextConversation("\n\n".join(context) or None, _pairs(chat)))


def _pairs(chat: list[tuple[str, str]]) -> list[tuple[str, str | None]]:
    """Each non-empty user turn and the assistant turn right after it, if any."""
    out: list[tuple[str, str | None]] = []
    for k, (role, value) in enumerate(chat):
        if role == "user" and value.strip():
            nxt = chat[k + 1] if k + 1 < len(chat) else None
            out.append((value, nxt[1] if nxt is not None and nxt[0] == "assistant" else None))
    return out


#: The readers of this module (``jsonl``, servebook's own, is ``workload.load_dataset``'s).
READERS: dict[Format, Callable[[Path, str, Dataset], None]] = {
    "sharegpt": read_sharegpt,
    "mooncake": read_mooncake,
    "azure": read_azure,
    "burstgpt": read_burstgpt,
}


def resolve_format(path: str | Path, fmt: str | None) -> Format:
    """``fmt`` checked, or the format ``path``'s content says (:func:`detect_format`)."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise UsageError(f"--dataset-format {fmt!r}: choose one of {', '.join(FORMATS)}")
        return fmt
    p = Path(path)
    return detect_format(p, _read(p))


def _read(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError as e:
        raise UsageError(f"{p}: cannot read the dataset: {e.strerror or e}") from None


def read_dataset(path: str | Path, fmt: Format) -> Dataset:
    """Read ``path`` as ``fmt`` (not ``jsonl``: ``workload.load_dataset`` reads that); a
    file with no usable row is refused too."""
    p = Path(path)
    if fmt not in READERS:
        raise ValueError(f"read_dataset does not read {fmt}")
    raw = _read(p)
    try:
        text = raw.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as e:
        raise UsageError(f"{p}: not UTF-8 text (byte {e.start})") from None
    ds = Dataset(str(p), fmt, hashlib.sha256(raw).hexdigest())
    READERS[fmt](p, text, ds)
    if not ds.texts and not ds.rows:
        skipped = f" ({_skipped_text(ds.skipped)} skipped)" if ds.skipped else ""
        raise UsageError(f"{p}: no usable request in this {fmt} file{skipped}")
    return ds


def _skipped_text(skipped: dict[str, int]) -> str:
    return ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))


def load_dataset(
    path: str | Path,
    *,
    default_output_len: int,
    tokenizer: TextTokenizer | None = None,
    api: Api = "completions",
) -> DatasetPrompts:
    """Read servebook's JSONL (one ``{"prompt": STR, "output_len": INT?}`` a line, blank
    lines skipped); with a tokenizer each prompt's server-side length is recorded."""
    p = Path(path)
    raw = _read(p)
    prompts: list[Prompt] = []
    for where, obj in _json_lines(p, raw.decode("utf-8", "replace"), "jsonl"):
        text = obj.get("prompt")
        if not isinstance(text, str) or not text:
            raise _bad(where, '"prompt" must be a non-empty string', "jsonl")
        out = obj.get("output_len", default_output_len)
        if isinstance(out, bool) or not isinstance(out, int) or out < 1:
            raise _bad(where, f'"output_len" must be a positive integer, got {out!r}', "jsonl")
        n = server_token_count(tokenizer, text, api) if tokenizer is not None else None
        prompts.append(Prompt(text, out, n))
    return DatasetPrompts(prompts, str(p), hashlib.sha256(raw).hexdigest())
