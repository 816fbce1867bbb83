"""Live preflight over real HTTP against the stand-in API server (tests/unit/kube_standin.py)
holding a fixture cluster: one kubeconfig and context for every request, the probe Pod in a
namespace that exists, its image pull outside its deadline, refusals named by request, and
the access review (SB263), the server-side dry run (SB264) and the weights fit (SB262)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from servebook.findings import Severity
from servebook.preflight.live import PREFLIGHT_NAMESPACE_PREFIX
from servebook.preflight.probe_pod import pod_manifest, probe_targets
from tests.conftest import GPU_PD_SETS, CliResult
from tests.unit.kube_standin import Kubelet, Server, serve
from tests.unit.preflight_standin import (
    KIMI_K2_FP8_BYTES,
    LLAMA_70B_BYTES,
    by_check,
    load_cluster,
    plan,
    probe_output,
    run,
)

Cli = Callable[..., CliResult]


def preflight_cli(cli: Cli, *args: str, env: dict[str, str] | None = None) -> CliResult:
    argv = ["preflight", "vllm-pd", "--json", *args]
    for s in GPU_PD_SETS:
        argv += ["--set", s]
    return cli(*argv, env=env)


# --- one kubeconfig and context for every request ----------------------------------------


def test_every_request_goes_to_the_context_given(cli: Cli, tmp_path: Path) -> None:
    a, b = serve(), serve()
    try:
        for s in (a, b):
            load_cluster(s)
            s.standin.kubelet = Kubelet(logs=probe_output(LLAMA_70B_BYTES))
        cfg = tmp_path / "two-clusters"
        cfg.write_text(
            "apiVersion: v1\nkind: Config\n"
            f'clusters:\n- name: a\n  cluster: {{server: "{a.standin.url}"}}\n'
            f'- name: b\n  cluster: {{server: "{b.standin.url}"}}\n'
            'users:\n- name: u\n  user: {token: "t"}\n'
            "contexts:\n- name: a\n  context: {cluster: a, user: u}\n"
            "- name: b\n  context: {cluster: b, user: u}\n"
            "current-context: a\n"
        )
        # KUBECONFIG names only cluster a: --kubeconfig and --context must win everywhere.
        only_a = a.write_kubeconfig(tmp_path / "only-a")
        r = preflight_cli(
            cli, "--kubeconfig", str(cfg), "--context", "b", env={"KUBECONFIG": str(only_a)}
        )
        assert r.returncode == 0, r.stdout + r.stderr
        seen_b = {(q.method, q.path.split("/servebook-probe")[0]) for q in b.standin.requests}
        assert ("POST", "/api/v1/namespaces/servebook/pods") in seen_b  # the probe Pods
        assert ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews") in seen_b
        assert any(q.query.get("dryRun") == "All" for q in b.standin.requests)
        assert [q.path for q in a.standin.requests] == []
        assert len(b.standin.created_pods) == 2
    finally:
        a.stop()
        b.stop()


def test_an_unknown_context_exits_2_naming_it(
    cli: Cli, preflight_cluster: tuple[Server, Path]
) -> None:
    _, cfg = preflight_cluster
    r = preflight_cli(cli, "--kubeconfig", str(cfg), "--context", "nope")
    assert r.returncode == 2
    assert "nope" in r.stderr and "Traceback" not in r.stderr


# --- the namespace the probe runs in ---------------------------------------------------


def test_probe_runs_in_a_temporary_namespace_when_the_recipes_does_not_exist(
    preflight_cluster: tuple[Server, Path],
) -> None:
    server, cfg = preflight_cluster
    before = server.standin.names("namespaces")
    found = run(cfg, plan("namespace=moe-pd"))
    st = server.standin
    assert {(f.subject, f.severity) for f in by_check(found, "SB259")} == {
        ("gpu-a", Severity.PASS),
        ("gpu-b", Severity.PASS),
    }
    (ns,) = {ns for ns, _ in st.created_pods}
    assert ns.startswith(PREFLIGHT_NAMESPACE_PREFIX)
    # The recipe's namespace was not made (`up` makes it), preflight's own is gone, and
    # so are its probe Pods.
    assert st.names("namespaces") == before
    assert "moe-pd" not in before
    assert st.names("pods", ns) == []
    deletes = [q.path for q in st.requests if q.method == "DELETE"]
    assert f"/api/v1/namespaces/{ns}" in deletes
    (dry_run,) = by_check(found, "SB264")
    assert f"in namespace {ns}, standing in for moe-pd" in dry_run.message


def test_probe_runs_in_the_recipes_namespace_when_it_exists(
    preflight_cluster: tuple[Server, Path],
) -> None:
    server, cfg = preflight_cluster
    run(cfg, plan())  # namespace servebook exists in the fixture
    st = server.standin
    assert {ns for ns, _ in st.created_pods} == {"servebook"}
    assert not [q for q in st.requests if q.method == "POST" and q.path == "/api/v1/namespaces"]
    assert st.names("pods", "servebook") == []


# --- the image pull and the probe's deadline ----------------------------------------------


def test_image_pull_is_outside_the_probe_deadline(preflight_cluster: tuple[Server, Path]) -> None:
    server, cfg = preflight_cluster
    # A slow pull (1.5 s) and a quick probe (0.2 s), with a 1 s probe deadline.
    server.standin.kubelet = Kubelet(pull_s=1.5, run_s=0.2, logs=probe_output(LLAMA_70B_BYTES))
    found = run(cfg, plan(), probe_deadline_s=1, pull_timeout_s=30)
    assert [f.severity for f in by_check(found, "SB259")] == [Severity.PASS, Severity.PASS]


def test_probe_pod_deadline_covers_the_pull_and_the_probe() -> None:
    t = probe_targets(plan())[0]
    pod = pod_manifest(t, namespace="ns", deadline_s=120, script="", pull_timeout_s=900)
    assert pod["spec"]["activeDeadlineSeconds"] == 1020
    small = pod_manifest(t, namespace="ns", deadline_s=120, script="", image="python:3.12-slim")
    assert small["spec"]["containers"][0]["image"] == "python:3.12-slim"


def test_probe_that_overruns_its_deadline_fails(preflight_cluster: tuple[Server, Path]) -> None:
    server, cfg = preflight_cluster
    server.standin.kubelet = Kubelet(pull_s=0, run_s=5, logs=probe_output(LLAMA_70B_BYTES))
    found = run(cfg, plan(), probe_deadline_s=1, pull_timeout_s=30)
    probe = by_check(found, "SB259")
    assert [f.severity for f in probe] == [Severity.FAIL, Severity.FAIL]
    assert "did not finish within 1 s of its start" in probe[0].message


def test_image_that_cannot_be_pulled_is_named(preflight_cluster: tuple[Server, Path]) -> None:
    server, cfg = preflight_cluster
    server.standin.kubelet = Kubelet(pull_error="ImagePullBackOff")
    found = run(cfg, plan(), probe_image="registry.example/python:3.12-slim")
    probe = by_check(found, "SB259")
    assert probe[0].severity is Severity.ERROR
    assert "registry.example/python:3.12-slim" in probe[0].message
    assert "ImagePullBackOff" in probe[0].message


def test_refused_probe_pod_exits_2_naming_the_request(
    cli: Cli, preflight_cluster: tuple[Server, Path]
) -> None:
    server, cfg = preflight_cluster
    server.standin.forbidden.append(("POST", "/api/v1/namespaces/servebook/pods"))
    r = preflight_cli(cli, "--kubeconfig", str(cfg))
    assert r.returncode == 2, r.stdout
    assert "POST /api/v1/namespaces/servebook/pods" in r.stderr
    assert "creating the probe Pod on node gpu-a" in r.stderr
    assert "Traceback" not in r.stderr


# --- SB263: what the caller may do ---------------------------------------------------------


def test_access_review_passes_when_everything_is_allowed(
    preflight_cluster: tuple[Server, Path],
) -> None:
    _, cfg = preflight_cluster
    (access,) = by_check(run(cfg, plan()), "SB263")
    assert access.severity is Severity.PASS
    asked = access.evidence["asked"]
    # A 1.31 server: a WebSocket port-forward is authorized as a GET only.
    assert "get pods/portforward" in asked and "get pods/log" in asked
    assert "create pods/portforward" not in asked
    assert "patch deployments.apps" in asked and "delete services" in asked
    # The namespace exists, so up never creates it: its create is not asked.
    assert "create namespaces" not in asked


def test_access_review_lists_every_denial(preflight_cluster: tuple[Server, Path]) -> None:
    server, cfg = preflight_cluster
    server.standin.denied |= {("get", "pods", "portforward"), ("delete", "services", "")}
    (access,) = by_check(run(cfg, plan()), "SB263")
    assert access.severity is Severity.FAIL
    assert "may not do 2 of the" in access.message
    assert "get pods/portforward" in access.message
    assert "delete services" in access.message
    assert "kubectl auth can-i" in access.hint


def test_access_review_asks_for_namespace_create_when_up_would_create_it(
    preflight_cluster: tuple[Server, Path],
) -> None:
    server, cfg = preflight_cluster
    server.standin.denied.add(("create", "namespaces", ""))
    (access,) = by_check(run(cfg, plan("namespace=moe-pd")), "SB263")
    assert access.severity is Severity.FAIL
    assert "create namespaces (cluster scope)" in access.message


# --- SB264: the server-side dry run --------------------------------------------------------


def test_dry_run_passes_on_a_namespace_that_admits_everything(
    preflight_cluster: tuple[Server, Path],
) -> None:
    server, cfg = preflight_cluster
    (adm,) = by_check(run(cfg, plan()), "SB264")
    assert adm.severity is Severity.PASS, adm.message
    assert "admits the 6 rendered object(s) and 3 Pod(s) of their templates" in adm.message
    # Nothing was stored by the dry run: the namespace holds only the fixture's objects.
    assert server.standin.names("deployments", "servebook") == []


# Pod Security's words at `restricted` for the three Pods, as the plane's API server refuses
# them (tests/cluster/test_scenarios.py runs the level itself): the engines mount their
# weights by hostPath, and the router runs as root without dropping ALL capabilities.
RESTRICTED = {
    "vllm-pd-router": 'runAsNonRoot != true (pod or container "router" must set '
    "securityContext.runAsNonRoot=true)",
    "vllm-pd-prefill": 'restricted volume types (volume "model" uses restricted volume type '
    '"hostPath")',
    "vllm-pd-decode": 'restricted volume types (volume "model" uses restricted volume type '
    '"hostPath")',
}


def test_dry_run_reports_every_refusal_at_once(preflight_cluster: tuple[Server, Path]) -> None:
    """Pod Security refuses each Pod and a policy webhook the router's Deployment: every
    refusal is named at once, each by its object and the request that met it."""
    server, cfg = preflight_cluster
    for owner, why in RESTRICTED.items():
        pod = f"{owner}-servebook-dry-run"
        server.standin.refuse[f"Pod/{pod}"] = (
            403,
            "Forbidden",
            f'pods "{pod}" is forbidden: violates PodSecurity "restricted:latest": {why}',
        )
    server.standin.refuse["Deployment/vllm-pd-router"] = (
        400,
        "BadRequest",
        'admission webhook "validate.kyverno.svc-fail" denied the request: policy '
        "Deployment/servebook/vllm-pd-router for resource violation: require-requests-limits: "
        "validate-resources: validation error: CPU and memory resource requests are required",
    )
    (adm,) = by_check(run(cfg, plan()), "SB264")
    assert adm.severity is Severity.FAIL
    assert "refuses 4 of the" in adm.message
    assert "Pod/vllm-pd-router-servebook-dry-run" in adm.message
    assert RESTRICTED["vllm-pd-router"] in adm.message
    assert (
        "Pod/vllm-pd-prefill-servebook-dry-run (the Pods of Deployment/vllm-pd-prefill): "
        "Pod Security" in adm.message
    )
    assert "Pod/vllm-pd-decode-servebook-dry-run" in adm.message
    assert 'violates PodSecurity "restricted:latest"' in adm.message
    assert "Deployment/vllm-pd-router: webhook" in adm.message
    assert "PATCH /apis/apps/v1/namespaces/servebook/deployments/vllm-pd-router?dryRun=All" in (
        adm.message
    )


# --- SB262 from the probe ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "verdict"),
    [(LLAMA_70B_BYTES, Severity.PASS), (KIMI_K2_FP8_BYTES, Severity.FAIL)],
)
def test_weights_fit_reads_the_bytes_the_probe_found(
    preflight_cluster: tuple[Server, Path], weights: int, verdict: Severity
) -> None:
    server, cfg = preflight_cluster
    server.standin.kubelet = Kubelet(logs=probe_output(weights))
    fit = by_check(run(cfg, plan()), "SB262")
    assert [(f.subject, f.severity) for f in fit] == [
        ("role/prefill", verdict),
        ("role/decode", verdict),
    ]
    assert "the probe on node gpu-a" in fit[0].message
    assert "nvidia.com/gpu.memory=81559 MiB" in fit[0].message
