"""The experiment's runner when something goes wrong, and the deployments it makes (issue
49, points 4 and 5): one slow /health answer does not lose a block (a role is called
silent only after ``bench.health.TRIES`` asks in a row missed, and each miss is recorded);
``--resume --retry BLOCK/ARM`` runs an invalid entry again in its place, recorded; a stop
prints the exact command that resumes; and every deployment an experiment makes has its
own name, logs and KV directory, distinct from a plain `servebook up`'s and from another
experiment's in the same home."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from servebook.backends.local.deployer import LocalBackend
from servebook.backends.state import state_dir_for
from servebook.bench import health
from servebook.bench.sweep import Interrupted
from servebook.deployment.view import DeploymentView, RoleView
from servebook.errors import UsageError
from servebook.experiment import runner, session, spec
from servebook.experiment.runner import StepFailed, Steps
from servebook.experiment.spec import Arm
from servebook.experiment.steps import arm_plan, servebook_steps
from servebook.kube.names import name_errors
from servebook.names import is_deployment_name
from servebook.recipe.resolve import resolve
from tests.conftest import CliResult
from tests.unit.engine_standin import scripted_engine, vllm_package
from tests.unit.result_runs import RESULTS
from tests.unit.served_app import served

FIELD_RUNS = {"mixed": RESULTS / "trial-mixed-spec", "pd": RESULTS / "trial-pd-spec"}


# --- a role is called silent only within a stated bound ----------------------------------


@pytest.fixture
def slow_once() -> Iterator[tuple[str, list[float]]]:
    """A server whose first /health answers after 0.6 s and every later one at once;
    yields its URL and when each ask came."""
    asked: list[float] = []

    async def health_page(_r: web.Request) -> web.Response:
        asked.append(time.monotonic())
        if len(asked) == 1:
            await _sleep(0.6)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health_page)
    with served(app) as url:
        yield url, asked


async def _sleep(s: float) -> None:
    import asyncio

    await asyncio.sleep(s)


def view_of(url: str, alive: Callable[[], bool | None] = lambda: True) -> DeploymentView:
    plan = resolve("tiny-mixed", [], [])
    role = RoleView("mixed", "engine", url, alive=alive)
    return DeploymentView("d", "local", "tiny-mixed", plan, "tiny", url, [role])


def test_one_slow_health_answer_is_a_recorded_miss_not_a_silent_role(
    slow_once: tuple[str, list[float]],
) -> None:
    url, asked = slow_once
    said: list[str] = []
    check = health.not_serving(view_of(url), timeout_s=0.3, pause_s=0.1, tell=said.append)
    assert check() == []  # answered at the second ask: it can serve
    (miss,) = check.misses
    assert miss["role"] == "mixed" and miss["ask"] == 1 and miss["tries"] == health.TRIES
    assert miss["then"] == "answered at ask 2" and miss["url"] == f"{url}/health"
    assert "timed out" in miss["error"] or "0.3" in miss["error"], miss
    assert len(asked) == 2 and asked[1] - asked[0] >= 0.3 + 0.1 - 0.05
    # told as it happened, and what came of it
    assert said[0].startswith("mixed missed /health (ask 1 of 3") and "again in 0.1 s" in said[0]
    assert said[1] == "mixed answered /health at ask 2 of 3"
    assert check() == [] and len(check.misses) == 1  # the next point's check: no miss


def test_a_role_is_called_silent_after_every_ask_missed_within_the_bound() -> None:
    from tests.unit.engine_standin import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    check = health.not_serving(view_of(url), timeout_s=0.2, pause_s=0.1, tell=lambda _l: None)
    t0 = time.monotonic()
    (silent,) = check()
    took = time.monotonic() - t0
    assert silent.startswith(f"mixed (nothing answers at {url}/health: 3 asks in a row missed")
    assert took <= health.bound_s(3, 0.2, 0.1) + 0.5
    assert [m["ask"] for m in check.misses] == [1, 2, 3]
    assert {m["then"] for m in check.misses} == {"called silent"}
    # the default bound, stated: 3 asks of 2 s, 2 s apart
    assert health.bound_s() == 10.0
    # a role whose process is gone is dead at once, with no ask
    gone = health.not_serving(view_of(url, alive=lambda: False))
    assert gone() == ["mixed (not running)"] and gone.misses == []


def test_a_slow_health_answer_during_an_experiment_s_bench_does_not_lose_the_block(
    sb_home: Path, tmp_path: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The field's case, through servebook's own steps: a local deployment (the stand-in
    engine as vLLM) whose /health answers 3 s late once, just as its bench starts (the
    sweep's 2 s ask misses).  Before, that one miss stopped the sweep and made the block
    invalid; now the block is valid and its entry records the miss."""
    flag = tmp_path / "slow-next-health"
    env = vllm_package(tmp_path / "vllm", slow_health=(flag, 3.0))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.syspath_prepend(str(tmp_path / "vllm"))
    (tmp_path / "model").mkdir()
    dataset = tmp_path / "p.jsonl"
    dataset.write_text(json.dumps({"prompt": "a prompt"}) + "\n")
    with scripted_engine(tokenizer=tiny_dir / "tokenizer.json") as (url, _):
        exp = spec.parse(
            {
                "baseline": "local",
                "blocks": 1,
                "arms": [
                    {
                        "name": "local",
                        "recipe": "tiny-mixed",
                        "set": {"model_dir": str(tmp_path / "model")},
                    },
                    {"name": "url", "url": url, "model": "tiny"},
                ],
                "load": {
                    "concurrency": [1],
                    "dataset": str(dataset),
                    "tokenizer": str(tiny_dir),
                    "output-len": 4,
                    "warmup": "50ms",
                    "duration": "300ms",
                    "repetitions": 1,
                    "precision": False,  # YAML's bare `off`
                    "min-requests": 1,
                    "max-client-lag-ms": 1000,
                    "min-achieved-concurrency": 0.1,
                },
            },
            str(tmp_path / "exp.yaml"),
        )
        real = servebook_steps(exp, lambda _l: None, None)

        def bench(arm: Arm, name: str | None, where: Path) -> dict[str, Any] | None:
            if name is not None:
                flag.touch()  # the next /health answers 3 s late
            return real.bench(arm, name, where)

        nothing: Callable[..., None] = lambda *_a: None  # noqa: E731
        steps = Steps(real.up, nothing, lambda *_a: None, bench, real.down)
        state = session.execute(exp, tmp_path / "out", steps, lambda _l: None)
    entry = next(e for e in state["schedule"] if e["arm"] == "local")
    assert entry["outcome"] == "done", entry
    (miss,) = entry["health_misses"]
    assert miss["role"] == "mixed" and miss["then"] == "answered at ask 2", miss
    assert not flag.exists()  # the slow answer was given
    saved = json.loads((tmp_path / "out" / "experiment.json").read_text())
    assert saved["schedule"] == state["schedule"] and state["invalid_blocks"] == []
    # its deployment was its own: named for the experiment, its logs under its name
    name = entry["deployment"]
    assert name == f"local-b1-{state['tag']}"
    assert (state_dir_for(name) / "logs" / "mixed.log").is_file()
    assert not (sb_home / "deployments" / "tiny-mixed").exists()


# --- --resume --retry BLOCK/ARM, and the command a stop prints ----------------------------


def field_file(tmp_path: Path) -> Path:
    f = tmp_path / "exp.yaml"
    f.write_text(
        json.dumps(
            {
                "baseline": "mixed",
                "blocks": 2,
                "arms": [
                    {"name": "mixed", "url": "http://127.0.0.1:9", "model": "m"},
                    {"name": "pd", "url": "http://127.0.0.1:9", "model": "m"},
                ],
                "load": {"concurrency": [1, 4]},
            }
        )
    )
    return f


def copying(calls: list[str], fail: dict[str, BaseException] | None = None) -> Steps:
    """Steps whose bench copies the field trial's results of the arm (real shapes), or
    raises what ``fail`` holds for the entry (BLOCK/ARM); ``calls``: each entry benched."""

    def bench(arm: Arm, _name: str | None, where: Path) -> dict[str, Any] | None:
        key = f"{where.name.removeprefix('block-')}/{arm.name}"
        calls.append(key)
        if fail and key in fail:
            raise fail[key]
        where.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIELD_RUNS[arm.name] / "results.json", where / "results.json")
        return None

    nothing: Callable[..., None] = lambda *_a: None  # noqa: E731
    return Steps(lambda _a, name: name, nothing, lambda *_a: None, bench, nothing)


def test_resume_retry_runs_an_invalid_entry_again_in_its_place_and_records_it(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    f = field_file(tmp_path)
    exp = spec.load(f)
    out = tmp_path / "out"
    order = [f"{b}/{a}" for b, a in session.order_of(exp)]
    bad, stop = order[1], order[2]
    why = "role(s) router (nothing answers at http://r/health: 3 asks in a row missed)"
    calls: list[str] = []
    fail: dict[str, BaseException] = {bad: StepFailed(why), stop: KeyboardInterrupt()}
    with pytest.raises(session.ExperimentStopped) as e:
        session.execute(exp, out, copying(calls, fail), lambda _l: None)
    # the exact command that continues it
    assert f"run:\n  servebook experiment {f} -o {out} --resume" in str(e.value)
    first = json.loads((out / "experiment.json").read_text())
    entry = {runner.entry_id(x): x for x in first["schedule"]}
    assert entry[bad]["outcome"] == f"bench failed: {why}"
    assert [entry[k]["outcome"] for k in order[2:]] == ["pending", "pending"]

    # refused, before anything runs: not an entry, a finished one, no --resume
    for args, said in (
        (["--resume", "--retry", "pd"], "name an entry of the schedule as BLOCK/ARM, e.g."),
        (["--resume", "--retry", "3/pd"], "has no entry 3/pd"),
        (["--resume", "--retry", order[0]], "that entry finished"),
        (["--resume", "--retry", order[3]], "has not run yet"),
        (["--retry", bad], "give --resume too"),
    ):
        r = cli("experiment", str(f), "-o", str(out), *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert said in " ".join(r.stderr.split()), (args, r.stderr)
        if args[0] == "--resume":
            assert f"its invalid entries: {bad}" in " ".join(r.stderr.split())
    assert json.loads((out / "experiment.json").read_text()) == first  # nothing changed

    calls.clear()
    said_lines: list[str] = []
    done = session.execute(exp, out, copying(calls), said_lines.append, resume=True, retry=[bad])
    # in its place: before the entries still pending, in the schedule's order
    assert calls == order[1:]
    assert [runner.entry_id(x) for x in done["schedule"]] == order
    assert [x["outcome"] for x in done["schedule"]] == ["done"] * 4
    again = next(x for x in done["schedule"] if runner.entry_id(x) == bad)
    (before,) = again["retried"]
    assert before["outcome"] == f"bench failed: {why}" and before["retried_at"]
    assert before["started_at"] == entry[bad]["started_at"]
    assert again["started_at"] >= before["ended_at"]
    assert done["schedule"][0] == first["schedule"][0]  # not run again
    assert done["invalid_blocks"] == []
    assert any(
        line.startswith(f"retrying {bad} in its place (was: bench failed") for line in said_lines
    )


def test_a_stop_inside_bench_prints_the_command_that_resumes(tmp_path: Path) -> None:
    """bench's own stop (Ctrl-C or SIGTERM in the sweep: ``Interrupted``, exit 130) ended
    the experiment with bench's message, which never mentioned --resume."""
    f = field_file(tmp_path)
    exp = spec.load(f)
    out = tmp_path / "my out"  # a path a shell must quote
    first = "/".join(map(str, session.order_of(exp)[0]))
    stop = Interrupted("stopped at c=4 rep 0", path=None, points=0)
    with pytest.raises(session.ExperimentStopped) as e:
        session.execute(
            exp, out, copying([], {first: stop}), lambda _l: None, extra_args=["--kubeconfig", "k"]
        )
    assert e.value.exit_code == 130
    assert str(e.value).endswith(
        f"run:\n  servebook experiment {f} -o '{out}' --resume --kubeconfig k"
    )


# --- every deployment an experiment makes is its own --------------------------------------


def pd_arms(tmp_path: Path) -> spec.Experiment:
    f = tmp_path / "pd.yaml"
    f.write_text(
        "baseline: pd\nblocks: 2\nvariable: [engine_args]\narms:\n"
        "  - {name: pd, recipe: tiny-pd}\n"
        "  - {name: pd-seqs, recipe: tiny-pd, set: {extra_engine_args: --max-num-seqs 8}}\n"
    )
    return spec.load(f)


def test_each_deployment_has_its_own_name_and_kv_directory_in_one_home(
    sb_home: Path, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """Every PD arm's deployment used SERVEBOOK_HOME/deployments/tiny-pd/kv, the directory
    a plain `servebook up tiny-pd` empties and deletes, and two experiments in one home
    reused each other's names (pd-b1) and so their logs."""
    exp = pd_arms(tmp_path)
    plain = resolve("tiny-pd", [], [], state_dir=state_dir_for("tiny-pd"))
    kv_dirs = {plain.kv_storage[0]}
    names = set()
    for out in (tmp_path / "one", tmp_path / "two"):
        tag = session.tag_of(exp, out)
        for b, a in session.order_of(exp):
            name = runner.deployment_name(tag, a, b)
            plan = arm_plan(exp, exp.arm(a), name)
            assert plan.kv_storage == [str(state_dir_for(name) / "kv")]
            names.add(name)
            kv_dirs.add(plan.kv_storage[0])
    assert len(names) == 8 and len(kv_dirs) == 9  # 2 experiments x 4, and none is up's
    # the plan --dry-run prints names them so
    r = cli("experiment", str(exp.path), "-o", str(tmp_path / "one"), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    printed = {d["name"] for d in json.loads(r.stdout)["deployments"]}
    assert printed < names and len(printed) == 4
    # a name a deployment of this home holds already (one an experiment left in a
    # directory since removed) is not taken again: its logs stay its own
    one = session.tag_of(exp, tmp_path / "one")
    state_dir_for(runner.deployment_name(one, "pd", 2)).mkdir(parents=True)
    assert session.tag_of(exp, tmp_path / "one") != one


@pytest.mark.parametrize(
    "arm", ["pd", "7b", "a" * 40, "a" * 30 + "-x", "abcdefghijklmnopqrstuvwxyz-0123456789"]
)
def test_a_deployment_name_is_a_kubernetes_name_with_room_for_its_objects(arm: str) -> None:
    name = runner.deployment_name("c0ffee", arm, 12)
    assert is_deployment_name(name) and len(name) <= runner.NAME_MAX
    # a Service's name (DNS-1035), with room for the longest object the backend derives
    assert name_errors(name, "dns1035") == []
    assert name_errors(f"{name}-prefill-lws-10" + "-" + "h" * 10, "label-value") == []
    assert name.endswith("-b12-c0ffee")
    # arms that share a long prefix keep names of their own
    assert runner.deployment_name("c0ffee", "a" * 39 + "b", 1) != runner.deployment_name(
        "c0ffee", "a" * 39 + "c", 1
    )


def test_up_refuses_kv_storage_in_another_deployment_s_directory(sb_home: Path) -> None:
    """The guard under every caller: a Plan resolved for deployment tiny-pd, brought up
    under another name, would have emptied tiny-pd's KV storage; refused first."""
    plan = resolve("tiny-pd", [], [], state_dir=state_dir_for("tiny-pd"))
    theirs = Path(plan.kv_storage[0])
    theirs.mkdir(parents=True)
    (theirs / "kv-of-a-request").write_text("x")
    with pytest.raises(UsageError) as e:
        LocalBackend().up(plan, name="pd-b1-c0ffee", timeout_s=5, say=lambda _l: None)
    assert "lies in deployment 'tiny-pd''s directory" in str(e.value)
    assert (theirs / "kv-of-a-request").read_text() == "x"
    assert not state_dir_for("pd-b1-c0ffee").exists()


# --- load: takes bench's defaults, and the plan says every setting -----------------------


def test_the_load_takes_bench_s_defaults_unless_the_file_says_otherwise(tmp_path: Path) -> None:
    """An experiment's load ran without bench's precision target (issue 49): its
    defaults are bench's, field for field, unless the file gives the key."""
    import inspect
    from dataclasses import fields

    from servebook.bench.sweep import settings_from
    from servebook.commands import bench as bench_command
    from servebook.experiment.steps import bench_args

    f = tmp_path / "exp.yaml"
    f.write_text(
        "baseline: a\narms:\n  - {name: a, recipe: tiny-mixed}\n  - {name: b, recipe: tiny-mixed}\n"
    )
    exp = spec.load(f)
    ours = bench_args(exp, exp.arm("a"))
    cli_defaults = {
        n: getattr(p.default, "default", p.default)
        for n, p in inspect.signature(bench_command.bench).parameters.items()
    }
    # the experiment's own: its seed, server evidence required of what servebook deploys,
    # and the levels bench takes when --concurrency is not given (the same 1,4,16)
    own = {"seed", "require_server_evidence", "concurrency"}
    for fld in fields(ours):
        if fld.name in cli_defaults and fld.name not in own:
            assert getattr(ours, fld.name) == cli_defaults[fld.name], fld.name
    s = settings_from(ours, None)
    assert s.precision == 0.05 and s.repetition_cap == 10 and s.concurrencies == (1, 4, 16)
    # the file says otherwise: precision off (YAML's bare `off` reads as false)
    f.write_text(f.read_text() + "load: {precision: off, repetitions: 2}\n")
    exp = spec.load(f)
    s = settings_from(bench_args(exp, exp.arm("a")), None)
    assert s.precision is None and s.repetitions == 2 and s.repetition_cap == 2


def test_the_plan_prints_every_load_setting_and_how_long_a_window_may_stretch(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    f = tmp_path / "exp.yaml"
    f.write_text(
        "baseline: a\narms:\n  - {name: a, recipe: tiny-mixed}\n  - {name: b, recipe: tiny-mixed}\n"
        "load: {concurrency: [1, 4], duration: 8s}\n"
    )
    r = cli("experiment", str(f), "-o", str(tmp_path / "out"), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    rows = {x["key"]: x for x in json.loads(r.stdout)["load"]}
    # every key load: takes that applies here (no rate, dataset or Kubernetes arm)
    left = {"rate", "dataset", "load-image", "load-start-timeout"}
    assert set(rows) == (spec.LOAD_KEYS - left) | {"window"}
    assert rows["duration"] == {"key": "duration", "value": "8 s", "from": "file"}
    assert rows["precision"]["from"] == "bench's default"
    assert rows["precision"]["value"].startswith("5%: a level is repeated until")
    assert rows["min-requests"]["value"] == "c=1: 10, c=4: 40 (10 x the level)"
    assert rows["window"]["value"].startswith("at least 8 s and until its minimum of requests")
    assert rows["window"]["value"].endswith("c=1: 600 s, c=4: 600 s")
    text = cli("experiment", str(f), "-o", str(tmp_path / "out"), "--dry-run").stdout
    assert "  precision: 5%: " in text and "[bench's default]" in text
    assert "  window: at least 8 s" in text and "  duration: 8 s\n" in text


def test_sigterm_during_an_experiment_prints_the_command_that_resumes_it(
    tmp_path: Path, tiny_dir: Path, sb_home: Path
) -> None:
    """A real `servebook experiment` process, its first bench's completions held open by
    the server, stopped by SIGTERM to its process group (as `timeout` and CI do)."""
    import os
    import signal
    import subprocess
    import sys

    from tests.unit.conftest import START

    seen = tmp_path / "seen"
    with scripted_engine(answer=0, tokenizer=tiny_dir / "tokenizer.json", seen=seen) as (url, _):
        f = tmp_path / "exp.yaml"
        arms = [{"name": n, "url": url, "model": "tiny"} for n in ("a", "b")]
        load = {"concurrency": [1], "tokenizer": str(tiny_dir), "input-len": 16,
                "output-len": 4, "warmup": "0s", "duration": "1s", "precision": "off",
                "repetitions": 1}  # fmt: skip
        f.write_text(json.dumps({"baseline": "a", "blocks": 1, "arms": arms, "load": load}))
        out = tmp_path / "out"
        p = subprocess.Popen(
            [sys.executable, "-c", START, "experiment", str(f), "-o", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "200", "SERVEBOOK_HOME": str(sb_home)},
        )
        deadline = time.monotonic() + 60
        while not (seen.exists() and any(seen.iterdir())):  # the bench's load is on
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=60)
    said = " ".join(stderr.split())
    assert p.returncode == 128 + signal.SIGTERM, stdout + stderr
    assert "Traceback" not in stderr
    assert f"0 of 2 benches are in {out / 'experiment.json'}" in said, said
    assert f"run: servebook experiment {f} -o {out} --resume" in said, said
