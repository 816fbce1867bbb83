"""The tiny recipes on a CPU-only Kubernetes cluster (kind, k3s), and unchanged locally.

On a cluster each engine Pod makes the tiny model itself: an init container of vLLM's CPU
image runs servebook's generator, shipped in a ConfigMap, into an emptyDir.  These tests
run that very ConfigMap text with the init container's own command line (this machine's
Python standing in for the image's) and compare the bytes with ``servebook model tiny``;
they pin the PD handoff's shared node directory, the parameters only a cluster needs, and
the local backend's command lines as they were before the recipes learnt Kubernetes
(tests/unit/fixtures/local_plans.json, captured from the previous commit)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from servebook.commands.render import render_files
from servebook.errors import UsageError
from servebook.kube import manifests
from servebook.kube.engine_pod import GENERATOR_HASH_ANNOTATION, GENERATOR_MOUNT, KV_VOLUME
from servebook.kube.names import GENERATOR_KEY
from servebook.models.tiny import make_tiny_model
from servebook.recipe.plan import POD_DRAFT_DIR, POD_MODEL_DIR, POD_MODELS_MOUNT
from servebook.recipe.resolve import Source, load_source, parse_recipe, resolve

FIXTURES = Path(__file__).parent / "fixtures"
IMAGE = "image=vllm/vllm-openai-cpu:v0.32.0-x86_64"
PD = [IMAGE, "node=kind-control-plane"]
Obj = dict[str, Any]


def _deployments(objects: list[Obj]) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}


def _pod(objects: list[Obj], name: str) -> Obj:
    spec: Obj = _deployments(objects)[name]["spec"]["template"]["spec"]
    return spec


def _engine(objects: list[Obj], name: str) -> Obj:
    container: Obj = _pod(objects, name)["containers"][0]
    return container


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _hashes(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


# --- the model made in the Pod is `servebook model tiny`'s, byte for byte ------------------


def _run_init_container(init: Obj, script_text: str, root: Path) -> Path:
    """Run an init container's command here: the ConfigMap's script at its mount path, the
    emptyDir at its mount path, both under ``root``; servebook made unimportable, as in
    vLLM's image."""
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert mounts == {"models": POD_MODELS_MOUNT, "model-generator": GENERATOR_MOUNT}
    script = root / mounts["model-generator"].lstrip("/") / GENERATOR_KEY
    script.parent.mkdir(parents=True)
    script.write_text(script_text, encoding="utf-8")
    (root / POD_MODELS_MOUNT.lstrip("/")).mkdir(parents=True)
    python, path, *args = init["command"]
    assert python == "python3" and path == str(Path("/") / script.relative_to(root))
    argv = [str(root / a.lstrip("/")) if a.startswith("/") else a for a in args]
    blocked = (
        "import runpy, sys; sys.modules['servebook'] = None; "
        "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    r = subprocess.run(
        [sys.executable, "-c", blocked, str(script), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert r.returncode == 0, r.stderr
    return root / args[0].lstrip("/")


@pytest.mark.parametrize("recipe", ["tiny-mixed", "tiny-pd"])
def test_the_pods_init_container_makes_the_same_model_as_servebook_model_tiny(
    recipe: str, tmp_path: Path
) -> None:
    _, objects, _ = render_files(recipe, PD if recipe == "tiny-pd" else [IMAGE])
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
    script_text = cm["data"][GENERATOR_KEY]
    engines = [n for n, d in _deployments(objects).items() if not n.endswith("-router")]
    inits = {
        n: [c for c in _pod(objects, n)["initContainers"] if c["name"] == "make-model"]
        for n in engines
    }
    # Every engine Pod makes its model with the same command from the same ConfigMap.
    commands = {json.dumps(i[0]["command"]) for i in inits.values()}
    assert len(commands) == 1
    for n in engines:
        pod = _pod(objects, n)
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["model-generator"]["configMap"]["name"] == cm["metadata"]["name"]
        assert volumes["models"] == {"name": "models", "emptyDir": {}}
        assert {"name": "models", "mountPath": POD_MODELS_MOUNT, "readOnly": True} in (
            pod["containers"][0]["volumeMounts"]
        )
        assert _flag(pod["containers"][0]["args"], "--model") == POD_MODEL_DIR
        # A new generator rolls the Pods (a ConfigMap change alone would not).
        annotations = _deployments(objects)[n]["spec"]["template"]["metadata"]["annotations"]
        assert annotations[GENERATOR_HASH_ANNOTATION] == (
            hashlib.sha256(script_text.encode()).hexdigest()
        )

    made = _run_init_container(next(iter(inits.values()))[0], script_text, tmp_path / "pod")
    expected = make_tiny_model(tmp_path / "expected")
    assert _hashes(made) == _hashes(expected)
    # A restarted Pod keeps its emptyDir: running again replaces the model with the same.
    again = _run_init_container(next(iter(inits.values()))[0], script_text, tmp_path / "pod2")
    assert _hashes(again) == _hashes(expected)


def test_the_shipped_generator_is_servebooks_own_source() -> None:
    source = manifests.generator_source()
    assert source == (Path(manifests.__file__).parents[1] / "models" / "tiny.py").read_text()
    assert 'if __name__ == "__main__":' in source


# --- speculation: the draft is made in the Pod beside the model --------------------------------

# Each speculative recipe and the recipe it adds speculation to, with the values a cluster needs.
SPEC_BASES = {"tiny-mixed-spec": ("tiny-mixed", [IMAGE]), "tiny-pd-spec": ("tiny-pd", PD)}


def _without_the_draft(objects: list[Obj], recipe: str, base: str) -> list[Obj]:
    """``objects`` with every trace of the draft taken out of the engine Pods (its init
    container, the engine's --speculative-config) and the deployment named as ``base``."""
    stripped: list[Obj] = json.loads(json.dumps(objects).replace(recipe, base))
    for o in stripped:
        if o["kind"] != "Deployment" or o["metadata"]["name"].endswith("-router"):
            continue
        pod = o["spec"]["template"]["spec"]
        pod["initContainers"] = [c for c in pod["initContainers"] if c["name"] != "make-draft"]
        args = pod["containers"][0]["args"]
        at = args.index("--speculative-config")
        del args[at : at + 2]
    # The generator's hash is of the same script; the ConfigMap's text names no recipe.
    return stripped


@pytest.mark.parametrize("recipe", list(SPEC_BASES))
def test_a_spec_recipe_on_kubernetes_is_its_base_plus_a_draft_made_in_each_engine_pod(
    recipe: str,
) -> None:
    base, sets = SPEC_BASES[recipe]
    _, objects, _ = render_files(recipe, sets)
    _, base_objects, _ = render_files(base, sets)
    engines = [n for n in _deployments(objects) if not n.endswith("-router")]
    assert engines == ([f"{recipe}-prefill", f"{recipe}-decode"] if base == "tiny-pd" else [recipe])
    for n in engines:
        inits = {c["name"]: c for c in _pod(objects, n)["initContainers"]}
        # The model, then the draft, into the one emptyDir the engine mounts at /models.
        assert inits["make-model"]["command"][2:] == [POD_MODEL_DIR]
        assert inits["make-draft"]["command"][2:] == [POD_DRAFT_DIR, "--draft"]
        assert inits["make-draft"]["command"][:2] == inits["make-model"]["command"][:2]
        assert list(inits)[-2:] == ["make-model", "make-draft"]
        args = _engine(objects, n)["args"]
        assert _flag(args, "--model") == POD_MODEL_DIR
        assert json.loads(_flag(args, "--speculative-config")) == {
            "method": "draft_model",
            "model": POD_DRAFT_DIR,
            "num_speculative_tokens": 3,
        }
    # Apart from the draft, exactly the base recipe's objects: the same image, resources,
    # node, probes, and (PD) the same KV storage and router.
    assert _without_the_draft(objects, recipe, base) == base_objects


@pytest.mark.parametrize("recipe", list(SPEC_BASES))
def test_a_spec_recipe_declares_its_bases_parameters_as_the_base_does(recipe: str) -> None:
    """A catalog file cannot include another, so each spec recipe repeats its base's
    parameter declarations: they must not drift apart (only the image's words name the
    draft too)."""
    base = load_source(SPEC_BASES[recipe][0]).data
    spec = load_source(recipe).data
    params, base_params = spec["parameters"], base["parameters"]
    assert set(params) == set(base_params) | {"draft_dir", "num_speculative_tokens"}
    for name, declared in base_params.items():
        mine = dict(params[name])
        if name == "image":
            assert "and its draft" in mine["description"]
            mine["description"] = declared["description"]
        assert mine == declared, name
    for key in ("image", "kubernetes", "router", "roles"):
        assert spec.get(key) == base.get(key), key


def test_the_pods_draft_is_servebook_model_tiny_drafts_bytes(tmp_path: Path) -> None:
    _, objects, _ = render_files("tiny-pd-spec", PD)
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
    (init,) = [
        c
        for c in _pod(objects, "tiny-pd-spec-decode")["initContainers"]
        if c["name"] == "make-draft"
    ]
    made = _run_init_container(init, cm["data"][GENERATOR_KEY], tmp_path / "pod")
    assert made == tmp_path / "pod" / POD_DRAFT_DIR.lstrip("/")
    expected = make_tiny_model(tmp_path / "expected", draft=True)
    assert _hashes(made) == _hashes(expected)


# --- PD: one node, one shared directory ------------------------------------------------------


def test_pd_engines_share_one_node_directory_as_the_connectors_storage() -> None:
    _, objects, _ = render_files("tiny-pd", PD)
    pre, dec = _pod(objects, "tiny-pd-prefill"), _pod(objects, "tiny-pd-decode")
    for pod in (pre, dec):
        assert pod["nodeSelector"] == {"kubernetes.io/hostname": "kind-control-plane"}
        kv = {v["name"]: v for v in pod["volumes"]}[KV_VOLUME]
        # Scratch, one per deployment, created when absent; never the weights.
        assert kv["hostPath"] == {
            "path": "/var/lib/servebook/kv/tiny-pd",
            "type": "DirectoryOrCreate",
        }
        assert not [v for v in pod["volumes"] if v.get("hostPath", {}).get("type") == "Directory"]
        engine = pod["containers"][0]
        mount = {m["name"]: m for m in engine["volumeMounts"]}[KV_VOLUME]
        assert "readOnly" not in mount
        cfg = json.loads(_flag(engine["args"], "--kv-transfer-config"))
        assert cfg == {
            "kv_connector": "ExampleConnector",
            "kv_connector_extra_config": {"shared_storage_path": mount["mountPath"]},
            "kv_role": "kv_both",
        }
        res = engine["resources"]
        assert res == {"requests": {"cpu": "2", "memory": "4Gi"}}  # no GPU anywhere
        env = {e["name"]: e.get("value") for e in engine["env"]}
        assert env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
        assert "--enforce-eager" in engine["args"] and _flag(engine["args"], "--dtype") == (
            "bfloat16"
        )
        # The CPU engine is up in ~35-60 s: a startup budget of minutes, not half an hour.
        startup = engine["startupProbe"]
        assert 60 <= startup["periodSeconds"] * startup["failureThreshold"] <= 600
    assert pre["containers"][0]["args"] == dec["containers"][0]["args"]
    # Only the prefill Pod empties the directory, before its engine starts: files an
    # earlier run left would read as transferred KV on the decode side.
    clear = [c for c in pre["initContainers"] if c["name"] == "clear-kv-storage"]
    assert clear and clear[0]["command"][:2] == ["find", "/kv"]
    assert not [c for c in dec["initContainers"] if c["name"] == "clear-kv-storage"]
    # The router finds both engines through their Services.
    args = _engine(objects, "tiny-pd-router")["args"]
    assert _flag(args, "--prefill") == "http://tiny-pd-prefill:8000"
    assert "--kv-connector" not in args  # ExampleConnector needs no router protocol


def test_two_deployments_of_tiny_pd_get_their_own_kv_directories() -> None:
    _, a, _ = render_files("tiny-pd", PD, name="a")
    _, b, _ = render_files("tiny-pd", PD, name="b")

    def kv_path(objects: list[Obj], name: str) -> str:
        vols = {v["name"]: v for v in _pod(objects, name)["volumes"]}
        return str(vols[KV_VOLUME]["hostPath"]["path"])

    assert kv_path(a, "a-prefill") == kv_path(a, "a-decode") == "/var/lib/servebook/kv/a"
    assert kv_path(b, "b-decode") == "/var/lib/servebook/kv/b"
    cms = [o["metadata"]["name"] for o in b if o["kind"] == "ConfigMap"]
    assert cms == ["b-model-generator"]


def test_tiny_mixed_needs_no_node_and_mounts_nothing_from_one() -> None:
    _, objects, _ = render_files("tiny-mixed", [IMAGE])
    pod = _pod(objects, "tiny-mixed")
    assert "nodeSelector" not in pod
    assert not [v for v in pod["volumes"] if "hostPath" in v]


# --- parameters only a cluster needs ----------------------------------------------------------


def test_render_without_image_and_node_exits_2_naming_both_and_how_to_find_them(
    cli: Any, tmp_path: Path
) -> None:
    out = tmp_path / "deploy"
    r = cli("render", "tiny-pd", "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert "kubernetes backend needs are unset" in r.stderr
    for name in ("image", "node"):
        assert f"  {name} (" in r.stderr and f"--set {name}=VALUE" in r.stderr
    assert "vllm/vllm-openai-cpu" in r.stderr  # where vLLM publishes its CPU images
    assert "0.32.0" in r.stderr
    assert not out.exists()


def test_local_resolution_needs_neither_image_nor_node(sb_home: Path) -> None:
    plan = resolve("tiny-pd")
    assert plan.params["image"] is None and plan.params["node"] is None
    assert sorted(plan.unresolved_on) == ["kubernetes"]
    with pytest.raises(UsageError, match="image"):
        manifests.render(plan)


def test_an_image_set_to_nothing_is_still_unset_for_kubernetes() -> None:
    with pytest.raises(UsageError, match=r"unset;.*\n  image \("):
        render_files("tiny-mixed", ["image="])


# --- the local backend is exactly as before -----------------------------------------------------


@pytest.mark.parametrize("recipe", ["tiny-mixed", "tiny-pd", "tiny-mixed-spec", "tiny-pd-spec"])
@pytest.mark.parametrize("state", [None, "/sbstate/x"])
def test_local_plans_are_unchanged(
    recipe: str, state: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVEBOOK_HOME", "/sbhome")
    before = json.loads((FIXTURES / "local_plans.json").read_text())[f"{recipe}|{state}"]
    plan = resolve(recipe, state_dir=Path(state) if state else None)
    d = plan.model_dump(mode="json")
    assert plan.command_lines() == before["command_lines"]
    assert plan.command_lines("/venv/bin/python", "127.0.0.1") == before["command_lines_py"]
    assert {r.name: r.env for r in plan.roles} == before["env"]
    assert {r.name: [r.model_path, r.draft_path] for r in plan.roles} == before["model_paths"]
    assert d["generate"] == before["generate"]
    assert d["kv_storage"] == before["kv_storage"]
    assert plan.served_model_name == before["served"]
    assert plan.speculative == before["speculative"]
    assert (plan.topology, plan.entry_role) == (before["topology"], before["entry_role"])
    # What the local backend reads is untouched by the kubernetes section.
    assert all(r.image is None for r in plan.engine_roles) and plan.image is None


# --- the schema says what a kubernetes section may not do -----------------------------------


def _recipe(**changes: Any) -> Source:
    data: Obj = {
        "name": "r",
        "description": "d",
        "backends": ["local", "kubernetes"],
        "topology": "mixed",
        "model": {"path": "/m", "served_name": "m", "generate": "tiny"},
        "roles": {"mixed": {}},
        "kubernetes": {"model_source": "generate"},
    }
    for key, value in changes.items():
        data[key] = value
    return Source("r", "r.yaml", data)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"model": {"path": "/m", "served_name": "m"}}, "needs model.generate"),
        (
            {
                "model": {
                    "path": "/m",
                    "served_name": "m",
                    "generate": "tiny",
                    "container_path": "/x",
                }
            },
            "leave container_path unset",
        ),
        (
            {"kubernetes": {"kv_storage": {"host_path": "/var/kv"}}},
            "has none",
        ),
        ({"kubernetes": {"kv_storage": {"host_path": "var/kv"}}}, "an absolute path"),
        (
            {
                "parameters": {
                    "p": {"description": "x", "required_on": ["kubernetes"], "default": 1}
                }
            },
            "cannot have a default",
        ),
    ],
)
def test_the_schema_refuses_a_kubernetes_section_that_cannot_work(changes: Obj, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        parse_recipe(_recipe(**changes))
