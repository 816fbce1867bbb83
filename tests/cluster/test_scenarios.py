"""What a real API server does over time (deletion, Terminating namespaces, paging, unserved
groups), server-side apply and its refusals, Pod Security, RBAC on port-forwards, and
servebook's port-forwards through the API server, on the cluster of the tests (the test plane
by default).  These ran on the stand-in API server too until issue 43: where the two had
disagreed, the plane was right, and the stand-in (tests/unit/kube_standin.py) keeps only what
the plane cannot show."""

from __future__ import annotations

import asyncio
import base64
import http.client
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from servebook.backends.kubernetes import deployer as kube_backend
from servebook.findings import Severity
from servebook.kube import client as kube_client
from servebook.kube import resources
from servebook.kube.names import CREATED_BY_ANNOTATION, DEPLOYMENT_LABEL
from servebook.preflight.live import LiveOptions, plan_findings
from servebook.recipe.resolve import resolve
from tests.cluster.conftest import PLANE_IMAGE, POD_PORT, Kube, until
from tests.conftest import CliResult
from tests.rbac_rules import CLUSTER_READS, forward_rules

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

Obj = dict[str, Any]
Cli = Callable[..., CliResult]
VALUES = Path(__file__).parents[1] / "unit" / "fixtures" / "render" / "vllm-pd" / "values.yaml"
# vllm-pd's engines (VALUES) are pinned to nodes gpu-node-1 and gpu-node-2, which the plane
# does not have: they stay Pending, and no vLLM starts.  Its router runs vllm-router.
WIDE = VALUES.parents[1] / "vllm-pd-wide-ep-replicas" / "values.yaml"
CLIENT_FAILS = (OSError, http.client.HTTPException, urllib.error.URLError)


def _get(api: Any, path: str) -> Obj | None:
    return kube_client.call(api, "GET", path, "reading", missing_ok=True)


def _pods(api: Any, ns: str) -> list[Obj]:
    return resources.list_objects(api, "Pod", ns)


def _ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _slow_to_stop(ns: str, name: str, grace_s: int) -> Obj:
    """A Deployment whose Pod ignores SIGTERM: it stops when its grace period ends."""
    labels = {"app.kubernetes.io/component": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": grace_s,
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox:1.36",
                            "command": ["sh", "-c", "trap '' TERM; sleep 3600"],
                            # Ready once the shell surely ignores SIGTERM: a Pod deleted
                            # before (its container just started) stopped at once.
                            "readinessProbe": {
                                "exec": {"command": ["true"]},
                                "initialDelaySeconds": 2,
                                "periodSeconds": 1,
                            },
                        }
                    ],
                },
            },
        },
    }


def _running(api: Any, ns: str) -> list[Obj]:
    return until("the Deployment's Pod running", lambda: [p for p in _pods(api, ns) if _ready(p)])


# --- what a real API server does over time ---------------------------------------------------


def test_a_foreground_delete_leaves_the_object_until_its_pods_have_stopped(kube: Kube) -> None:
    ns = kube.namespace()
    api = kube_client.connect()
    resources.apply(api, [_slow_to_stop(ns, "web", grace_s=3)], lambda s: None)
    _running(api, ns)
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/web"
    t0 = time.monotonic()
    kube_client.call(api, "DELETE", path, "deleting", body={"propagationPolicy": "Foreground"})
    dep = _get(api, path)
    assert dep is not None, "deleted at once, Pods and all"
    assert dep["metadata"]["deletionTimestamp"]
    assert dep["metadata"]["finalizers"] == ["foregroundDeletion"]
    until("the Pod terminating", lambda: _pods(api, ns)[0]["metadata"].get("deletionTimestamp"))
    until("the Deployment gone", lambda: _get(api, path) is None and not _pods(api, ns))
    assert time.monotonic() - t0 >= 2.5, "gone before its Pod's grace period ended"


@pytest.mark.admin(
    "deleting a namespace, asking for one that does not exist, and creating one are the "
    "platform's: a tenant is refused each (403) before the API server looks"
)
def test_a_terminating_namespace_refuses_creates_not_as_rbac_and_up_waits_for_it(
    kube: Kube,
) -> None:
    ns = kube.namespace()
    api = kube_client.connect()
    resources.apply(api, [_slow_to_stop(ns, "web", grace_s=5)], lambda s: None)
    _running(api, ns)
    kube_client.call(api, "DELETE", f"/api/v1/namespaces/{ns}", "deleting")
    space = _get(api, f"/api/v1/namespaces/{ns}")
    assert space is not None and space["status"]["phase"] == "Terminating"
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": ns}}

    def apply_config(namespace: str) -> None:
        kube_client.call(
            api,
            "PATCH",
            f"/api/v1/namespaces/{namespace}/configmaps/c",
            "applying",
            params={"fieldManager": "t"},
            body={**config, "metadata": {"name": "c", "namespace": namespace}},
            content_type="application/apply-patch+yaml",
        )

    with pytest.raises(kube_client.RequestFailed) as refused:
        apply_config(ns)
    assert refused.value.code == 403
    assert refused.value.status["message"] == (
        f'configmaps "c" is forbidden: unable to create new content in namespace {ns} because '
        "it is being terminated"
    )
    assert refused.value.status["details"]["causes"][0]["reason"] == "NamespaceTerminating"
    # servebook's apply says so, not that it lacks permissions.
    with pytest.raises(resources.NamespaceTerminating) as e:
        resources.apply(api, [_slow_to_stop(ns, "other", grace_s=1)], lambda s: None)
    assert f"namespace {ns} is being deleted (Terminating)" in str(e.value)
    assert "RBAC" not in str(e.value) and "servebook needs" not in str(e.value)
    absent = kube.namespace(create=False)
    with pytest.raises(kube_client.RequestFailed) as missing:
        apply_config(absent)
    assert missing.value.code == 404
    assert missing.value.status["message"] == f'namespaces "{absent}" not found'
    # Issue 23 point 2: `up` into it (another client's `down` still finishing) waits for it
    # to go, saying so, then creates it again as its own and applies.
    said: list[str] = []
    plan = resolve("vllm-pd", [f"namespace={ns}"], [VALUES])
    kube_backend.apply_deployment(kube_backend._api(), plan, "pd", say=said.append)
    assert any(f"namespace {ns} is being deleted (Terminating" in s for s in said), said
    again = _get(api, f"/api/v1/namespaces/{ns}")
    assert again is not None and again["metadata"]["uid"] != space["metadata"]["uid"]
    assert again["metadata"]["annotations"][CREATED_BY_ANNOTATION] == "pd"
    assert kube.names("deployments", ns) == ["pd-decode", "pd-prefill", "pd-router"]


def test_lists_page_with_limit_and_continue(kube: Kube) -> None:
    ns = kube.namespace()
    api = kube_client.connect()
    objs = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"c{i}", "namespace": ns}}
        for i in range(5)
    ]
    resources.apply(api, objs, lambda s: None)
    path = f"/api/v1/namespaces/{ns}/configmaps"
    everything = [i["metadata"]["name"] for i in kube_client.list_items(api, path, "listing")]
    # A namespace's controllers publish the cluster's CA bundle into every namespace.
    assert everything == ["c0", "c1", "c2", "c3", "c4", "kube-root-ca.crt"]
    first = kube_client.call(api, "GET", path, "listing", params={"limit": "2"})
    assert first is not None and len(first["items"]) == 2
    assert first["metadata"]["continue"] and first["metadata"]["remainingItemCount"] == 4
    got = kube_client.list_items(api, path, "listing", page=2)
    assert [i["metadata"]["name"] for i in got] == everything


@pytest.mark.admin(
    "RBAC judges a request before the API server routes it: a tenant not granted the unserved "
    "group's kind gets 403, not the plain-text 404 this is about"
)
def test_an_unserved_group_answers_the_plain_text_404_and_servebook_names_the_crd(
    kube: Kube,
) -> None:
    ns = kube.namespace()
    api = kube_client.connect()
    with pytest.raises(kube_client.RequestFailed) as e:
        kube_client.send(api, "GET", "/apis/example.servebook.io/v1/widgets", "x")
    assert e.value.code == 404 and e.value.status == {}
    assert "404 page not found" in str(e.value.__cause__.response.text)  # type: ignore[union-attr]
    widget = resources.Where("example.servebook.io/v1", ns, "widgets/w")
    with pytest.raises(resources.NotServed) as refused:
        resources.request(
            api,
            "PATCH",
            widget,
            "applying Widget/w",
            params={"fieldManager": resources.FIELD_MANAGER},
            body={"apiVersion": "example.servebook.io/v1", "kind": "Widget", "metadata": {}},
            content_type="application/apply-patch+yaml",
        )
    text = str(refused.value)
    assert "does not serve example.servebook.io/v1 widgets" in text, text
    assert "Install the CustomResourceDefinition widgets.example.servebook.io" in text, text


# --- server-side apply and its refusals ---------------------------------------------------------


def _owned(api: Any, ns: str, name: str) -> dict[str, Obj]:
    return {
        f"{kind}/{o['metadata']['name']}": o
        for kind in ("Deployment", "Service")
        for o in resources.list_objects(api, kind, ns, {DEPLOYMENT_LABEL: name})
    }


@pytest.mark.admin("up creates the namespace and applies it again: a tenant may create none")
def test_apply_is_server_side_and_idempotent(kube: Kube) -> None:
    ns = kube.namespace(create=False)  # up creates it
    plan = resolve("vllm-pd", [f"namespace={ns}"], [VALUES])
    api = kube_backend._api()
    kube_backend.apply_deployment(api, plan, "vllm-pd")
    first = _owned(api, ns, "vllm-pd")
    space = _get(api, f"/api/v1/namespaces/{ns}")
    kube_backend.apply_deployment(api, plan, "vllm-pd")
    again = _owned(api, ns, "vllm-pd")
    assert sorted(again) == [
        f"{kind}/vllm-pd-{role}"
        for kind in ("Deployment", "Service")
        for role in ("decode", "prefill", "router")
    ]
    # The same objects, applied again in place (not deleted and re-created, not changed).
    uid = {k: o["metadata"]["uid"] for k, o in first.items()}
    assert {k: o["metadata"]["uid"] for k, o in again.items()} == uid
    for k, o in again.items():
        if k.startswith("Deployment/"):
            assert o["metadata"]["generation"] == first[k]["metadata"]["generation"] == 1, k
    assert space is not None
    assert space["metadata"]["annotations"][CREATED_BY_ANNOTATION] == "vllm-pd"
    again_space = _get(api, f"/api/v1/namespaces/{ns}")
    assert again_space is not None and again_space["metadata"]["uid"] == space["metadata"]["uid"]
    prefill = again["Deployment/vllm-pd-prefill"]
    applied = [m for m in prefill["metadata"]["managedFields"] if m["operation"] == "Apply"]
    assert [m["manager"] for m in applied] == ["servebook"]  # server-side apply, as servebook
    assert prefill["spec"]["selector"]["matchLabels"][DEPLOYMENT_LABEL] == "vllm-pd"


@pytest.mark.admin("up creates the namespace here: a tenant may create none")
def test_a_field_manager_conflict_is_reported_naming_the_object_not_overwritten(
    kube: Kube, cli: Cli
) -> None:
    ns = kube.namespace(create=False)
    kube_backend.apply_deployment(
        kube_backend._api(), resolve("vllm-pd", [f"namespace={ns}"], [VALUES]), "vllm-pd"
    )
    manager = kube.set_replicas(ns, "vllm-pd-prefill", 0)  # someone ran `kubectl patch`
    up = ["up", "vllm-pd", "--backend", "kubernetes", "-f", str(VALUES), "--set", f"namespace={ns}"]
    r = cli(*up, timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"applying Deployment/vllm-pd-prefill in namespace {ns}" in r.stderr
    assert "conflicts with another field manager" in r.stderr
    assert ".spec.replicas" in r.stderr and f'"{manager}"' in r.stderr, r.stderr
    dep = _get(kube_backend._api(), f"/apis/apps/v1/namespaces/{ns}/deployments/vllm-pd-prefill")
    assert dep is not None and dep["spec"]["replicas"] == 0  # not forced over


# Everything `up` uses in a namespace, but patching Deployments.
ALL_BUT_PATCHING_DEPLOYMENTS = [
    {
        "apiGroups": ["", "rbac.authorization.k8s.io", "leaderworkerset.x-k8s.io", "batch"],
        "resources": ["*"],
        "verbs": ["*"],
    },
    {
        "apiGroups": ["apps"],
        "resources": ["*"],
        "verbs": ["get", "list", "watch", "create", "update", "delete"],
    },
]


def test_a_permission_up_lacks_is_exit_2_at_the_start_naming_it(kube: Kube, cli: Cli) -> None:
    """up asks for every permission it needs before it applies anything (issue 43): one
    missing is exit 2 naming the verb and resource, with nothing applied, not a 403 part-way
    through the apply."""
    ns = kube.namespace()
    cfg = kube.grant(ns, ALL_BUT_PATCHING_DEPLOYMENTS, [])
    up = ["up", "vllm-pd", "--backend", "kubernetes", "-f", str(VALUES), "--set", f"namespace={ns}"]
    r = cli(*up, env={"KUBECONFIG": cfg}, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "up vllm-pd needs permissions" in r.stderr, r.stderr
    assert f"in namespace {ns}: patch deployments.apps" in r.stderr, r.stderr
    assert "Nothing was changed" in r.stderr and "applying" not in r.stderr, r.stderr
    for kind in ("deployments", "services", "configmaps"):
        assert [n for n in kube.names(kind, ns) if n.startswith("vllm-pd")] == [], kind


def _up_under_baseline(kube: Kube, recipe: str, values: Path, name: str) -> tuple[str, str]:
    """``up`` of ``recipe`` in a namespace enforcing Pod Security baseline: (the namespace,
    the failure's words), asserted to come at once, not after waiting for a Pod that
    cannot come."""
    ns = kube.namespace(labels={"pod-security.kubernetes.io/enforce": "baseline"})
    plan = resolve(recipe, [f"namespace={ns}"], [values])
    t0 = time.monotonic()
    with pytest.raises(Exception) as e:
        kube_backend.up(plan, name=name, timeout_s=90, poll_s=0.2)
    assert time.monotonic() - t0 < 60, "it waited for a Pod that cannot come"
    return ns, str(e.value)


def test_a_deployment_whose_pods_pod_security_refuses_fails_with_the_reason(kube: Kube) -> None:
    """vllm-pd's engines mount their weights by hostPath, which baseline forbids: the
    ReplicaSet controller makes no Pod and records FailedCreate on its ReplicaSet; ``up``
    fails at once with those words."""
    ns, text = _up_under_baseline(kube, "vllm-pd", VALUES, "pd")
    for role in ("prefill", "decode"):
        refused = re.search(
            rf'{role}: the cluster refused to create its Pod: Error creating: pods "pd-{role}-'
            r'[0-9a-z]+-[0-9a-z]{5}" is forbidden: (.*)',
            text,
        )
        assert refused is not None, text
        assert refused.group(1) == (
            'violates PodSecurity "baseline:latest": non-default capabilities (container '
            '"engine" must not include "IPC_LOCK" in securityContext.capabilities.add), '
            'hostPath volumes (volume "model")'
        ), text
    # Only the router, which mounts nothing from the node, was admitted.
    pods = kube.names("pods", ns)
    assert pods and all(p.startswith("pd-router-") for p in pods), pods


def test_a_leaderworkerset_whose_pods_pod_security_refuses_fails_with_the_reason(
    kube: Kube,
) -> None:
    """Issue 23 point 11: the API server refuses the set's Pods (Pod Security's baseline
    level: the engines' hostPath model volume and added capabilities); the refusal is only
    on the StatefulSets' events, and ``up`` fails with it at once instead of waiting two
    minutes to ask whether the controller runs."""
    _, text = _up_under_baseline(kube, "vllm-pd-wide-ep", WIDE, "wide")
    assert "the cluster refused to create the Pods of LeaderWorkerSet" in text, text
    assert 'violates PodSecurity "baseline:latest"' in text, text
    assert "is the LeaderWorkerSet controller running" not in text


# --- port-forwards: RBAC, servebook's dialer, a Pod's identity ---------------------------------


async def _upgrade(kubeconfig: str, ns: str, pod: str) -> int:
    """The status of a port-forward WebSocket upgrade (101 when it is let through), asked
    with the kubeconfig's server, CA and bearer token."""
    cfg = yaml.safe_load(Path(kubeconfig).read_text())
    cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
    context: ssl.SSLContext | bool = False
    if "certificate-authority-data" in cluster:
        ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
        context = ssl.create_default_context(cadata=ca)
    url = f"{cluster['server']}/api/v1/namespaces/{ns}/pods/{pod}/portforward?ports={POD_PORT}"
    headers = {"Authorization": f"Bearer {user['token']}"}
    async with aiohttp.ClientSession() as session:
        try:
            async with session.ws_connect(
                url, protocols=("v4.channel.k8s.io",), headers=headers, ssl=context
            ) as ws:
                await ws.close()
                return 101
        except aiohttp.WSServerHandshakeError as e:
            return e.status


def _fetch(url: str) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as r:
        return bytes(r.read())


def _forwards(api: Any) -> Any:
    from servebook.kube.kr8s_dialer import Kr8sDialer, kr8s_pod_identity
    from servebook.kube.portforward import Forwards

    return Forwards(
        Kr8sDialer(api, timeout_s=10),
        pod_identity=kr8s_pod_identity(api),
        timeout_s=20,
        watch_period_s=0.5,
    )


def _server_minor(api: Any) -> int:
    version = api.version()
    return int("".join(ch for ch in str(version.get("minor", "")) if ch.isdigit()))


@pytest.mark.parametrize("verbs", [("get", "create"), ("get",), ("create",), ()])
def test_a_role_and_the_port_forward_verbs_preflight_the_upgrade_and_the_dialer_agree(
    kube: Kube, verbs: tuple[str, ...]
) -> None:
    """What a WebSocket port-forward needs, asked as the API server authorizes it (issue 23
    point 3): the upgrade is a GET (`get pods/portforward`), and from Kubernetes 1.35 the
    server checks `create` as well (KEP-4006, kubernetes#134577).  Preflight's access review
    (SB263), the upgrade's own status, and servebook's dialer with the kubeconfig's
    credentials all say the same for a Role with each set of verbs."""
    ns = kube.namespace()
    kube.run_pod(ns, "server")
    needed = (
        ["get", "create"] if _server_minor(kube_client.connect(kube.kubeconfig)) >= 35 else ["get"]
    )
    missing = [f"{v} pods/portforward" for v in needed if v not in verbs]
    cfg = kube.grant(ns, forward_rules(*verbs), [CLUSTER_READS])
    # Preflight's verdict
    plan = resolve("tiny-mixed", [f"image={PLANE_IMAGE}", f"namespace={ns}"], [])
    found = plan_findings(plan, options=LiveOptions(kubeconfig=cfg, poll_s=0.2))
    (access,) = [f for f in found if f.check == "SB263"]
    denied = [d["access"] for d in access.evidence.get("denied", [])]
    assert denied == missing, access.message
    assert access.severity is (Severity.FAIL if missing else Severity.PASS), access.message
    if missing:
        assert "WebSocket" in access.message
    # The API server's answer to the upgrade
    assert asyncio.run(_upgrade(cfg, ns, "server")) == (403 if missing else 101)
    # servebook's forward, with the kubeconfig's credentials
    with _forwards(kube_client.connect(cfg)) as fw:
        url = fw.open(role="decode", pod="server", namespace=ns, remote_port=POD_PORT)
        if not missing:
            assert _fetch(url + "/v1/models") == b"pod-answer /v1/models"
            assert _fetch(url + "/metrics") == b"pod-answer /metrics"
            assert fw.problems() == {} and fw.alive("decode")
            fw.check()
            return
        with pytest.raises(CLIENT_FAILS):
            _fetch(url + "/metrics")
        until("the forward's failure", lambda: "decode" in fw.problems(), 20)
        reason = fw.problems()["decode"]
        assert "403 Forbidden to the port-forward for" in reason, reason
        assert "needs get on pods/portforward, and create on it too from Kubernetes" in reason
        assert f"pod {ns}/server port {POD_PORT}" in reason, reason


def test_kr8s_pod_identity_notices_a_restart_and_a_deletion(kube: Kube) -> None:
    from servebook.kube.kr8s_dialer import kr8s_pod_identity

    ns = kube.namespace()
    kube.run_pod(ns, "server")
    api = kube_client.connect(kube.kubeconfig)
    identity = kr8s_pod_identity(api)
    first = identity(ns, "server")
    assert first is not None
    assert identity(ns, "no-such-pod") is None
    with _forwards(api) as fw:  # the container exits after answering /exit, and restarts
        url = fw.open(role="decode", pod="server", namespace=ns, remote_port=POD_PORT)
        assert _fetch(url + "/exit") == b"pod-answer /exit"
        until("a restart seen", lambda: identity(ns, "server") not in (None, first), 60)
        until("the forward failing", lambda: "decode" in fw.problems(), 20)
        assert "was replaced" in fw.problems()["decode"], fw.problems()
    client = kube_client.connect()
    kube_client.call(client, "DELETE", f"/api/v1/namespaces/{ns}/pods/server", "deleting")
    assert identity(ns, "server") is None


def test_a_dry_run_in_a_namespace_enforcing_restricted_names_each_refusal_in_its_words(
    kube: Kube,
) -> None:
    """Preflight's server-side dry run (SB264) of vllm-pd's objects and their Pods where
    Pod Security enforces `restricted`: each Pod is refused with the API server's own
    reasons, the router's (which mounts nothing from the node) included."""
    ns = kube.namespace(labels={"pod-security.kubernetes.io/enforce": "restricted"})
    plan = resolve("vllm-pd", [f"namespace={ns}"], [VALUES])
    found = plan_findings(plan, options=LiveOptions(kubeconfig=kube.kubeconfig, poll_s=0.2))
    (adm,) = [f for f in found if f.check == "SB264"]
    assert adm.severity is Severity.FAIL, adm.message
    assert "refuses 3 of the 6 rendered object(s) and 3 Pod(s)" in adm.message, adm.message
    router = (
        'pods "vllm-pd-router-servebook-dry-run" is forbidden: violates PodSecurity '
        '"restricted:latest": allowPrivilegeEscalation != false (container "router" must set '
        "securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container "
        '"router" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true '
        '(pod or container "router" must set securityContext.runAsNonRoot=true), seccompProfile '
        '(pod or container "router" must set securityContext.seccompProfile.type to '
        '"RuntimeDefault" or "Localhost")'
    )
    assert router in adm.message, adm.message
    engine = (
        'unrestricted capabilities (container "engine" must set '
        'securityContext.capabilities.drop=["ALL"]; container "engine" must not include '
        '"IPC_LOCK" in securityContext.capabilities.add), restricted volume types (volume '
        '"model" uses restricted volume type "hostPath")'
    )
    assert adm.message.count(engine) >= 2, adm.message  # prefill's and decode's Pods
    # The Deployments are admitted with Pod Security's warnings, read as text.
    assert 'Deployment/vllm-pd-router: would violate PodSecurity "restricted:latest"' in (
        adm.message
    ), adm.message
    assert "\\" not in adm.message, adm.message
