"""`servebook render RECIPE [--set k=v ...] [-f values.yaml] [-o DIR]`.

Resolves the recipe, builds every Kubernetes object (``servebook.kube.manifests``), checks
each against the Kubernetes OpenAPI schema, runs `servebook lint`'s rules on the files
(a failing finding refuses the render), and only then writes: into a temporary
directory beside DIR that is renamed into place, so a render that fails at any step leaves
DIR exactly as it was.  Without ``-o`` the manifests go to stdout (for ``| kubectl apply
-f -``).

It prints the teardown beside the apply (issue 32): ``kubectl delete -f DIR/`` removes this
deployment's objects and nothing another deployment needs.  The Namespace, which other
deployments may share, is written apart (``DIR/namespace/``, applied first) and left out of
stdout, so no teardown of a render ever deletes it.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import typer

from servebook import inputs
from servebook.commands import app
from servebook.console import err, out
from servebook.errors import UsageError
from servebook.kube import manifests, names
from servebook.kube.parameters_doc import MARKER, parameters_markdown
from servebook.kube.validate import K8S_VERSION, check_schema
from servebook.recipe.plan import Plan
from servebook.recipe.resolve import load_source, parse_parameters, resolve

PARAMETERS_FILE = "PARAMETERS.md"
_MANIFEST_FILE = re.compile(r"^\d{2}-[a-z0-9-]+\.yaml$")

_EPILOG = (
    "Examples:\n\n"
    "  servebook render vllm-mixed -f examples/values/dense-8b-one-node.yaml -o deploy/dense\n\n"
    "  servebook render vllm-pd-spec -f examples/values/moe-two-8gpu-nodes.yaml "
    "--set spec_method=mtp -o deploy/moe\n\n"
    "  kubectl create namespace NS; servebook render vllm-pd -f values.yaml | kubectl apply "
    "-f -\n\n"
    "Exit codes: 0 written; 2 a parameter is missing or invalid, or an object does not match "
    "the Kubernetes schema, or `servebook lint` fails a rendered file (nothing is written)."
)


def _is_previous_render(path: Path) -> bool:
    """Only a directory servebook itself rendered (and nothing else) may be replaced."""
    entries = list(path.iterdir())
    if not entries:
        return True
    params = path / PARAMETERS_FILE
    try:
        first = inputs.read_text(params, "parameters file").split("\n", 1)[0]
    except inputs.InputError:
        return False
    if first != MARKER:
        return False
    return all(_rendered(e) for e in entries)


def _rendered(entry: Path) -> bool:
    """A file (or the namespace's folder) a render writes, and not a symlink."""
    if entry.is_symlink():
        return False
    if entry.is_file():
        return entry.name == PARAMETERS_FILE or bool(_MANIFEST_FILE.match(entry.name))
    return (
        entry.name == manifests.NAMESPACE_DIR
        and entry.is_dir()
        and all(_rendered(e) and e.name != PARAMETERS_FILE for e in entry.iterdir())
    )


def check_output_dir(path: Path) -> None:
    """Refuse, before anything is written, a DIR that render must not replace."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise UsageError(f"-o {path}: exists and is not a directory. Choose another -o.")
    if path.is_dir() and not _is_previous_render(path):
        raise UsageError(
            f"-o {path}: the directory holds files `servebook render` did not write; it "
            "replaces only its own renders. Choose a new directory (or an empty one)."
        )


def write_atomically(
    path: Path, files: Mapping[str, str], check: Callable[[Path], None] | None = None
) -> None:
    """Write ``files`` as the whole content of directory ``path``: all of them or, on any
    failure, nothing (a previous render there stays as it was).  ``check`` refuses a
    ``path`` that must not be replaced (default: anything but a previous render)."""
    (check or check_output_dir)(path)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent))
    old: Path | None = None
    try:
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text, encoding="utf-8")
        tmp.chmod(0o755)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=parent))
            os.rename(path, old / path.name)
        try:
            os.rename(tmp, path)
        except OSError:
            if old is not None:
                os.rename(old / path.name, path)
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def render_files(
    recipe: str, sets: Sequence[str] = (), values: Sequence[Path] = (), name: str | None = None
) -> tuple[Plan, list[dict[str, Any]], dict[str, str]]:
    """Everything a render writes, checked, without writing it: the Plan, the objects of
    deployment ``name`` (default: the recipe's name), and file name -> text (the manifests
    in apply order, then PARAMETERS.md)."""
    plan = resolve(recipe, sets, values)
    objects = manifests.render(plan, name)
    check_schema(objects)
    files = manifests.manifest_files(plan, objects)
    declared = parse_parameters(load_source(recipe))
    files[PARAMETERS_FILE] = parameters_markdown(plan, declared, list(files), K8S_VERSION)
    refuse_what_lint_fails(files)
    return plan, objects, files


def refuse_what_lint_fails(files: Mapping[str, str]) -> None:
    """Run `servebook lint`'s rules on the files a render is about to write; a failing
    finding is a ``UsageError`` naming each (file:line, check, message), so nothing is
    written that lint would fail."""
    from servebook.findings import Severity
    from servebook.lint import docs, loader, rules

    lint_set = loader.LintSet()
    for file_name, text in files.items():
        if file_name.endswith(".md"):
            lint_set.markdown_files.append(loader.parse_markdown(text, file_name))
        else:
            lint_set.yaml_files.append(loader.parse_yaml(text, file_name))
    findings = rules.check(lint_set) + docs.check(lint_set.markdown_files)
    failing = [f for f in findings if f.severity in (Severity.FAIL, Severity.ERROR)]
    if not failing:
        return
    hint = "Change the parameter that put it there; `servebook checks ID` explains each check."
    if any(f.check == "SB114" for f in failing):
        hint = (
            "Keep the key in a Secret in the namespace and name it with "
            "`--set api_key_secret=NAME` (key api-key, or NAME/KEY): every engine then gets "
            "VLLM_API_KEY from it. Remove --api-key (or the secret) from extra_engine_args."
        )
    lines = "\n".join(f"  {f.subject} {f.check}: {f.message}" for f in failing)
    raise UsageError(
        f"the render would fail `servebook lint` ({len(failing)} failing finding(s)); "
        f"nothing was written:\n{lines}",
        hint=hint,
    )


@app.command("render", epilog=_EPILOG)
def render(
    recipe: str = typer.Argument(..., help="Built-in recipe name or path to a recipe YAML."),
    sets: list[str] = typer.Option(
        [], "--set", help="Set a recipe parameter: NAME=VALUE (repeatable; wins over -f)."
    ),
    values: list[Path] = typer.Option(
        [], "-f", "--values", help="YAML file of parameter values (repeatable)."
    ),
    output: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        help="Directory to write the manifests and PARAMETERS.md to (created, or replaced "
        "when it holds an earlier render). Without it the manifests go to stdout.",
    ),
    name: str | None = typer.Option(
        None,
        "--name",
        help="Deployment name the objects are named and labelled after (default: the "
        "recipe's name), as `servebook up --name` would apply them.",
    ),
) -> None:
    """Render a recipe to Kubernetes manifests that need no editing.

    Every parameter is typed and checked; any missing or invalid one (a node name like
    `<NODE>`, a relative weights path) stops the render with exit 2, naming each, and nothing
    is written.  Every object is checked against the Kubernetes schema first.
    """
    if output is not None:
        check_output_dir(output)
    plan, objects, files = render_files(recipe, sets, values, name)
    note = manifests.engine_args_note(plan)
    if note:
        err.print(note, highlight=False, markup=False, soft_wrap=True)
    namespace = names.settings(plan).namespace
    has_namespace = any(o["kind"] == "Namespace" for o in objects)
    if output is None:
        sys.stdout.write("---\n".join(files[k] for k in manifests.owned_files(files)))
        _say_stdout_namespace(namespace, has_namespace)
        return
    write_atomically(output, files)
    out.print(
        f"wrote {len(objects)} objects of recipe {plan.recipe} to {output}/ "
        f"({', '.join(files)}); checked against the Kubernetes {K8S_VERSION} schema.",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    entry = names.object_name(plan, plan.entry_role, name)
    port = names.ROUTER_PORT if plan.topology == "pd" else names.ENGINE_PORT
    kept = (
        f"; namespace {namespace} stays, since other deployments may share it: `kubectl "
        f"delete namespace {namespace}` once it is empty"
        if has_namespace
        else ""
    )
    for line in (
        f"apply: {manifests.apply_command(files, str(output))}",
        f"teardown: {manifests.teardown_command(str(output))}   (this deployment's "
        f"objects only{kept})",
        f"entry point: service/{entry} port {port} in namespace {namespace}",
    ):
        out.print(line, highlight=False, markup=False, soft_wrap=True)


def _say_stdout_namespace(namespace: str, left_out: bool) -> None:
    """Where the manifests went to stdout: what became of the namespace, and the teardown
    (on stderr, so that stdout stays YAML for `| kubectl apply -f -`)."""
    if left_out:
        err.print(
            f"namespace {namespace} is not in this output: other deployments may share it, "
            "and `kubectl delete -f` of this output would delete it with everything in it. "
            f"On a fresh cluster create it first: kubectl create namespace {namespace}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    err.print(
        "teardown: the same render piped to `kubectl delete -f -` (this deployment's objects only)",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
