from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest


@pytest.fixture
def sb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated SERVEBOOK_HOME for this test."""
    home = tmp_path / "sbhome"
    monkeypatch.setenv("SERVEBOOK_HOME", str(home))
    return home


CliResult = subprocess.CompletedProcess[str]


@pytest.fixture
def cli(sb_home: Path) -> Callable[..., CliResult]:
    """Run `python -m servebook ARGS` in a subprocess (real exit codes, real stderr)."""

    def run(
        *args: str,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        prelude: Sequence[str] = (),
    ) -> CliResult:
        code = "\n".join([*prelude, "from servebook.cli import main", "main()"])
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "SERVEBOOK_HOME": str(sb_home), "COLUMNS": "200", **(env or {})},
        )

    return run
