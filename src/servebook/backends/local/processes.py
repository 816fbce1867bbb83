"""Process bookkeeping for the local backend: start a role in a process group of its own,
tell whether a recorded process is still ours, stop exactly its group, read its log's end.

A PID is recorded with its kernel start time (``/proc/PID/stat``), so a recycled PID is
never mistaken for ours and never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from servebook import redact
from servebook.backends.state import RoleProcess


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 on: [state, ppid, pgrp, ...], or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return stat[stat.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def is_ours_alive(proc: RoleProcess) -> bool:
    fields = _stat_fields(proc.pid)
    if not fields:
        return False
    if proc.start_ticks is not None and int(fields[19]) != proc.start_ticks:
        return False  # the PID was recycled by an unrelated process
    return fields[0] != "Z"


def process_state(proc: RoleProcess) -> str:
    """A short description of the role's process for messages ("stopped (SIGSTOP)")."""
    fields = _stat_fields(proc.pid)
    if not fields or not is_ours_alive(proc):
        return f"pid {proc.pid} is not running"
    state = fields[0]
    names = {"T": "stopped (SIGSTOP)", "t": "stopped by a tracer", "D": "in uninterruptible I/O"}
    return f"pid {proc.pid} {names.get(state, 'running')}"


def group_members(pgids: Iterable[int]) -> set[int]:
    """Live (non-zombie) processes in the given process groups."""
    wanted = set(pgids)
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and int(fields[2]) in wanted and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies still count for killpg; look for a live member.
    return bool(group_members([pgid]))


@contextlib.contextmanager
def started_on(cpus: Iterable[int] | None) -> Iterator[None]:
    """Within the block, this thread may run only on ``cpus``, so a process started in it
    (and every process that one starts) is confined to them from its first instruction:
    Linux keeps the affinity mask per thread and a child inherits its creator's.  No window
    in which the role runs elsewhere, no ``preexec_fn`` (unsafe beside threads), and the
    thread's own mask is back as it was after the block.  Nothing to do for ``None``, or
    where the platform has no affinity call."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def spawn(
    argv: list[str],
    env: dict[str, str],
    log: Path,
    secret_env: dict[str, str] | None = None,
    cpus: Iterable[int] | None = None,
) -> subprocess.Popen[bytes]:
    """Start one role.  ``secret_env`` (an API key) reaches the process's environment only:
    not its command line, where `ps` shows it, and not the recorded state.  ``cpus``: the
    only cores the role and every process it starts may run on (:func:`started_on`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    # One log per run: verify reads it for failure signatures, and an earlier run's engine
    # death must not be reported as this one's.  The previous run's log is kept beside it.
    if log.exists():
        os.replace(log, log.with_suffix(".prev.log"))
    with open(log, "wb") as f:
        shown = redact.argv(argv)[0]
        f.write(f"# servebook: {datetime.now(UTC).isoformat()} starting: {shown}\n".encode())
        f.flush()
        with started_on(cpus):
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env, **(secret_env or {})},
                start_new_session=True,  # own process group: down stops exactly this tree
            )


def stop_process_group(proc: RoleProcess, grace_s: float = 15.0) -> str:
    """Stop the role's process group (the engine and the workers it spawned)."""
    # When the leader is gone its group may still hold children (vLLM's engine core).
    if not is_ours_alive(proc) and not _group_alive(proc.pid):
        return "not running"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(proc.pid)
        if not _group_alive(proc.pid):
            return "stopped"
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        _reap(proc.pid)
        if not _group_alive(proc.pid):
            return "killed"
        time.sleep(0.1)
    return "still running"


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def log_tail(path: str | Path, lines: int = 25) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    # Printed in up's failure messages and read into verify's findings: never a secret.
    return redact.text("\n".join(data.splitlines()[-lines:]))
