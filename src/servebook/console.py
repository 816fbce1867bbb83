"""What a person reads on the terminal: the two consoles, and the tables that both a
command and the main job (``servebook.pipeline``) print.

``out`` (stdout) carries results: tables, verdicts, paths written.  ``err`` (stderr)
carries progress and errors, so ``--json`` on stdout stays one document.  Every message
that quotes a server, a log line or a URL is redacted before it is printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from servebook import redact
from servebook.findings import Finding
from servebook.results.schema import Results
from servebook.verify.smoke import Report

out = Console()
err = Console(stderr=True)


# --- a sweep's points (bench) ---------------------------------------------------------------


def number(x: float | None, digits: int = 1) -> str:
    """A figure for a table: ``-`` when it was not measured."""
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
            number(p.output_tokens_per_s),
            number(p.requests_per_s, 2),
            number(p.ttft_ms.p50),
            number(p.tpot_ms.p50, 2),
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


# --- a verify report ------------------------------------------------------------------------

_STYLE = {
    "pass": "green",
    "info": "cyan",
    "warn": "yellow",
    "fail": "bold red",
    "error": "bold magenta",
}


def _share(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{100 * v:.1f}%" if 0 <= v <= 1 else f"{v:.2f}"
    return str(v)


def _measured(f: Finding) -> tuple[str, str]:
    ev = f.evidence
    if "share" in ev:
        return _share(ev["share"]), _share(ev.get("threshold"))
    if "acceptance_rate" in ev:
        return f"acceptance {_share(ev['acceptance_rate'])}", "> 0 drafts"
    if "seconds" in ev:
        return f"{ev['seconds']:.2f} s", ""
    if "preemptions" in ev and ev.get("preemptions") is not None:
        return f"preemptions {ev['preemptions']:.0f}", "0 errors/aborts"
    return "", ""


def print_report(rep: Report, name: str) -> None:
    t = Table(title=f"servebook verify {name}")
    for col in ("check", "role", "verdict", "measured", "threshold", "message"):
        t.add_column(col, overflow="fold")
    for f in rep.findings:
        measured, threshold = _measured(f)
        msg = escape(redact.text(f.message))
        if f.failed and f.hint:
            msg += f"\n[dim]fix: {escape(f.hint)}[/]"
        t.add_row(
            f.check,
            f.subject,
            f"[{_STYLE[f.severity.value]}]{f.severity.value}[/]",
            measured,
            threshold,
            msg,
        )
    out.print(t)
    n_fail = sum(1 for f in rep.findings if f.failed)
    verdict = "[green]PASS[/]" if n_fail == 0 else f"[bold red]FAIL[/] ({n_fail} failing)"
    out.print(f"verify {name}: {verdict} in {rep.elapsed_s:.1f} s")
