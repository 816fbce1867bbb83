"""Files servebook writes and reads back: atomically, and with errors that name them; and
the records it keeps on this machine, redacted and private."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from servebook import inputs, redact
from servebook.errors import UsageError

M = TypeVar("M", bound=BaseModel)


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
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask() if mode is None else mode)
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


def write_record(path: str | Path, record: BaseModel) -> None:
    """A record servebook keeps on this machine (a deployment's state, an attached
    deployment's record), written atomically, readable by its owner only, and redacted
    (``servebook.redact.scrub``): an engine's ``--api-key``, a token in its environment or
    in a URL is kept as ``<redacted>``, never in clear.  Nothing reads a secret back from a
    record: a command that needs the key takes it from ``--api-key`` or the environment
    (``servebook.auth``), and a redacted flag still says that one was given."""
    doc, _ = redact.scrub(record.model_dump(mode="json"))
    write_atomic(path, json.dumps(doc, indent=2, ensure_ascii=False), mode=PRIVATE)


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
