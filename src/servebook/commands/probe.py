"""`servebook probe`: read-only check of a model directory on this node (or of every model
directory under a root).  The checks live in ``servebook.preflight.probe`` (stdlib only,
also run standalone inside a probe Pod); this module parses, calls and prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from servebook import inputs
from servebook.commands import app, print_json
from servebook.console import out, print_findings
from servebook.errors import UsageError
from servebook.findings import exit_code, to_json
from servebook.preflight import probe as probe_lib
from servebook.preflight.probe_checks import to_findings

_EPILOG = (
    "Examples:\n\n"
    "  servebook probe /mnt/models/Llama-3.1-8B-Instruct --expect-model LlamaForCausalLM\n\n"
    "  servebook probe /models/target --draft /models/eagle-draft --json\n\n"
    "  servebook probe /models/llama --mountinfo node7-mountinfo.txt\n\n"
    "  servebook probe --find /mnt --max-depth 3\n\n"
    "Exit codes: 0 every check passes, 1 a check failed, 2 unusable arguments or a check "
    "could not decide."
)


def _unset(flag: str, metavar: str, help: str) -> Any:
    """One of probe's options: None unless given (usage_problem tells an absent option from
    a given one, and the defaults are applied after it), with its metavar and help."""
    return typer.Option(None, flag, metavar=metavar, help=help)


def _mounts(mountinfo: Path | None) -> tuple[list[probe_lib.Mount] | None, str]:
    """This machine's mounts, or those of a node's captured mountinfo (read through
    ``servebook.inputs``: a FIFO or ``/dev/zero`` given as FILE is refused, not read)."""
    if mountinfo is None:
        return probe_lib.read_mountinfo(None)
    raw = inputs.read_bytes(mountinfo, "--mountinfo file", probe_lib.MOUNTINFO_MAX_BYTES)
    # Mount points are bytes to the kernel: a path that is not UTF-8 is still a path.
    mounts = probe_lib.parse_mountinfo(raw.decode("utf-8", "surrogateescape"))
    if not mounts:
        raise UsageError(
            f"--mountinfo {mountinfo} holds no mountinfo lines.",
            hint="Give a file captured with `cat /proc/self/mountinfo` on the node.",
        )
    return mounts, ""


def _a_directory(path: Path, what: str) -> None:
    """A path given here that is no directory at all is unusable input (exit 2), not a
    failing check: there is nothing to probe (the node probe's SB201 says the same of a
    node's path; here the user typed it)."""
    gone = probe_lib.no_directory(str(path))
    if gone is not None:
        raise UsageError(
            f"{what} {path} {gone[0]}.",
            hint="Give the model directory, the one holding config.json "
            "(`servebook probe --find ROOT` lists them).",
        )


@app.command("probe", epilog=_EPILOG)
def probe(
    directory: Path | None = typer.Argument(
        None, metavar="DIR", help="Model directory to check (symlinks are followed)."
    ),
    expect_model: str | None = _unset(
        "--expect-model",
        "M",
        "Fail unless config.json is model M: one of its `architectures` or its "
        "`_name_or_path` (case-insensitive; `model_type` is not accepted, it names a family).",
    ),
    draft: Path | None = _unset("--draft", "DIR2", "Draft model directory: the same checks."),
    mountinfo: Path | None = _unset(
        "--mountinfo",
        "FILE",
        "Read mounts from FILE (a node's captured /proc/self/mountinfo) instead of this machine's.",
    ),
    find: Path | None = _unset("--find", "ROOT", "List model directories under ROOT instead."),
    max_depth: int | None = _unset(
        "--max-depth", "N", "--find: directory levels to descend (default 4)."
    ),
    timeout: float | None = _unset(
        "--timeout", "S", "--find: wall-time bound in seconds (default 10)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print findings as JSON."),
) -> None:
    """Check a model directory before deploying it: it exists, config.json is the expected
    model, every shard is present and intact (safetensors headers and sizes), no download is
    unfinished, every link resolves, a tokenizer is there, and the directory's own mount is
    a local filesystem.  With --find ROOT: list directories under ROOT that hold config.json
    plus weights, each with its verdict, bounded in depth and time (a bound hit is reported).
    Strictly read-only: creates, changes and deletes nothing.
    """
    problem = probe_lib.usage_problem(
        str(directory) if directory is not None else None,
        str(find) if find is not None else None,
        expect_model,
        str(draft) if draft is not None else None,
        max_depth,
        timeout,
    )
    if problem:
        raise UsageError(f"{problem}.  See `servebook probe --help`.")
    mounts, mount_error = _mounts(mountinfo)

    if find is not None:
        res = probe_lib.find_models(
            str(find),
            4 if max_depth is None else max_depth,
            10.0 if timeout is None else timeout,
            mounts,
            mount_error,
        )
        findings = to_findings(res.findings)
        extra = {"candidates": res.candidates, "search": res.search}
        title = f"model directories under {find}"
    else:
        assert directory is not None  # usage_problem guarantees it
        _a_directory(directory, "DIR")
        if draft is not None:
            _a_directory(draft, "--draft")
        found = probe_lib.probe(
            str(directory),
            expect_model,
            str(draft) if draft is not None else None,
            mounts,
            mount_error,
        )
        findings = to_findings(found)
        extra = {}
        title = f"probe {directory}"

    if json_out:
        print_json(to_json(findings, **extra))
    else:
        print_findings(findings, title=title, console=out)
    raise typer.Exit(exit_code(findings))
