"""A command imports only its own module (``servebook.cli.COMMAND_MODULES``): the map must
name every command the modules register, and the module that registers it."""

from __future__ import annotations

import subprocess
import sys

from servebook import cli, commands


def test_the_map_names_every_registered_command_and_its_module() -> None:
    cli.load()
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
        name: f"servebook.commands.{module}" for name, module in cli.COMMAND_MODULES.items()
    }


def test_a_command_imports_only_its_own_module() -> None:
    code = (
        "import sys\nfrom servebook import cli\ncli.load(['recipes', 'list'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('servebook.commands.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "['servebook.commands.recipes']"
