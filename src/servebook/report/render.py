"""Write a report: ``report.md`` (GitHub-flavoured markdown that also reads in a
terminal: pipe tables, fenced code, image links, no HTML), a self-contained
``report.html`` (plots embedded as base64 PNG, inline CSS, no script, nothing fetched from
a network), and every plot as PNG and SVG under ``plots/``.

Every file is written atomically (temporary file in the same directory, then
``os.replace``): a reader sees the previous report or the new one, never half of one.
Nothing is written until every results file has loaded.
"""

from __future__ import annotations

import base64
import html
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from servebook import __version__
from servebook.errors import UsageError
from servebook.files import write_files
from servebook.report.comparability import differences_table
from servebook.report.plots import PlotSpec, draw, plot_specs
from servebook.report.summary import (
    ACCELERATORS_ABSENT,
    describe_protocol,
    incomplete_note,
    latency_diagnoses,
    summary,
)
from servebook.report.tables import (
    NA,
    Column,
    Run,
    Table,
    any_accelerators,
    fmt_interval,
    fmt_num,
    invalid_table,
    latency_table,
    levels,
    load_runs,
    provenance_table,
    runs_table,
    throughput_table,
    validity_table,
)
from servebook.results import stats
from servebook.results.schema import Latency

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
PLOTS_DIR = "plots"

METHODS = [
    "Figures come from results files only; each load level's figure is the mean over its "
    "valid repetitions with a 95% confidence interval (Student t over per-repetition "
    "values; no interval with fewer than two).",
    "Latency percentiles use numpy's linear method over the requests scheduled and "
    "finished inside each repetition's measurement window (steady state).",
    "A point is valid only if every SB4xx check passed (window length, request count, "
    "error rate, client lag and CPU, server evidence, PD handoff, output length). Invalid "
    "points are listed with their reasons and excluded from every figure, line and ratio.",
    "Per-accelerator figures divide by the accelerators the deployment uses (not the "
    "host's); n/a where that count is unknown.",
    "Server evidence (PD handoff share, speculative acceptance, preemptions) comes from "
    "each role's Prometheus counters read before and after each window.",
]


@dataclass(frozen=True)
class RoleCommand:
    role: str
    command: str
    env: list[str]


@dataclass
class ProvenanceSection:
    run: Run
    table: Table
    roles: list[RoleCommand]
    plan: str = ""  # the protocol as settings (``summary.describe_protocol``)


@dataclass
class Report:
    """Everything a report shows, as plain data; ``to_markdown`` and ``to_html`` lay it
    out, so both say the same thing."""

    runs: list[Run]
    runs_table: Table
    throughput: Table
    latency: Table
    validity: Table
    invalid: Table
    differences: Table | None
    provenance: list[ProvenanceSection]
    plots: list[PlotSpec] = field(default_factory=list)
    summary: str = ""  # the opening paragraph (``summary.summary``)
    server_latency: Table | None = None  # only when the results carry the diagnosis
    turns: Table | None = None  # only for conversations (``turns_table``)
    notes: list[str] = field(default_factory=list)  # said once, under the summary

    @property
    def tables(self) -> list[Table]:
        """Every table the report shows (the headless-browser test checks each)."""
        out = [self.runs_table, self.throughput, self.latency]
        if self.server_latency is not None and self.server_latency.rows:
            out.append(self.server_latency)
        if self.turns is not None:
            out.append(self.turns)
        out.append(self.validity)
        if self.invalid.rows:
            out.append(self.invalid)
        if self.differences is not None and self.differences.rows:
            out.append(self.differences)
        out += [s.table for s in self.provenance]
        return out

    def plot(self, prefix: str) -> list[PlotSpec]:
        return [p for p in self.plots if p.id == prefix or p.id.startswith(prefix + "-")]


def server_latency_table(runs: Sequence[Run]) -> Table | None:
    """The client's per-token latency beside the engine's own histograms, per point, with
    the likely cause where they differ; ``None`` when no point records it."""
    rows = []
    for run in runs:
        for level, rep, d in latency_diagnoses(run):
            bucket = d.get("server_itl_ms_p50_bucket")
            b = ""
            if isinstance(bucket, list) and len(bucket) == 2:
                hi = fmt_num(bucket[1]) if bucket[1] is not None else "inf"
                b = f" ({fmt_num(bucket[0])}-{hi})"
            agrees = d.get("agrees")
            rows.append(
                [
                    run.label,
                    level,
                    str(rep),
                    fmt_num(d.get("client_tpot_ms_mean")),
                    fmt_num(d.get("server_tpot_ms_mean")),
                    fmt_num(d.get("client_itl_ms_p50")),
                    fmt_num(d.get("server_itl_ms_p50")) + b,
                    NA if agrees is None else ("agree" if agrees else str(d.get("cause"))),
                ]
            )
    if not rows:
        return None
    return Table(
        "server-latency",
        "Client vs server per-token latency (ms)",
        [
            Column("Run"),
            Column("Load"),
            Column("Repetition", True),
            Column("Client TPOT mean", True),
            Column("Server TPOT mean", True),
            Column("Client ITL p50", True),
            Column("Server ITL p50 (bucket)", True),
            Column("Verdict"),
        ],
        rows,
        note="Server figures come from the engine's histograms read at both window edges: "
        "means exact (sum/count), percentiles estimated inside the bucket shown. Where the "
        "client and the server disagree the verdict names the likely cause "
        "(coalesced_streaming, burst_delivery, saturated_client, unexplained).",
    )


def turns_table(runs: Sequence[Run]) -> Table | None:
    """TTFT per conversation turn, per load level: the mean over the level's valid
    repetitions of each turn's p50 and p99 (``Point.ttft_ms_by_turn``); a later turn's
    prompt holds the conversation so far, which the prefix cache may hold.  ``None``
    when no run is of conversations."""
    rows = []
    for run in runs:
        for lv in levels(run):
            by: dict[str, list[Latency]] = {}
            for p in lv.valid:
                for turn, lat in (p.ttft_ms_by_turn or {}).items():
                    by.setdefault(turn, []).append(lat)
            for turn, lats in sorted(by.items(), key=lambda kv: int(kv[0])):
                rows.append(
                    [
                        run.label,
                        lv.label,
                        turn,
                        fmt_interval(stats.mean_ci(x.p50 for x in lats)),
                        fmt_interval(stats.mean_ci(x.p99 for x in lats)),
                        str(sum(x.n for x in lats)),
                    ]
                )
    if not rows:
        return None
    return Table(
        "turns",
        "TTFT per conversation turn (ms)",
        [
            Column("Run"),
            Column("Load"),
            Column("Turn", True),
            Column("TTFT p50", True),
            Column("TTFT p99", True),
            Column("Requests", True),
        ],
        rows,
        note="Mean ± 95% CI half-width over the level's valid repetitions of each turn's "
        "percentile. Turn 1 is a conversation's first request; each later turn carries the "
        "conversation so far, including the server's replies.",
    )


def build_report(runs: Sequence[Run]) -> Report:
    runs = list(runs)
    return Report(
        runs=runs,
        runs_table=runs_table(runs),
        throughput=throughput_table(runs),
        latency=latency_table(runs),
        validity=validity_table(runs),
        invalid=invalid_table(runs),
        differences=differences_table(runs),
        provenance=[
            ProvenanceSection(
                run,
                provenance_table(run, i),
                [
                    RoleCommand(
                        r.name,
                        shlex.join(r.command) if r.command else "(not recorded)",
                        [f"{k}={v}" for k, v in sorted(r.env.items())],
                    )
                    for r in run.results.provenance.roles
                ],
                describe_protocol(run.results.provenance.protocol),
            )
            for i, run in enumerate(runs)
        ],
        plots=plot_specs(runs),
        summary=summary(runs),
        server_latency=server_latency_table(runs),
        turns=turns_table(runs),
        notes=[
            *filter(
                None,
                (
                    incomplete_note(r.label, r.results.provenance.protocol, r.results.points)
                    for r in runs
                ),
            ),
            *([] if any_accelerators(runs) else [ACCELERATORS_ABSENT]),
        ],
    )


# --- markdown ------------------------------------------------------------------------------

_MD_SPECIAL = re.compile(r"([\\`*\[\]<>|])")

# An absolute path on this machine: "/" then two components or more, not inside a URL
# ("http://h/p") or a word ("4/s", "a/b"); one component is an endpoint's ("/metrics").
_MACHINE_PATH = re.compile(r"(?<![\w.:/~-])(?:/[^\s/:,;'\"()\[\]{}|<>=]+){2,}/?")


def public(s: str) -> str:
    """``s`` without this machine's paths: each absolute path is its last component after
    ``…/`` (``/root/.cache/servebook/tiny`` -> ``…/tiny``), for a page pasted where
    others read it (a pull request): the directories are this machine's, the name is
    what a reader recognises."""
    return _MACHINE_PATH.sub(lambda m: "…/" + m.group(0).rstrip("/").rsplit("/", 1)[-1], s)


def md_text(s: str) -> str:
    """Plain text for a markdown table cell or paragraph: markdown and HTML characters
    escaped, one line."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(s.split()))


def md_code(s: str) -> str:
    """An inline code span that survives any content (backticks, pipes in a table)."""
    s = " ".join(s.split())
    ticks = "`"
    while ticks in s:
        ticks += "`"
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{ticks}{pad}{s}{pad}{ticks}".replace("|", "\\|")


def md_table(t: Table) -> str:
    head = "| " + " | ".join(md_text(c.title) for c in t.columns) + " |"
    rule = "| " + " | ".join("---:" if c.numeric else "---" for c in t.columns) + " |"
    lines = [head, rule]
    for row in t.rows:
        cells = [md_code(v) if i in t.code_columns and v else md_text(v) for i, v in enumerate(row)]
        lines.append("| " + " | ".join(cells) + " |")
    out = "\n".join(lines)
    if t.note:
        out += "\n\n" + md_prose(t.note)
    return out


def md_prose(s: str) -> str:
    """A note that may quote `code` spans: text outside them is escaped."""
    parts = " ".join(s.split()).split("`")
    return "".join(
        _MD_SPECIAL.sub(r"\\\1", p) if i % 2 == 0 else md_code(p) for i, p in enumerate(parts)
    )


def _fence(text: str) -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}text\n{text}\n{ticks}"


def to_markdown(report: Report) -> str:
    out: list[str] = [
        "# servebook report",
        "",
        md_text(
            f"{len(report.runs)} run(s), from results files only; servebook {__version__}. "
            "Invalid points are listed, never plotted as measurements or averaged in."
        ),
        "",
        "## Summary",
        "",
        md_text(report.summary),
        "",
        *[line for n in report.notes for line in (md_text(n), "")],
        *[
            line
            for sec in report.provenance
            if sec.plan
            for line in (md_text(f"Plan of {sec.run.label}: {sec.plan}."), "")
        ],
        "## Runs",
        "",
        md_table(report.runs_table),
        "",
    ]

    def figures(prefix: str) -> list[str]:
        lines = []
        for p in report.plot(prefix):
            lines += [
                f"![{md_text(p.title)}]({PLOTS_DIR}/{p.id}.png)",
                "",
                md_text(p.caption) + f" (SVG: {md_code(f'{PLOTS_DIR}/{p.id}.svg')})",
                "",
            ]
        return lines

    out += ["## Throughput", "", *figures("throughput"), md_table(report.throughput), ""]
    out += ["## Latency", "", *figures("tpot"), *figures("ttft"), md_table(report.latency), ""]
    if report.server_latency is not None:
        out += [md_table(report.server_latency), ""]
    if report.turns is not None:
        out += [md_table(report.turns), ""]
    out += ["## Pareto view", "", *figures("pareto")]
    out += ["## Errors, validity and server evidence", "", md_table(report.validity), ""]
    out += ["### Invalid points", ""]
    out += [md_table(report.invalid) if report.invalid.rows else "Every point is valid.", ""]
    out += ["## Provenance", ""]
    if report.differences is not None:
        out += ["### What differs between the runs shown", ""]
        out += [
            md_table(report.differences)
            if report.differences.rows
            else md_prose(report.differences.note),
            "",
        ]
    for sec in report.provenance:
        out += [f"### {md_text(sec.table.title)}", ""]
        if sec.plan:
            out += [md_text(f"Plan: {sec.plan}."), ""]
        out += [md_table(sec.table), ""]
        for rc in sec.roles:
            out += [f"Role {md_code(rc.role)}: command line and environment", ""]
            out += [_fence("\n".join([rc.command, *rc.env])), ""]
    out += ["## How to read this report", ""]
    out += [f"- {md_text(m)}" for m in METHODS]
    return "\n".join(out).rstrip() + "\n"


# --- html ----------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;
max-width:1280px;padding:0 1.5em;color:#1b1f24}
h1{font-size:1.8em;margin-bottom:.2em}h2{border-bottom:1px solid #d0d7de;padding-bottom:.2em;
margin-top:2em}h3{margin-top:1.5em}
table{border-collapse:collapse;margin:.6em 0;font-size:13px}
th,td{border:1px solid #d0d7de;padding:4px 8px;vertical-align:top;text-align:left}
th{background:#f6f8fa}td.num,th.num{text-align:right;white-space:nowrap}
tr:nth-child(even) td{background:#fbfcfd}
td.bad{color:#b42318;font-weight:600}
code,pre{font:12px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
td code{word-break:break-all}
pre{background:#f6f8fa;padding:.7em;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eaeef2}
figcaption,.note{color:#57606a;font-size:12.5px;max-width:1000px}
""".strip()


def html_table(t: Table) -> str:
    e = html.escape
    head = "".join(
        f'<th class="num">{e(c.title)}</th>' if c.numeric else f"<th>{e(c.title)}</th>"
        for c in t.columns
    )
    body = []
    for row in t.rows:
        cells = []
        for i, v in enumerate(row):
            cls = []
            if t.columns[i].numeric:
                cls.append("num")
            if i == 3 and (
                t.id == "invalid"
                or (t.id == "validity" and "invalid" in v)
                or (t.id == "evidence" and v.startswith("INVALID"))  # an experiment's
            ):
                cls.append("bad")  # a verdict or a reason a reader must not miss
            attr = f' class="{" ".join(cls)}"' if cls else ""
            content = f"<code>{e(v)}</code>" if i in t.code_columns and v else e(v)
            cells.append(f"<td{attr}>{content}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    note = f'<p class="note">{_html_prose(t.note)}</p>' if t.note else ""
    return (
        f'<table id="table-{e(t.id)}" data-table="{e(t.id)}">'
        f"<caption hidden>{e(t.title)}</caption>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{note}"
    )


def _html_prose(s: str) -> str:
    parts = s.split("`")
    return "".join(
        html.escape(p) if i % 2 == 0 else f"<code>{html.escape(p)}</code>"
        for i, p in enumerate(parts)
    )


def html_figure(p: PlotSpec, png: bytes) -> str:
    e = html.escape
    data = base64.b64encode(png).decode("ascii")
    axis = ""
    if p.logx:
        ticks = ",".join(f"{x:g}" for x in p.xticks)
        axis = f' data-xscale="log2" data-xticks="{e(ticks)}"'
    return (
        f'<figure id="plot-{e(p.id)}" data-plot="{e(p.id)}"{axis}>'
        f'<img alt="{e(p.title)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{e(p.caption)} "
        f'(<a href="{PLOTS_DIR}/{e(p.id)}.svg">SVG</a>)</figcaption></figure>'
    )


def to_html(report: Report, pngs: dict[str, bytes]) -> str:
    e = html.escape
    parts: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>servebook report: {e(', '.join(r.label for r in report.runs))}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>servebook report</h1>",
        f"<p>{len(report.runs)} run(s), from results files only; servebook "
        f"{e(__version__)}. Invalid points are listed, never plotted as measurements or "
        "averaged in.</p>",
        '<section id="summary"><h2>Summary</h2>',
        f'<p id="summary-text">{e(report.summary)}</p>',
        *[f'<p class="note">{e(n)}</p>' for n in report.notes],
        *[
            f'<p class="plan">Plan of {e(sec.run.label)}: {e(sec.plan)}.</p>'
            for sec in report.provenance
            if sec.plan
        ],
        "</section>",
        '<section id="runs"><h2>Runs</h2>',
        html_table(report.runs_table),
        "</section>",
    ]

    def figures(prefix: str) -> str:
        return "".join(html_figure(p, pngs[p.id]) for p in report.plot(prefix))

    parts += [
        '<section id="throughput"><h2>Throughput</h2>',
        figures("throughput"),
        html_table(report.throughput),
        "</section>",
        '<section id="latency"><h2>Latency</h2>',
        figures("tpot"),
        figures("ttft"),
        html_table(report.latency),
        html_table(report.server_latency) if report.server_latency is not None else "",
        html_table(report.turns) if report.turns is not None else "",
        "</section>",
        '<section id="pareto"><h2>Pareto view</h2>',
        figures("pareto"),
        "</section>",
        '<section id="validity"><h2>Errors, validity and server evidence</h2>',
        html_table(report.validity),
        "<h3>Invalid points</h3>",
        html_table(report.invalid) if report.invalid.rows else "<p>Every point is valid.</p>",
        "</section>",
        '<section id="provenance"><h2>Provenance</h2>',
    ]
    if report.differences is not None:
        parts.append("<h3>What differs between the runs shown</h3>")
        parts.append(
            html_table(report.differences)
            if report.differences.rows
            else f"<p>{_html_prose(report.differences.note)}</p>"
        )
    for sec in report.provenance:
        parts.append(f"<h3>{e(sec.table.title)}</h3>")
        if sec.plan:
            parts.append(f'<p class="plan">Plan: {e(sec.plan)}.</p>')
        parts.append(html_table(sec.table))
        for rc in sec.roles:
            parts.append(f"<p>Role <code>{e(rc.role)}</code>: command line and environment</p>")
            parts.append(f"<pre>{e(chr(10).join([rc.command, *rc.env]))}</pre>")
    parts += ["</section>", '<section id="methods"><h2>How to read this report</h2><ul>']
    parts += [f"<li>{e(m)}</li>" for m in METHODS]
    parts += ["</ul></section>", "</body></html>"]
    return "\n".join(parts) + "\n"


# --- files ---------------------------------------------------------------------------------


def output_paths(out: Path) -> tuple[Path, str]:
    """``-o DIR`` or ``-o FILE.html`` -> (directory, html file name)."""
    if out.suffix.lower() in (".html", ".htm"):
        return out.parent, out.name
    return out, REPORT_HTML


def write_report(result_dirs: list[Path], out_dir: Path, html_name: str = REPORT_HTML) -> Path:
    """Load every results file, then write ``report.md``, ``report.html`` and the plots
    into ``out_dir``; returns the html report's path.  Bad input raises ``UsageError``
    (exit 2) naming the file, before anything is written."""
    runs = load_runs(result_dirs)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"-o {out_dir}: exists and is not a directory")
    report = build_report(runs)
    pngs: dict[str, bytes] = {}
    files: dict[str, str | bytes] = {}
    for spec in report.plots:
        png, svg = draw(spec)
        pngs[spec.id] = png
        files[f"{PLOTS_DIR}/{spec.id}.png"] = png
        files[f"{PLOTS_DIR}/{spec.id}.svg"] = svg
    files[Path(html_name).with_suffix(".md").name] = to_markdown(report)
    files[html_name] = to_html(report, pngs)
    write_files(out_dir, files)  # all of them or none: never plots without their report
    return out_dir / html_name
