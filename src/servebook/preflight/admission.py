"""What the cluster will let ``servebook up`` do: the caller's permissions (SB263) and the
API server's admission of the rendered objects (SB264).  Pure: what to ask, and findings
from the answers; ``preflight.live`` sends the requests.

* SB263 asks a ``SelfSubjectAccessReview`` for every verb ``up``, ``status``, ``verify``
  and ``down`` use: get, list, create, patch and delete on each kind the render emits (the
  Namespace only when it does not exist yet, since ``up`` uses an existing one as it is),
  list on the Pods, ReplicaSets and Events it watches, get on ``pods/log`` and, for the
  port-forwards, what the server checks of a WebSocket upgrade (``portforward_access``).
  The authorizer answers exactly as it would the real request, RBAC
  and webhooks alike; one finding lists every denial.
* SB264 applies the rendered set server-side with ``dryRun=All``: every admission step runs
  (schema, Pod Security, ResourceQuota and LimitRange, validating and mutating webhooks)
  and nothing is stored.  Every refusal is reported together, not the first only.  Pod
  Security's enforce level and compute quotas apply to Pods, not to the Deployment that
  makes them (a Deployment is checked against the *warn* level only, so in a namespace
  that enforces ``restricted`` and warns at nothing it is admitted silently, and its Pods
  are refused later in the ReplicaSet's events while ``up`` waits): so each workload's Pod
  template is also dry-run created as a Pod.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from servebook.errors import UsageError
from servebook.findings import Finding, Severity, register_once
from servebook.kube.load_job import LOAD_KINDS

Obj = dict[str, Any]


ACCESS = register_once(
    "SB263",
    "The caller may do everything servebook up, bench and down do",
    "`up` applies, reads and waits on several kinds, reads logs and opens port-forwards; "
    "a permission missing for one of them stops the deploy part-way (objects applied, "
    "nothing serving) or leaves `down` unable to delete what `up` made. RBAC rules are "
    "easy to get almost right: a Role with deployments but not services, or without "
    "pods/portforward.",
    "Ask the cluster's admin for a Role (and RoleBinding) in the namespace granting the "
    "verbs the finding lists; `kubectl auth can-i VERB RESOURCE -n NAMESPACE` checks one.",
)
ADMISSION = register_once(
    "SB264",
    "The API server admits the rendered objects (server-side dry run)",
    "Admission is decided only when objects are applied: Pod Security levels, "
    "ResourceQuota and LimitRange, policy webhooks (Kyverno, Gatekeeper) and schema "
    "checks refuse objects one at a time, part-way through an apply. Pod Security never "
    "refuses a Deployment itself: its Pods are refused later by the ReplicaSet controller, "
    "which only an event says, while the deploy waits for its timeout.",
    "Read each refusal: for Pod Security, run in a namespace whose "
    "pod-security.kubernetes.io/enforce level allows the Pods (hostPath volumes need "
    "`privileged`) or ask for an exemption; for quota, free or raise it; for a webhook, "
    "change what its policy names or ask its owner.",
)
CHECKS = (ACCESS, ADMISSION)

PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
PSA_LEVELS = ("privileged", "baseline", "restricted")
DRY_RUN_POD_SUFFIX = "-servebook-dry-run"


# ---------------------------------------------------------------------------------------
# Kinds and their resources.

# kind -> (group, resource); the render's kinds and those the backend watches.
_RESOURCES: dict[str, tuple[str, str]] = {
    "Namespace": ("", "namespaces"),
    "Service": ("", "services"),
    "ConfigMap": ("", "configmaps"),
    "Secret": ("", "secrets"),
    "ServiceAccount": ("", "serviceaccounts"),
    "PersistentVolumeClaim": ("", "persistentvolumeclaims"),
    "Pod": ("", "pods"),
    "Event": ("", "events"),
    "Job": ("batch", "jobs"),
    "Deployment": ("apps", "deployments"),
    "StatefulSet": ("apps", "statefulsets"),
    "ReplicaSet": ("apps", "replicasets"),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io", "leaderworkersets"),
}


def resource_of(obj: Obj) -> tuple[str, str]:
    """(group, plural resource) of an object, from its kind and apiVersion."""
    kind = str(obj.get("kind", ""))
    if kind in _RESOURCES:
        return _RESOURCES[kind]
    api_version = str(obj.get("apiVersion", "v1"))
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    return group, kind.lower() + "s"


def object_path(obj: Obj) -> str:
    """The object's API path: ``/apis/apps/v1/namespaces/NS/deployments/NAME``."""
    api_version = str(obj.get("apiVersion", "v1"))
    _, resource = resource_of(obj)
    meta = obj.get("metadata") or {}
    base = "/api" if api_version == "v1" else "/apis"
    ns = meta.get("namespace")
    where = f"/namespaces/{ns}" if ns and obj.get("kind") != "Namespace" else ""
    return f"{base}/{api_version}{where}/{resource}/{meta.get('name')}"


def describe_object(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{meta.get('name')}"


# ---------------------------------------------------------------------------------------
# SB263: permissions.


@dataclass(frozen=True)
class Access:
    verb: str
    resource: str
    group: str = ""
    subresource: str = ""
    namespace: str | None = None
    # Why servebook needs it, where that is not plain from the verb (for the message).
    why: str = field(default="", compare=False)

    def text(self) -> str:
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        what += f".{self.group}" if self.group else ""
        return f"{self.verb} {what}"

    def review(self) -> Obj:
        """The ``SelfSubjectAccessReview`` asking for this."""
        attrs: Obj = {"verb": self.verb, "resource": self.resource, "group": self.group}
        if self.subresource:
            attrs["subresource"] = self.subresource
        if self.namespace:
            attrs["namespace"] = self.namespace
        return {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }


OBJECT_VERBS = ("get", "list", "create", "patch", "delete")
# From this minor version the API server also authorizes a WebSocket upgrade of
# pods/portforward (and exec, attach) as `create` (KEP-4006; kubernetes#134577, feature
# gate AuthorizePodWebsocketUpgradeCreatePermission, beta and on by default in 1.35).
PORTFORWARD_CREATE_FROM_MINOR = 35


def server_minor(version: Obj | None) -> int | None:
    """The minor version of a ``/version`` answer (``"31"``, or ``"31+"`` on GKE and EKS);
    None when it says none."""
    text = str((version or {}).get("minor") or "")
    digits = text[: len(text) - len(text.lstrip("0123456789"))] if text else ""
    return int(digits) if digits and str((version or {}).get("major")) == "1" else None


def portforward_access(namespace: str, minor: int | None) -> list[Access]:
    """What a port-forward needs: servebook opens it as a WebSocket, whose upgrade is an
    HTTP GET, authorized as ``get pods/portforward``; from 1.35 the server also checks
    ``create`` (a server whose version is unknown is taken to check both)."""
    verbs = ["get"]
    why = "port-forwards open as WebSocket GETs"
    if minor is None or minor >= PORTFORWARD_CREATE_FROM_MINOR:
        verbs.append("create")
        why += (
            ", and Kubernetes 1.35+ also checks create on them"
            if minor is not None
            else "; the server's version is unknown, and from 1.35 create is checked too"
        )
    return [
        Access(v, "pods", subresource="portforward", namespace=namespace, why=why) for v in verbs
    ]


def required_access(
    objects: Sequence[Obj],
    namespace: str,
    namespace_exists: bool,
    minor: int | None = None,
    *,
    load: bool = False,
) -> list[Access]:
    """Every permission ``up``/``status``/``verify``/``down`` use for ``objects`` in
    ``namespace``: the object verbs on each rendered kind (server-side apply is a patch that
    creates), the Namespace's only when it is to be created, and what the rollout watch,
    the logs and the port-forwards need on a server of minor version ``minor``.  With
    ``load``, also what ``bench`` needs for its load in the cluster (``load_access``), which
    preflight asks on its behalf before any load Job exists."""
    return _unique(
        [
            *_object_access(objects, namespace, namespace_exists),
            *_pod_access(namespace, minor, rollout=True),
            *(load_access(_LOAD_OBJECTS, namespace, minor) if load else ()),
        ]
    )


def load_access(objects: Sequence[Obj], namespace: str, minor: int | None) -> list[Access]:
    """What ``bench``'s in-cluster load (``kube.load_job``'s ``objects``) needs: the object
    verbs on each of their kinds, and reading its Pods, their logs and events, and the one
    port-forward that fetches the results."""
    return _unique([*_object_access(objects, namespace, True), *_pod_access(namespace, minor)])


# One object of each kind the load creates (kube.load_job.LOAD_KINDS).
_LOAD_OBJECTS: list[Obj] = [
    {"apiVersion": v, "kind": k, "metadata": {"name": "load"}} for v, k in LOAD_KINDS
]


def _unique(accesses: Sequence[Access]) -> list[Access]:
    return list(dict.fromkeys(accesses))


def _object_access(objects: Sequence[Obj], namespace: str, namespace_exists: bool) -> list[Access]:
    out: list[Access] = []
    for obj in objects:
        group, resource = resource_of(obj)
        if obj.get("kind") == "Namespace":
            # One that exists is used as it is, and need not even be readable
            # (kube.resources.namespace_exists); a Namespace's own name is the namespace
            # RBAC judges a request on it in, but creating one is cluster-scoped.
            if not namespace_exists:
                name = str((obj.get("metadata") or {}).get("name") or namespace)
                out.append(Access("create", resource, group))
                out += [
                    Access(v, resource, group, namespace=name) for v in ("get", "patch", "delete")
                ]
            continue
        out += [Access(verb, resource, group, namespace=namespace) for verb in OBJECT_VERBS]
    return out


def _pod_access(namespace: str, minor: int | None, rollout: bool = False) -> list[Access]:
    """Reading the Pods, their logs and the namespace's events, and the port-forwards; with
    ``rollout``, the ReplicaSets ``up``'s rollout verdict watches."""
    return [
        Access("list", "pods", namespace=namespace),
        Access("get", "pods", namespace=namespace),
        Access("get", "pods", subresource="log", namespace=namespace),
        *portforward_access(namespace, minor),
        *([Access("list", "replicasets", "apps", namespace=namespace)] if rollout else []),
        Access("list", "events", namespace=namespace),
    ]


@dataclass(frozen=True)
class Review:
    access: Access
    allowed: bool
    reason: str = ""


def review_from_answer(access: Access, answer: Obj) -> Review:
    status = answer.get("status") or {}
    reason = str(status.get("reason") or status.get("evaluationError") or "")
    return Review(access, bool(status.get("allowed")), reason)


class AccessDenied(UsageError):
    """A command may not do what it needs (exit 2, before it changed anything)."""


def denied_text(denied: Sequence[Review]) -> str:
    """Each denied permission, with the server's reason and why servebook needs it."""
    return "; ".join(
        r.access.text()
        + (f" ({r.reason})" if r.reason else "")
        + (f" ({r.access.why})" if r.access.why else "")
        + ("" if r.access.namespace else " (cluster scope)")
        for r in denied
    )


def access_finding(reviews: Sequence[Review], namespace: str, who: str = "") -> Finding:
    subject = f"namespace/{namespace}"
    caller = who or "the caller"
    denied = [r for r in reviews if not r.allowed]
    evidence = {
        "asked": [r.access.text() for r in reviews],
        "denied": [
            {"access": r.access.text(), "namespace": r.access.namespace, "reason": r.reason}
            for r in denied
        ],
    }
    if not denied:
        return ACCESS.finding(
            Severity.PASS,
            subject,
            f"{caller} may do all {len(reviews)} things up, bench and down do in namespace "
            f"{namespace} (SelfSubjectAccessReview for each)",
            evidence=evidence,
        )
    listed = denied_text(denied)
    commands = " ".join(
        f"`kubectl auth can-i {r.access.verb} {r.access.resource}"
        + (f"/{r.access.subresource}" if r.access.subresource else "")
        + (f" -n {r.access.namespace}" if r.access.namespace else "")
        + "`"
        for r in denied[:2]
    )
    return ACCESS.finding(
        Severity.FAIL,
        subject,
        f"{caller} may not do {len(denied)} of the {len(reviews)} things up, bench and down do in "
        f"namespace {namespace}: {listed}",
        hint=f"{ACCESS.fix} E.g. {commands}.",
        evidence=evidence,
    )


# ---------------------------------------------------------------------------------------
# SB264: the server-side dry run.


@dataclass(frozen=True)
class DryRun:
    """One dry-run request: ``code`` the HTTP status (None: no answer), ``message`` and
    ``reason`` the API server's Status on a refusal, ``warnings`` its Warning headers;
    ``pod_of`` the workload whose Pod template this Pod is."""

    what: str
    request: str
    code: int | None
    message: str = ""
    reason: str = ""
    warnings: tuple[str, ...] = ()
    pod_of: str | None = None
    # What was changed to make the dry run say something (an account the apply creates).
    note: str = ""

    @property
    def refused(self) -> bool:
        return self.code is None or self.code >= 400

    @property
    def not_allowed_to_try(self) -> bool:
        """RBAC refused the dry-run Pod itself: ``up`` never creates Pods, so this says
        nothing about the deploy, only that the Pod-level checks could not run."""
        return (
            self.pod_of is not None
            and self.code == 403
            and "cannot create resource" in self.message
        )


def pods_of(obj: Obj) -> list[tuple[str, Obj]]:
    """(name, Pod) for each Pod template of a workload object, as the controller would
    create it in the object's namespace; none for other kinds."""
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    templates: list[tuple[str, Obj]] = []
    if isinstance(spec.get("template"), dict):
        templates.append((str(meta.get("name")), spec["template"]))
    lws = spec.get("leaderWorkerTemplate") or {}
    for key, suffix in (("leaderTemplate", "leader"), ("workerTemplate", "worker")):
        if isinstance(lws.get(key), dict):
            templates.append((f"{meta.get('name')}-{suffix}", lws[key]))
    out = []
    for name, t in templates:
        tmeta = t.get("metadata") or {}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}{DRY_RUN_POD_SUFFIX}"[:63].rstrip("-"),
                "namespace": meta.get("namespace"),
                "labels": dict(tmeta.get("labels") or {}),
                "annotations": dict(tmeta.get("annotations") or {}),
            },
            "spec": t.get("spec") or {},
        }
        out.append((name, pod))
    return out


def service_account_of(pod: Obj) -> str | None:
    """The ServiceAccount a Pod runs as, when not the namespace's ``default``."""
    name = (pod.get("spec") or {}).get("serviceAccountName")
    return str(name) if name and name != "default" else None


def without_account(pod: Obj) -> Obj:
    """The Pod as it would be admitted under the namespace's default account."""
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k != "serviceAccountName"}
    return {**pod, "spec": spec}


def _kind_of_refusal(message: str, reason: str) -> str:
    text = message.lower()
    if "podsecurity" in text.replace(" ", ""):
        return "Pod Security"
    if "exceeded quota" in text or "resourcequota" in text:
        return "quota"
    if "limitrange" in text or "maximum cpu" in text or "maximum memory" in text:
        return "LimitRange"
    if "admission webhook" in text:
        return "webhook"
    if reason == "Invalid":
        return "invalid"
    if "no matches for kind" in text or "could not find the requested resource" in text:
        return "kind not served"
    if reason == "Forbidden":
        return "forbidden"
    return reason or "refused"


def dry_run_finding(
    results: Sequence[DryRun],
    namespace: str,
    *,
    enforce: str | None = None,
    stand_in: str | None = None,
) -> Finding:
    """One finding for the whole set.  ``enforce`` is the namespace's Pod Security enforce
    label, for the message; ``stand_in`` the namespace the namespaced objects were dry-run
    in when ``namespace`` does not exist yet."""
    subject = f"namespace/{namespace}"
    where = (
        f" (in namespace {stand_in}, standing in for {namespace}, which does not exist yet: "
        "its own Pod Security labels, quotas and webhooks' selectors may differ)"
        if stand_in
        else ""
    )
    refusals: list[str] = []
    warnings: list[str] = []
    untried: list[str] = []
    for r in results:
        if r.not_allowed_to_try:
            untried.append(r.what)
        elif r.refused:
            kind = _kind_of_refusal(r.message, r.reason)
            said = f"{r.code} " if r.code else ""
            of = f" (the Pods of {r.pod_of})" if r.pod_of else ""
            refusals.append(f"{r.what}{of}: {kind}: {said}{r.message} [{r.request}]")
        warnings.extend(f"{r.what}: {w}" for w in r.warnings)
    changed = [f"{r.what}: {r.note}" for r in results if r.note]
    evidence: dict[str, Any] = {
        "objects": [
            {
                "object": r.what,
                "pod_of": r.pod_of,
                "request": r.request,
                "code": r.code,
                "message": r.message,
                "warnings": list(r.warnings),
                "note": r.note,
            }
            for r in results
        ],
        "enforce": enforce,
        "stand_in_namespace": stand_in,
    }
    n = len([r for r in results if r.pod_of is None])
    pods = len([r for r in results if r.pod_of is not None and not r.not_allowed_to_try])
    tried = f"{n} rendered object(s)" + (f" and {pods} Pod(s) of their templates" if pods else "")
    notes = ""
    if untried:
        notes += (
            f"; the Pods of {', '.join(untried)} were not dry-run (RBAC: no create on pods, "
            "which up does not need), so Pod Security enforcement and compute quotas were "
            "not checked"
        )
    if warnings:
        notes += f"; warnings: {'; '.join(warnings)}"
    if changed:
        notes += f"; {'; '.join(changed)}"
    if refusals:
        return ADMISSION.finding(
            Severity.FAIL,
            subject,
            f"the API server refuses {len(refusals)} of the {tried} in a server-side dry "
            f"run{where}: " + "; ".join(refusals) + notes,
            hint=ADMISSION.fix,
            evidence=evidence,
        )
    if warnings or untried:
        return ADMISSION.finding(
            Severity.WARN,
            subject,
            f"the API server admits the {tried} in a server-side dry run{where}" + notes,
            hint=ADMISSION.fix,
            evidence=evidence,
        )
    return ADMISSION.finding(
        Severity.PASS,
        subject,
        f"the API server admits the {tried} in a server-side dry run{where}" + notes,
        evidence=evidence,
    )


def enforce_level(namespace_obj: Obj | None) -> str | None:
    if not namespace_obj:
        return None
    labels = (namespace_obj.get("metadata") or {}).get("labels") or {}
    level = labels.get(PSA_ENFORCE)
    return str(level) if level in PSA_LEVELS else None


__all__ = [
    "ACCESS",
    "ADMISSION",
    "CHECKS",
    "Access",
    "AccessDenied",
    "DryRun",
    "Review",
    "access_finding",
    "denied_text",
    "describe_object",
    "dry_run_finding",
    "enforce_level",
    "load_access",
    "object_path",
    "pods_of",
    "portforward_access",
    "required_access",
    "resource_of",
    "review_from_answer",
    "server_minor",
    "service_account_of",
    "without_account",
]
