"""`servebook experiment` short of the mechanics (test_experiment_mechanics.py): the file's
checks, the refusal of arms that differ in an undeclared field before anything starts, the
counterbalanced schedule, an interrupted experiment resumed with the same schedule, a block
made invalid by an arm that failed verify, and the analysis' verdicts and crossovers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servebook.errors import UsageError
from servebook.experiment import analysis, design, session, slo, spec
from servebook.experiment import report as exp_report
from servebook.experiment.runner import StepFailed, Steps, deployment_name
from servebook.experiment.spec import Arm
from servebook.experiment.steps import servebook_steps
from tests.conftest import CliResult
from tests.unit.conftest import QUICK_LOAD, scripted_machine


def url_arms(**extra_b: Any) -> dict[str, Any]:
    return {
        "baseline": "a",
        "blocks": 2,
        "arms": [
            {"name": "a", "url": "http://127.0.0.1:1", "model": "m", "image": "vllm:v1"},
            {"name": "b", "url": "http://127.0.0.1:2", "model": "m", "image": "vllm:v1", **extra_b},
        ],
        "load": {"concurrency": [1, 2], "duration": "1s"},
    }


@pytest.mark.parametrize(
    ("change", "key", "fix"),
    [
        ({"baseline": "zz"}, "baseline", "one of a, b"),
        ({"blocks": 0}, "blocks", "whole number"),
        ({"load": {"concurency": [1]}}, "load.concurency", "concurrency"),
        ({"variable": "colour"}, "variable", "topology"),
        ({"slo": "ttft=fast"}, "slo", "ttft=500ms,tpot=50ms"),
        ({"values": 3}, "values", "values file's path"),
        (
            {
                "arms": [
                    {"name": "a", "recipe": "r", "backend": "k8s"},
                    {"name": "b", "recipe": "r"},
                ]
            },
            "arms[a].backend",
            "kubernetes",
        ),
        (
            {
                "arms": [
                    {"name": "a", "recipe": "r", "namespace": "ns"},
                    {"name": "b", "recipe": "r"},
                ]
            },
            "arms[a].namespace",
            "set: {namespace: NS}",
        ),
        ({"slo": {"latency": "1s"}}, "slo", "keys ttft, tpot, itl, e2e"),
        (
            {"arms": [{"name": "a", "url": "http://x"}, {"name": "b", "url": "http://y"}]},
            "model",
            "model: NAME",
        ),
        (
            {
                "arms": [
                    {"name": "a", "recipe": "r", "url": "http://x"},
                    {"name": "b", "url": "http://y"},
                ]
            },
            "arms[a]",
            "exactly one",
        ),
    ],
)
def test_a_bad_experiment_file_names_the_key_and_the_fix(
    change: dict[str, Any], key: str, fix: str
) -> None:
    with pytest.raises(UsageError) as e:
        spec.parse({**url_arms(), **change}, "exp.yaml")
    assert f"exp.yaml: {key}" in str(e.value) or key in str(e.value)
    assert e.value.hint is not None and fix in e.value.hint


@pytest.mark.parametrize(
    ("field", "value", "kind"),
    [
        ("image", "vllm:v2", "packages"),
        ("packages", {"vllm": "0.12.0"}, "packages"),
        ("engine_version", "0.12.0", "engine"),
        ("model", "other", "model"),
    ],
)
def test_arms_differing_in_an_undeclared_field_are_refused_before_anything_starts(
    field: str, value: Any, kind: str, tmp_path: Path
) -> None:
    exp = spec.parse(url_arms(**{field: value}), "exp.yaml")
    with pytest.raises(UsageError) as e:
        session.prepare(exp)
    msg = str(e.value)
    assert "nothing was started" in msg and f"[{kind}]" in msg and "arm b vs baseline a" in msg
    assert e.value.hint is not None and f"variable: [{kind}]" in e.value.hint
    assert not (tmp_path / "experiment.json").exists()
    # declared as the variable, the same difference is what the experiment measures
    session.prepare(spec.parse({**url_arms(**{field: value}), "variable": kind}, "exp.yaml"))


def test_the_schedule_is_counterbalanced_seeded_and_reproducible() -> None:
    for n in (2, 3, 4):
        rows = design.williams_rows(n)
        # every arm once in every position, and every ordered pair once as neighbours
        for pos in range(n):
            assert sorted(r[pos] for r in rows) == sorted(list(range(n)) * (len(rows) // n))
        pairs = [(r[i], r[i + 1]) for r in rows for i in range(n - 1)]
        assert len(set(pairs)) == n * (n - 1)
        assert all(pairs.count(p) == len(pairs) // (n * (n - 1)) for p in set(pairs))
    arms = ["x", "y", "z"]
    assert design.schedule(arms, 6, 7) == design.schedule(arms, 6, 7)
    assert design.schedule(arms, 6, 7) != design.schedule(arms, 6, 8)
    firsts = [row[0] for row in design.schedule(arms, 6, 7)]
    assert sorted(firsts) == ["x", "x", "y", "y", "z", "z"]


@pytest.fixture(scope="module")
def two_urls(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory, tok: Any) -> Any:
    """Two scripted arms (4 ms and 3 ms a step) and the load's dataset and tokenizer; one
    machine for the module (its process takes seconds to start on a busy machine)."""
    prompt = "a prompt"
    dataset = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    dataset.write_text(json.dumps({"prompt": prompt}) + "\n")
    n = len(tok.encode(prompt, add_special_tokens=True))
    load = {**QUICK_LOAD, "dataset": str(dataset), "tokenizer": str(tiny_dir)}
    with scripted_machine([(4.0, 4.0, 99), (3.0, 3.0, 99)], 0.0, n) as (urls, _reset):
        yield urls, load


def test_an_interrupted_experiment_resumes_and_finishes_with_the_same_schedule(
    two_urls: Any, tmp_path: Path
) -> None:
    urls, load = two_urls
    doc = {
        "baseline": "a",
        "blocks": 2,
        "arms": [
            {"name": "a", "url": urls[0], "model": "tiny"},
            {"name": "b", "url": urls[1], "model": "tiny"},
        ],
        "load": load,
        "slo": "ttft=10s,tpot=1s",
    }
    exp = spec.parse(doc, str(tmp_path / "exp.yaml"))
    out = tmp_path / "out"
    real = servebook_steps(exp, lambda _l: None, None)
    calls: list[str] = []

    def stopping_bench(arm: Arm, handle: str | None, where: Path) -> None:
        calls.append(arm.name)
        if len(calls) == 3:  # Ctrl-C during the third bench
            raise KeyboardInterrupt
        real.bench(arm, handle, where)

    stopping = Steps(real.up, real.warm, real.verify, stopping_bench, real.down)
    with pytest.raises(session.ExperimentStopped, match="--resume"):
        session.execute(exp, out, stopping, lambda _l: None)
    saved = json.loads((out / "experiment.json").read_text())
    assert [e["outcome"] for e in saved["schedule"]] == ["done", "done", "pending", "pending"]
    planned = [(e["block"], e["arm"]) for e in saved["schedule"]]
    assert planned == session.order_of(exp)

    done = session.execute(exp, out, real, lambda _l: None, resume=True)
    assert [(e["block"], e["arm"]) for e in done["schedule"]] == planned
    assert [e["outcome"] for e in done["schedule"]] == ["done"] * 4
    assert done["schedule"][:2] == saved["schedule"][:2]  # not run again
    assert {c["metric"] for c in done["comparisons"]} >= {"output_tokens_per_s", "tpot_ms"}
    # what the servers said, compared as `compare` compares it: the same here
    assert [p["like_for_like"] for p in done["provenance"]] == [True]
    # the report reads experiment.json: every arm x level, the ratios, the schedule
    html = exp_report.write(out, out).read_text()
    md = (out / "report.md").read_text()
    for text in (html, md):
        assert "Every arm at every level" in text and "Ratios to the baseline a" in text
        assert text.count("done") >= 4 and "c=2" in text
    assert 'id="plot-ratios"' in html and (out / "plots" / "ratios.png").stat().st_size > 0
    # the Pareto view: each arm's tok/s per user (1000 / TPOT) against its tok/s, absolute
    # (URL arms without an accelerator count), drawn as a report of runs draws it
    pareto = done["pareto"]
    assert pareto["per_accelerator"] is False and pareto["left_out"] == []
    by_arm = {p["arm"]: p for p in pareto["points"]}
    assert set(by_arm) == {"a", "b"} and all(p["level"] == 2 for p in by_arm.values())
    # the scripted arms take 4 and 3 ms a token: ~250 and ~333 tok/s per user
    assert by_arm["a"]["tokens_per_user"][0] < by_arm["b"]["tokens_per_user"][0]
    assert 'id="plot-pareto"' in html and (out / "plots" / "pareto.png").stat().st_size > 0
    assert "Throughput vs speed per user (absolute: no accelerator counts)" in (
        (out / "plots" / "pareto.svg").read_text()
    )
    # the SLO, met at the one level swept: no max load is invented above it, and it says so
    assert [(m["arm"], m["outcome"]) for m in done["max_load"]] == [
        ("a", "met at every level"),
        ("b", "met at every level"),
    ]
    said = "max load of a under p99 TTFT <= 10000 ms and p99 TPOT <= 1000 ms: met at every"
    assert said in html.replace("&lt;", "<")
    # another experiment's file is not resumed into this directory
    other = spec.parse({**doc, "blocks": 3}, str(tmp_path / "exp.yaml"))
    with pytest.raises(UsageError, match="another experiment"):
        session.execute(other, out, real, lambda _l: None, resume=True)


def test_an_arm_that_fails_verify_makes_its_block_invalid_with_the_reason(
    two_urls: Any, tmp_path: Path
) -> None:
    urls, load = two_urls
    doc = {
        "baseline": "a",
        "blocks": 2,
        "arms": [{"name": "a", "recipe": "tiny-mixed"}, {"name": "b", "recipe": "tiny-mixed"}],
        "load": load,
    }
    exp = spec.parse(doc, str(tmp_path / "exp.yaml"))
    real = servebook_steps(exp, lambda _l: None, None)
    served = {"a": urls[0], "b": urls[1]}
    log: list[str] = []

    def up(arm: Arm, name: str) -> str:
        short = f"{arm.name}-{name.split('-')[1][1:]}"  # a-b2-TAG -> a-2
        log.append(f"up {short}")
        return short

    def verify(arm: Arm, name: str) -> str | None:
        return "SB301 no completion" if name == "b-2" else None

    def bench(arm: Arm, name: str | None, where: Path) -> None:
        as_url = Arm(name=arm.name, kind="url", url=served[arm.name], model="tiny")
        real.bench(as_url, None, where)

    def down(arm: Arm, name: str) -> None:
        log.append(f"down {name}")

    def warm(arm: Arm, name: str) -> None:
        log.append(f"warm {name}")

    state = session.execute(exp, tmp_path / "out", Steps(up, warm, verify, bench, down), log.append)
    failed = next(e for e in state["schedule"] if e["arm"] == "b" and e["block"] == 2)
    assert failed["outcome"] == "failed verify: SB301 no completion"
    # each entry records its own deployment and verify's verdict on it
    assert failed["deployment"] == "b-2" and failed["verify"] == "SB301 no completion"
    assert sorted(e["deployment"] for e in state["schedule"]) == ["a-1", "a-2", "b-1", "b-2"]
    assert [e["verify"] for e in state["schedule"] if e is not failed] == ["passed"] * 3
    assert state["invalid_blocks"] == [
        {"block": 2, "reason": "arm b failed verify: SB301 no completion"}
    ]
    # every deployment brought up was warmed and taken down, the failed one included
    for name in ("a-1", "b-1", "a-2", "b-2"):
        assert log.index(f"up {name.split('-')[0]}-{name[-1]}") < log.index(f"warm {name}")
        assert f"down {name}" in log
    assert {c["blocks"] for c in state["comparisons"]} == {1}  # block 2 counts for nothing


def test_a_step_failure_is_an_outcome_not_a_crash(two_urls: Any, tmp_path: Path) -> None:
    urls, load = two_urls
    doc = {
        "baseline": "a",
        "blocks": 1,
        "load": load,
        "arms": [
            {"name": "a", "recipe": "tiny-mixed"},
            {"name": "b", "url": urls[1], "model": "tiny"},
        ],
    }
    exp = spec.parse(doc, str(tmp_path / "exp.yaml"))
    real = servebook_steps(exp, lambda _l: None, None)

    downed: list[str] = []

    def up(arm: Arm, name: str) -> str:
        raise StepFailed("role mixed exited 1 (CUDA out of memory)")

    nothing: Callable[..., None] = lambda *_a: None  # noqa: E731
    steps = Steps(up, nothing, lambda *_a: None, real.bench, lambda _a, n: downed.append(n))
    state = session.execute(exp, tmp_path / "out", steps, lambda _l: None)
    assert state["invalid_blocks"][0]["reason"].startswith("arm a failed to come up: role mixed")
    assert state["comparisons"] == [] and state["crossovers"] == []
    # what the failed up applied went with it: the next arm came up on a clean cluster
    (entry,) = [e for e in state["schedule"] if e["arm"] == "a"]
    assert downed == [entry["deployment"]]

    # A Ctrl-C while an arm comes up takes that deployment down too, and stops the
    # experiment (found on the test plane: the interrupted arm's Pods were left running).
    def stopped_up(arm: Arm, name: str) -> str:
        raise KeyboardInterrupt

    downed.clear()
    steps = Steps(stopped_up, nothing, lambda *_a: None, real.bench, lambda _a, n: downed.append(n))
    with pytest.raises(session.ExperimentStopped, match="--resume"):
        session.execute(exp, tmp_path / "stopped", steps, lambda _l: None)
    saved = json.loads((tmp_path / "stopped" / "experiment.json").read_text())
    assert downed == [deployment_name(saved["tag"], "a", 1)], downed
    assert [e["outcome"] for e in saved["schedule"] if e["arm"] == "a"] == ["pending"]


def ratio(
    level: float, lo: float, hi: float, metric: str = "output_tokens_per_s"
) -> analysis.Ratio:
    return analysis.Ratio("b", "a", level, metric, (lo + hi) / 2, lo, hi, 3)


def test_verdicts_mind_that_lower_tpot_is_better() -> None:
    assert ratio(1, 1.1, 1.2).verdict == "better"
    assert ratio(1, 1.1, 1.2, "tpot_ms").verdict == "worse"
    assert ratio(1, 0.8, 0.9, "tpot_ms").verdict == "better"
    assert ratio(1, 0.9, 1.1).verdict == "not distinguishable"


def test_a_crossover_is_where_the_interval_leaves_one_side_of_1_for_the_other() -> None:
    rs = [ratio(1, 1.2, 1.4), ratio(4, 0.95, 1.1), ratio(16, 0.7, 0.8), ratio(64, 0.6, 0.7)]
    (cross,) = analysis.crossovers(rs)
    assert cross["between"] == [1, 16] and cross["direction"] == "above to below 1"
    # estimates cross 1 but every interval holds 1: undetermined, not invented
    vague = [ratio(1, 0.95, 1.3), ratio(4, 0.7, 1.05)]
    (und,) = analysis.crossovers(vague)
    assert und["undetermined"] is True and und["between"] is None


def test_the_crossover_is_stated_in_words() -> None:
    (cross,) = analysis.crossovers([ratio(1, 1.2, 1.4), ratio(16, 0.7, 0.8)])
    line = exp_report.crossover_line(cross)
    assert "b is ahead of a in output tok/s up to 1 and behind from 16 on" in line
    tpot = analysis.crossovers([ratio(1, 0.7, 0.8, "tpot_ms"), ratio(8, 1.2, 1.3, "tpot_ms")])
    assert "b is ahead of a in TPOT (ms) up to 1 and behind from 8 on" in (
        exp_report.crossover_line(tpot[0])
    )


def test_the_bootstrap_resamples_blocks_so_block_scatter_widens_the_interval() -> None:
    steady = analysis.bootstrap_ratio([[110], [110], [110], [110]], [[100]] * 4, seed=0)
    scattered = analysis.bootstrap_ratio([[90], [130], [100], [120]], [[100]] * 4, seed=0)
    assert steady == pytest.approx((1.1, 1.1, 1.1))
    assert scattered[1] < 1.0 < scattered[2]


def test_dry_run_prints_the_schedule_time_and_deployments(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    f = tmp_path / "exp.yaml"
    f.write_text(
        "baseline: mixed\nblocks: 2\nvariable: [topology]\narms:\n"
        "  - {name: mixed, recipe: tiny-mixed}\n  - {name: spec, recipe: tiny-mixed-spec}\n"
        "load: {concurrency: [1, 4], duration: 15s, warmup: 5s}\n"
    )
    r = cli("experiment", str(f), "-o", str(tmp_path / "out"), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "block 1: " in r.stdout and "block 2: " in r.stdout
    assert "time: benches about" in r.stdout and "4 fresh deployment(s)" in r.stdout
    # each deployment named for its arm, its block and the experiment (ARM-bBLOCK-TAG)
    tag = re.search(r"mixed-b1-([0-9a-f]{6}) \(arm mixed, block 1\)", r.stdout)
    assert tag is not None, r.stdout
    assert f"spec-b2-{tag.group(1)} (arm spec, block 2)" in r.stdout
    # the levels' orders each block's benches will run: rows of the design, not one shuffle
    b1 = re.search(r"levels .*\n  block 1: (.*)\n  block 2: (.*)\n", r.stdout)
    assert b1 is not None, r.stdout
    assert b1.group(1) != b1.group(2) and set(b1.group(1).split(", then ")) == {
        "c=1 -> c=4",
        "c=4 -> c=1",
    }
    assert not (tmp_path / "out").exists()


def test_the_cross_image_ratio_is_refused_with_exit_2(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    f = tmp_path / "exp.yaml"
    f.write_text(json.dumps(url_arms(image="vllm:v2")))
    r = cli("experiment", str(f), "-o", str(tmp_path / "out"))
    assert r.returncode == 2
    assert "roles.images" in r.stderr and "vllm:v1" in r.stderr and "vllm:v2" in r.stderr
    assert "variable: [packages]" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_stop_signal_during_a_bench_takes_the_arms_deployment_down(tmp_path: Path) -> None:
    recipes = [{"name": "a", "recipe": "tiny-mixed"}, {"name": "b", "recipe": "tiny-mixed"}]
    doc = {**url_arms(), "arms": recipes}
    exp = spec.parse(doc, str(tmp_path / "exp.yaml"))
    log: list[str] = []

    def bench(arm: Arm, name: str | None, where: Path) -> None:
        raise KeyboardInterrupt  # what cli.main turns SIGINT, SIGTERM and SIGHUP into

    steps = Steps(
        up=lambda arm, name: name,
        warm=lambda arm, name: None,
        verify=lambda arm, name: None,
        bench=bench,
        down=lambda arm, name: log.append(f"down {name}"),
    )
    with pytest.raises(session.ExperimentStopped) as e:
        session.execute(exp, tmp_path / "out", steps, lambda _l: None)
    assert e.value.exit_code == 130
    block, arm = session.order_of(exp)[0]
    saved = json.loads((tmp_path / "out" / "experiment.json").read_text())
    assert log == [f"down {arm}-b{block}-{saved['tag']}"]
    assert {e["outcome"] for e in saved["schedule"]} == {"pending"}


def test_the_slo_is_bench_s_syntax_as_text_or_a_mapping() -> None:
    text = spec.parse({**url_arms(), "slo": "ttft=500ms,tpot=0.05s"}, "exp.yaml")
    mapping = spec.parse({**url_arms(), "slo": {"ttft": "500ms", "tpot": 50}}, "exp.yaml")
    assert text.slo == mapping.slo == {"ttft": 500.0, "tpot": 50.0}
    # analysis only: the same experiment, so --resume may judge it against another SLO
    assert text.digest() == spec.parse(url_arms(), "exp.yaml").digest()


def slo_samples(ttft_per_level: float, blocks: int = 4) -> dict[int, Any]:
    """An arm's samples whose p99 TTFT is ``ttft_per_level`` ms per unit of concurrency
    (plus a block's own offset of -6..+6 ms and a repetition's +-2 ms), TPOT 20 ms flat."""
    out: dict[int, Any] = {}
    for b in range(1, blocks + 1):
        offset = (b - (blocks + 1) / 2) * 4.0
        out[b] = {
            float(c): {
                "ttft_ms_p99": [ttft_per_level * c + offset - 2, ttft_per_level * c + offset + 2],
                "tpot_ms_p99": [20.0, 20.0],
            }
            for c in (1, 4, 16)
        }
    return out


def test_max_load_under_an_slo_is_where_the_p99_crosses_its_limit_between_the_levels() -> None:
    # p99 TTFT 50 ms per unit of concurrency: 50 at c=1, 200 at c=4, 800 at c=16; under
    # ttft=500ms the limit is reached at c=10, between the swept 4 and 16.
    got = slo.max_load(slo_samples(50.0), {"ttft": 500.0, "tpot": 50.0}, seed=1)
    assert got["outcome"] == "crossed" and got["between"] == [4.0, 16.0]
    assert got["level"] == pytest.approx(10.0, abs=0.05) and got["binding"] == "ttft"
    lo, hi = got["ci95"]
    assert 4.0 <= lo < 10.0 < hi <= 16.0 and hi - lo < 1.0  # the blocks' +-6 ms, no more
    # A TPOT that reaches its limit first binds instead: 20 ms up to c=4, 60 at c=16, so
    # a 30 ms limit falls a quarter of the way, at c=7.
    steep = slo_samples(50.0)
    for blk in steep.values():
        blk[16.0]["tpot_ms_p99"] = [60.0, 60.0]
    tpot = slo.max_load(steep, {"ttft": 500.0, "tpot": 30.0})
    assert tpot["binding"] == "tpot" and tpot["level"] == pytest.approx(7.0)
    # Missed at the lowest level: no figure is invented below the sweep either.
    low = slo.max_load(slo_samples(50.0), {"tpot": 15.0})
    assert low["outcome"] == "missed at the lowest level" and low["between"] == [None, 1.0]
    # Met at every swept level: no figure is invented above the sweep.
    easy = slo.max_load(slo_samples(10.0), {"ttft": 500.0})
    assert easy["outcome"] == "met at every level" and easy["level"] is None
    assert easy["between"] == [16.0, None] and easy["ci95"] == [16.0, 16.0]


def test_the_max_load_is_recorded_per_arm_and_said_in_words() -> None:
    samples = {"a": slo_samples(50.0), "b": slo_samples(100.0)}
    rows = slo.max_loads(samples, {"ttft": 500.0}, seed=0)
    assert [(r["arm"], r["slo"]) for r in rows] == [("a", {"ttft": 500.0}), ("b", {"ttft": 500.0})]
    # b's TTFT grows twice as fast: 400 at c=4, 1600 at c=16, so the limit falls at c=5
    assert rows[1]["level"] == pytest.approx(5.0, abs=0.05)
    line = exp_report.max_load_line(rows[1], "concurrency")
    assert "max load of b under p99 TTFT <= 500 ms: about c=5" in line
    assert "meets the SLO at c=4 and misses it at c=16 (p99 TTFT reaches its limit first)" in line


# One site's values for vllm-pd and vllm-pd-spec: the pd recipe's golden values, and the
# draft heads only vllm-pd-spec declares.
SITE_VALUES = (
    (Path(__file__).parent / "fixtures" / "render" / "vllm-pd" / "values.yaml").read_text()
    + "spec_method: eagle3\n"
    + "prefill_draft_dir: /data/models/EAGLE3-Kimi-K2\n"
    + "decode_draft_dir: /mnt/nvme0/models/EAGLE3-Kimi-K2\n"
)


def pd_vs_spec(values: str) -> str:
    return (
        "baseline: pd\nblocks: 2\nvariable: [topology]\n"
        f"values: {values}\n"
        "arms:\n"
        "  - {name: pd, recipe: vllm-pd, backend: kubernetes}\n"
        "  - {name: spec, recipe: vllm-pd-spec, backend: kubernetes}\n"
        "load: {concurrency: [1, 4], duration: 15s, warmup: 5s}\n"
    )


def test_one_values_file_serves_every_recipe_of_the_experiment(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    """decode_draft_dir is vllm-pd-spec's alone: given to the vllm-pd arm too, it is no
    error there; each recipe takes the keys it declares."""
    (tmp_path / "site.yaml").write_text(SITE_VALUES)
    f = tmp_path / "exp.yaml"
    f.write_text(pd_vs_spec("site.yaml"))
    r = cli("experiment", str(f), "-o", str(tmp_path / "out"), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["fresh_deployments"] == 4
    # the same values inline, and the spec arm's plan has them where its recipe uses them
    exp = spec.parse(
        {
            "baseline": "pd",
            "values": inputs_of(SITE_VALUES),
            "arms": [
                {"name": "pd", "recipe": "vllm-pd"},
                {"name": "spec", "recipe": "vllm-pd-spec"},
            ],
        },
        str(f),
    )
    from servebook.experiment.values import resolve_arm

    spec_plan = resolve_arm(exp, exp.arm("spec"))
    assert spec_plan.param_origins["decode_draft_dir"] == f"{f} values:"
    assert "decode_draft_dir" not in resolve_arm(exp, exp.arm("pd")).param_origins


def test_a_values_key_no_recipe_of_the_experiment_declares_is_refused_naming_it_and_the_file(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    (tmp_path / "site.yaml").write_text(SITE_VALUES + "namespce: bench\n")
    f = tmp_path / "exp.yaml"
    f.write_text(pd_vs_spec("site.yaml"))
    r = cli("experiment", str(f), "-o", str(tmp_path / "out"), "--dry-run")
    assert r.returncode == 2, r.stdout + r.stderr
    said = " ".join(r.stderr.split())
    assert f"values file {tmp_path / 'site.yaml'}: 'namespce' is a parameter of no recipe" in said
    assert "vllm-pd, vllm-pd-spec" in said and "servebook recipes show NAME" in said
    # an arm's set: stays strict: another recipe's key there is its own recipe's error
    f.write_text(
        pd_vs_spec("site.yaml").replace(
            "recipe: vllm-pd, backend", "recipe: vllm-pd, set: {decode_draft_dir: /x}, backend"
        )
    )
    (tmp_path / "site.yaml").write_text(SITE_VALUES)
    r = cli("experiment", str(f), "-o", str(tmp_path / "out"), "--dry-run")
    assert r.returncode == 2 and "no parameter named 'decode_draft_dir'" in r.stderr, r.stderr


def inputs_of(text: str) -> dict[str, Any]:
    import yaml

    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


def test_a_kubernetes_arms_load_from_a_file_here_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    """On Kubernetes the load runs in the cluster, whose Pods cannot read this machine's
    dataset: refused with the arm and the fix before any arm comes up."""
    arms = [{"name": n, "recipe": "vllm-pd", "backend": "kubernetes"} for n in ("a", "b")]
    doc = {"baseline": "a", "arms": arms, "load": {"dataset": "prompts.jsonl"}}
    with pytest.raises(UsageError) as e:
        session.prepare(spec.parse(doc, str(tmp_path / "exp.yaml")))
    assert "arms[a] runs on Kubernetes, whose load runs in the cluster" in str(e.value)
    assert "prompts.jsonl is a file on this machine" in str(e.value)
    assert e.value.hint is not None and "leave dataset:" in e.value.hint
    with pytest.raises(UsageError, match="load-start-timeout"):
        bad = {**doc, "load": {"load-start-timeout": "soon"}}
        session.prepare(spec.parse(bad, str(tmp_path / "exp.yaml")))


def test_the_pareto_view_s_intervals_are_the_ratios_block_bootstrap() -> None:
    """Two blocks' t interval (t = 12.7 on one degree of freedom) reached -1,300 tok/s in a
    real run on a busy machine (tests/engine/test_experiment_real.py), and 0-700 wide beside
    bootstrap intervals that said otherwise (issue 49): a point's interval is now the
    ratios' block bootstrap, so it stays within the blocks' own values and is the interval a
    ratio to a constant baseline of 1 gets."""
    from servebook.experiment import figures

    blocks = {
        1: {1.0: {"output_tokens_per_s": [220.0], "tokens_per_user": [150.0]}},
        2: {1.0: {"output_tokens_per_s": [60.0], "tokens_per_user": [40.0]}},
    }
    (point,) = figures.pareto({"a": blocks}, seed=3)["points"]
    assert point["tokens_per_s"][0] == 140.0  # the median of two blocks: their mean
    assert 60.0 <= point["tokens_per_s"][1] < 140.0 < point["tokens_per_s"][2] <= 220.0
    assert 40.0 <= point["tokens_per_user"][1] < point["tokens_per_user"][2] <= 150.0
    _, lo, hi = analysis.bootstrap_ratio([[220.0], [60.0]], [[1.0], [1.0]], seed=3)
    assert point["tokens_per_s"][1:] == [round(lo, 4), round(hi, 4)]
