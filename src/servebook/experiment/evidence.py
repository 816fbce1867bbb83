"""The server's evidence per arm and level of an experiment: what every point's counters
said (PD handoff share, speculative acceptance, prefix-hit share, preemptions, the
engines' and the client's errors), gathered over the blocks and repetitions that count,
and the levels an arm's handoff failed open at.

A level where an arm's PD handoff failed open (a point of it failed SB407: decode
recomputed the prompt instead of receiving its KV) is invalid for that arm as a whole: the
deployment measured there was not the topology the arm names, in that repetition, and its
other repetitions and blocks at that level are the same deployment under the same load.
Its figures are left out of the comparisons, the absolute table, the Pareto view and the
max load, and the report lists it with the reasons.  Its evidence is still given: the
share it fell to is the evidence."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from servebook.bench.validity import HANDOFF_SHARE
from servebook.engines.handoff import NOT_JUDGED
from servebook.experiment.analysis import level_of
from servebook.results.schema import Point, Results

# What a point's ``server`` evidence carries (``results.evidence.server_evidence``) and is
# gathered per arm and level: key -> whether it is a share (0..1) of something.
SERVER_FIGURES: dict[str, bool] = {
    "handoff_share": True,
    "spec_acceptance": True,
    "prefix_hit_share": True,
    "preemptions": False,
    "request_errors": False,
}


def failed_open(p: Point) -> str | None:
    """The point's SB407 reason when its handoff failed open (or could not be judged, which
    counts the same: nothing shows the KV arrived), else None."""
    prefix = f"{HANDOFF_SHARE.id}:"
    return next((r for r in p.invalid_reasons if r.startswith(prefix)), None)


def _spread(values: list[float]) -> dict[str, Any] | None:
    """Mean, lowest and highest of one figure over the points that carried it."""
    if not values:
        return None
    return {
        "mean": round(sum(values) / len(values), 5),
        "min": round(min(values), 5),
        "max": round(max(values), 5),
        "n": len(values),
    }


def _number(v: Any) -> float | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _row(arm: str, level: float, points: list[tuple[int, Point]]) -> dict[str, Any]:
    """One arm at one level: every point's server figures (valid or not: an invalid
    point's evidence is why it is invalid), the client's errors, and the handoff verdict."""
    row: dict[str, Any] = {"arm": arm, "level": level}
    for key in SERVER_FIGURES:
        row[key] = _spread([v for _, p in points if (v := _number(p.server.get(key))) is not None])
    ok = sum(p.requests_ok for _, p in points)
    errors = sum(p.errors for _, p in points)
    row["errors"] = errors
    row["error_rate"] = round(errors / (ok + errors), 5) if ok + errors else None
    row["points"] = len(points)
    row["valid_points"] = sum(1 for _, p in points if p.valid)
    row["blocks"] = sorted({b for b, _ in points})
    # The checks its invalid points failed (each left out on its own, as everywhere)
    row["invalid_checks"] = sorted(
        {r.split(":", 1)[0] for _, p in points if not p.valid for r in p.invalid_reasons}
    )
    row["missing"] = sorted({m for _, p in points for m in p.server.get("missing") or []})
    opened: list[dict[str, Any]] = [
        {"block": b, "repetition": p.repetition, "reason": why}
        for b, p in sorted(points, key=lambda bp: (bp[0], bp[1].repetition))
        if (why := failed_open(p)) is not None
    ]
    row["handoff_failed_open"] = opened
    row["valid"] = not opened
    where = ", ".join(f"block {o['block']} rep {o['repetition']}" for o in opened)
    # Prompts too short for the connector's whole blocks: no share could show a failure.
    unjudged = all(NOT_JUDGED in o["reason"] for o in opened)
    row["invalid_reason"] = (
        f"PD handoff {'not judged' if unjudged else 'failed open'} in {len(opened)} of "
        f"{len(points)} point(s) ({where})"
        if opened
        else None
    )
    return row


def per_level(results: Mapping[tuple[str, int], Results]) -> list[dict[str, Any]]:
    """Every arm x level of ``results`` (arm, block -> its results), in arm and level
    order: the server evidence gathered over its blocks and repetitions, and whether the
    level is valid for the arm (:func:`failed_open`)."""
    by: dict[tuple[str, float], list[tuple[int, Point]]] = {}
    for (arm, block), res in results.items():
        for p in res.points:
            by.setdefault((arm, level_of(p)), []).append((block, p))
    return [_row(arm, level, pts) for (arm, level), pts in sorted(by.items())]


def invalid_levels(rows: list[dict[str, Any]]) -> set[tuple[str, float]]:
    """(arm, level) of every level invalid for its arm."""
    return {(r["arm"], r["level"]) for r in rows if not r["valid"]}
