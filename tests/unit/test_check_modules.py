"""`servebook.check_modules.CHECK_MODULES` names every module that registers a check, and
nothing else: read from the source with `ast`, so no module is imported to find out."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import servebook
from servebook.check_modules import CHECK_MODULES

PACKAGE = Path(servebook.__file__).parent
# The functions of servebook.findings that register a check.
REGISTER = {"register", "register_once"}


def _calls_register(tree: ast.Module) -> bool:
    """Whether the module calls ``servebook.findings.register`` (or ``register_once``),
    however it imported it."""
    direct: set[str] = set()  # register, or what it was imported as
    modules: set[str] = set()  # names bound to servebook.findings
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "servebook.findings":
            direct |= {a.asname or a.name for a in node.names if a.name in REGISTER}
        elif isinstance(node, ast.ImportFrom) and node.module == "servebook":
            modules |= {a.asname or a.name for a in node.names if a.name == "findings"}
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "servebook.findings"}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in direct:
            return True
        if isinstance(f, ast.Attribute) and f.attr in REGISTER and ast.unparse(f.value) in modules:
            return True
    return False


def registering_modules(root: Path) -> list[str]:
    names = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        if rel.parts[-1] == "findings" or not _calls_register(ast.parse(path.read_text())):
            continue
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def test_every_module_that_registers_a_check_is_in_check_modules() -> None:
    missing = sorted(set(registering_modules(PACKAGE)) - set(CHECK_MODULES))
    assert missing == [], f"add {missing} to servebook/check_modules.py"


def test_every_listed_check_module_exists_and_registers_checks() -> None:
    absent = [m for m in CHECK_MODULES if importlib.util.find_spec(m) is None]
    assert absent == [], f"{absent} no longer exist: update servebook/check_modules.py"
    idle = sorted(set(CHECK_MODULES) - set(registering_modules(PACKAGE)))
    assert idle == [], f"{idle} register no check: remove them from servebook/check_modules.py"
    assert len(set(CHECK_MODULES)) == len(CHECK_MODULES)


def test_registering_modules_sees_every_spelling_of_register(tmp_path: Path) -> None:
    pkg = tmp_path / "servebook"
    (pkg / "area").mkdir(parents=True)
    (pkg / "area" / "a.py").write_text(
        "from servebook.findings import register\nX = register('SB9', 't', 'r', 'f')\n"
    )
    (pkg / "area" / "b.py").write_text(
        "from servebook import findings as fd\nX = fd.register('SB9', 't', 'r', 'f')\n"
    )
    (pkg / "area" / "c.py").write_text(
        "from servebook.findings import register as reg\nX = reg('SB9', 't', 'r', 'f')\n"
    )
    (pkg / "area" / "d.py").write_text(
        "from servebook.findings import register_once\nX = register_once('SB9', 't', 'r', 'f')\n"
    )
    (pkg / "area" / "other.py").write_text("import atexit\natexit.register(print)\n")
    (pkg / "findings.py").write_text("def register(id): ...\n")
    assert registering_modules(pkg) == [f"servebook.area.{m}" for m in "abcd"]
