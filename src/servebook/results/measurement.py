"""Whether a load level's figures are a measurement, and which of a run's protocol choices
bias them (issue 32, finding 3).

Field notes ("Benchmarks"): a published sweep did not reproduce because it was too short,
had no warm-up and ran its points low to high.  The protocol's defaults avoid each, but
they were only defaults: ``bench --duration 1s --warmup 0s --repetitions 1
--min-requests 1`` gave a "valid" point and exit 0.  Now a level is *not a measurement*
unless

* its points had a warm-up (a replay excepted: its window is the whole trace),
* each valid point's window held at least ``MIN_WINDOW_REQUESTS`` requests, and
* it has at least ``MIN_REPETITIONS`` valid repetitions (an interval needs two);

such a level is shown as "not a measurement" with these reasons, and never drawn as a
figure.  The choices that bias a run it still measures (``--order ascending``, no
warm-up) are named in the report's headline.  Every reader (report, plots, the bench
table) asks here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from servebook.results.schema import Point

#: Fewer requests than this in a window give percentiles of noise (p90 of 9 is the top one).
MIN_WINDOW_REQUESTS = 10
#: A mean without an interval is one sample.
MIN_REPETITIONS = 2


def _no_warmup(protocol: Mapping[str, Any]) -> bool:
    return protocol.get("warmup") == "0" and protocol.get("replay_speed") is None


def not_a_measurement(points: Sequence[Point], protocol: Mapping[str, Any]) -> list[str]:
    """Why one level's points are not a measurement (empty: they are).  ``protocol``:
    the run's ``provenance.protocol``."""
    valid = [p for p in points if p.valid]
    reasons = []
    if _no_warmup(protocol):
        reasons.append("no warm-up (--warmup 0): its window held the cold start")
    few = [p.requests_ok for p in valid if p.requests_ok < MIN_WINDOW_REQUESTS]
    if few:
        reasons.append(
            f"{min(few)} request{'s' if min(few) != 1 else ''} in a window (a measurement "
            f"needs at least {MIN_WINDOW_REQUESTS}: raise --duration or --min-requests)"
        )
    if len(valid) < MIN_REPETITIONS:
        reasons.append(
            f"{len(valid)} valid repetition{'s' if len(valid) != 1 else ''} (an interval "
            f"needs {MIN_REPETITIONS}: raise --repetitions)"
        )
    return reasons


def biasing_choices(protocol: Mapping[str, Any]) -> list[str]:
    """The run's protocol choices that bias what it measures, in words."""
    out = []
    if protocol.get("order") == "ascending":
        out.append(
            "points ran low to high (--order ascending), so drift during the run (a warming "
            "cache, a cooling GPU) lines up with the load"
        )
    if _no_warmup(protocol):
        out.append("no warm-up (--warmup 0), so each window began with the cold start")
    return out
