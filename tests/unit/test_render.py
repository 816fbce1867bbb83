"""`servebook render`: the GPU recipes rendered to manifests that need no editing.

Golden files pin each recipe's whole output (regenerate with
``UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_render.py``, then read the diff).  The
other tests pin the properties the field notes demand whatever the golden files say:
schema-valid objects, weights from hostPath type Directory in Pods pinned to their node,
identical speculative configs on both PD roles, and bad input that writes nothing."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from servebook.commands.render import PARAMETERS_FILE, render_files, write_atomically
from servebook.errors import UsageError
from servebook.kube.names import ENGINE_PORT
from servebook.kube.validate import K8S_VERSION, schema_errors
from tests.conftest import CliResult
from tests.unit.conftest import LOCAL_ONLY_RECIPE

Cli = Callable[..., CliResult]
GPU_RECIPES = ["vllm-mixed", "vllm-mixed-spec", "vllm-pd", "vllm-pd-spec"]
# The tiny recipes on a CPU-only cluster (tests/unit/test_render_tiny.py has the rest).
TINY_RECIPES = ["tiny-mixed", "tiny-pd", "tiny-mixed-spec", "tiny-pd-spec"]
# vllm-pd on each KV fabric profile (fixtures/render/fabrics/NAME/values.yaml).
FABRIC_GOLDENS = ["ib-shared", "ib-sriov", "roce-gke", "efa", "tcp"]
# PARAMETERS.md names the local-only model_dir's default, which follows SERVEBOOK_HOME.
GOLDEN_HOME = "/home/user/.servebook"
FIXTURES = Path(__file__).parent / "fixtures" / "render"
REPO = Path(__file__).resolve().parents[2]

MIXED = [
    "image=vllm/vllm-openai:v0.11.0",
    "node=gpu-node-1",
    "model_dir=/data/models/m",
]
PD = [
    "image=vllm/vllm-openai:v0.11.0",
    "fabric=ib-shared",
    "prefill_node=gpu-node-1",
    "decode_node=gpu-node-2",
    "prefill_model_dir=/data/models/m",
    "decode_model_dir=/mnt/nvme/m",
]


def pd_with(*changes: str) -> list[str]:
    """PD's settings with ``changes`` (NAME=VALUE) in place of PD's own for those names: a
    parameter given twice is refused, as a key given twice in a values file is."""
    changed = {c.partition("=")[0] for c in changes}
    return [s for s in PD if s.partition("=")[0] not in changed] + list(changes)


@pytest.fixture
def in_fixture(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """Run from a recipe's fixture directory, so the values file is named `values.yaml` in
    PARAMETERS.md whichever directory the tests run from (and from one SERVEBOOK_HOME)."""

    def go(recipe: str) -> Path:
        d = FIXTURES / recipe
        monkeypatch.chdir(d)
        monkeypatch.setenv("SERVEBOOK_HOME", GOLDEN_HOME)
        return d

    return go


def _golden(recipe: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    _, objects, files = render_files(recipe, [], [Path("values.yaml")])
    return objects, files


def _check_golden(d: Path, files: dict[str, str]) -> None:
    expected_dir = d / "expected"
    if os.environ.get("UPDATE_GOLDEN"):
        shutil.rmtree(expected_dir, ignore_errors=True)
        expected_dir.mkdir()
        for name, text in files.items():
            (expected_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (expected_dir / name).write_text(text, encoding="utf-8")
    expected = _tree(expected_dir)
    assert sorted(files) == sorted(expected), "files written differ from the golden set"
    for name, text in files.items():
        assert text == expected[name], f"{name} differs from {expected_dir / name}"


def _tree(d: Path) -> dict[str, str]:
    """Every file under ``d`` by its path relative to ``d`` (``namespace/00-...yaml``)."""
    return {
        p.relative_to(d).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


def _pods(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for o in objects:
        if o["kind"] == "Deployment":
            yield o["metadata"]["name"], o["spec"]["template"]["spec"]


def _engine(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    pods = dict(_pods(objects))
    container: dict[str, Any] = pods[name]["containers"][0]
    return container


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


# --- golden files ---------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", GPU_RECIPES + TINY_RECIPES)
def test_rendered_files_match_the_golden_files(
    recipe: str, in_fixture: Callable[[str], Path]
) -> None:
    d = in_fixture(recipe)
    _, files = _golden(recipe)
    _check_golden(d, files)


@pytest.mark.parametrize("case", ["vllm-pd-wide-ep", "vllm-pd-wide-ep-replicas"])
def test_roles_on_several_nodes_render_their_golden_files(
    case: str, in_fixture: Callable[[str], Path]
) -> None:
    d = in_fixture(case)
    _, objects, files = render_files("vllm-pd-wide-ep", [], [Path("values.yaml")])
    assert schema_errors(objects) == []
    # Lint-clean: every Pod pinned (SB103), leader and workers agreeing (SB113).
    from servebook.lint import loader, rules

    found = rules.check(loader.load_paths([d / "expected"]))
    assert [f for f in found if f.severity.value in ("fail", "warn")] == []
    _check_golden(d, files)


@pytest.mark.parametrize("fabric", FABRIC_GOLDENS)
def test_every_fabric_profile_renders_its_golden_files(
    fabric: str, in_fixture: Callable[[str], Path]
) -> None:
    d = in_fixture(f"fabrics/{fabric}")
    _, objects, files = render_files("vllm-pd", [], [Path("values.yaml")])
    assert schema_errors(objects) == []
    _check_golden(d, files)


# --- properties every render must have ------------------------------------------------------


@pytest.mark.parametrize("recipe", GPU_RECIPES + TINY_RECIPES)
def test_every_rendered_object_passes_the_kubernetes_schema(
    recipe: str, in_fixture: Callable[[str], Path]
) -> None:
    in_fixture(recipe)
    objects, _ = _golden(recipe)
    kinds = {"Namespace", "Deployment", "Service"}
    if recipe in TINY_RECIPES:
        kinds.add("ConfigMap")  # the model generator the engine Pods run
    assert {o["kind"] for o in objects} == kinds
    assert schema_errors(objects) == []


@pytest.mark.parametrize(
    ("recipe", "sets"),
    [
        ("vllm-mixed", [*MIXED, "gpus=1", "tensor_parallel=1", "gpu_resource=amd.com/gpu"]),
        ("vllm-mixed-spec", [*MIXED, "spec_method=ngram", "namespace=default"]),
        ("vllm-pd", [*PD, "kv_connector=MooncakeConnector", "rdma_resource=rdma/ib"]),
        ("vllm-pd-spec", [*PD, "spec_method=mtp", "max_model_len=8192"]),
    ],
)
def test_variants_pass_the_kubernetes_schema(recipe: str, sets: list[str]) -> None:
    _, objects, _ = render_files(recipe, sets)
    assert schema_errors(objects) == []


def test_schema_check_refuses_a_misspelt_field() -> None:
    # The strict schema is what catches a field the API server would silently drop.
    _, objects, _ = render_files("vllm-mixed", MIXED)
    pod = dict(_pods(objects))["vllm-mixed"]
    pod["nodeSelecter"] = pod.pop("nodeSelector")
    errors = schema_errors(objects)
    assert len(errors) == 1 and "Deployment/vllm-mixed" in errors[0]
    assert "nodeSelecter" in errors[0]


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_every_pod_mounting_weights_uses_hostpath_directory_and_is_pinned(
    recipe: str, in_fixture: Callable[[str], Path]
) -> None:
    in_fixture(recipe)
    values = yaml.safe_load(Path("values.yaml").read_text())
    objects, _ = _golden(recipe)
    mounting = 0
    for name, pod in _pods(objects):
        host_volumes = [v for v in pod.get("volumes", []) if "hostPath" in v]
        if not host_volumes:
            continue
        mounting += 1
        role = name.removeprefix(recipe).strip("-") or "mixed"
        node = values["node"] if role == "mixed" else values[f"{role}_node"]
        assert pod["nodeSelector"] == {"kubernetes.io/hostname": node}
        assert "nodeName" not in pod and "nodeAffinity" not in pod.get("affinity", {})
        # Weights (not the compile cache, scratch created when absent) are read-only
        # directories that must exist.
        weights = [v for v in host_volumes if v["name"] in ("model", "draft")]
        assert weights
        for v in weights:
            assert v["hostPath"]["type"] == "Directory", v
            assert v["hostPath"]["path"].startswith("/")
        mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
        for v in weights:
            assert mounts[v["name"]]["readOnly"] is True
    assert mounting == (1 if recipe.startswith("vllm-mixed") else 2)


def test_pd_spec_speculative_config_is_byte_identical_with_different_draft_paths(
    in_fixture: Callable[[str], Path],
) -> None:
    in_fixture("vllm-pd-spec")
    objects, _ = _golden("vllm-pd-spec")
    pre = _engine(objects, "vllm-pd-spec-prefill")
    dec = _engine(objects, "vllm-pd-spec-decode")
    assert _flag(pre["args"], "--speculative-config") == _flag(dec["args"], "--speculative-config")
    assert json.loads(_flag(pre["args"], "--speculative-config")) == {
        "method": "eagle3",
        "model": "/models/draft",
        "num_speculative_tokens": 3,
    }
    # ... while each Pod mounts its own node's directory there.
    hosts = {
        name: {v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}
        for name, pod in _pods(objects)
    }
    assert hosts["vllm-pd-spec-prefill"]["draft"] == "/data/models/EAGLE3-LLaMA3.3-Instruct-70B"
    assert hosts["vllm-pd-spec-decode"]["draft"] == (
        "/scratch/weights/EAGLE3-LLaMA3.3-Instruct-70B"
    )
    # Everything both engines must share is identical: only the Pods' placement differs.
    assert pre["args"] == dec["args"]


def test_pd_spec_with_mtp_mounts_no_draft() -> None:
    _, objects, _ = render_files("vllm-pd-spec", [*PD, "spec_method=mtp"])
    for name in ("vllm-pd-spec-prefill", "vllm-pd-spec-decode"):
        cfg = json.loads(_flag(_engine(objects, name)["args"], "--speculative-config"))
        assert cfg == {"method": "mtp", "num_speculative_tokens": 3}
    for _, pod in _pods(objects):
        assert all(v["name"] != "draft" for v in pod.get("volumes", []))


def test_startup_probe_allows_the_whole_weight_load_and_readiness_is_engine_health() -> None:
    _, objects, _ = render_files("vllm-mixed", [*MIXED, "startup_timeout_s=1200"])
    c = _engine(objects, "vllm-mixed")
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1200
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    shm = {v["name"]: v for v in dict(_pods(objects))["vllm-mixed"]["volumes"]}["shm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_namespace_is_created_by_the_render_and_holds_every_object() -> None:
    _, objects, _ = render_files("vllm-pd", [*PD, "namespace=team-a"])
    assert objects[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "team-a", "labels": {"app.kubernetes.io/managed-by": "servebook"}},
    }
    assert {o["metadata"]["namespace"] for o in objects[1:]} == {"team-a"}


def test_pd_router_points_at_the_role_services_in_pd_mode() -> None:
    _, objects, _ = render_files("vllm-pd", PD)
    args = _engine(objects, "vllm-pd-router")["args"]
    assert "--vllm-pd-disaggregation" in args
    assert _flag(args, "--prefill") == "http://vllm-pd-prefill:8000"
    assert _flag(args, "--decode") == "http://vllm-pd-decode:8000"
    assert _flag(args, "--kv-connector") == "nixl"
    services = {o["metadata"]["name"] for o in objects if o["kind"] == "Service"}
    assert services == {"vllm-pd-prefill", "vllm-pd-decode", "vllm-pd-router"}


def test_router_arguments_parse_with_vllm_router() -> None:
    launch = pytest.importorskip("vllm_router.launch_router")
    _, objects, _ = render_files("vllm-pd", [*PD, "kv_connector=MooncakeConnector"])
    parsed = launch.parse_router_args(_engine(objects, "vllm-pd-router")["args"])
    assert parsed.vllm_pd_disaggregation
    assert parsed.prefill_urls == [("http://vllm-pd-prefill:8000", 8998)]
    assert parsed.decode_urls == ["http://vllm-pd-decode:8000"]
    assert parsed.kv_connector == "mooncake"


def test_nixl_side_channel_announces_the_pod_ip_not_localhost() -> None:
    _, objects, _ = render_files("vllm-pd", PD)
    for name in ("vllm-pd-prefill", "vllm-pd-decode"):
        env = {e["name"]: e for e in _engine(objects, name)["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "status.podIP"}
        }


# --- KV fabrics ------------------------------------------------------------------------------


def _fabric_golden(fabric: str) -> list[dict[str, Any]]:
    values = FIXTURES / "fabrics" / fabric / "values.yaml"
    _, objects, _ = render_files("vllm-pd", [], [values])
    return objects


def _pod_template(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for o in objects:
        if o["kind"] == "Deployment" and o["metadata"]["name"] == name:
            template: dict[str, Any] = o["spec"]["template"]
            return template
    raise KeyError(name)


def _kv_config(container: dict[str, Any]) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads(_flag(container["args"], "--kv-transfer-config"))
    return cfg


@pytest.mark.parametrize("role", ["vllm-pd-prefill", "vllm-pd-decode"])
def test_ib_shared_requests_one_shared_device_and_states_ucx_over_rdma(role: str) -> None:
    c = _engine(_fabric_golden("ib-shared"), role)
    assert c["resources"]["limits"]["rdma/rdma_shared_device_a"] == 1
    assert c["resources"]["requests"]["rdma/rdma_shared_device_a"] == 1
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["UCX_TLS"] == "rc_x,rc,dc_x,dc,cuda_copy,cuda_ipc"
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1"
    assert env["UCX_LOG_LEVEL"] == "info"  # verify reads the transport from the log
    assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    kv = _kv_config(c)
    assert kv["kv_connector_extra_config"] == {"backends": ["UCX"]}
    assert kv["kv_buffer_device"] == "cuda"


def test_ib_sriov_requests_one_virtual_function_and_one_network_per_gpu() -> None:
    objects = _fabric_golden("ib-sriov")
    for name in ("vllm-pd-prefill", "vllm-pd-decode"):
        t = _pod_template(objects, name)
        c = t["spec"]["containers"][0]
        assert c["resources"]["limits"]["nvidia.com/sriov_ib_rdma"] == 8
        nets = t["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"]
        assert nets.split(",") == ["ib-sriov-net"] * 8


def test_roce_on_gke_attaches_the_rdma_networks_by_annotation_without_a_device() -> None:
    t = _pod_template(_fabric_golden("roce-gke"), "vllm-pd-decode")
    ann = t["metadata"]["annotations"]
    assert ann["networking.gke.io/default-interface"] == "eth0"
    ifaces = json.loads(ann["networking.gke.io/interfaces"])
    assert ifaces[0] == {"interfaceName": "eth0", "network": "default"}
    assert [i["network"] for i in ifaces[1:]] == [f"rdma-{i}" for i in range(8)]
    c = t["spec"]["containers"][0]
    assert set(c["resources"]["limits"]) == {"nvidia.com/gpu"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["UCX_IB_ROCE_REACHABILITY_MODE"] == "all"
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]


def test_efa_requests_efa_interfaces_and_tells_nixl_to_use_libfabric() -> None:
    c = _engine(_fabric_golden("efa"), "vllm-pd-prefill")
    assert c["resources"]["limits"]["vpc.amazonaws.com/efa"] == 32
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert "UCX_TLS" not in env
    assert _kv_config(c)["kv_connector_extra_config"] == {"backends": ["LIBFABRIC"]}
    # Without rdma_devices: one interface per GPU.
    _, objects, _ = render_files("vllm-pd", pd_with("fabric=efa"))
    c = _engine(objects, "vllm-pd-prefill")
    assert c["resources"]["limits"]["vpc.amazonaws.com/efa"] == 8


def test_tcp_states_tcp_and_requests_no_device() -> None:
    c = _engine(_fabric_golden("tcp"), "vllm-pd-prefill")
    assert set(c["resources"]["limits"]) == {"nvidia.com/gpu"}
    assert "securityContext" not in c
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["UCX_TLS"] == "tcp,cuda_copy"


def test_mooncake_is_told_its_protocol_by_the_fabric() -> None:
    _, objects, _ = render_files("vllm-pd", [*PD, "kv_connector=MooncakeConnector"])
    kv = _kv_config(_engine(objects, "vllm-pd-decode"))
    assert kv["kv_connector_extra_config"] == {"mooncake_protocol": "rdma"}
    with pytest.raises(UsageError, match="cannot be given to the KV connector") as e:
        render_files("vllm-pd", pd_with("kv_connector=MooncakeConnector", "fabric=efa"))
    assert "'fabric'" in str(e.value) and "'kv_connector'" in str(e.value)


def _render_pd_refused(cli: Cli, tmp_path: Path, *settings: str) -> str:
    """``servebook render vllm-pd`` with PD's settings and ``settings``: it exits 2 and
    writes nothing; its stderr."""
    out = tmp_path / "deploy"
    sets = [a for s in pd_with(*settings) for a in ("--set", s)]
    r = cli("render", "vllm-pd", *sets, "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert not out.exists()
    return r.stderr


def test_tcp_fabric_without_acknowledgement_exits_2_naming_the_parameter(
    cli: Cli, tmp_path: Path
) -> None:
    err = _render_pd_refused(cli, tmp_path, "fabric=tcp")
    assert "'allow_tcp_kv'" in err and "--set allow_tcp_kv=VALUE" in err
    assert "over TCP" in err
    sets = [a for s in pd_with("fabric=tcp", "allow_tcp_kv=true") for a in ("--set", s)]
    r = cli("render", "vllm-pd", *sets, "-o", str(tmp_path / "deploy"))
    assert r.returncode == 0, r.stderr


def test_pd_without_a_fabric_is_unresolved_naming_it() -> None:
    sets = [s for s in PD if not s.startswith("fabric=")]
    with pytest.raises(UsageError, match=r"  fabric \(choice\)"):
        render_files("vllm-pd", sets)


@pytest.mark.parametrize(
    ("sets", "names", "words"),
    [
        (["fabric=ib-sriov", "fabric_networks=n"], ["rdma_resource", "fabric"], "SR-IOV"),
        (["fabric=ib-sriov", "rdma_resource=x.io/vf"], ["fabric_networks"], "secondary"),
        (["fabric=roce", "fabric_networking=gke"], ["fabric_networks"], "secondary"),
        (["fabric=ib-shared", "fabric_networks=n"], ["fabric_networks"], "no secondary"),
    ],
)
def test_fabric_settings_that_cannot_work_are_refused_naming_the_parameters(
    sets: list[str], names: list[str], words: str
) -> None:
    base = [s for s in PD if not s.startswith("fabric=")]
    with pytest.raises(UsageError, match=words) as e:
        render_files("vllm-pd", [*base, *sets])
    for name in names:
        assert f"'{name}'" in str(e.value)


def test_a_fabric_is_refused_on_a_mixed_recipe(tmp_path: Path) -> None:
    from servebook.recipe.resolve import load_source

    data = load_source("vllm-mixed").data
    data["kubernetes"]["fabric"] = {"profile": "ib-shared"}
    f = tmp_path / "r.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(UsageError, match="hands no KV over"):
        render_files(str(f), MIXED)


def test_parameters_md_names_every_parameter_its_value_and_origin(
    in_fixture: Callable[[str], Path],
) -> None:
    in_fixture("vllm-pd")
    plan, _, files = render_files("vllm-pd", ["gpus=4", "tensor_parallel=4"], [Path("values.yaml")])
    text = files[PARAMETERS_FILE]
    assert f"Kubernetes {K8S_VERSION}" in text
    for name in plan.params:
        assert f"## `{name}`" in text
    assert "| `gpus` | `4` | --set gpus |" in text
    assert "| `prefill_node` | `gpu-node-1` | values file values.yaml |" in text
    assert "| `kv_connector` | `NixlConnector` | default |" in text
    assert "| `max_model_len` | unset | unset (optional) |" in text
    assert "kubectl get nodes -L kubernetes.io/hostname" in text


def test_rerender_command_in_parameters_md_renders_the_same_manifests(
    in_fixture: Callable[[str], Path],
) -> None:
    in_fixture("vllm-pd-spec")
    _, _, files = render_files("vllm-pd-spec", [], [Path("values.yaml")])
    block = files[PARAMETERS_FILE].split("```sh\n", 1)[1].split("\n```", 1)[0]
    import shlex

    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:3] == ["servebook", "render", "vllm-pd-spec"]
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    _, _, again = render_files("vllm-pd-spec", sets)
    for name in files:
        if name != PARAMETERS_FILE:
            assert again[name] == files[name]


# --- bad input: exit 2, names each offending parameter, writes nothing ----------------------


def _previous_render(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    out = tmp_path / "deploy"
    _, _, files = render_files("vllm-mixed", MIXED)
    write_atomically(out, files)
    return out, _tree(out)


def _leftovers(tmp_path: Path, out: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name not in (out.name, "sbhome"))


def test_missing_parameters_exit_2_name_each_and_write_nothing(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    r = cli("render", "vllm-pd", "-o", str(out))
    assert r.returncode == 2, r.stderr
    for name in ("image", "prefill_node", "decode_node", "prefill_model_dir", "decode_model_dir"):
        assert f"  {name} (" in r.stderr, name
    assert "nothing was rendered" in r.stderr
    assert not out.exists()
    assert _leftovers(tmp_path, out) == []


@pytest.mark.parametrize(
    ("value", "why"),
    [("<NODE>", "unfilled placeholder"), ("gpu_node-", "not a valid Kubernetes label value")],
)
def test_invalid_node_exits_2_and_leaves_the_previous_render_untouched(
    cli: Cli, tmp_path: Path, value: str, why: str
) -> None:
    out, before = _previous_render(tmp_path)
    sets = [a for s in [*MIXED[:1], f"node={value}", *MIXED[2:]] for a in ("--set", s)]
    r = cli("render", "vllm-mixed", *sets, "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert "parameter 'node'" in r.stderr and why in r.stderr
    assert _tree(out) == before
    assert _leftovers(tmp_path, out) == []


def test_several_bad_parameters_are_all_named_at_once(cli: Cli, tmp_path: Path) -> None:
    r = cli(
        "render",
        "vllm-pd",
        *("--set", "prefill_node=<NODE>", "--set", "gpus=eight", "--set", "kv_connector=nccl"),
        "-o",
        str(tmp_path / "deploy"),
    )
    assert r.returncode == 2
    for name in ("prefill_node", "gpus", "kv_connector", "image", "decode_node"):
        assert name in r.stderr, name
    assert not (tmp_path / "deploy").exists()


@pytest.mark.parametrize(
    ("sets", "names"),
    [
        ([*MIXED[:2], "model_dir=models/m"], ["model_dir"]),
        ([*MIXED, "namespace=Team_A"], ["namespace"]),
        ([*MIXED, "gpu_resource=gpu"], ["gpu_resource"]),
        ([*MIXED, "gpus=4"], ["gpus", "tensor_parallel"]),
    ],
)
def test_values_that_cannot_work_are_refused_naming_the_parameter(
    sets: list[str], names: list[str]
) -> None:
    with pytest.raises(UsageError) as e:
        render_files("vllm-mixed", sets)
    for name in names:
        assert f"'{name}'" in str(e.value)


def test_draft_method_without_a_draft_names_the_draft_parameter() -> None:
    with pytest.raises(UsageError) as e:
        render_files("vllm-pd-spec", [*PD, "spec_method=eagle3", "prefill_draft_dir=/data/d"])
    msg = str(e.value)
    assert "role decode has none" in msg and "'decode_draft_dir'" in msg


def test_draft_given_to_a_method_without_drafts_is_refused() -> None:
    with pytest.raises(UsageError, match=r"'mtp' uses no draft model.*'draft_dir'"):
        render_files("vllm-mixed-spec", [*MIXED, "spec_method=mtp", "draft_dir=/data/d"])


def test_local_recipe_is_refused(cli: Cli, tmp_path: Path) -> None:
    r = cli("render", LOCAL_ONLY_RECIPE, "-o", str(tmp_path / "deploy"))
    assert r.returncode == 2
    assert "local backend only" in r.stderr
    assert not (tmp_path / "deploy").exists()


def test_a_directory_of_other_files_is_never_replaced(tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    _, _, files = render_files("vllm-mixed", MIXED)
    with pytest.raises(UsageError, match="did not write"):
        write_atomically(out, files)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_rendering_again_replaces_the_previous_render(tmp_path: Path) -> None:
    out, _ = _previous_render(tmp_path)
    _, _, files = render_files("vllm-pd", PD)
    write_atomically(out, files)
    assert sorted(_tree(out)) == sorted(files)
    assert _leftovers(tmp_path, out) == []


def test_without_output_the_manifests_go_to_stdout(cli: Cli) -> None:
    r = cli("render", "vllm-mixed", *[a for s in MIXED for a in ("--set", s)])
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    # No Namespace: `| kubectl delete -f -` would delete it with every deployment in it
    # (issue 32, finding 9); stderr says how to make it and how to tear down.
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    assert "kubectl create namespace servebook" in r.stderr
    assert "teardown: the same render piped to `kubectl delete -f -`" in r.stderr


# --- teardown ---------------------------------------------------------------------------------

# What kubectl reads from a directory given to -f without -R: its own files of these
# suffixes, never a folder's (k8s.io/cli-runtime resource.ExpandPathsToFileVisitors).
KUBECTL_SUFFIXES = (".json", ".yaml", ".yml")
Ref = tuple[str, str | None, str]


def _kubectl_objects(command: str) -> list[Ref]:
    """The objects a printed ``kubectl apply|delete -f PATH [&& ...]`` reads, in order."""
    refs: list[Ref] = []
    for step in command.split("&&"):
        words = step.split()
        assert words[:1] == ["kubectl"] and words[2] == "-f" and len(words) == 4, step
        path = Path(words[3])
        files = sorted(
            f for f in path.iterdir() if f.is_file() and f.name.endswith(KUBECTL_SUFFIXES)
        )
        for f in files if path.is_dir() else [path]:
            for d in yaml.safe_load_all(f.read_text()):
                meta = d["metadata"]
                refs.append((d["kind"], meta.get("namespace"), meta["name"]))
    return refs


def _printed(stdout: str, what: str) -> str:
    line = next(x for x in stdout.splitlines() if x.startswith(f"{what}: "))
    return line.removeprefix(f"{what}: ").split("   ")[0]


def _render_to(cli: Cli, recipe: str, out: Path, *args: str) -> tuple[str, str]:
    values = FIXTURES / recipe / "values.yaml"
    r = cli("render", recipe, "-f", str(values), *args, "-o", str(out))
    assert r.returncode == 0, r.stderr
    return _printed(r.stdout, "apply"), _printed(r.stdout, "teardown")


def test_a_renders_teardown_deletes_nothing_another_render_applied(
    cli: Cli, tmp_path: Path
) -> None:
    """(issue 32, finding 9) vllm-pd and vllm-pd-spec both render namespace moe-pd; the
    printed teardown of one (`kubectl delete -f DIR`) deleted that namespace, and with it
    every object of the other.  Render prints a teardown that removes only its own."""
    pd_apply, pd_teardown = _render_to(cli, "vllm-pd", tmp_path / "pd")
    spec_apply, spec_teardown = _render_to(
        cli, "vllm-pd-spec", tmp_path / "spec", "--set", "namespace=moe-pd"
    )
    pd_applied, spec_applied = _kubectl_objects(pd_apply), _kubectl_objects(spec_apply)
    pd_deleted, spec_deleted = _kubectl_objects(pd_teardown), _kubectl_objects(spec_teardown)
    # A fresh cluster: each apply makes the namespace before anything goes into it.
    for applied in (pd_applied, spec_applied):
        assert applied[0] == ("Namespace", None, "moe-pd")
        assert {ns for _, ns, _ in applied[1:]} == {"moe-pd"}
    # Each teardown removes everything its apply made but the namespace, and nothing else.
    assert set(pd_deleted) == set(pd_applied[1:])
    assert set(spec_deleted) == set(spec_applied[1:])
    assert not set(pd_deleted) & set(spec_applied)
    assert not set(spec_deleted) & set(pd_applied)
    # The same recipe under two deployment names: the same holds.
    other_apply, _ = _render_to(cli, "vllm-pd", tmp_path / "pd-b", "--name", "pd-b")
    assert not set(pd_deleted) & set(_kubectl_objects(other_apply))


def test_render_says_the_namespace_stays_and_how_to_delete_it(cli: Cli, tmp_path: Path) -> None:
    """(issue 32, finding 9) The teardown line says what it leaves behind; PARAMETERS.md
    carries the same two commands for whoever finds the directory later."""
    out = tmp_path / "pd"
    r = cli("render", "vllm-pd", "-f", str(FIXTURES / "vllm-pd" / "values.yaml"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert f"teardown: kubectl delete -f {out}/   (this deployment's objects only; " in r.stdout
    assert "namespace moe-pd stays" in r.stdout
    assert "`kubectl delete namespace moe-pd` once it is empty" in r.stdout
    params = (out / PARAMETERS_FILE).read_text()
    assert "`kubectl apply -f ./namespace/ && kubectl apply -f ./`" in params
    assert "Tear down: `kubectl delete -f ./`" in params
    # Rendering into the same directory again replaces it, namespace folder and all.
    r = cli("render", "vllm-pd", "-f", str(FIXTURES / "vllm-pd" / "values.yaml"), "-o", str(out))
    assert r.returncode == 0, r.stderr


# --- servebook lint on the rendered output ---------------------------------------------------


@pytest.mark.parametrize("recipe", GPU_RECIPES + TINY_RECIPES)
def test_servebook_lint_reports_nothing_on_rendered_output(recipe: str, cli: Cli) -> None:
    expected = FIXTURES / recipe / "expected"
    r = cli("lint", str(expected))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no findings" in r.stdout, r.stdout


def test_object_names_follow_the_roles() -> None:
    _, objects, _ = render_files("vllm-pd", PD)
    plan_names = [o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"]
    assert plan_names == ["vllm-pd-prefill", "vllm-pd-decode", "vllm-pd-router"]
    assert ENGINE_PORT == 8000


# --- extra engine flags ---------------------------------------------------------------------


def test_extra_engine_args_reach_every_engine_after_the_recipes_own(tmp_path: Path) -> None:
    _, objects, files = render_files(
        "vllm-pd", [*PD, "extra_engine_args=--trust-remote-code --max-num-seqs 64"]
    )
    for name in ("vllm-pd-prefill", "vllm-pd-decode"):
        args = _engine(objects, name)["args"]
        i = args.index("--trust-remote-code")
        assert args[i : i + 3] == ["--trust-remote-code", "--max-num-seqs", "64"], name
        assert i > args.index("--tensor-parallel-size"), name
    assert "`--trust-remote-code --max-num-seqs 64`" in files[PARAMETERS_FILE]
    # A values file may give them as a YAML list, quoted words staying one argument.
    vf = tmp_path / "v.yaml"
    vf.write_text("extra_engine_args: [--override-generation-config, '{\"a\": 1}']\n")
    _, objects, _ = render_files("vllm-mixed", MIXED, [vf])
    args = _engine(objects, "vllm-mixed")["args"]
    assert _flag(args, "--override-generation-config") == '{"a": 1}'
    _, objects, _ = render_files("vllm-mixed", MIXED)  # unset: nothing added
    args = _engine(objects, "vllm-mixed")["args"]
    assert args[args.index("--tensor-parallel-size") + 2] == "--host"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("--served-model-name other", "sets --served-model-name, which servebook sets from"),
        ("-tp 4", "gives --tensor-parallel-size more than once"),
        ("--kv_transfer_config {}", "sets --kv_transfer_config, which servebook sets"),
        ("--x 'unclosed", "cannot split it into arguments"),
    ],
)
def test_extra_engine_args_that_cannot_work_exit_2_naming_the_parameter_and_write_nothing(
    cli: Cli, tmp_path: Path, value: str, words: str
) -> None:
    err = _render_pd_refused(cli, tmp_path, f"extra_engine_args={value}")
    assert words in err and "extra_engine_args" in err


# --- start-up and Pod settings ----------------------------------------------------------------


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_engine_ready_timeout_follows_the_startup_budget_only_beyond_vllms_default() -> None:
    _, objects, _ = render_files("vllm-mixed", [*MIXED, "startup_timeout_s=2400"])
    env = _env(_engine(objects, "vllm-mixed"))
    assert env["VLLM_ENGINE_READY_TIMEOUT_S"] == "2400"
    # Node-local weights: never a hub download.
    assert env["HF_HUB_OFFLINE"] == "1"
    _, objects, _ = render_files("vllm-mixed", [*MIXED, "startup_timeout_s=600"])
    assert "VLLM_ENGINE_READY_TIMEOUT_S" not in _env(_engine(objects, "vllm-mixed"))


def test_engine_pods_request_cpu_and_memory_burstable_by_default() -> None:
    _, objects, _ = render_files("vllm-pd", PD)
    r = _engine(objects, "vllm-pd-decode")["resources"]
    assert r["requests"]["cpu"] == "16" and r["requests"]["memory"] == "128Gi"
    assert "cpu" not in r["limits"] and "memory" not in r["limits"]


def test_guaranteed_qos_sets_limits_equal_to_requests(in_fixture: Callable[[str], Path]) -> None:
    in_fixture("vllm-mixed-spec")
    objects, _ = _golden("vllm-mixed-spec")
    r = _engine(objects, "vllm-mixed-spec")["resources"]
    for k in ("cpu", "memory"):
        assert r["requests"][k] == r["limits"][k]
    assert r["requests"]["nvidia.com/gpu"] == r["limits"]["nvidia.com/gpu"]


def test_pod_settings_reach_every_pod_and_drain_matches_the_termination_grace() -> None:
    sets = [
        *PD,
        "image_pull_secrets=regcred,mirror",
        "service_account=llm",
        "priority_class=llm-high",
        "drain_timeout_s=60",
        "extra_tolerations=[{key: dedicated, operator: Exists}]",
    ]
    _, objects, _ = render_files("vllm-pd", sets)
    for name, pod in _pods(objects):
        assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}], name
        assert pod["serviceAccountName"] == "llm" and pod["priorityClassName"] == "llm-high"
        assert {"key": "dedicated", "operator": "Exists"} in pod["tolerations"]
    for name in ("vllm-pd-prefill", "vllm-pd-decode"):
        pod = dict(_pods(objects))[name]
        assert _flag(pod["containers"][0]["args"], "--shutdown-timeout") == "60"
        assert pod["terminationGracePeriodSeconds"] == 90
    assert "terminationGracePeriodSeconds" not in dict(_pods(objects))["vllm-pd-router"]
    with pytest.raises(UsageError, match="--shutdown-timeout"):
        render_files("vllm-pd", [*sets, "extra_engine_args=--shutdown-timeout 5"])


def test_compile_cache_is_a_node_directory_per_role_kept_across_restarts() -> None:
    _, objects, _ = render_files("vllm-pd", [*PD, "compile_cache_dir=/var/cache/sb"])
    pod = dict(_pods(objects))["vllm-pd-decode"]
    vol = {v["name"]: v for v in pod["volumes"]}["compile-cache"]
    assert vol["hostPath"] == {"path": "/var/cache/sb/vllm-pd-decode", "type": "DirectoryOrCreate"}
    env = _env(pod["containers"][0])
    assert env["VLLM_CACHE_ROOT"] == "/cache/vllm" and env["TRITON_CACHE_DIR"] == "/cache/triton"


def test_pod_overrides_merge_into_the_engine_pod_spec() -> None:
    values = "{runtimeClassName: nvidia, securityContext: {fsGroup: 1000}}"
    _, objects, _ = render_files("vllm-pd", [*PD, f"pod_overrides={values}"])
    pod = dict(_pods(objects))["vllm-pd-prefill"]
    assert pod["runtimeClassName"] == "nvidia" and pod["securityContext"] == {"fsGroup": 1000}
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "gpu-node-1"}  # kept
    assert "runtimeClassName" not in dict(_pods(objects))["vllm-pd-router"]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("{runtimeClasName: nvidia}", "runtimeClasName"),
        ("{terminationGracePeriodSeconds: soon}", "terminationGracePeriodSeconds"),
    ],
)
def test_invalid_pod_overrides_exit_2_naming_them_and_write_nothing(
    cli: Cli, tmp_path: Path, value: str, words: str
) -> None:
    err = _render_pd_refused(cli, tmp_path, f"pod_overrides={value}")
    assert "kubernetes.pod.overrides" in err and "Pod schema" in err
    assert words in err


def test_pod_overrides_replacing_the_containers_need_the_engines_http_port(
    cli: Cli, tmp_path: Path
) -> None:
    """Issue 33, D24: a container list without ports crashed render (KeyError: 'ports')."""
    bare = "{containers: [{name: engine, image: 'python:3.12-slim'}]}"
    err = " ".join(_render_pd_refused(cli, tmp_path, f"pod_overrides={bare}").split())
    assert "Traceback" not in err and "KeyError" not in err
    assert "parameter pod_overrides" in err and "replaces role prefill's containers" in err
    assert "container 'engine' with no port named 'http'" in err
    assert "ports: [{name: http, containerPort: 8000}]" in err
    # With the port it renders: the Service targets the replacing container's port.
    ported = (
        "{containers: [{name: engine, image: 'python:3.12-slim', "
        "ports: [{name: http, containerPort: 8000}]}]}"
    )
    _, objects, _ = render_files("vllm-pd", [*PD, f"pod_overrides={ported}"])
    pod = dict(_pods(objects))["vllm-pd-prefill"]
    assert [c["image"] for c in pod["containers"]] == ["python:3.12-slim"]


def test_a_yaml_parameter_that_is_not_yaml_structure_is_refused_naming_it() -> None:
    with pytest.raises(UsageError, match=r"parameter 'pod_overrides'.*mapping or list"):
        render_files("vllm-pd", [*PD, "pod_overrides=nvidia"])


def test_a_role_on_several_nodes_needs_one_listed_node_per_pod() -> None:
    base = ["image=i:1", "model_dir=/data/m", "fabric=ib-shared", "decode_nodes=c,d"]
    with pytest.raises(UsageError, match=r"runs 2 Pods .* lists 1 node\(s\) \(a\)"):
        render_files("vllm-pd-wide-ep", [*base, "prefill_nodes=a"], [])
    with pytest.raises(UsageError, match="names a node twice"):
        render_files(
            "vllm-pd-wide-ep",
            [*base, "prefill_nodes=a,a"],
            [],
        )
    with pytest.raises(UsageError, match="--data-parallel-size, which servebook sets"):
        render_files(
            "vllm-pd-wide-ep",
            [*base, "prefill_nodes=a,b", "extra_engine_args=--data-parallel-size 4"],
            [],
        )
