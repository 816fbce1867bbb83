"""How long the command line takes to answer: CPU time (user + system) of ``servebook
--version``, ``--help``, ``recipes`` and the shell's completion of a command's name, each
the median of ``--runs`` starts, against issue 48's target of 150 ms each on the 2-core
machine; then, for reference, commands that import their own module (a command's options
completed, ``verify --help``, ``status``).

Each start is what the console script runs (``servebook.entry.main``, ``sys.argv[0]``
``servebook``), in a fresh interpreter with ``SERVEBOOK_HOME`` an empty directory and
stdout a pipe, its bytecode written (the first, unmeasured start writes it, as an install
does); its CPU time is the child's rusage.  The floor printed first is the
interpreter's own start (``python -c pass``), typer's import, which every command but
``--version`` pays, and with its Rich help (``typer.rich_utils``), which every ``--help``
pays.

    python benchmarks/cli_latency.py                      # this checkout (src/)
    python benchmarks/cli_latency.py --before /other/src  # and another, in the same run
    python benchmarks/cli_latency.py --profile            # what each light one imports

CPU time on a shared machine grows with the others' load (caches, the hypervisor): the
load average is printed beside the figures, and a figure is only compared with one of the
same run.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
TARGET_MS = 150.0
RUN = "import sys; sys.argv[0] = 'servebook'; from servebook.entry import main; main()"


def _complete(words: str) -> dict[str, str]:
    """The environment typer's bash completion script gives the program on Tab."""
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    env = {"COMP_WORDS": words, "COMP_CWORD": str(cword)}
    return {"_SERVEBOOK_COMPLETE": "complete_bash", **env}


#: (label, arguments, extra environment, held to the target)
COMMANDS: list[tuple[str, list[str], dict[str, str], bool]] = [
    ("servebook --version", ["--version"], {}, True),
    ("servebook --help", ["--help"], {}, True),
    ("servebook recipes", ["recipes"], {}, True),
    ("completion: servebook <Tab>", [], _complete("servebook "), True),
    ("completion: servebook recipes <Tab>", [], _complete("servebook recipes "), True),
    ("completion: servebook verify --<Tab>", [], _complete("servebook verify --"), False),
    ("servebook verify --help", ["verify", "--help"], {}, False),
    ("servebook status (none recorded)", ["status"], {}, False),
]

FLOOR: list[tuple[str, str]] = [
    ("python -c pass", "pass"),
    ("python -c 'import typer'", "import typer"),
    ("python -c 'import typer.rich_utils'", "import typer.rich_utils"),
]


def cpu_ms(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU ms, wall ms) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return 1000 * cpu, 1000 * wall


def measure(argv: list[str], env: dict[str, str], runs: int) -> tuple[float, float, float]:
    """(median CPU ms, min CPU ms, median wall ms) over ``runs``, after one unmeasured
    start (it fills the OS's page cache and Python's bytecode cache)."""
    cpu_ms(argv, env)
    samples = [cpu_ms(argv, env) for _ in range(runs)]
    cpus = [c for c, _ in samples]
    return statistics.median(cpus), min(cpus), statistics.median(w for _, w in samples)


def modules(src: Path, args: list[str], env: dict[str, str]) -> int:
    """How many modules the command had imported when it exited."""
    code = (
        "import atexit, os, sys\n"
        "atexit.register(lambda: os.write(2, f'\\n@modules {len(sys.modules)}\\n'.encode()))\n"
        + RUN
    )
    r = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=_env(src, env),
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.findall(r"@modules (\d+)", r.stderr)
    return int(found[-1]) if found else -1


def import_profile(src: Path, args: list[str], env: dict[str, str], top: int = 8) -> str:
    """The top-level packages that took the most import time (``-X importtime``, self
    time summed per package): where a figure over the target goes."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", RUN, *args],
        env=_env(src, env),
        capture_output=True,
        text=True,
        check=False,
    )
    per: Counter[str] = Counter()
    for m in re.finditer(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", r.stderr):
        per[m.group(2).split(".")[0]] += int(m.group(1))
    total = sum(per.values()) / 1000
    parts = ", ".join(f"{name} {us / 1000:.0f}" for name, us in per.most_common(top))
    return f"imports {total:.0f} ms: {parts}"


_HOME = tempfile.mkdtemp(prefix="servebook-cli-latency-")


def _env(src: Path, extra: dict[str, str]) -> dict[str, str]:
    # An installed servebook has its bytecode: PYTHONDONTWRITEBYTECODE (set on the build
    # machine) would have every start compile the sources again, ~20 ms more.
    drop = ("_SERVEBOOK_", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(PYTHONPATH=str(src), SERVEBOOK_HOME=_HOME, COLUMNS="100", **extra)
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="measured starts per command")
    ap.add_argument("--src", type=Path, default=SRC, help="the servebook sources measured")
    ap.add_argument("--before", type=Path, help="another checkout's src/ measured in the same run")
    ap.add_argument("--profile", action="store_true", help="each light command's imports")
    a = ap.parse_args()

    load = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"python {sys.version.split()[0]} ({sys.executable}); {a.runs} runs each, median")
    print()
    for label, code in FLOOR:
        med, low, _ = measure([sys.executable, "-c", code], _env(a.src, {}), a.runs)
        print(f"  {label:<40} {med:6.0f} ms CPU (min {low:.0f})")
    print()
    sources = [("before", a.before), ("now", a.src)] if a.before else [("now", a.src)]
    head = "".join(f"{name:>16}" for name, _ in sources)
    print(f"  {'command':<40}{head}   modules   target {TARGET_MS:.0f} ms")
    for label, args, extra, held in COMMANDS:
        cells, counts, met = [], [], ""
        for _, src in sources:
            med, low, _ = measure([sys.executable, "-c", RUN, *args], _env(src, extra), a.runs)
            cells.append(f"{med:7.0f} (min {low:3.0f})")
            counts.append(str(modules(src, args, extra)))
            met = ("met" if med <= TARGET_MS else "NOT met") if held else "-"
        print(f"  {label:<40}{''.join(f'{c:>16}' for c in cells)}   {'/'.join(counts):>7}   {met}")
        if a.profile and held:
            print(f"      {import_profile(a.src, args, extra)}")
    load = os.getloadavg()
    print(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
