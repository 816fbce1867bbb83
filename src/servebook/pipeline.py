"""The main job, `servebook run`: [preflight ->] up -> verify -> a short bench sweep ->
report -> down, one named step each.

Exit 0 only when verify passed and every benchmark point is valid; the sweep runs only
when verify passed.  A step that cannot go on raises ``ServebookError`` (a failed
preflight deploys nothing; ``UpFailed`` carries the role's evidence); whatever was brought
up is taken down afterwards unless ``keep``, whatever happened in between.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from servebook.backends.base import Deployer, Say
from servebook.bench import target as tgt
from servebook.bench.health import not_serving
from servebook.bench.sweep import BenchArgs, Interrupted, run_bench, settings_from
from servebook.bench.sweep import plan_text as sweep_plan
from servebook.console import err, out, print_findings, print_points, print_report
from servebook.deployment.site import LoadSite
from servebook.deployment.view import DeploymentView
from servebook.errors import ServebookError
from servebook.findings import exit_code
from servebook.recipe.plan import Plan
from servebook.report.render import write_report
from servebook.results.schema import Results
from servebook.verify.smoke import Options, verify

# The main job's sweep, made to survive `servebook compare A B --reproduce` between two
# runs on a 2-core machine that also runs both servers.  Reproduce judges each level's
# median over repetitions of tok/s and TPOT p50 against a 5% tolerance, so what decides is
# how far two runs' medians scatter.  A median of n repetitions scatters by about
# 1.25 cv / sqrt(n); for two runs' medians to fall within 5% of each other nearly always,
# each needs a 95% interval of about +-2.5%.  So: at least three repetitions, shuffled
# across the sweep so a noisy stretch touches every level alike, repeated while a level's
# interval is wider than +-2.5%, up to 20.
#
# What made the repetitions scatter was the deployment, not the protocol: with only their
# OpenMP threads bound, each engine's busy-waiting engine core and worker roamed both cores,
# and c=4 flipped between two regimes from one window to the next (440-812 tok/s, cv 21%,
# on a machine whose two plain loops kept their speed within 2%), so twenty repetitions
# still left two runs' TPOT 7.7% apart.  The local backend now confines each engine's whole
# process tree to its cores (backends/local/deployer.engine_cores): the same machine gave
# cv 0.1-0.9% for tok/s and engine TPOT at both levels, both levels were precise after 3-4
# repetitions, and two `make run`s in a row (152 s and 190 s) reproduced within 3.3%.  The
# client bounds are bench's defaults again: with the engines on their own cores the client's
# event loop lagged 1-2 ms at p99 and kept 99.9% of its streams busy.  Windows of 15 s,
# chosen when whole responses arrived in lumps; with steady streams shorter ones have
# not been tried.
RUN_SWEEP = BenchArgs(
    concurrency="1,4",
    repetitions=3,
    precision="2.5%",
    max_repetitions=20,
    duration="15s",
    warmup="3s",
    min_requests=4,
    input_len=512,
    output_len=64,
)


@dataclass
class Job:
    """What one run does: the recipe resolved for ``backend`` and how to treat it."""

    backend: Deployer
    name: str  # the deployment's
    plan: Plan
    recipe: str  # as the user named it, for titles
    opts: Options  # verify's, with the API key bench sends too
    timeout_s: float | None
    keep: bool
    out_dir: Path | None  # None: ./servebook-runs/NAME-TIME
    say: Say
    max_repetitions: int | None = None  # None: RUN_SWEEP's


def run(job: Job) -> int:
    """Every step in order; the exit code of the whole job."""
    out_dir = job.out_dir or Path("servebook-runs") / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    err.print(f"plan: {plan_text(job, out_dir)}", highlight=False, markup=False, soft_wrap=True)
    preflight(job)
    ready = job.backend.up(job.plan, name=job.name, timeout_s=job.timeout_s, say=job.say)
    step = "verify"
    try:
        with job.backend.open(ready.name) as view:
            rc = verify_step(job, view)
            if rc == 0:
                step = "bench"
                try:
                    rc = bench_step(job, view, out_dir)
                except Interrupted as e:
                    raise interrupted_bench(e, out_dir, ready.name) from None
                report_step(out_dir)
        return rc
    except KeyboardInterrupt:
        raise Interrupted(
            f"stopped during {step}: nothing was measured; {ready.name} was taken down. "
            "`servebook run` starts over.",
            path=None,
            points=0,
        ) from None
    finally:
        down_step(job, ready.name)


def sweep_of(job: Job) -> BenchArgs:
    """The main job's sweep, with the job's repetition cap."""
    if job.max_repetitions is None:
        return RUN_SWEEP
    return replace(RUN_SWEEP, max_repetitions=job.max_repetitions)


def plan_text(job: Job, out_dir: Path) -> str:
    """The whole job as a person reads it before anything starts (up alone takes
    minutes): what comes up where, what is checked, the sweep as bench states it (with its
    time; the deployment's own bounds, such as PD's handoff share, are added when it
    starts), and what happens after."""
    roles = ", ".join(r.name for r in job.plan.roles)
    sweep = sweep_of(job)
    after = f"kept up (`servebook down {job.name}`)" if job.keep else "then down"
    return (
        f"up {job.name} (role{'s' if len(job.plan.roles) > 1 else ''} {roles}) on "
        f"{job.backend.title}, {job.backend.up_cost}; verify it from its servers' counters; "
        f"then, if it passes, the sweep: {sweep_plan(settings_from(sweep, None), sweep)}; "
        f"then its report in {out_dir}; {after}"
    )


def interrupted_bench(e: Interrupted, out_dir: Path, name: str) -> Interrupted:
    """Ctrl-C during the main job's sweep: the report of the points it has, then down."""
    report = ""
    if e.points:
        report = f" Their report: {report_step(out_dir)}."
    return Interrupted(
        f"the sweep {e}{report} {name} was taken down; `servebook run` starts over.",
        path=e.path,
        points=e.points,
    )


def preflight(job: Job) -> None:
    """The backend's checks worth their time before up (a cluster's); a failing one
    deploys nothing."""
    checks = job.backend.preflight(job.plan)
    if not checks:
        return
    print_findings(checks, title=f"servebook preflight {job.recipe}", console=out)
    code = exit_code(checks)
    if code:
        raise ServebookError("nothing was deployed.", exit_code=code, label="preflight failed")


def verify_step(job: Job, view: DeploymentView) -> int:
    job.say(f"verifying {view.name} from server-side counters")
    rep = verify(view, job.opts)
    print_report(rep, view.name)
    return exit_code(rep.findings)


def bench_step(job: Job, view: DeploymentView, out_dir: Path) -> int:
    """The short sweep; 1 when a point is invalid.  A role that dies stops it (exit 1), as
    does a failing load generator (exit 2): both are ``ServebookError``
    (``servebook.bench.sweep``)."""
    sweep = sweep_of(job)
    site = job.backend.load_site(view.name)
    if not site.here:
        results, path = bench_in_cluster(job, view.name, site, sweep, out_dir)
    else:
        job.say(f"benchmarking {view.name} (the sweep's plan, with the deployment's bounds)")
        subject = tgt.from_deployment(
            view, api="completions", request_timeout_s=120.0, api_key=job.opts.api_key
        )
        results, path = run_bench(
            subject,
            sweep,
            out_dir,
            resume=False,
            tokenizer=None,
            alive=view.dead_roles,
            serving=not_serving(view),
            resumable=False,
        )
    print_points(results, path)
    return 0 if all(p.valid for p in results.points) else 1


def bench_in_cluster(
    job: Job, name: str, site: LoadSite, sweep: BenchArgs, out_dir: Path
) -> tuple[Results, Path]:
    """On Kubernetes the sweep runs next to the servers, as `bench NAME` does by default:
    one load agent in a Job in the deployment's namespace, in the engine's image, its
    results fetched and the Job deleted (``backends/kubernetes/job_site``).  Measured through
    port-forwards, every latency would carry the API server's and the kubelet's relay."""
    from servebook.backends.kubernetes import job_site

    source = job_site.source_of(site)
    job.say(
        f"benchmarking {name} from a load Job in namespace {source.namespace}, next to its "
        "servers (its plan is the Pod's)"
    )
    prepared = job_site.prepare(source, sweep, agents=1, image=None, api_key=job.opts.api_key)
    return job_site.run_in_cluster(source, prepared, out_dir, say=job.say)


def report_step(out_dir: Path) -> Path:
    html = write_report([out_dir], out_dir)
    out.print(f"report: {html}", highlight=False, markup=False)
    return html


def down_step(job: Job, name: str) -> None:
    if job.keep:
        out.print(
            f"kept: {name} is still up (`servebook down {name}` removes it).", highlight=False
        )
        return
    result = job.backend.down(name)
    out.print("down: " + ", ".join(f"{k} {v}" for k, v in result.done.items()))
