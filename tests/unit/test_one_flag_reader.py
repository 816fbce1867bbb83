"""One argv flag reader (issue 34): ``servebook.engines.vllm.flag_value``, argparse's
answer. Three readers disagreed on ``--served-model-name a --served-model-name b`` (b, b
and a: the record recovered from the cluster took the first); preflight's parallel sizes
and attach's sidecar flags now read through the same one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from servebook.engines.vllm import flag_value
from servebook.preflight.weights_fit import parallelism

SRC = Path(__file__).parents[2] / "src" / "servebook"

TWICE = ["vllm", "serve", "/m", "--served-model-name", "a", "--served_model_name=b"]


@pytest.mark.parametrize(
    ("argv", "flag", "want"),
    [
        (TWICE, "--served-model-name", "b"),  # the last, in any spelling, as argparse
        (["-tp", "2", "--tensor-parallel-size=4"], "--tensor-parallel-size", "4"),
        (["--port", "8000", "--vllm-port", "8200"], "--vllm-port", "8200"),  # not vLLM's own
        (["--secure-proxy=false"], "--secure-proxy", "false"),
        (["--port"], "--port", None),  # no value
    ],
)
def test_the_reader_gives_argparses_answer(argv: list[str], flag: str, want: str | None) -> None:
    assert flag_value(argv, flag) == want


def test_preflight_reads_the_short_spellings_through_it() -> None:
    p = parallelism(["-tp", "2", "-pp", "3", "--data-parallel-size=2", "-tp", "4"])
    assert (p.tensor, p.pipeline, p.data) == (4, 3, 2)


def test_no_other_module_defines_a_flag_reader() -> None:
    readers = [
        f"{path.relative_to(SRC)}:{node.name}"
        for path in sorted(SRC.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and "flag_value" in node.name
    ]
    assert readers == ["engines/vllm.py:flag_value"], readers
