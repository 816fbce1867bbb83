"""A load sweep as servebook runs it, for `servebook bench` and the main job alike: the
sweep's arguments, its prompts, its results file and its progress on the terminal
(bench/protocol.py decides what the sweep is; this module runs it for a person).

A sweep that cannot go on ends as a ``ServebookError`` that ``cli.main`` prints: a role of
the deployment died (``SweepStopped``, exit 1: further points would only measure errors)
or the load generator itself failed (``LoadFailed``, exit 2: nothing the point measured is
usable).  Either way the points finished before it are in the results file.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from servebook.bench import target as tgt
from servebook.bench.control import ClientError, default_workers
from servebook.bench.control import Progress as LoadProgress
from servebook.bench.coordinator import Launcher
from servebook.bench.datasets import read_dataset, resolve_format
from servebook.bench.figures import parse_slo
from servebook.bench.flags import (
    parse_duration,
    parse_levels,
    parse_precision,
    parse_rates,
    parse_warmup,
)
from servebook.bench.lengths import parse_length_dist
from servebook.bench.prefixes import PrefixPrompts
from servebook.bench.protocol import (
    PointOutcome,
    PointSpec,
    ProtocolSettings,
    Stalled,
    point_order,
    replay_rate,
    run_sweep,
)
from servebook.bench.saved_requests import write_point_requests
from servebook.bench.server_tokenizer import ServerTokenizer
from servebook.bench.sessions import sessions_from, sharegpt_sessions
from servebook.bench.tokens import Api, load_tokenizer
from servebook.bench.trace_prompts import dataset_prompts
from servebook.bench.validity import Thresholds, prefix_hit_bound
from servebook.bench.workload import PromptFormat, PromptSource, RandomPrompts, handoff_lengths
from servebook.console import err, number
from servebook.errors import ServebookError, UsageError
from servebook.findings import EXIT_FAIL
from servebook.report.summary import describe_protocol
from servebook.results.schema import RESULTS_NAME, Results
from servebook.results.store import ResultsWriter, load_results


class SweepStopped(ServebookError):
    """A role of the deployment died: further points would only measure errors."""

    exit_code = EXIT_FAIL
    label = "bench stopped"


class LoadFailed(ServebookError):
    """The load generator itself failed (a worker died): nothing the point measured is
    usable."""

    label = "bench could not run"


class Interrupted(ServebookError):
    """Ctrl-C during a sweep: what was stopped, what was saved, how to go on."""

    exit_code = 130  # 128 + SIGINT, as a shell reports a command it interrupted
    label = "interrupted"

    def __init__(self, message: str, *, path: Path | None, points: int) -> None:
        super().__init__(message)
        self.path = path  # the results file, when one was written
        self.points = points  # finished points in it


@dataclasses.dataclass
class BenchArgs:
    concurrency: str | None = "1,4,16"
    rate: str | None = None
    input_len: int = 1024
    output_len: int = 128
    warmup: str | None = None
    duration: str = "60s"
    min_requests: int | None = None
    repetitions: int = 3
    order: str = "shuffled"
    seed: int = 0
    slo: str | None = None
    api: str = "completions"
    dataset: Path | None = None
    workers: int | None = None  # None: one per 256 streams, at most the cores
    agents: int | None = None  # load agents (--agents; --workers is its older name)
    save_requests: bool = False  # every request's record beside results.json
    request_timeout: float = 600.0
    max_point: str | None = None
    stall: str = "120s"  # no request succeeded for this long: the point and the sweep end
    max_client_lag_ms: float = 10.0
    min_achieved_concurrency: float = 0.98
    prompt_format: str = "text"
    # Points without server counters are invalid (always for servebook's own deployments).
    require_server_evidence: bool = True
    # A precision target ("5%"): repeat each level until its interval is that tight, up to
    # max_repetitions (None: the protocol's default).  None: off, --repetitions exactly.
    precision: str | None = None
    max_repetitions: int | None = None
    dataset_format: str | None = None  # None: detected from the file's content
    # A trace with timestamps and no --concurrency/--rate is replayed at this speed.
    replay_speed: float = 1.0
    max_schedule_lag_ms: float = 50.0
    burstiness: float = 1.0  # open loop: gamma shape of inter-arrivals (1: Poisson)
    input_len_dist: str | None = None  # None: fixed (bench/lengths.py)
    output_len_dist: str | None = None
    # Shared prefixes (bench/prefixes.py): each prompt starts with one of prefix_count
    # prefixes of prefix_len tokens.  None: none.
    prefix_len: int | None = None
    prefix_count: int | None = None
    # Conversations (bench/sessions.py): each later turn carries the conversation so far.
    multi_turn: bool = False
    turns: int | None = None  # None: 2 for synthetic sessions, every turn of a dataset's
    turn_delay: str = "0s"
    # order "counterbalanced": each round's order of the levels (labels), from an
    # experiment (``experiment.design.level_orders``); no flag sets it.
    level_orders: tuple[tuple[str, ...], ...] = ()


#: The concurrency levels of a sweep given neither --concurrency nor --rate (nor a trace).
DEFAULT_CONCURRENCY = "1,4,16"
# bench takes run's protocol by default: a precision target, up to --max-repetitions
# (issue 32, finding 3: three repetitions gave ±30-70% intervals with exit 0); an
# experiment's load: too, unless its file says otherwise.
DEFAULT_PRECISION = "5%"


def settings_from(
    a: BenchArgs,
    min_handoff_share: float | None,
    handoff_undecidable: str | None = None,
    prompts: PromptSource | None = None,
    *,
    salted_each: bool = False,
) -> ProtocolSettings:
    """The protocol from the flags.  A trace with timestamps (``prompts.arrivals_ns``) and
    neither --concurrency nor --rate is replayed: one level, the trace's mean rate at
    --replay-speed."""
    if not 0 < a.min_achieved_concurrency <= 1:
        raise UsageError(
            f"--min-achieved-concurrency {a.min_achieved_concurrency:g}: give a share of the "
            "level between 0 and 1, e.g. 0.98"
        )
    trace = getattr(prompts, "arrivals_ns", None)
    replay = bool(trace) and not a.concurrency and not a.rate
    conc_text = a.concurrency or (None if a.rate or replay else DEFAULT_CONCURRENCY)
    conc = parse_levels(conc_text) if conc_text else ()
    rates = parse_rates(a.rate) if a.rate else ()
    if replay and trace:
        if not (a.replay_speed > 0 and math.isfinite(a.replay_speed)):
            raise UsageError(f"--replay-speed {a.replay_speed:g}: give a positive factor, e.g. 1")
        rates = (round(replay_rate(trace, a.replay_speed), 6),)
    settings = ProtocolSettings(
        replay_speed=a.replay_speed if replay else None,
        burstiness=a.burstiness,
        concurrencies=conc,
        rates=rates,
        repetitions=a.repetitions,
        # A replay has one level, the trace's: no order to give.
        order="shuffled" if replay and a.level_orders else a.order,  # type: ignore[arg-type]
        level_orders=() if replay else tuple(tuple(o) for o in a.level_orders),
        seed=a.seed,
        warmup=parse_warmup(a.warmup) if a.warmup else None,
        duration_s=parse_duration(a.duration),
        min_requests=a.min_requests,
        max_point_s=parse_duration(a.max_point, "--max-point") if a.max_point else None,
        stall_s=parse_duration(a.stall, "--stall"),
        precision=parse_precision(a.precision) if a.precision else None,
        max_repetitions=a.max_repetitions,
        thresholds=Thresholds(
            min_handoff_share=min_handoff_share,
            handoff_undecidable=handoff_undecidable,
            max_send_lag_p99_ms=a.max_client_lag_ms,
            max_schedule_lag_p99_ms=a.max_schedule_lag_ms,
            max_prefix_hit_share=_prefix_bound(prompts, a.input_len, salted_each),
            max_loop_lag_p99_ms=a.max_client_lag_ms,
            require_server_evidence=a.require_server_evidence,
            min_achieved_concurrency=a.min_achieved_concurrency,
        ),
    )
    labels = sorted(lv.label() for lv in settings.levels())
    for given in settings.level_orders:
        if sorted(given) != labels:
            raise UsageError(
                f"level order {', '.join(given)} is not an order of the levels {', '.join(labels)}"
            )
    return settings


def _prefix_bound(
    prompts: PromptSource | None, input_len: int, salted_each: bool = False
) -> float | None:
    """SB412's bound for this workload (``validity.prefix_hit_bound``): judged where it
    shares no prefix, or where each request has a cache salt of its own (``tgt.salted``:
    then not even a dataset's repeats or a template's tokens can be cache hits)."""
    declared = getattr(prompts, "shares_prefixes", None)
    if declared is True:
        return None
    if salted_each:
        return prefix_hit_bound(False, 0, input_len)
    if declared is not False:
        return None
    lead = getattr(prompts, "shared_lead_tokens", None)
    return prefix_hit_bound(False, lead() if lead is not None else 0, input_len)


def prompt_run(out_dir: Path, resume: bool) -> int:
    """The run whose prompts this invocation sends (``workload``, "Seeding"): the results
    file's when resuming it, so the rest of the sweep is what the first run would have
    sent; else a fresh one, so that no prompt of an earlier run on the same deployment is
    sent again (its prefix cache would answer it: issue 32, finding 2)."""
    path = out_dir / RESULTS_NAME
    if resume and path.exists():
        # read as the writer reads it: a file that is not results is refused, naming it
        run = load_results(path).provenance.workload.get("run")
        if isinstance(run, int) and not isinstance(run, bool):
            return run
    return secrets.randbelow(2**31)


def prompts_from(
    a: BenchArgs, tokenizer: str | ServerTokenizer, run: int | None = None
) -> PromptSource:
    """The workload the flags describe: random prompts (with shared prefixes), a dataset,
    or conversations of either."""
    if not a.multi_turn:
        if a.turns is not None or a.turn_delay not in ("0s", "0"):
            flag = "--turns" if a.turns is not None else "--turn-delay"
            raise UsageError(f"{flag} shapes conversations", hint="add --multi-turn")
        return _single_turn(a, tokenizer, run)
    if a.api != "chat":
        raise UsageError(
            "--multi-turn sends each turn with the conversation so far as chat messages",
            hint="add --api chat",
        )
    delay = parse_duration(a.turn_delay, "--turn-delay")
    if a.dataset is None:
        inner = _single_turn(a, tokenizer, run)
        return sessions_from(inner, turns=a.turns, turn_delay_s=delay, api=a.api)
    form = resolve_format(a.dataset, a.dataset_format)
    if form != "sharegpt":
        raise UsageError(
            f"--multi-turn with --dataset {a.dataset}: a {form} file holds single requests; "
            "conversations come from a ShareGPT file or from synthetic sessions",
            hint="give a ShareGPT --dataset, or leave --dataset out for --turns N sessions",
        )
    return sharegpt_sessions(
        read_dataset(a.dataset, form),
        default_output_len=a.output_len,
        tok=load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer,
        turns=a.turns,
        turn_delay_s=delay,
    )


# The request's shape: each option and the values bench can send (its type's).
REQUEST_SHAPE = {"api": get_args(Api), "prompt-format": get_args(PromptFormat)}


def request_shape_problem(a: BenchArgs) -> tuple[str, str] | None:
    """``(option, what to choose)`` for the first option of ``REQUEST_SHAPE`` whose value
    bench cannot send, else None."""
    for option, allowed in REQUEST_SHAPE.items():
        if getattr(a, option.replace("-", "_")) not in allowed:
            return option, f"choose {' or '.join(allowed)}"
    return None


def check_api(a: BenchArgs) -> None:
    """The request's shape: an API and a prompt format bench can send."""
    bad = request_shape_problem(a)
    if bad is not None:
        option, choose = bad
        raise UsageError(f"--{option} {getattr(a, option.replace('-', '_'))!r}: {choose}")


def _single_turn(a: BenchArgs, tokenizer: str | ServerTokenizer, run: int | None) -> PromptSource:
    check_api(a)
    if (a.prefix_len is None) != (a.prefix_count is None):
        given = "--prefix-len" if a.prefix_len is not None else "--prefix-count"
        raise UsageError(
            f"{given} alone: shared prefixes need both --prefix-len L (tokens) and "
            "--prefix-count P (how many prefixes)",
            hint="e.g. --prefix-len 256 --prefix-count 4",
        )
    if a.dataset is not None:
        if a.prefix_len is not None:
            raise UsageError(
                "--prefix-len and --prefix-count build random prompts around shared "
                "prefixes; a --dataset brings its own text"
            )
        if a.prompt_format != "text":
            raise UsageError("--prompt-format ids builds random prompts; a --dataset is text")
        if a.input_len_dist or a.output_len_dist:
            raise UsageError(
                "--input-len-dist and --output-len-dist shape random prompts; a --dataset "
                "brings its own lengths"
            )
        return dataset_prompts(
            a.dataset,
            a.dataset_format,
            default_output_len=a.output_len,
            tokenizer=load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer,
            api=a.api,  # type: ignore[arg-type]
            seed=a.seed,
            run=run,
        )
    if a.dataset_format is not None:
        raise UsageError("--dataset-format names the format of a --dataset file; give one")
    kw: dict[str, Any] = {
        "input_len": a.input_len,
        "output_len": a.output_len,
        "input_dist": parse_length_dist(a.input_len_dist, "--input-len-dist", a.input_len),
        "output_dist": parse_length_dist(a.output_len_dist, "--output-len-dist", a.output_len),
        "seed": a.seed,
        "run": run,
        "api": a.api,
        "prompt_format": a.prompt_format,
    }
    if a.prefix_len is not None and a.prefix_count is not None:
        return PrefixPrompts(tokenizer, prefix_len=a.prefix_len, prefix_count=a.prefix_count, **kw)
    return RandomPrompts(tokenizer, **kw)


def run_bench(
    subject: tgt.Subject,
    a: BenchArgs,
    out_dir: Path,
    *,
    resume: bool,
    tokenizer: str | None,
    alive: Callable[[], list[str]] | None = None,
    resumable: bool = True,
    launcher: Launcher | None = None,
    serving: Callable[[], list[str]] | None = None,
) -> tuple[Results, Path]:
    """Run the sweep; returns the results and the results.json path.  ``alive()`` returns
    the names of dead roles (a deployment) so the sweep stops instead of measuring errors;
    ``serving()`` (``not_serving``), asked before each point, the roles that do not answer,
    so that no point is measured against a deployment being taken down.
    ``resumable``: the caller can continue the results file (``bench --resume``), and a
    failed load generator's message says so.  ``launcher`` starts the load agents
    (``bench.coordinator.Launcher``; default: processes on this machine)."""
    try:
        return _run(
            subject,
            a,
            out_dir,
            resume=resume,
            tokenizer=tokenizer,
            alive=alive,
            launcher=launcher,
            serving=serving,
        )
    except ClientError as e:
        raise LoadFailed(
            f"{e}. Points finished before it are in {out_dir / RESULTS_NAME}"
            + ("; rerun with --resume." if resumable else ".")
        ) from None
    except _Stopped as e:
        n = len(e.writer.results.points)
        saved = (
            f"{n} finished point(s) are in {e.writer.path}"
            if n
            else "no point had finished, so nothing was saved"
        )
        go_on = "; rerun the same command with --resume to continue from there."
        raise Interrupted(
            f"stopped {e.label} (its partial measurements are discarded); {saved}"
            + (go_on if resumable and n else "."),
            path=e.writer.path if n else None,
            points=n,
        ) from None
    except KeyboardInterrupt:
        raise Interrupted(
            "stopped before the sweep started (while asking the target and building "
            "prompts): nothing was measured or written.",
            path=None,
            points=0,
        ) from None


class _Stopped(Exception):
    """Ctrl-C inside the sweep, with where it was."""

    def __init__(self, label: str, writer: ResultsWriter) -> None:
        self.label, self.writer = label, writer


def _run(
    subject: tgt.Subject,
    a: BenchArgs,
    out_dir: Path,
    *,
    resume: bool,
    tokenizer: str | None,
    alive: Callable[[], list[str]] | None,
    launcher: Launcher | None = None,
    serving: Callable[[], list[str]] | None = None,
) -> tuple[Results, Path]:
    if a.dataset is None:
        longest_in = parse_length_dist(a.input_len_dist, "--input-len-dist", a.input_len)
        longest_out = parse_length_dist(a.output_len_dist, "--output-len-dist", a.output_len)
        tgt.check_fits(
            subject.max_model_len,
            longest_in.upper(a.input_len),
            longest_out.upper(a.output_len),
            subject.target.endpoint.model,
        )
        if a.multi_turn:
            _check_conversation_fits(a, subject, longest_in.upper(a.input_len))
    tok = tgt.tokenizer_for(subject, tokenizer)
    run = prompt_run(out_dir, resume)
    prompts = prompts_from(a, tok, run)
    handoff = None
    if subject.target.decode_role is not None:
        handoff = tgt.pd_min_share(
            subject.target.metrics_urls[subject.target.decode_role],
            handoff_lengths(prompts, a.input_len),
        )
    subject.target = tgt.salted(subject, prompts, run)
    settings = settings_from(
        a,
        handoff.share if handoff else None,
        handoff.undecidable if handoff else None,
        prompts,
        salted_each=subject.target.endpoint.salt_each,
    )
    err.print(f"plan: {plan_text(settings, a)}", highlight=False, markup=False)
    if handoff is not None and handoff.undecidable:
        given = f"--dataset {a.dataset}" if a.dataset else f"--input-len {a.input_len}"
        err.print(
            f"warning: {given}: {handoff.undecidable}, so every point of this sweep is "
            "invalid (SB407); give longer prompts, or the engines a smaller --block-size.",
            highlight=False,
            markup=False,
        )
    slo = parse_slo(a.slo) if a.slo else None
    workers = a.agents or a.workers or default_workers(max(lv.size for lv in settings.levels()))
    subject.info["client_workers"] = workers
    prov = tgt.provenance(subject, settings, prompts, tgt.load_origin(subject, workers))
    with ResultsWriter(out_dir, prov, resume=resume) as writer:
        checks = _Checks(alive, serving)
        return _sweep(subject, a, settings, prompts, writer, workers, slo, checks, launcher)


def _check_conversation_fits(a: BenchArgs, subject: tgt.Subject, longest_in: int) -> None:
    """A conversation's last turn holds every turn before it and the replies: refused
    before any load when that cannot fit the served model's context."""
    turns, context = 2 if a.turns is None else a.turns, subject.max_model_len
    need = turns * (longest_in + a.output_len)
    if context is not None and need > context:
        raise UsageError(
            f"--multi-turn --turns {turns}: a conversation's last turn carries every turn "
            f"before it and the replies, about {turns} x ({longest_in} + {a.output_len}) = "
            f"{need} tokens, more than the served model {subject.target.endpoint.model!r} "
            f"takes (max_model_len {context}); nothing was measured or written.",
            hint="lower --turns, --input-len or --output-len",
        )


@dataclasses.dataclass
class _Checks:
    """What the sweep asks about the deployment: after each point, which roles died
    (``alive``); before each, which do not answer (``serving``)."""

    alive: Callable[[], list[str]] | None = None
    serving: Callable[[], list[str]] | None = None


def _sweep(
    subject: tgt.Subject,
    a: BenchArgs,
    settings: ProtocolSettings,
    prompts: PromptSource,
    writer: ResultsWriter,
    workers: int,
    slo: dict[str, float] | None,
    checks: _Checks,
    launcher: Launcher | None,
) -> tuple[Results, Path]:
    out_dir = writer.path.parent
    alive = checks.alive
    order = point_order(settings)
    done_before = len(writer.done_keys())

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} points"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as bar:
        task = bar.add_task("starting", total=len(order), completed=done_before)
        current = {"label": "", "t0": time.monotonic()}

        def on_point(spec: PointSpec, outcome: PointOutcome | None) -> None:
            label = f"{spec.level.label()} rep {spec.repetition}"
            if outcome is None:
                if spec.repetition >= settings.min_repetitions:
                    # A round a precision target added: the sweep grows by this point.
                    t = next(t for t in bar.tasks if t.id == task)
                    bar.update(task, total=max(t.total or 0, t.completed) + 1)
                silent = checks.serving() if checks.serving is not None else []
                if silent:
                    raise SweepStopped(
                        f"role(s) {', '.join(silent)} of the deployment do not answer; the "
                        f"sweep stopped before {label} instead of measuring connection "
                        f"errors. Finished points are in {writer.path}; bring the "
                        "deployment back and rerun with --resume."
                    )
                current["label"], current["t0"] = label, time.monotonic()
                bar.update(task, description=f"{label}: warm-up")
                return
            p = outcome.point
            if a.save_requests:
                write_point_requests(out_dir, p, outcome.load)
            verdict = "valid" if p.valid else "INVALID: " + "; ".join(p.invalid_reasons)
            if isinstance(p.server, dict) and p.server.get("evidence") == "none":
                verdict += " (no server evidence)"
            level_now = next(
                (x for x in writer.results.points if x.key == p.key), None
            )  # marked with its level's precision by the writer
            if level_now is not None and level_now.precision is not None:
                pr = level_now.precision
                verdict += (
                    f"; level {pr.status if pr.status != 'pending' else 'not yet precise'}: "
                    f"{pr.describe()}"
                )
            bar.console.print(
                f"{label}: {number(p.output_tokens_per_s)} output tok/s over the window, "
                f"{p.requests_ok} ok and {p.errors} failed of the requests it scheduled, "
                f"{verdict}",
                highlight=False,
                markup=False,
            )
            bar.advance(task)
            current["label"] = ""
            if alive is not None:
                dead = alive()
                if dead:
                    raise SweepStopped(
                        f"role(s) {', '.join(dead)} of the deployment are not running; the "
                        f"sweep stopped after {label}. Finished points are in "
                        f"{writer.path}; bring the deployment back and rerun with --resume."
                    )

        def on_progress(pr: LoadProgress) -> None:
            bar.update(task, description=f"{current['label']}: {live_counters(pr, settings)}")

        try:
            results = run_sweep(
                subject.target,
                settings,
                prompts,
                writer,
                workers=workers,
                slo_ms=slo,
                on_point=on_point,
                on_progress=on_progress,
                launcher=launcher,
            )
        except KeyboardInterrupt:
            where = f"at {current['label']}" if current["label"] else "between two points"
            raise _Stopped(where, writer) from None
        except Stalled as e:
            n = len(writer.results.points)
            raise SweepStopped(
                f"the target stalled at {e.spec.level.label()} rep {e.spec.repetition}: "
                f"{e.reason}. The sweep stopped there instead of waiting out every point "
                f"left; {n} point(s), the stalled one included (invalid), are in {writer.path}.",
                hint="check the server (`servebook status`, its log); rerun with --resume once "
                "it answers. A server that is only slow gets a longer --stall.",
            ) from None
    return results, writer.path


def live_counters(pr: LoadProgress, settings: ProtocolSettings) -> str:
    """What the bar says while a point runs, each count named for what it counts: in the
    window, the requests scheduled in it that finished (the table's ``ok``); before it,
    the warm-up's, which are discarded; tok/s is every output token since the load
    started (warm-up included) over that time, not the window's figure."""
    rate = f"{pr.output_tokens / max(pr.elapsed_s, 1e-9):.0f} output tok/s since the load started"
    if pr.window_start_ns is None:
        return f"warm-up {pr.elapsed_s:.0f} s (discarded), {pr.completed_ok} finished, {rate}"
    return (
        f"window {pr.window_elapsed_s:.0f}/{settings.duration_s:g} s, {pr.window_ok} ok and "
        f"{pr.window_errors} failed of the requests it scheduled, {rate}"
    )


def plan_text(settings: ProtocolSettings, a: BenchArgs) -> str:
    """The sweep as a person reads it before it starts: levels, repetitions, windows,
    workload and the time it should take."""
    low, high = settings.estimated_s()
    took = f"about {_minutes(low)}" + (f" to {_minutes(high)}" if high > low else "")
    workload = (
        f"prompts from {a.dataset}"
        if a.dataset is not None
        else f"{a.input_len} prompt and {a.output_len} output tokens a request"
    )
    return f"{describe_protocol(settings.to_dict())}; {workload}; {took}"


def _minutes(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"
