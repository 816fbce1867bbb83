"""What an experiment's ``load:`` runs every arm's bench with: each setting that applies,
its value, and whether the file gave it or it is bench's default (``steps.bench_args``
takes bench's defaults, the precision target included, for every key the file leaves
out).  The plan (`servebook experiment --dry-run`, as text and as JSON) prints them all,
how long a window may stretch included: a window lasts at least ``duration`` and until
``min-requests`` of the requests it scheduled finished (10 x the level unless given), up
to the point's deadline, so on a slow server it runs far past ``duration`` (seen: 13-51 s
windows for ``duration: 8s``)."""

from __future__ import annotations

from typing import Any

from servebook.bench.protocol import ProtocolSettings
from servebook.bench.sweep import BenchArgs, settings_from
from servebook.experiment.spec import Experiment

FILE = "file"
DEFAULT = "bench's default"
DERIVED = "duration, min-requests and warmup"


def _s(x: float) -> str:
    return f"{x:g} s"


def rows(exp: Experiment) -> list[dict[str, str]]:
    """``{key, value, from}`` for every setting of the load that applies to this
    experiment (the keys of ``load:``, and ``window``: what the window's bounds make of
    it), in the order a person reads a sweep."""
    from servebook.experiment.steps import bench_args

    a = bench_args(exp, next((x for x in exp.arms if x.kind != "url"), exp.arms[0]))
    s = settings_from(a, None)
    given = set(exp.load)
    out: list[dict[str, str]] = []

    def row(key: str, value: str) -> None:
        out.append({"key": key, "value": value, "from": FILE if key in given else DEFAULT})

    if s.concurrencies:
        row("concurrency", ",".join(str(c) for c in s.concurrencies))
    if s.rates:
        row("rate", ",".join(f"{r:g}" for r in s.rates) + " req/s")
    row("repetitions", _repetitions(s))
    row("precision", _precision(s))
    if s.precision is not None:
        row("max-repetitions", str(s.repetition_cap))
    row("warmup", _per_level(s, lambda lv: _warmup(s, lv)) if "warmup" not in given else _warm(a))
    row("duration", _s(s.duration_s))
    row("min-requests", _per_level(s, lambda lv: str(s.min_requests_for(lv))) + _unless(s))
    out.append({"key": "window", "value": _window(s), "from": DERIVED})
    row("stall", f"{_s(s.stall_s)} with no successful request stops the point and the sweep")
    out += _workload(exp, a)
    row(
        "max-client-lag-ms",
        f"{a.max_client_lag_ms:g} (p99 send and loop lag; a point past it is invalid)",
    )
    row(
        "min-achieved-concurrency",
        f"{a.min_achieved_concurrency:g} (of the level; a point below it is invalid)",
    )
    row("request-timeout", _s(a.request_timeout))
    row("seed", f"{a.seed}" if "seed" in given else f"from the experiment's seed ({exp.seed})")
    row("require-server-evidence", _evidence(exp))
    row("agents", str(a.agents or 1))
    return out


def _repetitions(s: ProtocolSettings) -> str:
    if s.precision is None:
        return f"{s.repetitions} per level, exactly"
    return f"{s.min_repetitions} per level at least (the precision target may add more)"


def _precision(s: ProtocolSettings) -> str:
    if s.precision is None:
        return "off: every level runs exactly its repetitions"
    cap = s.repetition_cap
    return (
        f"{100 * s.precision:g}%: a level is repeated until the 95% interval of its output "
        f"tok/s and TPOT p50 is within ±{100 * s.precision:g}% of the mean, at most {cap} "
        "repetitions, else it is marked imprecise"
    )


def _per_level(s: ProtocolSettings, text: Any) -> str:
    return ", ".join(f"{lv.label()}: {text(lv)}" for lv in s.levels())


def _warmup(s: ProtocolSettings, lv: Any) -> str:
    w = s.warmup_for(lv)
    return f"{_s(w.duration_s or 0)} and {w.requests or 0} requests"


def _warm(a: BenchArgs) -> str:
    return f"{a.warmup} (discarded; the window opens once every bound is met)"


def _unless(s: ProtocolSettings) -> str:
    return "" if s.min_requests is not None else " (10 x the level)"


def _window(s: ProtocolSettings) -> str:
    """How long a window lasts, and how long it may stretch."""
    deadline = _per_level(s, lambda lv: _s(s.deadline_for(lv)))
    return (
        f"at least {_s(s.duration_s)} and until its minimum of requests finished, however "
        f"long that takes on a slow server, up to the point's deadline (warm-up and window, "
        f"max(600 s, 10 x (warm-up + duration))): {deadline}"
    )


def _workload(exp: Experiment, a: BenchArgs) -> list[dict[str, str]]:
    given = set(exp.load)

    def row(key: str, value: str) -> dict[str, str]:
        return {"key": key, "value": value, "from": FILE if key in given else DEFAULT}

    out = []
    if a.dataset is not None:
        out.append(row("dataset", f"prompts from {exp.load['dataset']}"))
    else:
        out += [
            row("input-len", f"{a.input_len} tokens"),
            row("output-len", f"{a.output_len} tokens"),
        ]
    out.append(row("api", a.api))
    if a.dataset is None:
        out.append(row("prompt-format", a.prompt_format))
    tok = exp.load.get("tokenizer")
    out.append(
        row(
            "tokenizer",
            str(tok) if tok else "the deployment's model directory, else the server's /tokenize",
        )
    )
    from servebook.backends import registry

    recipes = [x for x in exp.arms if x.kind == "recipe"]
    if any(not registry.get(x.backend).loads_here for x in recipes) or any(
        x.namespace for x in exp.arms
    ):  # a load that runs in the cluster
        image = exp.load.get("load-image") or "the engine's image"
        out.append(row("load-image", str(image)))
        out.append(row("load-start-timeout", str(exp.load.get("load-start-timeout", "600s"))))
    return out


def _evidence(exp: Experiment) -> str:
    if "require-server-evidence" in exp.load:
        return str(exp.load["require-server-evidence"]).lower()
    kinds = {a.kind for a in exp.arms}
    if kinds == {"url"}:
        return "false (URL arms)"
    if "url" in kinds:
        return "true for recipe and deployment arms, false for URL arms"
    return "true"
