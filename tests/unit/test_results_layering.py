"""The results document is the contract between bench and report: ``servebook.results``
and ``servebook.report`` read JSON files, so neither imports the load generator
(``servebook.bench``) or a backend (``servebook.backends``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "servebook"
FORBIDDEN = ("servebook.bench", "servebook.backends")


def imported_modules(source: str, package: str) -> list[str]:
    """Every module a file of ``package`` imports, absolute (``from servebook import bench``
    counts as ``servebook.bench``; relative imports are resolved against ``package``)."""
    out: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            out += [base, *(f"{base}.{a.name}" for a in node.names)]
    return out


def forbidden_imports(source: str, package: str) -> list[str]:
    mods = imported_modules(source, package)
    return sorted({m for m in mods for f in FORBIDDEN if m == f or m.startswith(f + ".")})


@pytest.mark.parametrize("package", ["results", "report"])
def test_results_and_report_import_neither_bench_nor_backends(package: str) -> None:
    files = sorted((SRC / package).rglob("*.py"))
    assert files, f"no modules under {SRC / package}"
    bad = {
        str(f.relative_to(SRC)): forbidden_imports(
            f.read_text(encoding="utf-8"), ".".join(("servebook", *f.relative_to(SRC).parent.parts))
        )
        for f in files
    }
    assert {f: mods for f, mods in bad.items() if mods} == {}


def test_the_walk_sees_every_spelling_of_an_import() -> None:
    source = (
        "from servebook.bench.client import LoadResult\n"
        "from servebook import backends\n"
        "from ..bench import stats\n"
        "import servebook.backends.local\n"
        "from servebook.results import schema\n"
        "from . import tables\n"
    )
    assert forbidden_imports(source, "servebook.report") == [
        "servebook.backends",
        "servebook.backends.local",
        "servebook.bench",
        "servebook.bench.client",
        "servebook.bench.client.LoadResult",
        "servebook.bench.stats",
    ]
