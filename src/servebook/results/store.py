"""Reading and writing ``DIR/results.json``.

Writing is atomic: the document goes to a temporary file in the same directory, is
fsynced, and replaces ``results.json`` with ``os.replace``; an interrupted run leaves the
previous complete document.  ``ResultsWriter(resume=True)`` loads it, refuses a run whose
provenance differs in what makes points comparable, keeps the valid points, and re-runs
the invalid ones (their old records move to ``superseded_points``).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from servebook import inputs
from servebook.errors import UsageError
from servebook.files import write_atomic
from servebook.results.aggregate import PrecisionTarget, aggregate, mark_precision
from servebook.results.evidence import one_source_per_level
from servebook.results.provenance import resume_mismatches, utc_now
from servebook.results.schema import RESULTS_NAME, SCHEMA, Point, PointKey, Provenance, Results


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
        write_atomic(self.path, self.results.to_json())
