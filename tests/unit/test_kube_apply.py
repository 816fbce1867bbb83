"""The kubernetes backend's apply, down and status over real HTTP, against a stand-in API
server (tests/unit/kube_standin.py) that keeps objects in memory and answers as the real
one does: server-side apply as field manager servebook, deployments named and labelled by
their name beside each other, refusals (another deployment's object, a field-manager
conflict, a 403) as exit 2 naming the object or request, and state recovered from labels
when the local record is gone.

Server-side apply's idempotence, a field-manager conflict and a 403 run against this
stand-in and the test plane with one body each (tests/cluster/test_scenarios.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from servebook.backends.kubernetes import deployer as kube
from servebook.backends.kubernetes.record import find_deployment, read_state
from servebook.errors import UsageError
from servebook.kube.names import CREATED_BY_ANNOTATION, DEPLOYMENT_LABEL
from servebook.recipe.plan import Plan
from servebook.recipe.resolve import resolve
from tests.conftest import CliResult
from tests.unit.kube_standin import Server, StandIn, dump, serve

Cli = Callable[..., CliResult]
VALUES = Path(__file__).parent / "fixtures" / "render" / "vllm-pd" / "values.yaml"
NS = "moe-pd"  # the namespace VALUES names
UP = ["up", "vllm-pd", "--backend", "kubernetes", "-f", str(VALUES)]


@pytest.fixture
def cluster(
    tmp_path: Path, sb_home: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[StandIn, dict[str, str]]]:
    server: Server = serve()
    cfg = server.write_kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    try:
        yield server.standin, {"KUBECONFIG": str(cfg)}
    finally:
        server.stop()


@pytest.fixture
def plan() -> Plan:
    return resolve("vllm-pd", [], [VALUES])


def _mine(st: StandIn, name: str) -> list[str]:
    return sorted(
        f"{p}/{n}"
        for (p, _, n), o in st.objects.items()
        if (o["metadata"].get("labels") or {}).get(DEPLOYMENT_LABEL) == name
        and p not in ("pods", "replicasets", "namespaces")
    )


def _patches(st: StandIn) -> list[str]:
    return [r.path for r in st.requests if r.method == "PATCH"]


def test_two_deployments_of_one_recipe_coexist_and_down_removes_exactly_its_own(
    cluster: tuple[StandIn, dict[str, str]], plan: Plan
) -> None:
    st, _ = cluster
    api = kube._api()
    kube.apply_deployment(api, plan, "a")
    kube.apply_deployment(api, plan, "b")
    a_objs, b_objs = _mine(st, "a"), _mine(st, "b")
    assert a_objs == [
        "deployments/a-decode",
        "deployments/a-prefill",
        "deployments/a-router",
        "services/a-decode",
        "services/a-prefill",
        "services/a-router",
    ]
    assert b_objs == [o.replace("/a-", "/b-") for o in a_objs]
    # b's router reaches b's engines, not a's
    router = st.objects[("deployments", NS, "b-router")]["spec"]["template"]["spec"]
    args = " ".join(router["containers"][0]["args"])
    assert "http://b-prefill:8000" in args and "a-prefill" not in args
    # a created the namespace; b found it there and used it as it is
    assert st.objects[("namespaces", "", NS)]["metadata"]["annotations"] == {
        CREATED_BY_ANNOTATION: "a"
    }
    assert len([p for p in _patches(st) if p == f"/api/v1/namespaces/{NS}"]) == 1

    done = kube.down("a")
    assert _mine(st, "a") == [], dump(st)
    assert _mine(st, "b") == b_objs
    assert done[f"Namespace/{NS}"].startswith("kept (deployment b"), done
    assert {k: v for k, v in done.items() if k != f"Namespace/{NS}"} == {
        f"{o}": "deleted"
        for o in (
            f"{kind}/a-{role} in namespace {NS}"
            for kind in ("Deployment", "Service")
            for role in ("prefill", "decode", "router")
        )
    }
    assert st.names("namespaces") == [NS]
    assert kube.down("a") == {}  # idempotent: nothing of a is left to find


@pytest.mark.parametrize(
    ("labels", "words"),
    [
        ({DEPLOYMENT_LABEL: "other"}, "servebook deployment 'other'"),
        ({"app.kubernetes.io/name": "vllm"}, f"no {DEPLOYMENT_LABEL} label"),
    ],
)
def test_an_object_of_another_deployment_is_refused_and_nothing_is_applied(
    cli: Cli, cluster: tuple[StandIn, dict[str, str]], labels: dict[str, str], words: str
) -> None:
    st, env = cluster
    st.ready_pods = True
    st.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    st.put(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "vllm-pd-decode", "namespace": NS, "labels": labels},
            "spec": {"ports": [{"port": 80}]},
        }
    )
    r = cli(*UP, env=env)
    assert r.returncode == 2, r.stderr
    assert f"Service/vllm-pd-decode in namespace {NS}" in r.stderr and words in r.stderr
    assert "does not adopt" in r.stderr
    assert _patches(st) == []
    assert st.objects[("services", NS, "vllm-pd-decode")]["metadata"]["labels"] == labels


def test_namespace_only_credentials_use_the_namespace_as_it_is(
    cli: Cli, cluster: tuple[StandIn, dict[str, str]]
) -> None:
    """A Role bound in the namespace cannot read the cluster-scoped Namespace (403): up
    takes the namespace as existing, applies into it, and down deletes what up applied and
    never the namespace."""
    st, env = cluster
    st.ready_pods = True
    st.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for method in ("GET", "PATCH", "DELETE"):  # the Namespace object itself, nothing in it
        st.forbidden.append((method, f"/api/v1/namespaces/{NS}$"))
    r = cli(*UP, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(_mine(st, "vllm-pd")) == 6
    assert all(
        not (s.method == "PATCH" and s.path.endswith(f"namespaces/{NS}")) for s in st.requests
    )
    r = cli("down", "vllm-pd", env=env)
    assert r.returncode == 0, r.stderr
    assert _mine(st, "vllm-pd") == [] and st.names("namespaces") == [NS]


def test_status_and_down_recover_the_deployment_from_labels_without_the_record(
    cli: Cli, cluster: tuple[StandIn, dict[str, str]], sb_home: Path
) -> None:
    st, env = cluster
    st.ready_pods = True
    for name in ("a", "b"):
        r = cli(*UP, "--name", name, "--timeout", "60", env=env)
        assert r.returncode == 0, r.stderr
        assert f"up: {name} ready: service/{name}-router port 8000" in r.stdout, r.stdout
    shutil.rmtree(sb_home / "deployments")  # another machine: no local record

    r = cli("status", "a", env=env)
    assert r.returncode == 2 and "--backend kubernetes" in r.stderr, r.stderr
    r = cli("status", "a", "--backend", "kubernetes", "--json", env=env)
    assert r.returncode == 0, r.stderr
    st_a = json.loads(r.stdout)
    assert st_a["namespace"] == NS and st_a["recipe"] == "vllm-pd"
    assert [x["name"] for x in st_a["roles"]] == ["prefill", "decode", "router"]
    assert all(x["ok"] for x in st_a["roles"]), st_a
    assert st_a["entry"] == f"service/a-router port 8000 in namespace {NS}"

    r = cli("status", "--backend", "kubernetes", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [
        {"name": n, "namespace": NS, "recipe": "vllm-pd", "roles": ["prefill", "decode", "router"]}
        for n in ("a", "b")
    ]
    r = cli("status", "--backend", "kubernetes", "-n", "elsewhere", env=env)
    assert r.returncode == 0 and "no servebook deployments in namespace elsewhere" in r.stdout

    r = cli("down", "b", "--backend", "kubernetes", "-n", NS, env=env)
    assert r.returncode == 0, r.stderr
    assert f"Namespace/{NS}: kept (this deployment did not create it)" in r.stdout, r.stdout
    assert _mine(st, "b") == [] and len(_mine(st, "a")) == 6
    r = cli("down", "a", "--backend", "kubernetes", env=env)
    assert r.returncode == 0, r.stderr
    assert f"Namespace/{NS}: deleted" in r.stdout, r.stdout  # a created it; nothing else is in it
    assert st.objects == {}, dump(st)


def test_status_of_a_deployment_the_cluster_does_not_have_is_exit_2(
    cli: Cli, cluster: tuple[StandIn, dict[str, str]]
) -> None:
    _, env = cluster
    r = cli("status", "ghost", "--backend", "kubernetes", env=env)
    assert r.returncode == 2, r.stderr
    assert "servebook.io/deployment=ghost" in r.stderr


def test_listing_across_namespaces_refused_searches_the_context_namespace_then_asks_for_one(
    cluster: tuple[StandIn, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """A tenant may not list across namespaces: as kubectl without -n, the kubeconfig
    context's namespace is searched (a note says so); refused there too, -n is asked for."""
    st, _ = cluster
    st.forbidden.append(("GET", "/apis/apps/v1/deployments"))
    assert kube.list_deployments() == []
    assert "searched namespace default (the kubeconfig context's)" in capsys.readouterr().err
    st.forbidden.append(("GET", "/apis/apps/v1/namespaces/default/deployments"))
    with pytest.raises(UsageError, match=r"nor in namespace default .* -n NAMESPACE"):
        kube.list_deployments()


WIDE = Path(__file__).parent / "fixtures" / "render" / "vllm-pd-wide-ep-replicas" / "values.yaml"


@pytest.mark.parametrize("crd", [True, False])
def test_roles_that_span_nodes_and_the_routers_identity_are_applied_found_and_deleted(
    cli: Cli, cluster: tuple[StandIn, dict[str, str]], sb_home: Path, crd: bool
) -> None:
    """Two prefill replicas and a decode group over three nodes: the decode role is a
    LeaderWorkerSet, the router finds the engines by label with a ServiceAccount, Role and
    RoleBinding of its own.  All are applied (the wait is cut short: no LWS controller
    here), found again by label with the local record gone, and deleted by down; on a
    cluster without the LWS CRD the listing is empty, not an error."""
    st, env = cluster
    up = ["up", "vllm-pd-wide-ep", "--name", "wide", "--backend", "kubernetes", "-f", str(WIDE)]
    r = cli(*up, "--timeout", "2", env=env)
    assert r.returncode == 1, r.stderr  # not ready within 2 s: nothing runs the LWS
    record = read_state("wide")
    assert record is not None
    ns = record.namespace
    assert st.names("leaderworkersets", ns) == ["wide-decode-lws"]
    assert st.names("serviceaccounts", ns) == ["wide-router"]
    assert st.names("roles", ns) == ["wide-router"] == st.names("rolebindings", ns)
    shutil.rmtree(sb_home / "deployments" / "wide")
    if crd:
        found = find_deployment(kube._api(), "wide", ns)
        assert found is not None and found.roles["decode"] == "wide-decode-lws"
        r = cli("down", "wide", "--backend", "kubernetes", "-n", ns, env=env)
        assert r.returncode == 0, r.stderr
        for plural in ("leaderworkersets", "serviceaccounts", "roles", "rolebindings"):
            assert st.names(plural, ns) == [], plural
    else:
        st.serves_lws = False  # the CRD went away: the rest is still found and deleted
        r = cli("down", "wide", "--backend", "kubernetes", "-n", ns, env=env)
        assert r.returncode == 0, r.stderr
        assert st.names("serviceaccounts", ns) == [] and st.names("deployments", ns) == []
