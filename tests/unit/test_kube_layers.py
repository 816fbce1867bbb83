"""`servebook.kube` is the layer under preflight and the Kubernetes backend: it imports
neither, so preflight and the backend may use it without the two importing each other.
Read from the source with `ast`, imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import servebook

PACKAGE = Path(servebook.__file__).parent


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def _importing(package: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in sorted((PACKAGE / package).rglob("*.py")):
        for name in sorted(_imports(path)):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(PACKAGE)} imports {name}")
    return bad


def test_kube_imports_neither_preflight_nor_backends() -> None:
    assert _importing("kube", ("servebook.preflight", "servebook.backends")) == []


def test_preflight_imports_no_backend() -> None:
    assert _importing("preflight", ("servebook.backends",)) == []
