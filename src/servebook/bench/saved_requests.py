"""Every request's raw record, kept beside results.json (``bench --save-requests``), as
``vllm bench serve --save-detailed`` keeps its per-request lists: the user's to analyse;
``report`` and ``compare`` never read them (they read only results.json).

One gzip-compressed JSON Lines file per point, ``DIR/requests/<level>-rep<R>.jsonl.gz``
(``c64-rep0``, ``rate2.5-rep1``), written whole to a temporary name, fsynced and renamed,
so a file is never half-written and a point re-run (``--resume``) replaces its own.  The
first line describes the file (``REQUESTS_SCHEMA``, the clock, the window's edges and
the agents); every other line is one request::

    {"index": 7, "agent": 1, "latency_from": "sent", "scheduled_ns": ..., "sent_ns": ...,
     "first_token_ns": ..., "end_ns": ..., "chunk_ns": [...], "chunk_tokens": null,
     "output_tokens": 128, "prompt_tokens": 1024, "status": 200, "error": null,
     "cancelled": false, "counted": true}

Times are CLOCK_MONOTONIC nanoseconds of the bench command's process (agents' records
corrected onto it, ``bench/coordinator.py``), the clock of ``window.start_monotonic_ns``
in results.json.  ``counted``: the request is one of the point's window requests that
gave its latency figures.  ``error`` is the server's text, redacted (``servebook.redact``)
as results.json is: a proxy that echoes the request's Authorization header writes the key
into every failed request's error.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servebook import redact
from servebook.bench.figures import window_records
from servebook.bench.records import LoadResult, RequestRecord
from servebook.results.schema import Point

REQUESTS_SCHEMA = "servebook.requests/1"
REQUESTS_DIR = "requests"


def requests_path(out_dir: Path, point: Point) -> Path:
    level = f"c{point.concurrency}" if point.concurrency is not None else f"rate{point.rate:g}"
    return out_dir / REQUESTS_DIR / f"{level}-rep{point.repetition}.jsonl.gz"


def request_line(r: RequestRecord, counted: bool) -> dict[str, Any]:
    return {
        "index": r.index,
        "agent": r.worker,
        "latency_from": r.latency_from,
        "scheduled_ns": r.scheduled_ns,
        "sent_ns": r.sent_ns or None,
        "first_token_ns": r.chunk_ns[0] if r.chunk_ns else None,
        "end_ns": r.end_ns or None,
        "chunk_ns": list(r.chunk_ns),
        "chunk_tokens": list(r.chunk_tokens) if r.chunk_tokens is not None else None,
        "output_tokens": r.output_tokens,
        "prompt_tokens": r.prompt_tokens,
        "status": r.status,
        "error": None if r.error is None else redact.text(r.error),
        "cancelled": r.cancelled,
        "counted": counted,
    }


def write_point_requests(out_dir: Path, point: Point, load: LoadResult) -> Path:
    """Write the point's file (module docstring); returns its path."""
    ws = point.window.start_monotonic_ns if point.window else None
    we = point.window.end_monotonic_ns if point.window else None
    counted = {id(r) for r in window_records(load.records, ws, we)[0]} if ws and we else set()
    path = requests_path(out_dir, point)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    head = {
        "schema": REQUESTS_SCHEMA,
        "clock": "CLOCK_MONOTONIC ns of the bench command's process",
        "concurrency": point.concurrency,
        "rate": point.rate,
        "repetition": point.repetition,
        "window_start_ns": ws,
        "window_end_ns": we,
        "agents": [a.to_dict() for a in load.agents] or None,
        "requests": len(load.records),
    }
    with open(tmp, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as gz:
            gz.write((json.dumps(redact.scrub(head)[0]) + "\n").encode())
            for r in load.records:
                line = json.dumps(request_line(r, id(r) in counted), separators=(",", ":"))
                gz.write(line.encode() + b"\n")
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, path)
    return path


def read_requests(path: Path) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """(the file's description, its requests) of one point's file."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    return json.loads(lines[0]), (json.loads(x) for x in lines[1:])
