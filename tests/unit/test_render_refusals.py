"""`servebook render` refuses what the API server, its controllers or vLLM would refuse
later, half-way through an apply or minutes after an image pull: exit 2, nothing written,
naming the parameter and the rule (issue 23 point 5, issue 24 point 5)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servebook.commands.render import render_files
from servebook.errors import UsageError
from tests.conftest import CliResult

Cli = Callable[..., CliResult]
WIDE_EP = [
    "image=vllm/vllm-openai:v0.20.0",
    "model_dir=/data/models/m",
    "prefill_nodes=gpu-a,gpu-b",
    "decode_nodes=gpu-c,gpu-d",
    "fabric=ib-shared",
]
CATALOG = Path(__file__).resolve().parents[2] / "src" / "servebook" / "recipe" / "catalog"
TINY = ["image=vllm/vllm-openai-cpu:v0.32.0-x86_64"]


def _sets(values: list[str]) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def test_a_name_starting_with_a_digit_is_refused_as_a_service_name(
    cli: Cli, tmp_path: Path
) -> None:
    out = tmp_path / "deploy"
    r = cli("render", "tiny-mixed", *_sets(TINY), "--name", "8b-test", "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert "deployment name '8b-test'" in r.stderr
    assert "Service/8b-test" in r.stderr and "DNS-1035 label" in r.stderr
    assert "start with an alphabetic character" in r.stderr
    assert not out.exists()


def test_a_long_name_whose_statefulset_pods_could_not_be_created_is_refused(
    cli: Cli, tmp_path: Path
) -> None:
    """kubernetes#64023: a StatefulSet's Pods carry controller-revision-hash=NAME-HASH;
    the LeaderWorkerSet's worker StatefulSet is LWS-0, so 44 characters leave no room."""
    name = "a" * 44
    out = tmp_path / "deploy"
    r = cli("render", "vllm-pd-wide-ep", *_sets(WIDE_EP), "--name", name, "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert f"worker StatefulSet {name}-prefill-lws-0" in r.stderr
    assert "controller-revision-hash" in r.stderr
    assert "a label value may have at most 63" in r.stderr
    # 63 - len("-prefill-lws-0") - len("-") - 10 = 38
    assert "at most 38 characters" in r.stderr
    assert "--name" in r.stderr
    assert not out.exists()


def test_the_longest_name_the_limit_names_renders() -> None:
    render_files("vllm-pd-wide-ep", WIDE_EP, name="a" * 38)
    with pytest.raises(UsageError, match="at most 38 characters"):
        render_files("vllm-pd-wide-ep", WIDE_EP, name="a" * 39)


def test_the_revision_label_limit_counts_every_group_of_a_leaderworkerset() -> None:
    """With 11 groups the last worker StatefulSet is LWS-10: one character less room."""
    from servebook.kube.names import derived_names

    _, objects, _ = render_files("vllm-pd-wide-ep", WIDE_EP, name="a" * 20)
    lws = next(o for o in objects if o["kind"] == "LeaderWorkerSet")
    lws["spec"]["replicas"] = 11
    texts = [d.text for d in derived_names([lws]) if d.pad]
    assert f"{lws['metadata']['name']}-10" in texts


@pytest.mark.parametrize(
    ("text", "rule", "bad"),
    [
        ("8b-test", "dns1035", True),
        ("b8-test", "dns1035", False),
        ("8b-test", "dns1123-label", False),
        ("a" * 64, "dns1123-label", True),
        ("a.b", "dns1123-subdomain", False),
        ("a.b", "dns1123-label", True),
        ("", "label-value", False),
        ("-x", "label-value", True),
    ],
)
def test_name_rules_are_the_api_servers(text: str, rule: str, bad: bool) -> None:
    from servebook.kube.names import name_errors

    assert bool(name_errors(text, rule)) is bad


def test_quantities_the_api_server_refuses_exit_2_naming_each_parameter(
    cli: Cli, tmp_path: Path
) -> None:
    out = tmp_path / "deploy"
    r = cli("render", "tiny-mixed", *_sets([*TINY, "memory=lots", "cpu=-3"]), "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert "parameter 'memory'" in r.stderr and "'lots'" in r.stderr
    assert "parameter 'cpu'" in r.stderr and "'-3'" in r.stderr
    assert "Kubernetes quantity" in r.stderr
    assert not out.exists()


@pytest.mark.parametrize("value", ["1500m", "2", "0.5", "16Gi", "512M", "1e3", "+4", ".5"])
def test_quantities_the_api_server_parses_render(value: str) -> None:
    _, objects, _ = render_files("tiny-mixed", [*TINY, f"cpu={value}"])
    (dep,) = [o for o in objects if o["kind"] == "Deployment"]
    assert dep["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == (
        value
    )


@pytest.mark.parametrize(
    ("image", "why"),
    [
        ("vllm/vllm-openai:latest", "tag `latest`"),
        ("vllm/vllm-openai", "no version tag or digest"),
        ("localhost:5000/vllm", "no version tag or digest"),
    ],
)
def test_an_unpinned_image_is_refused_unless_meant(
    cli: Cli, tmp_path: Path, image: str, why: str
) -> None:
    out = tmp_path / "deploy"
    r = cli("render", "tiny-mixed", "--set", f"image={image}", "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert why in r.stderr and "allow_unpinned_image=true" in r.stderr
    assert not out.exists()
    render_files("tiny-mixed", [f"image={image}", "allow_unpinned_image=true"])


@pytest.mark.parametrize("image", ["localhost:5000/vllm:v1", "vllm/vllm-openai@sha256:" + "a" * 64])
def test_a_tag_or_digest_pins(image: str) -> None:
    render_files("tiny-mixed", [f"image={image}"])


def _containers(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for o in objects:
        spec = o.get("spec") or {}
        lwt = spec.get("leaderWorkerTemplate") or {}
        for t in (spec.get("template"), lwt.get("leaderTemplate"), lwt.get("workerTemplate")):
            pod = (t or {}).get("spec") or {}
            for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
                out.append((f"{o['kind']}/{o['metadata']['name']}/{c['name']}", c))
    return out


@pytest.mark.parametrize(
    ("recipe", "sets"),
    [
        ("tiny-pd", [*TINY, "router_image=vllm/vllm-router:v0.1.17", "node=n1"]),
        ("vllm-pd-wide-ep", WIDE_EP),
    ],
)
def test_every_container_requests_cpu_and_memory(recipe: str, sets: list[str]) -> None:
    """Router and init containers too: a container without requests makes its Pod
    BestEffort (or, beside others, leaves its share unreserved)."""
    _, objects, _ = render_files(recipe, sets)
    containers = _containers(objects)
    assert any("router" in who for who, _ in containers)
    for who, c in containers:
        requests = (c.get("resources") or {}).get("requests") or {}
        assert requests.get("cpu") and requests.get("memory"), who


def test_deployments_allow_progress_beyond_their_startup_budget() -> None:
    """Kubernetes' default progressDeadlineSeconds (600) would call a healthy long load
    failed; each Deployment's is above its Pods' start-up budget."""
    sets = [*TINY, "router_image=vllm/vllm-router:v0.1.17", "node=n1"]
    plan, objects, _ = render_files("tiny-pd", sets)
    budget = plan.kubernetes.startup_timeout_s if plan.kubernetes else 0
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    assert len(deployments) == 3
    for dep in deployments:
        pod = dep["spec"]["template"]["spec"]
        probe = pod["containers"][0]["startupProbe"]
        startup = probe["periodSeconds"] * probe["failureThreshold"]
        assert startup >= budget
        assert dep["spec"]["progressDeadlineSeconds"] > startup, dep["metadata"]["name"]


def test_a_role_without_cpu_or_memory_requests_is_refused(tmp_path: Path) -> None:
    text = (CATALOG / "tiny-mixed.yaml").read_text(encoding="utf-8")
    recipe = tmp_path / "no-memory.yaml"
    recipe.write_text(text.replace("      memory: ${memory}\n", ""), encoding="utf-8")
    with pytest.raises(UsageError, match=r"role mixed requests no memory.*BestEffort"):
        render_files(str(recipe), TINY)


def test_the_probe_pod_is_pinned_to_its_node_the_way_the_engines_are() -> None:
    """Issue 23 point 10: where a node's name and its hostname label differ, a probe
    pinned by nodeName would never run where the engines (pinned by the label) do."""
    from servebook.preflight.probe_pod import pod_manifest, probe_targets
    from servebook.recipe.resolve import resolve

    sets = ["image=vllm/vllm-openai:v0.11.0", "node=gpu-node-1", "model_dir=/data/models/m"]
    plan = resolve("vllm-mixed", sets, [])
    _, objects, _ = render_files("vllm-mixed", sets)
    (dep,) = [o for o in objects if o["kind"] == "Deployment"]
    engine = dep["spec"]["template"]["spec"]
    (target,) = probe_targets(plan)
    probe = pod_manifest(target, namespace="ns", deadline_s=60, script="")["spec"]
    assert "nodeName" not in probe
    assert probe["nodeSelector"] == engine["nodeSelector"]
    assert {"operator": "Exists"} in probe["tolerations"]  # cordoned nodes are still probed


def test_unknown_flags_name_the_closest_real_one() -> None:
    from servebook.recipe.engine_flags import flags_of, unknown_flags

    known = {"--max-num-seqs", "--enable-prefix-caching", "--no-enable-prefix-caching"}
    args = ["--max-num-seqz", "256", "--enable_prefix_caching", "--max-num-seqs=8", "--x"]
    assert flags_of(args) == ["--max-num-seqz", "--enable-prefix-caching", "--max-num-seqs", "--x"]
    assert unknown_flags(args, known) == [("--max-num-seqz", "--max-num-seqs"), ("--x", None)]
