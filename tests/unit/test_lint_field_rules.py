"""The rule changes the field corpus asked for, each with the true case it must keep:
templates (SB115), caches on hostPaths (SB103), hybrid-LB data parallelism (SB113),
alternatives that are not pairs, `$VAR` words (SB117 and the model), secrets written for
envsubst or in chart values (SB114), unbounded wait loops (SB116), placeholders spelled
the docs' way (SB101) and READMEs one directory below their manifests (SB110)."""

from __future__ import annotations

import pytest

from servebook.findings import Finding
from servebook.lint import rules
from servebook.lint.loader import LintSet, MarkdownFile, parse_yaml
from servebook.lint.rules.placeholders import find_placeholders


def lint(*files: tuple[str, str], md: tuple[str, str] | None = None) -> list[Finding]:
    docs = [MarkdownFile(md[0], md[1])] if md else []
    return rules.check(LintSet([parse_yaml(text, path) for path, text in files], docs))


def ids(findings: list[Finding]) -> list[tuple[str, str]]:
    return sorted((f.check, f.severity.value) for f in findings)


def deployment(name: str, args: str, extra: str = "", volumes: str = "") -> str:
    return (
        f"apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n"
        f"  template:\n    spec:\n      containers:\n        - name: vllm\n"
        f"          image: vllm/vllm-openai:v0.11.0\n          command: [vllm, serve]\n"
        f"          args: {args}\n{extra}{volumes}"
    )


NIXL = '\'{"kv_connector":"NixlConnector","kv_role":"kv_both"}\''


# --- SB101 / SB115 ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["pvc://YOUR-PVC-NAME/models", "YOUR_MODEL_PATH", "your-storage-class", "<YOUR HF TOKEN>",
     "my-registry/vllm-openai:my-tag", "<your hf token here>"],
)  # fmt: skip
def test_the_docs_placeholder_spellings_are_placeholders(text: str) -> None:
    assert find_placeholders(text)


@pytest.mark.parametrize(
    "text", ["yourself", "<b>Bold Text</b>", "Hello World <3", "a < B c > d", "my-registry-mirror"]
)
def test_lookalikes_of_the_new_spellings_are_not(text: str) -> None:
    assert find_placeholders(text) == []


def test_a_leftover_values_expression_fails_and_a_chart_template_is_not_a_pass() -> None:
    leftover = deployment("d", "[Qwen/Qwen3-8B]").replace(
        "vllm/vllm-openai:v0.11.0", '"vllm/vllm-openai:{{ .Values.tag }}"'
    )
    assert ids(lint(("a.yaml", leftover))) == [("SB101", "fail")]
    chart = leftover.replace("{name: d}", '{name: "{{ .Release.Name }}-vllm"}')
    assert ids(lint(("a.yaml", chart))) == [("SB115", "error")]  # not checked: exit 2


def test_a_kustomize_base_is_information_only_where_its_kustomization_replaces_the_image() -> None:
    base = deployment("decode", "[Qwen/Qwen3-8B]").replace(
        "vllm/vllm-openai:v0.11.0", "REPLACE_IMAGE"
    )
    kust = (
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [decode.yaml]\nimages: [{name: REPLACE_IMAGE, newName: vllm/vllm-openai}]\n"
    )
    assert ids(lint(("k/decode.yaml", base))) == [("SB101", "fail")]
    assert ids(lint(("k/decode.yaml", base), ("k/kustomization.yaml", kust))) == [("SB115", "info")]
    # A file the kustomization does not list keeps its placeholder.
    assert ids(lint(("k/other.yaml", base), ("k/kustomization.yaml", kust))) == [("SB101", "fail")]


# --- SB103 ------------------------------------------------------------------------------

HOSTPATH = (
    "          volumeMounts: [{{name: v, mountPath: {mount}}}]\n{env}"
    "      volumes: [{{name: v, hostPath: {{path: {path}, type: Directory}}}}]\n"
)


def test_a_cache_hostpath_is_not_unpinned_weights_but_weights_named_cache_still_are() -> None:
    cache = deployment(
        "d",
        "[Qwen/Qwen3-8B]",
        volumes=HOSTPATH.format(
            mount="/data/hf",
            path="/mnt/local/hf",
            env="          env: [{name: HF_HOME, value: /data/hf}]\n",
        ),
    )
    assert ids(lint(("a.yaml", cache))) == []
    weights = deployment(
        "d",
        "[/models/llama]",
        volumes=HOSTPATH.format(mount="/models", path="/mnt/hf-cache", env=""),
    )
    assert ids(lint(("a.yaml", weights))) == [("SB103", "fail")]


# --- SB113 ------------------------------------------------------------------------------


def lws(worker_flags: str) -> str:
    return (
        "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: {name: g}\n"
        "spec:\n  leaderWorkerTemplate:\n    size: 2\n    workerTemplate:\n      spec:\n"
        "        containers:\n          - name: vllm\n            image: vllm/vllm-openai:v0.11.0\n"
        f"            command: [vllm, serve, m, --data-parallel-size, '4', {worker_flags}]\n"
    )


def test_hybrid_lb_workers_need_no_headless_but_plain_workers_do() -> None:
    assert ids(lint(("a.yaml", lws("--data-parallel-hybrid-lb")))) == []
    assert ids(lint(("a.yaml", lws("--data-parallel-size-local, '2'")))) == [("SB113", "fail")]


def test_kubernetes_references_do_not_cut_a_script_short() -> None:
    script = lws("--enable-expert-parallel").replace(
        "command: [vllm, serve, m, --data-parallel-size, '4', --enable-expert-parallel]",
        'command: [sh, -c, "exec vllm serve m --data-parallel-size 4 --data-parallel-address '
        '$(LWS_LEADER_ADDRESS) --data-parallel-hybrid-lb"]',
    )
    assert ids(lint(("a.yaml", script))) == []


# --- pairs ------------------------------------------------------------------------------

SPEC = '\'{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4}\''


def test_two_files_defining_the_same_object_are_alternatives_not_a_pair() -> None:
    a = (
        deployment("m-prefill", f"[m, --kv-transfer-config, {NIXL}]")
        + "---\n"
        + deployment("m-decode", f"[m, --kv-transfer-config, {NIXL}]")
    )
    b = deployment("m-decode", f"[m, --kv-transfer-config, {NIXL}, --speculative-config, {SPEC}]")
    assert ids(lint(("a.yaml", a), ("b.yaml", b))) == []
    # Distinct objects in two files still pair: the decode-only speculation is found.
    c = deployment("m-decode", f"[m, --kv-transfer-config, {NIXL}, --speculative-config, {SPEC}]")
    p = deployment("m-prefill", f"[m, --kv-transfer-config, {NIXL}]")
    assert ids(lint(("p.yaml", p), ("c.yaml", c))) == [("SB105", "fail")]


# --- SB117 and the model ----------------------------------------------------------------


def scripted(name: str, script: str) -> str:
    return (
        f"apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n"
        "  template:\n    spec:\n      containers:\n        - name: vllm\n"
        "          image: vllm/vllm-openai:v0.11.0\n"
        f"          command: [sh, -c]\n          args:\n            - |\n              {script}\n"
    )


def test_flag_variables_are_reported_and_never_read_as_the_model() -> None:
    p = scripted(
        "m-prefill", f"exec vllm serve $PROFILER_ARGS Qwen/Qwen3-8B --kv-transfer-config {NIXL}"
    )
    d = scripted("m-decode", f"exec vllm serve Qwen/Qwen3-8B --kv-transfer-config {NIXL}")
    found = lint(("a.yaml", p + "---\n" + d))
    assert ids(found) == [("SB117", "warn")]  # no SB107 "served model names differ"
    assert "$PROFILER_ARGS" in found[0].message
    alone = scripted("m", "exec vllm serve $MODEL --port 8000")
    assert ids(lint(("a.yaml", alone))) == []


# --- SB114 ------------------------------------------------------------------------------


def test_env_secrets_written_for_envsubst_are_found_wherever_the_env_list_is() -> None:
    cr = (
        "apiVersion: ome.io/v1beta1\nkind: BenchmarkJob\nmetadata: {name: b}\nspec:\n"
        "  podOverride:\n    env:\n      - {name: HF_TOKEN, value: $HF_TOKEN}\n"
        "      - {name: HF_TOKEN2, value: $(HF_TOKEN)}\n      - {name: HF_HOME, value: $HOME}\n"
    )
    found = lint(("a.yaml", cr))
    assert ids(found) == [("SB114", "fail")]
    assert "expands only $(VAR)" in found[0].message


def test_literal_secrets_in_chart_values_but_not_secret_references() -> None:
    values = (
        "servingEngineSpec:\n  vllmApiKey: abc123XYZ987\n"
        "  hfToken: {secretName: hf, secretKey: token}\n"
        "  tokenSecretName: hf-token\n  hf_token: <hf-token>\n  apiKeyFile: /etc/key\n"
    )
    assert ids(lint(("values.yaml", values))) == [("SB101", "fail"), ("SB114", "fail")]


# --- SB116 ------------------------------------------------------------------------------


def job(script: str, deadline: str = "") -> str:
    return (
        f"apiVersion: batch/v1\nkind: Job\nmetadata: {{name: j}}\nspec:\n{deadline}"
        "  template:\n    spec:\n      containers:\n        - name: c\n"
        f"          image: curlimages/curl:8.8.0\n          command: [sh, -c, '{script}']\n"
    )


def test_a_wait_loop_is_unbounded_until_something_ends_it() -> None:
    loop = "until curl -sf --max-time 5 http://x/health; do sleep 5; done"
    assert ids(lint(("a.yaml", job(loop)))) == [("SB116", "fail")]
    assert ids(lint(("a.yaml", job(loop, "  activeDeadlineSeconds: 600\n")))) == []
    assert ids(lint(("a.yaml", job(f'timeout 600 sh -c "{loop}"')))) == []
    counted = "n=0; until curl -sf http://x; do n=$((n+1)); [ $n -ge 30 ] && exit 1; sleep 2; done"
    assert ids(lint(("a.yaml", job(counted)))) == []


# --- SB110 ------------------------------------------------------------------------------


def test_a_readme_below_the_manifests_is_compared_but_a_build_tag_is_not() -> None:
    manifest = ("deploy/a.yaml", deployment("d", "[Qwen/Qwen3-8B]"))
    stale = ("deploy/docs/README.md", "Runs `vllm/vllm-openai:v0.10.0`.\n")
    assert ids(lint(manifest, md=stale)) == [("SB110", "fail")]
    build = ("deploy/README.md", "```sh\ndocker build -t vllm/vllm-openai:dev .\n```\n")
    assert ids(lint(manifest, md=build)) == []


def test_a_kustomize_patch_leaves_its_placeholders_to_the_overlays() -> None:
    patch = (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: decode}\n"
        "spec:\n  replicas: ${DECODE_REPLICAS}\n"
    )
    kust = (
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [../base]\npatches: [{path: patch.yaml}]\n"
    )
    assert ids(lint(("o/patch.yaml", patch))) == [("SB101", "fail")]
    found = lint(("o/patch.yaml", patch), ("o/kustomization.yaml", kust))
    assert ids(found) == [("SB115", "info")]
    assert "${DECODE_REPLICAS}" in found[0].message


def test_without_names_roles_pair_within_a_file_or_as_a_lone_pair() -> None:
    spec = f"[m, --kv-transfer-config, {NIXL}, --speculative-config, {SPEC}]"
    plain = f"[m, --kv-transfer-config, {NIXL}]"
    # Two unrelated files, each with a prefill and a decode of its own names.
    a = deployment("alpha-prefill", plain) + "---\n" + deployment("alpha-decode", plain)
    b = deployment("beta-p", plain).replace("{name: beta-p}", "{name: beta-prefill}")
    b += "---\n" + deployment("gamma-decode", spec)
    assert ids(lint(("a.yaml", a), ("b.yaml", b))) == [("SB105", "fail")]
    # A lone prefill and a lone decode in two files are one deployment.
    assert ids(
        lint(("p.yaml", deployment("x-prefill", plain)), ("d.yaml", deployment("y-decode", spec)))
    ) == [("SB105", "fail")]


def test_values_lookup_keys_and_expressions_are_not_secrets() -> None:
    values = (
        "tolerations: [{key: nvidia.com/gpu, operator: Exists}]\n"
        "ci:\n  githubToken: ${{ secrets.GITHUB_TOKEN }}\n  hfToken: '{{ .Values.token }}'\n"
    )
    assert [f for f in lint(("values.yaml", values)) if f.check == "SB114"] == []


def test_the_base_image_of_a_dockerfile_in_a_doc_is_not_the_manifests_image() -> None:
    manifest = ("deploy/a.yaml", deployment("d", "[Qwen/Qwen3-8B]"))
    doc = ("deploy/README.md", "```dockerfile\nFROM vllm/vllm-openai:v0.8.0\n```\n")
    assert ids(lint(manifest, md=doc)) == []
    stale = ("deploy/README.md", "```sh\ndocker pull vllm/vllm-openai:v0.8.0\n```\n")
    assert ids(lint(manifest, md=stale)) == [("SB110", "fail")]


def test_a_controller_templates_engines_are_neither_checked_nor_paired() -> None:
    def template(role: str, flags: str) -> str:
        return (
            "apiVersion: serving.kserve.io/v1alpha1\nkind: LLMInferenceServiceConfig\n"
            f"metadata: {{name: config-llm-{role}-template}}\nspec:\n  template:\n"
            "    containers:\n      - name: main\n        image: ghcr.io/llm-d/llm-d:v0.2.0\n"
            f"        command: [vllm, serve, /mnt/models]\n        args: [{flags}]\n"
        )

    found = lint(
        ("p.yaml", template("prefill", f"--kv-transfer-config, {NIXL}")),
        ("d.yaml", template("decode", f"--kv-transfer-config, {NIXL}, --block-size, '64'")),
    )
    assert ids(found) == [("SB115", "info"), ("SB115", "info")]


def test_a_secret_flag_in_chart_values_extra_args() -> None:
    values = "vllmConfig:\n  extraArgs: [--api-key, sk-abcdef123456, --port, '8000']\n"
    found = lint(("values.yaml", values))
    assert ids(found) == [("SB114", "fail")]
    assert "sk-abcdef123456" not in found[0].message
