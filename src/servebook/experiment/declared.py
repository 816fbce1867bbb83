"""What each arm is, as far as it can be known before anything starts, stated as a
``Provenance`` so that ``compare``'s own field-by-field comparison
(``report.comparability``) judges whether the arms differ in more than the experiment's
``variable:``.  One implementation of that judgement: an experiment refuses, before any
deployment, exactly the differences ``compare`` would refuse afterwards, and names them
the same way.

A recipe arm's provenance comes from its resolved Plan (engine, image and each role's
command line and environment); an attached or URL arm's from what the file declares for it
(``model``, ``image``, ``packages``, ``engine``, ``engine_version``, ``topology``): servebook
does not deploy those, so their image is what the user says it is.
"""

from __future__ import annotations

from servebook.errors import UsageError
from servebook.experiment.spec import Arm, Experiment
from servebook.recipe.plan import Plan
from servebook.report.comparability import Comparability, comparability
from servebook.results.schema import ModelInfo, Provenance, RoleProvenance


def of_plan(plan: Plan) -> Provenance:
    roles = [
        RoleProvenance(
            name=r.name, command=list(r.args), env=dict(r.env), image=r.image or plan.image
        )
        for r in plan.roles
    ]
    return Provenance(
        servebook_version="this",
        engine=plan.engine,
        model=ModelInfo(name=plan.served_model_name),
        target={"recipe": plan.recipe, "topology": plan.topology},
        roles=roles,
        seed=0,
        started_at="",
    )


def of_declared(arm: Arm) -> Provenance:
    d = arm.declared
    packages = d.get("packages") or {}
    image = d.get("image")
    return Provenance(
        servebook_version="this",
        engine=d.get("engine"),
        engine_version=d.get("engine_version"),
        model=ModelInfo(name=str(arm.model or "")),
        target={"topology": d["topology"]} if "topology" in d else {},
        roles=[RoleProvenance(name="mixed", image=image)] if image else [],
        packages={str(k): str(v) for k, v in packages.items()}
        if isinstance(packages, dict)
        else {},
        accelerators_used=arm.accelerators,
        seed=0,
        started_at="",
    )


def provenance(exp: Experiment, arm: Arm) -> Provenance:
    if arm.kind == "recipe":
        from servebook.experiment.values import resolve_arm

        return of_plan(resolve_arm(exp, arm))
    return of_declared(arm)


def check(exp: Experiment, provs: dict[str, Provenance]) -> dict[str, Comparability]:
    """Each arm against the baseline; refuses (``UsageError``, exit 2, nothing started)
    when any differs in a kind the experiment's ``variable:`` does not declare."""
    base = provs[exp.baseline]
    judged = {
        a.name: comparability(base, provs[a.name], exp.variable)
        for a in exp.arms
        if a.name != exp.baseline
    }
    bad = {name: c for name, c in judged.items() if not c.like_for_like}
    if not bad:
        return judged
    lines = [
        f"{exp.path}: the arms differ in more than the experiment's variable "
        f"({', '.join(exp.variable) or 'none declared'}), so their ratios would mix it with "
        "these differences; nothing was started."
    ]
    kinds: set[str] = set()
    for name, c in bad.items():
        lines.append(f"arm {name} vs baseline {exp.baseline}:")
        lines += [
            f"  [{d.kind}] {d.describe().replace('(A)', '(baseline)').replace('(B)', f'({name})')}"
            for d in c.unexplained
        ]
        kinds |= set(c.suggestion())
    fix = (
        "if that is what the experiment tests, declare it "
        f"(variable: [{', '.join(sorted(kinds))}]); "
        "otherwise make the arms match (one image, one model for every arm)"
        if kinds
        else "make the arms match"
    )
    raise UsageError("\n".join(lines), hint=fix)
