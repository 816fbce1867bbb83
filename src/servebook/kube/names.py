"""What a deployment's Kubernetes objects are called, labelled and selected by, and the
ports they listen on: the names ``kube.manifests`` renders, and the backend, preflight and
``servebook render`` find them by.  Object names, labels and Pod selectors derive from the
deployment's name, so two deployments of one recipe share a namespace without touching
each other.
"""

from __future__ import annotations

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
