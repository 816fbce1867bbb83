"""`servebook report`: report.md is GitHub-flavoured markdown with no HTML (it must read
in a terminal and on a code-hosting site), report.html needs no network, plots are
written as PNG and SVG, every file is replaced atomically, and bad input exits 2 naming
the file before anything is written."""

from __future__ import annotations

import base64
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt
from typer.testing import CliRunner

from servebook.cli import app
from servebook.report import render
from servebook.report.render import (
    PLOTS_DIR,
    REPORT_HTML,
    REPORT_MD,
    build_report,
    output_paths,
    write_report,
)
from servebook.report.tables import load_runs
from tests.conftest import CliResult
from tests.unit.browser import PROBE, Dom, chromium
from tests.unit.result_runs import CPU, A, B, variant

RUNS = [A, B, CPU]

Cli = Callable[..., CliResult]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("report")
    assert write_report(RUNS, d) == d / REPORT_HTML
    return d


# --- markdown ------------------------------------------------------------------------------

_DELIM = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+$")


def gfm_cells(line: str) -> list[str]:
    """A table row's cells by GFM's rule: split on every pipe not escaped with a backslash
    (code spans do not protect a pipe inside a table)."""
    assert line.startswith("|") and line.endswith("|"), line
    return re.split(r"(?<!\\)\|", line[1:-1])


def gfm_tables(md: str) -> list[list[str]]:
    """Every table as its lines; fails on a pipe line that is not part of a valid table."""
    lines = md.splitlines()
    tables: list[list[str]] = []
    in_fence = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence or not line.startswith("|"):
            i += 1
            continue
        assert i == 0 or lines[i - 1] == "", f"table at line {i + 1} needs a blank line before"
        assert _DELIM.match(lines[i + 1]), f"line {i + 2}: not a delimiter row: {lines[i + 1]}"
        block = [line]
        i += 1
        while i < len(lines) and lines[i].startswith("|"):
            block.append(lines[i])
            i += 1
        tables.append(block)
    return tables


def test_markdown_has_no_html(out: Path) -> None:
    md = (out / REPORT_MD).read_text()
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    kinds = {t.type for t in tokens} | {c.type for t in tokens for c in t.children or []}
    assert "html_block" not in kinds and "html_inline" not in kinds
    # Belt and braces: no tag-like text outside code either.
    prose = re.sub(r"```.*?```", "", md, flags=re.S)
    prose = re.sub(r"(`+).*?\1", "", prose)
    assert not re.search(r"<[A-Za-z!/][^>]*>", prose)


def test_markdown_tables_are_valid_gfm_and_all_there(out: Path) -> None:
    md = (out / REPORT_MD).read_text()
    tables = gfm_tables(md)
    report = build_report(load_runs(RUNS))
    assert len(tables) == len(report.tables)
    for block, table in zip(tables, report.tables, strict=True):
        width = len(gfm_cells(block[0]))
        assert width == len(table.columns)
        assert all(len(gfm_cells(row)) == width for row in block), block[0]
        assert len(block) == 2 + len(table.rows)
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    assert sum(t.type == "table_open" for t in tokens) == len(report.tables)


def test_markdown_links_every_plot_file(out: Path) -> None:
    md = (out / REPORT_MD).read_text()
    report = build_report(load_runs(RUNS))
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert sorted(images) == sorted(f"{PLOTS_DIR}/{p.id}.png" for p in report.plots)
    for p in report.plots:
        assert (out / PLOTS_DIR / f"{p.id}.png").read_bytes().startswith(b"\x89PNG")
        assert b"<svg" in (out / PLOTS_DIR / f"{p.id}.svg").read_bytes()


def test_markdown_has_the_sections_a_reader_needs(out: Path) -> None:
    md = (out / REPORT_MD).read_text()
    for heading in [
        "## Runs",
        "## Throughput",
        "## Latency",
        "## Pareto view",
        "## Errors, validity and server evidence",
        "### Invalid points",
        "## Provenance",
        "### What differs between the runs shown",
        "## How to read this report",
    ]:
        assert f"\n{heading}\n" in md
    # Every role's command line, verbatim, in a code block.
    assert "python3 -m vllm.entrypoints.openai.api_server --model" in md
    assert "--kv-transfer-config" in md and "vllm-router --vllm-pd-disaggregation" in md
    assert "SB403: 300 of 4987 requests failed" in md


# --- html ----------------------------------------------------------------------------------


def test_html_is_self_contained(out: Path) -> None:
    html = (out / REPORT_HTML).read_text()
    assert "<script" not in html and "<link" not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert not re.search(r"url\(", html)
    imgs = re.findall(r'<img [^>]*src="([^"]+)"', html)
    report = build_report(load_runs(RUNS))
    assert len(imgs) == len(report.plots)
    for src in imgs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(b"\x89PNG")
    for t in report.tables:
        assert f'id="table-{t.id}"' in html
    for p in report.plots:
        assert f'id="plot-{p.id}"' in html


# --- files ---------------------------------------------------------------------------------


def test_no_temporary_files_are_left_and_files_are_readable(out: Path) -> None:
    names = [p.name for p in out.rglob("*")]
    assert not [n for n in names if n.endswith(".tmp")]
    assert (out / REPORT_HTML).stat().st_mode & 0o044  # not mkstemp's 0600


def test_a_failure_while_writing_leaves_the_previous_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / REPORT_HTML).write_text("previous report")

    def broken(_spec: object) -> tuple[bytes, bytes]:
        raise RuntimeError("disk full")

    monkeypatch.setattr(render, "draw", broken)
    with pytest.raises(RuntimeError):
        write_report([A], tmp_path)
    assert (tmp_path / REPORT_HTML).read_text() == "previous report"
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_output_may_name_the_html_file() -> None:
    assert output_paths(Path("out/r.html")) == (Path("out"), "r.html")
    assert output_paths(Path("out")) == (Path("out"), REPORT_HTML)


def test_report_command_writes_next_to_a_single_run_by_default(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_bytes((A / "results.json").read_bytes())
    r = CliRunner().invoke(app, ["report", str(run)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert f"report: {run / REPORT_HTML}" in r.output
    assert (run / REPORT_MD).is_file() and (run / PLOTS_DIR / "pareto.svg").is_file()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no results.json in this directory"),
        ("{not json", "not JSON (line 1)"),
        ('{"schema": "servebook.bench/0"}', "not a servebook results file"),
    ],
    ids=["missing", "malformed", "schema"],
)
def test_bad_input_exits_2_naming_the_file_and_writes_nothing(
    cli: Cli, tmp_path: Path, content: str | None, message: str
) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    if content is not None:
        (bad / "results.json").write_text(content)
    dest = tmp_path / "out"
    r = cli("report", str(A), str(bad), "-o", str(dest))
    assert r.returncode == 2, r.stderr
    assert str(bad) in r.stderr and message in r.stderr
    assert "Traceback" not in r.stderr
    assert not dest.exists()


# --- in a real browser ---------------------------------------------------------------------


def test_html_renders_in_headless_chromium_with_every_plot_and_table(
    out: Path, tmp_path: Path
) -> None:
    exe = chromium()
    # A copy with a probe that records, once the page has loaded, whether each image
    # decoded (the report itself carries no script).  Name resolution is mapped to nothing,
    # so a page that needed the network would show broken images.
    probe = out / "probe.html"
    probe.write_text((out / REPORT_HTML).read_text().replace("</body>", PROBE + "</body>"))
    try:
        r = subprocess.run(
            [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--host-resolver-rules=MAP * ~NOTFOUND",
                f"--user-data-dir={tmp_path / 'profile'}",
                "--virtual-time-budget=10000",
                "--dump-dom",
                probe.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        probe.unlink()
    assert r.returncode == 0, r.stderr[-2000:]
    dom = Dom()
    dom.feed(r.stdout)
    assert dom.body.get("data-probe") == "loaded", r.stdout[:500]
    report = build_report(load_runs(RUNS))
    assert set(dom.plots) == {p.id for p in report.plots}
    assert all(w > 0 for w in dom.plots.values()), dom.plots
    for t in report.tables:
        assert dom.tables.get(t.id) == len(t.rows), t.id
    # Concurrency plots on a log2 axis ticked at the measured levels only (A and B: 1, 4,
    # 16; the CPU run: 1, 2); the rate plots and the Pareto view are not.
    for id in ("throughput", "tpot", "ttft"):
        assert dom.figures[id].get("data-xscale") == "log2", id
        assert dom.figures[id].get("data-xticks") == "1,2,4,16", id
    assert "data-xscale" not in dom.figures["pareto"]
    # The summary paragraph, first on the page, as the browser shows it: the CPU run's
    # engine, packages and model are not the GPU runs', and it says so first.
    assert dom.summary == report.summary
    assert dom.summary.startswith("Warning: these runs differ in engine versions")
    assert "vllm-mixed: best valid point c=16: 1,200 ± 75 output tok/s" in dom.summary
    assert "vllm-pd: best valid point c=16: 1,520 ± 254 output tok/s" in dom.summary
    assert "1 invalid point, excluded: c=16 rep 2 (SB403)" in dom.summary
    assert r.stdout.index('id="summary"') < r.stdout.index('id="runs"')


# --- reading at a glance -------------------------------------------------------------------


def test_summary_names_where_latency_breaks_the_slo(tmp_path: Path) -> None:
    def slo(doc: dict[str, Any]) -> None:
        for p in doc["points"]:
            p["goodput"] = {"slo_ms": {"ttft": 200.0}, "requests_per_s": 1.0, "fraction": 0.9}

    d = variant(tmp_path, A, "slo", slo)
    report = build_report(load_runs([d]))
    # A's TTFT p99 is 2 x p50: 80, 110, 240 ms at c=1, 4, 16 (means over repetitions).
    assert "latency breaks the SLO at c=16 (TTFT p99 240.0 ms > 200 ms)" in report.summary
    md = render.to_markdown(report)
    assert "latency breaks the SLO at c=16" in md.split("## Runs")[0]


def test_summary_lists_imprecise_levels_when_the_results_say_so(tmp_path: Path) -> None:
    def imprecise(doc: dict[str, Any]) -> None:
        for p in doc["points"]:
            if p["concurrency"] == 4:
                p["imprecise"] = True

    d = variant(tmp_path, A, "imprecise", imprecise)
    assert "imprecise (interval wider than the precision target) at c=4" in (
        build_report(load_runs([d])).summary
    )
    assert "imprecise" not in build_report(load_runs([A])).summary


def test_per_accelerator_columns_are_absent_when_no_count_is_known_and_it_is_said_once() -> None:
    cpu = build_report(load_runs([CPU]))
    assert [c.title for c in cpu.throughput.columns] == [
        "Run",
        "Load",
        "Valid reps",
        "Requests/s",
        "Output tok/s",
    ]
    assert "Accelerators used" not in [c.title for c in cpu.runs_table.columns]
    md = render.to_markdown(cpu)
    assert md.count(render.ACCELERATORS_ABSENT) == 1
    mixed = build_report(load_runs([A, CPU]))
    assert "Output tok/s per accelerator" in [c.title for c in mixed.throughput.columns]
    assert render.ACCELERATORS_ABSENT not in render.to_markdown(mixed)


def test_the_plan_reads_as_settings_not_a_repr(out: Path) -> None:
    md = (out / REPORT_MD).read_text()
    assert (
        "Plan of tiny-pd-spec: c=1,2 and rate=0.5/s; 2 repetitions, shuffled; 30 s windows "
        "after the default warm-up (at least 10 s and 2 x the level in requests); seed 0."
    ) in md
    assert "Settings(" not in md and "BenchArgs(" not in md
    # Nested settings as key=value, not JSON.
    assert "max\\_error\\_rate=0.01" in md or "max_error_rate=0.01" in md
    assert '{"max_error_rate"' not in md


def test_client_and_server_latency_are_shown_side_by_side_when_recorded(tmp_path: Path) -> None:
    from servebook.engines.vllm import H
    from servebook.metrics.histogram import diagnose_client_latency, latency_windows
    from servebook.metrics.scrape import snapshot_from_text

    fix = Path(__file__).parent / "fixtures" / "metrics"
    before, after = (
        snapshot_from_text((fix / f"vllm-0.32.0-cpu-pd-failopen-decode-{s}.prom").read_text())
        for s in ("before", "after")
    )
    ws = latency_windows(before, after, {"itl": H.ITL, "tpot": H.TPOT})
    diag = diagnose_client_latency(
        client_tpot_ms=36.0, client_itl_ms=0.0, server_tpot=ws["tpot"], server_itl=ws["itl"]
    ).to_dict()

    def record(doc: dict[str, Any]) -> None:
        doc["points"][0]["latency_diagnosis"] = diag

    d = variant(tmp_path, CPU, "diag", record)
    report = build_report(load_runs([d]))
    t = report.server_latency
    assert t is not None and t in report.tables
    (row,) = t.rows
    assert row[3:] == ["36.00", "37.61", "0", "27.50 (25.00-50.00)", "coalesced_streaming"]
    assert build_report(load_runs([CPU])).server_latency is None
