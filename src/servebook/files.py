"""Files servebook writes and reads back: atomically, and with errors that name them."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from servebook import inputs
from servebook.errors import UsageError

M = TypeVar("M", bound=BaseModel)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """``path`` holds the old content or the new, never half (temp file, fsync, rename,
    fsync of the directory so the rename itself is durable).  The file gets the mode the
    umask gives a new file (mkstemp's own 0600 would hide a report from its readers)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


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
