"""servebook.inputs, the one reader of files a user hands servebook: what it refuses, in
which words, and that what it accepts is read whole.  Real files throughout: FIFOs, a
symlink to /dev/zero, sparse files, alias bombs and nesting written out."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from servebook import inputs
from servebook.errors import UsageError
from tests.unit.conftest import alias_bomb, nested_json

Hostile = Callable[[str, str], Path]


def test_a_fifo_is_refused_at_once_in_its_own_words(hostile: Hostile) -> None:
    fifo = hostile("fifo", "values.yaml")
    with pytest.raises(inputs.InputError) as e:
        inputs.read_text(fifo, "values file")
    assert str(e.value) == f"values file {fifo} is a FIFO, not a regular file."
    assert e.value.exit_code == 2 and "regular file" in (e.value.hint or "")


def test_a_symlink_to_a_device_says_where_it_points(hostile: Hostile) -> None:
    link = hostile("dev-zero", "z.yaml")
    with pytest.raises(inputs.InputError, match=r"character device \(a symlink to /dev/zero\)"):
        inputs.read_bytes(link, "file")


def test_a_directory_and_an_absent_file_are_each_named(tmp_path: Path) -> None:
    with pytest.raises(inputs.InputError, match="is a directory, not a regular file"):
        inputs.read_bytes(tmp_path, "recipe file")
    with pytest.raises(inputs.InputError, match="does not exist"):
        inputs.read_bytes(tmp_path / "absent.yaml", "recipe file")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(inputs.InputError, match=r"does not exist \(a symlink to .*gone\)"):
        inputs.read_bytes(tmp_path / "dangling", "recipe file")


def test_a_file_over_the_bound_is_refused_before_it_is_read(tmp_path: Path) -> None:
    sparse = tmp_path / "big.yaml"
    with open(sparse, "wb") as f:
        f.truncate(200 * inputs.MiB)  # a hole: nothing on disk, 200 MiB to a reader
    t0 = time.monotonic()
    with pytest.raises(inputs.InputError) as e:
        inputs.read_bytes(sparse, "values file")
    assert time.monotonic() - t0 < 1
    assert "is 200.0 MiB; servebook reads at most 64 MiB of it" in str(e.value)
    with pytest.raises(inputs.InputError, match="at most 1 MiB"):
        inputs.read_bytes(sparse, "values file", inputs.MiB)


def test_a_file_at_the_bound_is_read_whole(tmp_path: Path) -> None:
    p = tmp_path / "exact"
    p.write_bytes(b"x" * 4096)
    assert inputs.read_bytes(p, "file", 4096) == b"x" * 4096
    with pytest.raises(inputs.InputError):
        inputs.read_bytes(p, "file", 4095)


def test_text_that_is_not_utf8_names_the_byte_its_offset_and_line(tmp_path: Path) -> None:
    p = tmp_path / "v.yaml"
    p.write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(inputs.InputError) as e:
        inputs.read_text(p, "values file")
    assert "is not UTF-8 text: byte 0xe9 at offset 11 (line 2)" in str(e.value)
    assert "iconv" in (e.value.hint or "")


@pytest.mark.parametrize("depth", [101, 999, 100_000])
def test_json_nested_past_the_bound_is_refused_never_a_recursion_error(
    tmp_path: Path, depth: int
) -> None:
    p = tmp_path / "results.json"
    p.write_text(nested_json(depth))
    with pytest.raises(inputs.InputError, match="nests deeper than 100 levels"):
        inputs.load_json(p, "results file")


def test_json_at_the_bound_is_read_and_brackets_in_strings_do_not_count(tmp_path: Path) -> None:
    p = tmp_path / "ok.json"
    p.write_text(nested_json(100))
    inputs.load_json(p, "file")
    tricky = {"s": "[" * 500 + '\\"{' * 200, "t": ["]" * 300, "\\\\", [[1]]]}

    p.write_text(json.dumps(tricky))
    assert inputs.load_json(p, "file") == tricky
    # tricky nests 4 levels (object, list, list, list) whatever its strings hold.
    assert inputs.json_deeper_than(json.dumps(tricky), 4) is False
    assert inputs.json_deeper_than(json.dumps(tricky), 3) is True


def test_a_yaml_alias_bomb_is_refused_quickly_and_says_so() -> None:
    text = "data:\n" + alias_bomb(9)  # about 500 bytes; 10**10 scalars expanded
    t0 = time.monotonic()
    with pytest.raises(inputs.YamlTooComplex) as e:
        inputs.safe_load(text)
    assert time.monotonic() - t0 < 2
    # 33 nodes written (the keys, 10 scalars, 10 sequences of aliases) stand for 1.2e10.
    assert "aliases expand 33 nodes to 12,345,679,023" in str(e.value.problem)
    assert "at most 100,000" in str(e.value.problem)


def test_aliases_that_add_little_are_read_as_before() -> None:
    text = "base: &b {cpu: 1, memory: 2Gi}\na: *b\nb: *b\nc: {<<: *b, cpu: 2}\n"
    assert inputs.safe_load(text) == {
        "base": {"cpu": 1, "memory": "2Gi"},
        "a": {"cpu": 1, "memory": "2Gi"},
        "b": {"cpu": 1, "memory": "2Gi"},
        "c": {"cpu": 2, "memory": "2Gi"},
    }


@pytest.mark.parametrize(
    "text",
    [
        "k: " + "{k: " * 3000 + "v" + "}" * 3000,
        "[" * 50_000 + "]" * 50_000,
        "".join(f"{'  ' * i}k{i}:\n" for i in range(150)) + "  " * 150 + "v\n",
        "a: &a [*a]\n",  # an alias inside its own anchor: a cycle
        "a: &a [x]\n"
        + "".join(f"b{i}: &b{i} [*{'a' if i == 0 else f'b{i - 1}'}]\n" for i in range(120)),
    ],
    ids=["flow-mappings", "flow-lists", "block-mappings", "alias-cycle", "alias-chain"],
)
def test_yaml_nested_past_the_bound_is_refused_never_a_recursion_error(text: str) -> None:
    with pytest.raises(inputs.YamlTooComplex, match="deeper than 100 levels"):
        inputs.safe_load(text)


def test_yaml_too_complex_is_a_yaml_error_with_a_line() -> None:
    text = "a: 1\nb: " + "[" * 200 + "]" * 200 + "\n"
    with pytest.raises(yaml.YAMLError) as e:
        inputs.safe_load(text)
    assert isinstance(e.value, inputs.YamlTooComplex)
    assert inputs.yaml_where(e.value) == ":2"


def test_every_refusal_is_a_usage_error_with_the_path_apart(hostile: Hostile) -> None:
    fifo = hostile("fifo", "f")
    with pytest.raises(UsageError) as e:
        inputs.check_regular(fifo, "snapshot")
    assert isinstance(e.value, inputs.InputError)
    assert (e.value.path, e.value.why) == (os.fspath(fifo), "is a FIFO, not a regular file.")
