"""What makes a file another tool's template (SB115, registered in
``servebook.lint.rules.placeholders``): a Helm chart's, a controller's, a kustomize base.

What counts:

* Helm: ``{{ }}`` expressions naming a chart's own objects and helpers (``.Release``,
  ``.Chart``, ``include``, ``toYaml``, ...; ``.Values`` alone is a leftover placeholder);
* a controller's Go templates: a kind that is a controller's template by definition
  (KServe's ``LLMInferenceServiceConfig``), or expressions over the owner object
  (``.Spec.``, ``.ObjectMeta``, ``ChildName``);
* kustomize: a resource or patch of a ``Kustomization`` in the same lint run: the images
  its ``images:`` replace, and the placeholders left for the overlays (``REPLACE_IMAGE``,
  ``${DECODE_REPLICAS}``), are the build's business, judged on its output.

Kinds that template on their own at run time (PrometheusRule, Argo, ServingRuntime) are
final objects, not templates, and are not reported here (SB101 leaves their ``{{ }}``).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from servebook.lint.loader import Document, LintSet
from servebook.lint.rules.objects import walk

GO_TEMPLATE = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.S)
# A chart's own objects and functions.  `.Values` alone is not enough: a concrete manifest
# with one pasted `{{ .Values.image.tag }}` left in it is a placeholder (SB101), while a
# chart template names the release, the chart or its helpers somewhere.
_HELM_WORDS = re.compile(
    r"(?:^|[\s(|$])(?:\$?\.(?:Release|Chart|Capabilities|Files|Template)\b|"
    r"(?:include|tpl|toYaml|lookup|template)\s)"
)
_CONTROLLER_WORDS = re.compile(r"(?:^|[\s(])\.(?:Spec|ObjectMeta)\b|ChildName")
# Kinds whose fields legitimately carry `{{ }}` templates their own tool fills at run time:
# final objects, not templates of another tool.
TEMPLATING_KINDS = frozenset(
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
# Kinds that are, by definition, a template some controller renders into other objects.
CONTROLLER_TEMPLATE_KINDS = {
    "LLMInferenceServiceConfig": "the KServe LLMInferenceService controller",
}
KUSTOMIZATION = "Kustomization"


@dataclass
class Kustomized:
    """The files the kustomizations of a lint run build from (resources and patches), and
    the image names each kustomization replaces in them."""

    images: dict[str, set[str]] = field(default_factory=dict)  # file path -> image names
    kustomization: dict[str, str] = field(default_factory=dict)  # file path -> its file

    def replaced(self, doc: Document) -> set[str]:
        return self.images.get(posixpath.normpath(doc.path), set())

    def base_of(self, doc: Document) -> str | None:
        """The kustomization file that builds from ``doc``'s file, if one is in the run."""
        return self.kustomization.get(posixpath.normpath(doc.path))


def _listed_files(data: dict[str, object]) -> list[str]:
    files: list[str] = []
    for key in ("resources", "bases", "patches", "patchesStrategicMerge", "patchesJson6902"):
        items = data.get(key)
        for item in items if isinstance(items, list) else []:
            path = item.get("path") if isinstance(item, dict) else item
            if isinstance(path, str) and "://" not in path:
                files.append(path)
    return files


def kustomized(lint_set: LintSet) -> Kustomized:
    out = Kustomized()
    for doc in lint_set.documents:
        if doc.kind != KUSTOMIZATION or not isinstance(doc.data, dict):
            continue
        base = posixpath.dirname(doc.path)
        names = {
            str(i["name"])
            for i in doc.data.get("images") or []
            if isinstance(i, dict) and isinstance(i.get("name"), str)
        }
        for r in _listed_files(doc.data):
            path = posixpath.normpath(posixpath.join(base, r))
            out.images.setdefault(path, set()).update(names)
            out.kustomization.setdefault(path, doc.path)
    return out


def template_tool(doc: Document) -> str | None:
    """Which tool renders this document, if it is a template; None for a final object."""
    if doc.kind in CONTROLLER_TEMPLATE_KINDS:
        return CONTROLLER_TEMPLATE_KINDS[doc.kind]
    if doc.kind in TEMPLATING_KINDS:
        return None
    for _, node in walk(doc.data):
        if not isinstance(node, str) or "{{" not in node:
            continue
        for m in GO_TEMPLATE.finditer(node):
            expr = m.group(1)
            if _HELM_WORDS.search(expr):
                return "Helm"
            if _CONTROLLER_WORDS.search(expr) and doc.is_kubernetes:
                return f"the controller that owns {doc.kind} (Go templates)"
    return None


def kustomize_replaced(doc: Document, k: Kustomized) -> list[str]:
    """The image names in ``doc`` that a kustomization in the run replaces."""
    names = k.replaced(doc)
    if not names:
        return []
    return sorted(
        {
            node.split(":", 1)[0]
            for kp, node in walk(doc.data)
            if kp and kp[-1] == "image" and isinstance(node, str) and node.split(":", 1)[0] in names
        }
    )
