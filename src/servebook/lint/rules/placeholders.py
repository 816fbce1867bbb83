"""SB101: placeholder text left in a manifest, a recipe or a values file; SB115: a file
that is another tool's template (``servebook.lint.rules.templates`` says which).

Placeholders must not fire on text that only looks like one: ``${VAR}`` inside a shell
script (``sh -c``), in YAML that expands variables itself (compose, CI) or in a file
carried by a ConfigMap; ``{{ }}`` in Jinja chat templates, in kinds that template on their
own (PrometheusRule, Argo, KServe ServingRuntime) and GitHub's ``${{ }}``; ``<tok>`` model
special tokens and HTML, and anything in a string with ``</`` or ``<|``; shell redirects
(``< in > out``: the spaces keep them from matching); Kubernetes ``$(VAR)``.  In a recipe,
``${name}`` is fine when ``name`` is a declared parameter.  Other YAML than Kubernetes
objects (a servebook recipe, a Helm values file) is read for this rule, on string values.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from typing import Any

from servebook.findings import Finding, Severity, register
from servebook.lint.loader import Document, KeyPath, LintSet
from servebook.lint.rules.objects import finding_at, is_label_value, keypath_str, lookup, walk
from servebook.lint.rules.registry import SET_RULES
from servebook.lint.rules.templates import (
    KUSTOMIZATION,
    TEMPLATING_KINDS,
    kustomize_replaced,
    kustomized,
    template_tool,
)

_ANGLE = re.compile(r"<([A-Za-z][A-Za-z0-9_.-]*)>")
_DOLLAR = re.compile(r"\$\{([^{}]*)\}")
_MUSTACHE = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.S)
_REPLACE = re.compile(r"\bREPLACE(?:_[A-Z0-9_]+|[-_]?ME)\b")
_CHANGEME = re.compile(r"\bchange[-_]?me\b", re.I)
# The docs' spellings of "fill this in": YOUR-MODEL-PATH, your-storage-class, <YOUR HF
# TOKEN> (words with spaces), my-registry/vllm:my-tag.
_YOUR = re.compile(r"(?<![\w.-])(?:YOUR|[Yy]our)[-_][A-Za-z0-9][A-Za-z0-9_-]*")
_ANGLE_WORDS = re.compile(r"<(?:[A-Z][A-Z0-9_.-]*|[Yy]our)(?: [A-Za-z0-9_.-]+){1,6}>")
_MY_REF = re.compile(r"(?<![\w.-])my-(?:registry|repo|repository|image|tag|org|bucket)(?![\w-])")
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
    for pattern in (_REPLACE, _CHANGEME, _YOUR, _MY_REF):
        hits.extend(m.group(0) for m in pattern.finditer(text))
    if not markup:
        hits.extend(m.group(0) for m in _ANGLE_WORDS.finditer(text))
    return list(dict.fromkeys(hits))


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


PLACEHOLDER = register(
    "SB101",
    "Unresolved placeholder in a value",
    "A manifest applies with placeholder text such as `<NODE>`, `<YOUR HF TOKEN>`, `${X}`, "
    "`{{ .Values.x }}`, `REPLACE_...`, `CHANGEME`, `YOUR-PVC-NAME` or "
    "`my-registry/...:my-tag` still in it, and the failure shows up "
    "far from the cause. In a nodeSelector or nodeName the workload is 'created' (apply "
    "exits 0) but no Pod ever appears: the controller's Pod is rejected or stays Pending, "
    "and the only error is in the controller's events. In a hostPath the Pod is created "
    "and scheduled, then fails at volume mount time minutes later, which reads like a "
    "storage problem. In engine arguments vLLM starts with the literal text as a model "
    "name or path and fails after the image pull. A Helm or controller template, and "
    "the image names a kustomization in the same run replaces, are reported once as SB115 "
    "instead (their expressions are filled in by that tool).",
    "Replace every placeholder with its real value before applying (or render a servebook "
    "recipe with `servebook render ... --set NAME=VALUE`, which refuses to write anything "
    "while a parameter is unresolved).",
)


@SET_RULES.add(PLACEHOLDER)
def check_placeholders(lint_set: LintSet) -> Iterator[Finding]:
    k = kustomized(lint_set)
    for doc in lint_set.documents:
        if k.base_of(doc) is None:  # a kustomize base's placeholders are SB115's
            yield from document_placeholders(doc)


def document_placeholders(
    doc: Document, replaced: AbstractSet[str] = frozenset()
) -> Iterator[Finding]:
    """SB101 on one document; ``replaced``: image names a kustomization replaces."""
    declared = None if doc.is_kubernetes else _declared_parameters(doc)
    # A template's `{{ }}` belongs to the tool that renders it (SB115 says so once).
    templating = doc.kind in TEMPLATING_KINDS or template_tool(doc) is not None
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
        if doc.kind == KUSTOMIZATION and len(keypath) == 3 and keypath[0] == "images":
            continue  # `images: [{name: REPLACE_IMAGE, newName: ...}]` names what it replaces
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
                shell = _container_runs_shell(lookup(doc.data, *keypath[:idx]))
            # A file carried in a ConfigMap/Secret (a script, a chat template).
            embedded = data_kind and "\n" in text.strip() and keypath[:1] in _DATA_KEYS
            hits = find_placeholders(
                text, shell=shell or expands_env, embedded_file=embedded, templating=templating
            )
            if declared is not None:
                hits = [h for h in hits if not (h.startswith("${") and h[2:-1].strip() in declared)]
            if keypath[-1:] == ("image",) and text.split(":", 1)[0] in replaced:
                hits = []
            if not hits:
                continue
            effect = _placeholder_effect(doc, keypath, hits, text)
            shown = text if len(text) <= 80 else text[:77] + "..."
            undeclared = [h for h in hits if h.startswith("${")] if declared is not None else []
            note = f" ({', '.join(undeclared)} is not a declared parameter)" if undeclared else ""
            yield finding_at(
                PLACEHOLDER,
                Severity.FAIL,
                doc,
                keypath,
                f"{keypath_str(keypath) or 'value'} = {shown!r} contains "
                f"{', '.join(hits)}{note}. Effect if applied: {effect}.",
                evidence={"placeholders": hits, "value": text},
            )


RENDERED_BY_ANOTHER_TOOL = register(
    "SB115",
    "File is another tool's template: lint the rendered output",
    "A Helm chart's templates, a controller's config templates (KServe's "
    "LLMInferenceServiceConfig) and a kustomize base are not what reaches the cluster: "
    "their `{{ }}` expressions and placeholder images are filled in by Helm, the "
    "controller or the overlay. Reporting them as placeholders would fail every checkout "
    "of those projects, and a lint that fails correct files gets switched off; passing "
    "them silently would hide that lint did not see the real values. So lint says once per "
    "document which tool renders it, and still reports any other trap in it. A controller's "
    "template or a kustomize base is information (it does not fail the run: the file is "
    "legitimately a template, and an object of its own). A Helm chart's template is never "
    "applied as written and none of its values were seen: like one that does not parse as "
    "YAML (SB100), it is input lint could not check, and the run exits 2, never 0.",
    "Lint what the tool produces: `helm template RELEASE CHART -f VALUES > out.yaml`, "
    "`kubectl kustomize DIR > out.yaml`, or the objects the controller created (`kubectl "
    "get ... -o yaml > out.yaml`), then `servebook lint out.yaml`.",
)


@SET_RULES.add(RENDERED_BY_ANOTHER_TOOL)
def check_templates(lint_set: LintSet) -> Iterator[Finding]:
    k = kustomized(lint_set)
    for doc in lint_set.documents:
        tool = template_tool(doc)
        kustomization = k.base_of(doc) if tool is None else None
        if kustomization is not None:
            replaced = kustomize_replaced(doc, k)
            left = [
                h
                for f in document_placeholders(doc, set(replaced))
                for h in f.evidence["placeholders"]
            ]
            if not replaced and not left:
                continue
            said = [f"replaces {', '.join(replaced)}"] if replaced else []
            if left:
                said.append(f"leaves {', '.join(dict.fromkeys(left))} to the overlays")
            tool = f"kustomize ({kustomization} builds from it and {'; '.join(said)})"
        if tool is None:
            continue
        # A Helm template checked as written is no pass (exit 0): an unparseable one is
        # SB100's error, and one that happens to parse is no more checked than it.
        helm = tool == "Helm"
        yield finding_at(
            RENDERED_BY_ANOTHER_TOOL,
            Severity.ERROR if helm else Severity.INFO,
            doc,
            (),
            f"{doc.label} is a template that {tool} renders; its template expressions "
            "are not placeholders and were not checked: lint the rendered output"
            + (" (`helm template RELEASE CHART -f VALUES`)." if helm else "."),
            evidence={"rendered_by": tool},
        )
