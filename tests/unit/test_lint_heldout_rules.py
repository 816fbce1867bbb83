"""Rule changes the held-out corpus (tests/unit/fixtures/lint/heldout, judged independently
of the rules' author) asked for, each with the true case it must keep: KV over multi-node
NVLink is not TCP (SB112), Dynamo's --disaggregation-mode and v1beta1 component types name
the PD roles, a Pod that downloads its own weights into a hostPath (SB103/SB104), a doc's
image beside a placeholder image field (SB110), and an engine started through
`eval "exec vllm serve ..."` (SB117)."""

from __future__ import annotations

from servebook.findings import Finding
from servebook.lint import rules
from servebook.lint.loader import LintSet, MarkdownFile, parse_yaml


def lint(*files: tuple[str, str], md: tuple[str, str] | None = None) -> list[Finding]:
    docs = [MarkdownFile(md[0], md[1])] if md else []
    return rules.check(LintSet([parse_yaml(text, path) for path, text in files], docs))


def checks(findings: list[Finding]) -> list[tuple[str, str]]:
    return sorted((f.check, f.severity.value) for f in findings)


NIXL = '\'{"kv_connector":"NixlConnector","kv_role":"kv_both"}\''


def deployment(name: str, args: str, env: str = "") -> str:
    return (
        f"apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n"
        f"  template:\n    spec:\n      containers:\n        - name: vllm\n"
        f"          image: vllm/vllm-openai:v0.22.1\n          command: [vllm, serve]\n"
        f"          args: {args}\n{env}"
    )


def ucx_env(tls: str, mnnvl: str | None) -> str:
    env = f"          env:\n            - {{name: UCX_TLS, value: '{tls}'}}\n"
    if mnnvl is not None:
        env += f"            - {{name: UCX_CUDA_IPC_ENABLE_MNNVL, value: '{mnnvl}'}}\n"
    return env


# --- SB112 --------------------------------------------------------------------------------


def test_kv_over_multi_node_nvlink_is_not_tcp() -> None:
    """llm-d's wide-EP GB200 guides: UCX_TLS=cuda_copy,cuda_ipc,tcp with MNNVL enabled moves
    KV over NVLink between nodes; tcp only bootstraps."""
    env = ucx_env("cuda_copy,cuda_ipc,tcp", "y")
    found = lint(
        ("p.yaml", deployment("m-prefill", f"[m, --kv-transfer-config, {NIXL}]", env)),
        ("d.yaml", deployment("m-decode", f"[m, --kv-transfer-config, {NIXL}]", env)),
    )
    assert "SB112" not in [c for c, _ in checks(found)]


def test_cuda_ipc_without_mnnvl_still_crosses_nodes_by_tcp() -> None:
    for mnnvl in (None, "n"):
        env = ucx_env("cuda_copy,cuda_ipc,tcp", mnnvl)
        found = lint(
            ("p.yaml", deployment("m-prefill", f"[m, --kv-transfer-config, {NIXL}]", env)),
            ("d.yaml", deployment("m-decode", f"[m, --kv-transfer-config, {NIXL}]", env)),
        )
        assert ("SB112", "warn") in checks(found), mnnvl


# --- Dynamo roles (SB112 and every PD rule) -------------------------------------------------


def dgd_v1beta1(
    tls: str, names: tuple[str, str] = ("VllmDecodeWorker", "VllmPrefillWorker")
) -> str:
    def component(name: str, mode: str) -> str:
        return (
            f"  - name: {name}\n    type: {mode}\n    frontendSidecar: sidecar-frontend\n"
            "    podTemplate:\n      spec:\n        containers:\n        - name: main\n"
            "          image: nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.0.0\n"
            "          command: [/bin/sh, -c]\n"
            "          args:\n            - |\n"
            f"              python3 -m dynamo.vllm --model Qwen/Qwen3-0.6B \\\n"
            f"              --disaggregation-mode {mode} --kv-transfer-config {NIXL}\n"
            f"          env: [{{name: UCX_TLS, value: '{tls}'}}]\n"
            "        - name: sidecar-frontend\n"
            "          image: nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.0.0\n"
            "          args: [-m, dynamo.frontend, --router-mode, direct]\n"
        )

    return (
        "apiVersion: nvidia.com/v1beta1\nkind: DynamoGraphDeployment\n"
        "metadata: {name: qwen}\nspec:\n  components:\n"
        + component(names[0], "decode")
        + component(names[1], "prefill")
    )


def test_dynamo_disaggregation_mode_names_the_pd_roles() -> None:
    """ai-dynamo/dynamo examples/backends/vllm/deploy/gaie/v1beta1/disagg.yaml: kv_both on
    both workers, the role only in --disaggregation-mode; TCP must be seen on that pair."""
    found = [f for f in lint(("dgd.yaml", dgd_v1beta1("tcp,self"))) if f.check == "SB112"]
    assert len(found) == 1, found
    assert "VllmPrefillWorker -> " in found[0].subject
    assert "VllmDecodeWorker" in found[0].subject
    assert lint(("dgd.yaml", dgd_v1beta1("rc,cuda_copy,cuda_ipc"))) == []
    # Components named for nothing: the flag alone says which worker is which.
    neutral = lint(("dgd.yaml", dgd_v1beta1("tcp,self", ("worker-a", "worker-b"))))
    assert [f.check for f in neutral] == ["SB112"]


def test_a_frontend_sidecar_on_the_runtime_image_is_not_an_engine() -> None:
    from servebook.engines.cmdline import parse_container

    image = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.0.0"
    assert parse_container({"image": image, "args": ["-m", "dynamo.frontend"]}) is None
    worker = parse_container({"image": image, "args": ["-m", "dynamo.vllm", "--model", "Q"]})
    assert worker is not None and worker.value("--model") == "Q"


# --- SB110 ----------------------------------------------------------------------------------


def pod_with_image(image: str) -> str:
    return (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: fe}\nspec:\n  containers:\n"
        f"    - name: fe\n      image: {image}\n"
    )


README = (
    "Replace `nvcr.io/nvidia/ai-dynamo/vllm-runtime:my-tag` with your image.\n\n"
    "> Validated against `nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.2.0-cuda13-dev.3`.\n"
)


def test_a_doc_beside_a_placeholder_image_field_is_not_stale() -> None:
    """ai-dynamo/dynamo's guides: the manifest keeps `my-tag` (SB101 reports it) and the
    doc names the validated image; that doc is not a stale reference."""
    found = lint(
        ("d/agg.yaml", pod_with_image("nvcr.io/nvidia/ai-dynamo/vllm-runtime:my-tag")),
        md=("d/README.md", README),
    )
    assert checks(found) == [("SB101", "fail")]


def test_a_doc_naming_another_real_tag_is_still_stale() -> None:
    found = lint(
        ("d/agg.yaml", pod_with_image("nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.1.0")),
        md=("d/README.md", README),
    )
    assert ("SB110", "fail") in checks(found)


# --- SB103 / SB104 --------------------------------------------------------------------------


def downloading_pod(init_cmd: str, read_only: bool = False) -> str:
    """Shaped like vllm-project/aibrix samples/kvcache/l1cache/vllm.yaml: weights downloaded
    by an init container into a DirectoryOrCreate hostPath the engine serves from."""
    ro = "\n              readOnly: true" if read_only else ""
    return (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: r1}\nspec:\n  template:\n"
        "    spec:\n      initContainers:\n        - name: init-model\n"
        "          image: aibrix/runtime:v0.3.0\n"
        f"          command: {init_cmd}\n"
        "          volumeMounts:\n            - mountPath: /models\n"
        f"              name: model-hostpath{ro}\n"
        "      containers:\n        - name: vllm\n          image: vllm/vllm-openai:v0.10.2\n"
        "          command: [vllm, serve, --model, /models/R1-Distill-Llama-8B/]\n"
        "          volumeMounts:\n            - {mountPath: /models, name: model-hostpath}\n"
        "      volumes:\n        - name: model-hostpath\n          hostPath:\n"
        "            path: /root/models\n            type: DirectoryOrCreate\n"
    )


def test_weights_an_init_container_downloads_into_a_hostpath_are_not_a_trap() -> None:
    for init in (
        "[aibrix_download, --model-uri, 'tos://bucket/R1/', --local-dir, /models/]",
        "[sh, -c, 'hf download deepseek-ai/R1-Distill-Llama-8B --local-dir /models/R1']",
    ):
        assert lint(("d.yaml", downloading_pod(init))) == [], init


def test_an_init_container_that_only_reads_the_weights_fills_nothing() -> None:
    for pod in (
        downloading_pod("[ls, /models]"),
        downloading_pod("[aibrix_download, --local-dir, /models/]", read_only=True),
    ):
        assert checks(lint(("d.yaml", pod))) == [("SB103", "fail"), ("SB104", "fail")]


# --- eval "exec vllm serve ..." (SB117 and every engine rule) -------------------------------


EVAL_SCRIPT = (
    'KV_ARGS=""\nif [ "$V" = new ]; then KV_ARGS="--kv-transfer-config {}"; fi\n'
    'eval "exec vllm serve \\\n  /mnt/models \\\n  --served-model-name "Qwen/Qwen3-8B" \\\n'
    '  --port 8000 \\\n  ${KV_ARGS} \\\n  $@"'
)


def test_an_engine_started_through_eval_is_read() -> None:
    """KServe's rendered LLMInferenceService Pods start vLLM as `eval "exec vllm serve ...
    ${KV_TRANSFER_ARGS} $@"`; before, lint saw no engine there at all."""
    from servebook.engines.cmdline import parse_container

    cmd = parse_container({"command": ["/bin/bash", "-c", EVAL_SCRIPT, "--"]})
    assert cmd is not None and cmd.entrypoint == "vllm serve"
    assert cmd.positional_model == "/mnt/models" and cmd.value("--port") == "8000"
    pod = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n"
        "    - name: main\n      image: ghcr.io/llm-d/llm-d-cuda:v0.6.0\n"
        "      command:\n        - /bin/bash\n        - -c\n        - |-\n"
        + "".join(f"          {line}\n" for line in EVAL_SCRIPT.splitlines())
        + "        - --\n"
    )
    found = lint(("p.yaml", pod))
    assert checks(found) == [("SB117", "warn")]
    assert "${KV_ARGS}" in found[0].message


def test_eval_of_something_else_is_no_engine() -> None:
    from servebook.engines.cmdline import parse_container

    script = 'eval "$(ssh-agent -s)"\nexec python -m http.server'
    assert parse_container({"command": ["sh", "-c", script]}) is None


# --- second batch: SB102, SB104 for a download Pod, SB110 for a doc that names its manifest --


WARMUP = """apiVersion: model.aibrix.ai/v1alpha1
kind: ModelWarmup
metadata: {name: warm}
spec:
  targets:
  - nodeSelector:
      matchLabels:
        resource-pool.aibrix.ai/name: POOL
  custom:
    volumes:
    - name: model-cache
      hostPath: {path: /var/lib/aibrix/models, type: DirectoryOrCreate}
    containers:
    - name: download
      image: aibrix/runtime:v0.8.0
      command: [CMD]
      args: [--model-uri, sshleifer/tiny-gpt2, --local-dir, /models/tiny-gpt2]
      volumeMounts:
      - {name: model-cache, mountPath: /models}
"""


def test_a_label_selector_under_node_selector_is_checked_as_one() -> None:
    """vllm-project/aibrix samples/modelwarmup/model-download.yaml: `nodeSelector:
    {matchLabels: {...}}` is a LabelSelector; its values are label values, the map is not."""
    ok = WARMUP.replace("POOL", "latency-pool").replace("CMD", "aibrix_download")
    assert lint(("w.yaml", ok)) == []
    bad = WARMUP.replace("POOL", "latency pool!").replace("CMD", "aibrix_download")
    found = lint(("w.yaml", bad))
    assert checks(found) == [("SB102", "fail")]
    assert "matchLabels.resource-pool.aibrix.ai/name" in found[0].message


def test_a_pod_whose_job_is_the_download_fills_its_hostpath() -> None:
    warm = WARMUP.replace("POOL", "latency-pool")
    assert lint(("w.yaml", warm.replace("CMD", "aibrix_download"))) == []
    # The same volume written by something that downloads nothing: weights created empty.
    assert checks(lint(("w.yaml", warm.replace("CMD", "touch")))) == [("SB104", "fail")]


def test_a_doc_naming_its_manifest_is_compared_with_that_manifest_only() -> None:
    doc = (
        "Edit `disagg.yaml`: replace `nvcr.io/nvidia/ai-dynamo/vllm-runtime:my-tag` with "
        "your image.\n\nValidated against `nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.2.0`.\n"
    )
    runtime = "nvcr.io/nvidia/ai-dynamo/vllm-runtime"
    beside = ("d/agg.yaml", pod_with_image(f"{runtime}:1.3.1"))
    found = lint(
        ("d/disagg.yaml", pod_with_image(f"{runtime}:my-tag")), beside, md=("d/README.md", doc)
    )
    assert checks(found) == [("SB101", "fail")]
    # Naming the manifest it describes, a stale tag for that manifest is still reported.
    found = lint(
        ("d/disagg.yaml", pod_with_image(f"{runtime}:1.1.0")), beside, md=("d/README.md", doc)
    )
    assert [f.evidence["line"] for f in found if f.check == "SB110"] == [3]
    assert "disagg.yaml" in next(f.message for f in found if f.check == "SB110")
