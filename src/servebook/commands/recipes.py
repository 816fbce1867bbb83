"""`servebook recipes [list|show NAME]`."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from servebook import redact
from servebook.commands import app, print_json
from servebook.console import out, styled
from servebook.recipe.source import catalog_names, load_source

recipes_app = typer.Typer(
    help="List the built-in recipes, or show one resolved to exact command lines.\n\n"
    "Example: servebook recipes show tiny-pd",
    invoke_without_command=True,
)
app.add_typer(recipes_app, name="recipes")

SetOpt = typer.Option([], "--set", help="Set a recipe parameter: NAME=VALUE (repeatable).")
ValuesOpt = typer.Option([], "-f", "--values", help="YAML file of parameter values.")


@recipes_app.callback()
def _default(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        list_recipes(json_out=False)


@recipes_app.command("list")
def list_recipes(json_out: bool = typer.Option(False, "--json", help="Machine-readable.")) -> None:
    """List built-in recipes.

    Example: servebook recipes list --json
    """
    rows: list[dict[str, Any]] = []
    for name in catalog_names():
        # Listed from the document itself: parameters are not resolved here.
        d = load_source(name).data
        spec = d.get("speculative") or {}
        rows.append(
            {
                "name": name,
                "topology": str(d.get("topology", "")),
                "speculative": spec.get("method") if isinstance(spec, dict) else None,
                "backends": list(d.get("backends") or []),
                "description": " ".join(str(d.get("description", "")).split()),
            }
        )
    if json_out:
        print_json(rows)
        return
    t = Table(title="built-in recipes")
    for col in ("name", "topology", "speculative", "backends", "description"):
        t.add_column(col)
    for row in rows:
        t.add_row(
            row["name"],
            row["topology"],
            row["speculative"] or "-",
            ",".join(row["backends"]),
            row["description"].split(". ")[0].rstrip(".") + ".",
        )
    out.print(t)


@recipes_app.command("show")
def show(
    recipe: str = typer.Argument(..., help="Built-in recipe name or path to a recipe YAML."),
    sets: list[str] = SetOpt,
    values: list[Path] = ValuesOpt,
    json_out: bool = typer.Option(False, "--json", help="Print the resolved Plan as JSON."),
) -> None:
    """Resolve a recipe and print each role's exact engine command line.

    Ports shown are illustrative; `servebook up` picks free ones.

    Example: servebook recipes show tiny-pd-spec --set num_speculative_tokens=4
    """
    from servebook.recipe.plan import Plan  # pydantic: not for the list
    from servebook.recipe.resolve import resolve

    # Shown as a record is kept: a key in the engine arguments, a token in the environment
    # or a parameter shows that it is given, never its value (``servebook.redact``).
    plan = Plan.model_validate(redact.scrub(resolve(recipe, sets, values).model_dump())[0])
    if json_out:
        print_json(plan.model_dump_json())
        return
    out.print(
        styled(
            f"[bold]{escape(plan.recipe)}[/] ({escape(plan.topology)}, engine "
            f"{escape(plan.engine)}) from {escape(plan.origin)}"
        ),
        soft_wrap=True,
    )
    for k, v in plan.params.items():
        out.print(f"  {k} = {v}", soft_wrap=True)
    for role, argv in plan.command_lines().items():
        env = plan.role(role).env
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        out.print(styled(f"\n[bold]{escape(role)}[/]:"))
        out.print(((prefix + " ") if prefix else "") + shlex.join(argv), soft_wrap=True)
