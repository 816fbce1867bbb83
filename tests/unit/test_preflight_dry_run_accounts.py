"""SB264's server-side dry run of Pods whose ServiceAccount the same apply creates (issue
23 point 8), and the stand-in's validation as the API server words it (422 Invalid).

A dry run stores nothing, so a ServiceAccount dry-run before a Pod does not exist when the
Pod is dry-run, and the ServiceAccount admission plugin refuses the Pod ("error looking up
service account"): a false refusal of the router's Pods (its own account, when it finds
the engines by label) and, in preflight's temporary namespace, of Pods running as the
user's account.  The stand-in refuses such Pods as the plugin does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servebook.commands.render import render_files
from servebook.findings import Severity
from servebook.kube.client import RequestFailed, call, connect
from servebook.preflight.live import check_admission
from tests.conftest import GPU_PD_SETS
from tests.unit.kube_standin import Server, serve

REPLICAS = Path(__file__).parent / "fixtures" / "render" / "vllm-pd-wide-ep-replicas"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Server, Any]]:
    s = serve()
    try:
        yield s, connect(str(s.write_kubeconfig(tmp_path / "kubeconfig")))
    finally:
        s.stop()


def namespace(server: Server, name: str) -> None:
    server.call(
        lambda st: st.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    )


def _router_account_objects() -> list[dict[str, Any]]:
    _, objects, _ = render_files("vllm-pd-wide-ep", [], [REPLICAS / "values.yaml"])
    assert any(o["kind"] == "ServiceAccount" for o in objects)
    return objects


def test_the_stand_in_refuses_a_pod_whose_account_does_not_exist(
    server: tuple[Server, Any],
) -> None:
    s, api = server
    namespace(s, "servebook")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"serviceAccountName": "nobody", "containers": [{"name": "c", "image": "i:1"}]},
    }
    with pytest.raises(RequestFailed) as e:
        call(
            api,
            "POST",
            "/api/v1/namespaces/servebook/pods",
            "x",
            params={"dryRun": "All"},
            body=pod,
        )
    assert e.value.code == 403
    assert 'serviceaccount "nobody" not found' in e.value.server_message


def test_the_routers_pods_are_admitted_though_the_apply_creates_their_account(
    server: tuple[Server, Any],
) -> None:
    s, api = server
    namespace(s, "servebook")
    f = check_admission(api, _router_account_objects(), "servebook", "servebook", exists=True)
    assert f.severity is not Severity.FAIL, f.message
    assert "default ServiceAccount, since its own (vllm-pd-wide-ep-router)" in f.message
    # Nothing was created in the user's namespace for it.
    assert s.standin.names("serviceaccounts", "servebook") == []


def test_in_preflights_own_namespace_the_users_account_is_made_for_the_dry_run(
    server: tuple[Server, Any],
) -> None:
    s, api = server
    namespace(s, "servebook-preflight-0a1b2c3d")
    _, objects, _ = render_files(
        "vllm-pd", [*GPU_PD_SETS, "namespace=new-ns", "service_account=runner"]
    )
    f = check_admission(api, objects, "new-ns", "servebook-preflight-0a1b2c3d", exists=False)
    assert f.severity is not Severity.FAIL, f.message
    assert "ServiceAccount runner was made in servebook-preflight-0a1b2c3d" in f.message
    assert "that it exists in new-ns was not checked" in f.message


def test_a_users_account_missing_from_an_existing_namespace_is_a_real_refusal(
    server: tuple[Server, Any],
) -> None:
    s, api = server
    namespace(s, "servebook")
    _, objects, _ = render_files("vllm-pd", [*GPU_PD_SETS, "service_account=runner"])
    f = check_admission(api, objects, "servebook", "servebook", exists=True)
    assert f.severity is Severity.FAIL
    assert 'serviceaccount "runner" not found' in f.message


# --- the stand-in's validation -------------------------------------------------------------


def _apply(api: Any, path: str, body: dict[str, Any]) -> None:
    call(
        api,
        "PATCH",
        path,
        "applying",
        params={"fieldManager": "servebook"},
        body=body,
        content_type="application/apply-patch+yaml",
    )


def test_the_stand_in_refuses_a_service_name_as_the_api_server_does(
    server: tuple[Server, Any],
) -> None:
    s, api = server
    namespace(s, "servebook")
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "8b-test"}, "spec": {}}
    with pytest.raises(RequestFailed) as e:
        _apply(api, "/api/v1/namespaces/servebook/services/8b-test", svc)
    assert e.value.code == 422
    assert e.value.status["reason"] == "Invalid"
    assert e.value.server_message.startswith(
        'Service "8b-test" is invalid: metadata.name: Invalid value: "8b-test": a DNS-1035 label'
    )
    (cause,) = e.value.status["details"]["causes"]
    assert cause["field"] == "metadata.name" and cause["reason"] == "FieldValueInvalid"


def test_the_stand_in_refuses_a_changed_deployment_selector(server: tuple[Server, Any]) -> None:
    s, api = server
    namespace(s, "servebook")
    path = "/apis/apps/v1/namespaces/servebook/deployments/d"

    def dep(app: str) -> dict[str, Any]:
        labels = {"app": app}
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "c", "image": "i:1"}]},
                },
            },
        }

    _apply(api, path, dep("a"))
    with pytest.raises(RequestFailed) as e:
        _apply(api, path, dep("b"))
    assert e.value.code == 422
    assert 'Deployment.apps "d" is invalid: spec.selector' in e.value.server_message
    assert "field is immutable" in e.value.server_message
