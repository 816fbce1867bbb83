"""`servebook bench` builds its BenchArgs from the parameters named after BenchArgs's fields."""

from __future__ import annotations

import inspect
from dataclasses import fields

from servebook.bench.sweep import BenchArgs
from servebook.commands.bench import bench

# Settings the command does not offer (they keep BenchArgs's default); level_orders is an
# experiment's (``experiment.design.level_orders``, with ``order="counterbalanced"``).
NOT_OPTIONS = {"max_point", "level_orders"}


def test_every_bench_setting_is_a_parameter_of_the_command() -> None:
    params = set(inspect.signature(bench).parameters)
    missing = {f.name for f in fields(BenchArgs)} - NOT_OPTIONS - params
    assert not missing, f"BenchArgs fields with no bench parameter of that name: {missing}"
