"""servebook's own steps for an experiment (``runner.Steps``): a recipe arm comes up
through its backend as `servebook up` brings it up, is warmed and verified as `servebook
run` verifies, and benched with bench's sweep (``servebook.bench.sweep``); an attached or
URL arm is benched as `servebook bench NAME` or `--url` benches it.  A failure of one step is
``StepFailed`` (the block is invalid with its message); a stop signal is not caught here,
so the runner's ``finally`` takes down what it brought up."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servebook import auth
from servebook.bench import target as tgt
from servebook.bench.health import ServingCheck, not_serving
from servebook.bench.sweep import DEFAULT_PRECISION, BenchArgs, run_bench
from servebook.errors import ServebookError, UsageError
from servebook.experiment.runner import Say, StepFailed, Steps
from servebook.experiment.spec import Arm, Experiment, dataset_path

if TYPE_CHECKING:
    from servebook.backends.base import Place
    from servebook.recipe.plan import Plan

_BENCH_FIELDS = {f.name: f for f in dataclasses.fields(BenchArgs)}
_NOT_BENCH_ARGS = {"tokenizer", "load_image", "load_start_timeout"}


def bench_args(exp: Experiment, arm: Arm, block: int | None = None) -> BenchArgs:
    """bench's settings from the experiment's ``load:`` (each key a bench flag's long
    name), typed as bench types them; one seed for every arm (the same prompts), and in
    ``block`` the block's orders of the levels (``design.level_orders``), which every arm
    of the block runs."""
    given: dict[str, Any] = {"seed": exp.seed, "require_server_evidence": arm.kind != "url"}
    for key, value in exp.load.items():
        name = key.replace("-", "_")
        if name in _NOT_BENCH_ARGS:
            continue
        default = getattr(BenchArgs(), name)
        if name == "dataset":
            given[name] = dataset_path(exp)
            continue
        if name == "precision" and value is False:  # YAML reads a bare `off` as false
            value = "off"
        try:
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ValueError("give true or false")
                given[name] = value
            elif isinstance(default, int) or name in ("min_requests", "max_repetitions", "agents"):
                given[name] = int(value)
            elif isinstance(default, float):
                given[name] = float(value)
            else:
                given[name] = str(value)
        except ValueError:
            raise UsageError(
                f"{exp.path}: load.{key}: {value!r} is not what `servebook bench --{key}` takes",
                hint=f"see `servebook bench --help` for --{key}",
            ) from None
    # bench's precision target where the file gives none, as every other default is
    # bench's (BenchArgs holds none: `run` and the agents set their own)
    given.setdefault("precision", DEFAULT_PRECISION)
    a = BenchArgs(**given)
    if block is None:
        return a
    orders = level_orders(exp, a, block)
    if not orders:
        return a
    return dataclasses.replace(a, order="counterbalanced", level_orders=orders)


def level_orders(exp: Experiment, a: BenchArgs, block: int) -> tuple[tuple[str, ...], ...]:
    """Each round's order of the load's levels (labels: ``c=4``) in the benches of
    ``block``; none for a single level."""
    from servebook.bench.protocol import round_order
    from servebook.bench.sweep import settings_from
    from servebook.experiment.design import level_orders as orders

    ascending = dataclasses.replace(settings_from(a, None), order="ascending", level_orders=())
    labels = [lv.label() for lv in round_order(ascending, 0)]
    if len(labels) < 2:
        return ()
    return tuple(tuple(o) for o in orders(labels, block, exp.seed))


def block_of(where: Path) -> int:
    """The block whose results directory ``where`` is (``runner.results_dir``:
    ``arms/ARM/block-N``, as experiment.json records it)."""
    number = where.name.removeprefix("block-")
    if not number.isdigit():
        raise ValueError(f"{where} is not an experiment's block directory")
    return int(number)


def check_load(exp: Experiment) -> None:
    """Every arm's bench settings parse (levels, durations, precision), and a Kubernetes
    arm's load can run in the cluster (no file of this machine in it), before anything
    starts."""
    from servebook.backends import registry
    from servebook.bench.sweep import settings_from

    load_start_s(exp)
    for arm in exp.arms:
        a = bench_args(exp, arm)
        settings_from(a, None)
        deployer = registry.get(arm.backend)
        if not deployer.loads_here:
            from servebook.backends.kubernetes.job_site import refuse_unsupported

            try:
                refuse_unsupported(a, tokenizer=exp.load.get("tokenizer"), resume=False)
            except UsageError as e:
                raise UsageError(
                    f"{exp.path}: arms[{arm.name}] runs on {deployer.title}, whose load runs "
                    f"in the cluster: {e}",
                    hint="leave dataset: and tokenizer: out of load: (the Pods tokenize on "
                    "the server)",
                ) from None
        check_workload(exp, arm, a)


def check_workload(exp: Experiment, arm: Arm, a: BenchArgs) -> None:
    """What each bench would refuse when it starts, refused before any arm comes up
    (issue 44 point 2; hostile probe D14: a bad ``api``, ``input-len: 0``, a missing
    dataset or tokenizer, a request timeout of 0 or nan were refused after other arms
    ran): exit 2 naming the key of the file."""
    import math

    from servebook import inputs
    from servebook.bench.sweep import request_shape_problem
    from servebook.urls import server_url

    def bad(key: str, problem: str, fix: str) -> UsageError:
        return UsageError(f"{exp.path}: {key}: {problem}", hint=fix)

    shape = request_shape_problem(a)
    if shape is not None:
        key, choose = shape
        raise bad(f"load.{key}", choose, f"see `servebook bench --help` for --{key}")
    for key, n in (("input-len", a.input_len), ("output-len", a.output_len)):
        if n < 1 and (key == "output-len" or a.dataset is None):
            raise bad(f"load.{key}", f"{n}", "give a number of tokens, 1 or more")
    if not (math.isfinite(a.request_timeout) and a.request_timeout > 0):
        raise bad("load.request-timeout", f"{a.request_timeout}", "give seconds above 0, e.g. 600")
    if a.dataset is not None:
        inputs.check_regular(a.dataset, f"{exp.path}: load.dataset file")
    tok = exp.load.get("tokenizer")
    if tok is not None and not Path(str(tok)).exists():
        raise bad(
            "load.tokenizer",
            f"{tok} does not exist (read from the working directory, {Path.cwd()})",
            "give the model directory that holds tokenizer.json, or leave tokenizer: out "
            "(the deployment's model directory, else the server's /tokenize)",
        )
    if arm.kind == "url":
        server_url(str(arm.url), f"{exp.path}: arms[{arm.name}].url")


def check_backends(exp: Experiment) -> None:
    """Every recipe arm's backend can bring its recipe up (the recipe is for that backend,
    and every parameter that backend needs is set), before anything starts: otherwise the
    arm would fail only when its turn came, after the arms before it had run."""
    from servebook.backends import registry
    from servebook.backends.base import refuse_unfit
    from servebook.experiment.values import resolve_arm

    for arm in exp.arms:
        if arm.kind != "recipe":
            continue
        try:
            refuse_unfit(resolve_arm(exp, arm), registry.get(arm.backend))
        except UsageError as e:
            raise UsageError(
                f"{exp.path}: arms[{arm.name}] (recipe {arm.recipe}, backend {arm.backend}): {e}",
                hint=e.hint or "set it in the experiment's values: or the arm's set:",
            ) from None


def load_start_s(exp: Experiment) -> float:
    """``load-start-timeout`` (seconds for the in-cluster load's Pods to run; bench's
    default 600)."""
    from servebook.bench.flags import parse_duration

    raw = exp.load.get("load-start-timeout")
    s = 600.0 if raw is None else parse_duration(str(raw), f"{exp.path}: load.load-start-timeout")
    if s <= 0:
        raise UsageError(f"{exp.path}: load.load-start-timeout {raw!r}: give a time above 0")
    return s


def estimated_s(exp: Experiment) -> tuple[float, float]:
    """The experiment's bench time, low and high (bench's own estimate per bench)."""
    from servebook.bench.sweep import settings_from

    low = high = 0.0
    for arm in exp.arms:
        lo, hi = settings_from(bench_args(exp, arm), None).estimated_s()
        low += lo * exp.blocks
        high += hi * exp.blocks
    return low, high


def in_cluster(
    exp: Experiment,
    owner: Place,
    name: str,
    namespace: str | None,
    a: BenchArgs,
    where: Path,
    key: str | None,
    say: Say,
) -> bool:
    """A Kubernetes deployment's bench runs in the cluster, as `servebook bench NAME` runs
    it there by default: an Indexed Job of load agents next to the engines, its results
    fetched into ``where`` and its objects deleted (``backends.kubernetes.job_site``).  False: the
    deployment is reached from here."""
    from servebook.backends.kubernetes import job_site

    site = owner.load_site(name, namespace)
    if site.here:
        return False
    source = job_site.source_of(site)
    prepared = job_site.prepare(
        source, a, agents=a.agents or 1, image=exp.load.get("load-image"), api_key=key
    )
    job_site.run_in_cluster(source, prepared, where, say=say, start_s=load_start_s(exp))
    return True


def arm_plan(exp: Experiment, arm: Arm, name: str) -> Plan:
    """The Plan deployment ``name`` of ``arm`` comes up from: resolved with that
    deployment's own state directory, as `servebook up --name NAME` resolves it, so its
    KV storage (``${state_dir}/kv``) is its alone, not the recipe name's directory that a
    plain `servebook up RECIPE` empties and `down` deletes."""
    from servebook.backends.state import state_dir_for
    from servebook.experiment.values import resolve_arm

    return resolve_arm(exp, arm, state_dir=state_dir_for(name))


def misses(check: ServingCheck | None) -> dict[str, Any]:
    """The entry's record of the /health asks that missed during its sweep (each role is
    called silent only after ``bench.health.TRIES`` in a row): evidence, even when a later
    ask was answered."""
    return {"health_misses": check.misses} if check is not None and check.misses else {}


def servebook_steps(exp: Experiment, say: Say, api_key: str | None) -> Steps:
    from servebook.backends import registry

    key = auth.resolve(api_key)
    tokenizer = exp.load.get("tokenizer")

    def up(arm: Arm, name: str) -> str:
        backend = registry.get(arm.backend)
        plan = arm_plan(exp, arm, name)
        if backend.has(name):
            # Its name is this experiment's (``runner.deployment_name``) and the run holds
            # the experiment's lock: it is left by a run of it that was killed (hostile
            # probe D10: the block failed for good and the engine kept running).
            say(f"{name} is left up by an earlier run of this experiment: taking it down first")
            try:
                backend.down(name)
            except ServebookError as e:
                raise StepFailed(
                    f"{name}, left up by an earlier run, would not go down: {e}"
                ) from None
        try:
            ready = backend.up(plan, name=name, timeout_s=None, say=say)
        except ServebookError as e:
            raise StepFailed(str(e)) from None
        return str(ready.name)

    def verify(arm: Arm, name: str) -> str | None:
        from servebook.verify.smoke import Options
        from servebook.verify.smoke import verify as smoke

        opts = Options(api_key=key)
        with registry.get(arm.backend).open(name) as view:
            rep = smoke(view, opts)
        failed = [f for f in rep.findings if f.failed]
        return "; ".join(f"{f.check} {f.message}" for f in failed) if failed else None

    def warm(arm: Arm, name: str) -> None:
        say(f"warming {name} up (a verify pass whose verdict is not kept)")
        verify(arm, name)

    def bench(arm: Arm, name: str | None, where: Path) -> dict[str, Any] | None:
        a = bench_args(exp, arm, block_of(where))
        check: ServingCheck | None = None
        try:
            if arm.kind == "url":
                assert arm.url is not None and arm.model is not None
                subject = tgt.from_url(
                    arm.url,
                    model=arm.model,
                    tokenizer=tokenizer,
                    api=a.api,
                    request_timeout_s=a.request_timeout,
                    api_key=key,
                )
                run_bench(subject, a, where, resume=False, tokenizer=tokenizer, resumable=False)
                return None
            owner, dep = (
                (registry.get(arm.backend), name)
                if name is not None
                else registry.locate(
                    arm.deployment, backend="kubernetes" if arm.namespace else None
                )
            )
            if in_cluster(exp, owner, dep, arm.namespace, a, where, key, say):
                return None
            with owner.open(dep, arm.namespace) as view:
                check = not_serving(view)
                subject = tgt.from_deployment(
                    view, api=a.api, request_timeout_s=a.request_timeout, api_key=key
                )
                run_bench(
                    subject,
                    a,
                    where,
                    resume=False,
                    tokenizer=tokenizer,
                    alive=view.dead_roles,
                    serving=check,
                    resumable=False,
                )
            return misses(check)
        except UsageError:
            raise
        except ServebookError as e:
            if e.exit_code >= 128:  # stopped by a signal: the experiment stops
                raise
            raise StepFailed(str(e), facts=misses(check)) from None

    def down(arm: Arm, name: str) -> None:
        registry.get(arm.backend).down(name)

    return Steps(up=up, warm=warm, verify=verify, bench=bench, down=down)
