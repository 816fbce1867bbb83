"""SB110: image references in comments, recipe descriptions and docs that disagree with
the image field beside them."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import PurePath

from servebook.findings import Finding, Severity, register
from servebook.lint.loader import Document, KeyPath, LintSet
from servebook.lint.rules.objects import keypath_str, walk
from servebook.lint.rules.placeholders import find_placeholders
from servebook.lint.rules.registry import SET_RULES

_IMAGE_TOKEN = re.compile(
    r"(?<![\w./@-])"
    r"((?:[a-z0-9][a-z0-9.-]*(?::[0-9]+)?/)?[a-z0-9][a-z0-9._-]*(?:/[a-z0-9][a-z0-9._-]*)+)"
    r"(?::([A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(sha256:[a-f0-9]{64}))?"
)
_DOCKER_HUB = ("docker.io/", "index.docker.io/", "registry-1.docker.io/")
# `docker build -t NAME:TAG`, `podman build --tag=NAME:TAG`: the tag an optional build
# produces, not a reference to the image the manifests run.
_BUILD_TAG = re.compile(
    r"(?:(?:^|\s)(?:-t|--tag)(?:\s+|=)|(?:^|\s)(?:docker|podman)\s+push\s+|"
    r"^\s*FROM\s+(?:--platform=\S+\s+)?)['\"]?$",
    re.I,
)
# A Dockerfile shown in a doc builds an image of its own from a base: not the manifests'.
_BUILD_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*(?:dockerfile|containerfile)\b", re.I)


def _without_build_files(text: str) -> str:
    """The doc with the bodies of ```dockerfile fences blanked (line numbers kept)."""
    out: list[str] = []
    fence: str | None = None
    for line in text.splitlines():
        m = _BUILD_FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is not None:
            line = ""
        out.append(line)
    return "\n".join(out)


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
            if _BUILD_TAG.search(line[: m.start()]):
                continue  # what a build writes, not what the manifests run
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


IMAGE_MISMATCH = register(
    "SB110",
    "Image reference in a comment or doc disagrees with the image field",
    "When the image field is bumped and a header comment, a recipe description or the "
    "README beside the manifest (or in a docs/ or build/ directory just below it) still "
    "names the old tag, a reader cannot tell which "
    "image is authoritative; benchmark numbers get attributed to the wrong engine "
    "version, and ratios across images are invalid even when both numbers are true. "
    "The image a doc's optional build writes (`docker build -t NAME:TAG`, `docker push`, "
    "the `FROM` of a Dockerfile it shows) is not a reference and is not compared, and "
    "neither is an image field that is itself a placeholder (`:my-tag`, `${VERSION}`, "
    "reported by SB101): a doc naming the image to put there is not stale. A doc that names "
    "the manifest files it describes is compared with those files only.",
    "Update (or delete) the stale reference so every mention of the image repository names "
    "the tag the manifest actually runs.",
)


# repo -> {tag: [file:line of each image field naming it]}
Fields = dict[str, dict[str, list[str]]]


@SET_RULES.add(IMAGE_MISMATCH)
def check_images(lint_set: LintSet) -> list[Finding]:
    findings: list[Finding] = []
    by_file, by_dir, imaged = _image_fields(lint_set)
    for yf in lint_set.yaml_files:
        fields = by_file.get(yf.path)
        if not fields:
            continue
        for c in yf.comments:
            findings += _compare(fields, c.text, yf.path, c.line, "comment")
        for doc in yf.documents:
            for keypath, text in _text_values(doc):
                findings += _compare(
                    fields, text, yf.path, doc.line_at(keypath), f"{keypath_str(keypath)}"
                )
    for md in lint_set.markdown_files:
        fields = _fields_for_doc(lint_set, md.path, md.text, by_file, by_dir, imaged)
        if fields:
            findings += _compare(fields, _without_build_files(md.text), md.path, 1, "doc")
    return findings


def _image_fields(
    lint_set: LintSet,
) -> tuple[dict[str, Fields], dict[PurePath, Fields], set[str]]:
    """The image fields per file and per directory (for the docs beside them), and the
    files with an image field, a placeholder one included."""
    by_file: dict[str, Fields] = {}
    by_dir: dict[PurePath, Fields] = {}
    imaged: set[str] = set()
    for yf in lint_set.yaml_files:
        for doc in yf.documents:
            for keypath, ref in image_fields(doc):
                imaged.add(yf.path)
                norm = normalize_image(ref)
                if not norm or find_placeholders(ref):
                    continue
                repo, tag = norm
                at = doc.where(keypath)
                by_file.setdefault(yf.path, {}).setdefault(repo, {}).setdefault(tag, []).append(at)
                d = by_dir.setdefault(PurePath(yf.path).parent, {})
                d.setdefault(repo, {}).setdefault(tag, []).append(at)
    return by_file, by_dir, imaged


def _fields_for_doc(
    lint_set: LintSet,
    path: str,
    text: str,
    by_file: dict[str, Fields],
    by_dir: dict[PurePath, Fields],
    imaged: set[str],
) -> Fields | None:
    """The image fields a markdown doc is compared with."""
    # The manifests beside the doc, or, for a doc in a subdirectory of its own (docs/,
    # build/), the manifests one directory up.
    here = PurePath(path).parent
    fields = by_dir.get(here) or by_dir.get(here.parent)
    # A doc that names the manifests it describes (`kubectl apply -f disagg.yaml`) is
    # compared with those, not with every other manifest of its directory.
    named = [
        f
        for yf in lint_set.yaml_files
        if yf.path in imaged
        and PurePath(yf.path).parent in (here, here.parent)
        and re.search(rf"(?<![\w.-]){re.escape(PurePath(yf.path).name)}(?![\w-])", text)
        for f in [by_file.get(yf.path, {})]
    ]
    if named:
        fields = {}
        for f in named:
            for repo, tags in f.items():
                for tag, ats in tags.items():
                    fields.setdefault(repo, {}).setdefault(tag, []).extend(ats)
    return fields


def _compare(
    fields: Mapping[str, Mapping[str, list[str]]],
    text: str,
    where: str,
    first_line: int,
    kind: str,
) -> list[Finding]:
    """A finding for each image ``text`` names with a tag its image fields do not say."""
    findings = []
    for offset, written, repo, tag in image_mentions(text):
        tags = fields.get(repo)
        if not tags or tag in tags or find_placeholders(written):
            continue  # a doc naming the placeholder to replace (`:my-tag`) is not stale
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
    return findings
