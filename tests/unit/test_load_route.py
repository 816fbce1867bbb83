"""Where a run's load came from and how it reached the server (``provenance.load``):
compare refuses runs measured through different routes unless --force, saying why, and
the report's summary says when latencies include a port-forward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servebook.cli import app
from servebook.report import compare as cmp
from servebook.report.summary import run_summary
from servebook.report.tables import load_runs
from tests.unit import result_runs
from tests.unit.result_runs import A


def _route(route: str, agents: int = 1) -> Any:
    def edit(doc: dict[str, Any]) -> None:
        doc["provenance"]["load"] = {
            "generator": "servebook",
            "agents": agents,
            "where": "this machine",
            "host": "bench-host",
            "route": route,
            "target_url": "http://127.0.0.1:8000",
        }

    return edit


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path, Path]:
    direct = result_runs.variant(tmp_path, A, "direct", _route("direct"))
    forwarded = result_runs.variant(tmp_path, A, "forwarded", _route("port-forward"))
    other_direct = result_runs.variant(tmp_path, A, "direct2", _route("direct", agents=2))
    return direct, forwarded, other_direct


def test_a_forwarded_run_beside_a_direct_one_is_refused_saying_why(
    runs: tuple[Path, Path, Path],
) -> None:
    direct, forwarded, _ = runs
    a, b = load_runs([direct, forwarded])
    with pytest.raises(cmp.Refused) as e:
        cmp.compare(a, b)
    (d,) = e.value.comparability.unexplained
    assert (d.kind, d.field, d.a, d.b) == ("route", "load.route", "direct", "port-forward")
    # No variable allows it, and none is suggested.
    with pytest.raises(cmp.Refused):
        cmp.compare(a, b, ["topology", "protocol", "packages"])
    r = CliRunner().invoke(app, ["compare", str(direct), str(forwarded)])
    assert r.exit_code == 1
    assert "[route] load.route: direct (A) vs port-forward (B)" in r.output
    assert "different routes" in r.output and "kubelet" in r.output
    assert "--variable route" not in r.output
    forced = cmp.compare(a, b, force=True)
    assert forced.stamp == cmp.CROSS_PROVENANCE and forced.rows


def test_runs_through_the_same_route_compare(runs: tuple[Path, Path, Path]) -> None:
    direct, _, other = runs
    a, b = load_runs([direct, other])
    assert cmp.compare(a, b).stamp is None  # agents differ; the route does not


def test_the_summary_says_when_latencies_include_a_port_forward(
    runs: tuple[Path, Path, Path],
) -> None:
    direct, forwarded, _ = runs
    d, f = load_runs([direct, forwarded])
    assert "port-forward" in run_summary(f) and "include a port-forward" in run_summary(f)
    assert "port-forward" not in run_summary(d)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agents", "0"], "--agents 0: give at least 1"),
        (["--agents", "2", "--workers", "3"], "--agents 2 and --workers 3: give one"),
        (["--via", "tunnel"], "--via 'tunnel': choose cluster or port-forward"),
        (["--via", "port-forward"], "--via port-forward is for a Kubernetes deployment"),
        (["--load-image", "python:3.12.8"], "--load-image names the image of in-cluster"),
        (["--dry-run"], "--dry-run writes the in-cluster load of a Kubernetes deployment"),
    ],
)
def test_bad_agents_and_via_are_bad_input_and_write_nothing(
    args: list[str], message: str, tmp_path: Path, cli: Any
) -> None:
    out = tmp_path / "out"
    r = cli("bench", "--url", "http://127.0.0.1:9", "--model", "m", *args, "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert not out.exists()
