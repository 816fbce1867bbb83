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
* No import cycle: no module imports itself through others, and no top-level package
  (``servebook.X``, X a subpackage or a top-level module) does either, by any form of import
  (a lazy one and one for the type checker too).  An imported name is the longest module it
  names, and the bare ``servebook`` package is not counted.  A fact two layers need lives
  below both; a failure names one loop, each import in it by module and line.
* No code outside ``backends/`` compares a backend's name (``view.backend == "kubernetes"``,
  ``owner.name in ("local", ...)``): where the load runs and what route it takes are the
  place's to say (``Place.load_site``, ``DeploymentView.route``).
* No module is so long that it holds several jobs, and no function is too long or too
  branchy to read in one sitting: at most 100 lines and a McCabe complexity of at most 15.
  A function's length is its body, from its first statement (the docstring, where it has
  one) to its last line: the signature is declarations, and a Typer command declares every
  option there (``commands/bench.bench`` has some 200 lines of options over its body), so
  one count for every function leaves it out; decorators are left out too. Complexity is
  counted as ruff's C901 (mccabe) counts it, read with ``ast`` so the rule needs no tool
  on the path: 1, plus 1 for each ``if``/``elif``, loop, ``except``, ``try``'s ``else``,
  ``match`` case and nested function, boolean operators and comprehensions not counted.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "servebook"
MAX_LINES = 700
LONG_FILES_ALLOWED = {
    # One stdlib script shipped into the probe Pods: it cannot import the rest of servebook.
    "preflight/probe.py",
}
MAX_FUNCTION_LINES = 100
MAX_COMPLEXITY = 15


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


BACKEND_NAMES = {"local", "kubernetes", "attached", "url"}
# What names a deployment's place in an expression: ``view.backend``, ``arm.backend``,
# ``owner.name``.  A recipe's ``backends:`` list (``plan.backends``) is what the recipe
# declares it runs on, read where a backend's own code refuses a recipe not for it.
PLACE_WORDS = re.compile(r"\b(backend|owner|place)\b", re.IGNORECASE)


def backend_name_comparisons(source: str, path: str = "") -> list[str]:
    """Every comparison (``==``, ``!=``, ``in``, ``not in``) of an expression that names a
    place with a backend's name (alone, or in a tuple, list or set of literals)."""

    def names_in(node: ast.expr) -> set[str]:
        elts = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
        return {e.value for e in elts if isinstance(e, ast.Constant) and e.value in BACKEND_NAMES}

    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        if not all(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops):
            continue
        operands = [node.left, *node.comparators]
        literal = [o for o in operands if names_in(o)]
        placed = [o for o in operands if PLACE_WORDS.search(ast.unparse(o))]
        if literal and placed:
            found.append(f"{path}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_backend_name_is_compared_outside_the_backends() -> None:
    outside = [p for p in source_files(".") if "backends" not in p.relative_to(PACKAGE).parts]
    found = [
        hit
        for p in outside
        for hit in backend_name_comparisons(
            p.read_text(encoding="utf-8"), str(p.relative_to(PACKAGE))
        )
    ]
    assert found == []


def test_the_backend_name_rule_sees_each_form() -> None:
    source = (
        'if view.backend == "kubernetes": pass\n'  # 1
        'if owner.name in ("local", "attached"): pass\n'  # 2
        'if "local" != place: pass\n'  # 3
        'if arm.kind == "url": pass\n'  # an arm's kind, not a place
        'if "local" in recipe.backends: pass\n'  # what a recipe declares
        'if "local" in keys: pass\n'  # a YAML key
    )
    assert [h.split()[0] for h in backend_name_comparisons(source, "x.py")] == [
        "x.py:1",
        "x.py:2",
        "x.py:3",
    ]


def test_no_source_file_is_over_700_lines() -> None:
    lines = {
        str(p.relative_to(PACKAGE)): len(p.read_bytes().splitlines()) for p in source_files(".")
    }
    long = {f: n for f, n in lines.items() if n > MAX_LINES and f not in LONG_FILES_ALLOWED}
    assert long == {}, f"over {MAX_LINES} lines: {long}"


Function = ast.FunctionDef | ast.AsyncFunctionDef


def functions_in(files: Iterable[Path]) -> Iterator[tuple[str, Function]]:
    """Every function and method under ``files`` (nested ones too), with its place:
    ``bench/http1.py:110 data_received``."""
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}", node


def body_lines(function: Function) -> int:
    """The lines of a function's body, its first statement to its last line."""
    return (function.end_lineno or function.lineno) - function.body[0].lineno + 1


def complexity(function: Function) -> int:
    """The McCabe complexity of a function as ruff's C901 counts it."""
    return 1 + branches(function.body)


def branches(statements: list[ast.stmt]) -> int:
    """The decision points in ``statements`` and the blocks under them (ruff's
    ``get_complexity_number``)."""
    n = 0
    for s in statements:
        if isinstance(s, ast.If | ast.For | ast.AsyncFor | ast.While):
            n += 1 + branches(s.body) + branches(s.orelse)
        elif isinstance(s, ast.With | ast.AsyncWith | ast.ClassDef):
            n += branches(s.body)
        elif isinstance(s, ast.Match):
            n += sum(1 + branches(case.body) for case in s.cases)
        elif isinstance(s, ast.Try | ast.TryStar):
            n += branches(s.body) + branches(s.orelse) + branches(s.finalbody)
            n += (1 if s.orelse else 0) + sum(1 + branches(h.body) for h in s.handlers)
        elif isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef):
            n += 1 + branches(s.body)
    return n


def offenders(measure: Callable[[Function], int], limit: int) -> dict[str, int]:
    """Every function whose ``measure`` is over ``limit``, by place, with its figure."""
    return {place: n for place, f in functions_in(source_files(".")) if (n := measure(f)) > limit}


def test_no_function_is_over_100_lines() -> None:
    long = offenders(body_lines, MAX_FUNCTION_LINES)
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_function_has_a_mccabe_complexity_over_15() -> None:
    branchy = offenders(complexity, MAX_COMPLEXITY)
    assert branchy == {}, f"functions over a McCabe complexity of {MAX_COMPLEXITY}: {branchy}"


def test_the_size_rules_count_the_body_and_every_branch() -> None:
    source = (
        "@decorator\n"
        "def f(\n"
        "    a: int = 1,\n"  # the signature: not counted
        ") -> int:\n"
        '    """Doc."""\n'  # 5: the body starts here
        "    if a:\n"  # +1
        "        pass\n"
        "    elif a > 1 and a < 3:\n"  # +1, the boolean operator not counted
        "        pass\n"
        "    else:\n"
        "        pass\n"
        "    for _ in [b for b in range(a) if b]:\n"  # +1, the comprehension not counted
        "        while a:\n"  # +1
        "            a -= 1\n"
        "    try:\n"
        "        pass\n"
        "    except ValueError:\n"  # +1
        "        pass\n"
        "    else:\n"  # +1
        "        pass\n"
        "    with open('x'):\n"
        "        match a:\n"
        "            case 1:\n"  # +1
        "                pass\n"
        "            case _:\n"  # +1
        "                pass\n"
        "    def inner() -> None:\n"  # +1
        "        if a:\n"  # +1
        "            pass\n"
        "    return a\n"  # 30
    )
    f = ast.parse(source).body[0]
    assert isinstance(f, ast.FunctionDef)
    assert body_lines(f) == 26
    assert complexity(f) == 11


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


# --- import cycles ---------------------------------------------------------------------------

# Modules that import each other (each a set), allowed while the work that ends the cycle is
# under way.  None now: the last (backends.attached <-> kube_attach) ended when the attached
# place moved apart from its record (backends/attached/place.py).
CYCLES_ALLOWED: list[frozenset[str]] = []

# Each module's imports of other servebook modules, each edge with its first import.
Graph = dict[str, dict[str, Import]]


def import_graph(imports: dict[str, list[Import]]) -> Graph:
    """Which module imports which, from each module's imports (``imports``, by module).  An
    imported name is the longest prefix of it that is a module (``from servebook.bench.client
    import Hooks`` imports ``servebook.bench.client``), and the bare ``servebook`` package is
    left out (``from servebook import auth`` names it only as the place ``servebook.auth`` is
    in).  Each edge keeps its first import, the line a failure names."""
    graph: Graph = {m: {} for m in imports}
    for module, found in imports.items():
        for i in found:
            target = i.name
            while target and target not in imports:
                target = target.rpartition(".")[0]
            if target in ("", "servebook", module):
                continue
            if target not in graph[module] or i.line < graph[module][target].line:
                graph[module][target] = i
    return graph


def top_level(module: str) -> str:
    """The top-level package a module is in: ``servebook.bench.client`` -> ``servebook.bench``
    (a top-level module is its own)."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: Graph) -> Graph:
    """Which top-level package imports which (``servebook.X``, X a subpackage or a top-level
    module), each edge with the first import of it among the package's modules."""
    packages: Graph = {top_level(m): {} for m in graph}
    for module in sorted(graph):
        edges = packages[top_level(module)]
        for target, i in sorted(graph[module].items()):
            if top_level(target) != top_level(module):
                edges.setdefault(top_level(target), i)
    return packages


def reachable(graph: Graph, start: str) -> set[str]:
    """Every module that ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def shortest_loop(graph: Graph, start: str) -> list[Import]:
    """The fewest imports that lead from ``start`` back to it (breadth first)."""
    came: dict[str, tuple[str, Import]] = {}
    todo = deque([start])
    while todo:
        module = todo.popleft()
        for target, i in sorted(graph[module].items()):
            if target == start:
                loop = [i]
                while module != start:
                    module, i = came[module]
                    loop.append(i)
                return loop[::-1]
            if target not in came:
                came[target] = (module, i)
                todo.append(target)
    raise ValueError(f"{start} is in no cycle")


def cycles(graph: Graph) -> list[tuple[frozenset[str], list[Import]]]:
    """Each set of modules that import each other (directly or through others), with one
    shortest loop of imports through its first module by name."""
    reach = {m: reachable(graph, m) for m in graph}
    placed: set[str] = set()
    found = []
    for module in sorted(graph):
        if module in placed or module not in reach[module]:
            continue
        group = frozenset(m for m in reach[module] if module in reach[m])
        placed |= group
        found.append((group, shortest_loop(graph, module)))
    return found


def cycles_in(graph: Graph) -> list[str]:
    """The cycles in ``graph`` not allowed (``CYCLES_ALLOWED``), each as its loop's imports."""
    return [
        "; ".join(str(i) for i in loop)
        for group, loop in cycles(graph)
        if not any(group <= allowed for allowed in CYCLES_ALLOWED)
    ]


def source_graph() -> Graph:
    return import_graph({module_name(p): list(imports_of([p])) for p in source_files(".")})


def test_no_module_imports_itself_through_others() -> None:
    found = cycles_in(source_graph())
    assert found == [], "\n".join(found)


def test_no_top_level_package_imports_itself_through_others() -> None:
    found = cycles_in(package_graph(source_graph()))
    assert found == [], "\n".join(found)


def test_the_cycle_rule_finds_a_cycle_through_any_form_of_an_import() -> None:
    sources = {
        "servebook": "",
        "servebook.a": "import servebook\nfrom servebook.b import x\n",  # a -> b
        "servebook.b": "def later() -> None:\n    from servebook import a\n",  # b -> a, lazily
        # The packages p and q import each other; no module of them imports itself.
        "servebook.p": "",
        "servebook.p.one": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from servebook.q.two import T\n"  # p -> q, for the type checker only
        ),
        "servebook.p.three": "",
        "servebook.q": "",
        "servebook.q.two": "from ..p import three\n",  # q -> p, relative
    }
    packages = {"servebook", "servebook.p", "servebook.q"}
    graph = import_graph(
        {m: imports_in(s, m, m in packages, m.replace(".", "/")) for m, s in sources.items()}
    )
    assert cycles_in(graph) == [
        "servebook/a:2 imports servebook.b; servebook/b:2 imports servebook.a"
    ]
    assert cycles_in(package_graph(graph)) == [
        "servebook/a:2 imports servebook.b; servebook/b:2 imports servebook.a",
        "servebook/p/one:3 imports servebook.q.two; servebook/q/two:1 imports servebook.p",
    ]


# --- the tests' own layout -----------------------------------------------------------------

TESTS = SRC.parent / "tests"


def imports_of_test_file(path: Path) -> list[Import]:
    rel = path.relative_to(TESTS.parent)
    module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
    return imports_in(
        path.read_text(encoding="utf-8"), module, path.name == "__init__.py", str(rel)
    )


def imports_a_test_module(imp: Import) -> bool:
    """Whether the name imported is a test module (a ``test_*.py`` file under tests/), not
    a name defined in one: ``from tests.unit import test_a`` is, ``from tests.unit.conftest
    import test_like`` is not."""
    target = TESTS.parent.joinpath(*imp.name.split(".")).with_suffix(".py")
    return imp.name.startswith("tests.") and target.name.startswith("test_") and target.is_file()


def test_no_test_module_imports_another() -> None:
    """Shared set-up (fixtures, stand-ins, factories, constants) lives in ``conftest.py``
    and helper modules, never in a test module: importing one runs its module-level code
    again under another name, a fixture imported by name hides where it is defined, and a
    test module edited for its own tests breaks others it never names."""
    files = [p for p in sorted(TESTS.rglob("*.py")) if "fixtures" not in p.parts]
    assert any(p.name == "test_layers.py" for p in files)
    found = [str(i) for p in files for i in imports_of_test_file(p) if imports_a_test_module(i)]
    assert found == [], "\n".join(found)


def test_the_test_import_rule_sees_each_form_of_importing_a_test_module() -> None:
    src = (
        "from tests.unit.test_layers import X\n"
        "import tests.unit.test_layers\n"
        "from tests.unit import test_layers\n"
        "from . import test_layers as layers\n"
        "from tests.unit.conftest import test_like_helper\n"
        "from tests.unit.kube_standin import Server\n"
        "import tests.unit.conftest\n"
    )
    found = [i for i in imports_in(src, "tests.unit.test_x") if imports_a_test_module(i)]
    assert sorted({i.line for i in found}) == [1, 2, 3, 4]
