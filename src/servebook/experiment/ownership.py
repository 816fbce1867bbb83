"""What an experiment's run owns in its directory, and that it is the only run writing
there (issue 44, point 1; hostile probe D1, D2, D12c).

* **One run at a time.**  ``DIR/experiment.lock`` (a flock naming its holder's pid) is
  held for the whole run; a second run of the directory (two ``--resume`` at once) is
  refused, exit 2, naming the first's pid, before it reads or writes anything there.
* **A new experiment takes nothing it did not make.**  It starts only where there is no
  ``arms/`` (what it writes into): a directory of someone else's files is never taken for
  an interrupted experiment's.
* **Every block directory carries its maker.**  The runner makes ``arms/ARM/block-N``
  whole with a marker inside (``MARKER``: the experiment's tag, the block and the arm)
  before its bench writes there; a block directory left by an interrupted bench is removed
  only when it carries this experiment's marker, anything else is refused naming it.
* **Never through a symbolic link.**  ``arms``, ``arms/ARM`` and ``arms/ARM/block-N`` must
  be directories of DIR itself: a link out of DIR is refused, nothing written or removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servebook.errors import UsageError
from servebook.files import exclusive

LOCK_NAME = "experiment.lock"
MARKER = ".servebook-block"


@contextlib.contextmanager
def held(out_dir: Path) -> Iterator[None]:
    """The run's hold on ``out_dir`` (made when missing); a second holder is refused."""
    if os.path.lexists(out_dir) and not out_dir.is_dir():
        raise UsageError(
            f"-o {out_dir}: exists and is not a directory; nothing was written",
            hint="give a directory (new, or an experiment's to --resume) for the output",
        )
    path = out_dir / LOCK_NAME

    def refused(holder: str) -> UsageError:
        return UsageError(
            f"{out_dir} is being run by another `servebook experiment` "
            f"({f'pid {holder}' if holder else 'its pid not written yet'}, {LOCK_NAME}); two "
            "runs of one directory would run its schedule twice, each removing the other's "
            "blocks",
            hint=f"wait for it to end, or stop it (kill {holder or 'PID'}), then run this "
            "command again",
        )

    entered = False
    try:
        with exclusive(path, refused):
            entered = True
            yield
    except OSError as e:
        if entered:  # the run's own
            raise
        raise UsageError(
            f"-o {out_dir}: cannot take {path} ({e.strerror or e}); nothing was run",
            hint="choose a directory you can write, and no symbolic link at that name",
        ) from None


def check_new(out_dir: Path) -> None:
    """A new experiment's directory holds no ``arms/`` it would write into."""
    arms = out_dir / "arms"
    if os.path.lexists(arms):
        raise UsageError(
            f"{arms} exists, and no experiment.json says this experiment made it: servebook "
            "writes a new experiment's results there and removes nothing it did not make; "
            "nothing was run",
            hint="give a new or empty -o DIR (or move arms/ out of it)",
        )


def _mark(tag: str, arm: str, block: int) -> dict[str, Any]:
    return {"made-by": "servebook experiment", "tag": tag, "arm": arm, "block": block}


def _real_dirs(out_dir: Path, where: Path) -> None:
    """Each of ``arms``, ``arms/ARM``, ``arms/ARM/block-N`` is absent or a directory of
    ``out_dir`` itself (no symbolic link)."""
    rel = where.relative_to(out_dir)
    path = out_dir
    for part in rel.parts:
        path = path / part
        if path.is_symlink():
            raise UsageError(
                f"{path} is a symbolic link (to {os.readlink(path)}): an experiment writes "
                f"and removes only inside {out_dir}; nothing was run through it",
                hint=f"replace the link with a directory of {out_dir}, or give another -o DIR",
            )
        if path.exists() and not path.is_dir():
            raise UsageError(
                f"{path} is not a directory: an experiment keeps its results there",
                hint="move it away, then run the same command again",
            )


def _ours(where: Path, tag: str, arm: str, block: int) -> bool:
    marker = where / MARKER
    if marker.is_symlink() or not marker.is_file():
        return False
    try:
        return bool(json.loads(marker.read_text()) == _mark(tag, arm, block))
    except (OSError, ValueError):
        return False


def check(out_dir: Path, where: Path, tag: str, arm: str, block: int) -> None:
    """``where`` may be made here: absent, or this experiment's own block directory."""
    _real_dirs(out_dir, where)
    if os.path.lexists(where) and not _ours(where, tag, arm, block):
        raise UsageError(
            f"{where} exists and was not made by this experiment (it holds no {MARKER} of "
            "its own): servebook removes only what it made; nothing was removed",
            hint="move it out of the experiment's directory, then run the same command again",
        )


def fresh_block(out_dir: Path, where: Path, tag: str, arm: str, block: int) -> None:
    """``where`` made anew, with this experiment's marker in it: an interrupted bench's
    directory (this experiment's) is removed first; any other is refused."""
    check(out_dir, where, tag, arm, block)
    if os.path.lexists(where):
        shutil.rmtree(where)
    where.parent.mkdir(parents=True, exist_ok=True)
    made = Path(tempfile.mkdtemp(prefix=f".{where.name}.", suffix=".tmp", dir=where.parent))
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(made, 0o777 & ~mask)  # as a directory made by mkdir (mkdtemp's is 0700)
    (made / MARKER).write_text(json.dumps(_mark(tag, arm, block)) + "\n")
    os.rename(made, where)
