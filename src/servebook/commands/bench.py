"""`servebook bench`: a load sweep whose numbers reproduce (see bench/protocol.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from servebook import auth, redact
from servebook.backends import base
from servebook.bench import target as tgt
from servebook.bench.control import ClientError, default_workers
from servebook.bench.control import Progress as LoadProgress
from servebook.bench.figures import parse_slo
from servebook.bench.protocol import (
    PointOutcome,
    PointSpec,
    ProtocolSettings,
    parse_duration,
    parse_levels,
    parse_precision,
    parse_rates,
    parse_warmup,
    point_order,
    run_sweep,
)
from servebook.bench.server_tokenizer import ServerTokenizer
from servebook.bench.validity import Thresholds
from servebook.bench.workload import PromptSource, RandomPrompts, load_dataset, load_tokenizer
from servebook.commands import app, err, out
from servebook.commands.verify import ApiKeyOpt, NamespaceOpt, PlaceOpt
from servebook.errors import UsageError
from servebook.results.schema import RESULTS_NAME, Results
from servebook.results.store import ResultsWriter


class SweepStopped(Exception):
    """A role of the deployment died: further points would only measure errors."""


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
    request_timeout: float = 600.0
    max_point: str | None = None
    max_client_lag_ms: float = 10.0
    min_achieved_concurrency: float = 0.98
    prompt_format: str = "text"
    # Points without server counters are invalid (always for servebook's own deployments).
    require_server_evidence: bool = True
    # A precision target ("5%"): repeat each level until its interval is that tight, up to
    # max_repetitions (None: the protocol's default).  None: off, --repetitions exactly.
    precision: str | None = None
    max_repetitions: int | None = None


def settings_from(a: BenchArgs, min_handoff_share: float | None) -> ProtocolSettings:
    if not 0 < a.min_achieved_concurrency <= 1:
        raise UsageError(
            f"--min-achieved-concurrency {a.min_achieved_concurrency:g}: give a share of the "
            "level between 0 and 1, e.g. 0.98"
        )
    conc = parse_levels(a.concurrency) if a.concurrency else ()
    rates = parse_rates(a.rate) if a.rate else ()
    return ProtocolSettings(
        concurrencies=conc,
        rates=rates,
        repetitions=a.repetitions,
        order=a.order,  # type: ignore[arg-type]
        seed=a.seed,
        warmup=parse_warmup(a.warmup) if a.warmup else None,
        duration_s=parse_duration(a.duration),
        min_requests=a.min_requests,
        max_point_s=parse_duration(a.max_point, "--max-point") if a.max_point else None,
        precision=parse_precision(a.precision) if a.precision else None,
        max_repetitions=a.max_repetitions,
        thresholds=Thresholds(
            min_handoff_share=min_handoff_share,
            max_send_lag_p99_ms=a.max_client_lag_ms,
            max_loop_lag_p99_ms=a.max_client_lag_ms,
            require_server_evidence=a.require_server_evidence,
            min_achieved_concurrency=a.min_achieved_concurrency,
        ),
    )


def prompts_from(a: BenchArgs, tokenizer: str | ServerTokenizer) -> PromptSource:
    if a.api not in ("completions", "chat"):
        raise UsageError(f"--api {a.api!r}: choose completions or chat")
    if a.prompt_format not in ("text", "ids"):
        raise UsageError(f"--prompt-format {a.prompt_format!r}: choose text or ids")
    if a.dataset is not None:
        if a.prompt_format != "text":
            raise UsageError("--prompt-format ids builds random prompts; a --dataset is text")
        return load_dataset(
            a.dataset,
            default_output_len=a.output_len,
            tokenizer=load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer,
            api=a.api,  # type: ignore[arg-type]
        )
    return RandomPrompts(
        tokenizer,
        input_len=a.input_len,
        output_len=a.output_len,
        seed=a.seed,
        api=a.api,  # type: ignore[arg-type]
        prompt_format=a.prompt_format,  # type: ignore[arg-type]
    )


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def print_points(results: Results, path: Path) -> None:
    t = Table(title=f"servebook bench: {path}")
    for col in (
        "level",
        "rep",
        "valid",
        "ok",
        "err",
        "out tok/s",
        "req/s",
        "TTFT p50 ms",
        "TPOT p50 ms",
        "handoff",
        "why invalid",
    ):
        t.add_column(col, overflow="fold")
    for p in sorted(results.points, key=lambda p: (p.concurrency or 0, p.rate or 0, p.repetition)):
        level = f"c={p.concurrency}" if p.concurrency is not None else f"rate={p.rate:g}"
        share = p.server.get("handoff_share") if isinstance(p.server, dict) else None
        verdict = "[green]valid[/]" if p.valid else "[bold red]INVALID[/]"
        if p.imprecise:
            verdict += ", [yellow]imprecise[/]"
        t.add_row(
            level,
            str(p.repetition),
            verdict,
            str(p.requests_ok),
            str(p.errors),
            _fmt(p.output_tokens_per_s),
            _fmt(p.requests_per_s, 2),
            _fmt(p.ttft_ms.p50),
            _fmt(p.tpot_ms.p50, 2),
            "-" if share is None else f"{100 * share:.0f}%",
            escape("; ".join(r.split(":")[0] for r in p.invalid_reasons)),
        )
    out.print(t)
    for agg in results.aggregates:
        if agg.precision is not None:
            level = f"c={agg.concurrency}" if agg.concurrency is not None else f"rate={agg.rate:g}"
            out.print(
                f"{level}: {agg.precision.status} after {agg.precision.repetitions} "
                f"repetition(s): {agg.precision.describe()}",
                highlight=False,
                markup=False,
            )
    causes = sorted(
        {
            str(p.latency_diagnosis.get("cause"))
            for p in results.points
            if p.latency_diagnosis and p.latency_diagnosis.get("agrees") is False
        }
    )
    if causes:
        out.print(
            "client and server per-token latency disagree (likely cause: "
            f"{', '.join(causes)}); each point's latency_diagnosis says why",
            highlight=False,
            markup=False,
        )


def run_bench(
    subject: tgt.Subject,
    a: BenchArgs,
    out_dir: Path,
    *,
    resume: bool,
    tokenizer: str | None,
    alive: Callable[[], list[str]] | None = None,
) -> tuple[Results, Path]:
    """Run the sweep; returns the results and the results.json path.  ``alive()`` returns
    the names of dead roles (a deployment) so the sweep stops instead of measuring errors."""
    tok = tgt.tokenizer_for(subject, tokenizer)
    share = None
    if subject.target.decode_role is not None:
        share = tgt.pd_min_share(
            subject.target.metrics_urls[subject.target.decode_role], a.input_len
        )
    settings = settings_from(a, share)
    prompts = prompts_from(a, tok)
    slo = parse_slo(a.slo) if a.slo else None
    workers = a.workers or default_workers(max(lv.size for lv in settings.levels()))
    subject.info["client_workers"] = workers
    writer = ResultsWriter(out_dir, tgt.provenance(subject, settings, prompts), resume=resume)
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
                current["label"], current["t0"] = label, time.monotonic()
                bar.update(task, description=f"{label}: warm-up")
                return
            p = outcome.point
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
                f"{label}: {_fmt(p.output_tokens_per_s)} tok/s, {p.requests_ok} ok, "
                f"{p.errors} errors, {verdict}",
                highlight=False,
                markup=False,
            )
            bar.advance(task)
            if alive is not None:
                dead = alive()
                if dead:
                    raise SweepStopped(
                        f"role(s) {', '.join(dead)} of the deployment are not running; the "
                        f"sweep stopped after {label}. Finished points are in "
                        f"{writer.path}; bring the deployment back and rerun with --resume."
                    )

        def on_progress(pr: LoadProgress) -> None:
            phase = "window" if pr.window_start_ns is not None else "warm-up"
            el = max(pr.elapsed_s, 1e-9)
            bar.update(
                task,
                description=(
                    f"{current['label']}: {phase}, {pr.completed_ok} ok, {pr.errors} err, "
                    f"{pr.output_tokens / el:.0f} tok/s"
                ),
            )

        results = run_sweep(
            subject.target,
            settings,
            prompts,
            writer,
            workers=workers,
            slo_ms=slo,
            on_point=on_point,
            on_progress=on_progress,
        )
    return results, writer.path


HELP = (
    "Measure a deployment (or any OpenAI-compatible server with --url) with a load sweep "
    "whose numbers reproduce.\n\n"
    "Per point: a discarded warm-up, then a window bounded below by duration and completed "
    "requests; only requests that start and finish inside it count. Points run in an order "
    "shuffled with the seed (--order ascending to override), repeated --repetitions times "
    "with 95% confidence intervals; with --precision 5% each level is repeated (in later "
    "shuffled rounds, never back to back) until those intervals are that tight, and a level "
    "that reaches --max-repetitions first is reported imprecise with the interval it "
    "reached. Every point gets a validity verdict with reasons "
    "(window, request count, errors, client saturation, server evidence, PD handoff share); "
    "the engine's own latency histograms are recorded beside the client's figures, with the "
    "likely cause when they disagree; and DIR/results.json is rewritten atomically after "
    "each point (--resume continues it)."
    "\n\nOn Kubernetes every role is reached through a port-forward servebook opens to its "
    "Ready Pod; a forward that breaks or a Pod replaced during a point makes that point "
    "invalid (SB410) and stops the sweep, naming the role. Without --tokenizer and without "
    "the model on this machine, prompts are built with the server's own /tokenize."
    "\n\nExit 0 when every point is valid (an imprecise level is reported, not an error), 1 "
    "when a point is invalid or the sweep stopped, 2 on unusable input.\n\n"
    "Example: servebook bench tiny-pd --concurrency 1,4 --duration 30s -o out/tiny-pd"
)


def _sweep(
    subject: tgt.Subject,
    a: BenchArgs,
    out_dir: Path,
    resume: bool,
    tokenizer: str | None,
    alive: Callable[[], list[str]] | None,
) -> tuple[Results, Path]:
    """run_bench, with a sweep stopped by a dead role ending the command with exit 1."""
    try:
        return run_bench(subject, a, out_dir, resume=resume, tokenizer=tokenizer, alive=alive)
    except SweepStopped as e:
        err.print(f"[bold red]bench stopped:[/] {escape(redact.text(str(e)))}")
        raise typer.Exit(1) from None
    except ClientError as e:
        # The load generator itself failed: nothing this point measured is usable.
        err.print(
            f"[bold red]bench could not run:[/] {escape(redact.text(str(e)))}. Points finished "
            "before it "
            f"are in {escape(str(out_dir / RESULTS_NAME))}; rerun with --resume.",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(2) from None


@app.command(help=HELP)
def bench(
    deployment: str | None = typer.Argument(None, help="Deployment (default: the only one)."),
    url: str | None = typer.Option(None, "--url", help="Benchmark this server instead."),
    model: str | None = typer.Option(None, "--model", help="With --url: the model name."),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="Tokenizer directory (default: the deployment's model directory when it is on "
        "this machine, else the server's own /tokenize and /detokenize).",
    ),
    concurrency: str | None = typer.Option("1,4,16", "--concurrency", help="e.g. 1,4,16"),
    rate: str | None = typer.Option(None, "--rate", help="Open-loop rates (req/s), e.g. 2,8"),
    input_len: int = typer.Option(1024, "--input-len", help="Prompt tokens (server count)."),
    output_len: int = typer.Option(128, "--output-len", help="Output tokens (ignore_eos)."),
    warmup: str | None = typer.Option(
        None, "--warmup", help="e.g. 10s, 200r, 10s,200r (default: 10 s and 2 x level)."
    ),
    duration: str = typer.Option("60s", "--duration", help="Window length at least."),
    min_requests: int | None = typer.Option(
        None, "--min-requests", help="Window requests at least (default 10 x level)."
    ),
    repetitions: int = typer.Option(
        3,
        "--repetitions",
        help="Repetitions of each point (with --precision: the minimum, at least 2).",
    ),
    precision: str | None = typer.Option(
        None,
        "--precision",
        help="Precision target, e.g. 5%: repeat each level until the 95% interval "
        "half-width of its output tok/s and TPOT p50 is at most that share of the mean, up "
        "to --max-repetitions; a level that does not get there is marked imprecise. Off by "
        "default (recorded either way).",
    ),
    max_repetitions: int | None = typer.Option(
        None,
        "--max-repetitions",
        help="With --precision: the most repetitions of a level (default 10).",
    ),
    order: str = typer.Option("shuffled", "--order", help="shuffled or ascending."),
    seed: int = typer.Option(0, "--seed", help="Seed of prompts, arrivals and order."),
    slo: str | None = typer.Option(None, "--slo", help="Goodput SLOs, e.g. ttft=500ms,tpot=50ms"),
    api: str = typer.Option("completions", "--api", help="completions or chat."),
    dataset: Path | None = typer.Option(None, "--dataset", help="JSONL prompts instead."),
    workers: int | None = typer.Option(
        None,
        "--workers",
        help="Client processes (default: one per 256 streams, at most the cores).",
    ),
    request_timeout: float = typer.Option(600.0, "--request-timeout", help="Per request, s."),
    max_client_lag: float = typer.Option(
        10.0,
        "--max-client-lag-ms",
        help="Open loop: a point whose requests go out later than their schedule by more "
        "than this (p99) is invalid. Closed loop is judged by achieved concurrency; its "
        "send lag is reported.",
    ),
    min_achieved: float = typer.Option(
        0.98,
        "--min-achieved-concurrency",
        help="Closed loop: a point whose time-weighted requests in flight fall below this "
        "share of the level is client-limited, so invalid (recorded; lower it only on a "
        "machine the server shares).",
    ),
    prompt_format: str = typer.Option(
        "text",
        "--prompt-format",
        help="text, or ids: send token ids (completions API; exact lengths, no tokenizer "
        "work in the run). Recorded in the results.",
    ),
    require_server_evidence: bool = typer.Option(
        False,
        "--require-server-evidence",
        help="With --url: a point without server counters (vLLM's or SGLang's /metrics) "
        "is invalid. Always on for servebook's own deployments.",
    ),
    out_dir: Path = typer.Option(..., "-o", "--output", help="Directory for results.json."),
    resume: bool = typer.Option(False, "--resume", help="Continue DIR/results.json."),
    api_key: str | None = ApiKeyOpt,
    backend: str | None = PlaceOpt,
    namespace: str | None = NamespaceOpt,
) -> None:
    key = auth.resolve(api_key)
    a = BenchArgs(
        concurrency=None if rate and concurrency == "1,4,16" else concurrency,
        rate=rate,
        input_len=input_len,
        output_len=output_len,
        warmup=warmup,
        duration=duration,
        min_requests=min_requests,
        repetitions=repetitions,
        precision=precision,
        max_repetitions=max_repetitions,
        order=order,
        seed=seed,
        slo=slo,
        api=api,
        dataset=dataset,
        workers=workers,
        request_timeout=request_timeout,
        max_client_lag_ms=max_client_lag,
        min_achieved_concurrency=min_achieved,
        prompt_format=prompt_format,
        require_server_evidence=require_server_evidence or url is None,
    )
    if url is not None:
        if deployment is not None or backend is not None:
            raise UsageError("give a deployment (with --backend) or --url, not both")
        if not model:
            raise UsageError("--url needs --model NAME (the served model name)")
        subject = tgt.from_url(
            url,
            model=model,
            tokenizer=tokenizer,
            api=api,
            request_timeout_s=request_timeout,
            api_key=key,
        )
        results, path = _sweep(subject, a, out_dir, resume, tokenizer, None)
    else:
        owner, name = base.locate(
            deployment,
            "Start one with `servebook up RECIPE`, or benchmark a running server with "
            "--url URL --model NAME.",
            backend=backend,
        )
        with owner.open(name, namespace) as view:
            subject = tgt.from_deployment(
                view, api=api, request_timeout_s=request_timeout, api_key=key
            )
            results, path = _sweep(subject, a, out_dir, resume, tokenizer, view.dead_roles)
    print_points(results, path)
    if not all(p.valid for p in results.points):
        raise typer.Exit(1)
