"""`servebook compare`: refuses every kind of provenance mismatch unless it is the declared
variable, stamps every output under --force, never lets an invalid point into a ratio,
and gives the verdicts of Welch's test on hand-computed samples."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servebook.cli import app
from servebook.report import comparability as cb
from servebook.report import compare as cmp
from servebook.report.compare import compare, fmt_relative
from servebook.report.plots import pareto_plot
from servebook.report.tables import fmt_interval, levels, load_runs
from servebook.results import stats
from servebook.results.store import load_results
from tests.conftest import CliResult
from tests.unit import result_runs
from tests.unit.result_runs import CPU, RERUN, A, B, invalid_level

Cli = Callable[..., CliResult]


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def variant(tmp_path: Path, name: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of A's results with one provenance edit (the document stays schema-valid)."""
    out = result_runs.variant(tmp_path, A, name, lambda doc: edit(doc["provenance"]))
    load_results(out / "results.json")  # still a valid results file
    return out


def _engine(p: dict[str, Any]) -> None:
    p["engine_version"] = "0.11.1"
    for r in p["roles"]:
        r["engine_version"] = "0.11.1"


def _image(p: dict[str, Any]) -> None:
    p["roles"][0]["image"] = "vllm/vllm-openai:v0.11.0-cu129"


def _package(p: dict[str, Any]) -> None:
    p["packages"]["aiohttp"] = "3.11.0"


def _model(p: dict[str, Any]) -> None:
    p["model"]["config_hash"] = "sha256:" + "1" * 64


def _hardware(p: dict[str, Any]) -> None:
    p["accelerator"]["model"] = "NVIDIA H100 80GB HBM3"


def _topology(p: dict[str, Any]) -> None:
    p["accelerators_used"] = 4


def _engine_args(p: dict[str, Any]) -> None:
    p["roles"][0]["command"].append("--enable-chunked-prefill")


def _env(p: dict[str, Any]) -> None:
    p["roles"][0]["env"]["VLLM_ATTENTION_BACKEND"] = "FLASHINFER"


def _protocol(p: dict[str, Any]) -> None:
    p["protocol"]["duration_s"] = 30.0


def _threshold(p: dict[str, Any]) -> None:
    p["protocol"]["thresholds"]["max_error_rate"] = 0.05


def _workload(p: dict[str, Any]) -> None:
    p["workload"]["output_len"] = 256


def _api(p: dict[str, Any]) -> None:
    p["target"]["api"] = "chat"


def _seed(p: dict[str, Any]) -> None:
    p["seed"] = 7


# (edit, kind it must be reported as, field named in the refusal)
MISMATCHES = {
    "engine version": (_engine, "engine", "engine_version"),
    "image": (_image, "packages", "roles.images"),
    "package version": (_package, "packages", "packages.aiohttp"),
    "model hash": (_model, "model", "model.config_hash"),
    "hardware": (_hardware, "hardware", "accelerator.model"),
    "topology": (_topology, "topology", "accelerators_used"),
    "engine args": (_engine_args, "engine_args", "role.mixed.command"),
    "engine env": (_env, "engine_args", "role.mixed.env.VLLM_ATTENTION_BACKEND"),
    "protocol": (_protocol, "protocol", "protocol.duration_s"),
    "protocol threshold": (_threshold, "protocol", "protocol.thresholds.max_error_rate"),
    "workload": (_workload, "workload", "workload.output_len"),
    "api": (_api, "workload", "target.api"),
    "seed": (_seed, "seed", "seed"),
}


# --- provenance ------------------------------------------------------------------------


@pytest.mark.parametrize("what", list(MISMATCHES))
def test_each_provenance_mismatch_kind_is_refused_and_named(what: str, tmp_path: Path) -> None:
    edit, kind, field = MISMATCHES[what]
    b = variant(tmp_path, "b", edit)
    a_run, b_run = load_runs([A, b])
    with pytest.raises(cmp.Refused) as e:
        cmp.compare(a_run, b_run)
    diffs = e.value.comparability.unexplained
    assert {d.kind for d in diffs} == {kind}
    assert field in [d.field for d in diffs]
    # Declaring the variable under test that covers that kind lets the comparison proceed,
    # and nothing is stamped: it is like-for-like but for the variable.
    c = cmp.compare(a_run, b_run, [kind])
    assert c.stamp is None and c.rows


def test_refusal_exits_1_and_lists_the_difference_with_the_variable_to_declare(
    tmp_path: Path,
) -> None:
    b = variant(tmp_path, "b", _engine)
    r = invoke("compare", str(A), str(b))
    assert r.exit_code == 1
    assert "compare refused" in r.output
    assert "[engine] engine_version: 0.11.0 (A) vs 0.11.1 (B)" in r.output
    assert "--variable engine" in r.output and "--force" in r.output
    rj = invoke("compare", str(A), str(b), "--json")
    assert rj.exit_code == 1
    doc = json.loads(rj.output)
    assert doc["refused"] is True and doc["suggested_variables"] == ["engine"]
    assert {d["field"] for d in doc["differences"]} == {"engine_version", "roles.engine_versions"}


def test_a_variable_covers_only_its_kinds(tmp_path: Path) -> None:
    def two(p: dict[str, Any]) -> None:
        _engine_args(p)
        _workload(p)

    a_run, b_run = load_runs([A, variant(tmp_path, "b", two)])
    with pytest.raises(cmp.Refused) as e:
        cmp.compare(a_run, b_run, ["engine_args"])
    assert [d.kind for d in e.value.comparability.unexplained] == ["workload"]
    assert cmp.compare(a_run, b_run, ["engine_args", "workload"]).stamp is None


def test_topology_covers_the_command_lines_a_new_topology_brings() -> None:
    a_run, b_run = load_runs([A, B])
    c = cmp.compare(a_run, b_run, ["topology"])
    assert c.stamp is None
    kinds = {d.kind for d in c.comparability.differences}
    assert kinds == {"topology"}  # same engine, images and model: not reported as changed
    with pytest.raises(cmp.Refused):
        cmp.compare(a_run, b_run, ["engine_args"])


def test_ports_hosts_interpreter_and_placement_are_not_differences() -> None:
    # The rerun listens on another host and port, runs /opt/venv/bin/python instead of
    # /usr/bin/python3 and on other GPUs: only its seed differs.
    a_run, r_run = load_runs([A, RERUN])
    diffs = cb.provenance_differences(a_run.results.provenance, r_run.results.provenance)
    assert [(d.kind, d.field) for d in diffs] == [("seed", "seed")]


def test_normalized_command_keeps_real_flags() -> None:
    from servebook.results.schema import ModelInfo

    argv = [
        "/opt/venv/bin/python3.11",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/m",
        "--port=8123",
        "--host",
        "0.0.0.0",
        "--kv-transfer-config",
        '{"url": "http://10.1.1.1:5555"}',
        "--max-num-seqs",
        "64",
    ]
    got = cb.normalize_command(argv, ModelInfo(name="m", path="/models/m"))
    assert got == [
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "<model>",
        "--port=<port>",
        "--host",
        "<host>",
        "--kv-transfer-config",
        '{"url": "<url>"}',
        "--max-num-seqs",
        "64",
    ]


def _renamed(p: dict[str, Any]) -> None:
    """The same recipe deployed under another name: its KV connector's storage directory
    (under the deployment's own directory) and the recorded deployment name change."""
    p["target"]["deployment"] = "pd-b"
    for r in p["roles"]:
        r["command"] = [
            a.replace("/deployments/tiny-pd-spec/", "/deployments/pd-b/") for a in r["command"]
        ]


def test_one_recipe_deployed_under_two_names_has_no_provenance_difference(
    tmp_path: Path,
) -> None:
    """(issue 32, finding 7) The deployment name entered the ExampleConnector's storage
    path, so two deployments of one recipe differed in engine_args for compare."""
    b = result_runs.variant(tmp_path, CPU, "b", lambda doc: _renamed(doc["provenance"]))
    prefill = load_results(b / "results.json").provenance.roles[0]
    assert any("/deployments/pd-b/kv" in a for a in prefill.command)
    a_run, b_run = load_runs([CPU, b])
    assert cb.provenance_differences(a_run.results.provenance, b_run.results.provenance) == []


def _local_provenance(plan: Any, port0: int) -> Any:
    """What a local deployment of ``plan`` records: each role's full command line as the
    local backend starts it (its ports are the deployment's own)."""
    from servebook.engines import vllm
    from servebook.results.schema import ModelInfo, Provenance, RoleProvenance

    roles = [
        RoleProvenance(
            name=r.name,
            command=vllm.server_argv("/venv/bin/python", r.args, "127.0.0.1", port0 + i),
            env=dict(r.env),
        )
        for i, r in enumerate(plan.engine_roles)
    ]
    model = ModelInfo(name=plan.served_model_name, path=plan.engine_roles[0].model_path)
    return Provenance(
        servebook_version="x",
        model=model,
        target={"recipe": plan.recipe, "topology": plan.topology},
        roles=roles,
        seed=0,
        started_at="",
    )


def test_a_one_flag_ab_of_a_tiny_recipe_differs_in_that_flag_only(sb_home: Path) -> None:
    """(issue 32, finding 7) Two deployments of tiny-pd, the second with one more engine
    flag: compare sees that flag and nothing else (not the deployments' names)."""
    from servebook.backends.state import state_dir_for
    from servebook.recipe.resolve import resolve

    a = resolve("tiny-pd", state_dir=state_dir_for("pd-a"))
    b = resolve("tiny-pd", ["extra_engine_args=--max-num-seqs 8"], state_dir=state_dir_for("pd-b"))
    diffs = cb.provenance_differences(_local_provenance(a, 8100), _local_provenance(b, 8200))
    assert sorted((d.field, d.kind) for d in diffs) == [
        ("role.decode.command", "engine_args"),
        ("role.prefill.command", "engine_args"),
    ]
    assert {d.describe().split(": ", 1)[1] for d in diffs} == {
        "(nothing) (A) -> --max-num-seqs 8 (B)"
    }


def test_unknown_variable_is_bad_input_naming_the_vocabulary(cli: Cli) -> None:
    r = cli("compare", str(A), str(B), "--variable", "topolgy")
    assert r.returncode == 2
    assert "--variable 'topolgy'" in r.stderr and "topology" in r.stderr


def test_every_kind_has_a_variable_of_its_own_name() -> None:
    # but the route: a port-forward's relay is in the latencies (only --force compares).
    assert set(cb.KINDS) - {"route"} <= set(cb.VARIABLES) and "route" not in cb.VARIABLES
    for name, v in cb.VARIABLES.items():
        assert name in v.kinds and set(v.kinds) <= set(cb.KINDS)


# --- --force ---------------------------------------------------------------------------


def test_force_stamps_text_json_and_files(tmp_path: Path) -> None:
    b = variant(tmp_path, "b", _engine)
    out = tmp_path / "out"
    r = invoke("compare", str(A), str(b), "--force", "-o", str(out))
    assert r.exit_code == 0
    assert r.output.count(cmp.CROSS_PROVENANCE) == 2  # first and last line of the text
    assert r.output.strip().splitlines()[0] == cmp.CROSS_PROVENANCE
    assert r.output.strip().splitlines()[-1] == cmp.CROSS_PROVENANCE
    md = (out / "compare.md").read_text()
    assert md.count(cmp.CROSS_PROVENANCE) == 2
    saved = json.loads((out / "compare.json").read_text())
    rj = invoke("compare", str(A), str(b), "--force", "--json")
    assert rj.exit_code == 0
    for doc in (json.loads(rj.output), saved):
        assert doc["stamp"] == cmp.CROSS_PROVENANCE and doc["like_for_like"] is False
        assert doc["rows"] and all(row["stamp"] == cmp.CROSS_PROVENANCE for row in doc["rows"])
        assert [d["field"] for d in doc["differences"] if not d["under_test"]] == [
            "engine_version",
            "roles.engine_versions",
        ]


def test_like_for_like_output_carries_no_stamp(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = invoke("compare", str(A), str(B), "--variable", "topology", "-o", str(out))
    assert r.exit_code == 0
    assert "cross-provenance" not in r.output
    assert "cross-provenance" not in (out / "compare.md").read_text()
    doc = json.loads((out / "compare.json").read_text())
    assert doc["stamp"] is None and doc["like_for_like"] is True


# --- the test and the ratios -----------------------------------------------------------


def test_welch_on_hand_computed_samples() -> None:
    # A = 100, 102, 98; B = 110, 112, 108: means 100 and 110, s^2 = 4 each, n = 3.
    # se = sqrt(4/3 + 4/3) = 1.632993; t = 10 / se = 6.123724; df = (8/3)^2 /
    # ((4/3)^2 / 2 + (4/3)^2 / 2) = 4.  Student t with 4 df has a closed-form CDF:
    # F(t) = 1/2 + (3/8) u (1 - t^2 / (12 (1 + t^2/4))), u = t / sqrt(1 + t^2/4), so the
    # two-sided p = 2 (1 - F(6.123724)) = 0.0036022.  95% CI of the difference:
    # 10 +- t(0.975, 4) * se = 10 +- 2.776445 * 1.632993 = [5.46608, 14.53392].
    w = stats.welch([100, 102, 98], [110, 112, 108])
    assert w is not None
    assert w.t == pytest.approx(6.123724, rel=1e-6)
    assert w.df == pytest.approx(4.0)
    assert w.p == pytest.approx(0.0036022, abs=1e-7)
    assert (w.low, w.high) == (pytest.approx(5.46608, abs=1e-5), pytest.approx(14.53392, abs=1e-5))
    assert cmp.verdict_of(w, "higher") == "better"
    assert cmp.verdict_of(w, "lower") == "worse"  # the same samples as a latency


def test_welch_unequal_variances_and_a_nonsignificant_difference() -> None:
    # A = 100, 110, 90 (s^2 = 100); B = 105, 95, 115 (s^2 = 100): t = 5 / 8.164966 =
    # 0.612372, df = 4, p = 2 (1 - F(0.612372)) = 0.57339 -> not distinguishable.
    w = stats.welch([100, 110, 90], [105, 95, 115])
    assert w is not None and w.p == pytest.approx(0.57339, abs=1e-5)
    assert cmp.verdict_of(w, "higher") == "not distinguishable"
    # Unequal variances and sizes: A = 10, 12 (mean 11, s^2 = 2), B = 20, 30, 40, 50
    # (mean 35, s^2 = 166.67): qa = 2/2 = 1, qb = 166.67/4 = 41.667, se = 6.531973,
    # t = 24 / se = 3.674235, df = 42.667^2 / (1^2/1 + 41.667^2/3) = 3.140302; p = 0.032315
    # (numerical integration of the t density with 3.1403 df: no closed form).
    w2 = stats.welch([10, 12], [20, 30, 40, 50])
    assert w2 is not None
    assert w2.df == pytest.approx(3.140302, abs=1e-6)
    assert w2.t == pytest.approx(3.674235, abs=1e-6)
    assert w2.p == pytest.approx(0.032315, abs=1e-6)
    assert cmp.verdict_of(w2, "lower") == "worse"


def test_fewer_than_two_repetitions_is_never_a_verdict() -> None:
    assert stats.welch([100.0], [200.0, 201.0, 199.0]) is None
    assert cmp.verdict_of(None, "higher") == "not distinguishable (too few repetitions)"
    a_run, r_run = load_runs([A, RERUN])
    c = cmp.compare(a_run, r_run, ["seed"])
    c1 = [r for r in c.rows if r.level == "c=1"]
    assert c1 and all(r.verdict == "not distinguishable (too few repetitions)" for r in c1)
    assert all(r.test is None and r.ratio_ci is None and r.b.n == 1 for r in c1)


def row(c: cmp.Comparison, level: str, metric: str) -> cmp.Row:
    return next(r for r in c.rows if r.level == level and r.metric == metric)


def test_pd_vs_mixed_verdicts_per_metric_direction_and_per_accelerator() -> None:
    a_run, b_run = load_runs([A, B])
    c = cmp.compare(a_run, b_run, ["topology"])
    tok = row(c, "c=1", "output_tokens_per_s")
    assert tok.verdict == "better" and tok.ratio == pytest.approx(1.1)
    # The samples of test_welch_on_hand_computed_samples: the ratio's interval is the
    # difference's interval over A's mean (100), plus one.
    assert tok.test is not None and tok.test.p == pytest.approx(0.0036022, abs=1e-7)
    lo, hi = tok.ratio_ci or (0.0, 0.0)
    assert lo == pytest.approx(1.0546608, abs=1e-6) and hi == pytest.approx(1.1453392, abs=1e-6)
    # Per accelerator: A on 2 GPUs (50/GPU), B on 4 (27.5/GPU): higher tok/s, worse per GPU.
    per = row(c, "c=1", "output_tokens_per_s_per_accelerator")
    assert per.a.mean == pytest.approx(50.0) and per.b.mean == pytest.approx(27.5)
    assert per.verdict == "worse"
    # Latency: lower is better.
    assert row(c, "c=1", "tpot_ms.p50").verdict == "better"  # 7.0 vs 8.0 ms
    assert row(c, "c=1", "ttft_ms.p50").verdict == "worse"  # 60 vs 40 ms
    assert row(c, "c=4", "output_tokens_per_s").verdict == "not distinguishable"


def test_invalid_points_are_excluded_from_ratios() -> None:
    # B's c=16 repetition 2 is invalid (SB403) and claims 9999 tok/s.
    a_run, b_run = load_runs([A, B])
    c = cmp.compare(a_run, b_run, ["topology"])
    tok = row(c, "c=16", "output_tokens_per_s")
    assert tok.b.n == 2 and tok.b.mean == pytest.approx(1520.0)
    assert tok.ratio == pytest.approx(1520.0 / 1200.0)
    w = stats.welch([1200, 1230, 1170], [1500, 1540])
    assert w is not None and tok.test == w
    doc = cmp.to_json(c)
    r16 = next(
        r for r in doc["rows"] if r["level"] == "c=16" and r["metric"] == "output_tokens_per_s"
    )
    assert r16["b"]["n"] == 2 and not math.isclose(r16["b"]["mean"], (1500 + 1540 + 9999) / 3)


def test_a_level_with_no_valid_repetition_has_no_ratio(tmp_path: Path) -> None:
    d = result_runs.variant(
        tmp_path, B, "b", invalid_level(4, "SB401: window 3.0 s of the required 60 s")
    )
    a_run, b_run = load_runs([A, d])
    c = cmp.compare(a_run, b_run, ["topology"])
    r4 = [r for r in c.rows if r.level == "c=4"]
    assert r4 and all(r.verdict == "no valid repetitions" and r.ratio is None for r in r4)


def test_levels_only_in_one_run_are_listed_not_compared(tmp_path: Path) -> None:
    def without_c16(doc: dict[str, Any]) -> None:
        doc["points"] = [p for p in doc["points"] if p["concurrency"] != 16]

    d = result_runs.variant(tmp_path, A, "a", without_c16)
    a_run, b_run = load_runs([d, RERUN])
    c = cmp.compare(a_run, b_run, ["seed"])
    assert c.only_b == ["c=16"] and not any(r.level == "c=16" for r in c.rows)


def test_the_same_directory_twice_is_bad_input(tmp_path: Path) -> None:
    from servebook.errors import UsageError

    shutil.copytree(A, tmp_path / "a")
    with pytest.raises(UsageError, match="given twice"):
        load_runs([tmp_path / "a", tmp_path / "a" / "results.json"])


# --- --reproduce ---------------------------------------------------------------------------


def rerun_with(tmp_path: Path, name: str, c16: list[tuple[float, float]]) -> Path:
    """The re-run with its c=16 repetitions' (tok/s, TPOT p50 ms) replaced."""
    doc = json.loads((RERUN / "results.json").read_text())
    pts = sorted(
        (p for p in doc["points"] if p["concurrency"] == 16), key=lambda p: p["repetition"]
    )
    for p, (tok, tpot) in zip(pts, c16, strict=True):
        p["output_tokens_per_s"], p["tpot_ms"]["p50"] = tok, tpot
    out = tmp_path / name
    out.mkdir()
    (out / "results.json").write_text(json.dumps(doc))
    return out


def test_an_independent_rerun_reproduces_within_5_percent() -> None:
    from servebook.report import reproduce as rep

    a_run, r_run = load_runs([A, RERUN])
    r = rep.reproduce(a_run, r_run)
    assert r.verdict == "reproduces" and r.tolerance == 0.05
    c16 = next(p for p in r.points if p.level == "c=16")
    tok, tpot = c16.metrics
    # A's c=16: 1200, 1230, 1170 -> median 1200; the re-run: 1195, 1225, 1180 -> 1195.
    assert (tok.median_a, tok.median_b) == (1200.0, 1195.0)
    assert tok.relative == pytest.approx(-5 / 1200)
    # TPOT p50: 12.0, 12.3, 11.7 -> 12.0; 12.1, 12.2, 11.8 -> 12.1 (+0.83%).
    assert (tpot.median_a, tpot.median_b) == (12.0, 12.1)
    # A's interval: 1200 +- t(0.975, 2) x 30 / sqrt(3) = 1200 +- 74.5: covers 1195.
    assert tok.ci_a.low == pytest.approx(1200 - 4.302653 * 30 / math.sqrt(3), rel=1e-6)
    assert tok.a_covers_b is True and tok.b_covers_a is True
    # c=1: one valid repetition in B (two windows cut short): no interval, no cover.
    c1 = next(p for p in r.points if p.level == "c=1")
    assert c1.verdict == "reproduces"
    assert c1.metrics[0].ci_b.n == 1 and c1.metrics[0].b_covers_a is None


def test_reproduce_command_exit_codes_and_json(tmp_path: Path) -> None:
    ok = invoke("compare", str(A), str(RERUN), "--reproduce", "--json")
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.output)
    assert doc["verdict"] == "reproduces" and doc["reproduces"] is True
    assert [p["level"] for p in doc["points"]] == ["c=1", "c=4", "c=16"]
    assert doc["points"][2]["metrics"][0]["median_b"] == 1195.0

    # 15% less throughput with tight repetitions: a real difference.
    slow = rerun_with(tmp_path, "slow", [(1020, 12.0), (1025, 12.1), (1015, 11.9)])
    r = invoke("compare", str(A), str(slow), "--reproduce")
    assert r.exit_code == 1, r.output
    assert "does not reproduce" in r.output and "c=16" in r.output
    out = tmp_path / "o"
    r = invoke("compare", str(A), str(slow), "--reproduce", "--json", "-o", str(out))
    doc = json.loads(r.output)
    assert doc["verdict"] == "does not reproduce"
    c16 = doc["points"][2]
    assert c16["verdict"] == "does not reproduce"
    assert c16["metrics"][0]["relative"] == pytest.approx(1020 / 1200 - 1)
    assert c16["metrics"][0]["a_interval_covers_b_median"] is False
    assert json.loads((out / "reproduce.json").read_text())["verdict"] == "does not reproduce"
    assert "does not reproduce" in (out / "reproduce.md").read_text()


def test_a_difference_inside_both_intervals_is_inconclusive_not_a_pass(tmp_path: Path) -> None:
    # B's c=16: 1000, 1130, 1260 -> median 1130 (-5.8%), mean 1130, s = 130, interval
    # 1130 +- 4.302653 x 130 / sqrt(3) = [807, 1453]: covers A's 1200; A's [1125.5, 1274.5]
    # covers 1130.  Outside 5%, inside the noise: the runs cannot tell.
    noisy = rerun_with(tmp_path, "noisy", [(1000, 12.0), (1130, 12.1), (1260, 11.9)])
    r = invoke("compare", str(A), str(noisy), "--reproduce", "--json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.output)
    assert doc["verdict"] == "inconclusive"
    assert doc["points"][2]["verdict"] == "inconclusive"
    assert "too imprecise" in doc["points"][2]["reason"]
    # A wider tolerance accepts it.
    r = invoke("compare", str(A), str(noisy), "--reproduce", "--tolerance", "10%", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["tolerance"] == pytest.approx(0.1)


def test_reproduce_unusable_input_exits_2(cli: Cli, tmp_path: Path) -> None:
    bad_tol = cli("compare", str(A), str(RERUN), "--reproduce", "--tolerance", "150%")
    assert bad_tol.returncode == 2 and "--tolerance" in bad_tol.stderr
    # A PD run is not a re-run of a mixed one: refused, as unusable for this question.
    other = cli("compare", str(A), str(B), "--reproduce")
    assert other.returncode == 2 and "topology" in other.stderr

    # No common load level.
    def doubled(doc: dict[str, Any]) -> None:
        for p in doc["points"]:
            p["concurrency"] = p["concurrency"] * 2

    d = result_runs.variant(tmp_path, RERUN, "shifted", doubled)
    none = cli("compare", str(A), str(d), "--reproduce")
    assert none.returncode == 2 and "no load level in common" in none.stderr
    assert "Traceback" not in none.stderr


def _spread(doc: dict[str, Any], tok: tuple[float, float], ttft: tuple[float, float]) -> None:
    """Two repetitions per concurrency level as far apart as the issue's main job saw
    (193 ± 348 tok/s, TTFT 1,080 ± 4,352 ms): Student t with one degree of freedom."""
    for p in doc["points"]:
        if p["concurrency"] == 1:
            p["output_tokens_per_s"] = tok[p["repetition"]]
            p["ttft_ms"]["p50"] = ttft[p["repetition"]]


def test_no_interval_reaches_past_what_its_metric_can_take(tmp_path: Path) -> None:
    a = result_runs.variant(tmp_path, CPU, "a", lambda d: _spread(d, (166, 220), (740, 1420)))
    b = result_runs.variant(tmp_path, CPU, "b", lambda d: _spread(d, (20, 300), (100, 160)))
    ra, rb = load_runs([a, b])
    (lv,) = [lv for lv in levels(rb) if lv.label == "c=1"]
    tok = lv.figure("output_tokens_per_s")
    assert tok.low == 0.0 and tok.high is not None and tok.high > 1000  # cut, not negative
    assert fmt_interval(tok).startswith("160 (0 to ")  # both ends shown once cut
    c = compare(ra, rb, force=True)
    for row in c.rows:
        ci = row.ratio_ci
        assert ci is None or ci[0] >= 0.0, (row.level, row.metric, ci)  # never below -100%
    ttft = next(r for r in c.rows if r.level == "c=1" and r.metric == "ttft_ms.p50")
    assert ttft.test is not None and ttft.test.low < -1080  # what Welch alone would say
    assert "-100.0%," in fmt_relative(ttft)
    # the Pareto view's bands stay on the axes' possible side
    (panel,) = pareto_plot([ra, rb]).panels
    for s in panel.series:
        assert all(v >= 0 for v in s.low + s.x_low if v == v)


def test_a_copy_of_a_run_is_refused_as_not_an_independent_rerun(cli: Cli, tmp_path: Path) -> None:
    """Issue 33, D10: `compare A copy-of-A --reproduce` said it reproduces, exit 0."""
    copy = tmp_path / "a-copy"
    shutil.copytree(A, copy)
    r = cli("compare", str(A), str(copy), "--reproduce")
    said = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stdout + r.stderr
    assert "not an independent run" in said and "A's timestamps" in said
    started = json.loads((A / "results.json").read_text())["provenance"]["started_at"]
    assert f"the run's start ({started})" in said
    assert "reproduces" not in r.stdout
    # A's numbers with a new start but its points' own stamps: still A's measurements.
    edited = result_runs.variant(
        tmp_path, A, "restamped", lambda doc: doc["provenance"].update(started_at="2027-01-01")
    )
    r = cli("compare", str(A), str(edited), "--reproduce")
    assert r.returncode == 2 and "point(s) started when one of A's did" in " ".join(
        r.stderr.split()
    )
