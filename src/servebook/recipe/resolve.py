"""Recipe -> Plan: load, supply parameters, substitute, validate.

Every error here is a ``UsageError`` (exit 2) that names the file, the key or parameter,
where it is used, and how to fix it; nothing is started or written before resolution
succeeds.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servebook import inputs
from servebook.errors import UsageError
from servebook.recipe.plan import Plan, RecipeValueError, build_plan
from servebook.recipe.schema import Parameter, ParamType, Recipe

REF = re.compile(r"\$\{([^}]*)\}")
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Kubernetes label value: <= 63 chars, alphanumeric at both ends, - _ . inside.
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Built-in references every recipe may use; their values come from the caller.
BUILTINS = ("cache_dir", "state_dir")
# A recipe or values file is a few KiB; a bound far above that keeps a wrong file from
# holding the pure-Python YAML parser for minutes (60 MB took more than 120 s).
RECIPE_MAX_BYTES = inputs.MiB


@dataclass(frozen=True)
class Source:
    """A recipe document and where it came from (for messages)."""

    name: str
    origin: str
    data: dict[str, Any]


def servebook_home() -> Path:
    """Where servebook keeps generated models and deployment state."""
    return Path(os.environ.get("SERVEBOOK_HOME") or Path.home() / ".servebook").expanduser()


def catalog_names() -> list[str]:
    root = resources.files("servebook.recipe") / "catalog"
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


class _StrictLoader(inputs.BoundedLoader):
    """A safe loader within servebook's bounds (``inputs.BoundedLoader``) that refuses a key
    given twice in one mapping (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[str, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                line = key_node.start_mark.line + 1
                if key_node.value in seen:
                    raise _DuplicateKey(key_node.value, line, seen[key_node.value])
                seen[key_node.value] = line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, origin: str) -> dict[str, Any]:
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: no arbitrary objects
    except _DuplicateKey as e:
        raise UsageError(
            f"{origin}: line {e.line}: key {e.key!r} is given twice (first at line {e.first}); "
            "YAML would silently keep the last one. Keep one of them."
        ) from None
    except inputs.YamlTooComplex as e:
        raise UsageError(
            f"{origin}{inputs.yaml_where(e)}: {e.problem}.",
            hint="Is this the right file? A recipe or values file nests a few levels.",
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise UsageError(
            f"{origin}:{where}: malformed YAML: {problem}. Fix the YAML syntax there."
        ) from None
    if data is None:
        raise UsageError(f"{origin}: holds no keys (an empty YAML document).")
    if not isinstance(data, dict):
        raise UsageError(
            f"{origin}: expected a mapping of keys (a recipe), got {type(data).__name__}."
        )
    return data


def load_source(ref: str) -> Source:
    """A built-in recipe name, or a path to a recipe YAML file."""
    path = Path(ref)
    if ref.endswith((".yaml", ".yml")) or os.sep in ref:
        text = inputs.read_text(path, "recipe file", RECIPE_MAX_BYTES)
        return Source(name=path.stem, origin=str(path), data=parse_yaml(text, str(path)))
    names = catalog_names()
    if ref not in names:
        raise UsageError(
            f"unknown recipe '{ref}'. Built-in recipes: {', '.join(names)}. "
            "Give one of them, or a path to a recipe .yaml file "
            "(`servebook recipes` lists them)."
        )
    res = resources.files("servebook.recipe") / "catalog" / f"{ref}.yaml"
    return Source(name=ref, origin=f"built-in recipe {ref}", data=parse_yaml(res.read_text(), ref))


def _loc(loc: Iterable[Any]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _set_by(keys: Iterable[str], usages: Mapping[str, list[str]] | None) -> str:
    """' Set by parameter(s) X (--set X=VALUE).' for the parameters used at or under
    ``keys``, so a message about a recipe key names what the user actually typed."""
    if not usages:
        return ""
    names = sorted(
        {
            name
            for name, locs in usages.items()
            for loc in locs
            for key in keys
            if key and (loc == key or loc.startswith(key + ".")) and name not in BUILTINS
        }
    )
    if not names:
        return ""
    how = ", ".join(f"--set {n}=VALUE" for n in names)
    noun = "parameter" if len(names) == 1 else "parameters"
    return f" Set by {noun} {', '.join(repr(n) for n in names)} ({how})."


def _validation_error(
    src: Source, e: ValidationError, usages: Mapping[str, list[str]] | None = None
) -> UsageError:
    lines = []
    for err in e.errors():
        where = _loc(err["loc"])
        if err["type"] == "extra_forbidden":
            lines.append(
                f"  {where}: unknown key. Remove it or fix its spelling "
                "(unknown keys are errors, not ignored)."
            )
        else:
            set_by = _set_by([where], usages) if err["loc"] else ""
            lines.append(f"  {where}: {err['msg']} (got {err.get('input')!r}).{set_by}")
    return UsageError(f"{src.origin}: invalid recipe:\n" + "\n".join(lines))


def parse_recipe(src: Source, usages: Mapping[str, list[str]] | None = None) -> Recipe:
    try:
        return Recipe.model_validate(src.data)
    except ValidationError as e:
        raise _validation_error(src, e, usages) from None


def parse_set(pairs: Iterable[str]) -> dict[str, str]:
    """``--set NAME=VALUE`` pairs; a NAME given twice is refused, as a key given twice in a
    values file is (keeping the last one silently would hide a typo'd command line)."""
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set {pair!r}: expected NAME=VALUE, e.g. --set node=gpu-node-1.")
        if key in values:
            raise UsageError(
                f"--set {key} is given twice ({key}={values[key]!r}, then {key}={value!r}).",
                hint="Keep one of them.",
            )
        values[key] = value
    return values


def load_values_file(path: Path) -> dict[str, Any]:
    text = inputs.read_text(path, "values file", RECIPE_MAX_BYTES)
    if not any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines()):
        raise UsageError(
            f"values file {path} is empty: it should map parameter names to values, e.g. "
            "`node: gpu-node-1`. Fill it in, or drop -f."
        )
    data = parse_yaml(text, str(path))
    return data


def _coerce(name: str, param: Parameter, value: Any, origin: str) -> Any:
    """Convert a supplied value to the parameter's type, or say exactly what is wrong."""
    try:
        return _converted(param, value)
    except _Invalid as e:
        shown = value if e.value is _AS_GIVEN else e.value
        raise UsageError(
            f"parameter '{name}' = {shown!r} (from {origin}) is invalid: {e}. "
            f"It is: {param.description} Supply a valid value with --set {name}=VALUE."
        ) from None


_AS_GIVEN = object()


class _Invalid(Exception):
    """Why a value is not of its parameter's type; ``value``, when set, is the value to show
    in place of the one supplied (YAML shows what it parsed)."""

    def __init__(self, why: str, value: Any = _AS_GIVEN) -> None:
        super().__init__(why)
        self.value = value


def _converted(param: Parameter, value: Any) -> Any:
    if param.type is ParamType.ARGS:
        return _as_args(value)
    if param.type is ParamType.YAML:
        return _as_yaml(value)
    text = str(value).strip() if value is not None else ""
    if value is None or text == "":
        raise _Invalid("it is empty")
    if "<" in text and ">" in text:
        raise _Invalid("it looks like an unfilled placeholder such as <NODE>")
    out = _SCALARS.get(param.type, _as_text)(param, value, text)
    if param.type in (ParamType.INT, ParamType.FLOAT):
        if param.min is not None and out < param.min:
            raise _Invalid(f"must be >= {param.min:g}")
        if param.max is not None and out > param.max:
            raise _Invalid(f"must be <= {param.max:g}")
    return out


def _as_args(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    try:
        return shlex.split(str(value or ""))
    except ValueError as e:
        raise _Invalid(f"cannot split it into arguments ({e}); quote it as a shell would") from None


def _as_yaml(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value = inputs.safe_load(value)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or str(e)
            raise _Invalid(f"not valid YAML ({problem})") from None
    if not isinstance(value, (dict, list)):
        raise _Invalid(
            "expected a YAML mapping or list, e.g. --set NAME='{key: value}' or "
            "--set NAME='[{key: value}]', or the same under NAME: in a values file",
            value,
        )
    return value


def _as_int(param: Parameter, value: Any, text: str) -> int:
    if isinstance(value, bool):
        raise _Invalid("expected an integer")
    try:
        out = int(text)
    except ValueError:
        raise _Invalid("expected an integer") from None
    if abs(out) > INT32_MAX:
        raise _Invalid(
            f"too large: at most {INT32_MAX} (the integer fields an engine and Kubernetes "
            "take are 32-bit)"
        )
    return out


def _as_float(param: Parameter, value: Any, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise _Invalid("expected a number") from None


def _as_bool(param: Parameter, value: Any, text: str) -> bool:
    if isinstance(value, bool):
        return value
    if text.lower() in ("true", "yes", "1", "on"):
        return True
    if text.lower() in ("false", "no", "0", "off"):
        return False
    raise _Invalid("expected true or false")


def _as_choice(param: Parameter, value: Any, text: str) -> str:
    assert param.choices is not None
    if text not in param.choices:
        raise _Invalid(f"expected one of {', '.join(param.choices)}")
    return text


def _as_label(param: Parameter, value: Any, text: str) -> str:
    if len(text) > 63 or not LABEL_VALUE.match(text):
        raise _Invalid(
            "not a valid Kubernetes label value (at most 63 characters: letters, "
            "digits, '-', '_', '.', starting and ending with a letter or digit)"
        )
    return text


def _as_text(param: Parameter, value: Any, text: str) -> str:
    return text


# How a scalar parameter's value (stripped, not empty) becomes its type; a type not listed
# (str, path) keeps the text.
_SCALARS: dict[ParamType, Callable[[Parameter, Any, str], Any]] = {
    ParamType.INT: _as_int,
    ParamType.FLOAT: _as_float,
    ParamType.BOOL: _as_bool,
    ParamType.CHOICE: _as_choice,
    ParamType.NODE: _as_label,
    ParamType.LABEL: _as_label,
}


# Kubernetes' integer fields (replicas, ports, probe periods) are int32, as are vLLM's token
# counts; a larger value would overflow where it lands, not where it was given.
INT32_MAX = 2**31 - 1


def _walk_strings(node: Any, path: tuple[Any, ...] = ()) -> Iterable[tuple[tuple[Any, ...], str]]:
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, Mapping):
        for k, v in node.items():
            yield from _walk_strings(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk_strings(v, (*path, i))


def _usages(data: Mapping[str, Any]) -> dict[str, list[str]]:
    """Parameter name -> the keys where ``${name}`` is used."""
    found: dict[str, list[str]] = {}
    body = {k: v for k, v in data.items() if k != "parameters"}
    for path, text in _walk_strings(body):
        for m in REF.finditer(text):
            found.setdefault(m.group(1).strip(), []).append(_loc(path))
    params = data.get("parameters") or {}
    if isinstance(params, Mapping):
        for pname, pdef in params.items():
            if isinstance(pdef, Mapping) and isinstance(pdef.get("default"), str):
                for m in REF.finditer(pdef["default"]):
                    found.setdefault(m.group(1).strip(), []).append(f"parameters.{pname}.default")
    return found


def _substitute(node: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(node, str):
        whole = REF.fullmatch(node)
        if whole:  # a whole-string reference keeps the parameter's type (int, bool)
            return values[whole.group(1).strip()]

        def part(m: re.Match[str]) -> str:
            value = values[m.group(1).strip()]
            if isinstance(value, list):
                raise UsageError(
                    f"parameter '{m.group(1).strip()}' holds arguments but is used inside "
                    f"the larger value {node!r}; arguments can only be a whole element of a "
                    "list, where they are spliced in. Fix the recipe."
                )
            if value is None:
                raise UsageError(
                    f"optional parameter '{m.group(1).strip()}' is unset but used inside "
                    f"the larger value {node!r}; an optional parameter can only be a whole "
                    "value (so that unset leaves the key out). Fix the recipe."
                )
            return str(value)

        return REF.sub(part, node)
    if isinstance(node, Mapping):
        return {k: _substitute(v, values) for k, v in node.items()}
    if isinstance(node, list):
        out: list[Any] = []
        for v in node:
            new = _substitute(v, values)
            if isinstance(v, str) and REF.fullmatch(v) and (new is None or isinstance(new, list)):
                out.extend(new or [])  # arguments spliced in; unset ones leave nothing
            else:
                out.append(new)
        return out
    return node


class _ParamsOnly(BaseModel):
    model_config = ConfigDict(extra="ignore")
    parameters: dict[str, Parameter] = Field(default_factory=dict)


def parse_parameters(src: Source) -> dict[str, Parameter]:
    try:
        return _ParamsOnly.model_validate(src.data).parameters
    except ValidationError as e:
        raise _validation_error(src, e) from None


_DUMMY: dict[ParamType, Any] = {
    ParamType.INT: 1,
    ParamType.FLOAT: 1.0,
    ParamType.BOOL: True,
    ParamType.ARGS: [],
}


def _unresolved_line(name: str, param: Parameter, usages: Mapping[str, list[str]]) -> str:
    used_at = ", ".join(usages.get(name, [])) or "not referenced"
    line = f"  {name} ({param.type.value}): {param.description} Used at: {used_at}."
    if param.required_on and param.how_to_find:
        line += f" How to find it: {' '.join(param.how_to_find.split())}"
    return line + f" Supply it with --set {name}=VALUE or in a -f values.yaml file."


def _check_names(
    src: Source,
    declared: Mapping[str, Parameter],
    supplied: Mapping[str, tuple[Any, str]],
    usages: Mapping[str, list[str]],
) -> None:
    """Every ``${name}`` the recipe uses and every name supplied is a declared parameter
    (or a built-in, for a reference)."""
    for ref, where in usages.items():
        if ref not in declared and ref not in BUILTINS:
            hint = (
                f"Declare it under 'parameters:' or fix the name"
                f" (declared: {', '.join(sorted(declared)) or 'none'};"
                f" built-in: {', '.join(BUILTINS)})."
            )
            if not IDENT.match(ref):
                hint = "A reference is ${name} with a declared parameter name."
            raise UsageError(
                f"{src.origin}: '${{{ref}}}' used at {', '.join(where)} is not a declared "
                f"parameter. {hint}"
            )
    for name in supplied:
        if name not in declared:
            raise UsageError(
                f"{src.origin}: no parameter named '{name}' (from {supplied[name][1]}). "
                f"This recipe's parameters: {', '.join(sorted(declared)) or 'none'}."
            )


def resolve_values(
    src: Source,
    declared: Mapping[str, Parameter],
    supplied: Mapping[str, tuple[Any, str]],
    builtins: Mapping[str, str],
    origins: dict[str, str] | None = None,
    unresolved_on: dict[str, list[str]] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Parameter values from defaults and supplied (value, origin) pairs, typed and
    validated, and a message per unresolved parameter (with where it is used).  Unresolved
    parameters get a typed stand-in value so the rest of the recipe can still be checked.
    ``origins``, when given, receives where each value came from; ``unresolved_on``, per
    backend, a message per unset parameter only that backend requires (``required_on``),
    which is left unset like an optional one."""
    origins = {} if origins is None else origins
    unresolved_on = {} if unresolved_on is None else unresolved_on
    usages = _usages(src.data)
    _check_names(src, declared, supplied, usages)
    values: dict[str, Any] = dict(builtins)
    missing: list[str] = []
    invalid: list[str] = []
    for name, param in declared.items():
        if name in supplied:
            raw, origin = supplied[name]
        elif param.default is not None:
            raw, origin = param.default, "the recipe's default"
        elif param.optional or param.required_on:
            raw, origin = None, "unset (optional)"
        else:
            missing.append(_unresolved_line(name, param, usages))
            values[name] = _DUMMY.get(param.type, (param.choices or ["unresolved"])[0])
            continue
        if isinstance(raw, str) and REF.search(raw):
            raw = REF.sub(lambda m: str(builtins.get(m.group(1).strip(), m.group(0))), raw)
            if REF.search(raw):
                raise UsageError(
                    f"{src.origin}: parameter '{name}' default {param.default!r} may only "
                    f"refer to built-ins ({', '.join(BUILTINS)})."
                )
        origins[name] = origin
        if (param.optional or param.required_on) and (raw is None or str(raw).strip() == ""):
            for backend in param.required_on:
                unresolved_on.setdefault(backend, []).append(_unresolved_line(name, param, usages))
            values[name] = None  # unset: a whole-value reference leaves its key out
            continue
        try:
            values[name] = _coerce(name, param, raw, origin)
        except UsageError as e:
            invalid.append(f"  {e}")
    if invalid:
        # Every offending parameter at once: a deploy cycle is minutes, not one per typo.
        raise UsageError(
            f"{src.origin}: {len(invalid) + len(missing)} parameter(s) invalid or unresolved; "
            "nothing was rendered or started:\n" + "\n".join(invalid + missing)
        )
    return values, missing


def resolve(
    ref: str,
    sets: Iterable[str] = (),
    values_files: Iterable[Path] = (),
    *,
    state_dir: Path | None = None,
    given: Iterable[tuple[Mapping[str, Any], str]] = (),
) -> Plan:
    """Resolve a recipe (built-in name or file) and parameter values into a Plan.
    ``given``: values already read, each mapping with where it came from (an experiment's
    values, filtered to this recipe's parameters), before the values files and ``sets``."""
    src = load_source(ref)
    declared = parse_parameters(src)
    supplied: dict[str, tuple[Any, str]] = {}
    for mapping, origin in given:
        for k, v in mapping.items():
            supplied[str(k)] = (v, origin)
    for vf in values_files:
        for k, v in load_values_file(Path(vf)).items():
            supplied[str(k)] = (v, f"values file {vf}")
    for k, v in parse_set(sets).items():
        supplied[k] = (v, f"--set {k}")
    name = str(src.data.get("name", src.name))
    home = servebook_home()
    builtins = {
        "cache_dir": str(home / "models"),
        "state_dir": str(state_dir or home / "deployments" / name),
    }
    origins: dict[str, str] = {}
    unresolved_on: dict[str, list[str]] = {}
    values, missing = resolve_values(src, declared, supplied, builtins, origins, unresolved_on)
    body = {k: v for k, v in src.data.items() if k != "parameters"}
    usages = _usages(src.data)
    try:
        recipe = parse_recipe(
            Source(src.name, src.origin, {**_substitute(body, values), "parameters": declared}),
            usages,
        )
    except UsageError as e:
        if not missing:
            raise
        # Report the unresolved parameters too, so one run names everything to fix.
        raise UsageError(
            f"{e}\nand {len(missing)} parameter(s) unresolved:\n" + "\n".join(missing)
        ) from None
    if missing:
        raise UsageError(
            f"{src.origin}: {len(missing)} parameter(s) unresolved; nothing was rendered or "
            "started:\n" + "\n".join(missing)
        )
    for b in BUILTINS:
        values.pop(b, None)
    try:
        plan = build_plan(recipe, values, origin=src.origin)
    except RecipeValueError as e:
        raise UsageError(f"{e}{_set_by(e.keys, usages)}") from None
    plan.param_origins = origins
    plan.unresolved_on = unresolved_on
    return plan
