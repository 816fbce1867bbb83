"""The lint rules, each added where it is defined, by what it reads.

A rule is a pure function to the findings of one check (a list, or a generator that
yields them), added with the decorator of what it reads:

* ``@DOCUMENT_RULES.add(CHECK)``: each parsed document (Kubernetes object, recipe, values);
* ``@ENGINE_RULES.add(CHECK)``: each container that runs the vLLM engine;
* ``@PAIR_RULES.add(CHECK)``: each prefill/decode pair of engines;
* ``@SET_RULES.add(CHECK)``: the whole lint set, for rules that compare across files.

``servebook.lint.rules.check`` runs them in that order, each kind in check-id order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from servebook.findings import Finding, Rules
from servebook.lint.loader import Document, LintSet
from servebook.lint.rules.objects import Engine

DOCUMENT_RULES: Rules[Callable[[Document], Iterable[Finding]]] = Rules()
ENGINE_RULES: Rules[Callable[[Engine], Iterable[Finding]]] = Rules()
PAIR_RULES: Rules[Callable[[Engine, Engine], Iterable[Finding]]] = Rules()
SET_RULES: Rules[Callable[[LintSet], Iterable[Finding]]] = Rules()
