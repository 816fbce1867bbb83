"""The built-in recipes are read with libyaml (``servebook.recipe.source._ShippedLoader``,
ten times faster: ``servebook recipes`` reads all of them), a user's file with the bounded
pure-Python loader: the two must read every shipped recipe alike, and both refuse a key
given twice."""

from __future__ import annotations

from importlib import resources

import pytest

from servebook.errors import UsageError
from servebook.recipe.source import catalog_names, load_source, parse_yaml


def test_every_shipped_recipe_reads_alike_with_either_loader() -> None:
    names = catalog_names()
    assert "tiny-pd" in names and len(names) >= 9
    for name in names:
        text = (resources.files("servebook.recipe") / "catalog" / f"{name}.yaml").read_text()
        assert load_source(name).data == parse_yaml(text, name), name


@pytest.mark.parametrize("shipped", [False, True])
def test_a_key_given_twice_is_refused_by_either_loader(shipped: bool) -> None:
    text = "name: a\ntopology: mixed\nroles:\n  x: 1\nname: b\n"
    with pytest.raises(
        UsageError, match=r"r: line 5: key 'name' is given twice \(first at line 1\)"
    ):
        parse_yaml(text, "r", shipped=shipped)
