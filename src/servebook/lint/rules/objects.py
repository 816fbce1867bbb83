"""What lint rules read, and how a finding names where it is.

* Kubernetes objects (a document with ``apiVersion`` and ``kind``).  Pod specs are found
  wherever they sit: ``spec`` of a Pod, ``spec.template.spec`` of a Deployment,
  StatefulSet, DaemonSet, Job, ReplicaSet; ``spec.jobTemplate...`` of a CronJob; the leader
  and worker templates of a LeaderWorkerSet; ``extraPodSpec`` of an NVIDIA Dynamo graph;
  and any other mapping with a ``containers`` list.
* Engine command lines, read by ``servebook.engines.cmdline`` from each container: an
  ``Engine`` is one container that runs the vLLM engine, with the role (prefill, decode)
  its names, labels or ``kv_role`` give it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servebook.engines.cmdline import (
    BOOLEAN_FLAGS,
    EngineCommand,
    normalize_flag,
    parse_argv,
    parse_container,
    parse_engine_args,
)
from servebook.engines.cmdline import _shell_script as shell_script
from servebook.engines.cmdline import _word as cmdline_word
from servebook.findings import Check, Finding, Severity
from servebook.lint.loader import Document, Key, KeyPath, LintSet


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


def finding_at(
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


def lookup(data: Any, *keys: Key) -> Any:
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


def _part_words(data: Any, path: KeyPath) -> Iterator[str]:
    """What names a pod spec inside its object: the keys on its path, and the `name` of a
    Dynamo v1beta1 component (``spec.components[i]``), which has no key of its own."""
    for i, k in enumerate(path):
        if isinstance(k, str):
            if k not in _STRUCTURAL:
                yield k
        elif i and path[i - 1] == "components":
            item = lookup(data, *path[: i + 1])
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                yield item["name"]


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
                parent = lookup(doc.data, *path[:-1]) if path else None
                labels: Any = None
                if isinstance(parent, dict) and path[-1] == "spec":
                    labels = lookup(parent, "metadata", "labels")
                if labels is None and path == ("spec",):
                    labels = doc.metadata.get("labels")
                part = "/".join(_part_words(doc.data, path))
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
        # Dynamo's newer workers (v1beta1 components): `--disaggregation-mode prefill|decode`
        # is what the engine runs as (a decode worker without it runs aggregated).
        mode = (self.cmd.value("--disaggregation-mode") or "").lower()
        if mode in ("prefill", "decode"):
            return mode
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


def container_script(container: Mapping[str, Any]) -> str | None:
    """The script of a container that runs ``sh -c SCRIPT`` (command and args together)."""
    words = [
        cmdline_word(x)
        for key in ("command", "args")
        if isinstance(container.get(key), list)
        for x in container[key]
    ]
    return shell_script(words)


# A shell variable standing alone as a word: `$SPEC_ARGS`, `${EXTRA_ARGS}`, `${X:-}`.
_EXPANSION = re.compile(r"^\$(?:\{[A-Za-z_]\w*(?:[:#%/-][^}]*)?\}|[A-Za-z_]\w*)$")


def script_expansions(cmd: EngineCommand) -> list[str]:
    """The engine's words that are a shell variable alone where a flag would stand (not a
    flag's value): flags a script assembles at start time, which lint cannot see."""
    if not cmd.via_shell:
        return []
    found: list[str] = []
    takes_value = False
    for w in cmd.args:
        if takes_value:
            takes_value = False
            continue
        if w.startswith("-") and len(w) > 1:
            name = normalize_flag(w.split("=", 1)[0])[0]
            takes_value = (
                "=" not in w and name not in BOOLEAN_FLAGS and not name.startswith("--no-")
            )
            continue
        if _EXPANSION.match(w):
            found.append(w)
    return found


def _model_after_expansions(cmd: EngineCommand) -> EngineCommand:
    """`exec vllm serve $PROFILER_ARGS $SPEC_ARGS MODEL ...`: the first positional word is
    a variable of flags, not the model.  When a literal positional word follows, that one
    is the model; a variable alone (`vllm serve $MODEL`) stays the model."""
    model = cmd.positional_model
    if model is None or not _EXPANSION.match(model):
        return cmd
    expansions = set(script_expansions(cmd))
    rest = parse_engine_args([w for w in cmd.args if w not in expansions], positional_model=True)
    if rest.positional_model is None:
        return cmd
    rest.entrypoint, rest.via_shell, rest.args = cmd.entrypoint, cmd.via_shell, cmd.args
    return rest


# Kubernetes expands `$(VAR)` in command and args before any shell sees them.
_KUBE_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _kube_refs_as_variables(container: Mapping[str, Any]) -> Mapping[str, Any]:
    """The container with `$(VAR)` written `${VAR}` in its command and args: Kubernetes
    substitutes them before the shell runs, so a script's parser must not read `$(` as
    the start of a command substitution (which would cut the command line there)."""
    out = dict(container)
    for key in ("command", "args"):
        items = container.get(key)
        if isinstance(items, list):
            out[key] = [_KUBE_REF.sub(r"${\1}", x) if isinstance(x, str) else x for x in items]
    return out


def engine_command(container: Mapping[str, Any]) -> EngineCommand | None:
    """The container's engine command; for `sh -c 'exec ENGINE "$@" MORE' NAME ARGS...` the
    container's args are the script's "$@" (how a LeaderWorkerSet worker computes its
    data-parallel start rank in a shell), so they are read as the engine's."""
    container = _kube_refs_as_variables(container)
    cmd = parse_container(container)
    args = container.get("args")
    if cmd is not None and cmd.via_shell and "$@" in cmd.args and isinstance(args, list):
        at = cmd.args.index("$@")
        words = [*cmd.entrypoint.split(), *cmd.args[:at], *map(str, args), *cmd.args[at + 1 :]]
        full = parse_argv(words)
        if full is not None:
            full.via_shell = True
            return _model_after_expansions(full)
    return _model_after_expansions(cmd) if cmd is not None else None


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


_LABEL_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def is_label_value(value: str) -> bool:
    return len(value) <= 63 and _LABEL_RE.match(value) is not None
