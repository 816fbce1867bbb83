"""`servebook compare A B`: B relative to A, point by point, only when that ratio means
something.

Field notes ("Benchmarks"): ratios between numbers taken on different images were invalid
even though both numbers were true (the baseline itself moved -15% and +29% between
images).  So compare first reads both runs' provenance, field by field, and sorts every
difference into a *kind*; a difference of a kind the user did not declare as the variable
under test makes compare refuse and list it.  ``--force`` compares anyway and stamps every
output :data:`CROSS_PROVENANCE`.

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
  path, ``--host``/``--port``/``--*-port`` values, URLs and the model's path are replaced
  by placeholders, and device-placement variables (``CUDA_VISIBLE_DEVICES``...) are left
  out, because those change between deployments of the same thing.  Per-role fields are
  compared for the roles both runs have; a role on one side only is a ``topology``
  difference;
* ``protocol``: every protocol setting except the load levels and the repetition count
  (compare matches the levels both runs have; the intervals account for repetitions);
* ``workload``: the prompt source (lengths, dataset hash, API), not the tokenizer's path;
* ``seed``: the run's seed (the prompts and the point order derive from it).

**Variables** (``--variable NAME``, repeatable) name what the comparison is about; each
allows the kinds that necessarily change with it (:data:`VARIABLES`).

**The verdict per point and metric** (:data:`TEST`): Welch's two-sided t-test at 5% over
the per-repetition values of the valid repetitions.  A repetition is the unit that was
actually replicated (requests inside one repetition share server state, so a test over
requests would overstate the sample size), and Welch's test does not assume two topologies
vary alike.  The interval shown is Welch's 95% interval of B - A relative to A's mean, so
it excludes zero exactly when the verdict is *better* or *worse*; it is the same t
machinery as every CI in a report (``stats``).  With fewer than two valid repetitions on a
side there is no test: *not distinguishable (too few repetitions)*.  Direction is per
metric: throughput higher is better, latency and error rate lower is better.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

from servebook.bench import stats
from servebook.bench.results import ModelInfo, Provenance
from servebook.findings import UsageError
from servebook.report.tables import (
    COMPARED,
    METRICS,
    NA,
    Column,
    Level,
    Run,
    Table,
    fmt_interval,
    fmt_num,
    levels,
    show_value,
)

CROSS_PROVENANCE = "cross-provenance: not a like-for-like comparison"
ALPHA = 0.05

TEST = (
    "Welch's two-sided t-test at 5% over the per-repetition values of the valid "
    "repetitions (one value per repetition; invalid points excluded). The interval is "
    "Welch's 95% CI of B - A relative to A's mean: it excludes 0 exactly when the verdict "
    "is better or worse. Fewer than 2 valid repetitions on a side: not distinguishable "
    "(too few repetitions). Throughput: higher is better; latency and error rate: lower "
    "is better."
)
MULTIPLE_TESTS = (
    "Each verdict is its own test at 5%: among many points and metrics that do not truly "
    "differ, about 1 in 20 reads better or worse by chance. Trust a pattern across points "
    "more than one verdict."
)

# --- provenance ----------------------------------------------------------------------------

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
}
# Workload keys that name a place on a machine; the content is compared elsewhere (model
# config hash, dataset sha256).
_WORKLOAD_FREE = {"tokenizer", "path", "seed"}
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
    and port values, URLs, the model's path."""
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
        if model.path:
            tok = tok.replace(model.path.rstrip("/"), "<model>")
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
    # Per role: compared only for roles both runs have (``provenance_differences``); a role
    # on one side only is the topology difference ``roles``.
    for role in prov.roles:
        if role.name not in ENGINE_ROLES and not role.engine_version:
            put(f"{ROLE_PREFIX}{role.name}.image", "packages", role.image)
        put(
            f"{ROLE_PREFIX}{role.name}.command",
            "engine_args",
            " ".join(normalize_command(role.command, prov.model)),
        )
        for k, v in role.env.items():
            if k not in _PLACEMENT_ENV:
                put(f"{ROLE_PREFIX}{role.name}.env.{k}", "engine_args", v)
    for k, v in prov.protocol.items():
        if k == "thresholds" and isinstance(v, dict):
            for tk, tv in v.items():
                # The PD handoff threshold exists only for PD deployments: it changes with
                # the topology, not with the protocol.
                put(
                    f"protocol.thresholds.{tk}",
                    "topology" if tk in _TOPOLOGY_THRESHOLDS else "protocol",
                    tv,
                )
        elif k not in _PROTOCOL_FREE:
            put(f"protocol.{k}", "protocol", v)
    for k, v in prov.workload.items():
        if k not in _WORKLOAD_FREE:
            put(f"workload.{k}", "workload", v)
    put("seed", "seed", prov.seed)
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
        """The variables that would cover the unexplained differences."""
        return sorted({d.kind for d in self.unexplained})


def comparability(a: Provenance, b: Provenance, variables: Sequence[str]) -> Comparability:
    return Comparability(provenance_differences(a, b), check_variables(variables))


def differences_table(runs: Sequence[Run]) -> Table | None:
    """Every compared provenance field that is not the same in all runs shown (``None``
    for one run), each with its kind."""
    if len(runs) < 2:
        return None
    flat = shared_fields([r.results.provenance for r in runs])
    names = sorted(set().union(*flat))
    rows = []
    for name in names:
        vals = [f.get(name) for f in flat]
        shown = [show_value(v.value) if v is not None else "(absent)" for v in vals]
        if len({_canon(v.value) if v is not None else "\0" for v in vals}) > 1:
            kind = next(v.kind for v in vals if v is not None)
            rows.append([name, kind, *shown])
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


# --- the test ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Welch:
    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    diff: float  # mean_b - mean_a
    se: float
    df: float | None  # None when both samples have zero variance
    t: float | None
    p: float
    low: float  # 95% interval of the difference
    high: float


def welch(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Welch | None:
    """Welch's two-sided t-test of mean(b) - mean(a); ``None`` with fewer than two values
    on a side (no variance estimate: no test)."""
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        return None
    ma, mb = math.fsum(a) / na, math.fsum(b) / nb
    va = math.fsum((x - ma) ** 2 for x in a) / (na - 1)
    vb = math.fsum((x - mb) ** 2 for x in b) / (nb - 1)
    qa, qb = va / na, vb / nb
    se = math.sqrt(qa + qb)
    diff = mb - ma
    if se == 0.0:
        # Identical repetitions on both sides: the difference is exact (p 1 when there is
        # none, else 0); real measurements essentially never land here.
        p = 1.0 if diff == 0 else 0.0
        return Welch(na, nb, ma, mb, diff, 0.0, None, None, p, diff, diff)
    df = (qa + qb) ** 2 / (qa**2 / (na - 1) + qb**2 / (nb - 1))
    t = diff / se
    p = min(1.0, 2.0 * stats.t_cdf(-abs(t), df))
    half = stats.t_quantile(0.5 + level / 2.0, df) * se
    return Welch(na, nb, ma, mb, diff, se, df, t, p, diff - half, diff + half)


Verdict = Literal[
    "better",
    "worse",
    "not distinguishable",
    "not distinguishable (too few repetitions)",
    "no valid repetitions",
    "not measured on one side",
]


def verdict_of(w: Welch | None, better: Literal["higher", "lower"]) -> Verdict:
    """better / worse at 5% in the metric's direction, else not distinguishable."""
    if w is None:
        return "not distinguishable (too few repetitions)"
    if w.p >= ALPHA or w.diff == 0:
        return "not distinguishable"
    up = w.diff > 0
    return "better" if up == (better == "higher") else "worse"


@dataclass(frozen=True)
class Row:
    level: str
    metric: str
    a: stats.Interval
    b: stats.Interval
    test: Welch | None
    verdict: Verdict
    # Whether A's and B's level is imprecise (its precision target not reached): a verdict
    # on it rests on an interval wider than that run asked for.
    imprecise: tuple[bool, bool] = (False, False)

    @property
    def imprecise_note(self) -> str:
        sides = [n for n, bad in zip("AB", self.imprecise, strict=True) if bad]
        return f"{' and '.join(sides)} imprecise" if sides else ""

    @property
    def ratio(self) -> float | None:
        """B / A; ``None`` when A's mean is not positive (an error rate of 0)."""
        if self.a.mean is None or self.b.mean is None or not self.a.mean > 0:
            return None
        return self.b.mean / self.a.mean

    @property
    def ratio_ci(self) -> tuple[float, float] | None:
        """Welch's interval of B - A over A's mean, plus one: excludes 1 exactly when the
        verdict is better or worse."""
        if self.test is None or self.a.mean is None or not self.a.mean > 0:
            return None
        return (1 + self.test.low / self.a.mean, 1 + self.test.high / self.a.mean)

    def to_dict(self) -> dict[str, Any]:
        def side(iv: stats.Interval) -> dict[str, Any]:
            ci = [iv.low, iv.high] if iv.low is not None else None
            return {"mean": iv.mean, "ci95": ci, "n": iv.n}

        t = self.test
        return {
            "level": self.level,
            "metric": self.metric,
            "better": METRICS[self.metric].better,
            "a": side(self.a),
            "b": side(self.b),
            "ratio": self.ratio,
            "ratio_ci95": list(self.ratio_ci) if self.ratio_ci else None,
            "difference": t.diff if t else None,
            "difference_ci95": [t.low, t.high] if t else None,
            "welch_t": t.t if t else None,
            "welch_df": t.df if t else None,
            "p": t.p if t else None,
            "verdict": self.verdict,
            "imprecise": {"a": self.imprecise[0], "b": self.imprecise[1]},
        }


def compare_level(la: Level, lb: Level, metric: str) -> Row | None:
    """One metric at one load level; ``None`` when neither run has the metric at all
    (per-accelerator figures of two CPU runs)."""
    m = METRICS[metric]
    assert m.better is not None
    va, vb = la.values(metric), lb.values(metric)
    if not va and not vb and la.valid and lb.valid:
        return None
    w = welch(va, vb)
    verdict: Verdict
    if not la.valid or not lb.valid:
        verdict = "no valid repetitions"
    elif not va or not vb:
        verdict = "not measured on one side"
    else:
        verdict = verdict_of(w, m.better)
    return Row(
        la.label,
        metric,
        stats.mean_ci(va),
        stats.mean_ci(vb),
        w,
        verdict,
        (la.imprecise, lb.imprecise),
    )


@dataclass
class Comparison:
    a: Run
    b: Run
    comparability: Comparability
    forced: bool
    rows: list[Row] = field(default_factory=list)
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)

    @property
    def stamp(self) -> str | None:
        return None if self.comparability.like_for_like else CROSS_PROVENANCE


class Refused(Exception):
    """The runs differ in more than the variable under test (exit 1)."""

    def __init__(self, comparability: Comparability) -> None:
        super().__init__("provenance differs beyond the variable under test")
        self.comparability = comparability


def compare(a: Run, b: Run, variables: Sequence[str] = (), *, force: bool = False) -> Comparison:
    """B relative to A per common load level and metric; raises :class:`Refused` when the
    provenance differs in an undeclared kind and ``force`` is not set."""
    c = comparability(a.results.provenance, b.results.provenance, variables)
    if not c.like_for_like and not force:
        raise Refused(c)
    la = {(lv.mode, lv.value): lv for lv in levels(a)}
    lb = {(lv.mode, lv.value): lv for lv in levels(b)}
    rows = []
    for key in [k for k in la if k in lb]:
        for metric in COMPARED:
            row = compare_level(la[key], lb[key], metric)
            if row is not None:
                rows.append(row)
    return Comparison(
        a,
        b,
        c,
        force,
        rows,
        only_a=[la[k].label for k in la if k not in lb],
        only_b=[lb[k].label for k in lb if k not in la],
    )


# --- output --------------------------------------------------------------------------------


def fmt_relative(row: Row) -> str:
    """``+12.3% [+5.1%, +19.5%]`` for B vs A; percentage points for percent metrics."""
    m = METRICS[row.metric]
    if m.percent:
        if row.a.mean is None or row.b.mean is None:
            return NA
        d = 100 * (row.b.mean - row.a.mean)
        t = row.test
        band = f" [{100 * t.low:+.2f}, {100 * t.high:+.2f}]" if t else ""
        return f"{d:+.2f} pp{band}"
    r = row.ratio
    if r is None:
        return NA
    ci = row.ratio_ci
    band = f" [{100 * (ci[0] - 1):+.1f}%, {100 * (ci[1] - 1):+.1f}%]" if ci else ""
    return f"{100 * (r - 1):+.1f}%{band}"


def rows_table(c: Comparison) -> Table:
    return Table(
        "compare",
        f"B ({c.b.label}) relative to A ({c.a.label})",
        [
            Column("Load"),
            Column("Metric"),
            Column("A", True),
            Column("B", True),
            Column("B vs A (95% CI)", True),
            Column("p", True),
            Column("Verdict"),
        ],
        [
            [
                r.level,
                METRICS[r.metric].label,
                fmt_interval(r.a, percent=METRICS[r.metric].percent),
                fmt_interval(r.b, percent=METRICS[r.metric].percent),
                fmt_relative(r),
                f"{r.test.p:.3g}" if r.test else NA,
                r.verdict + (f" ({r.imprecise_note})" if r.imprecise_note else ""),
            ]
            for r in c.rows
        ],
        note=TEST
        + (
            " 'imprecise': that run's level stopped at its repetition cap with an interval "
            "wider than its precision target."
            if any(r.imprecise_note for r in c.rows)
            else ""
        ),
    )


def differences_lines(c: Comparability) -> list[str]:
    out = []
    for d in c.differences:
        tag = "under test" if d.kind in c.allowed_kinds else "NOT under test"
        out.append(f"[{d.kind}] {d.describe()} ({tag})")
    return out


def refusal_message(c: Comparability) -> str:
    lines = [
        "compare refused: A and B differ in more than the variable under test, so a ratio of "
        "their numbers would mix that variable with the differences below.",
    ]
    lines += [f"  [{d.kind}] {d.describe()}" for d in c.unexplained]
    sugg = " ".join(f"--variable {k}" for k in c.suggestion())
    lines.append(
        f"If these differences are what you are testing, declare them ({sugg}); otherwise "
        "re-run one side so they match, or pass --force to compare anyway (every output is "
        f'then stamped "{CROSS_PROVENANCE}").'
    )
    return "\n".join(lines)


def to_json(c: Comparison) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "stamp": c.stamp,
        "like_for_like": c.comparability.like_for_like,
        "forced": c.forced,
        "a": {"label": c.a.label, "path": str(c.a.path)},
        "b": {"label": c.b.label, "path": str(c.b.path)},
        "variables": list(c.comparability.variables),
        "differences": [
            {**d.to_dict(), "under_test": d.kind in c.comparability.allowed_kinds}
            for d in c.comparability.differences
        ],
        "test": TEST,
        "alpha": ALPHA,
        "levels_only_in_a": c.only_a,
        "levels_only_in_b": c.only_b,
        "rows": [r.to_dict() for r in c.rows],
    }
    if c.stamp:
        for r in doc["rows"]:
            r["stamp"] = c.stamp
    return doc


def refusal_json(c: Comparability) -> dict[str, Any]:
    return {
        "refused": True,
        "reason": "provenance differs beyond the variable under test",
        "variables": list(c.variables),
        "differences": [
            {**d.to_dict(), "under_test": d.kind in c.allowed_kinds} for d in c.differences
        ],
        "suggested_variables": c.suggestion(),
    }


__all__ = [
    "CROSS_PROVENANCE",
    "KINDS",
    "TEST",
    "VARIABLES",
    "Comparison",
    "Refused",
    "compare",
    "fmt_num",
    "provenance_differences",
    "welch",
]
