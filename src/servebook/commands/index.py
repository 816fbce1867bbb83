"""Every command: the module of ``servebook.commands`` that defines it, and the line
``servebook --help`` lists it with, in --help's order.

Nothing is imported here: ``--help``, ``--version``, a mistyped command and the shell's
completion of a command's name are answered from this table, without importing any
command (importing all of them cost about a second of CPU, numpy, pydantic and
kubernetes-validate among them, before one line was printed).  A command's module is
imported when the command line names it (``servebook.cli.load``,
``servebook.commands.CommandGroup``).

``summary`` is the first paragraph of the command's own help, on one line, as --help
shows it; ``tests/unit/test_cli_lazy.py`` holds the two equal, and this table to what the
modules register.
"""

from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    module: str  # of servebook.commands
    summary: str


COMMANDS: dict[str, Command] = {
    "attach": Command(
        "attach",
        "Record a deployment servebook did not make, so that `verify NAME`, `bench NAME`, "
        "`status NAME` and `report` work on it as on servebook's own.",
    ),
    "detach": Command(
        "attach",
        "Forget an attached deployment: its record on this machine goes; nothing on the "
        "deployment is touched (servebook never stops what it did not make).",
    ),
    "verify": Command(
        "verify",
        "Prove a deployment works, from the servers' own counters.",
    ),
    "bench": Command(
        "bench",
        "Measure a deployment (or any OpenAI-compatible server with --url) with a load sweep "
        "whose numbers reproduce.",
    ),
    "up": Command(
        "deploy",
        "Bring a recipe up and wait until it is ready.",
    ),
    "status": Command(
        "deploy",
        "Show a deployment's roles and whether each can serve.",
    ),
    "down": Command(
        "deploy",
        "Stop exactly what a deployment started.",
    ),
    "run": Command(
        "deploy",
        "The main job: [preflight ->] up -> verify -> a short bench sweep -> report -> down.",
    ),
    "experiment": Command(
        "experiment",
        "Compare several arms (recipes brought up fresh per block, attached deployments, or "
        "URLs) in blocks: each block runs every arm once, in a randomized, counterbalanced "
        "order (seeded, recorded), each recipe arm up -> warm-up -> verify -> bench -> down. "
        "Arms may differ only in the file's variable: (topology, engine_args, packages, ...);"
        " any other difference (an image, the model) is refused before anything starts, as "
        "`servebook compare` refuses it. DIR/experiment.json is rewritten atomically after "
        "every bench (--resume continues it with the same schedule; a stop prints the command"
        " that does) and holds the schedule, each arm's results directories, the ratios to "
        "the baseline per level (output tok/s, per accelerator, TPOT p50) with 95% intervals "
        "that resample blocks, the crossovers and the baseline's drift. `servebook report "
        "DIR` renders it.",
    ),
    "checks": Command(
        "lint",
        "List every check servebook runs (lint, preflight, verify, bench): id, title, why it "
        "matters in production, and the fix.",
    ),
    "lint": Command(
        "lint",
        "Find the known traps in serving manifests, recipes and docs before they reach a "
        "cluster. Exit 0: nothing failing; 1: a failing finding; 2: unreadable input.",
    ),
    "preflight": Command(
        "preflight",
        "Check a cluster for a recipe before deploying: in seconds, and changing nothing.",
    ),
    "probe": Command(
        "probe",
        "Check a model directory before deploying it: it exists, config.json is the expected "
        "model, every shard is present and intact (safetensors headers and sizes), no "
        "download is unfinished, every link resolves, a tokenizer is there, and the "
        "directory's own mount is a local filesystem.  With --find ROOT: list directories "
        "under ROOT that hold config.json plus weights, each with its verdict, bounded in "
        "depth and time (a bound hit is reported). Strictly read-only: creates, changes and "
        "deletes nothing.",
    ),
    "render": Command(
        "render",
        "Render a recipe to Kubernetes manifests that need no editing.",
    ),
    "report": Command(
        "report",
        "Write report.md, a self-contained report.html and PNG/SVG plots from results files.",
    ),
    "compare": Command(
        "report",
        "Put run B beside run A: every figure of B relative to A with a 95% CI and a verdict "
        "per point (better / worse / not distinguishable), after checking that the runs "
        "differ only in the variable under test.",
    ),
    "recipes": Command(
        "recipes",
        "List the built-in recipes, or show one resolved to exact command lines.",
    ),
    "model": Command(
        "model",
        "Make models for demos and tests (nothing is downloaded).",
    ),
}
