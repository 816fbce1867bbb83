"""Rule behaviour beyond the fixtures: decisions and false-positive guards, each pinned."""

from __future__ import annotations

import json

import pytest

from servebook.findings import Finding
from servebook.lint import rules
from servebook.lint.loader import LintSet, MarkdownFile, parse_yaml
from servebook.lint.rules.hostpath import pinned_node
from servebook.lint.rules.images import normalize_image
from servebook.lint.rules.objects import is_label_value
from servebook.lint.rules.placeholders import find_placeholders


def lint_text(text: str, path: str = "m.yaml", *md: MarkdownFile) -> list[Finding]:
    return rules.check(LintSet([parse_yaml(text, path)], list(md)))


def ids(findings: list[Finding]) -> list[tuple[str, str]]:
    return sorted((f.check, f.severity.value) for f in findings)


# --- SB101 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["<NODE>", "/data/<MODEL_DIR>", "${MODEL}", "{{ .Values.node }}", "REPLACE_ME",
     "REPLACE_WITH_NODE", "changeme", "x-<your-model>-y"],
)  # fmt: skip
def test_placeholder_spellings_are_found(text: str) -> None:
    assert find_placeholders(text)


@pytest.mark.parametrize(
    "text",
    ["cat < in.txt > out.txt", "<|im_start|>user", "<s>[INST]", "<think>", "a <br> b",
     "$(POD_IP)", '{"a": {"b": 1}}', "REPLACEMENT", "exchange-me-not", "2>&1 | tee log",
     "{% if x %}{{ x }}{% endif %}", "<b>bold</b> <NOT_A_PLACEHOLDER_IN_MARKUP>"],
)  # fmt: skip
def test_placeholder_false_positive_guards(text: str) -> None:
    assert find_placeholders(text) == []


def test_shell_expansion_is_not_a_placeholder_but_angle_brackets_still_are() -> None:
    assert find_placeholders("ls ${MODEL_DIR}", shell=True) == []
    assert find_placeholders("ls <MODEL_DIR>", shell=True) == ["<MODEL_DIR>"]


def test_node_placeholder_and_mount_placeholder_name_different_failure_modes() -> None:
    node = lint_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n"
        "    spec:\n      nodeSelector: {kubernetes.io/hostname: <NODE>}\n"
        "      containers: [{name: c, image: i:1}]\n"
    )
    mount = lint_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  nodeName: n1\n"
        "  containers: [{name: c, image: i:1}]\n"
        "  volumes: [{name: w, hostPath: {path: <MODEL_DIR>, type: Directory}}]\n"
    )
    assert [f.check for f in node] == ["SB101"] and [f.check for f in mount] == ["SB101"]
    assert "no Pod ever appears" in node[0].message
    assert "mount time" in mount[0].message and "no Pod ever appears" not in mount[0].message
    assert node[0].evidence["line"] == 7


def test_valid_label_placeholder_in_node_selector_means_pending_forever() -> None:
    f = lint_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n"
        "  nodeSelector: {kubernetes.io/hostname: REPLACE_NODE}\n"
        "  containers: [{name: c, image: i:1}]\n"
    )
    assert len(f) == 1 and "Pending forever" in f[0].message


def test_templating_tools_and_env_expanding_files_are_not_placeholders() -> None:
    runtime = (
        "apiVersion: serving.kserve.io/v1alpha1\nkind: ClusterServingRuntime\n"
        "metadata: {name: vllm}\nspec:\n  containers:\n    - name: kserve-container\n"
        "      image: kserve/huggingfaceserver:v0.15.0\n"
        "      args: ['--model_name={{.Name}}', '--model_id={{.StorageUri}}']\n"
    )
    compose = "services:\n  vllm:\n    image: vllm/vllm-openai:v0.11.0\n"
    compose += "    command: ['--model', '${MODEL}']\n"
    actions = "on: push\njobs:\n  t:\n    steps:\n      - run: echo ${{ github.sha }}\n"
    assert lint_text(runtime) == []
    assert lint_text(compose) == []
    assert lint_text(actions) == []
    # A Helm values file expands nothing: `${X}` there is a leftover.
    assert ids(lint_text("image:\n  tag: ${TAG}\n")) == [("SB101", "fail")]


def test_recipe_references_must_be_declared_parameters() -> None:
    f = lint_text(
        "name: r\nparameters:\n  node: {type: label}\n"
        "roles:\n  decode: {node: '${node}', dir: '${cache_dir}/x', other: '${nodes}'}\n"
    )
    assert len(f) == 1
    assert "${nodes} is not a declared parameter" in f[0].message


# --- SB102 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,ok",
    [("gpu-node-07", True), ("", True), ("a" * 63, True), ("a" * 64, False),
     ("-x", False), ("x.", False), ("a/b", False), ("A_b.c-D", True)],
)  # fmt: skip
def test_label_value_syntax(value: str, ok: bool) -> None:
    assert is_label_value(value) is ok


# --- SB103 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,pinned",
    [
        ({"nodeName": "n1"}, True),
        ({"nodeSelector": {"kubernetes.io/hostname": "n1"}}, True),
        ({"nodeSelector": {"nvidia.com/gpu.product": "H100"}}, False),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}}},
         True),
        # Terms are ORed: two terms pinning to two nodes is not one node.
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]},
                {"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}]},
            ]}}}}, False),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}, True),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1"]}]}]}}}},
         False),
    ],
)  # fmt: skip
def test_pinned_node(spec: dict[str, object], pinned: bool) -> None:
    assert pinned_node(spec)[0] is pinned


# --- PD rules ---------------------------------------------------------------------------


V11 = "vllm/vllm-openai:v0.11.0"


def pd_pair(
    prefill_args: list[str], decode_args: list[str], images: tuple[str, str] = (V11, V11)
) -> str:
    """Two Deployments, m-prefill and m-decode, running `vllm serve org/model ARGS`."""
    docs = []
    roles = (("prefill", prefill_args, images[0]), ("decode", decode_args, images[1]))
    for role, args, image in roles:
        docs.append(
            "apiVersion: apps/v1\nkind: Deployment\n"
            f"metadata: {{name: m-{role}}}\n"
            "spec:\n  template:\n    spec:\n      containers:\n"
            f"        - name: vllm\n          image: {image}\n"
            f"          command: {json.dumps(['vllm', 'serve', 'org/model', *args])}\n"
        )
    return "---\n".join(docs)


def kv(connector: str, role: str) -> list[str]:
    return ["--kv-transfer-config", json.dumps({"kv_connector": connector, "kv_role": role})]


@pytest.mark.parametrize(
    "connector,expected",
    [("NixlConnector", []), ("NixlPushConnector", []),
     ("MooncakeConnector", [("SB107", "warn")]), ("LMCacheConnectorV1", [("SB107", "warn")]),
     ("ExampleConnector", [("SB107", "fail")]), ("P2pNcclConnector", [("SB107", "fail")])],
)  # fmt: skip
def test_heterogeneous_tp_depends_on_the_connector(
    connector: str, expected: list[tuple[str, str]]
) -> None:
    text = pd_pair(
        ["-tp", "4", *kv(connector, "kv_producer")], ["-tp", "8", *kv(connector, "kv_consumer")]
    )
    assert ids(lint_text(text)) == expected


@pytest.mark.parametrize(
    "p,d,expected",
    [("16", "64", [("SB107", "warn")]), ("64", "16", [("SB107", "fail")]), ("32", "32", [])],
)
def test_nixl_allows_only_a_smaller_prefill_block_size(
    p: str, d: str, expected: list[tuple[str, str]]
) -> None:
    text = pd_pair(
        ["--block-size", p, *kv("NixlConnector", "kv_producer")],
        ["--block-size", d, *kv("NixlConnector", "kv_consumer")],
    )
    assert ids(lint_text(text)) == expected


def test_fp8_kv_cache_on_one_side_fails_but_explicit_model_dtype_only_warns() -> None:
    both = kv("NixlConnector", "kv_both")
    fp8 = lint_text(pd_pair(both, ["--kv-cache-dtype", "fp8", *both]))
    auto = lint_text(pd_pair(["--dtype", "bfloat16", *both], both))
    assert ids(fp8) == [("SB107", "fail")]
    assert ids(auto) == [("SB107", "warn")]


def test_speculative_config_compares_semantically() -> None:
    both = kv("NixlConnector", "kv_both")
    a = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    b = ['--speculative_config={"num_speculative_tokens":3,"method":"ngram"}']
    assert lint_text(pd_pair([*a, *both], [*b, *both])) == []
    c = ["-sc", '{"method": "ngram", "num_speculative_tokens": 4}']
    f = lint_text(pd_pair([*a, *both], [*c, *both]))
    assert ids(f) == [("SB105", "fail")]
    assert "num_speculative_tokens: prefill 3, decode 4" in f[0].message


def test_legacy_speculative_flags_count_as_a_speculative_config() -> None:
    both = kv("NixlConnector", "kv_both")
    f = lint_text(pd_pair(both, ["--speculative-model", "org/draft", *both]))
    assert ids(f) == [("SB105", "fail")]


def test_draft_dirs_with_different_names_warn() -> None:
    both = kv("NixlConnector", "kv_both")

    def spec(path: str) -> list[str]:
        return ["-sc", json.dumps({"method": "eagle3", "model": path, "num_speculative_tokens": 2})]

    same = lint_text(pd_pair([*spec("/a/EAGLE3"), *both], [*spec("/b/EAGLE3"), *both]))
    other = lint_text(pd_pair([*spec("/a/EAGLE3"), *both], [*spec("/b/EAGLE3-v2"), *both]))
    assert same == []
    assert ids(other) == [("SB105", "warn")]


def test_role_named_prefill_but_configured_as_consumer_fails() -> None:
    f = lint_text(pd_pair(kv("NixlConnector", "kv_consumer"), kv("NixlConnector", "kv_consumer")))
    assert ids(f) == [("SB106", "fail")]
    assert "named as the prefill role but its kv_role is kv_consumer" in f[0].message


def test_pairs_are_formed_per_model_name_not_across_models() -> None:
    both = kv("NixlConnector", "kv_both")
    llama = pd_pair(both, both).replace("m-", "llama-")
    qwen = pd_pair(["--dtype", "float16", *both], ["--dtype", "float16", *both])
    qwen = qwen.replace("m-", "qwen-")
    assert lint_text(llama + "---\n" + qwen) == []


def test_unrelated_engines_are_not_paired_across_namespaces() -> None:
    both = kv("NixlConnector", "kv_both")
    text = pd_pair(["--dtype", "float16", *both], both)
    text = text.replace("{name: m-decode}", "{name: m-decode, namespace: other}")
    text += "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: other}\n"
    assert lint_text(text) == []


def test_image_tags_that_differ_between_roles_fail_but_registry_spelling_does_not() -> None:
    both = kv("NixlConnector", "kv_both")
    same = pd_pair(both, both, images=(V11, "docker.io/vllm/vllm-openai:v0.11.0"))
    other = pd_pair(both, both, images=(V11, "vllm/vllm-openai:v0.10.2"))
    assert lint_text(same) == []
    assert ids(lint_text(other)) == [("SB107", "fail")]


# --- SB110 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ref,norm",
    [("vllm/vllm-openai:v0.11.0", ("vllm/vllm-openai", "v0.11.0")),
     ("docker.io/vllm/vllm-openai:v0.11.0", ("vllm/vllm-openai", "v0.11.0")),
     ("docker.io/library/busybox", ("busybox", "latest")),
     ("localhost:5000/vllm/vllm-openai:v1", ("localhost:5000/vllm/vllm-openai", "v1")),
     ("ghcr.io/x/y@sha256:" + "a" * 64, ("ghcr.io/x/y", "sha256:" + "a" * 64))],
)  # fmt: skip
def test_normalize_image(ref: str, norm: tuple[str, str]) -> None:
    assert normalize_image(ref) == norm


def test_docs_in_another_directory_are_not_compared() -> None:
    deploy = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
        "spec:\n  containers: [{name: c, image: 'vllm/vllm-openai:v0.11.0'}]\n"
    )
    here = MarkdownFile("deploy/README.md", "uses vllm/vllm-openai:v0.10.0.\n")
    elsewhere = MarkdownFile("docs/history.md", "we used vllm/vllm-openai:v0.9.0.\n")
    f = lint_text(deploy, "deploy/pod.yaml", here, elsewhere)
    assert ids(f) == [("SB110", "fail")]
    assert f[0].subject == "deploy/README.md:1"
    assert f[0].evidence["mentioned"] == "vllm/vllm-openai:v0.10.0"


# --- SB104 ------------------------------------------------------------------------------


def hostpath_pod(command: list[str], path: str, mount: str, vtype: str) -> str:
    return (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  nodeName: n1\n"
        f"  containers:\n    - name: c\n      image: vllm/vllm-openai:v0.11.0\n"
        f"      command: {json.dumps(command)}\n"
        f"      volumeMounts: [{{name: v, mountPath: {mount}}}]\n"
        f"  volumes: [{{name: v, hostPath: {{path: {path}, type: {vtype}}}}}]\n"
    )


@pytest.mark.parametrize(
    "command,path,mount,expected",
    [
        # The engine reads its model from the mount: weights, whatever the name.
        (["vllm", "serve", "/srv/x/Llama"], "/data/x", "/srv/x", [("SB104", "fail")]),
        # A cache beside an engine that reads its model elsewhere.
        (["vllm", "serve", "/srv/x/Llama"], "/data/hf-cache", "/root/.cache/huggingface", []),
        (["vllm", "serve", "org/Llama"], "/data/hf-cache", "/root/.cache/huggingface", []),
        # No engine: the name decides (a probe or copy job on a weights directory).
        (["ls", "/w"], "/mnt/models/Llama", "/w", [("SB104", "fail")]),
        (["ls", "/w"], "/var/tmp/scratch", "/w", []),
    ],
)
def test_directory_or_create_on_weights(
    command: list[str], path: str, mount: str, expected: list[tuple[str, str]]
) -> None:
    assert ids(lint_text(hostpath_pod(command, path, mount, "DirectoryOrCreate"))) == expected


def test_type_directory_never_creates() -> None:
    pod = hostpath_pod(["vllm", "serve", "/srv/x/Llama"], "/data/x", "/srv/x", "Directory")
    assert lint_text(pod) == []
