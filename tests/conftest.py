from __future__ import annotations

import asyncio
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


# vllm-pd's settings for preflight on the GPU nodes gpu-a and gpu-b (the unit fixtures'
# clusters; the test plane's nodes are renamed where used).
GPU_PD_SETS = [
    "image=vllm/vllm-openai:v0.11.0",
    "prefill_node=gpu-a",
    "decode_node=gpu-b",
    "prefill_model_dir=/models/llama",
    "decode_model_dir=/models/llama",
    # No RDMA on these fixture clusters: PD over TCP, stated and acknowledged.
    "fabric=tcp",
    "allow_tcp_kv=true",
]


@pytest.fixture(autouse=True)
def _default_event_loop_policy() -> object:
    """Each test starts with asyncio's default policy: a command run in-process installs
    uvloop's (bench's client does), whose child watcher kr8s's exec credential plugin
    cannot use, and a later test in the same process failed on it (NotImplementedError)."""
    yield
    asyncio.set_event_loop_policy(None)
