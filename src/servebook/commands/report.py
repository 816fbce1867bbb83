"""`servebook report DIR... [-o OUT]` and `servebook compare A B`.

Both read results files only.  ``report`` writes markdown, self-contained html and plots;
``compare`` puts B beside A with a verdict per point, after checking that the two runs
differ only in what the user says is under test (``servebook.report.comparability``).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table as RichTable
from rich.text import Text

from servebook.commands import app, print_json
from servebook.console import err, out, styled
from servebook.errors import UsageError
from servebook.files import write_files
from servebook.findings import EXIT_FAIL, EXIT_UNUSABLE
from servebook.report import compare as cmp
from servebook.report import reproduce as rep
from servebook.report.comparability import VARIABLES, check_variables
from servebook.report.render import (
    md_code,
    md_table,
    md_text,
    output_paths,
    write_report,
)
from servebook.report.tables import Table, load_runs

_VARIABLES_HELP = "\n\n".join(
    f"  {name}: {v.meaning} (allows: {', '.join(v.kinds)})" for name, v in VARIABLES.items()
)


@app.command(
    epilog="Examples:\n\n  servebook report runs/mixed runs/pd -o report/\n\n"
    "  servebook report out/exp --pair pd-spec:pd\n\n"
    "  servebook report runs/pd -o runs/pd/report.html\n\n"
    "Exit codes: 0 written; 2 a results file is missing, malformed or of another schema "
    "(nothing is written)."
)
def report(
    dirs: list[Path] = typer.Argument(
        ..., metavar="DIR...", help="Results directories (each holds a results.json)."
    ),
    output: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        help="Output directory, or the report's .html path (its directory gets report.md "
        "and plots/). Default: beside the results of one run (DIR, or the directory of "
        "DIR/results.json), ./servebook-report for several.",
    ),
    pair: list[str] = typer.Option(
        [],
        "--pair",
        metavar="ARM:OVER",
        help="On an experiment's directory: also the ratios of ARM over OVER (repeatable), "
        "e.g. --pair pd-spec:pd for speculation's own effect inside PD; the file's pairs: "
        "are always there.",
    ),
) -> None:
    """Write report.md, a self-contained report.html and PNG/SVG plots from results files.

    On an experiment's directory (DIR/experiment.json, from `servebook experiment`): the
    provenance of each arm, the load, the table of every arm x level (absolute, per
    accelerator, TTFT and TPOT p50 and p99), the ratios to the baseline and of the named
    pairs (--pair) with their 95% intervals, the crossover in words, the drift and the
    schedule; report.md has no path of this machine and pastes into a pull request.

    Per run and load level: request and output-token throughput, absolute and per
    accelerator; TTFT/ITL/TPOT p50/p99 with 95% CIs; error rate; validity (invalid points
    listed with their reasons, never plotted as measurements); server evidence (PD handoff
    share, speculative acceptance). Plots: throughput, TPOT and TTFT vs concurrency with CI
    bands, and the Pareto view. Provenance of every run and what differs between them.
    """
    from servebook.experiment import report as exp_report

    if len(dirs) == 1 and dirs[0].is_dir() and exp_report.is_experiment(dirs[0]):
        out_dir, html_name = output_paths(output or dirs[0])
        html_path = exp_report.write(dirs[0], out_dir, html_name, pair)
        out.print(f"report: {html_path}", highlight=False, soft_wrap=True)
        out.print(f"report: {html_path.with_suffix('.md')}", highlight=False, soft_wrap=True)
        return
    if pair:
        raise UsageError(
            f"--pair {pair[0]}: pairs are of an experiment's arms; {dirs[0]} is not an "
            "experiment's directory (no experiment.json)",
            hint="give the directory `servebook experiment -o DIR` wrote, or use "
            "`servebook compare A B` for two runs",
        )
    if output is None:
        # One run: beside its results (DIR, or the directory of DIR/results.json).
        one = dirs[0] if len(dirs) == 1 else None
        output = Path("servebook-report") if one is None else one if one.is_dir() else one.parent
    out_dir, html_name = output_paths(output)
    html_path = write_report(list(dirs), out_dir, html_name)
    out.print(f"report: {html_path}", highlight=False, soft_wrap=True)
    out.print(f"report: {html_path.with_suffix('.md')}", highlight=False, soft_wrap=True)


def _rich_table(t: Table) -> RichTable:
    rt = RichTable(title=t.title, show_lines=False)
    for c in t.columns:
        rt.add_column(c.title, justify="right" if c.numeric else "left", overflow="fold")
    for row in t.rows:
        cells: list[str | Text] = list(row)
        v = row[-1]
        if v in ("better", "worse"):
            cells[-1] = Text(v, style="green" if v == "better" else "bold red")
        rt.add_row(*cells)
    return rt


def compare_markdown(c: cmp.Comparison) -> str:
    lines = [f"# servebook compare: {md_text(c.b.label)} relative to {md_text(c.a.label)}", ""]
    if c.stamp:
        lines += [f"**{c.stamp}**", ""]
    lines += [f"- A: {md_code(str(c.a.path))}", f"- B: {md_code(str(c.b.path))}"]
    lines.append(
        "- Variables under test: "
        + (", ".join(f"`{v}`" for v in c.comparability.variables) or "none declared")
    )
    lines.append("")
    if c.comparability.differences:
        lines += ["## Provenance differences", ""]
        lines += [f"- {md_text(d)}" for d in cmp.differences_lines(c.comparability)]
        lines.append("")
    lines += ["## Figures", "", md_table(cmp.rows_table(c)), "", cmp.MULTIPLE_TESTS, ""]
    if c.only_a or c.only_b:
        lines.append(
            f"Levels only in A: {', '.join(c.only_a) or 'none'}; only in B: "
            f"{', '.join(c.only_b) or 'none'} (not compared)."
        )
        lines.append("")
    if c.stamp:
        lines += [f"**{c.stamp}**", ""]
    return "\n".join(lines)


@app.command(
    help="Put run B beside run A: every figure of B relative to A with a 95% CI and a "
    "verdict per point (better / worse / not distinguishable), after checking that the runs "
    "differ only in the variable under test.\n\n"
    "The test: Welch's two-sided t-test at 5% over per-repetition values of the valid "
    "repetitions; fewer than 2 valid repetitions on a side gives 'not distinguishable (too "
    "few repetitions)'. Throughput: higher is better; latency and error rate: lower is "
    "better.\n\n"
    "Provenance first: engine version, images and packages, model hash, hardware, topology, "
    "engine args, protocol, workload and seed are compared field by field. A difference "
    "not covered by a --variable makes compare refuse (exit 1) and list it; --force compares "
    'anyway and stamps every output "cross-provenance: not a like-for-like comparison".\n\n'
    f"Variables:\n\n{_VARIABLES_HELP}",
    epilog="Examples:\n\n  servebook compare runs/mixed runs/pd --variable topology\n\n"
    "  servebook compare runs/a runs/a-rerun --variable seed --json\n\n"
    "  servebook compare runs/a runs/a-rerun --reproduce --tolerance 5%\n\n"
    "Exit codes: 0 compared; 1 refused (provenance differs beyond the variables); 2 bad "
    "input.\n\n"
    "With --reproduce: 0 B reproduces A; 1 it does not, or the runs are too imprecise to "
    "tell (inconclusive); 2 bad input, no common load level, or provenance differing "
    "beyond the seed and the declared variables (B is not a re-run of A; --force checks "
    "anyway, stamped).",
)
def compare(
    a: Path = typer.Argument(..., metavar="A", help="Baseline results directory."),
    b: Path = typer.Argument(..., metavar="B", help="Results directory compared to A."),
    variable: list[str] = typer.Option(
        [],
        "--variable",
        help=f"What differs on purpose (repeatable): {', '.join(VARIABLES)}.",
    ),
    force: bool = typer.Option(
        False, "--force", help="Compare despite other provenance differences (stamped)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Also write compare.md and compare.json into this directory."
    ),
    reproduce: bool = typer.Option(
        False,
        "--reproduce",
        help="Does B (an independent re-run) reproduce A? Per common load level: median "
        "output tokens/s and TPOT p50 within --tolerance, and whether each run's 95% "
        "interval covers the other's median; one verdict (the seed may differ).",
    ),
    tolerance: str = typer.Option(
        "5%", "--tolerance", help="With --reproduce: how far B's medians may be from A's."
    ),
) -> None:
    if reproduce:
        variable = [*variable, "seed"]
    variables = check_variables(variable)
    tol = rep.parse_tolerance(tolerance) if reproduce else rep.DEFAULT_TOLERANCE
    run_a, run_b = load_runs([a, b])
    try:
        c = cmp.compare(run_a, run_b, variables, force=force)
    except cmp.Refused as r:
        if as_json:
            print_json(cmp.refusal_json(r.comparability))
        else:
            err.print(cmp.refusal_message(r.comparability))
        raise typer.Exit(EXIT_UNUSABLE if reproduce else EXIT_FAIL) from None
    if reproduce:
        _reproduce(c, tol, as_json, output)
        return
    doc = cmp.to_json(c)
    if output is not None:
        write_files(
            output,
            {"compare.md": compare_markdown(c), "compare.json": json.dumps(doc, indent=2)},
        )
    if as_json:
        print_json(doc)
        return
    if c.stamp:
        out.print(Text(c.stamp, style="bold red"), soft_wrap=True)
    for v in c.comparability.unused_variables:
        err.print(
            styled(
                f"[yellow]note:[/] --variable {escape(v)} declared, but nothing it covers differs"
            )
        )
    for line in cmp.differences_lines(c.comparability):
        out.print(line, soft_wrap=True)
    table = cmp.rows_table(c)
    out.print(_rich_table(table))
    out.print(table.note)  # the test, and where a figure is the engines' exact means
    out.print(cmp.MULTIPLE_TESTS)
    if c.only_a or c.only_b:
        out.print(
            f"levels only in A: {', '.join(c.only_a) or 'none'}; only in B: "
            f"{', '.join(c.only_b) or 'none'} (not compared)",
            highlight=False,
        )
    if c.stamp:
        out.print(Text(c.stamp, style="bold red"), soft_wrap=True)


def reproduce_markdown(r: rep.Reproduction, stamp: str | None) -> str:
    lines = [f"# servebook compare --reproduce: {md_text(r.b.label)} against {md_text(r.a.label)}"]
    lines += ["", f"**{md_text(r.sentence())}**", ""]
    if stamp:
        lines += [f"**{stamp}**", ""]
    lines += [f"- A: {md_code(str(r.a.path))}", f"- B: {md_code(str(r.b.path))}", ""]
    lines += [md_table(rep.table(r)), ""]
    if r.only_a or r.only_b:
        lines += [
            f"Levels only in A: {', '.join(r.only_a) or 'none'}; only in B: "
            f"{', '.join(r.only_b) or 'none'} (not judged).",
            "",
        ]
    return "\n".join(lines)


def _reproduce(c: cmp.Comparison, tolerance: float, as_json: bool, output: Path | None) -> None:
    r = rep.reproduce(c.a, c.b, tolerance)
    doc = rep.to_json(r, c.stamp)
    if output is not None:
        write_files(
            output,
            {
                "reproduce.md": reproduce_markdown(r, c.stamp),
                "reproduce.json": json.dumps(doc, indent=2),
            },
        )
    if as_json:
        print_json(doc)
    else:
        if c.stamp:
            out.print(Text(c.stamp, style="bold red"), soft_wrap=True)
        for line in cmp.differences_lines(c.comparability):
            out.print(line, soft_wrap=True)
        out.print(_rich_table(rep.table(r)))
        out.print(rep.RULE)
        if r.only_a or r.only_b:
            out.print(
                f"levels only in A: {', '.join(r.only_a) or 'none'}; only in B: "
                f"{', '.join(r.only_b) or 'none'} (not judged)",
                highlight=False,
            )
        color = "green" if r.reproduces else "bold red"
        out.print(Text(r.sentence(), style=color), soft_wrap=True)
    if not r.reproduces:
        raise typer.Exit(EXIT_FAIL)
