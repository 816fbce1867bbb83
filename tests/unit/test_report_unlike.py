"""The report warns in its summary when the runs it puts side by side are not like for
like (issue 32, finding 6): different engine versions, images or packages, or models.
Before, only the "What differs" table near the end said so, while `compare` refused the
same pair."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servebook.report.render import build_report, to_markdown
from servebook.report.tables import load_runs
from tests.unit.result_runs import RERUN, TRIAL_MIXED, TRIAL_PD, A, B, variant


def _image(doc: dict[str, Any]) -> None:
    doc["provenance"]["roles"][0]["image"] = "vllm/vllm-openai:v0.11.0-cu129"


def _package(doc: dict[str, Any]) -> None:
    doc["provenance"]["packages"]["aiohttp"] = "3.11.0"


def _engine(doc: dict[str, Any]) -> None:
    doc["provenance"]["engine_version"] = "0.11.1"
    for r in doc["provenance"]["roles"]:
        r["engine_version"] = "0.11.1"


def _model(doc: dict[str, Any]) -> None:
    doc["provenance"]["model"]["config_hash"] = "sha256:" + "1" * 64


def summary_of(runs: list[Path]) -> str:
    """The summary paragraph of the report ``servebook report`` writes: its ``report.md``
    is ``to_markdown(build_report(load_runs(runs)))`` (``render.write_report``), here
    without the plots, whose drawing took ~3 s of CPU a report and holds no words."""
    md = to_markdown(build_report(load_runs(runs)))
    return md.split("## Summary", 1)[1].strip().split("\n\n", 1)[0]


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (_image, "images or packages (roles.images)"),
        (_package, "images or packages (packages.aiohttp)"),
        (_engine, "engine versions (engine_version, roles.engine_versions)"),
        (_model, "models (model.config_hash)"),
    ],
    ids=["image", "package", "engine", "model"],
)
def test_the_summary_opens_with_a_warning_when_the_runs_are_not_like_for_like(
    edit: Callable[[dict[str, Any]], None], said: str, tmp_path: Path
) -> None:
    other = variant(tmp_path, A, "other", edit)
    text = summary_of([A, other])
    assert text.startswith(f"Warning: these runs differ in {said}, so they are not like for like")
    assert "What differs between the runs shown" in text
    assert "vllm-mixed (mixed-tp2): best valid point" in text  # the runs' own summaries follow


@pytest.mark.parametrize(
    "runs",
    [[A, RERUN], [A, B], [TRIAL_MIXED, TRIAL_PD], [A]],
    ids=["seed", "topology", "trial", "one run"],
)
def test_runs_differing_only_in_what_they_are_about_get_no_warning(runs: list[Path]) -> None:
    assert "Warning" not in summary_of(runs)
