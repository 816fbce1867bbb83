"""What verify and bench see of a local deployment: processes on this machine, each role
one replica, reached directly at its own ports (``deployment.reach.build``)."""

from __future__ import annotations

from servebook.backends.local.processes import is_ours_alive, log_tail, process_state
from servebook.backends.state import Deployment, RoleProcess
from servebook.deployment.reach import Address, Reach, Record, ReplicaRecord, RoleRecord, build
from servebook.deployment.view import DeploymentView
from servebook.recipe.plan import Plan

HOST = "127.0.0.1"


def view(dep: Deployment) -> DeploymentView:
    """The deployment as verify, bench and run see it: processes on this machine, reached
    at their own ports (one replica per role)."""
    plan = Plan.model_validate(dep.plan)
    record = Record(
        dep.name, dep.backend, dep.recipe, plan, dep.served_model_name,
        roles=[RoleRecord(rp.name, rp.kind, [ReplicaRecord(rp.name, rp.argv, rp.env)])
               for rp in dep.roles],
        entry_role=plan.entry_role,
        local_model_dir=plan.engine_roles[0].model_path,
        accelerators=None,  # CPU processes: per-accelerator figures are n/a
    )  # fmt: skip
    at = {rp.name: _address(rp) for rp in dep.roles}
    return build(record, Reach("direct", {n: [a] for n, a in at.items()}, at, dep.entry_url))


def _address(rp: RoleProcess) -> Address:
    return Address(
        rp.url,
        f"http://{HOST}:{rp.metrics_port}" if rp.metrics_port else rp.url,
        alive=lambda: is_ours_alive(rp),
        describe=lambda: process_state(rp),
        log=lambda: log_tail(rp.log, lines=4000),
    )


__all__ = ["HOST", "view"]
