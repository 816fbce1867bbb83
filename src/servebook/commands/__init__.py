"""The Typer application, and the two ways every command prints beside its tables
(``servebook.console``): progress lines and ``--json``.  Each module beside this one
attaches one command (or command group) to ``app``; ``servebook.cli`` imports the one a
command line names, and ``CommandGroup`` lists the others from ``index.COMMANDS``."""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import typer.core
import typer.main
from rich.markup import escape
from typer import _click, _coercion
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from servebook import names, redact, urls, version_line
from servebook.commands.index import COMMANDS
from servebook.console import err, out, styled
from servebook.errors import UsageError


def import_command(name: str) -> None:
    """Attach the command ``name`` (of ``index.COMMANDS``) to ``app``: import its module."""
    importlib.import_module(f"servebook.commands.{COMMANDS[name].module}")


class _NotImported(TyperCommand):
    """A command whose module is not imported: its name and summary, for --help's list, a
    mistyped command's suggestion and the shell's completion of a command's name."""

    def __init__(self, name: str) -> None:
        super().__init__(name, help=COMMANDS[name].summary)

    def invoke(self, ctx: _click.Context) -> Any:
        # CommandGroup.resolve_command swaps it for the command before it can run.
        raise RuntimeError(f"servebook {self.name}: run before its module was imported")


class CommandGroup(TyperGroup):
    """servebook's commands, every one in ``index.COMMANDS``'s order, whether its module
    is imported or not; one that is not is imported when the command line (or the shell's
    completion of its options) reaches it."""

    def __init__(self, *, commands: dict[str, _click.Command], **attrs: Any) -> None:
        every = {name: commands.get(name) or _NotImported(name) for name in COMMANDS}
        super().__init__(commands=every | commands, **attrs)

    def resolve_command(
        self, ctx: _click.Context, args: list[str]
    ) -> tuple[str | None, _click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if name is not None and isinstance(command, _NotImported):
            import_command(name)
            command = self.commands[name] = typer.main.get_group(app).commands[name]
        return name, command, rest


app = typer.Typer(
    name="servebook",
    cls=CommandGroup,
    help="Make LLM serving deployments provable: recipe -> running deployment -> "
    "evidence -> reproducible numbers.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


_WORDS = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "bool": ""}


def _plain_type(param: TyperOption | TyperArgument, ctx: typer.Context) -> str | None:
    """What an option takes in --help, as a word (TEXT, INTEGER, PATH...), never a Python
    type (typer shows ``<list[str]>``); a flag shows nothing."""
    if param.metavar is not None:
        # An argument's metavar is already its name in the column before.
        return param.metavar if isinstance(param, TyperOption) else None
    if isinstance(param, TyperOption) and param.is_flag:
        return None
    python = re.sub(r"^list\[(.*)\]$", r"\1", param.display_type(ctx).strip("<>"))
    if param.type_descriptor.is_path:
        return "PATH"
    word = _WORDS.get(python, python.upper())
    return word or None


# The one place --help's type column is decided, for every command.
TyperOption.display_type_rich = _plain_type  # type: ignore[method-assign,assignment]
TyperArgument.display_type_rich = _plain_type  # type: ignore[method-assign,assignment]


@dataclass(frozen=True)
class _BuiltWhenUsed(_coercion.RuntimeParam):
    """Typer's conversion of one parameter's value, built when a value comes to convert.

    Typer builds a pydantic ``TypeAdapter`` for each parameter it processes, even one
    whose value is None and is never converted (``--help`` and ``--install-completion``
    not given, on every command): importing pydantic for that cost every command about
    100 ms of CPU, two thirds of ``servebook recipes``."""

    descriptor: _coercion.TypeDescriptor

    def _coerce_value(self, value: Any, param: Any, ctx: _click.Context) -> Any:
        built = _coercion.build_runtime_param(self.descriptor)
        param._runtime_param = built  # typer's own from now on
        return built._coerce_value(value, param=param, ctx=ctx)


def _built_when_used(descriptor: _coercion.TypeDescriptor) -> _coercion.RuntimeParam:
    return _BuiltWhenUsed(descriptor.parameter_info, descriptor.annotation, descriptor)


typer.core.build_runtime_param = _built_when_used


def port_number(param: typer.CallbackParam, value: int | None) -> int | None:
    """A TCP port option: 1-65535, else exit 2 saying so (not a traceback later)."""
    if value is not None and not 1 <= value <= 65535:
        flag = param.opts[0] if param.opts else str(param.name)
        raise UsageError(
            f"{flag} {value}: a TCP port is 1-65535.", hint=f"Give {flag} a free port."
        )
    return value


def _flag(param: typer.CallbackParam) -> str:
    return param.opts[0] if param.opts else str(param.name)


def seconds(param: typer.CallbackParam, value: float | None) -> float | None:
    """A time bound in seconds: a finite number above 0 (nan never times out, inf waits for
    ever, and 0 or less ends before anything could answer)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        flag = _flag(param)
        raise UsageError(
            f"{flag} {value}: give a number of seconds above 0.",
            hint=f"e.g. {flag} {param.default or 600:g}.",
        )
    return value


SEED_MAX = 2**63 - 1


def seed_number(param: typer.CallbackParam, value: int | None) -> int | None:
    """A seed: a whole number from 0 to 2^63-1 (numpy's generators take no negative one)."""
    if value is not None and not 0 <= value <= SEED_MAX:
        raise UsageError(f"{_flag(param)} {value}: a seed is a whole number from 0 to {SEED_MAX}.")
    return value


def server_url(param: typer.CallbackParam, value: str | None) -> str | None:
    """A server's base URL (``servebook.urls``): refused naming the flag when no HTTP
    client could use it."""
    return None if value is None else urls.server_url(value, _flag(param))


def regular_file(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """A file option read later (``--dataset``): a regular file (``servebook.inputs``),
    so that a FIFO or ``/dev/zero`` is refused now, in its own words, not read for ever."""
    if value is not None:
        from servebook import inputs  # PyYAML: not for --help

        inputs.check_regular(value, f"{_flag(param)} file")
    return value


def dataset_file(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """``--dataset``: a shipped dataset (``builtin:NAME``, ``servebook.datasets``) or a
    regular file (``regular_file``)."""
    if value is not None:
        from servebook import datasets

        shipped = datasets.resolve(str(value))
        if shipped is not None:
            return shipped
    return regular_file(param, value)


def deployment_name(param: typer.CallbackParam, value: str | None) -> str | None:
    """A deployment NAME argument or ``--name``: a DNS-1123 label (``servebook.names``),
    refused (exit 2) while the command line is read, before anything is written."""
    if value is not None:
        opts = [o for o in param.opts if o.startswith("-")]
        names.deployment_name(value, opts[0] if opts else "deployment name")
    return value


def comma_list(param: typer.CallbackParam, value: str | None) -> str | None:
    """A comma-separated option (``--concurrency 1,4,16``): an empty item (``1,,4``, a
    trailing comma) is refused, not dropped."""
    if value is not None and any(not item.strip() for item in value.split(",")):
        flag = param.opts[0] if param.opts else str(param.name)
        raise UsageError(
            f"{flag} {value!r}: an empty item between commas; write the list without it, "
            "e.g. 1,4,16."
        )
    return value


def _use_kubeconfig(value: str | None) -> str | None:
    """``--kubeconfig FILE``: the kubeconfig every cluster request of this command reads
    (``servebook.kube.client`` reads ``KUBECONFIG``), as kubectl's flag of the same name."""
    if value is not None:
        if not os.path.exists(os.path.expanduser(value)):
            raise UsageError(f"--kubeconfig {value}: no such file.")
        from servebook import inputs

        # A FIFO would block the Kubernetes client's read for ever.
        inputs.check_regular(os.path.expanduser(value), "--kubeconfig")
        os.environ["KUBECONFIG"] = os.path.expanduser(value)
    return value


KubeconfigOpt: Any = typer.Option(
    None,
    "--kubeconfig",
    help="With --backend kubernetes: the kubeconfig file (default: KUBECONFIG, else "
    "~/.kube/config).",
    callback=_use_kubeconfig,
)


def say(msg: str) -> None:
    """A progress line on stderr, with the time (up's and run's steps)."""
    err.print(styled(f"[dim]{time.strftime('%H:%M:%S')}[/] {escape(msg)}"), soft_wrap=True)


def print_json(doc: Any) -> None:
    """``--json`` output, one way for every command: ``doc`` (an object, or JSON text) on
    stdout, indented by 2, non-ASCII as it is, without colour, so a pipe gets exactly what
    a terminal shows; every secret in it replaced (``servebook.redact.scrub``: structure
    and all, so a secret under a secret-named key goes even where its text would not say
    so)."""
    if isinstance(doc, str):
        doc = json.loads(doc)
    doc = redact.scrub(json.loads(json.dumps(doc, default=str)))[0]
    typer.echo(json.dumps(doc, indent=2, ensure_ascii=False))


def _version_callback(value: bool) -> None:
    if value:
        out.print(version_line())
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    """servebook turns recipes into running deployments, proves them from server-side
    counters, and measures them with a protocol whose numbers survive a re-run."""
