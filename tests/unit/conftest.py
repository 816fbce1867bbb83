"""Fixtures several unit-test modules share."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from servebook import auth, redact
from servebook.bench.workload import HFTokenizer, load_tokenizer
from servebook.models.tiny import tokenizer_files
from tests.conftest import CliResult


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's tokenizer files (tokenizer.json adds <s>, as vLLM counts it)."""
    d = tmp_path_factory.mktemp("tiny-tokenizer")
    for name, data in tokenizer_files().items():
        (d / name).write_bytes(data)
    return d


@pytest.fixture(scope="module")
def tok(tiny_dir: Path) -> HFTokenizer:
    return load_tokenizer(tiny_dir)


@pytest.fixture
def no_secrets_known(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No API key in the environment or given, and none remembered by the redactor (it
    remembers for the life of the process): what a test redacts, patterns alone find,
    unless the test hands servebook the key as a command does."""
    for name in auth.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(auth, "_given", None)
    redact.forget_all()
    yield
    redact.forget_all()


# --- hostile input files (the reliability probe of 2026-12-04, tests/unit/test_cli_bad_files.py
# and test_inputs.py) -------------------------------------------------------------------

# A child process that reads /dev/zero without a bound stops at this much memory
# (MemoryError) instead of taking the machine's.
MEMORY_BOUND = [
    "import resource",
    "resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))",
]


@pytest.fixture
def bounded_cli(cli: Callable[..., CliResult]) -> Callable[..., CliResult]:
    """``cli`` in a child bounded in memory (``MEMORY_BOUND``) and to 60 s: a read that
    hangs or never ends fails the test instead of holding the machine."""

    def run(*args: str, timeout: float = 60) -> CliResult:
        return cli(*args, timeout=timeout, prelude=MEMORY_BOUND)

    return run


def alias_bomb(levels: int = 9, indent: str = "  ") -> str:
    """YAML lines of anchors, each level aliasing the one before ten times: a few hundred
    bytes that expand to 10**(levels + 1) scalars."""
    lines = [f"{indent}a: &a [x, x, x, x, x, x, x, x, x, x]"]
    prev = "a"
    for i in range(levels):
        lines.append(f"{indent}l{i}: &l{i} [" + ", ".join([f"*{prev}"] * 10) + "]")
        prev = f"l{i}"
    return "\n".join(lines) + "\n"


def nested_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_yaml(depth: int) -> str:
    """Mappings ``depth`` levels deep (the probe's 3000 nested mappings), in flow style so
    that the text stays small."""
    return "k: " + "{k: " * depth + "v" + "}" * depth + "\n"


@pytest.fixture
def hostile(tmp_path: Path) -> Callable[[str, str], Path]:
    """``hostile(kind, name)``: a file ``name`` under a directory of its own, of ``kind``:
    fifo, dev-zero (a symlink to /dev/zero), latin1 (one byte that is not UTF-8), deep-json
    and deep-yaml (100,000 and 3,000 levels), bomb (a YAML alias bomb under a key)."""
    made = tmp_path / "hostile"
    made.mkdir(exist_ok=True)

    def make(kind: str, name: str) -> Path:
        p = made / name
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "dev-zero":
            p.symlink_to("/dev/zero")
        elif kind == "latin1":
            p.write_bytes(b"gpus: caf\xe9\n")
        elif kind == "deep-json":
            p.write_text(nested_json(100_000))
        elif kind == "deep-yaml":
            p.write_text(nested_yaml(3000))
        elif kind == "bomb":
            p.write_text(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata:\n" + alias_bomb()
            )
        else:
            raise ValueError(kind)
        return p

    return make
