"""Preflight of a resolved Plan against a cluster: the cluster checks over a snapshot (read
live, or from a file); then, live, what the caller may do (SB263), a server-side dry run of
the rendered set (SB264), the read-only weights probe in a Pod on each target node (SB259)
and whether the weights fit the GPUs (SB262).  Used by `servebook preflight` and by the
Kubernetes backend's part of `run`.

Every request goes through one ``kube.client`` connection, so the kubeconfig, context and
timeouts hold for all of them.  The dry run and the probe Pods need a namespace that
exists.  When the recipe's does not exist yet, preflight makes a temporary one of its own
(``servebook-preflight-XXXXXXXX``) and deletes it afterwards, in every case: not the
recipe's own, whose deletion would leave it Terminating for a while, and `up` right after
preflight would be refused there.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from servebook.findings import Finding, Severity
from servebook.kube import manifests, names
from servebook.kube.client import (
    CONNECT_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    RequestFailed,
    call,
    connect,
    send,
    server_of,
)
from servebook.kube.resources import FIELD_MANAGER
from servebook.kube.snapshot import ClusterSnapshot, load_snapshot, read_with
from servebook.preflight.admission import (
    ACCESS,
    ADMISSION,
    Access,
    AccessDenied,
    DryRun,
    Review,
    access_finding,
    denied_text,
    describe_object,
    dry_run_finding,
    enforce_level,
    object_path,
    pods_of,
    required_access,
    review_from_answer,
    server_minor,
    service_account_of,
    without_account,
)
from servebook.preflight.cluster import CRDS_INSTALLED, check_cluster
from servebook.preflight.pod_security import pod_security_finding
from servebook.preflight.probe_pod import PROBE_POD, probe_targets, run_probe_pod
from servebook.preflight.requirements import ClusterRequirements, requirements_from_plan
from servebook.preflight.weights_fit import (
    WeightsSize,
    check_weights_fit,
    role_weights,
    size_from_probe,
    weights_size,
)
from servebook.recipe.plan import Plan

PREFLIGHT_NAMESPACE_PREFIX = "servebook-preflight-"
PREFLIGHT_LABEL = "servebook.io/preflight"
SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


@dataclass(frozen=True)
class LiveOptions:
    """How a live preflight reaches the cluster and runs its probes."""

    kubeconfig: str | None = None
    context: str | None = None
    request_timeout_s: float = REQUEST_TIMEOUT_S
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    probe_deadline_s: int = 120
    pull_timeout_s: int = 900
    probe_image: str | None = None
    poll_s: float = 2.0


def plan_findings(
    plan: Plan,
    *,
    snapshot: Path | None = None,
    kubeconfig: str | None = None,
    probe_deadline: int = 120,
    context: str | None = None,
    weights: str | None = None,
    options: LiveOptions | None = None,
) -> list[Finding]:
    """Every preflight finding for ``plan``.  ``weights`` (``--weights``) gives the
    weights' size where no probe runs (a size, a model directory, or its index)."""
    opts = options or LiveOptions(
        kubeconfig=kubeconfig, context=context, probe_deadline_s=probe_deadline
    )
    # servebook render always emits the Namespace, so the set creates it.
    req = requirements_from_plan(plan, creates_namespace=True)
    given = weights_size(weights) if weights else None
    if snapshot is not None:
        return _from_snapshot(plan, req, load_snapshot(snapshot), given)
    api = connect(
        opts.kubeconfig,
        opts.context,
        request_timeout_s=opts.request_timeout_s,
        connect_timeout_s=opts.connect_timeout_s,
    )
    snap = read_with(api, namespace=req.namespace)
    findings = [
        served_finding(api, f)
        if f.check == CRDS_INSTALLED.id and f.evidence.get("checked") is False
        else f
        for f in check_cluster(snap, req)
    ]
    objects = manifests.render(plan)
    ns_obj = snap.namespaces.get(req.namespace)
    exists = ns_obj is not None and not (ns_obj.get("metadata") or {}).get("deletionTimestamp")
    findings.append(check_access(api, objects, req.namespace, exists))
    findings.append(pod_security_finding(objects, req.namespace, ns_obj if exists else None))
    probes: list[Finding] = []
    with workspace(api, req.namespace, exists) as ws:
        findings.append(
            check_admission(
                api,
                objects,
                req.namespace,
                ws.name,
                exists=exists,
                enforce=enforce_level(ns_obj),
            )
        )
        for t in probe_targets(plan):
            probes += run_probe_pod(
                api,
                t,
                namespace=ws.name,
                deadline_s=opts.probe_deadline_s,
                pull_timeout_s=opts.pull_timeout_s,
                image=opts.probe_image,
                poll_s=opts.poll_s,
            )
    findings += probes
    if ws.left_behind:
        findings.append(
            PROBE_POD.finding(
                Severity.ERROR,
                f"namespace/{ws.name}",
                f"preflight could not delete its temporary namespace {ws.name}: {ws.left_behind}",
                hint=f"`kubectl delete namespace {ws.name}`",
            )
        )
    sizes = {
        r.name: size_from_probe(probes, r.placement.node or "") or given for r in plan.engine_roles
    }
    findings += _weights_findings(plan, req, snap, sizes)
    return findings


def _from_snapshot(
    plan: Plan, req: ClusterRequirements, snap: ClusterSnapshot, given: WeightsSize | None
) -> list[Finding]:
    findings = check_cluster(snap, req)
    ns_obj = snap.namespaces.get(req.namespace)
    findings.append(pod_security_finding(manifests.render(plan), req.namespace, ns_obj))
    targets = probe_targets(plan)
    findings.append(
        PROBE_POD.finding(
            Severity.INFO,
            ", ".join(t.node for t in targets) or "-",
            "node probes were not run: --snapshot reads no live cluster, so no Pod can "
            "check the model directories; the verdict is the cluster checks' alone",
        )
    )
    for check, what in ((ACCESS, "permissions"), (ADMISSION, "admission of the rendered set")):
        findings.append(
            check.finding(
                Severity.INFO,
                f"namespace/{req.namespace}",
                f"{what} not checked: --snapshot reads no live cluster",
            )
        )
    findings += _weights_findings(plan, req, snap, {r.name: given for r in plan.engine_roles})
    return findings


def _weights_findings(
    plan: Plan,
    req: ClusterRequirements,
    snap: ClusterSnapshot,
    sizes: dict[str, WeightsSize | None],
) -> list[Finding]:
    return [check_weights_fit(snap.nodes, rw) for rw in role_weights(plan, req.nodes, sizes)]


# ---------------------------------------------------------------------------------------
# The namespace the dry run and the probes run in.


@dataclass
class Workspace:
    name: str
    created: bool
    left_behind: str = ""


@contextlib.contextmanager
def workspace(api: Any, namespace: str, exists: bool) -> Iterator[Workspace]:
    """``namespace`` when it exists; else a temporary namespace of preflight's own,
    deleted on the way out whatever happened (a failure to delete it is recorded in
    ``left_behind``, for a finding)."""
    if exists:
        yield Workspace(namespace, created=False)
        return
    name = PREFLIGHT_NAMESPACE_PREFIX + secrets.token_hex(4)
    body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {
                names.MANAGED_BY_LABEL: names.MANAGED_BY,
                PREFLIGHT_LABEL: "true",
            },
            "annotations": {"servebook.io/stands-in-for": namespace},
        },
    }
    call(
        api,
        "POST",
        "/api/v1/namespaces",
        f"creating preflight's temporary namespace {name} (namespace {namespace} does not "
        "exist yet)",
        body=body,
    )
    ws = Workspace(name, created=True)
    try:
        yield ws
    finally:
        try:
            call(
                api,
                "DELETE",
                f"/api/v1/namespaces/{name}",
                f"deleting preflight's temporary namespace {name}",
                missing_ok=True,
            )
        except RequestFailed as e:
            ws.left_behind = str(e)


# ---------------------------------------------------------------------------------------
# SB263 and SB264, live.


def served_finding(api: Any, unread: Finding) -> Finding:
    """SB257 for a caller who may not read CRDs (a namespace's tenant): whether the API
    server serves the CRD's kind, from API discovery, which every authenticated user may
    read; ``unread`` (not checked) when discovery does not answer either."""
    subject = unread.subject
    name = subject.removeprefix("crd/")
    plural, _, group = name.partition(".")
    how = "read through API discovery: the caller may not read CustomResourceDefinitions"
    try:
        got = call(api, "GET", f"/apis/{group}", f"discovering API group {group}") or {}
        version = str((got.get("preferredVersion") or {}).get("groupVersion") or "")
        listed = call(api, "GET", f"/apis/{version}", f"discovering {version}") or {}
    except RequestFailed as e:
        if e.code != 404:
            return unread
        version, listed = "", {}  # the group is not served
    served = {str(r.get("name")) for r in listed.get("resources") or ()}
    if plural in served:
        return CRDS_INSTALLED.finding(
            Severity.PASS,
            subject,
            f"the API server serves {plural} ({version}): CRD {name} is installed and "
            f"established ({how})",
            evidence={"installed": True, "served_versions": [version], "via": "discovery"},
        )
    return CRDS_INSTALLED.finding(
        Severity.FAIL,
        subject,
        f"the API server does not serve {plural} in group {group}: CRD {name} is not "
        f"installed ({how})",
        hint=CRDS_INSTALLED.fix,
        evidence={"installed": False, "via": "discovery"},
    )


def check_access(
    api: Any, objects: Sequence[dict[str, Any]], namespace: str, exists: bool
) -> Finding:
    """A SelfSubjectAccessReview for each permission ``up``, ``bench`` (its load in the
    cluster) and ``down`` use (on this server's version: what a port-forward needs changed
    in 1.35)."""
    wanted = required_access(objects, namespace, exists, _minor(api), load=True)
    return access_finding(review(api, wanted), namespace, who=f"the caller on {server_of(api)}")


def _minor(api: Any) -> int | None:
    try:
        version = api.version()  # kr8s's own /version request (not an API path)
    except Exception:
        version = None  # taken as the newest: both port-forward verbs are asked
    return server_minor(version)


def review(api: Any, wanted: Sequence[Access]) -> list[Review]:
    """The API server's answer to a SelfSubjectAccessReview for each of ``wanted``."""
    reviews = []
    for a in wanted:
        answer = call(
            api, "POST", SSAR_PATH, f"asking whether the caller may {a.text()}", body=a.review()
        )
        reviews.append(review_from_answer(a, answer or {}))
    return reviews


def require_access(
    api: Any, wanted: Callable[[int | None], Sequence[Access]], namespace: str, doing: str
) -> None:
    """Before ``doing`` changes anything: ask for every permission it needs
    (``wanted(server minor)``) and refuse with exit 2, naming each one denied, so that a
    missing permission never stops it part-way with objects applied."""
    denied = [r for r in review(api, wanted(_minor(api))) if not r.allowed]
    if not denied:
        return
    raise AccessDenied(
        f"{doing} needs permissions the caller on {server_of(api)} does not have in "
        f"namespace {namespace}: {denied_text(denied)}. Nothing was changed.",
        hint=ACCESS.fix,
    )


def check_admission(
    api: Any,
    objects: Sequence[dict[str, Any]],
    namespace: str,
    into: str,
    *,
    exists: bool,
    enforce: str | None = None,
) -> Finding:
    """Dry-run apply every rendered object (server-side, as ``up`` applies it) and dry-run
    create the Pods of each workload's template, in ``into`` (the namespace, or preflight's
    stand-in for it); every answer is kept, refusals included."""
    results: list[DryRun] = []
    # ServiceAccounts the apply creates: a dry run stores none, so a Pod running as one
    # would be refused ("serviceaccount ... not found") though the real apply admits it.
    rendered = {
        str((o.get("metadata") or {}).get("name"))
        for o in objects
        if o.get("kind") == "ServiceAccount"
    }
    made = _accounts_for_dry_run(api, objects, into) if into != namespace else set()
    for obj in objects:
        if obj.get("kind") == "Namespace":
            if exists:
                continue  # up uses an existing namespace as it is
            results.append(_dry_run(api, obj, "PATCH"))
            continue
        placed = {**obj, "metadata": {**(obj.get("metadata") or {}), "namespace": into}}
        results.append(_dry_run(api, placed, "PATCH"))
        for owner, pod in pods_of(placed):
            account = service_account_of(pod)
            note = ""
            if account and account not in made and account in rendered:
                if not _exists(api, f"/api/v1/namespaces/{into}/serviceaccounts/{account}"):
                    pod = without_account(pod)
                    note = (
                        f"dry-run as the namespace's default ServiceAccount, since its own "
                        f"({account}) is created by this apply"
                    )
            elif account in made and account not in rendered:
                note = (
                    f"its ServiceAccount {account} was made in {into} for the dry run; that "
                    f"it exists in {namespace} was not checked"
                )
            r = _dry_run(api, pod, "POST", pod_of=f"{obj.get('kind')}/{owner}")
            results.append(replace(r, note=note) if note else r)
    return dry_run_finding(
        results, namespace, enforce=enforce, stand_in=None if into == namespace else into
    )


def _exists(api: Any, path: str) -> bool:
    return call(api, "GET", path, f"reading {path}", missing_ok=True) is not None


def _accounts_for_dry_run(api: Any, objects: Sequence[dict[str, Any]], into: str) -> set[str]:
    """In preflight's own temporary namespace (deleted afterwards), really create every
    ServiceAccount the Pods run as, the apply's and the user's, so their Pods' dry runs
    are admitted as the apply's would be; returns the names made."""
    wanted = sorted({a for o in objects for _, pod in pods_of(o) if (a := service_account_of(pod))})
    made = set()
    for account in wanted:
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}}
        try:
            call(
                api,
                "POST",
                f"/api/v1/namespaces/{into}/serviceaccounts",
                f"creating ServiceAccount {account} in preflight's temporary namespace {into} "
                "for the dry run",
                body=body,
            )
        except RequestFailed:
            continue  # its Pods are dry-run as they are; a refusal then says why
        made.add(account)
    return made


def _dry_run(api: Any, obj: dict[str, Any], method: str, pod_of: str | None = None) -> DryRun:
    what = describe_object(obj)
    if method == "POST":
        path = object_path(obj).rsplit("/", 1)[0]
        params = {"dryRun": "All", "fieldManager": FIELD_MANAGER}
        content_type = "application/json"
    else:
        path = object_path(obj)
        params = {"dryRun": "All", "fieldManager": FIELD_MANAGER}
        content_type = "application/apply-patch+yaml"
    request = f"{method} {path}?dryRun=All"
    try:
        answer = send(
            api,
            method,
            path,
            f"dry-run {'creating' if method == 'POST' else 'applying'} {what}",
            params=params,
            body=obj,
            content_type=content_type,
        )
    except RequestFailed as e:
        if e.code is None:
            raise  # no answer: could not check, exit 2
        return DryRun(
            what,
            request,
            e.code,
            message=e.server_message,
            reason=str(e.status.get("reason") or ""),
            pod_of=pod_of,
        )
    return DryRun(what, request, answer.code, warnings=answer.warnings, pod_of=pod_of)


__all__ = [
    "LiveOptions",
    "Workspace",
    "check_access",
    "check_admission",
    "plan_findings",
    "require_access",
    "review",
    "workspace",
]
