"""The checked-in benchmark runs (results.json) that the report and compare tests read."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "fixtures" / "results"
A = RESULTS / "mixed-tp2"
B = RESULTS / "pd-2p2d"
RERUN = RESULTS / "mixed-tp2-rerun"
CPU = RESULTS / "tiny-pd-spec-cpu"


def variant(tmp_path: Path, src: Path, name: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the run ``src`` as ``tmp_path/name``, its results.json changed by ``edit``."""
    doc = json.loads((src / "results.json").read_text())
    edit(doc)
    d = tmp_path / name
    d.mkdir()
    (d / "results.json").write_text(json.dumps(doc))
    return d


def invalid_level(concurrency: int, reason: str) -> Callable[[dict[str, Any]], None]:
    """An edit for ``variant``: every repetition at ``concurrency`` is invalid for ``reason``."""

    def edit(doc: dict[str, Any]) -> None:
        for p in doc["points"]:
            if p["concurrency"] == concurrency:
                p["valid"], p["invalid_reasons"] = False, [reason]

    return edit


# The field trial's comparison (issue 32, finding 1): mixed-spec's client read its tokens in
# bursts, so its TPOT is its engine's (exact means 1.82-1.86 ms, vLLM's 0-10 ms bucket
# interpolating every p50 to 5.00); pd-spec's client p50 (2.68-2.72 ms) stands beside its
# decode engine's exact means (2.80-2.84 ms).
TRIAL_MIXED = RESULTS / "trial-mixed-spec"
TRIAL_PD = RESULTS / "trial-pd-spec"


def experiment_of(
    tmp_path: Path,
    arms: dict[str, Path],
    blocks: int,
    arm_keys: dict[str, dict[str, Any]] | None = None,
    **top: Any,
) -> dict[str, Any]:
    """experiment.json's figures (``experiment.figures.update``) of URL arms whose every
    block is the run ``arms[name]``, the first arm the baseline; ``arm_keys``: more keys of
    an arm (``accelerators``); ``top``: more of the experiment file's keys (``slo``)."""
    from servebook.experiment import figures, runner, session, spec

    doc = {
        "baseline": next(iter(arms)),
        "blocks": blocks,
        "arms": [{"name": n, "url": f"http://127.0.0.1:{i}", "model": "m",
                  **(arm_keys or {}).get(n, {})}
                 for i, n in enumerate(arms, 1)],
        **top,
    }  # fmt: skip
    exp = spec.parse(doc, str(tmp_path / "exp.yaml"))
    state = runner.new_state(exp, session.order_of(exp), "williams", "t0")
    runner.analysis_settings(state, exp)
    out = tmp_path / "out"
    for e in state["schedule"]:
        where = runner.results_dir(out, e["arm"], e["block"])
        where.mkdir(parents=True)
        (where / "results.json").write_text((arms[e["arm"]] / "results.json").read_text())
        e["outcome"] = runner.DONE
    figures.update(state, out)
    runner.save(out, state)  # out/experiment.json, as `experiment -o out` leaves it
    return state
