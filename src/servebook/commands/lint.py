"""`servebook lint PATH...` and `servebook checks`.

``lint`` reads files and directories (``servebook.lint.loader``), runs the manifest rules
(``servebook.lint.rules``) and the markdown rules (``servebook.lint.docs``), and prints the
findings.  Exit code 0: nothing failing (warnings allowed); 1: a failing finding; 2: some
input could not be read (a missing path; a file that does not parse, which is an SB100
finding beside every other file's findings).

``checks`` prints every registered check, from whichever area registered it: ``all_checks``
imports exactly the modules named in ``servebook.check_modules.CHECK_MODULES`` (a unit test
fails when a module that registers checks is missing there) and lists the registry.
``docs/checks.md`` is generated: ``servebook checks --markdown > docs/checks.md``; a unit
test fails when the committed file and the registry disagree.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path

import typer

from servebook.check_modules import CHECK_MODULES
from servebook.commands import app, print_json
from servebook.console import out, print_findings, styled
from servebook.errors import UsageError
from servebook.findings import REGISTRY, Check, exit_code, to_json

AREAS = (
    ("SB1", "Lint (`servebook lint`)"),
    ("SB2", "Preflight (`servebook preflight`, `servebook probe`)"),
    ("SB3", "Verify (`servebook verify`)"),
    ("SB4", "Benchmark validity (`servebook bench`, `servebook report`)"),
)


def all_checks() -> list[Check]:
    """Every registered check, sorted by id, after importing every registering module."""
    for name in CHECK_MODULES:
        importlib.import_module(name)
    return [REGISTRY[k] for k in sorted(REGISTRY)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def checks_markdown(checks: Iterable[Check]) -> str:
    """The text of docs/checks.md."""
    checks = list(checks)
    lines = [
        "# servebook checks",
        "",
        "<!-- Generated from the check registry by "
        "`servebook checks --markdown > docs/checks.md`. Do not edit by hand: a unit test "
        "fails when this file and the registry disagree. -->",
        "",
        "Every rule servebook applies, by stable id: `SB1xx` lint, `SB2xx` preflight, "
        "`SB3xx` verify, `SB4xx` benchmark validity. Each says what goes wrong in "
        "production when it is ignored, and how to fix it. `servebook checks` prints the "
        "same list.",
        "",
        "| id | title |",
        "|---|---|",
    ]
    lines += [f"| [{c.id}](#{c.id.lower()}) | {_cell(c.title)} |" for c in checks]
    known = tuple(prefix for prefix, _ in AREAS)
    groups = [(title, [c for c in checks if c.id.startswith(p)]) for p, title in AREAS]
    groups.append(("Other", [c for c in checks if not c.id.startswith(known)]))
    for title, members in groups:
        if not members:
            continue
        lines += ["", f"## {title}"]
        for c in members:
            lines += [
                "",
                f'<a id="{c.id.lower()}"></a>',
                "",
                f"### {c.id}: {c.title}",
                "",
                f"**Why it matters.** {c.rationale}",
                "",
                f"**Fix.** {c.fix}",
            ]
    return "\n".join(lines) + "\n"


def select_checks(checks: list[Check], ids: Iterable[str]) -> list[Check]:
    """The checks named by ``ids`` (an id such as SB302, or a prefix such as SB3), in
    registry order; an id that names none is a ``UsageError``."""
    wanted = [i.strip().upper() for i in ids]
    unknown = [i for i in wanted if not any(c.id.startswith(i) for c in checks)]
    if unknown or any(not i for i in wanted):
        raise UsageError(
            f"no such check: {', '.join(repr(i) for i in unknown) or repr('')}; ids run "
            f"from {checks[0].id} to {checks[-1].id}.",
            hint="`servebook checks` lists every check; give ids like SB302, or a prefix "
            "like SB3 for an area.",
        )
    return [c for c in checks if not wanted or any(c.id.startswith(i) for i in wanted)]


@app.command("checks")
def checks_command(
    ids: list[str] = typer.Argument(
        None,
        metavar="ID",
        help="Check ids to print (default: all), e.g. SB302 SB114; a prefix like SB3 "
        "prints an area.",
        show_default=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON."),
    markdown: bool = typer.Option(
        False, "--markdown", help="Print docs/checks.md (the generated reference page)."
    ),
) -> None:
    """List every check servebook runs (lint, preflight, verify, bench): id, title, why it
    matters in production, and the fix.

    Example: servebook checks SB302 SB114

    Example: servebook checks --json
    """
    checks = all_checks()
    if markdown:
        if ids:
            raise UsageError("--markdown prints the whole reference page; give no check ids.")
        typer.echo(checks_markdown(checks), nl=False)
        return
    checks = select_checks(checks, ids or [])
    if as_json:
        doc = [
            {"id": c.id, "title": c.title, "rationale": c.rationale, "fix": c.fix} for c in checks
        ]
        print_json(doc)
        return
    from rich.markup import escape

    for c in checks:
        out.print(styled(f"[bold]{escape(c.id)}[/bold]  {escape(c.title)}"))
        out.print(styled(f"  [dim]why:[/dim] {escape(c.rationale)}"))
        out.print(styled(f"  [dim]fix:[/dim] {escape(c.fix)}\n"))
    out.print(f"{len(checks)} check(s)")


@app.command("lint")
def lint_command(
    paths: list[Path] = typer.Argument(
        ...,
        help="Files or directories: recipes, rendered or third-party manifests "
        "(multi-document, Helm output), markdown docs. Directories are read recursively.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print findings as JSON."),
) -> None:
    """Find the known traps in serving manifests, recipes and docs before they reach a
    cluster. Exit 0: nothing failing; 1: a failing finding; 2: unreadable input.

    A file that cannot be read (YAML that does not parse, an unrendered Helm template) is
    reported as an SB100 finding beside every other file's findings.

    Example: servebook lint deploy/ docs/

    Example: servebook lint --json rendered/ > findings.json
    """
    from servebook.lint import docs, loader, rules

    lint_set = loader.load_paths(paths)
    findings = (
        loader.unreadable_findings(lint_set)
        + rules.check(lint_set)
        + docs.check(lint_set.markdown_files)
    )
    findings.sort(
        key=lambda f: (str(f.evidence.get("file", "")), int(f.evidence.get("line", 0)), f.check)
    )
    code = exit_code(findings)
    n_docs = len(lint_set.documents)
    summary = (
        f"{len(lint_set.yaml_files)} YAML file(s) ({n_docs} document(s)), "
        f"{len(lint_set.markdown_files)} markdown file(s)"
    )
    if lint_set.unreadable:
        summary += f", {len(lint_set.unreadable)} file(s) that could not be read"
    if as_json:
        print_json(to_json(findings, paths=[str(p) for p in paths], read=summary))
    elif findings:
        print_findings(findings, title=f"servebook lint: {summary}", console=out)
    else:
        out.print(f"servebook lint: {summary}: no findings.", highlight=False)
    raise typer.Exit(code)
