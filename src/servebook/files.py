"""Files servebook writes and reads back: atomically, and with errors that name them; and
the records it keeps on this machine, redacted and private."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from servebook import inputs, redact
from servebook.errors import ServebookError, UsageError

M = TypeVar("M", bound=BaseModel)


class WriteFailed(ServebookError):
    """A file servebook writes could not be written (no space, no permission, a path
    through a regular file): exit 2, naming the file and the reason; what was there
    before is left as it was."""

    label = "cannot write"


def write_failed(path: Path, e: OSError) -> WriteFailed:
    why = {
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "disk quota exceeded",
        errno.EFBIG: "file too large for this process's limit (ulimit -f)",
        errno.EROFS: "read-only file system",
    }.get(e.errno or 0, e.strerror or str(e))
    return WriteFailed(
        f"{path}: {why}; nothing of this write was left half-done",
        hint="free space, or choose a directory you can write (-o DIR), and run it again",
    )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# A record of this machine's deployments: its owner's alone.
PRIVATE = 0o600


def write_atomic(path: str | Path, data: str | bytes, mode: int | None = None) -> None:
    """``path`` holds the old content or the new, never half (temp file, fsync, rename,
    fsync of the directory so the rename itself is durable).  The file gets ``mode``, else
    the mode the umask gives a new file (mkstemp's own 0600 would hide a report from its
    readers)."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise write_failed(path, e) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise write_failed(path, e) from None
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def hold_lock(path: Path) -> tuple[int, bool]:
    """(fd of ``path``, whether this process now holds its flock): the kernel drops it when
    the holder exits, however it exits.  A holder that finishes removes the file (and may
    remove its directory), so one opened just before that is not the lock any more: take
    the file that is there now."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, PRIVATE)
        except FileNotFoundError:
            continue  # its directory went between the mkdir and the open
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return fd, False
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd, True
        os.close(fd)


@contextlib.contextmanager
def exclusive(
    path: Path,
    refused: Callable[[str], Exception],
    after: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Held by this process for the block (``hold_lock``, its pid written in ``path``); a
    second holder gets ``refused(PID)`` raised (the first's pid as written, '' when it has
    not written it yet).  On the way out the holder removes ``path``, then runs ``after``."""
    fd, mine = hold_lock(path)
    try:
        if not mine:
            holder = os.read(fd, 32).decode("ascii", "replace").strip()
            raise refused(holder if holder.isdigit() else "")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        try:
            yield
        finally:
            path.unlink(missing_ok=True)
            if after is not None:
                after()
    finally:
        os.close(fd)


def write_record(path: str | Path, record: BaseModel) -> None:
    """A record servebook keeps on this machine (a deployment's state, an attached
    deployment's record), written atomically, readable by its owner only, and redacted
    (``servebook.redact.scrub``): an engine's ``--api-key``, a token in its environment or
    in a URL is kept as ``<redacted>``, never in clear.  Nothing reads a secret back from a
    record: a command that needs the key takes it from ``--api-key`` or the environment
    (``servebook.auth``), and a redacted flag still says that one was given."""
    doc, _ = redact.scrub(record.model_dump(mode="json"))
    write_atomic(path, json.dumps(doc, indent=2, ensure_ascii=False), mode=PRIVATE)


def write_files(out_dir: Path, files: Mapping[str, str | bytes]) -> None:
    """Write ``files`` (paths relative to ``out_dir`` -> content) all or none: each goes
    to a staging directory inside ``out_dir`` first, and only once every one is written
    whole are they renamed into place (a rename needs no space).  A full disk while
    writing leaves ``out_dir`` as it was (it left a report's plots without the report)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(
            f"-o {out_dir}: exists and is not a directory; nothing was written",
            hint="give a directory (new or existing) for the output",
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".servebook-", suffix=".tmp", dir=out_dir))
    except OSError as e:
        raise write_failed(out_dir, e) from None
    try:
        for rel, data in files.items():
            target = stage / rel
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
                os.chmod(target, 0o666 & ~_umask())
            except OSError as e:
                raise write_failed(out_dir / rel, e) from None
        for rel in files:
            final = out_dir / rel
            try:
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(stage / rel, final)
            except OSError as e:
                raise write_failed(final, e) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def read_model(path: Path, model: type[M], what: str, fix: str) -> M | None:
    """A pydantic document from a JSON file servebook wrote; None when there is none, and
    unusable input (exit 2) naming the file, ``what`` it should be and the ``fix`` when it
    is not one."""
    if not path.is_file():
        return None
    try:
        return model.model_validate_json(inputs.read_bytes(path, what))
    except ValueError as e:
        raise UsageError(f"{path} is not {what} ({type(e).__name__}). {fix}") from None
