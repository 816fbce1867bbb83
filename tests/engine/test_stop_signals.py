"""`timeout N servebook run`, cut off mid-sweep, leaves nothing behind (issue 32, finding 5).

Before: SIGTERM (what `timeout`, CI runners and systemd send) killed servebook at once, and
tiny-pd's prefill, decode and router ran on, recorded healthy by `servebook status`.  Now it
stops as Ctrl-C stops it: the deployment is taken down, the finished points and their report
are kept, and it exits 128 + 15.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servebook.backends.local import deployer as local
from servebook.backends.local.processes import group_members
from servebook.results.schema import RESULTS_NAME
from tests.engine.conftest import assert_all_stopped

pytestmark = pytest.mark.engine


@pytest.mark.timeout(900)
def test_sigterm_from_timeout_mid_sweep_leaves_no_process_and_no_status_entry(
    engine_home: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    # `timeout` signals the whole process group it runs, as it does when its time is up.
    p = subprocess.Popen(
        ["timeout", "800", sys.executable, "-m", "servebook", "run", "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while not (out / RESULTS_NAME).exists():  # the sweep's first point is written
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.5)
    dep = local.read_state("tiny-pd")
    assert dep is not None and len(dep.roles) == 3
    members = group_members([r.pid for r in dep.roles])
    assert members
    os.kill(p.pid, signal.SIGTERM)  # to `timeout`, which passes it on to its group
    stdout, stderr = p.communicate(timeout=180)
    said = " ".join((stdout + stderr).split())
    assert p.returncode == 128 + signal.SIGTERM, said
    assert "Traceback" not in said and "SIGTERM: stopping" in said, said
    assert "tiny-pd was taken down" in said, said
    assert_all_stopped(dep, members)
    assert local.read_state("tiny-pd") is None
    st = subprocess.run(
        [sys.executable, "-m", "servebook", "status"], capture_output=True, text=True, timeout=60
    )
    assert st.returncode == 2, st.stdout + st.stderr
    # what was measured is kept, with its report
    assert json.loads((out / RESULTS_NAME).read_text())["points"]
    assert (out / "report.html").is_file()
