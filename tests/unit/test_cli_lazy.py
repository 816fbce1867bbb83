"""A command imports only its own module, and the command line answers without importing
any where it can (issue 48, point 4): ``servebook --version``, ``--help``, ``recipes`` and
the shell's completion of a command's name import no numpy, plotting, pydantic, Kubernetes
client or bench code, and stay under a ceiling of modules; ``verify`` and ``status``
import no numpy and no plotting.  Import cost is counted in modules, never timed here
(``benchmarks/cli_latency.py`` prints the CPU time of each)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import typer.main

from servebook import cli as servebook_cli
from servebook import commands
from servebook.commands.index import COMMANDS
from tests.conftest import CliResult
from tests.unit.engine_standin import engine

Cli = Callable[..., CliResult]

#: What none of the light command lines may import: the numeric and plotting libraries,
#: the recipe schema's pydantic, the Kubernetes clients, the HTTP client and the bench.
HEAVY = ("numpy", "matplotlib", "pydantic", "kubernetes", "kubernetes_validate", "kr8s")
HEAVY_SERVEBOOK = (
    "servebook.bench",
    "servebook.report",
    "servebook.kube",
    "servebook.recipe.schema",
)
PLOTTING = ("numpy", "matplotlib", "servebook.report.plots")

#: Modules in ``sys.modules`` when the command ends (``python -c pass`` holds 33): 720 for
#: --version, 815 for --help, 360 for ``recipes`` and 722 for the completion when every
#: command, or the recipe schema, was imported first.  --help's are typer's: its Rich help
#: (``typer.rich_utils``) alone brings 316.
CEILING = {"--version": 80, "--help": 360, "recipes": 290, "completion": 250}

#: The shell's Tab after ``servebook `` (bash; what typer's completion script sets).
COMPLETE = {"_SERVEBOOK_COMPLETE": "complete_bash", "COMP_WORDS": "servebook ", "COMP_CWORD": "1"}

#: Each light command line: its arguments, its environment, what it prints, and the
#: modules of servebook.commands it imports (--help: typer's Rich help imports what it does).
LIGHT: dict[str, tuple[list[str], dict[str, str], str, list[str] | None]] = {
    "--version": (["--version"], {}, "servebook ", []),
    "--help": (["--help"], {}, "Make LLM serving deployments provable", None),
    "recipes": (["recipes"], {}, "tiny-pd", ["index", "recipes"]),
    "completion": ([], COMPLETE, "\nverify\n", ["index"]),
}


def imported(
    args: Sequence[str], tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``servebook ARGS`` as its console script runs it (``servebook.entry.main``), in a
    child, and the modules it had imported when it exited."""
    listing = tmp_path / "modules.txt"
    code = "\n".join(
        [
            "import atexit, sys",
            "def _imported():",
            f"    with open({str(listing)!r}, 'w') as f:",
            "        f.write('\\n'.join(sys.modules))",
            "atexit.register(_imported)",
            f"sys.argv = ['servebook', *{list(args)!r}]",
            "from servebook.entry import main",
            "main()",
        ]
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    return r, listing.read_text().split("\n")


def _of(modules: list[str], roots: Sequence[str]) -> list[str]:
    return [m for m in modules if any(m == r or m.startswith(r + ".") for r in roots)]


@pytest.mark.parametrize("name", LIGHT)
def test_a_light_command_line_imports_nothing_heavy(
    name: str, tmp_path: Path, sb_home: Path
) -> None:
    args, env, says, own = LIGHT[name]
    r, modules = imported(args, tmp_path, {"SERVEBOOK_HOME": str(sb_home), **env})
    assert r.returncode == 0, r.stderr
    assert says in r.stdout
    assert _of(modules, HEAVY + HEAVY_SERVEBOOK) == []
    assert len(modules) <= CEILING[name], f"{len(modules)} modules: {sorted(modules)}"
    if own is not None:
        prefix = "servebook.commands."
        assert sorted(m[len(prefix) :] for m in modules if m.startswith(prefix)) == own


def test_verify_and_status_import_no_numpy_or_plotting(
    cli: Cli, sb_home: Path, tmp_path: Path
) -> None:
    with engine() as url:
        assert cli("attach", "one", "--role", f"mixed={url}", "--entry", url).returncode == 0
        for command in ("verify", "status"):
            r, modules = imported(
                [command, "one", "--json"], tmp_path, {"SERVEBOOK_HOME": str(sb_home)}
            )
            assert r.returncode in (0, 1), r.stderr  # a verdict, whichever it is
            assert '"one"' in r.stdout, r.stdout  # its JSON, of the deployment asked
            assert _of(modules, PLOTTING) == [], command


def test_the_index_names_every_registered_command_and_its_module() -> None:
    servebook_cli.load()
    registered = [
        (c.name or c.callback.__name__, c.callback.__module__)
        for c in commands.app.registered_commands
        if c.callback is not None
    ]
    registered += [
        (str(g.name), g.typer_instance.registered_commands[0].callback.__module__)
        for g in commands.app.registered_groups
        if g.typer_instance is not None
    ]
    # (other tests may have imported the modules in another order than load's)
    assert len(registered) == len(dict(registered))
    assert dict(registered) == {
        name: f"servebook.commands.{c.module}" for name, c in COMMANDS.items()
    }


def test_each_summary_is_the_first_paragraph_of_its_commands_help() -> None:
    """--help lists a command by its summary when its module is not imported, and by its
    own help when it is: the two must read the same."""
    servebook_cli.load()
    group = typer.main.get_group(commands.app)
    for name, c in COMMANDS.items():
        command = group.commands[name]
        help_text = inspect.cleandoc(command.short_help or command.help or "")
        first = help_text.split("\n\n")[0].replace("\n", " ").strip()
        assert c.summary == first, f"index.COMMANDS[{name!r}].summary should read: {first!r}"


def test_help_lists_the_commands_alike_imported_or_not(cli: Cli, tmp_path: Path) -> None:
    """``servebook --help`` in a child imports no command; here every one is imported."""
    child, _ = imported(["--help"], tmp_path)
    servebook_cli.load()
    here = cli("--help")
    assert here.returncode == child.returncode == 0
    listed = here.stdout[here.stdout.index("╭─ Commands") :]
    assert "│ experiment " in listed and "│ model " in listed
    assert child.stdout.endswith(listed)


def test_a_command_imports_only_its_own_module() -> None:
    code = (
        "import sys\nfrom servebook import cli\ncli.load(['recipes', 'list'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('servebook.commands.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "['servebook.commands.index', 'servebook.commands.recipes']"


def test_a_mistyped_command_is_refused_with_a_suggestion_from_every_command(
    cli: Cli,
) -> None:
    """With no command imported (the child), typer's suggestion still knows them all."""
    r = cli("verfy", process=True)
    assert r.returncode == 2
    assert "No such command 'verfy'. Did you mean 'verify'?" in " ".join(r.stderr.split())
