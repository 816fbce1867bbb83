"""Fixtures several unit-test modules share."""

from __future__ import annotations

from pathlib import Path

import pytest

from servebook.bench.workload import HFTokenizer, load_tokenizer
from servebook.models.tiny import tokenizer_files


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
