"""A recipe's document: a built-in recipe by name, or a recipe file, read as YAML with a key
given twice refused.  Only PyYAML and ``servebook.inputs``: ``servebook recipes`` lists the
built-in recipes from their documents without the schema (pydantic) that resolving one
takes (``servebook.recipe.resolve``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from servebook import inputs
from servebook.errors import UsageError

# A recipe or values file is a few KiB; a bound far above that keeps a wrong file from
# holding the pure-Python YAML parser for minutes (60 MB took more than 120 s).
RECIPE_MAX_BYTES = inputs.MiB


@dataclass(frozen=True)
class Source:
    """A recipe document and where it came from (for messages)."""

    name: str
    origin: str
    data: dict[str, Any]


def catalog_names() -> list[str]:
    """The built-in recipes' names, sorted."""
    root = resources.files("servebook.recipe") / "catalog"
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


def _refuse_a_key_twice(node: yaml.MappingNode) -> None:
    seen: dict[str, int] = {}
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
            line = key_node.start_mark.line + 1
            if key_node.value in seen:
                raise _DuplicateKey(key_node.value, line, seen[key_node.value])
            seen[key_node.value] = line


class _StrictLoader(inputs.BoundedLoader):
    """A safe loader within servebook's bounds (``inputs.BoundedLoader``) that refuses a key
    given twice in one mapping (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        _refuse_a_key_twice(node)
        return super().construct_mapping(node, deep=deep)


class _ShippedLoader(yaml.CSafeLoader):
    """``_StrictLoader`` on libyaml's parser, for the recipes servebook ships only: ten
    times faster (``servebook recipes`` reads all nine: 130 ms of CPU in Python's parser,
    15 ms here).  It is not within ``inputs``' bounds, which are decided as Python's
    composer builds each node; a shipped recipe is known to be within them
    (``tests/unit/test_recipe_source.py`` reads each with both loaders), a user's file
    always gets ``_StrictLoader``."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        _refuse_a_key_twice(node)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, origin: str, *, shipped: bool = False) -> dict[str, Any]:
    """The mapping a recipe or values file holds (``origin`` names it in messages), a key
    given twice refused; ``shipped``: a recipe servebook ships (``_ShippedLoader``)."""
    loader = _ShippedLoader if shipped and yaml.__with_libyaml__ else _StrictLoader
    try:
        data = yaml.load(text, Loader=loader)  # a SafeLoader: no arbitrary objects
    except _DuplicateKey as e:
        raise UsageError(
            f"{origin}: line {e.line}: key {e.key!r} is given twice (first at line {e.first}); "
            "YAML would silently keep the last one. Keep one of them."
        ) from None
    except inputs.YamlTooComplex as e:
        raise UsageError(
            f"{origin}{inputs.yaml_where(e)}: {e.problem}.",
            hint="Is this the right file? A recipe or values file nests a few levels.",
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise UsageError(
            f"{origin}:{where}: malformed YAML: {problem}. Fix the YAML syntax there."
        ) from None
    if data is None:
        raise UsageError(f"{origin}: holds no keys (an empty YAML document).")
    if not isinstance(data, dict):
        raise UsageError(
            f"{origin}: expected a mapping of keys (a recipe), got {type(data).__name__}."
        )
    return data


def load_source(ref: str) -> Source:
    """A built-in recipe name, or a path to a recipe YAML file."""
    path = Path(ref)
    if ref.endswith((".yaml", ".yml")) or os.sep in ref:
        text = inputs.read_text(path, "recipe file", RECIPE_MAX_BYTES)
        return Source(name=path.stem, origin=str(path), data=parse_yaml(text, str(path)))
    names = catalog_names()
    if ref not in names:
        raise UsageError(
            f"unknown recipe '{ref}'. Built-in recipes: {', '.join(names)}. "
            "Give one of them, or a path to a recipe .yaml file "
            "(`servebook recipes` lists them)."
        )
    res = resources.files("servebook.recipe") / "catalog" / f"{ref}.yaml"
    data = parse_yaml(res.read_text(), ref, shipped=True)
    return Source(name=ref, origin=f"built-in recipe {ref}", data=data)
