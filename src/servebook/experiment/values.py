"""The values an experiment's recipe arms are resolved with, and the one way they are.

One values file (the experiment's ``values:``, a path or a mapping, or the same file named
in each arm's ``values:``) serves every recipe the experiment names: a site's namespace,
nodes, model directories and image for vllm-pd and vllm-pd-spec alike.  So a key that
another recipe of the experiment declares (vllm-pd-spec's ``decode_draft_dir``) is no
error for the recipe that lacks it (vllm-pd): each recipe takes the keys it declares.  A
key that no recipe of the experiment declares is still refused (exit 2, naming the key and
the file), as ``servebook up -f`` refuses it: a misspelt ``namespce`` would otherwise leave
every arm in the recipe's default namespace.  An arm's ``set:`` stays its own and strict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servebook.errors import UsageError
from servebook.experiment.spec import Arm, Experiment
from servebook.recipe.plan import Plan

Given = list[tuple[dict[str, Any], str]]  # (values, where they came from)


def _read(exp: Experiment, arm: Arm) -> Given:
    """The experiment's values, then the arm's values files, as read (not yet filtered)."""
    from servebook.recipe.resolve import load_values_file

    out: Given = []
    if isinstance(exp.values, dict):
        out.append((dict(exp.values), f"{exp.path} values:"))
    elif exp.values is not None:
        out.append((load_values_file(Path(exp.values)), f"values file {exp.values}"))
    out += [(load_values_file(Path(f)), f"values file {f}") for f in arm.values]
    return out


def declared(recipe: str) -> set[str]:
    from servebook.recipe.resolve import load_source, parse_parameters

    return set(parse_parameters(load_source(recipe)))


def check(exp: Experiment) -> None:
    """Every key of the experiment's values and of each recipe arm's values files is a
    parameter of some recipe the experiment names; refused (exit 2) naming the first that
    is not, where it was given and what the recipes declare."""
    recipes = sorted({a.recipe for a in exp.arms if a.kind == "recipe" and a.recipe})
    params = {r: declared(r) for r in recipes}
    anywhere = set().union(*params.values()) if params else set()
    for arm in exp.arms:
        if arm.kind != "recipe":
            continue
        for mapping, origin in _read(exp, arm):
            unknown = sorted(set(mapping) - anywhere)
            if unknown:
                raise UsageError(
                    f"{exp.path}: {origin}: {unknown[0]!r} is a parameter of no recipe of "
                    f"this experiment ({', '.join(recipes)})",
                    hint="fix its spelling or remove it; `servebook recipes show NAME` lists "
                    "a recipe's parameters (a key any one recipe of the experiment declares "
                    "is fine for the others)",
                )


def given(exp: Experiment, arm: Arm) -> Given:
    """The values ``arm``'s recipe is resolved with: each mapping cut to the parameters the
    recipe declares (the rest is another recipe's, or refused by :func:`check`)."""
    assert arm.recipe is not None
    mine = declared(arm.recipe)
    return [({k: v for k, v in m.items() if k in mine}, origin) for m, origin in _read(exp, arm)]


def resolve_arm(exp: Experiment, arm: Arm, **kw: Any) -> Plan:
    """``arm``'s Plan: its recipe with the experiment's values, its values files (each cut
    to what the recipe declares) and its ``set:`` (strict)."""
    from servebook.recipe.resolve import resolve

    assert arm.recipe is not None
    check(exp)
    return resolve(arm.recipe, arm.sets, given=given(exp, arm), **kw)
