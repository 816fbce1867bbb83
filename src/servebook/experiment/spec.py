"""The experiment file: arms, blocks, the load every arm gets, the declared variable.

An arm is one of three kinds: a ``recipe`` (with ``set``/``values``/``backend``; brought
up fresh for each block), an attached ``deployment``, or a ``url`` with a ``model`` (both
only benched).  Every error names the file, the key and the fix (exit 2), before anything
starts.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servebook import inputs, redact
from servebook.errors import UsageError
from servebook.report.comparability import VARIABLES

# bench's flags by their long names (without --) that an experiment's load may set.
LOAD_KEYS = {
    "concurrency",
    "rate",
    "input-len",
    "output-len",
    "warmup",
    "duration",
    "min-requests",
    "repetitions",
    "precision",
    "max-repetitions",
    "seed",
    "api",
    "stall",
    "max-client-lag-ms",
    "min-achieved-concurrency",
    "prompt-format",
    "request-timeout",
    "tokenizer",
    "dataset",
    "require-server-evidence",
    "agents",
    # On Kubernetes, the in-cluster load's (bench's flags of the same names).
    "load-image",
    "load-start-timeout",
}
_TOP_KEYS = {"baseline", "blocks", "arms", "load", "variable", "seed", "slo", "values", "pairs"}
_ARM_KEYS = {
    "name",
    "recipe",
    "set",
    "values",
    "backend",
    "deployment",
    "url",
    "model",
    "accelerators",
    "namespace",
    # Declared facts of an arm servebook does not deploy (compared before anything starts).
    "image",
    "packages",
    "engine",
    "engine_version",
    "topology",
}
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")


@dataclass(frozen=True)
class Arm:
    name: str
    kind: str  # recipe | deployment | url
    recipe: str | None = None
    sets: tuple[str, ...] = ()  # k=v, as --set takes them
    values: tuple[str, ...] = ()  # values files
    backend: str = "local"
    deployment: str | None = None
    # A deployment arm's Kubernetes namespace, as `bench NAME -n NS` takes it (one this
    # machine has no record of).
    namespace: str | None = None
    url: str | None = None
    model: str | None = None
    accelerators: int | None = None
    declared: dict[str, Any] = field(default_factory=dict)  # image, packages, engine, ...

    def describe(self) -> str:
        if self.kind == "recipe":
            sets = f" with {', '.join(self.sets)}" if self.sets else ""
            return f"recipe {self.recipe}{sets}, brought up fresh on {self.backend} per block"
        if self.kind == "deployment":
            where = f" in namespace {self.namespace}" if self.namespace else ""
            return f"deployment {self.deployment}{where}, benched only"
        # its credentials never leave servebook (issue 44 point 6; hostile probe D4)
        return f"{redact.url(str(self.url))} (model {self.model}), benched only"


@dataclass(frozen=True)
class Experiment:
    path: str
    baseline: str
    blocks: int
    arms: tuple[Arm, ...]
    load: dict[str, Any]  # bench flag (long name) -> value, as given
    variable: tuple[str, ...] = ()
    seed: int = 0
    # Each latency's p99 limit in ms (``bench --slo``'s keys): every arm's max load under
    # it is located (``experiment.slo``).  Analysis only: not part of the digest, so a
    # resumed experiment may be judged against another SLO.
    slo: dict[str, float] | None = None
    # Values for every recipe arm: a values file's path (beside the experiment file) or a
    # mapping; each recipe takes the keys it declares (``experiment.values``).
    values: str | dict[str, Any] | None = None
    # Pairs of arms compared as baseline and arm are, ``(arm, over)`` (``pairs: [pd-spec:pd]``):
    # analysis only, as the SLO is (not part of the digest).
    pairs: tuple[tuple[str, str], ...] = ()

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def digest(self) -> str:
        """What --resume checks: the same experiment (arms, load, blocks, seed)."""
        doc = {
            "baseline": self.baseline,
            "blocks": self.blocks,
            "arms": [a.__dict__ for a in self.arms],
            "load": self.load,
            "variable": self.variable,
            "seed": self.seed,
        }
        if self.values is not None:  # only when given: older experiments resume as they were
            doc["values"] = self.values
        raw = json.dumps(doc, sort_keys=True, default=str).encode()
        return "sha256:" + hashlib.sha256(raw).hexdigest()[:16]


def dataset_path(exp: Experiment) -> Path | None:
    """The load's dataset: a shipped one (``builtin:NAME``, as bench's ``--dataset``
    takes it), else a file beside the experiment file; None when the load gives none."""
    from servebook import datasets

    value = exp.load.get("dataset")
    if value is None:
        return None
    shipped = datasets.resolve(str(value))
    return shipped if shipped is not None else Path(exp.path).parent / str(value)


def _bad(path: str, key: str, problem: str, fix: str) -> UsageError:
    return UsageError(f"{path}: {key}: {problem}", hint=fix)


def load(path: Path) -> Experiment:
    """Read and check an experiment file (see the module docstring)."""
    from servebook.recipe.source import parse_yaml

    text = inputs.read_text(path, "experiment file")
    # malformed, too deep or too many aliases, or a key given twice: exit 2 naming the
    # line, as a values file's (hostile probe D12a, D16)
    return parse(parse_yaml(text, str(path)), str(path))


def parse(doc: Any, path: str) -> Experiment:
    if not isinstance(doc, dict):
        raise _bad(path, "(top)", "not a mapping", "write baseline:, blocks:, arms: and load:")
    unknown = sorted(set(map(str, doc)) - _TOP_KEYS)
    if unknown:
        raise _bad(
            path,
            unknown[0],
            "not a key of an experiment",
            f"use only {', '.join(sorted(_TOP_KEYS))}",
        )
    arms = _arms(doc.get("arms"), path)
    names = [a.name for a in arms]
    baseline = doc.get("baseline")
    if baseline not in names:
        raise _bad(
            path,
            "baseline",
            f"{baseline!r} is not an arm's name",
            f"name the arm every ratio divides by: one of {', '.join(names)}",
        )
    blocks = doc.get("blocks", 3)
    if not isinstance(blocks, int) or isinstance(blocks, bool) or not 1 <= blocks <= 100:
        raise _bad(
            path, "blocks", f"{blocks!r}", "give a whole number from 1 to 100 (2 or more for CIs)"
        )
    seed = doc.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise _bad(path, "seed", f"{seed!r}", "give a whole number, 0 or more")
    return Experiment(
        path=path,
        baseline=str(baseline),
        blocks=blocks,
        arms=tuple(arms),
        load=_load(doc.get("load"), path),
        variable=_variable(doc.get("variable"), path),
        seed=seed,
        slo=_slo(doc.get("slo"), path),
        values=_shared_values(doc.get("values"), path),
        pairs=_pairs(doc.get("pairs"), names, path),
    )


def parse_pair(text: Any, names: Sequence[str], where: str) -> tuple[str, str]:
    """``ARM:OVER`` (``pairs:``'s items, ``report --pair``): two different arms' names;
    an error names ``where`` and the arms there are."""
    arm, sep, over = str(text).partition(":")
    arm, over = arm.strip(), over.strip()
    fix = f"write ARM:OVER with two of the arms ({', '.join(names)}), e.g. {names[-1]}:{names[0]}"
    if not sep or arm not in names or over not in names:
        unknown = [n for n in (arm, over) if sep and n not in names]
        problem = f"{unknown[0]!r} is not an arm's name" if unknown else f"{text!r}"
        raise UsageError(f"{where}: {problem}", hint=fix)
    if arm == over:
        raise UsageError(f"{where}: {text!r} divides an arm by itself", hint=fix)
    return arm, over


def _pairs(v: Any, names: Sequence[str], path: str) -> tuple[tuple[str, str], ...]:
    if v is None:
        return ()
    items = v if isinstance(v, list) else [v]
    out = [parse_pair(item, names, f"{path}: pairs[{i}]") for i, item in enumerate(items)]
    return tuple(dict.fromkeys(out))


def _slo(v: Any, path: str) -> dict[str, float] | None:
    """``slo: ttft=500ms,tpot=50ms`` (bench's --slo syntax) or ``slo: {ttft: 500ms, tpot:
    50ms}``; parsed by bench's own parser."""
    from servebook.bench.figures import parse_slo

    if v is None:
        return None
    text = ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else v
    if not isinstance(text, str):
        raise _bad(path, "slo", f"{v!r}", "write slo: ttft=500ms,tpot=50ms (bench's --slo)")
    try:
        return parse_slo(text)
    except UsageError as e:
        raise _bad(
            path,
            "slo",
            str(e).removeprefix("--slo "),
            "write slo: ttft=500ms,tpot=50ms (keys ttft, tpot, itl, e2e: each latency's p99 limit)",
        ) from None


def _shared_values(v: Any, path: str) -> str | dict[str, Any] | None:
    if v is None:
        return None
    if isinstance(v, str) and v:
        return str(Path(path).parent / v)
    if isinstance(v, dict) and v:
        return {str(k): x for k, x in v.items()}
    raise _bad(
        path,
        "values",
        f"{v!r}",
        "give a values file's path (beside the experiment file) or a mapping of parameters, "
        "e.g. values: {namespace: bench}",
    )


def _variable(v: Any, path: str) -> tuple[str, ...]:
    if v is None:
        return ()
    items = v if isinstance(v, list) else [v]
    out: list[str] = []
    for item in items:
        if str(item) not in VARIABLES:
            raise _bad(
                path,
                "variable",
                f"{item!r} is not a variable servebook knows",
                f"choose from {', '.join(VARIABLES)} (what the arms are allowed to differ in)",
            )
        out.append(str(item))
    return tuple(out)


def _load(v: Any, path: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _bad(
            path, "load", "not a mapping", "give bench's flags by long name, e.g. duration: 15s"
        )
    out: dict[str, Any] = {}
    for k, val in v.items():
        key = str(k).removeprefix("--").replace("_", "-")
        if key not in LOAD_KEYS:
            raise _bad(
                path,
                f"load.{k}",
                "not a bench flag an experiment sets",
                f"use one of {', '.join(sorted(LOAD_KEYS))} (`servebook bench --help`)",
            )
        if isinstance(val, list):
            val = ",".join(str(x) for x in val)
        if val is None or val == "":  # `concurrency: []` read as bench's default (D16)
            raise _bad(
                path,
                f"load.{k}",
                "empty",
                f"give a value (`servebook bench --help` for --{key}), or leave the key out "
                "for bench's default",
            )
        out[key] = val
    return out


def _arms(v: Any, path: str) -> list[Arm]:
    if not isinstance(v, list) or len(v) < 2:
        raise _bad(path, "arms", "needs a list of at least two arms", "add the arms to compare")
    arms = [_arm(item, i, path) for i, item in enumerate(v)]
    seen: set[str] = set()
    for a in arms:
        if a.name in seen:
            raise _bad(path, f"arms[{a.name}]", "name given twice", "give each arm its own name")
        seen.add(a.name)
    return arms


def _arm(item: Any, i: int, path: str) -> Arm:
    where = f"arms[{i}]"
    if not isinstance(item, dict):
        raise _bad(path, where, "not a mapping", "write {name: NAME, recipe: RECIPE} or url:")
    unknown = sorted(set(map(str, item)) - _ARM_KEYS)
    if unknown:
        raise _bad(
            path,
            f"{where}.{unknown[0]}",
            "not a key of an arm",
            f"use {', '.join(sorted(_ARM_KEYS))}",
        )
    name = item.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(
            path,
            f"{where}.name",
            f"{name!r}",
            "give lower-case letters, digits and '-' (it names the arm's directory)",
        )
    where = f"arms[{name}]"
    kinds = [k for k in ("recipe", "deployment", "url") if item.get(k) is not None]
    if len(kinds) != 1:
        raise _bad(
            path,
            where,
            f"gives {' and '.join(kinds) or 'none'} of recipe, deployment, url",
            "give exactly one: a recipe to bring up, an attached deployment or a URL",
        )
    kind = kinds[0]
    if kind != "recipe":
        for k in ("set", "values", "backend"):
            if k in item:
                raise _bad(
                    path, f"{where}.{k}", f"only for a recipe arm, not a {kind}", f"remove {k}"
                )
    if kind == "url" and not isinstance(item.get("model"), str):
        raise _bad(
            path, f"{where}.model", "missing", "a URL arm names its served model: model: NAME"
        )
    if "namespace" in item and kind != "deployment":
        raise _bad(
            path,
            f"{where}.namespace",
            f"only for a deployment arm, not a {kind}",
            "a recipe arm's namespace is its recipe's parameter: set: {namespace: NS}"
            if kind == "recipe"
            else "remove namespace:",
        )
    from servebook.backends.registry import NAMES

    backend = item.get("backend", "local")
    if backend not in NAMES:
        raise _bad(
            path,
            f"{where}.backend",
            f"{backend!r}",
            "choose local (processes on this machine) or kubernetes (the current KUBECONFIG "
            "context, or `servebook experiment --kubeconfig FILE`)",
        )
    acc = item.get("accelerators")
    if acc is not None and (not isinstance(acc, int) or isinstance(acc, bool) or acc < 1):
        raise _bad(path, f"{where}.accelerators", f"{acc!r}", "give a whole number, 1 or more")
    return Arm(
        name=name,
        kind=kind,
        recipe=item.get("recipe"),
        sets=_sets(item.get("set"), path, where),
        values=_values(item.get("values"), path, where),
        backend=str(backend),
        deployment=item.get("deployment"),
        namespace=None if item.get("namespace") is None else str(item["namespace"]),
        url=item.get("url"),
        model=item.get("model"),
        accelerators=acc,
        declared={
            k: item[k]
            for k in ("image", "packages", "engine", "engine_version", "topology")
            if k in item
        },
    )


def _sets(v: Any, path: str, where: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise _bad(path, f"{where}.set", "not a mapping", "write set: {PARAM: VALUE}")
    return tuple(f"{k}={json.dumps(x) if isinstance(x, (dict, list)) else x}" for k, x in v.items())


def _values(v: Any, path: str, where: str) -> tuple[str, ...]:
    if v is None:
        return ()
    items = v if isinstance(v, list) else [v]
    if not all(isinstance(x, str) for x in items):
        raise _bad(
            path, f"{where}.values", f"{v!r}", "give a values file's path, or a list of them"
        )
    base = Path(path).parent
    return tuple(str(base / x) for x in items)
