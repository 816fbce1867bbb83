"""What a person reads on the terminal: the two consoles, and the tables that both a
command and the main job (``servebook.pipeline``) print.

``out`` (stdout) carries results: tables, verdicts, paths written.  ``err`` (stderr)
carries progress and errors, so ``--json`` on stdout stays one document.  Both consoles
redact everything they print (``servebook.redact``): every string and text, every cell of
a table (subject and hint columns too), each before it is wrapped, so that no call site
has to remember to and a folded cell cannot split a secret past the redactor.

Both consoles print text as it is: no Rich markup, no emoji codes (``:100:``), no
highlighting, since what they print quotes files, servers and messages.  Style written by
servebook itself goes through ``styled`` (its values escaped with ``escape``).  Without a
terminal (a pipe, CI) nothing is cut: a table is as wide as its longest path or message,
whatever width the environment claims.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleDimensions, ConsoleOptions, RenderableType
from rich.markup import escape
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from servebook import redact
from servebook.findings import Finding, Severity

if TYPE_CHECKING:  # the tables' inputs; every command imports this module, few print them
    from servebook.results.schema import Point, Results
    from servebook.verify.smoke import Report

# The width of a console that is not a terminal: wider than any line servebook prints, so
# that no column is cut or folded in a pipe.
UNCUT = 100_000


class _Console(Console):
    """A console that reads nothing it prints as markup or emoji, and never cuts a line
    written to something that is not a terminal."""

    @property
    def size(self) -> ConsoleDimensions:
        isatty = getattr(self.file, "isatty", None)
        try:
            terminal = bool(isatty and isatty())
        except ValueError:  # a closed stream
            terminal = False
        size = super().size
        # Not ``self._width``: Rich sets it from $COLUMNS, which CI may set with no reader.
        return size if terminal else ConsoleDimensions(UNCUT, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        # Rich renders every nested renderable (a table's cells, a progress bar's columns)
        # through here, before the text is wrapped into lines.
        return super().render(redacted(renderable), options)


def redacted(renderable: RenderableType) -> RenderableType:
    """``renderable`` with secrets replaced when it is text (``servebook.redact.text``);
    another renderable is redacted as Rich renders its parts."""
    if isinstance(renderable, str):
        return redact.text(renderable)
    if not isinstance(renderable, Text):
        return renderable
    plain = renderable.plain
    if redact.text(plain) == plain:
        return renderable
    # Redact each run of one style, so that the styles stay; a secret that crosses a
    # change of style is caught on the whole text, which is then printed unstyled.
    cuts = sorted({x for span in renderable.spans for x in (span.start, span.end)})
    out = renderable.blank_copy()
    for part in renderable.divide(cuts):
        piece = Text(redact.text(part.plain), style=part.style)
        for span in part.spans:
            piece.stylize(span.style)
        out.append_text(piece)
    if redact.text(out.plain) != out.plain:
        out = renderable.blank_copy(redact.text(plain))
    return out


def _console(stderr: bool = False) -> Console:
    return _Console(stderr=stderr, markup=False, emoji=False, highlight=False)


out = _console()
err = _console(stderr=True)


def styled(markup: str) -> Text:
    """Markup that servebook wrote (``[bold]...[/]``, any value in it passed through
    ``escape``) as styled text; the consoles themselves read no markup."""
    return Text.from_markup(markup, emoji=False)


# --- a sweep's points (bench) ---------------------------------------------------------------


def number(x: float | None, digits: int = 1) -> str:
    """A figure for a table: ``-`` when it was not measured."""
    return "-" if x is None else f"{x:.{digits}f}"


def _level(concurrency: int | None, rate: float | None) -> str:
    """A load level as the bench table names it: ``c=4`` or ``rate=2.5``."""
    return f"c={concurrency}" if concurrency is not None else f"rate={rate:g}"


def print_points(results: Results, path: Path) -> None:
    from servebook.results.tpot import judged

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
        "spec accept",
        "why invalid",
    ):
        t.add_column(col, overflow="fold")
    for p in sorted(results.points, key=lambda p: (p.concurrency or 0, p.rate or 0, p.repetition)):
        level = _level(p.concurrency, p.rate)
        server = p.server if isinstance(p.server, dict) else {}
        share, accept = server.get("handoff_share"), server.get("spec_acceptance")
        verdict = "[green]valid[/]" if p.valid else "[bold red]INVALID[/]"
        if p.imprecise:
            verdict += ", [yellow]imprecise[/]"
        t.add_row(
            level,
            str(p.repetition),
            styled(verdict),
            str(p.requests_ok),
            str(p.errors),
            number(p.output_tokens_per_s),
            number(p.requests_per_s, 2),
            number(p.ttft_ms.p50),
            judged(p).cell(),
            "-" if share is None else f"{100 * share:.0f}%",
            "-" if accept is None else f"{100 * accept:.0f}%",
            "; ".join(r.split(":")[0] for r in p.invalid_reasons),
        )
    out.print(t)
    from servebook.results.measurement import biasing_choices, not_a_measurement

    protocol = results.provenance.protocol
    by_level: dict[str, list[Point]] = {}
    for p in results.points:
        by_level.setdefault(_level(p.concurrency, p.rate), []).append(p)
    for level, pts in by_level.items():
        why = not_a_measurement(pts, protocol)
        if why:
            out.print(f"{level}: not a measurement: {'; '.join(why)}", markup=False)
    for choice in biasing_choices(protocol):
        out.print(f"a choice that biases these figures: {choice}", markup=False)
    for agg in results.aggregates:
        if agg.precision is not None:
            level = _level(agg.concurrency, agg.rate)
            out.print(
                f"{level}: {agg.precision.status} after {agg.precision.repetitions} "
                f"repetition(s): {agg.precision.describe()}",
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
        )


# The style of each severity, in a verify report and a table of findings alike.
_STYLE = {
    "pass": "green",
    "info": "cyan",
    "warn": "yellow",
    "fail": "bold red",
    "error": "bold magenta",
}


# --- a verify report ------------------------------------------------------------------------


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
        msg = escape(f.message)
        if f.failed and f.hint:
            msg += f"\n[dim]fix: {escape(f.hint)}[/]"
        t.add_row(
            f.check,
            f.subject,
            styled(f"[{_STYLE[f.severity.value]}]{f.severity.value}[/]"),
            measured,
            threshold,
            styled(msg),
        )
    out.print(t)
    n_fail = sum(1 for f in rep.findings if f.failed)
    verdict = "[green]PASS[/]" if n_fail == 0 else f"[bold red]FAIL[/] ({n_fail} failing)"
    out.print(styled(f"verify {escape(name)}: {verdict} in {rep.elapsed_s:.1f} s"))


# --- findings (lint, preflight, probe) --------------------------------------------------------


def print_findings(findings: Sequence[Finding], title: str = "", console: Any = None) -> None:
    """Print findings as a table for a person, on ``out`` unless told otherwise: the
    console that redacts what it prints."""
    console = console or out
    # Text cells, never markup strings: messages quote files, paths and log lines.
    table = Table(title=Text(title) if title else None, show_lines=False)
    table.add_column("check", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("subject")
    table.add_column("message")
    for f in findings:
        msg = Text(f.message)
        if f.hint:
            msg.append(f"\nfix: {f.hint}", style="dim")
        table.add_row(
            Text(f.check),
            Text(f.severity.value, style=_STYLE[f.severity.value]),
            Text(f.subject),
            msg,
        )
    console.print(table)
    n_fail = sum(1 for f in findings if f.failed)
    n_warn = sum(1 for f in findings if f.severity is Severity.WARN)
    console.print(Text(f"{len(findings)} finding(s): {n_fail} failing, {n_warn} warning(s)"))
