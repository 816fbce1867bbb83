"""`servebook bench`: a load sweep whose numbers reproduce (see bench/protocol.py)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from servebook import auth
from servebook.backends import registry
from servebook.bench import target as tgt
from servebook.bench.health import not_serving
from servebook.bench.sweep import DEFAULT_PRECISION, BenchArgs, run_bench
from servebook.commands import (
    KubeconfigOpt,
    app,
    comma_list,
    dataset_file,
    deployment_name,
    seconds,
    seed_number,
    server_url,
)
from servebook.commands.verify import ApiKeyOpt, NamespaceOpt, PlaceOpt
from servebook.console import print_points
from servebook.errors import UsageError

if TYPE_CHECKING:
    from servebook.backends.kubernetes.job_site import Source

HELP = (
    "Measure a deployment (or any OpenAI-compatible server with --url) with a load sweep "
    "whose numbers reproduce.\n\n"
    "Per point: a discarded warm-up, then a window bounded below by duration and completed "
    "requests; only requests that start and finish inside it count. Points run in an order "
    "shuffled with the seed (--order ascending to override), repeated --repetitions times "
    "with 95% confidence intervals; by default (--precision 5%, as `run`) each level is "
    "repeated (in later shuffled rounds, never back to back) until those intervals are that "
    "tight, and a level that reaches --max-repetitions first is reported imprecise with the "
    "interval it reached. A level without a warm-up, with fewer than 10 requests in a "
    "window or fewer than 2 valid repetitions is shown as not a measurement, never as a "
    "figure. Every point gets a validity verdict with reasons "
    "(window, request count, errors, client saturation, server evidence, PD handoff share); "
    "the engine's own latency histograms are recorded beside the client's figures, with the "
    "likely cause when they disagree; and DIR/results.json is rewritten atomically after "
    "each point (--resume continues it)."
    "\n\nOn Kubernetes the load runs in the cluster by default: an Indexed Job of --agents "
    "Pods (default 1) in the deployment's namespace, in the engine image (or --load-image), "
    "sends it to the entry Service's cluster address; the sweep runs in the Job's Pod 0, "
    "which reads each engine's counters at its Pod IP; the results are fetched through one "
    "port-forward and the Job is deleted afterwards. --dry-run -o DIR writes those objects "
    "and applies nothing. With --via port-forward every role is reached through a "
    "port-forward servebook opens to its Ready Pod instead (the latencies include the "
    "forward); a forward that breaks or a Pod replaced during a point makes that point "
    "invalid (SB410) and stops the sweep, naming the role. Without --tokenizer and without "
    "the model on this machine, prompts are built with the server's own /tokenize."
    "\n\nExit 0 when every point is valid (an imprecise level is reported, not an error), 1 "
    "when a point is invalid or the sweep stopped, 2 on unusable input.\n\n"
    "Example: servebook bench tiny-pd --concurrency 1,4 --duration 30s -o out/tiny-pd"
)


def _bench_args(options: dict[str, Any]) -> BenchArgs:
    """The sweep's settings from the command's options: each parameter named after a field
    of ``BenchArgs`` sets that field (the others, such as --url or -o, are not settings)."""
    return BenchArgs(**{f.name: options[f.name] for f in fields(BenchArgs) if f.name in options})


@app.command(help=HELP)
def bench(
    deployment: str | None = typer.Argument(
        None, help="Deployment (default: the only one).", callback=deployment_name
    ),
    url: str | None = typer.Option(
        None, "--url", help="Benchmark this server instead.", callback=server_url
    ),
    model: str | None = typer.Option(None, "--model", help="With --url: the model name."),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="Tokenizer directory (default: the deployment's model directory when it is on "
        "this machine, else the server's own /tokenize and /detokenize).",
    ),
    concurrency: str | None = typer.Option(
        None,
        "--concurrency",
        help="Closed-loop levels, e.g. 1,4,16 (the default, unless --rate or a trace to "
        "replay is given).",
        callback=comma_list,
    ),
    rate: str | None = typer.Option(
        None, "--rate", help="Open-loop rates (req/s), e.g. 2,8", callback=comma_list
    ),
    burstiness: float = typer.Option(
        1.0,
        "--burstiness",
        help="Open loop: gamma-distributed gaps between requests with this shape B "
        "(coefficient of variation 1/sqrt(B), as vLLM's and AIPerf's --burstiness): 1 is "
        "Poisson, 0.25 bursty, 4 smooth. Recorded. Example: --rate 8 --burstiness 0.5",
    ),
    input_len: int = typer.Option(1024, "--input-len", help="Prompt tokens (server count)."),
    output_len: int = typer.Option(128, "--output-len", help="Output tokens (ignore_eos)."),
    input_len_dist: str | None = typer.Option(
        None,
        "--input-len-dist",
        help="Prompt lengths around --input-len: fixed (default), uniform:min=A,max=B, "
        "normal:stdev=S[,min=A][,max=B] or lognormal:stdev=S[,min=A][,max=B]; seeded, "
        "recorded. Example: --input-len 512 --input-len-dist normal:stdev=128,min=64,max=1024",
    ),
    output_len_dist: str | None = typer.Option(
        None,
        "--output-len-dist",
        help="Output lengths around --output-len, as --input-len-dist. Example: "
        "--output-len-dist uniform:min=32,max=256",
    ),
    prefix_len: int | None = typer.Option(
        None,
        "--prefix-len",
        help="Shared prefixes: each prompt starts with one of --prefix-count prefixes of this "
        "many tokens (after the server's own: BOS, chat template), then text of its own up "
        "to --input-len; the point's server evidence shows the prefix-cache hits. Recorded. "
        "Example: --input-len 1024 --prefix-len 768 --prefix-count 4",
    ),
    prefix_count: int | None = typer.Option(
        None,
        "--prefix-count",
        help="With --prefix-len: how many distinct prefixes (each request picks one, "
        "seeded). Example: --prefix-count 4",
    ),
    multi_turn: bool = typer.Option(
        False,
        "--multi-turn",
        help="Conversations (chat API): each later turn is sent with the conversation so "
        "far, the server's own replies included, by the same agent and slot; TTFT is "
        "reported per turn. Synthetic sessions of --turns random prompts of --input-len, or "
        "a ShareGPT --dataset's conversations. The --concurrency level counts conversations. "
        "Example: --api chat --multi-turn --turns 4 --turn-delay 1s",
    ),
    turns: int | None = typer.Option(
        None,
        "--turns",
        help="With --multi-turn: turns a conversation (default 2; a ShareGPT file: all its "
        "human turns, at most this many when given).",
    ),
    turn_delay: str = typer.Option(
        "0s",
        "--turn-delay",
        help="With --multi-turn: the pause between a reply and the next turn (a user "
        "reading), e.g. 1s, 500ms; the slot stays the conversation's meanwhile.",
    ),
    warmup: str | None = typer.Option(
        None,
        "--warmup",
        help="e.g. 10s, 200r, 10s,200r (default: 10 s and 2 x level).",
        callback=comma_list,
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
    precision: str = typer.Option(
        DEFAULT_PRECISION,
        "--precision",
        help="Precision target: repeat each level until the 95% interval half-width of its "
        "output tok/s and TPOT p50 is at most that share of the mean, up to "
        "--max-repetitions; a level that does not get there is marked imprecise. 'off' "
        "runs exactly --repetitions (recorded either way).",
    ),
    max_repetitions: int | None = typer.Option(
        None,
        "--max-repetitions",
        help="With --precision: the most repetitions of a level (default 10).",
    ),
    order: str = typer.Option("shuffled", "--order", help="shuffled or ascending."),
    seed: int = typer.Option(
        0, "--seed", help="Seed of prompts, arrivals and order (0 or more).", callback=seed_number
    ),
    slo: str | None = typer.Option(
        None, "--slo", help="Goodput SLOs, e.g. ttft=500ms,tpot=50ms", callback=comma_list
    ),
    api: str = typer.Option("completions", "--api", help="completions or chat."),
    dataset: Path | None = typer.Option(
        None,
        "--dataset",
        help="Prompts or a trace from a file instead of random prompts (format: "
        "--dataset-format). A trace with timestamps (mooncake, azure, burstgpt) and no "
        "--concurrency or --rate is replayed on its own clock: each request leaves at its "
        "offset from the first, whatever is in flight; its window is the whole trace. "
        "Example: --dataset mooncake_trace.jsonl --replay-speed 2 --tokenizer MODEL_DIR. "
        "builtin:spec-text is text shipped with servebook whose replies repeat their "
        "prompts (speculation has tokens to accept).",
        callback=dataset_file,
    ),
    dataset_format: str | None = typer.Option(
        None,
        "--dataset-format",
        help='jsonl ({"prompt", "output_len"} a line), sharegpt (JSON array of '
        "{id, conversations: [{from, value}]}; the first human turn is the prompt), "
        "mooncake (JSONL {timestamp ms, input_length, output_length, hash_ids}: 512-token "
        "blocks, shared ids give shared prefixes), azure (CSV TIMESTAMP,ContextTokens,"
        "GeneratedTokens) or burstgpt (CSV Timestamp s, Request tokens, Response tokens; "
        "failed rows skipped). Default: detected from the content. Lengths-only traces get "
        "prompts of exactly their lengths as the server counts them. Example: "
        "--dataset-format azure",
    ),
    replay_speed: float = typer.Option(
        1.0,
        "--replay-speed",
        help="A replayed trace's clock speed: 2 sends it twice as fast, 0.5 at half speed "
        "(recorded). Example: --replay-speed 2",
    ),
    max_schedule_lag_ms: float = typer.Option(
        50.0,
        "--max-schedule-lag-ms",
        help="A replay whose requests leave later than the trace says by more than this "
        "(p99) is invalid (SB411).",
    ),
    agents: int | None = typer.Option(
        None,
        "--agents",
        help="Load agents: processes of their own, each with its share of every point, "
        "started together at one instant by a coordinator that merges their raw records "
        "(default: one per 256 streams, at most the cores; 1 runs the load in this "
        "process). Recorded in the results.",
    ),
    workers: int | None = typer.Option(
        None, "--workers", hidden=True, help="The older name of --agents."
    ),
    request_timeout: float = typer.Option(
        600.0, "--request-timeout", help="Per request, s.", callback=seconds
    ),
    stall: str = typer.Option(
        "120s",
        "--stall",
        help="A point in which no request succeeds for this long (a target that stopped "
        "answering) ends the sweep, exit 1, the points so far kept (e.g. 30s, 2m).",
    ),
    max_client_lag_ms: float = typer.Option(
        10.0,
        "--max-client-lag-ms",
        help="Open loop: a point whose requests go out later than their schedule by more "
        "than this (p99) is invalid. Closed loop is judged by achieved concurrency; its "
        "send lag is reported.",
    ),
    min_achieved_concurrency: float = typer.Option(
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
    via: str | None = typer.Option(
        None,
        "--via",
        help="How the load reaches a Kubernetes deployment: cluster (the default: load "
        "agents in a Job next to the engines, to the entry Service's cluster address) or "
        "port-forward (from this machine through a forward to each role's Pod; the "
        "latencies include the forward, and the results and the report say so). Recorded "
        "as the route in the results.",
    ),
    load_image: str | None = typer.Option(
        None,
        "--load-image",
        help="On Kubernetes, in the cluster: the image the load agents run in (default: "
        "the deployment's engine image; any with Python 3.11+, numpy and pydantic).",
    ),
    load_start_timeout: float = typer.Option(
        600.0,
        "--load-start-timeout",
        callback=seconds,
        help="On Kubernetes, in the cluster: seconds for every load agent's Pod to be "
        "running (its image pulled); past it the bench ends with the scheduler's or the "
        "kubelet's reasons.",
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="On Kubernetes: write the in-cluster load's objects (the Job, its ConfigMap, "
        "Secret and Service) to -o DIR, schema-checked and lint-clean, and apply nothing.",
    ),
    save_requests: bool = typer.Option(
        False,
        "--save-requests",
        help="Keep every request's record (agent, sent, first token, each chunk's arrival, "
        "tokens, status) beside results.json, one DIR/requests/LEVEL-repR.jsonl.gz per "
        "point; report and compare read only results.json.",
    ),
    out_dir: Path = typer.Option(..., "-o", "--output", help="Directory for results.json."),
    resume: bool = typer.Option(False, "--resume", help="Continue DIR/results.json."),
    api_key: str | None = ApiKeyOpt,
    backend: str | None = PlaceOpt,
    namespace: str | None = NamespaceOpt,
    kubeconfig: str | None = KubeconfigOpt,
) -> None:
    options = dict(locals())  # the parameters, before any other name is bound
    # --rate alone runs open loop only; servebook's own deployments always need server counters.
    # Neither --concurrency nor --rate: 1,4,16, or a trace's replay (sweep.settings_from).
    options["require_server_evidence"] = require_server_evidence or url is None
    if agents is not None and workers is not None and agents != workers:
        raise UsageError(f"--agents {agents} and --workers {workers}: give one (they are one)")
    if via is not None and via not in ("port-forward", "cluster"):
        raise UsageError(f"--via {via!r}: choose cluster or port-forward")
    if via is not None and url is not None:
        raise UsageError(f"--via {via} is for a Kubernetes deployment; --url is reached directly")
    if load_image is not None and (url is not None or via == "port-forward"):
        raise UsageError(
            "--load-image names the image of in-cluster load agents; with --url or --via "
            "port-forward the load runs on this machine"
        )
    if dry_run and (url is not None or via == "port-forward"):
        raise UsageError(
            "--dry-run writes the in-cluster load of a Kubernetes deployment; it has none "
            "with --url or --via port-forward"
        )
    n_agents = agents if agents is not None else workers
    if n_agents is not None and n_agents < 1:
        raise UsageError(f"--agents {n_agents}: give at least 1 (1: the load in this process)")
    a = _bench_args(options)
    key = auth.resolve(api_key)
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
        results, path = run_bench(subject, a, out_dir, resume=resume, tokenizer=tokenizer)
    else:
        owner, name = registry.locate(
            deployment,
            "Start one with `servebook up RECIPE`, or benchmark a running server with "
            "--url URL --model NAME.",
            backend=backend,
        )
        site = owner.load_site(name, namespace)
        if via != "port-forward" and not site.here:
            from servebook.backends.kubernetes import job_site

            source = job_site.source_of(site)
            _in_cluster(source, a, out_dir, n_agents or 1, load_image, dry_run, key, options)
            return
        if dry_run or via == "cluster" or load_image is not None:
            flag = "--dry-run" if dry_run else "--via cluster" if via else "--load-image"
            raise UsageError(
                f"{flag}: deployment {name} is not on Kubernetes ({owner.title}); only a "
                "Kubernetes deployment (servebook's own or attached) has an in-cluster load"
            )
        with owner.open(name, namespace) as view:
            if via is not None and view.route == "direct":
                raise UsageError(
                    f"--via port-forward: deployment {name} runs on the {view.backend} backend, "
                    "whose servers are reached directly"
                )
            subject = tgt.from_deployment(
                view, api=api, request_timeout_s=request_timeout, api_key=key
            )
            results, path = run_bench(
                subject,
                a,
                out_dir,
                resume=resume,
                tokenizer=tokenizer,
                alive=view.dead_roles,
                serving=not_serving(view),
            )
    print_points(results, path)
    if not all(p.valid for p in results.points):
        raise typer.Exit(1)


def _in_cluster(
    source: Source,
    a: BenchArgs,
    out_dir: Path,
    agents: int,
    image: str | None,
    dry_run: bool,
    key: str | None,
    options: dict[str, Any],
) -> None:
    """The default on Kubernetes: the load agents run in the cluster
    (``backends/kubernetes/job_site``)."""
    from servebook.backends.kubernetes import job_site
    from servebook.commands.render import refuse_what_lint_fails, write_atomically
    from servebook.console import err

    job_site.refuse_unsupported(a, tokenizer=options["tokenizer"], resume=options["resume"])
    # A key given here travels in the Job's Secret; a dry run writes none into its files.
    given = None if key is None else "" if dry_run else key
    prepared = job_site.prepare(source, a, agents=agents, image=image, api_key=given)
    if dry_run:
        files = job_site.dry_run_files(prepared)
        refuse_what_lint_fails(files)
        write_atomically(out_dir, files, check=job_site.check_dry_run_dir)
        for f in files:
            print(out_dir / f)
        return

    def say(line: str) -> None:
        err.print(line, highlight=False, markup=False)

    results, path = job_site.run_in_cluster(
        source, prepared, out_dir, say=say, start_s=options["load_start_timeout"]
    )
    print_points(results, path)
    if not all(p.valid for p in results.points):
        raise typer.Exit(1)
