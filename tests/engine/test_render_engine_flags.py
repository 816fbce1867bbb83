"""`servebook render` checks extra_engine_args with the installed vLLM's own argument
parser (issue 24 point 5): an unknown flag is exit 2 naming it and the closest real one,
nothing written; a real one renders.  Parsing only: no server is started."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult

pytestmark = pytest.mark.engine
Cli = Callable[..., CliResult]
MIXED = ["image=vllm/vllm-openai:v0.11.0", "node=gpu-node-1", "model_dir=/data/models/m"]


def _render(cli: Cli, out: Path, extra: str, prelude: tuple[str, ...] = ()) -> CliResult:
    sets = [a for s in [*MIXED, f"extra_engine_args={extra}"] for a in ("--set", s)]
    # The first check of a vLLM version builds its parser (minutes on a loaded machine).
    return cli("render", "vllm-mixed", *sets, "-o", str(out), timeout=900, prelude=prelude)


def test_an_unknown_engine_flag_is_refused_naming_the_closest_real_one(
    cli: Cli, tmp_path: Path
) -> None:
    pytest.importorskip("vllm")
    out = tmp_path / "deploy"
    r = _render(cli, out, "--max-num-seqz 256")
    assert r.returncode == 2, r.stderr
    assert "--max-num-seqz (did you mean --max-num-seqs?)" in r.stderr
    assert "parameter 'extra_engine_args'" in r.stderr
    assert not out.exists()


def test_a_real_engine_flag_renders_and_says_what_checked_it(cli: Cli, tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    r = _render(cli, tmp_path / "deploy", "--max-num-seqs 256 --enable_prefix_caching")
    assert r.returncode == 0, r.stderr
    assert "extra_engine_args checked against the argument parser of vLLM" in r.stderr


def test_without_vllm_the_check_says_it_did_not_run(cli: Cli, tmp_path: Path) -> None:
    """Where vLLM is not installed (here: hidden from the render's interpreter), the
    render still writes, and says the flags went unchecked; it never reads as a pass."""
    hide = ("import sys", "sys.modules['vllm'] = None")
    r = _render(cli, tmp_path / "deploy", "--max-num-seqz 256", prelude=hide)
    assert r.returncode == 0, r.stderr
    assert "extra_engine_args NOT checked against vLLM's argument parser" in r.stderr
    assert "vLLM is not installed" in r.stderr
