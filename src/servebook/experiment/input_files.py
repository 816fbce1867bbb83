"""What an experiment reads besides its file, by content: the values files, the recipes
(a recipe file's or a built-in recipe's document) and the load's dataset.  Their digests
are kept in ``experiment.json`` (``inputs``) and a ``--resume`` compares them with the
files as they are now: a change is refused naming the file (issue 44, point 3; hostile
probe D6: the digest ``--resume`` checked held these files' paths, so the blocks of one
experiment could measure different workloads, values or recipes, and nothing said so).
The experiment file itself is compared by what it sets (``Experiment.digest``), so its
analysis-only keys (``slo``, ``pairs``) may still change between runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from servebook.errors import UsageError
from servebook.experiment.spec import Experiment, dataset_path


def _file(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    return "sha256:" + h.hexdigest()


def digests(exp: Experiment) -> dict[str, str]:
    """``{what: digest}`` of every input of ``exp`` (``what``: ``values file PATH``,
    ``recipe file PATH`` or ``built-in recipe NAME``, ``dataset PATH``)."""
    from servebook.recipe.resolve import load_source

    out: dict[str, str] = {}
    if isinstance(exp.values, str):
        out[f"values file {exp.values}"] = _file(Path(exp.values))
    for arm in exp.arms:
        for f in arm.values:
            out[f"values file {f}"] = _file(Path(f))
        if arm.kind == "recipe" and arm.recipe:
            src = load_source(arm.recipe)
            raw = json.dumps(src.data, sort_keys=True, default=str).encode()
            out[src.origin if " " in src.origin else f"recipe file {src.origin}"] = (
                "sha256:" + hashlib.sha256(raw).hexdigest()
            )
    dataset = dataset_path(exp)
    if dataset is not None:
        out[f"dataset {dataset}"] = _file(dataset)
    return out


def check_unchanged(saved: object, exp: Experiment, state_path: Path) -> None:
    """Refused (exit 2) when an input ``saved`` (the state's ``inputs``) recorded differs
    now; a state written before inputs were recorded (None) is not checked."""
    if not isinstance(saved, dict):
        return
    now = digests(exp)
    for what, then in saved.items():
        if now.get(what) != then:
            raise UsageError(
                f"--resume: {what} changed since {state_path} was started ({then}, now "
                f"{now.get(what, 'not an input any more')}): the blocks of one experiment "
                "would measure different inputs",
                hint="put the file back as it was to resume, or start over in a new -o DIR",
            )
