"""Write failures are named errors, and leave nothing half-written (issue 33, D25): a
report whose last file could not be written left its plots without it, a traceback; an
output path through a regular file, or an existing file given as a directory, were
tracebacks; a results file that cannot be rewritten mid-sweep was a traceback too.  The
failure is real: the child process may not grow a file past a limit (RLIMIT_FSIZE), the way
a full disk refuses a write."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.conftest import CliResult
from tests.unit.conftest import file_size_limit
from tests.unit.result_runs import CPU, RERUN, A

Cli = Callable[..., CliResult]


def words(r: CliResult) -> str:
    return " ".join(r.stderr.split())


def test_a_report_that_cannot_be_written_whole_leaves_nothing(cli: Cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(CPU, run)
    # Each plot is under 100 kB; report.html, which embeds them, is not.
    r = cli("report", str(run), prelude=file_size_limit(100_000))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert f"cannot write: {run / 'report.html'}: file too large" in words(r)
    assert sorted(p.name for p in run.iterdir()) == ["results.json"]  # no plots, no report.md
    # Without the limit the same command writes all of it.
    assert cli("report", str(run)).returncode == 0
    assert (run / "report.html").is_file() and (run / "plots").is_dir()


def test_report_and_compare_outputs_through_a_file_are_exit_2(cli: Cli, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x\n")
    r = cli("report", str(CPU), "-o", str(blocker / "out"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert str(blocker / "out") in words(r)
    r = cli("compare", str(A), str(RERUN), "--variable", "seed", "-o", str(blocker))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"-o {blocker}: exists and is not a directory" in words(r)
    assert blocker.read_text() == "x\n"


WRITER = """
import resource, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from servebook.errors import ServebookError
from servebook.results.store import ResultsWriter
from tests.unit.conftest import a_point, a_provenance
out = Path(sys.argv[1])
w = ResultsWriter(out, a_provenance())
w.add(a_point(1, 0))
size = (out / "results.json").stat().st_size
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))  # the disk is full from here on
try:
    w.add(a_point(4, 0))
except ServebookError as e:
    print(type(e).__name__, e.exit_code, e, sep="|")
"""


def test_a_results_file_that_cannot_be_rewritten_mid_sweep_is_named_and_kept(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [sys.executable, "-c", WRITER, str(out), str(repo)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    kind, code, message = r.stdout.strip().split("|", 2)
    assert (kind, code) == ("WriteFailed", "2"), r.stdout
    assert f"{out / 'results.json'}: file too large" in message
    assert "holds the points written before this one" in message
    doc = json.loads((out / "results.json").read_text())
    assert [p["concurrency"] for p in doc["points"]] == [1]
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.lock"]
