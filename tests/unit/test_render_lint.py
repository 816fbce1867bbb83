"""`servebook render` refuses what `servebook lint` fails: the same rules run on the files
render is about to write, and a failing finding is exit 2 with nothing written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from servebook.commands.render import render_files
from servebook.errors import UsageError
from tests.conftest import CliResult

Cli = Callable[..., CliResult]
MIXED = ["image=vllm/vllm-openai:v0.11.0", "node=gpu-node-1", "model_dir=/data/models/m"]
KEY = "sk-live-0123456789abcdef0123456789abcdef"


def test_an_api_key_in_extra_engine_args_is_refused_pointing_at_api_key_secret(
    cli: Cli, tmp_path: Path
) -> None:
    out = tmp_path / "deploy"
    sets = [a for s in MIXED for a in ("--set", s)]
    r = cli(
        "render", "vllm-mixed", *sets, "--set", f"extra_engine_args=--api-key {KEY}", "-o", str(out)
    )
    assert r.returncode == 2, r.stdout
    assert not out.exists() and not list(tmp_path.iterdir())
    assert "SB114" in r.stderr and "api_key_secret" in r.stderr
    assert "10-vllm-mixed.yaml" in r.stderr
    assert KEY not in r.stderr + r.stdout
    # Without -o nothing reaches stdout (and so nothing reaches `| kubectl apply -f -`).
    piped = cli("render", "vllm-mixed", *sets, "--set", f"extra_engine_args=--api-key {KEY}")
    assert piped.returncode == 2 and piped.stdout == ""


def test_the_refusal_names_every_failing_finding() -> None:
    with pytest.raises(UsageError) as e:
        render_files("vllm-mixed", [*MIXED, f"extra_engine_args=--api-key={KEY}"])
    assert e.value.exit_code == 2
    assert "SB114" in str(e.value) and "api_key_secret" in (e.value.hint or "")


def test_a_render_lint_passes_is_written(tmp_path: Path) -> None:
    _, _, files = render_files("vllm-mixed", [*MIXED, "extra_engine_args=--max-num-seqs 64"])
    assert "--max-num-seqs" in files["10-vllm-mixed.yaml"]
