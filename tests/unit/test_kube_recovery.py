"""Pure: names and labels from the deployment name, and a deployment's record rebuilt from
API objects shaped like `kubectl get deployments,services,namespaces -o json` items (the
rendered objects with what the API server adds: uid, creationTimestamp, managedFields,
status)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from servebook.backends.base import Found
from servebook.backends.kubernetes.record import (
    PLAN_ANNOTATION,
    deployments_found,
    recover_record,
    with_plan,
)
from servebook.errors import UsageError
from servebook.kube import manifests
from servebook.kube.names import (
    CREATED_BY_ANNOTATION,
    DEPLOYMENT_LABEL,
    object_name,
    selector_for,
)
from servebook.recipe.plan import Plan
from servebook.recipe.resolve import resolve

PD = Path(__file__).parent / "fixtures" / "render" / "vllm-pd" / "values.yaml"
MIXED = Path(__file__).parent / "fixtures" / "render" / "vllm-mixed" / "values.yaml"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def pd() -> Plan:
    return resolve("vllm-pd", [], [PD])


def _as_listed(obj: Obj, i: int, ready: bool = True) -> Obj:
    """A rendered object as `kubectl get -o json` lists it."""
    out = copy.deepcopy(obj)
    meta = out["metadata"]
    meta.update(
        uid=f"0000-{i}",
        resourceVersion=str(1000 + i),
        creationTimestamp=f"2026-03-0{1 + i % 5}T10:00:00Z",
        managedFields=[{"manager": "servebook", "operation": "Apply", "apiVersion": "v1"}],
    )
    if out["kind"] == "Deployment":
        out["status"] = {"replicas": 1, "readyReplicas": 1 if ready else 0}
    return out


def _cluster(plan: Plan, name: str, *, store_plan: bool = True) -> list[Obj]:
    objs = manifests.render(plan, name)
    if store_plan:
        objs = with_plan(objs, plan, name)
    return [_as_listed(o, i) for i, o in enumerate(objs) if o["kind"] != "Namespace"]


def _namespace(name: str, created_by: str | None) -> Obj:
    ns: Obj = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "uid": "ns-1", "creationTimestamp": "2026-03-01T09:00:00Z"},
        "status": {"phase": "Active"},
    }
    if created_by:
        ns["metadata"]["annotations"] = {CREATED_BY_ANNOTATION: created_by}
    return ns


# --- names ----------------------------------------------------------------------------------


def test_names_labels_and_selectors_follow_the_deployment_name(pd: Plan) -> None:
    objs = manifests.render(pd, "blue")
    names = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert names == [
        ("Namespace", "moe-pd"),
        ("Deployment", "blue-prefill"),
        ("Service", "blue-prefill"),
        ("Deployment", "blue-decode"),
        ("Service", "blue-decode"),
        ("Deployment", "blue-router"),
        ("Service", "blue-router"),
    ]
    for o in objs[1:]:
        assert o["metadata"]["labels"][DEPLOYMENT_LABEL] == "blue"
        selector = (
            o["spec"]["selector"]["matchLabels"]
            if o["kind"] == "Deployment"
            else o["spec"]["selector"]
        )
        role = o["metadata"]["labels"]["app.kubernetes.io/component"]
        assert selector == selector_for("blue", role)
    # the default name is the recipe's: today's names
    assert [o["metadata"]["name"] for o in manifests.render(pd)][1] == "vllm-pd-prefill"
    mixed = resolve("vllm-mixed", [], [MIXED])
    assert object_name(mixed, "mixed", "green") == "green"
    assert object_name(mixed, "mixed") == "vllm-mixed"


@pytest.mark.parametrize("bad", ["Blue", "a_b", "x" * 60, "-a", "a-"])
def test_a_name_kubernetes_cannot_take_is_refused(pd: Plan, bad: str) -> None:
    with pytest.raises(UsageError, match="deployment name"):
        manifests.render(pd, bad)


# --- recovery -------------------------------------------------------------------------------


def test_a_deployment_is_recovered_from_its_labelled_objects(pd: Plan) -> None:
    objects = [
        *_cluster(pd, "a"),
        *_cluster(pd, "b"),
        _namespace("moe-pd", created_by="a"),
    ]
    dep = recover_record("a", objects)
    assert dep is not None
    assert (dep.name, dep.recipe, dep.namespace) == ("a", "vllm-pd", "moe-pd")
    assert dep.created_namespace
    assert dep.roles == {"prefill": "a-prefill", "decode": "a-decode", "router": "a-router"}
    assert [(o.kind, o.name) for o in dep.objects] == [
        ("Namespace", "moe-pd"),
        ("Deployment", "a-prefill"),
        ("Service", "a-prefill"),
        ("Deployment", "a-decode"),
        ("Service", "a-decode"),
        ("Deployment", "a-router"),
        ("Service", "a-router"),
    ]
    assert (dep.entry_service, dep.entry_port) == ("a-router", 8000)
    assert dep.served_model_name == pd.served_model_name
    assert Plan.model_validate(dep.plan) == pd
    assert dep.created == "2026-03-01T10:00:00Z" and dep.ready  # the earliest
    b = recover_record("b", objects)
    assert b is not None and not b.created_namespace  # a created it, not b
    assert all(o.name.startswith("b-") for o in b.objects)
    assert recover_record("c", objects) is None


def test_recovery_without_the_stored_plan_reads_the_objects(pd: Plan) -> None:
    objects = _cluster(pd, "a", store_plan=False)
    objects[0]["status"]["readyReplicas"] = 0  # prefill not ready
    dep = recover_record("a", [*reversed(objects), _namespace("moe-pd", created_by=None)])
    assert dep is not None
    assert dep.plan == {} and not dep.ready and not dep.created_namespace
    assert list(dep.roles) == ["prefill", "decode", "router"]
    assert dep.entry_service == "a-router" and dep.recipe == "vllm-pd"
    assert dep.served_model_name == pd.served_model_name  # from --served-model-name


def test_a_deployment_in_two_namespaces_asks_for_one(pd: Plan) -> None:
    objects = _cluster(pd, "a")
    other = copy.deepcopy(objects[0])
    other["metadata"]["namespace"] = "elsewhere"
    with pytest.raises(UsageError, match="-n"):
        recover_record("a", [*objects, other])


def test_the_deployments_are_listed_from_labelled_objects(pd: Plan) -> None:
    mixed = resolve("vllm-mixed", [], [MIXED])
    unlabelled = _as_listed(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "someone-elses", "namespace": "moe-pd", "labels": {"app": "x"}},
            "spec": {},
        },
        9,
    )
    listed = {
        "kind": "List",
        "apiVersion": "v1",
        "items": [
            *_cluster(pd, "b"),
            *_cluster(mixed, "vllm-mixed"),
            *_cluster(pd, "a"),
            unlabelled,
            _namespace("moe-pd", created_by="a"),
        ],
    }
    items = json.loads(json.dumps(listed))["items"]
    assert deployments_found(items) == [
        Found("vllm-mixed", "dense-8b", "vllm-mixed", ("mixed",)),
        Found("a", "moe-pd", "vllm-pd", ("prefill", "decode", "router")),
        Found("b", "moe-pd", "vllm-pd", ("prefill", "decode", "router")),
    ]
    assert PLAN_ANNOTATION in items[4]["metadata"]["annotations"]  # the router's Deployment
