"""Reading and writing ``DIR/results.json``.

Writing is atomic: the document goes to a temporary file in the same directory, is
fsynced, and replaces ``results.json`` with ``os.replace``; an interrupted run leaves the
previous complete document.  ``ResultsWriter(resume=True)`` loads it, refuses a run whose
provenance differs in what makes points comparable, keeps the valid points, and re-runs
the invalid ones (their old records move to ``superseded_points``).

**One run owns a results directory.**  A writer takes ``DIR/results.lock`` (created
exclusively, naming its pid) before it checks for an existing ``results.json``, and reads
the lock again before each write: a second run given the same ``-o`` is refused at its
start naming the first (their points would have replaced each other's file point by
point), and a run whose lock was taken over stops instead of overwriting the other's
file.  A lock whose pid is no longer running is stale (a killed run) and is taken over.
Taking the lock also writes into ``DIR`` before any load, so a directory that cannot be
written is refused before a point is measured.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path

from pydantic import ValidationError

from servebook import inputs
from servebook.errors import ServebookError, UsageError
from servebook.files import WriteFailed, write_atomic
from servebook.results.aggregate import PrecisionTarget, aggregate, mark_precision
from servebook.results.evidence import one_source_per_level
from servebook.results.provenance import resume_mismatches, utc_now
from servebook.results.schema import RESULTS_NAME, SCHEMA, Point, PointKey, Provenance, Results

LOCK_NAME = "results.lock"


class ResultsTaken(ServebookError):
    """Another run took this run's results directory while it ran: this run's next point
    is not written over the other's file."""

    exit_code = 1  # findings.EXIT_FAIL: the run did not finish as asked
    label = "results not written"


def load_results(path: str | Path) -> Results:
    """A results document, read through ``servebook.inputs`` (a regular file, bounded,
    UTF-8, nesting bounded); ``UsageError`` naming the file when it is not one."""
    path = Path(path)
    text = inputs.read_text(path, "results file")
    try:
        doc = inputs.parse_json(text, path, "results file")
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not JSON (line {e.lineno}): {e.msg}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise UsageError(
            f"{path}: not a servebook results file (schema {doc.get('schema')!r}, "
            f"expected {SCHEMA!r})"
            if isinstance(doc, dict)
            else f"{path}: not a servebook results file"
        )
    try:
        return Results.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise UsageError(f"{path}: invalid results at {where}: {first['msg']}") from None


class ResultsWriter:
    """Owns ``DIR/results.json`` for one run: adds points, recomputes aggregates, writes
    atomically after each point."""

    def __init__(self, out_dir: str | Path, provenance: Provenance, *, resume: bool = False):
        self.path = Path(out_dir) / RESULTS_NAME
        self.lock = Path(out_dir) / LOCK_NAME
        self._made_dir = _take(self.lock)
        try:
            self._open(provenance, resume)
        except BaseException:
            self.close()
            raise

    def _open(self, provenance: Provenance, resume: bool) -> None:
        if resume and self.path.exists():
            old = load_results(self.path)
            diff = resume_mismatches(old.provenance, provenance)
            if diff:
                raise UsageError(
                    f"{self.path}: cannot resume: the run differs from the file in "
                    f"{', '.join(diff)}. Points from different settings do not belong in one "
                    "results file; write to a new -o DIR, or rerun with the file's settings."
                )
            provenance = provenance.model_copy(update={"started_at": old.provenance.started_at})
            self.results = old.model_copy(update={"provenance": provenance})
        elif self.path.exists() and not resume:
            raise UsageError(
                f"{self.path} already exists; pass --resume to continue that run, or choose "
                "another -o DIR"
            )
        else:
            self.results = Results(provenance=provenance)

    def done_keys(self) -> set[PointKey]:
        """Points a resumed run skips: the valid ones.  Invalid points are run again."""
        return {p.key for p in self.results.points if p.valid}

    def add(self, point: Point) -> None:
        kept: list[Point] = []
        old: list[Point] = []
        for p in self.results.points:
            (old if p.key == point.key else kept).append(p)
        self.results.superseded_points.extend(old)
        precision = PrecisionTarget.from_protocol(self.results.provenance.protocol)
        # One source per level for TPOT and ITL (``evidence.one_source``): a repetition
        # that made the engine's histogram lead makes it lead on the level's others too.
        self.results.points = mark_precision(one_source_per_level([*kept, point]), precision)
        self.results.aggregates = aggregate(self.results.points, precision)
        self.results.provenance.ended_at = utc_now()
        self.write()

    def write(self) -> None:
        holder = _holder(self.lock)
        if holder != os.getpid():
            raise ResultsTaken(
                f"{self.lock.parent} was taken by another run "
                + (f"(pid {holder}) " if holder else "(its lock file is gone) ")
                + f"while this one ran; this run's last point is not written, so that the "
                f"other's {RESULTS_NAME} is not overwritten. {len(self.results.points)} "
                "point(s) of this run were measured.",
                hint="give each run its own -o DIR",
            )
        try:
            write_atomic(self.path, self.results.to_json())
        except WriteFailed as e:
            raise WriteFailed(
                f"{e} (the file holds the points written before this one: it is replaced "
                "whole or not at all)",
                hint="free space or fix the directory's permissions, then rerun with --resume",
            ) from None

    def close(self) -> None:
        """Give the directory up: remove the lock when it is still this run's, and the
        directory itself when this writer made it and nothing was written in it."""
        if _holder(self.lock) == os.getpid():
            with contextlib.suppress(OSError):
                self.lock.unlink()
        if self._made_dir:
            with contextlib.suppress(OSError):
                self.lock.parent.rmdir()  # only when empty

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _holder(lock: Path) -> int | None:
    """The pid a lock file names; None when there is none or it names none."""
    try:
        text = lock.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    first = text.split()[0] if text.split() else ""
    return int(first) if first.isdigit() else None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: running
    return True


def _take(lock: Path) -> bool:
    """Create ``lock`` naming this process, or take it over from a run no longer running;
    ``UsageError`` naming the running one, or the directory that cannot be written.
    Returns whether the directory was made here."""
    made = not lock.parent.exists()
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _unwritable(lock.parent, e) from None
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            holder = _holder(lock)
            if holder is not None and holder != os.getpid() and _running(holder):
                raise UsageError(
                    f"{lock.parent} is being written by another run (pid {holder}, "
                    f"{lock.name}); two runs in one directory replace each other's "
                    f"{RESULTS_NAME} point by point",
                    hint="choose another -o DIR, or wait for that run to end",
                ) from None
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()  # a stale lock: its run ended without removing it
            continue
        except OSError as e:
            raise _unwritable(lock.parent, e) from None
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
        return made
    raise UsageError(f"{lock}: could not take it (another run keeps replacing it)")


def _unwritable(directory: Path, e: OSError) -> UsageError:
    why = "no space left" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    return UsageError(
        f"-o {directory}: cannot write there ({why}); nothing was measured",
        hint="choose a directory you can write, e.g. -o ./results",
    )
