"""The command line run in this process, as a child would run it (``tests/unit/conftest.py``'s
``cli``): each start of ``python -c 'from servebook.cli import main; main()'`` imported
servebook again, about a second of CPU, and the unit tests started several hundred.

What a child has of its own is given to the command and taken back after it: the
arguments, the environment, the working directory, file descriptors 0, 1 and 2 (stdin
/dev/null; stdout and stderr files, so that what a process the command starts writes is
captured as a pipe would capture it), the signal handlers, servebook's process-wide state
(the redactor's remembered secrets, the API key given, the stop signal recorded, the event
loop policy), and the entries of a ``PYTHONPATH`` given, on ``sys.path``.  What ends a
child ends the command here: ``sys.exit``'s code, or an uncaught exception's traceback on
stderr and exit 1.  Where a child is the point (signals, process groups, a bound on its
memory or files, another process's hash seeds), tests start one."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from typing import IO, Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    before = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def _stream(fd: int, mode: str, **kw: Any) -> io.TextIOWrapper:
    """A text stream on ``fd`` that leaves it open when closed."""
    return io.TextIOWrapper(open(fd, mode, closefd=False), encoding="utf-8", **kw)


@contextlib.contextmanager
def _fds() -> Iterator[tuple[IO[bytes], ...]]:
    """fds 0, 1, 2 and ``sys.stdin``, ``sys.stdout``, ``sys.stderr`` on /dev/null and two
    files, as a child started with ``capture_output=True`` has them."""
    files = (
        open(os.devnull, "rb"),  # noqa: SIM115 - closed below
        tempfile.TemporaryFile(),  # noqa: SIM115
        tempfile.TemporaryFile(),  # noqa: SIM115
    )
    streams = (sys.stdin, sys.stdout, sys.stderr)
    for s in streams[1:]:
        s.flush()
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    try:
        for fd, f in enumerate(files):
            os.dup2(f.fileno(), fd)
        # As a child's interpreter sets them up (a C.UTF-8 locale, pipes).
        sys.stdin = _stream(0, "rb", errors="strict")
        sys.stdout = _stream(1, "wb", errors="surrogateescape")
        sys.stderr = _stream(2, "wb", errors="backslashreplace", line_buffering=True)
        try:
            yield files
        finally:
            for s in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    s.flush()
    finally:
        sys.stdin, sys.stdout, sys.stderr = streams
        for fd, s in enumerate(saved):
            os.dup2(s, fd)
            os.close(s)
        files[0].close()


def _read(f: IO[bytes]) -> str:
    f.seek(0)
    data = f.read()
    f.close()
    # As ``subprocess.run(text=True)`` decodes: universal newlines.
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8").read()


@contextlib.contextmanager
def _hidden(names: Sequence[str]) -> Iterator[None]:
    """The modules ``names`` cannot be imported (``sys.modules[name] = None``, as a child's
    prelude hides one), and are back after."""
    before = {n: sys.modules[n] for n in names if n in sys.modules}
    for n in names:
        sys.modules[n] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for n in names:
            if n in before:
                sys.modules[n] = before[n]
            else:
                sys.modules.pop(n, None)


@contextlib.contextmanager
def _python_path(value: str | None) -> Iterator[None]:
    """The entries of a ``PYTHONPATH`` given to the command first on ``sys.path``, as a
    child's would be (``engine_standin.vllm_package`` puts a stand-in ``vllm`` there, which
    ``up`` looks for); after, they are gone, and so is every module imported from them."""
    added = [p for p in (value or "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = added
    importlib.invalidate_caches()
    try:
        yield
    finally:
        for p in added:
            sys.path.remove(p)
        roots = tuple(os.path.join(os.path.abspath(p), "") for p in added)
        for name, module in list(sys.modules.items()):
            where = getattr(module, "__file__", None)
            if roots and where and os.path.abspath(where).startswith(roots):
                del sys.modules[name]
        importlib.invalidate_caches()


def run_cli(
    args: tuple[str, ...], env: dict[str, str], hide: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """``servebook ARGS`` with ``env`` added to the environment and the modules ``hide``
    not importable; a ``CompletedProcess`` as ``subprocess.run(capture_output=True,
    text=True)`` gives one."""
    from servebook import auth, cli, redact, stopping

    handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    known = set(redact._known)
    given = auth._given
    argv, cwd = sys.argv, os.getcwd()
    code: int | str | None = 0
    redact.forget_all()
    auth._given = None
    stopping.stopped_by.clear()
    stopping._polling[0] = 0
    asyncio.set_event_loop_policy(None)
    try:
        with _environment(env), _python_path(env.get("PYTHONPATH")), _hidden(hide), _fds() as files:
            sys.argv = ["-c", *args]
            try:
                cli.main()
            except SystemExit as e:
                code = e.code
            except BaseException:  # what a child's interpreter prints before it exits 1
                traceback.print_exc()
                code = 1
            if code is None:
                code = 0
            elif not isinstance(code, int):  # sys.exit("message"): printed, exit 1
                print(code, file=sys.stderr)
                code = 1
    finally:
        sys.argv = argv
        os.chdir(cwd)
        for sig, h in handlers.items():
            if h is not None:
                signal.signal(sig, h)
        stopping.stopped_by.clear()
        stopping._polling[0] = 0
        redact.forget_all()
        redact.remember(*known)
        auth._given = given
        asyncio.set_event_loop_policy(None)
    return subprocess.CompletedProcess(["servebook", *args], code, _read(files[1]), _read(files[2]))
