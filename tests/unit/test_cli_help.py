"""Every command's --help as a person reads it: each example on a line of its own, no Rich
markup, no Python types, and every command with an example."""

from __future__ import annotations

import re

import click
import pytest
import typer
from typer.testing import CliRunner

from servebook.cli import app

runner = CliRunner()


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for name, cmd in sorted(group.commands.items()):
        found.append((*prefix, name))
        if isinstance(cmd, click.Group):
            found += _commands(cmd, (*prefix, name))
    return found


COMMANDS = _commands(typer.main.get_command(app))  # type: ignore[arg-type]


def _help(*words: str) -> str:
    r = runner.invoke(app, [*words, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize("words", [(), *COMMANDS], ids=lambda w: " ".join(w) or "servebook")
def test_help_shows_no_markup_no_python_types_and_one_example_per_line(
    words: tuple[str, ...],
) -> None:
    text = _help(*words)
    assert not re.search(r"\[/?(bold|dim|green|red|yellow)?\]", text), text
    assert not re.search(r"<(list|str|int|float|bool|Path|path)\b", text), text
    assert "=True" not in text and "=False" not in text
    for line in text.splitlines():
        if "Example" in line:
            assert line.count("servebook ") <= 1, line


@pytest.mark.parametrize(
    ("words", "examples"),
    [
        (("up",), ["servebook up tiny-pd", "servebook up vllm-pd --backend kubernetes"]),
        (("status",), ["servebook status tiny-pd --json", "servebook status --backend"]),
        (("down",), ["servebook down tiny-pd", "servebook down moe --backend"]),
        (("lint",), ["Example: servebook lint deploy/", "Example: servebook lint --json"]),
        (("checks",), ["Example: servebook checks SB302", "Example: servebook checks --json"]),
    ],
)
def test_examples_each_on_their_own_line(words: tuple[str, ...], examples: list[str]) -> None:
    lines = [line for line in _help(*words).splitlines() if "Usage:" not in line]
    where = [[i for i, line in enumerate(lines) if e in line] for e in examples]
    assert all(len(w) == 1 for w in where), where
    assert len({w[0] for w in where}) == len(examples)


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_every_command_and_group_has_an_example_of_itself(words: tuple[str, ...]) -> None:
    """Before: `servebook model --help` had none (issue 32, finding 8)."""
    text = _help(*words)
    examples = text[text.find("Example") :] if "Example" in text else ""
    assert re.search(rf"servebook {' '.join(words)}\b", examples), text


def test_render_help_names_the_placeholder_it_refuses() -> None:
    assert "a node name like <NODE>, a relative" in " ".join(_help("render").split())
