"""The layers of servebook, read from the source with ``ast``: every ``import`` and
``from ... import`` of every module under ``src/servebook``, relative imports resolved and
imports inside functions and ``TYPE_CHECKING`` blocks included (a lazy import is still a
dependency). Each rule is one test whose failure names the module and line.

* ``results/`` is the contract between bench and report: it reads and writes JSON
  documents, so it imports neither side nor a backend; ``report/`` reads those documents
  and imports neither the load generator nor a backend.
* bench and verify reach a deployment through the endpoints it hands them, never by asking
  which backend started it.
* ``kube`` is the layer under preflight and the Kubernetes backend: it imports neither, and
  preflight imports no backend, so the two never import each other.
* ``commands`` is the edge (parse, call, print): only ``cli.py`` and the commands import it.
* No module is so long that it holds several jobs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "servebook"
MAX_LINES = 700
LONG_FILES_ALLOWED = {
    # One stdlib script shipped into the probe Pods: it cannot import the rest of servebook.
    "preflight/probe.py",
}


@dataclass(frozen=True)
class Import:
    """One name a module imports, absolute: ``from servebook import bench`` yields
    ``servebook`` and ``servebook.bench``, ``from servebook.bench.client import X`` yields
    ``servebook.bench.client`` and ``servebook.bench.client.X``."""

    path: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} imports {self.name}"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_in(source: str, module: str, is_package: bool = False, path: str = "") -> list[Import]:
    """Every import in ``source`` (the module ``module``), wherever it stands in the file."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(path, node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            found.append(Import(path, node.lineno, base))
            found += [Import(path, node.lineno, f"{base}.{a.name}") for a in node.names]
    return found


def source_files(*under: str) -> list[Path]:
    """The modules under ``src/servebook/<under>`` (a package folder or a module file)."""
    files: list[Path] = []
    for part in under:
        target = PACKAGE / part
        files += [target] if target.is_file() else sorted(target.rglob("*.py"))
    assert files, f"no modules under {under}"
    return files


def imports_of(files: Iterable[Path]) -> Iterator[Import]:
    for path in files:
        yield from imports_in(
            path.read_text(encoding="utf-8"),
            module_name(path),
            is_package=path.name == "__init__.py",
            path=str(path.relative_to(SRC)),
        )


def within(name: str, packages: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def violating(imports: Iterable[Import], forbidden: Iterable[str]) -> list[str]:
    forbidden = tuple(forbidden)
    return sorted({str(i) for i in imports if within(i.name, forbidden)})


def violations(files: Iterable[Path], forbidden: Iterable[str]) -> list[str]:
    return violating(imports_of(files), forbidden)


def test_report_imports_neither_bench_nor_backends() -> None:
    assert violations(source_files("report"), ["servebook.bench", "servebook.backends"]) == []


def test_results_imports_neither_bench_nor_backends_nor_report() -> None:
    forbidden = ["servebook.bench", "servebook.backends", "servebook.report"]
    assert violations(source_files("results"), forbidden) == []


def test_bench_and_verify_import_no_backend() -> None:
    assert violations(source_files("bench", "verify"), ["servebook.backends"]) == []


def test_kube_imports_neither_preflight_nor_backends() -> None:
    forbidden = ["servebook.preflight", "servebook.backends"]
    assert violations(source_files("kube"), forbidden) == []


def test_preflight_imports_no_backend() -> None:
    assert violations(source_files("preflight"), ["servebook.backends"]) == []


def test_only_the_cli_and_the_commands_import_the_commands() -> None:
    edge = {PACKAGE / "cli.py", *source_files("commands")}
    rest = [p for p in source_files(".") if p not in edge]
    assert violations(rest, ["servebook.commands"]) == []


def test_no_source_file_is_over_700_lines() -> None:
    lines = {
        str(p.relative_to(PACKAGE)): len(p.read_bytes().splitlines()) for p in source_files(".")
    }
    long = {f: n for f, n in lines.items() if n > MAX_LINES and f not in LONG_FILES_ALLOWED}
    assert long == {}, f"over {MAX_LINES} lines: {long}"


def test_the_walk_sees_every_form_of_an_import() -> None:
    source = (
        "from __future__ import annotations\n"
        "import servebook.backends.local\n"  # 2: plain
        "from servebook.bench.client import LoadResult\n"  # 3: from
        "from servebook import kube\n"  # 4: a package named as a name
        "from ..bench import stats\n"  # 5: relative, up one
        "from . import tables\n"  # 6: relative, this package
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from servebook.commands import out\n"  # 9: for the type checker only
        "def later() -> None:\n"
        "    import servebook.preflight as p\n"  # 11: inside a function
        "class Lazy:\n"
        "    def run(self) -> None:\n"
        "        from .plots import figure\n"  # 14: inside a method, relative
    )
    imports = imports_in(source, "servebook.report.render", path="x.py")
    found = {(i.line, i.name) for i in imports}
    assert {
        (2, "servebook.backends.local"),
        (3, "servebook.bench.client"),
        (3, "servebook.bench.client.LoadResult"),
        (4, "servebook.kube"),
        (5, "servebook.bench"),
        (5, "servebook.bench.stats"),
        (6, "servebook.report.tables"),
        (9, "servebook.commands.out"),
        (11, "servebook.preflight"),
        (14, "servebook.report.plots.figure"),
    } <= found
    forbidden = ["servebook.bench", "servebook.backends", "servebook.commands"]
    assert violating(imports, forbidden) == [
        "x.py:2 imports servebook.backends.local",
        "x.py:3 imports servebook.bench.client",
        "x.py:3 imports servebook.bench.client.LoadResult",
        "x.py:5 imports servebook.bench",
        "x.py:5 imports servebook.bench.stats",
        "x.py:9 imports servebook.commands",
        "x.py:9 imports servebook.commands.out",
    ]


def test_relative_imports_in_a_package_resolve_against_the_package_itself() -> None:
    names = {i.name for i in imports_in("from .store import load\n", "servebook.results", True)}
    assert names == {"servebook.results.store", "servebook.results.store.load"}
