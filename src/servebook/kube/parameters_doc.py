"""PARAMETERS.md: beside the rendered manifests, every parameter, its value, where the
value came from and how to find the right one on a cluster.  A reader who must change a
value learns which parameter to set and re-renders; nobody edits the manifests."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from servebook.kube import manifests
from servebook.recipe.plan import Plan
from servebook.recipe.schema import Parameter, ParamType

# First line of every PARAMETERS.md servebook writes: how `servebook render` recognises a
# directory it may replace.
MARKER = "<!-- Written by `servebook render`. Do not edit: render again. -->"
DEFAULT_ORIGIN = "the recipe's default"


def _value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):  # arguments
        return f"`{shlex.join(value)}`" if value else "none"
    if isinstance(value, (dict, list)):  # structured settings (type yaml)
        return f"`{_json(value)}`" if value else "none"
    return f"`{value}`"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _origin(origin: str) -> str:
    return {DEFAULT_ORIGIN: "default"}.get(origin, origin)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def rerender_command(plan: Plan, declared: Mapping[str, Parameter]) -> str:
    """A command that renders the same objects again: every value not at its default,
    one ``--set`` per line so a reader can compare them with the table."""
    lines = [shlex.join(["servebook", "render", plan.recipe])]
    for name in declared:
        origin = plan.param_origins.get(name, DEFAULT_ORIGIN)
        if origin in (DEFAULT_ORIGIN, "unset (optional)"):
            continue
        value = plan.params.get(name)
        if declared[name].type is ParamType.YAML:
            text = _json(value)
        elif isinstance(value, list):
            text = shlex.join(value)
        elif isinstance(value, bool):
            text = str(value).lower()
        else:
            text = "" if value is None else str(value)
        lines.append(shlex.join(["--set", f"{name}={text}"]))
    return " \\\n  ".join(lines)


def parameters_markdown(
    plan: Plan,
    declared: Mapping[str, Parameter],
    files: Sequence[str],
    k8s_version: str,
) -> str:
    lines = [
        MARKER,
        f"# {plan.recipe}: the parameters of this render",
        "",
        f"Rendered from recipe `{plan.recipe}` by `servebook render`. Every object was checked "
        f"against the Kubernetes {k8s_version} OpenAPI schema (strict) before anything was "
        "written. Files, in apply order:",
        "",
    ]
    lines += [f"* `{f}`" for f in files]
    shared = any("/" in f for f in files)
    lines += [
        "",
        f"Apply from this directory: `{manifests.apply_command(files, '.')}`. Tear down: "
        f"`{manifests.teardown_command('.')}`, which removes this deployment's objects only"
        + (
            f" (the namespace, which other deployments may share, is in "
            f"`{manifests.NAMESPACE_DIR}/`, and `kubectl delete -f` does not descend into it)."
            if shared
            else "."
        ),
        "",
        "To change a value, render again rather than editing the manifests; this command "
        "renders the same objects (add `-o` and this directory to replace it):",
        "",
        "```sh",
        rerender_command(plan, declared),
        "```",
        "",
        "| parameter | value | from |",
        "|---|---|---|",
    ]
    for name in declared:
        origin = _origin(plan.param_origins.get(name, DEFAULT_ORIGIN))
        lines.append(f"| `{name}` | {_cell(_value(plan.params.get(name)))} | {_cell(origin)} |")
    for name, p in declared.items():
        origin = _origin(plan.param_origins.get(name, DEFAULT_ORIGIN))
        kind = p.type.value + (" (optional)" if p.optional else "")
        if p.required_on:
            kind += f" (required on {', '.join(p.required_on)} only)"
        if p.choices:
            kind += f": one of {', '.join(p.choices)}"
        lines += [
            "",
            f"## `{name}`",
            "",
            f"{_value(plan.params.get(name))}, from {origin}. Type {kind}.",
            "",
            " ".join(p.description.split()),
        ]
        if p.how_to_find:
            lines += ["", "How to find it: " + " ".join(p.how_to_find.split())]
    return "\n".join(lines) + "\n"
