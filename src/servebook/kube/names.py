"""What a deployment's Kubernetes objects are called, labelled and selected by, and the
ports they listen on: the names ``kube.manifests`` renders, and the backend, preflight and
``servebook render`` find them by.  Object names, labels and Pod selectors derive from the
deployment's name, so two deployments of one recipe share a namespace without touching
each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from servebook.errors import UsageError
from servebook.recipe.plan import Plan, RolePlan
from servebook.recipe.schema import Kubernetes

ENGINE_PORT = 8000
ROUTER_PORT = 8000
ROUTER_METRICS_PORT = 29000
HOSTNAME_LABEL = "kubernetes.io/hostname"
MANAGED_BY = "servebook"
# Every object of a deployment carries its deployment's name under this label, and every
# role's Pod selector includes it: two deployments of one recipe in one namespace never
# select each other's Pods, and `down a` finds (and deletes) only a's objects.
DEPLOYMENT_LABEL = "servebook.io/deployment"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# The recipe a deployment was made from (annotation on its Deployments and Services).
RECIPE_ANNOTATION = "servebook.io/recipe"
# On a Namespace servebook created: the deployment that created it (only such a namespace
# is ever deleted by `down`).
CREATED_BY_ANNOTATION = "servebook.io/created-by"
# The generator a Pod runs to make a model in place (kubernetes.model_source 'generate'):
# servebook/models/tiny.py, shipped under this key of a ConfigMap (``kube.engine_pod``
# mounts it).
GENERATOR_KEY = "tiny_model.py"

# A role whose one copy spans nodes is a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1,
# kubernetes-sigs/lws): a group of nodes_per_replica Pods, the leader (worker index 0)
# serving the API, the workers headless engines, joined by vLLM's multi-node data
# parallelism (docs/serving/data_parallel_deployment.md).  The LWS controller injects
# LWS_LEADER_ADDRESS (the leader's name under the group's headless Service),
# LWS_GROUP_SIZE and LWS_WORKER_INDEX into every container; Kubernetes expands
# $(LWS_LEADER_ADDRESS) in args.  It names that headless Service after the
# LeaderWorkerSet, so the set is NAME-ROLE-lws and NAME-ROLE stays the role's Service.
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_SUFFIX = "-lws"
# Which member of a group a Pod is (leader serves the API; workers run headless).
MEMBER_LABEL = "servebook.io/member"


def settings(plan: Plan) -> Kubernetes:
    """The recipe's Kubernetes settings, or the defaults when it gives none."""
    return plan.kubernetes or Kubernetes()


def role_object_name(deployment: str, role: str) -> str:
    """The Deployment and Service name of a role of deployment ``deployment``: the
    deployment's name for a mixed server, ``NAME-ROLE`` for the PD roles (vllm-pd-prefill,
    vllm-pd-decode, vllm-pd-router for a deployment named vllm-pd)."""
    return deployment if role == "mixed" else f"{deployment}-{role}"


def object_name(plan: Plan, role: str, name: str | None = None) -> str:
    """``role_object_name`` of deployment ``name`` (default: the recipe's name)."""
    return role_object_name(name or plan.recipe, role)


def selector_for(deployment: str, role: str) -> dict[str, str]:
    """The labels that select a role's Pods: its deployment's and its role's."""
    return {DEPLOYMENT_LABEL: deployment, COMPONENT_LABEL: role}


def api_selector_for(deployment: str, role: RolePlan) -> dict[str, str]:
    """The labels that select the role's Pods that serve the API: all of them, or, for a
    role whose copy spans nodes, the group leaders (workers are headless)."""
    sel = selector_for(deployment, role.name)
    if role.spans_nodes:
        sel[MEMBER_LABEL] = "leader"
    return sel


def lws_name(deployment: str, role: str) -> str:
    """The LeaderWorkerSet of a role whose copy spans nodes (and its headless Service)."""
    return role_object_name(deployment, role) + LWS_SUFFIX


def router_account_name(deployment: str) -> str:
    return f"{deployment}-router"


def deployment_selector(deployment: str) -> str:
    """A label selector (query text) for every object of a deployment."""
    return f"{DEPLOYMENT_LABEL}={deployment}"


def generator_configmap_name(deployment: str) -> str:
    return f"{deployment}-model-generator"


# ---------------------------------------------------------------------------------------
# What the API server and the controllers accept as names, computed from the objects a
# render makes (so a name that would be refused half-way through an apply, or whose Pods a
# controller could never create, is refused before anything is written).
#
# The rules, as k8s.io/apimachinery/pkg/util/validation/validation.go states them:
# a Service's name is a DNS-1035 label (it becomes a DNS name: it must start with a
# letter), a Namespace's a DNS-1123 label, most other objects' a DNS-1123 subdomain, and a
# label value at most 63 characters.  A StatefulSet labels its Pods
# controller-revision-hash=NAME-HASH, HASH up to 10 characters (controller.ComputeHash),
# with no truncation (kubernetes#64023): a StatefulSet name over 52 characters has Pods
# that are never created.  A LeaderWorkerSet makes a leader StatefulSet named after itself
# and, per group, a worker StatefulSet named after the group's leader Pod, LWS-INDEX
# (kubernetes-sigs/lws pkg/controllers/pod_controller.go), and a headless Service named
# after itself.

LABEL_MAX = 63
SUBDOMAIN_MAX = 253
REVISION_HASH_MAX = 10
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
# The API server's own wording of each rule (validation.go).
DNS1035_RULE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start "
    "with an alphabetic character, and end with an alphanumeric character"
)
DNS1123_LABEL_RULE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)
DNS1123_SUBDOMAIN_RULE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character"
)
LABEL_VALUE_RULE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
    "or '.', and must start and end with an alphanumeric character"
)
_RULES = {
    "dns1035": (_DNS1035, LABEL_MAX, DNS1035_RULE),
    "dns1123-label": (_DNS1123_LABEL, LABEL_MAX, DNS1123_LABEL_RULE),
    "dns1123-subdomain": (_DNS1123_SUBDOMAIN, SUBDOMAIN_MAX, DNS1123_SUBDOMAIN_RULE),
    "label-value": (_LABEL_VALUE, LABEL_MAX, LABEL_VALUE_RULE),
}
# kind -> the rule for its metadata.name
NAME_RULE = {"Service": "dns1035", "Namespace": "dns1123-label"}


def name_errors(text: str, rule: str) -> list[str]:
    """The API server's errors for ``text`` under ``rule`` (empty: accepted)."""
    regex, limit, words = _RULES[rule]
    out = []
    if len(text) > limit:
        out.append(f"must be no more than {limit} characters")
    if not regex.fullmatch(text) or (rule != "label-value" and not text):
        out.append(words)
    return out


@dataclass(frozen=True)
class Derived:
    """A name or label value the cluster will see, ``why`` it exists, and its rule; a
    StatefulSet's revision label carries ``pad`` characters more than ``text``."""

    text: str
    why: str
    rule: str
    pad: int = 0


def derived_names(objects: list[dict[str, Any]]) -> list[Derived]:
    """Every name and label value the objects make the cluster hold: the objects' own,
    their labels and Pod template labels, and what a LeaderWorkerSet's controller makes."""
    out: list[Derived] = []
    for obj in objects:
        kind = str(obj.get("kind"))
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        who = f"{kind}/{name}"
        out.append(Derived(name, f"the name of {who}", NAME_RULE.get(kind, "dns1123-subdomain")))
        spec = obj.get("spec") or {}
        templates = [spec.get("template")]
        lwt = spec.get("leaderWorkerTemplate") or {}
        templates += [lwt.get("leaderTemplate"), lwt.get("workerTemplate")]
        labels = dict(meta.get("labels") or {})
        for t in templates:
            labels.update(((t or {}).get("metadata") or {}).get("labels") or {})
        for k, v in labels.items():
            out.append(Derived(str(v), f"the value of label {k} on {who}", "label-value"))
        if kind == LWS_KIND:
            out.append(Derived(name, f"the name of {who}'s headless Service", "dns1035"))
            hash_pad = 1 + REVISION_HASH_MAX
            stateful = [(name, "leader")]
            if int(lwt.get("size") or 1) > 1:
                stateful += [(f"{name}-{i}", "worker") for i in range(int(spec.get("replicas", 1)))]
            for sts, member in stateful:
                out.append(
                    Derived(
                        sts,
                        f"{who}'s {member} StatefulSet {sts} labels its Pods "
                        f"controller-revision-hash={sts}-<hash of up to {REVISION_HASH_MAX} "
                        "characters> (kubernetes#64023)",
                        "label-value",
                        pad=hash_pad,
                    )
                )
    return out


def check_names(objects: list[dict[str, Any]], name: str, whose: str, fix: str) -> None:
    """Refuse (exit 2) a deployment name that makes any name or label value the API
    server or a controller refuses, naming each, and the longest name that would do."""
    problems: list[str] = []
    longest: int | None = None
    for d in derived_names(objects):
        limit = _RULES[d.rule][1]
        size = len(d.text) + d.pad
        if d.text.startswith(name):
            room = limit - (size - len(name))
            longest = room if longest is None else min(longest, room)
        errors = name_errors(d.text, d.rule)
        if d.pad and size > limit:
            errors = [f"{size} characters, and a label value may have at most {limit}"]
        if errors:
            problems.append(f"{d.why}: {d.text!r}: {'; '.join(errors)}")
    if problems:
        most = (
            f"This recipe leaves room for a name of at most {longest} characters."
            if longest is not None and longest < len(name)
            else ""
        )
        raise UsageError(
            f"{whose} makes {len(problems)} name(s) the Kubernetes API server or its "
            "controllers refuse; nothing was written:\n"
            + "\n".join(f"  {p}" for p in dict.fromkeys(problems))
            + "\n"
            + " ".join(x for x in (most, fix) if x)
        )
