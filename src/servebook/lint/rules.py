"""Lint rules over manifests and engine arguments (ids ``SB101``-``SB119``).

Each rule is a registered ``Check`` (id, title, rationale: what breaks in production,
fix) plus a pure function from parsed documents to ``Finding`` s.  ``check(lint_set)`` runs
them all.  The markdown rules live in ``servebook.lint.docs``.

What a rule reads:

* Kubernetes objects (a document with ``apiVersion`` and ``kind``).  Pod specs are found
  wherever they sit: ``spec`` of a Pod, ``spec.template.spec`` of a Deployment,
  StatefulSet, DaemonSet, Job, ReplicaSet; ``spec.jobTemplate...`` of a CronJob; the leader
  and worker templates of a LeaderWorkerSet; ``extraPodSpec`` of an NVIDIA Dynamo graph;
  and any other mapping with a ``containers`` list.
* Other YAML (a servebook recipe, a Helm values file): string values only, for
  placeholders, and ``image`` keys for the image-reference rule.
* Engine command lines, read by ``servebook.engines.cmdline`` from each container.

Decisions worth knowing before changing a rule:

* Placeholders (SB101) must not fire on text that only looks like one: ``${VAR}`` inside a
  shell script (``sh -c``), in YAML that expands variables itself (compose, CI) or in a
  file carried by a ConfigMap; ``{{ }}`` in Jinja chat templates, in kinds that template
  on their own (PrometheusRule, Argo, KServe ServingRuntime) and GitHub's ``${{ }}``;
  ``<tok>`` model special tokens and HTML, and anything in a string with ``</`` or ``<|``;
  shell redirects (``< in > out``: the spaces keep them from matching); Kubernetes
  ``$(VAR)``.  In a recipe, ``${name}`` is fine when ``name`` is a declared parameter.
* Prefill/decode pairs (SB105-SB107) are engines in the same namespace, one prefill and
  one decode, paired by name once role words are removed.  Roles come from names and
  labels first (``llm-d.ai/role: decode``, ``kimi-prefill``), then from ``kv_role``.
* Heterogeneous tensor parallelism: NixlConnector (and its pull/push variants) supports
  a different TP on each side (vLLM's NixlConnector compatibility matrix), so no finding;
  MooncakeConnector gained it in vLLM around March 2026 (#36869) and unknown connectors
  may or may not have it: a warning; ExampleConnector and the P2P NCCL connectors move
  KV per rank: a failure.  Block size may differ only with NixlConnector and only with
  prefill's smaller (a warning: non-hybrid models only).
* The speculative config is compared as JSON and must be identical (field notes), even
  though newer NixlConnector documents tolerating a different ``num_speculative_tokens``.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from servebook import redact
from servebook.engines.cmdline import EngineCommand, parse_argv, parse_container, split_shell
from servebook.engines.cmdline import _shell_script as shell_script
from servebook.engines.cmdline import _word as cmdline_word
from servebook.findings import Check, Finding, Severity, register
from servebook.lint.loader import Document, Key, KeyPath, LintSet

# ---------------------------------------------------------------------------------------
# The checks.  Ids are stable: docs, CI configs and people refer to them.

PLACEHOLDER = register(
    "SB101",
    "Unresolved placeholder in a value",
    "A manifest applies with placeholder text such as `<NODE>`, `<MODEL_DIR>`, `${X}`, "
    "`{{ .Values.x }}`, `REPLACE_...` or `CHANGEME` still in it, and the failure shows up "
    "far from the cause. In a nodeSelector or nodeName the workload is 'created' (apply "
    "exits 0) but no Pod ever appears: the controller's Pod is rejected or stays Pending, "
    "and the only error is in the controller's events. In a hostPath the Pod is created "
    "and scheduled, then fails at volume mount time minutes later, which reads like a "
    "storage problem. In engine arguments vLLM starts with the literal text as a model "
    "name or path and fails after the image pull.",
    "Replace every placeholder with its real value before applying (or render a servebook "
    "recipe with `servebook render ... --set NAME=VALUE`, which refuses to write anything "
    "while a parameter is unresolved).",
)
LABEL_VALUE = register(
    "SB102",
    "Invalid Kubernetes label value where a label is expected",
    "Label values (metadata.labels, selectors, matchLabels, nodeSelector, matchExpressions "
    "values) must be strings of at most 63 characters, alphanumeric at both ends with only "
    "`-`, `_` and `.` inside. An invalid value in a workload's Pod template is accepted with "
    "the workload, and every Pod the controller then creates is rejected, so nothing runs; "
    "an unquoted number or boolean fails the apply with a type error.",
    'Use a valid label value: quote numbers and booleans (`"1"`, `"true"`), shorten '
    "to 63 characters, and remove characters other than letters, digits, `-`, `_`, `.`.",
)
HOSTPATH_UNPINNED = register(
    "SB103",
    "hostPath volume in a Pod that is not pinned to exactly one node",
    "A hostPath is a directory on whichever node the Pod lands on. Without pinning, the "
    "scheduler may place the server and its workers (or a restarted Pod) on different "
    "nodes; on a node where the path exists but is empty or stale, the engine crash-loops "
    "with errors that read like a bad model name. Seen in the field: server and worker "
    "Pods on different nodes, one with an empty weights directory.",
    "Pin every Pod that mounts node-local data to one node: `nodeSelector: "
    "{kubernetes.io/hostname: NODE}`, `nodeName: NODE`, or a required node affinity on "
    "`kubernetes.io/hostname` with exactly one value; Pods of several nodes (replicas, "
    "LeaderWorkerSet workers) may instead be pinned to a list of nodes that all keep the "
    "data, with a required pod anti-affinity on `kubernetes.io/hostname` against their own "
    "labels (one Pod per listed node). DaemonSets and system paths (/dev, /sys, /proc, "
    "/run, /etc, ...) are exempt.",
)
HOSTPATH_CREATES_WEIGHTS = register(
    "SB104",
    "hostPath that should hold model weights may be created empty",
    "With `type: DirectoryOrCreate` or `FileOrCreate` (and, in practice, with no `type`, "
    "because container runtimes create a missing bind-mount source), a typo in the path "
    "or a node without the weights gets a fresh empty directory instead of a mount error. "
    "The fast, obvious failure becomes a slow crash loop minutes later (vLLM: 'not a local "
    "path and HF resolution failed'), and a check that mounted it has mutated what it "
    "checked.",
    "Use `type: Directory` (or `File`) for weights, so a missing path fails at mount time "
    "with the path in the event. Keep `DirectoryOrCreate` for caches that are meant to be "
    "filled at startup.",
)
PD_SPECULATIVE = register(
    "SB105",
    "Prefill and decode roles disagree on --speculative-config",
    "With prefill/decode disaggregation the two engines must run the same speculative "
    "config. Speculation on the decode role only (the 'obvious' setup) makes decode "
    "register draft layers the prefill side never computed (`KeyError: "
    "'model.layers.N.self_attn'`, logged on decode, blaming the wrong host); once patched, "
    "the sides count KV blocks differently ('P num blocks less than D'). Both failures hang: "
    "Pods Ready, health green, no inference. servebook compares the JSON semantically (key "
    "order and formatting do not matter) and requires it identical: recent vLLM documents "
    "that NixlConnector tolerates a different num_speculative_tokens, but an unsupported "
    "difference hangs instead of failing, so lint keeps the strict rule. Draft model paths "
    "may differ between nodes; differently named draft directories are a warning.",
    "Give both roles the identical `--speculative-config` JSON (or neither).",
)
PD_CONNECTOR = register(
    "SB106",
    "Prefill and decode roles disagree on the KV connector",
    "The KV cache moves from prefill to decode only when both engines load the same "
    "`kv_connector` and the prefill side produces while the decode side consumes. A "
    "missing or different connector does not fail loudly: the decode side recomputes the "
    "prompt ('fails open'), throughput even looks better, and the disaggregation silently "
    "does nothing; a role named prefill configured as `kv_consumer` (or decode as "
    "`kv_producer`) never hands anything over.",
    "Give both roles `--kv-transfer-config` with the same `kv_connector`; use `kv_producer` "
    "(or `kv_both`) on prefill and `kv_consumer` (or `kv_both`) on decode.",
)
PD_SETTINGS = register(
    "SB107",
    "Prefill and decode roles disagree on settings both sides must share",
    "The KV blocks written by prefill are read by decode as raw memory: `--dtype` and "
    "`--kv-cache-dtype` must match (NixlConnector's handshake compares them and refuses; "
    "other connectors may read garbage). `--block-size` must match, except that "
    "NixlConnector supports a prefill block size smaller than decode's for non-hybrid "
    "models (a warning). `--tensor-parallel-size` may differ with NixlConnector "
    "(heterogeneous TP; hybrid/Mamba models still need equal TP, which lint cannot see), "
    "and with MooncakeConnector only in vLLM from about March 2026 (a warning); other "
    "connectors need equal TP. Both sides must serve the same model name, because the "
    "router sends one request body to both, and run the same vLLM image, because the NIXL "
    "handshake compares versions.",
    "Make these flags identical on both roles, or use a connector that supports the "
    "difference; set `--served-model-name` to the same name on both when the model "
    "directories differ between nodes.",
)
DUPLICATE_FLAG = register(
    "SB108",
    "Engine flag given more than once",
    "vLLM's argument parser keeps the last occurrence of a repeated flag without a word, "
    "so an edit that appends a flag instead of changing it takes effect or not depending "
    "on its position, and a reader of the manifest sees two contradicting values. "
    "`--x` and `--no-x`, `-tp` and `--tensor-parallel-size`, dashes and underscores count "
    "as the same flag.",
    "Give each engine flag once; delete the stale occurrence.",
)
NAMESPACE_NOT_CREATED = register(
    "SB109",
    "Objects in a namespace that nothing in the set creates",
    'Applying objects into a namespace that does not exist fails (`namespaces "x" not '
    "found`), part-way through a multi-object apply. This is a warning, not a failure: the "
    "namespace may already exist on the cluster.",
    "Add a `kind: Namespace` object to the set (servebook render emits one), or make sure "
    "the namespace exists (servebook preflight checks it).",
)
IMAGE_MISMATCH = register(
    "SB110",
    "Image reference in a comment or doc disagrees with the image field",
    "When the image field is bumped and a header comment, a recipe description or the "
    "README beside the manifest still names the old tag, a reader cannot tell which "
    "image is authoritative; benchmark numbers get attributed to the wrong engine "
    "version, and ratios across images are invalid even when both numbers are true.",
    "Update (or delete) the stale reference so every mention of the image repository names "
    "the tag the manifest actually runs.",
)
ENGINE_JSON = register(
    "SB111",
    "Engine flag that takes JSON is not valid JSON",
    "`--speculative-config`, `--kv-transfer-config` and the other JSON flags are parsed at "
    "engine start: a quoting slip (YAML quotes eaten, a trailing comma) makes the engine "
    "exit after the image pull and weight load, or, where the flag is optional, the "
    "intended feature is simply absent. Lint cannot compare a config it cannot read, so "
    "this is also what keeps the prefill/decode rules from passing silently.",
    "Write the value as one JSON object; in YAML, wrap it in single quotes: "
    '`- \'{"kv_connector":"NixlConnector","kv_role":"kv_producer"}\'`.',
)
GROUP_MEMBERS_DISAGREE = register(
    "SB113",
    "LeaderWorkerSet leader and workers run different engine settings",
    "A group that spans nodes is one vLLM engine: every member must load the same model with "
    "the same parallel sizes, KV connector and engine flags, and only the members' own "
    "data-parallel flags may differ (workers --headless, each starting at its own rank). A "
    "leader and worker that disagree fail the data-parallel handshake, hang in the first "
    "collective, or a worker without --headless starts a second API server on a rank the "
    "leader already counts.",
    "Render the leader and worker from one argument list (servebook does), adding only "
    "--headless and --data-parallel-start-rank (leader 0, worker k: k x "
    "--data-parallel-size-local) to the workers.",
)
KV_OVER_TCP = register(
    "SB112",
    "Prefill/decode KV cache handed over by TCP",
    "A PD pair whose KV connector is told to use TCP (UCX_TLS without an RDMA transport, "
    "libfabric's tcp or sockets provider, Mooncake's tcp protocol) moves every prompt's KV "
    "cache through host memory and sockets: the deployment works, and its time to first "
    "token is up to hundreds of times worse than over RDMA (NVIDIA Dynamo's guide measured "
    "~98 s against a few hundred ms). Fine on purpose (a test cluster); a warning so that "
    "it never happens by accident.",
    "Give the engines the cluster's RDMA fabric (servebook: the fabric parameter; by hand: "
    "the RDMA device resource, IPC_LOCK and UCX_TLS with rc/dc transports), or keep TCP "
    "knowingly.",
)

SECRET_IN_CLEAR = register(
    "SB114",
    "Secret written in clear in a manifest",
    "A container flag whose name says it is secret (`--api-key`, `--hf-token`, anything "
    "ending in token, key, secret or password) given a literal value, or an environment "
    "variable of such a name with a literal `value:`, puts the secret in the manifest: in "
    "git, in every render and review, in `kubectl get -o yaml` for anyone who may read the "
    "object, and on the engine's command line, where `ps` on the node shows it. A reference "
    "(`$(VAR)`, `${VAR}`, `$VAR`, a `<placeholder>`) is not a secret and is not flagged.",
    "Keep the value in a Secret and reference it: `env: [{name: VLLM_API_KEY, valueFrom: "
    "{secretKeyRef: {name: NAME, key: api-key}}}]` (vLLM reads VLLM_API_KEY itself, so "
    "drop `--api-key`; servebook render: the api_key_secret parameter), or for another "
    "flag pass `$(VAR)` with VAR from a secretKeyRef.",
)

# ---------------------------------------------------------------------------------------
# Small helpers


def keypath_str(keypath: Sequence[Key]) -> str:
    out = ""
    for k in keypath:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def _subject(doc: Document, keypath: Sequence[Key] = (), extra: str = "") -> str:
    s = f"{doc.where(keypath)} {doc.label}"
    if extra:
        s += f" {extra}"
    if doc.helm_source:
        s += f" (Source: {doc.helm_source})"
    return s


def _finding(
    check: Check,
    severity: Severity,
    doc: Document,
    keypath: Sequence[Key],
    message: str,
    *,
    extra: str = "",
    evidence: dict[str, Any] | None = None,
) -> Finding:
    ev: dict[str, Any] = {
        "file": doc.path,
        "line": doc.line_at(keypath),
        "object": doc.label,
    }
    if keypath:
        ev["key"] = keypath_str(keypath)
    if doc.helm_source:
        ev["helm_source"] = doc.helm_source
    ev.update(evidence or {})
    return check.finding(severity, _subject(doc, keypath, extra), message, evidence=ev)


def _get(data: Any, *keys: Key) -> Any:
    for k in keys:
        if isinstance(k, int):
            if not isinstance(data, list) or k >= len(data):
                return None
        elif not isinstance(data, dict):
            return None
        data = data[k] if isinstance(k, int) else data.get(k)
    return data


def walk(data: Any, prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    """Every node with its key path, parents before children."""
    yield prefix, data
    if isinstance(data, dict):
        for k, v in data.items():
            yield from walk(v, (*prefix, str(k)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from walk(v, (*prefix, i))


# ---------------------------------------------------------------------------------------
# Pod specs and engines


@dataclass(frozen=True)
class PodSpec:
    doc: Document
    path: KeyPath
    spec: dict[str, Any]
    labels: dict[str, Any]
    # What inside the object this pod spec is (``leaderTemplate``, a Dynamo service name).
    part: str

    @property
    def owner(self) -> str:
        return f"{self.doc.label}{'/' + self.part if self.part else ''}"

    def containers(self) -> Iterator[tuple[KeyPath, dict[str, Any]]]:
        for key in ("initContainers", "containers"):
            items = self.spec.get(key)
            if isinstance(items, list):
                for i, c in enumerate(items):
                    if isinstance(c, dict):
                        yield (*self.path, key, i), c
        main = self.spec.get("mainContainer")
        if isinstance(main, dict):
            yield (*self.path, "mainContainer"), main

    def volumes(self) -> Iterator[tuple[KeyPath, dict[str, Any]]]:
        items = self.spec.get("volumes")
        if isinstance(items, list):
            for i, v in enumerate(items):
                if isinstance(v, dict):
                    yield (*self.path, "volumes", i), v


_STRUCTURAL = {
    "spec",
    "template",
    "jobTemplate",
    "leaderWorkerTemplate",
    "extraPodSpec",
    "services",
    "podSpec",
    "podTemplate",
}


def pod_specs(doc: Document) -> list[PodSpec]:
    """Every pod spec in a Kubernetes object (see the module docstring for the shapes)."""
    if not doc.is_kubernetes:
        return []
    found: list[PodSpec] = []

    def visit(node: Any, path: KeyPath) -> None:
        if isinstance(node, dict):
            containers = node.get("containers")
            is_spec = (
                isinstance(containers, list) and any(isinstance(c, dict) for c in containers)
            ) or isinstance(node.get("mainContainer"), dict)
            if is_spec and path and path[0] != "status":
                parent = _get(doc.data, *path[:-1]) if path else None
                labels: Any = None
                if isinstance(parent, dict) and path[-1] == "spec":
                    labels = _get(parent, "metadata", "labels")
                if labels is None and path == ("spec",):
                    labels = doc.metadata.get("labels")
                part = "/".join(str(k) for k in path if isinstance(k, str) and k not in _STRUCTURAL)
                found.append(
                    PodSpec(doc, path, node, labels if isinstance(labels, dict) else {}, part)
                )
                return
            for k, v in node.items():
                visit(v, (*path, str(k)))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                visit(v, (*path, i))

    visit(doc.data, ())
    return found


_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_ROLE_WORD = re.compile(r"(?<![a-z])(prefill|decode)(?:r|rs|s)?(?![a-z])")
KV_PRODUCER_ROLES = {"kv_producer": "prefill", "kv_consumer": "decode"}


def _role_words(*texts: str) -> set[str]:
    roles: set[str] = set()
    for t in texts:
        for m in _ROLE_WORD.finditer(_CAMEL.sub(r"\1-\2", t).lower()):
            roles.add(m.group(1))
    return roles


@dataclass
class Engine:
    """One container that runs the vLLM engine."""

    pod: PodSpec
    path: KeyPath
    container: dict[str, Any]
    cmd: EngineCommand
    name_role: str | None
    kv_role: str | None
    kv_config: dict[str, Any] | None
    kv_error: str | None

    @property
    def doc(self) -> Document:
        return self.pod.doc

    @property
    def cname(self) -> str:
        return str(self.container.get("name") or self.path[-1])

    @property
    def role(self) -> str | None:
        if self.name_role:
            return self.name_role
        if self.kv_role in KV_PRODUCER_ROLES:
            return KV_PRODUCER_ROLES[self.kv_role]
        if self.cmd.has("--is-prefill-worker"):
            return "prefill"
        return None

    @property
    def image(self) -> str | None:
        img = self.container.get("image")
        return img if isinstance(img, str) and img else None

    @property
    def where(self) -> str:
        return f"{self.doc.where(self.path)} {self.pod.owner} container {self.cname}"

    @property
    def stem(self) -> str:
        """The name with its role words removed: what pairs `llama-prefill` with
        `llama-decode`."""
        text = _CAMEL.sub(r"\1-\2", f"{self.doc.name}/{self.pod.part}").lower()
        return re.sub(r"[-_/.]+", "-", _ROLE_WORD.sub("", text)).strip("-")


def engine_command(container: Mapping[str, Any]) -> EngineCommand | None:
    """The container's engine command; for `sh -c 'exec ENGINE "$@" MORE' NAME ARGS...` the
    container's args are the script's "$@" (how a LeaderWorkerSet worker computes its
    data-parallel start rank in a shell), so they are read as the engine's."""
    cmd = parse_container(container)
    args = container.get("args")
    if cmd is not None and cmd.via_shell and "$@" in cmd.args and isinstance(args, list):
        at = cmd.args.index("$@")
        words = [*cmd.entrypoint.split(), *cmd.args[:at], *map(str, args), *cmd.args[at + 1 :]]
        full = parse_argv(words)
        if full is not None:
            full.via_shell = True
            return full
    return cmd


def engines(lint_set: LintSet) -> list[Engine]:
    found: list[Engine] = []
    for doc in lint_set.documents:
        for pod in pod_specs(doc):
            for cpath, container in pod.containers():
                cmd = engine_command(container)
                if cmd is None:
                    continue
                kv, err = cmd.json_value("--kv-transfer-config")
                kv_role = kv.get("kv_role") if kv else None
                label_texts = [f"{k}={v}" for k, v in pod.labels.items()]
                roles = _role_words(doc.name, pod.part, str(container.get("name", "")))
                if not roles:
                    roles = _role_words(*label_texts)
                found.append(
                    Engine(
                        pod=pod,
                        path=cpath,
                        container=container,
                        cmd=cmd,
                        name_role=roles.pop() if len(roles) == 1 else None,
                        kv_role=str(kv_role) if kv_role else None,
                        kv_config=kv,
                        kv_error=err,
                    )
                )
    return found


# ---------------------------------------------------------------------------------------
# SB101 placeholders

_ANGLE = re.compile(r"<([A-Za-z][A-Za-z0-9_.-]*)>")
_DOLLAR = re.compile(r"\$\{([^{}]*)\}")
_MUSTACHE = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.S)
_REPLACE = re.compile(r"\bREPLACE(?:_[A-Z0-9_]+|[-_]?ME)\b")
_CHANGEME = re.compile(r"\bchange[-_]?me\b", re.I)
# Angle-bracket words that are tokens or markup, not placeholders: model special tokens
# (`<s>`, `<think>`, `<image>`) and HTML.  Chat templates also use `<|...|>` (not matched).
_TOKENS_AND_TAGS = frozenset(
    {
        *("s", "pad", "unk", "eos", "bos", "mask", "sep", "cls", "think"),
        *("tool_call", "tool_response", "image", "video", "audio"),
        *("start_of_turn", "end_of_turn", "start_of_image", "end_of_image"),
        *("br", "hr", "p", "b", "i", "u", "a", "em", "strong", "code", "pre", "div", "span"),
        *("img", "ul", "ol", "li", "table", "tr", "td", "th", "tbody", "thead", "html"),
        *("h1", "h2", "h3", "h4", "h5", "h6", "head", "body", "title", "script", "style"),
        *("meta", "link", "small", "sub", "sup"),
    }
)
# Kinds whose fields legitimately carry `{{ }}` templates of their own tool.
_TEMPLATING_KINDS = frozenset(
    {
        "PrometheusRule",
        "AlertmanagerConfig",
        "Workflow",
        "WorkflowTemplate",
        "ClusterWorkflowTemplate",
        "CronWorkflow",
        "ServingRuntime",  # KServe fills {{.Name}} / {{.StorageUri}}
        "ClusterServingRuntime",
        "ApplicationSet",
    }
)
# Top-level keys of YAML that expands ${VAR} itself at run time (docker compose, CI
# pipelines): there `${VAR}` is configuration, not a leftover.
_EXPANDING_FILE_KEYS = frozenset({"services", "stages", "jobs", "steps", "variables"})
# Parameter references a servebook recipe may use without declaring them (the recipe
# resolver supplies them).  Kept here, not imported: lint must not depend on the schema.
RECIPE_BUILTINS = frozenset({"cache_dir", "state_dir"})
_SKIP_ANNOTATIONS = {"kubectl.kubernetes.io/last-applied-configuration"}
_DATA_KEYS = (("data",), ("stringData",))


def find_placeholders(
    text: str, *, shell: bool = False, embedded_file: bool = False, templating: bool = False
) -> list[str]:
    """Placeholder-looking substrings of one value.

    ``shell``: the value is a shell script, where ``${VAR}`` is an expansion.
    ``embedded_file``: a file carried in a ConfigMap/Secret, where ``${}`` and ``{{ }}``
    belong to whatever reads it.  ``templating``: an object of a kind that uses ``{{ }}``.
    """
    hits: list[str] = []
    jinja = "{%" in text or "{#" in text
    markup = "</" in text or "<|" in text
    if not markup and not jinja:
        for m in _ANGLE.finditer(text):
            if m.group(1).lower() not in _TOKENS_AND_TAGS:
                hits.append(m.group(0))
    if not shell and not embedded_file:
        hits.extend(m.group(0) for m in _DOLLAR.finditer(text))
    if not jinja and not embedded_file and not templating:
        hits.extend(
            m.group(0)
            for m in _MUSTACHE.finditer(text)
            if not text[: m.start()].endswith("$")  # GitHub Actions `${{ expr }}`
        )
    hits.extend(m.group(0) for m in _REPLACE.finditer(text))
    hits.extend(m.group(0) for m in _CHANGEME.finditer(text))
    return list(dict.fromkeys(hits))


def is_label_value(value: str) -> bool:
    return len(value) <= 63 and _LABEL_RE.match(value) is not None


_LABEL_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _placeholder_effect(doc: Document, keypath: KeyPath, hits: list[str], value: str) -> str:
    """What happens in production when this placeholder is applied: the two field-notes
    failure modes (no Pod ever appears / mount fails minutes later) read differently."""
    keys = [k for k in keypath if isinstance(k, str)]
    workload = doc.kind not in ("Pod", "")
    if not doc.is_kubernetes:
        return (
            "an unresolved value in a recipe or values file; anything rendered from it "
            "carries the placeholder into the cluster"
        )
    if any(k in ("nodeSelector", "nodeName", "affinity") for k in keys):
        if not all(is_label_value(h) for h in hits) or not is_label_value(value):
            if workload:
                return (
                    "scheduling: apply reports the object created, but every Pod the "
                    "controller tries to create is rejected as invalid, so no Pod ever "
                    "appears; the only error is in the controller's events"
                )
            return "scheduling: the API server rejects the Pod as invalid"
        return (
            "scheduling: no node matches, so Pods are created and stay Pending forever "
            "(no error, just no Pod running)"
        )
    if "hostPath" in keys or "local" in keys or any("Path" in k for k in keys[-1:]):
        return (
            "mount: the Pod is created and scheduled, then fails at volume mount time "
            "minutes later (the event reads like a storage problem); with "
            "DirectoryOrCreate the literal directory is created and the engine crash-loops "
            "on an empty model directory instead"
        )
    if keys and keys[-1] == "image":
        return "image: the Pod fails with InvalidImageName / ErrImagePull"
    if any(k in ("labels", "matchLabels", "selector") for k in keys):
        return "label: the object (or every Pod it creates) is rejected as invalid"
    if "env" in keys and hits and all(h.startswith("${") for h in hits):
        return (
            "env: Kubernetes expands $(VAR) in env values, never ${VAR}; the process "
            "receives the literal text"
        )
    if any(k in ("command", "args") for k in keys):
        return (
            "engine arguments: the container starts with the literal text and fails only "
            "after the image pull (as a bad model name, path or flag)"
        )
    return "the literal text reaches the cluster"


def _declared_parameters(doc: Document) -> set[str] | None:
    params = doc.data.get("parameters") if isinstance(doc.data, dict) else None
    if isinstance(params, dict):
        return {str(k) for k in params} | RECIPE_BUILTINS
    return None


def _container_runs_shell(container: Any) -> bool:
    if not isinstance(container, dict):
        return False
    command = container.get("command")
    argv = [str(x) for x in command] if isinstance(command, list) else []
    if not argv:
        args = container.get("args")
        argv = [str(x) for x in args] if isinstance(args, list) else []
    return bool(argv) and posixpath.basename(argv[0]) in {"sh", "bash", "zsh", "dash", "ash"}


def check_placeholders(doc: Document) -> list[Finding]:
    findings: list[Finding] = []
    declared = None if doc.is_kubernetes else _declared_parameters(doc)
    templating = doc.kind in _TEMPLATING_KINDS
    expands_env = (
        not doc.is_kubernetes
        and declared is None
        and isinstance(doc.data, dict)
        and bool(_EXPANDING_FILE_KEYS & set(doc.data))
    )
    data_kind = doc.kind in ("ConfigMap", "Secret")
    for keypath, node in walk(doc.data):
        if keypath[:2] == ("metadata", "managedFields") or (
            keypath[:2] == ("metadata", "annotations")
            and len(keypath) > 2
            and keypath[2] in _SKIP_ANNOTATIONS
        ):
            continue
        texts: list[str] = []
        if isinstance(node, str):
            texts.append(node)
        if isinstance(node, dict):
            # Keys can be placeholders too (a nodeSelector `<LABEL>: x`).
            texts.extend(str(k) for k in node if isinstance(k, str) and ("<" in k or "$" in k))
            if not texts:
                continue
        for text in texts:
            shell = False
            if doc.is_kubernetes and any(k in ("command", "args") for k in keypath):
                idx = max(i for i, k in enumerate(keypath) if k in ("command", "args"))
                shell = _container_runs_shell(_get(doc.data, *keypath[:idx]))
            # A file carried in a ConfigMap/Secret (a script, a chat template).
            embedded = data_kind and "\n" in text.strip() and keypath[:1] in _DATA_KEYS
            hits = find_placeholders(
                text, shell=shell or expands_env, embedded_file=embedded, templating=templating
            )
            if declared is not None:
                hits = [h for h in hits if not (h.startswith("${") and h[2:-1].strip() in declared)]
            if not hits:
                continue
            effect = _placeholder_effect(doc, keypath, hits, text)
            shown = text if len(text) <= 80 else text[:77] + "..."
            undeclared = [h for h in hits if h.startswith("${")] if declared is not None else []
            note = f" ({', '.join(undeclared)} is not a declared parameter)" if undeclared else ""
            findings.append(
                _finding(
                    PLACEHOLDER,
                    Severity.FAIL,
                    doc,
                    keypath,
                    f"{keypath_str(keypath) or 'value'} = {shown!r} contains "
                    f"{', '.join(hits)}{note}. Effect if applied: {effect}.",
                    evidence={"placeholders": hits, "value": text},
                )
            )
    return findings


# ---------------------------------------------------------------------------------------
# SB102 label values


def _label_maps(doc: Document) -> Iterator[tuple[KeyPath, dict[str, Any]]]:
    for keypath, node in walk(doc.data):
        if not isinstance(node, dict) or not keypath:
            continue
        last = keypath[-1]
        if (
            (len(keypath) >= 2 and keypath[-2:] == ("metadata", "labels"))
            or last in ("matchLabels", "nodeSelector")
            or (last == "selector" and doc.kind in ("Service", "ReplicationController"))
        ):
            yield keypath, node


def _label_value_problem(value: Any) -> str | None:
    if isinstance(value, bool | int | float):
        return (
            f"{value!r} is a YAML {type(value).__name__}, not a string; the apply fails "
            "with a type error (quote it)"
        )
    if value is None:
        return None
    if not isinstance(value, str):
        return f"{value!r} is not a string"
    if len(value) > 63:
        return f"{value!r} is {len(value)} characters long; label values allow 63"
    if not _LABEL_RE.match(value):
        return (
            f"{value!r} is not a valid label value (letters, digits, '-', '_', '.'; "
            "alphanumeric at both ends)"
        )
    return None


def check_label_values(doc: Document) -> list[Finding]:
    if not doc.is_kubernetes:
        return []
    findings: list[Finding] = []

    def report(keypath: KeyPath, value: Any) -> None:
        if isinstance(value, str) and find_placeholders(value):
            return  # SB101 reports it, with the effect.
        problem = _label_value_problem(value)
        if problem:
            findings.append(
                _finding(
                    LABEL_VALUE,
                    Severity.FAIL,
                    doc,
                    keypath,
                    f"{keypath_str(keypath)}: {problem}.",
                    evidence={"value": value},
                )
            )

    for keypath, labels in _label_maps(doc):
        for k, v in labels.items():
            report((*keypath, str(k)), v)
    for keypath, node in walk(doc.data):
        if (
            isinstance(node, dict)
            and keypath
            and keypath[-2:-1] == ("matchExpressions",)
            and node.get("operator") in ("In", "NotIn")
            and isinstance(node.get("values"), list)
        ):
            for i, v in enumerate(node["values"]):
                report((*keypath, "values", i), v)
    return findings


# ---------------------------------------------------------------------------------------
# SB103 / SB104 hostPath

HOSTNAME_LABEL = "kubernetes.io/hostname"
# Host paths that exist on every node and are not data: devices, kernel, runtime sockets.
_SYSTEM_PATHS = (
    "/dev",
    "/sys",
    "/proc",
    "/run",
    "/var/run",
    "/var/lib/kubelet",
    "/var/log",
    "/etc",
    "/lib/modules",
    "/usr",
    "/lib",
    "/opt/cni",
    "/var/lib/containerd",
    "/var/lib/docker",
)
_WEIGHTS_WORD = re.compile(
    r"(?i)(?:^|[/_.-])(models?|weights?|checkpoints?|ckpts?|safetensors|huggingface|hf|"
    r"hf[-_]?(?:cache|home|hub)|hub)(?:[/_.-]|$)"
)
_CACHE_WORD = re.compile(r"(?i)(?:cache|huggingface|hf[-_]?home)")


def _is_system_path(path: str) -> bool:
    p = posixpath.normpath(path) if path else path
    return any(p == s or p.startswith(s + "/") for s in _SYSTEM_PATHS)


def _one_per_node(spec: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """A required pod anti-affinity on the hostname against the Pod's own labels: no two
    such Pods share a node."""
    terms = _get(
        spec, "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution"
    )
    for t in terms if isinstance(terms, list) else []:
        match = _get(t, "labelSelector", "matchLabels") if isinstance(t, dict) else None
        if (
            isinstance(t, dict)
            and t.get("topologyKey") == HOSTNAME_LABEL
            and isinstance(match, dict)
            and match
            and all(str(labels.get(k)) == str(v) for k, v in match.items())
        ):
            return True
    return False


def pinned_node(
    spec: Mapping[str, Any], labels: Mapping[str, Any] | None = None
) -> tuple[bool, str]:
    """Whether a pod spec can only run on one node, and how (for messages).  With the
    Pod's ``labels``, a required node affinity to several nodes counts as pinned when a
    required anti-affinity keeps such Pods one per node (each listed node keeps the data)."""
    node_name = spec.get("nodeName")
    if isinstance(node_name, str) and node_name:
        return True, f"nodeName {node_name}"
    selector = spec.get("nodeSelector")
    if isinstance(selector, dict) and selector.get(HOSTNAME_LABEL) not in (None, ""):
        return True, f"nodeSelector {HOSTNAME_LABEL}={selector[HOSTNAME_LABEL]}"
    terms = _get(
        spec,
        "affinity",
        "nodeAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        "nodeSelectorTerms",
    )
    why = "no nodeSelector on kubernetes.io/hostname, no nodeName, no required node affinity"
    if isinstance(terms, list) and terms:
        hosts: set[str] = set()
        for term in terms:  # terms are ORed: every one must pin, to the same node
            term_hosts: set[str] | None = None
            if isinstance(term, dict):
                for key, field_name in (
                    ("matchExpressions", HOSTNAME_LABEL),
                    ("matchFields", "metadata.name"),
                ):
                    for expr in term.get(key) or []:
                        if (
                            isinstance(expr, dict)
                            and expr.get("key") == field_name
                            and expr.get("operator") == "In"
                            and isinstance(expr.get("values"), list)
                        ):
                            vals = {str(v) for v in expr["values"]}
                            term_hosts = vals if term_hosts is None else term_hosts & vals
            if term_hosts is None or (len(term_hosts) != 1 and labels is None):
                shown = ", ".join(sorted(term_hosts)) if term_hosts else "any node"
                return False, f"required node affinity allows {shown}"
            hosts |= term_hosts
        if len(hosts) == 1:
            return True, f"required node affinity on {hosts.pop()}"
        if labels is not None and _one_per_node(spec, labels):
            return True, f"one Pod per node of {', '.join(sorted(hosts))}"
        return False, (
            f"required node affinity allows any of {', '.join(sorted(hosts))} and no required "
            "pod anti-affinity on kubernetes.io/hostname keeps its Pods one per node"
        )
    if _get(spec, "affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution"):
        why = "only a preferred (soft) node affinity, which the scheduler may ignore"
    return False, why


def check_hostpath_pinning(doc: Document) -> list[Finding]:
    findings: list[Finding] = []
    if doc.kind == "DaemonSet":
        return findings  # one Pod per node by design: a node-local path is the point
    for pod in pod_specs(doc):
        data_paths: list[str] = []
        first: KeyPath = pod.path
        for vpath, vol in pod.volumes():
            hp = vol.get("hostPath")
            path = hp.get("path") if isinstance(hp, dict) else None
            if isinstance(path, str) and not _is_system_path(path):
                if not data_paths:
                    first = vpath
                data_paths.append(f"{vol.get('name', '?')}={path}")
        if not data_paths:
            continue
        pinned, how = pinned_node(pod.spec, pod.labels)
        if pinned:
            continue
        findings.append(
            _finding(
                HOSTPATH_UNPINNED,
                Severity.FAIL,
                doc,
                first,
                f"{pod.owner} mounts hostPath {', '.join(data_paths)} but is not pinned to "
                f"one node ({how}); its Pods can land on a node where that path is missing, "
                "empty or different.",
                extra=pod.part,
                evidence={"host_paths": data_paths},
            )
        )
    return findings


def _under(path: str, mount: str) -> bool:
    p, m = posixpath.normpath(path), posixpath.normpath(mount)
    return p == m or p.startswith(m.rstrip("/") + "/")


def _local_model_paths(cmd: EngineCommand) -> list[str]:
    paths = [cmd.model, cmd.value("--tokenizer"), cmd.value("--download-dir")]
    spec, _ = cmd.json_value("--speculative-config")
    if spec and isinstance(spec.get("model"), str):
        paths.append(spec["model"])
    paths.append(cmd.value("--speculative-model"))
    return [p for p in paths if isinstance(p, str) and p.startswith("/")]


def check_hostpath_create(doc: Document) -> list[Finding]:
    findings: list[Finding] = []
    for pod in pod_specs(doc):
        mounts: dict[str, list[tuple[str, EngineCommand | None]]] = {}
        for _cpath, c in pod.containers():
            cmd = parse_container(c)
            for m in c.get("volumeMounts") or []:
                if isinstance(m, dict) and isinstance(m.get("mountPath"), str):
                    mounts.setdefault(str(m.get("name")), []).append((m["mountPath"], cmd))
        for vpath, vol in pod.volumes():
            hp = vol.get("hostPath")
            if not isinstance(hp, dict) or not isinstance(hp.get("path"), str):
                continue
            htype = hp.get("type") or ""
            if htype not in ("DirectoryOrCreate", "FileOrCreate", ""):
                continue
            name = str(vol.get("name", ""))
            used = mounts.get(name, [])
            # An engine whose local model/draft path lies under this mount: weights, surely.
            holds = [
                p
                for mount, cmd in used
                if cmd is not None
                for p in _local_model_paths(cmd)
                if _under(p, mount)
            ]
            named = [
                s for s in [hp["path"], name, *(m for m, _ in used)] if _WEIGHTS_WORD.search(s)
            ]
            # A cache an engine mounts but does not read its model from is meant to start
            # empty (`hf-cache` beside `vllm serve Qwen/Qwen3-8B`, a compile cache).
            cache = any(cmd is not None for _m, cmd in used) and any(
                _CACHE_WORD.search(s) for s in named
            )
            if not holds and (not named or cache):
                continue
            if not htype:
                severity = Severity.WARN
                what = (
                    "has no `type`: kubelet checks nothing and the container runtime "
                    "creates a missing directory"
                )
            else:
                severity = Severity.FAIL
                what = f"has type {htype}"
            reason = f"the engine reads {holds[0]} from it" if holds else "its name says weights"
            findings.append(
                _finding(
                    HOSTPATH_CREATES_WEIGHTS,
                    severity,
                    doc,
                    (*vpath, "hostPath"),
                    f"hostPath volume {name} ({hp['path']}) holds model weights ({reason}) "
                    f"but {what}: a wrong path or a node without the weights gets an empty "
                    "directory, and the engine fails minutes later instead of the mount "
                    "failing at once.",
                    extra=pod.part,
                    evidence={"host_path": hp["path"], "type": htype or None},
                )
            )
    return findings


# ---------------------------------------------------------------------------------------
# SB108 duplicate flags, SB111 JSON flags

JSON_FLAGS = (
    "--speculative-config",
    "--kv-transfer-config",
    "--compilation-config",
    "--hf-overrides",
    "--override-generation-config",
    "--limit-mm-per-prompt",
    "--kv-events-config",
    "--additional-config",
    "--model-loader-extra-config",
    "--mm-processor-kwargs",
    "--rope-scaling",
)
# Flags whose value must be JSON whatever it looks like.
_ALWAYS_JSON = ("--speculative-config", "--kv-transfer-config")


def check_duplicate_flags(engine: Engine) -> list[Finding]:
    findings = []
    for setting, flags in engine.cmd.duplicates().items():
        shown = [
            f"{f.written} {f.value}" if f.value is not None and "=" not in f.written else f.written
            for f in flags
        ]
        last = shown[-1]
        findings.append(
            _finding(
                DUPLICATE_FLAG,
                Severity.FAIL,
                engine.doc,
                engine.path,
                f"{setting} is given {len(flags)} times ({'; then '.join(shown)}); vLLM "
                f"silently keeps the last one ({last}).",
                extra=f"container {engine.cname}",
                evidence={"flag": setting, "occurrences": shown},
            )
        )
    return findings


def check_engine_json(engine: Engine) -> list[Finding]:
    findings = []
    for key in ("command", "args"):
        items = engine.container.get(key)
        for i, item in enumerate(items if isinstance(items, list) else []):
            if isinstance(item, dict | list):
                findings.append(
                    _finding(
                        ENGINE_JSON,
                        Severity.FAIL,
                        engine.doc,
                        (*engine.path, key, i),
                        f"{key}[{i}] is a YAML {'mapping' if isinstance(item, dict) else 'list'}"
                        f", not a string: unquoted JSON in YAML is parsed as YAML, and the API "
                        f"server rejects the container; quote it: '{json.dumps(item)}'.",
                        extra=f"container {engine.cname}",
                        evidence={"item": item},
                    )
                )
    for name in JSON_FLAGS:
        flag = engine.cmd.last(name)
        if flag is None or flag.value is None:
            continue
        text = flag.value.strip()
        if "$" in text:
            continue  # shell or Kubernetes expansion: the value is only known at run time
        if name not in _ALWAYS_JSON and not text.startswith(("{", "[")):
            continue  # e.g. `-O3`, `--compilation-config 3`
        _, err = engine.cmd.json_value(name)
        if err:
            findings.append(
                _finding(
                    ENGINE_JSON,
                    Severity.FAIL,
                    engine.doc,
                    engine.path,
                    f"{err}: {text[:120]!r}.",
                    extra=f"container {engine.cname}",
                    evidence={"flag": name, "value": text},
                )
            )
    return findings


# ---------------------------------------------------------------------------------------
# SB105 / SB106 / SB107 prefill/decode pairs

NIXL_CONNECTORS = frozenset({"NixlConnector", "NixlPullConnector", "NixlPushConnector"})
# Connectors that move KV per rank and block and have no heterogeneous-TP path.
HOMOGENEOUS_CONNECTORS = frozenset(
    {"ExampleConnector", "SharedStorageConnector", "P2pNcclConnector", "PyNcclConnector"}
)
_LEGACY_SPEC_FLAGS = {
    "--speculative-model": "model",
    "--num-speculative-tokens": "num_speculative_tokens",
    "--speculative-draft-tensor-parallel-size": "draft_tensor_parallel_size",
    "--ngram-prompt-lookup-max": "prompt_lookup_max",
    "--ngram-prompt-lookup-min": "prompt_lookup_min",
}


def speculative_config(cmd: EngineCommand) -> tuple[dict[str, Any] | None, str | None]:
    """The speculative config as one dict: the JSON flag plus the pre-JSON flags."""
    config, err = cmd.json_value("--speculative-config")
    if err:
        return None, err
    legacy: dict[str, Any] = {}
    for flag, key in _LEGACY_SPEC_FLAGS.items():
        v = cmd.value(flag)
        if v is not None:
            try:
                legacy[key] = json.loads(v)
            except json.JSONDecodeError:
                legacy[key] = v
    if config is None and not legacy:
        return None, None
    merged = dict(config or {})
    merged.update(legacy)
    return merged, None


def _pairs(all_engines: Sequence[Engine]) -> list[tuple[Engine, Engine]]:
    """Prefill/decode pairs: same namespace, and the same name once role words are removed
    (`llama-prefill` / `llama-decode`); if no names pair up, every prefill with every
    decode of the namespace."""
    by_ns: dict[str | None, list[Engine]] = {}
    for e in all_engines:
        by_ns.setdefault(e.doc.namespace, []).append(e)
    pairs: list[tuple[Engine, Engine]] = []
    for group in by_ns.values():
        prefill = [e for e in group if e.role == "prefill"]
        decode = [e for e in group if e.role == "decode"]
        matched = [(p, d) for p in prefill for d in decode if p.stem == d.stem]
        pairs.extend(matched or [(p, d) for p in prefill for d in decode])
    return pairs


def _pair_subject_finding(
    check: Check, severity: Severity, p: Engine, d: Engine, message: str, **evidence: Any
) -> Finding:
    ev = {"prefill": p.where, "decode": d.where, **evidence}
    return _finding(
        check,
        severity,
        d.doc,
        d.path,
        f"{message} (prefill: {p.where}; decode: {d.where})",
        extra=f"PD pair {p.pod.owner} -> {d.pod.owner}",
        evidence=ev,
    )


def _dict_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    keys = sorted(set(a) | set(b))
    missing = "(absent)"
    return [
        f"{k}: prefill {json.dumps(a.get(k, missing))}, decode {json.dumps(b.get(k, missing))}"
        for k in keys
        if a.get(k, missing) != b.get(k, missing)
    ]


def check_pd_speculative(p: Engine, d: Engine) -> list[Finding]:
    ps, perr = speculative_config(p.cmd)
    ds, derr = speculative_config(d.cmd)
    if perr or derr or (ps is None and ds is None):
        return []  # SB111 reports unreadable JSON
    if ps is None or ds is None:
        only = "decode" if ps is None else "prefill"
        other = "prefill" if only == "decode" else "decode"
        return [
            _pair_subject_finding(
                PD_SPECULATIVE,
                Severity.FAIL,
                p,
                d,
                f"--speculative-config is set on the {only} role only; {other} has none. "
                "Decode then expects draft-layer KV that prefill never produced, and the "
                "pair hangs with Pods Ready",
            )
        ]
    ps, ds = dict(ps), dict(ds)
    findings = []
    pm, dm = ps.get("model"), ds.get("model")
    if isinstance(pm, str) and isinstance(dm, str) and pm.startswith("/") and dm.startswith("/"):
        # Two nodes may keep the same draft weights at different paths.
        ps.pop("model")
        ds.pop("model")
        if posixpath.basename(pm.rstrip("/")) != posixpath.basename(dm.rstrip("/")):
            findings.append(
                _pair_subject_finding(
                    PD_SPECULATIVE,
                    Severity.WARN,
                    p,
                    d,
                    f"draft model directories differ in name ({pm} vs {dm}); make sure "
                    "both hold the same draft weights (`servebook probe DIR --draft ...`)",
                )
            )
    diff = _dict_diff(ps, ds)
    if diff:
        findings.append(
            _pair_subject_finding(
                PD_SPECULATIVE,
                Severity.FAIL,
                p,
                d,
                f"--speculative-config differs between prefill and decode: {'; '.join(diff)}",
                differences=diff,
            )
        )
    return findings


def check_pd_connector(p: Engine, d: Engine) -> list[Finding]:
    findings: list[Finding] = []
    for e, role, ok, bad in (
        (p, "prefill", ("kv_producer", "kv_both"), "kv_consumer"),
        (d, "decode", ("kv_consumer", "kv_both"), "kv_producer"),
    ):
        if e.name_role == role and e.kv_role == bad:
            findings.append(
                _finding(
                    PD_CONNECTOR,
                    Severity.FAIL,
                    e.doc,
                    e.path,
                    f"{e.pod.owner} is named as the {role} role but its kv_role is {bad}; "
                    f"the {role} side must use {' or '.join(ok)}.",
                    extra=f"container {e.cname}",
                )
            )
    if p.kv_error or d.kv_error:
        return findings
    if (p.kv_config is None) != (d.kv_config is None):
        missing = "prefill" if p.kv_config is None else "decode"
        findings.append(
            _pair_subject_finding(
                PD_CONNECTOR,
                Severity.FAIL,
                p,
                d,
                f"--kv-transfer-config is missing on the {missing} role: no KV is handed "
                "over and decode silently recomputes every prompt",
            )
        )
        return findings
    if p.kv_config is None or d.kv_config is None:
        return findings
    pc, dc = p.kv_config.get("kv_connector"), d.kv_config.get("kv_connector")
    if pc != dc:
        findings.append(
            _pair_subject_finding(
                PD_CONNECTOR,
                Severity.FAIL,
                p,
                d,
                f"kv_connector differs: prefill {pc!r}, decode {dc!r}",
            )
        )
    return findings


def _flag_or(cmd: EngineCommand, name: str, default: str) -> str:
    v = cmd.value(name)
    return default if v is None else v


def _repo_tag(image: str) -> tuple[str, str]:
    ref = normalize_image(image)
    return ref if ref else (image, "")


def check_pd_settings(p: Engine, d: Engine) -> list[Finding]:
    findings: list[Finding] = []
    connector = str((p.kv_config or {}).get("kv_connector") or "")

    def add(severity: Severity, msg: str) -> None:
        findings.append(_pair_subject_finding(PD_SETTINGS, severity, p, d, msg))

    pn, dn = set(p.cmd.served_model_names), set(d.cmd.served_model_names)
    if pn and dn and not (pn & dn):
        add(
            Severity.FAIL,
            f"served model names differ (prefill {sorted(pn)}, decode {sorted(dn)}): the "
            "router sends one request body to both, so one side answers 404",
        )
    for flag in ("--dtype", "--kv-cache-dtype"):
        pv, dv = _flag_or(p.cmd, flag, "auto"), _flag_or(d.cmd, flag, "auto")
        if pv == dv:
            continue
        quantized = [v for v in (pv, dv) if flag == "--kv-cache-dtype" and v.startswith("fp8")]
        if "auto" in (pv, dv) and not quantized:
            add(
                Severity.WARN,
                f"{flag} is {pv} on prefill and {dv} on decode; 'auto' follows the model "
                "config, so set it explicitly and identically on both",
            )
        else:
            add(
                Severity.FAIL,
                f"{flag} differs (prefill {pv}, decode {dv}): the KV bytes prefill writes "
                "are not what decode reads",
            )
    pb, db = p.cmd.value("--block-size"), d.cmd.value("--block-size")
    if pb != db:
        if pb is None or db is None:
            add(
                Severity.WARN,
                f"--block-size is set on one role only (prefill {pb or 'default'}, decode "
                f"{db or 'default'}); the default depends on platform and model",
            )
        elif connector in NIXL_CONNECTORS and pb.isdigit() and db.isdigit():
            if int(pb) < int(db):
                add(
                    Severity.WARN,
                    f"--block-size differs (prefill {pb} < decode {db}): {connector} "
                    "remaps blocks only for non-hybrid models",
                )
            else:
                add(
                    Severity.FAIL,
                    f"--block-size differs (prefill {pb} > decode {db}): {connector} "
                    "supports only a prefill block size smaller than decode's",
                )
        else:
            add(
                Severity.FAIL,
                f"--block-size differs (prefill {pb}, decode {db}) with "
                f"{connector or 'this connector'}, which transfers whole blocks",
            )
    pt = _flag_or(p.cmd, "--tensor-parallel-size", "1")
    dt = _flag_or(d.cmd, "--tensor-parallel-size", "1")
    if pt != dt and connector not in NIXL_CONNECTORS:
        if connector in HOMOGENEOUS_CONNECTORS:
            add(
                Severity.FAIL,
                f"--tensor-parallel-size differs (prefill {pt}, decode {dt}) and "
                f"{connector} has no heterogeneous-TP support",
            )
        else:
            add(
                Severity.WARN,
                f"--tensor-parallel-size differs (prefill {pt}, decode {dt}); "
                f"{connector or 'this connector'} supports that only in recent vLLM, if at "
                "all (MooncakeConnector since about March 2026); NixlConnector supports it",
            )
    pi, di = _repo_tag(p.image or ""), _repo_tag(d.image or "")
    if p.image and d.image and pi != di:
        add(
            Severity.FAIL if pi[0] == di[0] else Severity.WARN,
            f"images differ (prefill {p.image}, decode {d.image}): both sides must run the "
            "same vLLM version (KV layouts and connector protocols change between versions; "
            "the NIXL handshake refuses a mismatch)",
        )
    return findings


def check_pd(all_engines: Sequence[Engine]) -> list[Finding]:
    findings: list[Finding] = []
    seen_role_conflicts: set[tuple[str, str]] = set()
    for p, d in _pairs(all_engines):
        for f in check_pd_connector(p, d):
            key = (f.subject, f.message)
            if key in seen_role_conflicts:
                continue
            seen_role_conflicts.add(key)
            findings.append(f)
        findings.extend(check_pd_speculative(p, d))
        findings.extend(check_pd_settings(p, d))
        findings.extend(check_pd_tcp(p, d))
    return findings


# SB112: UCX transports that move KV by RDMA (UCX_TLS names; "ib" is UCX's alias for all
# of them); everything else (tcp, shared memory, cuda_copy/cuda_ipc) crosses no node by RDMA.
_UCX_RDMA = re.compile(r"^\^?(rc|dc|ud|ib|gga|srd)(_[a-z0-9]+)?$")


def _env_value(e: Engine, name: str) -> str | None:
    for item in e.container.get("env") or []:
        if isinstance(item, Mapping) and item.get("name") == name:
            value = item.get("value")
            return value if isinstance(value, str) else None
    return None


def _tcp_transport(e: Engine) -> str | None:
    """How the engine is told, explicitly, to move KV over TCP (None: it is not)."""
    extra = (e.kv_config or {}).get("kv_connector_extra_config") or {}
    if isinstance(extra, Mapping) and str(extra.get("mooncake_protocol", "")).lower() == "tcp":
        return "kv_connector_extra_config.mooncake_protocol tcp"
    provider = (_env_value(e, "FI_PROVIDER") or "").lower()
    if provider in ("tcp", "sockets"):
        return f"FI_PROVIDER={provider}"
    tls = _env_value(e, "UCX_TLS")
    if tls and not tls.startswith("^"):
        names = [t.strip() for t in tls.split(",") if t.strip()]
        if "tcp" in names and not any(_UCX_RDMA.match(t) for t in names) and "all" not in names:
            return f"UCX_TLS={tls}"
    return None


def check_pd_tcp(p: Engine, d: Engine) -> list[Finding]:
    how = {r: _tcp_transport(e) for r, e in (("prefill", p), ("decode", d))}
    said = {r: h for r, h in how.items() if h}
    if not said:
        return []
    return [
        _pair_subject_finding(
            KV_OVER_TCP,
            Severity.WARN,
            p,
            d,
            "the KV cache crosses from prefill to decode over TCP ("
            + "; ".join(f"{r}: {h}" for r, h in said.items())
            + ")",
            transport=said,
        )
    ]


# ---------------------------------------------------------------------------------------
# SB109 namespaces

CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "Node",
        "PersistentVolume",
        "ClusterRole",
        "ClusterRoleBinding",
        "StorageClass",
        "CustomResourceDefinition",
        "PriorityClass",
        "IngressClass",
        "RuntimeClass",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "APIService",
        "CSIDriver",
        "CSINode",
        "VolumeSnapshotClass",
        "ClusterIssuer",
        "GatewayClass",
    }
)
BUILTIN_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})


def check_namespaces(documents: Sequence[Document]) -> list[Finding]:
    created = {d.name for d in documents if d.is_kubernetes and d.kind == "Namespace"}
    users: dict[str, list[Document]] = {}
    for d in documents:
        if not d.is_kubernetes or d.kind in CLUSTER_SCOPED:
            continue
        ns = d.namespace
        if ns and ns not in created and ns not in BUILTIN_NAMESPACES:
            users.setdefault(ns, []).append(d)
    findings = []
    for ns, docs in sorted(users.items()):
        first = docs[0]
        names = ", ".join(d.label for d in docs[:5]) + (" ..." if len(docs) > 5 else "")
        findings.append(
            _finding(
                NAMESPACE_NOT_CREATED,
                Severity.WARN,
                first,
                ("metadata", "namespace"),
                f"{len(docs)} object(s) go into namespace {ns!r} ({names}), and no object "
                "in the set creates it; the apply fails unless it already exists.",
                evidence={"namespace": ns, "objects": [d.label for d in docs]},
            )
        )
    return findings


# ---------------------------------------------------------------------------------------
# SB110 image references

_IMAGE_TOKEN = re.compile(
    r"(?<![\w./@-])"
    r"((?:[a-z0-9][a-z0-9.-]*(?::[0-9]+)?/)?[a-z0-9][a-z0-9._-]*(?:/[a-z0-9][a-z0-9._-]*)+)"
    r"(?::([A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(sha256:[a-f0-9]{64}))?"
)
_DOCKER_HUB = ("docker.io/", "index.docker.io/", "registry-1.docker.io/")


def normalize_image(ref: str) -> tuple[str, str] | None:
    """``(repository, tag-or-digest)`` with Docker Hub spellings folded together;
    an untagged reference has tag ``latest``.  None if ``ref`` is not an image reference."""
    ref = ref.strip()
    if not ref or any(c.isspace() for c in ref):
        return None
    digest = ""
    if "@" in ref:
        ref, digest = ref.split("@", 1)
    repo, tag = ref, ""
    if ":" in ref.rsplit("/", 1)[-1]:
        repo, tag = ref.rsplit(":", 1)
    repo = repo.lower()
    for prefix in _DOCKER_HUB:
        if repo.startswith(prefix):
            repo = repo[len(prefix) :]
    if repo.startswith("library/"):
        repo = repo[len("library/") :]
    return repo, digest or tag or "latest"


def image_mentions(text: str) -> Iterator[tuple[int, str, str, str]]:
    """Tagged image references in free text: ``(line offset, written, repo, tag)``."""
    for lineno, line in enumerate(text.splitlines()):
        for m in _IMAGE_TOKEN.finditer(line):
            if not (m.group(2) or m.group(3)):
                continue  # prose naming the repository without a tag says nothing
            tag = (m.group(3) or m.group(2)).rstrip(".-")
            norm = normalize_image(m.group(1))
            if norm:
                written = m.group(0).rstrip(".-")
                yield lineno, written, norm[0], tag


def image_fields(doc: Document) -> Iterator[tuple[KeyPath, str]]:
    """``image:`` values; in a recipe also ``image: {default: ...}`` parameters."""
    for keypath, node in walk(doc.data):
        if not keypath or keypath[-1] != "image":
            continue
        if isinstance(node, str) and node:
            yield keypath, node
        elif isinstance(node, dict) and not doc.is_kubernetes:
            for k in ("default", "value"):
                if isinstance(node.get(k), str) and node[k]:
                    yield (*keypath, k), node[k]


def _text_values(doc: Document) -> Iterator[tuple[KeyPath, str]]:
    """Free-text values of a recipe (descriptions) that may name an image."""
    if doc.is_kubernetes:
        return
    for keypath, node in walk(doc.data):
        if isinstance(node, str) and "image" not in keypath:
            yield keypath, node


def check_images(lint_set: LintSet) -> list[Finding]:
    findings: list[Finding] = []
    # repo -> {tag: [(file:line)]} per file, and per directory for the docs beside it.
    by_file: dict[str, dict[str, dict[str, list[str]]]] = {}
    by_dir: dict[PurePath, dict[str, dict[str, list[str]]]] = {}
    for yf in lint_set.yaml_files:
        for doc in yf.documents:
            for keypath, ref in image_fields(doc):
                norm = normalize_image(ref)
                if not norm:
                    continue
                repo, tag = norm
                at = doc.where(keypath)
                by_file.setdefault(yf.path, {}).setdefault(repo, {}).setdefault(tag, []).append(at)
                d = by_dir.setdefault(PurePath(yf.path).parent, {})
                d.setdefault(repo, {}).setdefault(tag, []).append(at)

    def compare(
        fields: Mapping[str, Mapping[str, list[str]]],
        text: str,
        where: str,
        first_line: int,
        kind: str,
    ) -> None:
        for offset, written, repo, tag in image_mentions(text):
            tags = fields.get(repo)
            if not tags or tag in tags:
                continue
            field_refs = "; ".join(f"{repo}:{t} at {', '.join(ats)}" for t, ats in tags.items())
            findings.append(
                IMAGE_MISMATCH.finding(
                    Severity.FAIL,
                    f"{where}:{first_line + offset}",
                    f"{kind} names {written}, but the image field says {field_refs}.",
                    evidence={
                        "file": where,
                        "line": first_line + offset,
                        "mentioned": written,
                        "fields": {t: list(a) for t, a in tags.items()},
                    },
                )
            )

    for yf in lint_set.yaml_files:
        fields = by_file.get(yf.path)
        if not fields:
            continue
        for c in yf.comments:
            compare(fields, c.text, yf.path, c.line, "comment")
        for doc in yf.documents:
            for keypath, text in _text_values(doc):
                compare(fields, text, yf.path, doc.line_at(keypath), f"{keypath_str(keypath)}")
    for md in lint_set.markdown_files:
        fields = by_dir.get(PurePath(md.path).parent)
        if fields:
            compare(fields, md.text, md.path, 1, "doc")
    return findings


# ---------------------------------------------------------------------------------------
# SB113 LeaderWorkerSet members

# Flags that are each member's own in vLLM's multi-node data parallelism.
_MEMBER_FLAGS = frozenset({"--headless", "--data-parallel-start-rank", "-dpr", "--host", "--port"})


def _settings(cmd: EngineCommand) -> dict[str, str | None]:
    return {f.setting: f.value for f in cmd.flags if f.name not in _MEMBER_FLAGS}


def check_group_members(doc: Document) -> list[Finding]:
    """A LeaderWorkerSet's leader and worker engines agree on every flag but their own."""
    if doc.kind != "LeaderWorkerSet":
        return []
    by_member: dict[str, tuple[PodSpec, KeyPath, EngineCommand]] = {}
    for pod in pod_specs(doc):
        member = "leader" if "leaderTemplate" in pod.path else "worker"
        for cpath, container in pod.containers():
            cmd = engine_command(container)
            if cmd is not None:
                by_member.setdefault(member, (pod, cpath, cmd))
    if "worker" not in by_member:
        return []
    wpod, wpath, worker = by_member["worker"]
    findings: list[Finding] = []
    size = _get(doc.data, "spec", "leaderWorkerTemplate", "size")
    spans = isinstance(size, int) and size > 1
    if "leader" in by_member:
        _, _, leader = by_member["leader"]
        a, b = _settings(leader), _settings(worker)
        diff = sorted(
            f"{k}: leader {a.get(k)!r}, worker {b.get(k)!r}"
            for k in set(a) | set(b)
            if a.get(k) != b.get(k)
        )
        if diff:
            findings.append(
                _finding(
                    GROUP_MEMBERS_DISAGREE,
                    Severity.FAIL,
                    doc,
                    wpath,
                    f"{doc.label}'s leader and workers run different engine settings: "
                    + "; ".join(diff),
                    extra=wpod.part,
                    evidence={"differences": diff},
                )
            )
        local = leader.value("--data-parallel-size-local")
        rank = worker.value("--data-parallel-start-rank")
        if spans and size == 2 and local and rank and not rank.startswith("$") and rank != local:
            findings.append(
                _finding(
                    GROUP_MEMBERS_DISAGREE,
                    Severity.FAIL,
                    doc,
                    wpath,
                    f"{doc.label}'s worker starts at data-parallel rank {rank}, but the leader "
                    f"holds ranks 0 to {int(local) - 1} (--data-parallel-size-local {local}): "
                    "the worker's first rank must be " + local,
                    extra=wpod.part,
                )
            )
    if spans and worker.has("--data-parallel-size") and not worker.has("--headless"):
        findings.append(
            _finding(
                GROUP_MEMBERS_DISAGREE,
                Severity.FAIL,
                doc,
                wpath,
                f"{doc.label}'s workers run data-parallel ranks without --headless: each would "
                "start an API server of its own beside the leader's.",
                extra=wpod.part,
            )
        )
    return findings


# ---------------------------------------------------------------------------------------
# Secrets in clear (SB114)

# A reference to a value kept elsewhere, not a value: Kubernetes' $(VAR), the shell's
# ${VAR} and $VAR, a <placeholder> (SB101's business), and what redaction left.
_SECRET_REFERENCE = re.compile(r"\$\(\w+\)|\$\{[^}]+\}|\$\w+|<[^<>]+>")


def _literal(value: str) -> bool:
    v = value.strip().strip("'\"")
    return bool(v) and not _SECRET_REFERENCE.fullmatch(v)


def _command_lines(container: Mapping[str, Any]) -> list[list[str]]:
    """The container's command and args as word lists: one, or each simple command of a
    ``sh -c`` script."""
    words = [
        cmdline_word(x)
        for key in ("command", "args")
        if isinstance(container.get(key), list)
        for x in container[key]
    ]
    script = shell_script(words)
    if script is not None:
        return split_shell(script) or []
    return [words]


def _secret_flags(words: Sequence[str]) -> Iterator[list[str]]:
    """Each secret flag given a literal value, as its words (``--api-key VALUE`` or
    ``--api-key=VALUE``)."""
    for i, w in enumerate(words):
        if not w.startswith("-") or len(w) < 2:
            continue
        name, eq, value = w.partition("=")
        if not redact.is_secret_name(name):
            continue
        if eq:
            if _literal(value):
                yield [w]
        elif i + 1 < len(words):
            nxt = words[i + 1]
            if not (nxt.startswith("-") and len(nxt) > 1) and _literal(nxt):
                yield [w, nxt]


def check_secrets_in_clear(doc: Document) -> list[Finding]:
    """Secret flags with literal values, and secret-named env vars with a literal value."""
    findings: list[Finding] = []
    for pod in pod_specs(doc):
        for cpath, container in pod.containers():
            cname = container.get("name", "?")
            for words in _command_lines(container):
                for flag in _secret_flags(words):
                    shown = " ".join(redact.argv(flag)[0])
                    findings.append(
                        _finding(
                            SECRET_IN_CLEAR,
                            Severity.FAIL,
                            doc,
                            cpath,
                            f"container {cname} is given {shown} with the secret written in "
                            "the manifest: keep it in a Secret (vLLM's API key: VLLM_API_KEY "
                            "from a secretKeyRef, no --api-key).",
                            extra=pod.part,
                            evidence={"flag": flag[0].partition("=")[0]},
                        )
                    )
            env = container.get("env")
            for i, item in enumerate(env if isinstance(env, list) else []):
                if not isinstance(item, dict):
                    continue
                name, value = item.get("name"), item.get("value")
                if not (isinstance(name, str) and redact.is_secret_name(name)):
                    continue
                if isinstance(value, str | int | float) and _literal(str(value)):
                    findings.append(
                        _finding(
                            SECRET_IN_CLEAR,
                            Severity.FAIL,
                            doc,
                            (*cpath, "env", i),
                            f"container {cname} sets {name}={redact.REDACTED} with the value "
                            "written in the manifest: take it from a Secret (valueFrom."
                            "secretKeyRef) instead of value.",
                            extra=pod.part,
                            evidence={"env": name},
                        )
                    )
    return findings


# ---------------------------------------------------------------------------------------


def check_documents(docs: Iterable[Document]) -> list[Finding]:
    findings: list[Finding] = []
    for doc in docs:
        findings.extend(check_placeholders(doc))
        findings.extend(check_label_values(doc))
        findings.extend(check_hostpath_pinning(doc))
        findings.extend(check_hostpath_create(doc))
        findings.extend(check_group_members(doc))
        findings.extend(check_secrets_in_clear(doc))
    return findings


def check(lint_set: LintSet) -> list[Finding]:
    """Every manifest and engine-argument rule over everything in ``lint_set``."""
    docs = lint_set.documents
    findings = check_documents(docs)
    all_engines = engines(lint_set)
    for e in all_engines:
        findings.extend(check_duplicate_flags(e))
        findings.extend(check_engine_json(e))
    findings.extend(check_pd(all_engines))
    findings.extend(check_namespaces(docs))
    findings.extend(check_images(lint_set))
    return findings


__all__ = [
    "DUPLICATE_FLAG",
    "ENGINE_JSON",
    "GROUP_MEMBERS_DISAGREE",
    "HOSTPATH_CREATES_WEIGHTS",
    "HOSTPATH_UNPINNED",
    "IMAGE_MISMATCH",
    "KV_OVER_TCP",
    "LABEL_VALUE",
    "NAMESPACE_NOT_CREATED",
    "PD_CONNECTOR",
    "PD_SETTINGS",
    "PD_SPECULATIVE",
    "PLACEHOLDER",
    "SECRET_IN_CLEAR",
    "Engine",
    "PodSpec",
    "check",
    "engines",
    "find_placeholders",
    "image_mentions",
    "normalize_image",
    "pinned_node",
    "pod_specs",
]
