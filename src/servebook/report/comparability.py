"""Whether two runs are like for like: every compared provenance field, sorted into a
*kind*, and the variables under test that allow differences of some kinds.

Field notes ("Benchmarks"): ratios between numbers taken on different images were invalid
even though both numbers were true (the baseline itself moved -15% and +29% between
images).  So compare first reads both runs' provenance, field by field, and sorts every
difference into a *kind*; a difference of a kind the user did not declare as the variable
under test makes compare refuse and list it.  ``--force`` compares anyway and stamps every
output ``compare.CROSS_PROVENANCE``.

**Kinds** (what is compared; a provenance field not listed here is not compared):

* ``engine``: engine name and version (the run's ``/version``, and the set of versions its
  engine roles report);
* ``packages``: the set of images of the engine roles, other roles' images, package
  versions, servebook's version;
* ``model``: model name and config.json hash (not its path: the same model may live at
  different paths on different hosts);
* ``hardware``: the host's accelerator kind, model, count and cores;
* ``topology``: roles present, accelerators the deployment uses, recipe and other
  ``target`` keys (not its URL or deployment name), the PD handoff threshold (only a PD
  deployment has one);
* ``engine_args``: each role's command line and environment, normalized: the interpreter's
  path, ``--host``/``--port``/``--*-port`` values, URLs, the model's path and the KV
  connector's storage directory are replaced by placeholders, and device-placement
  variables (``CUDA_VISIBLE_DEVICES``...) are left out, because those change between
  deployments of the same thing (the storage directory is the deployment's own, named
  after it: two deployments of one recipe under two names run the same engines).
  Per-role fields are compared for the roles both runs have; a role on one side only is a
  ``topology`` difference;
* ``protocol``: every protocol setting except the load levels and the repetition count
  (compare matches the levels both runs have; the intervals account for repetitions);
* ``workload``: the prompt source (lengths, dataset format and hash, a replay's speed, API),
  not the tokenizer's or the dataset's path;
* ``seed``: the run's seed (the prompts and the point order derive from it);
* ``route``: how the load reached the server (``provenance.load.route``: directly, through
  port-forwards, from agents in the cluster).  A forward relays every byte through the
  API server and the kubelet, which the latencies then include (ai-dynamo/aiperf#850
  measured ~2 ms per request through one), so no variable allows it: only ``--force``.
  A run written before routes were recorded has none, which differs from any route.

**Variables** (``--variable NAME``, repeatable) name what the comparison is about; each
allows the kinds that necessarily change with it (:data:`VARIABLES`).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from servebook.engines import vllm
from servebook.errors import UsageError
from servebook.report.tables import Column, Run, Table, show_value
from servebook.results.schema import ModelInfo, Provenance

KINDS: dict[str, str] = {
    "engine": "engine name and version (the run's /version and each role's)",
    "packages": "each role's image, package versions, servebook's version",
    "model": "model name and config.json hash",
    "hardware": "the host's accelerator kind, model, count and cores",
    "topology": "roles present, accelerators the deployment uses, recipe",
    "engine_args": "each role's command line and environment (normalized)",
    "protocol": "warm-up, window, minimum requests, order, thresholds, ...",
    "workload": "prompt source: lengths, dataset hash, API",
    "seed": "the run's seed",
    "route": "how the load reached the server (direct, port-forward, in-cluster agents)",
}


@dataclass(frozen=True)
class Variable:
    kinds: tuple[str, ...]
    meaning: str


VARIABLES: dict[str, Variable] = {
    "engine": Variable(
        ("engine", "packages"),
        "the engine version; a new engine version comes in new images and package "
        "versions, so those may differ too",
    ),
    "packages": Variable(("packages",), "images or package versions with the same engine version"),
    "model": Variable(("model",), "the model (name and config hash)"),
    "hardware": Variable(("hardware",), "the accelerator model or count on the host"),
    "topology": Variable(
        ("topology", "engine_args"),
        "the serving topology (mixed vs PD, role count, accelerators used); each role's "
        "command line changes with it",
    ),
    "engine_args": Variable(("engine_args",), "engine flags and environment of the same roles"),
    "protocol": Variable(("protocol",), "the benchmark protocol settings"),
    "workload": Variable(("workload",), "the workload (prompt source and lengths)"),
    "seed": Variable(("seed",), "the seed only (an independent re-run of the same thing)"),
}

# Protocol settings that may differ between like-for-like runs: compare matches the load
# levels both have, and the intervals already account for the number of repetitions.
# A precision target and its cap decide how many repetitions there are, nothing else.
_PROTOCOL_FREE = {
    "concurrencies",
    "rates",
    "repetitions",
    "seed",
    "precision",
    "max_repetitions",
    "precision_rule",
    "replay_speed",  # compared as the workload's
    # The rows of a counterbalanced design each bench ran (``order`` itself is compared):
    # an experiment's blocks draw different rows by design, as runs draw different seeds.
    "level_orders",
}
# Workload keys that name a place on a machine; the content is compared elsewhere (model
# config hash, dataset sha256).
# ``run`` is drawn by each invocation so that no run resends another's prompts (issue 32,
# finding 2): two runs of one workload always differ in it, as a re-run must.
_WORKLOAD_FREE = {"tokenizer", "path", "seed", "run", "seeding"}
# Thresholds derived from what is compared elsewhere: SB412's bound from the workload.
_THRESHOLDS_FREE = {"max_prefix_hit_share"}
_TOPOLOGY_THRESHOLDS = {"min_handoff_share"}
ENGINE_ROLES = {"mixed", "prefill", "decode"}
ROLE_PREFIX = "role."
_TARGET_FREE = {"url", "deployment", "name"}
_PLACEMENT_ENV = {
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
}
_PYTHON = re.compile(r"python[0-9.]*")
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s,'\"]+", re.I)


@dataclass(frozen=True)
class FieldValue:
    kind: str
    value: Any


def _endpoint_flag(flag: str) -> str | None:
    if flag == "--host":
        return "<host>"
    if flag == "--port" or (flag.startswith("--") and flag.endswith("-port")):
        return "<port>"
    return None


def normalize_command(argv: Sequence[str], model: ModelInfo) -> list[str]:
    """A role's command line with what changes between deployments of the same thing
    replaced: the interpreter's path (``/opt/venv/bin/python3.11`` -> ``python``), host
    and port values, URLs, the model's path, the KV connector's storage directory."""
    places = {model.path.rstrip("/"): "<model>"} if model.path else {}
    storage = vllm.kv_storage_path(argv)
    if storage:
        # As written on the command line: inside the connector's JSON.
        places[json.dumps(storage.rstrip("/"))[1:-1]] = "<kv-storage>"
    out: list[str] = []
    placeholder: str | None = None
    for i, tok in enumerate(argv):
        if placeholder is not None:
            out.append(placeholder)
            placeholder = None
            continue
        if i == 0:
            name = PurePosixPath(tok).name
            out.append("python" if _PYTHON.fullmatch(name) else name)
            continue
        flag, eq, _value = tok.partition("=")
        ph = _endpoint_flag(flag)
        if ph is not None:
            if eq:
                out.append(f"{flag}={ph}")
            else:
                out.append(tok)
                placeholder = ph
            continue
        tok = _URL.sub("<url>", tok)
        # Longest first: a storage directory inside the model's keeps its own placeholder.
        for place in sorted(places, key=len, reverse=True):
            tok = tok.replace(place, places[place])
        out.append(tok)
    return out


def provenance_fields(prov: Provenance) -> dict[str, FieldValue]:
    """Every compared provenance field, flattened to ``name -> (kind, value)``."""
    f: dict[str, FieldValue] = {}

    def put(name: str, kind: str, value: Any) -> None:
        f[name] = FieldValue(kind, value)

    put("engine", "engine", prov.engine)
    put("engine_version", "engine", prov.engine_version)
    put("servebook_version", "packages", prov.servebook_version)
    for k, v in prov.packages.items():
        put(f"packages.{k}", "packages", v)
    put("model.name", "model", prov.model.name)
    put("model.config_hash", "model", prov.model.config_hash)
    acc = prov.accelerator
    for k in ("kind", "model", "count", "cores"):
        put(f"accelerator.{k}", "hardware", getattr(acc, k) if acc else None)
    put("roles", "topology", sorted(r.name for r in prov.roles))
    put("accelerators_used", "topology", prov.accelerators_used)
    for k, v in prov.target.items():
        if k == "api":
            put("target.api", "workload", v)
        elif k not in _TARGET_FREE:
            put(f"target.{k}", "topology", v)
    # Over the engine roles as a set, so that a topology change (mixed -> prefill + decode)
    # is not also read as an engine or image change.
    engines = [r for r in prov.roles if r.name in ENGINE_ROLES or r.engine_version]
    put("roles.engine_versions", "engine", sorted({r.engine_version or "" for r in engines}))
    put("roles.images", "packages", sorted({r.image or "" for r in engines}))
    f.update(_role_fields(prov))
    f.update(_protocol_fields(prov.protocol))
    for k, v in prov.workload.items():
        if k not in _WORKLOAD_FREE:
            put(f"workload.{k}", "workload", v)
    put("seed", "seed", prov.seed)
    put("load.route", "route", prov.load.route if prov.load is not None else None)
    return f


def _role_fields(prov: Provenance) -> dict[str, FieldValue]:
    """Per role: compared only for roles both runs have (``provenance_differences``); a role
    on one side only is the topology difference ``roles``."""
    f: dict[str, FieldValue] = {}
    for role in prov.roles:
        if role.name not in ENGINE_ROLES and not role.engine_version:
            f[f"{ROLE_PREFIX}{role.name}.image"] = FieldValue("packages", role.image)
        f[f"{ROLE_PREFIX}{role.name}.command"] = FieldValue(
            "engine_args", " ".join(normalize_command(role.command, prov.model))
        )
        for k, v in role.env.items():
            if k not in _PLACEMENT_ENV:
                f[f"{ROLE_PREFIX}{role.name}.env.{k}"] = FieldValue("engine_args", v)
    return f


def _protocol_fields(protocol: Mapping[str, Any]) -> dict[str, FieldValue]:
    f: dict[str, FieldValue] = {}
    for k, v in protocol.items():
        if k == "thresholds" and isinstance(v, dict):
            for tk, tv in v.items():
                if tk in _THRESHOLDS_FREE:
                    continue
                # The PD handoff threshold exists only for PD deployments: it changes with
                # the topology, not with the protocol.
                kind = "topology" if tk in _TOPOLOGY_THRESHOLDS else "protocol"
                f[f"protocol.thresholds.{tk}"] = FieldValue(kind, tv)
        elif k not in _PROTOCOL_FREE:
            f[f"protocol.{k}"] = FieldValue("protocol", v)
    return f


@dataclass(frozen=True)
class Difference:
    field: str
    kind: str
    a: Any
    b: Any

    def describe(self) -> str:
        if self.field.endswith(".command") and isinstance(self.a, str) and isinstance(self.b, str):
            return f"{self.field}: {token_diff(self.a, self.b)}"
        return f"{self.field}: {show_value(self.a)} (A) vs {show_value(self.b)} (B)"

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "kind": self.kind, "a": self.a, "b": self.b}


def token_diff(a: str, b: str) -> str:
    """What differs between two command lines, token by token: ``A has X; B has Y``."""
    ta, tb = a.split(), b.split()
    parts = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=ta, b=tb, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        left, right = " ".join(ta[i1:i2]), " ".join(tb[j1:j2])
        parts.append(f"{left or '(nothing)'} (A) -> {right or '(nothing)'} (B)")
    return "; ".join(parts) or "the same tokens"


def role_of(name: str) -> str | None:
    """``role.decode.command`` -> ``decode``; ``None`` for a field of no single role."""
    if not name.startswith(ROLE_PREFIX):
        return None
    return name[len(ROLE_PREFIX) :].split(".", 1)[0]


def shared_fields(provs: Sequence[Provenance]) -> list[dict[str, FieldValue]]:
    """Each run's fields, without the per-role fields of roles not every run has."""
    flat = [provenance_fields(p) for p in provs]
    common = set.intersection(*({r.name for r in p.roles} for p in provs)) if provs else set()
    return [{k: v for k, v in f.items() if role_of(k) in (None, *common)} for f in flat]


def provenance_differences(a: Provenance, b: Provenance) -> list[Difference]:
    fa, fb = shared_fields([a, b])
    out = []
    for name in sorted(set(fa) | set(fb)):
        va, vb = fa.get(name), fb.get(name)
        xa = va.value if va is not None else None
        xb = vb.value if vb is not None else None
        if _canon(xa) != _canon(xb):
            kind = (va or vb).kind  # type: ignore[union-attr]
            out.append(Difference(name, kind, xa, xb))
    return out


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def check_variables(names: Iterable[str]) -> tuple[str, ...]:
    out: list[str] = []
    for n in names:
        for part in n.split(","):
            part = part.strip()
            if not part:
                continue
            if part not in VARIABLES:
                raise UsageError(
                    f"--variable {part!r}: not a variable servebook knows; choose from "
                    f"{', '.join(VARIABLES)} (`servebook compare --help` says what each "
                    "covers)"
                )
            if part not in out:
                out.append(part)
    return tuple(out)


@dataclass(frozen=True)
class Comparability:
    differences: list[Difference]
    variables: tuple[str, ...]

    @property
    def allowed_kinds(self) -> set[str]:
        return {k for v in self.variables for k in VARIABLES[v].kinds}

    @property
    def explained(self) -> list[Difference]:
        return [d for d in self.differences if d.kind in self.allowed_kinds]

    @property
    def unexplained(self) -> list[Difference]:
        return [d for d in self.differences if d.kind not in self.allowed_kinds]

    @property
    def like_for_like(self) -> bool:
        return not self.unexplained

    @property
    def unused_variables(self) -> list[str]:
        """Declared variables under which nothing differs (worth a warning: the user
        believes the runs differ in something they do not)."""
        kinds = {d.kind for d in self.differences}
        return [v for v in self.variables if not kinds & set(VARIABLES[v].kinds)]

    def suggestion(self) -> list[str]:
        """The variables that would cover the unexplained differences (a route has none)."""
        return sorted({d.kind for d in self.unexplained} & set(VARIABLES))

    def route_reason(self) -> str | None:
        """Why runs measured through different routes are not compared, or None."""
        d = next((d for d in self.unexplained if d.kind == "route"), None)
        if d is None:
            return None
        return (
            f"The load reached the servers by different routes ({show_value(d.a)} (A) vs "
            f"{show_value(d.b)} (B)): a port-forward relays every byte through the API "
            "server and the kubelet, and its cost is in the latencies measured through it; "
            "no --variable covers that. Measure both runs the same way."
        )


def comparability(a: Provenance, b: Provenance, variables: Sequence[str]) -> Comparability:
    return Comparability(provenance_differences(a, b), check_variables(variables))


def differing_fields(runs: Sequence[Run]) -> list[tuple[str, str, list[FieldValue | None]]]:
    """``(field, kind, each run's value)`` for every compared provenance field that is not
    the same in all ``runs`` (a run without it: ``None``), by field name."""
    flat = shared_fields([r.results.provenance for r in runs])
    out = []
    for name in sorted(set().union(*flat)):
        vals = [f.get(name) for f in flat]
        if len({_canon(v.value) if v is not None else "\0" for v in vals}) > 1:
            out.append((name, next(v.kind for v in vals if v is not None), vals))
    return out


def differences_table(runs: Sequence[Run]) -> Table | None:
    """Every compared provenance field that is not the same in all runs shown (``None``
    for one run), each with its kind."""
    if len(runs) < 2:
        return None
    rows = [
        [name, kind, *(show_value(v.value) if v is not None else "(absent)" for v in values)]
        for name, kind, values in differing_fields(runs)
    ]
    return Table(
        "differences",
        "What differs between the runs shown",
        [Column("Field"), Column("Kind"), *(Column(r.label) for r in runs)],
        rows,
        note="Provenance as `servebook compare` reads it (command lines normalized: "
        "interpreter path, host, port, URLs and model path replaced). `compare` refuses a "
        "difference of a kind that is not the variable under test."
        if rows
        else "Every compared provenance field is the same in all runs.",
        code_columns=frozenset(range(2, 2 + len(runs))),
    )
