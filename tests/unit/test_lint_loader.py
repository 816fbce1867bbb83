from __future__ import annotations

from pathlib import Path

import pytest

from servebook.errors import UsageError
from servebook.lint.loader import load_paths, parse_yaml, unreadable_findings

FIXTURES = Path(__file__).parent / "fixtures" / "lint"


def test_multi_document_file_keeps_lines_per_value() -> None:
    text = (
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n"
        "---\n"
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: a\n"
        "spec:\n  containers:\n    - name: c\n      image: x:1\n"
    )
    f = parse_yaml(text, "m.yaml")
    assert [d.label for d in f.documents] == ["Namespace/a", "Pod/p"]
    pod = f.documents[1]
    assert pod.line == 6
    assert pod.line_at(("spec", "containers", 0, "image")) == 14
    # A key path with no line of its own falls back to the nearest ancestor.
    assert pod.line_at(("spec", "containers", 0, "missing", 3)) == 13


def test_helm_source_comments_attach_to_their_document() -> None:
    f = parse_yaml(
        (FIXTURES / "third-party" / "production-stack-helm.yaml").read_text(), "out.yaml"
    )
    sources = {d.label: d.helm_source for d in f.documents}
    assert sources["Deployment/vllm-deployment-router"] == (
        "vllm-stack/templates/deployment-router.yaml"
    )
    assert sources["Deployment/vllm-llama3-deployment-vllm"] == (
        "vllm-stack/templates/deployment-vllm-multi.yaml"
    )
    assert len(f.documents) == 7


def test_empty_documents_are_skipped_and_lists_expand() -> None:
    text = (
        "---\n---\n# only a comment\n---\n"
        "apiVersion: v1\nkind: List\nitems:\n"
        "  - apiVersion: v1\n    kind: ConfigMap\n    metadata: {name: one}\n"
        "  - apiVersion: v1\n    kind: ConfigMap\n    metadata:\n      name: two\n"
    )
    f = parse_yaml(text, "list.yaml")
    assert [d.label for d in f.documents] == ["ConfigMap/one", "ConfigMap/two"]
    assert f.documents[1].line_at(("metadata", "name")) == 14


def test_kindless_yaml_is_not_a_kubernetes_object() -> None:
    f = parse_yaml("name: tiny\nparameters: {}\n", "recipe.yaml")
    assert not f.documents[0].is_kubernetes


def test_yaml_syntax_error_names_file_and_line() -> None:
    with pytest.raises(UsageError) as e:
        parse_yaml("apiVersion: v1\nkind: Pod\nmetadata:\n  name: [unclosed\n", "bad.yaml")
    assert str(e.value).startswith("bad.yaml:5:")


def test_missing_path_is_unusable_input(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        load_paths([tmp_path / "nope.yaml"])


def test_directories_recurse_and_skip_unrendered_chart_templates(tmp_path: Path) -> None:
    (tmp_path / "deploy" / "nested").mkdir(parents=True)
    (tmp_path / "deploy" / "a.yaml").write_text("apiVersion: v1\nkind: Namespace\n")
    (tmp_path / "deploy" / "nested" / "b.yml").write_text("name: recipe\n")
    (tmp_path / "deploy" / "README.md").write_text("# hi\n")
    (tmp_path / "deploy" / "notes.txt").write_text("not read")
    chart = tmp_path / "deploy" / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\n")
    (chart / "templates" / "d.yaml").write_text("image: {{ .Values.image }}\n  bad: [")
    lint_set = load_paths([tmp_path / "deploy"])
    names = sorted(Path(f.path).name for f in lint_set.yaml_files)
    assert names == ["Chart.yaml", "a.yaml", "b.yml"]
    assert [Path(m.path).name for m in lint_set.markdown_files] == ["README.md"]


def test_a_file_given_twice_is_read_once(tmp_path: Path) -> None:
    p = tmp_path / "a.yaml"
    p.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")
    assert len(load_paths([p, tmp_path]).yaml_files) == 1


def test_an_empty_directory_is_not_a_silent_pass(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UsageError, match="no YAML, JSON or markdown files"):
        load_paths([tmp_path])


def test_a_file_that_is_not_text_is_recorded_and_the_rest_still_read(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")
    (tmp_path / "weights.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    lint_set = load_paths([tmp_path])
    assert [Path(f.path).name for f in lint_set.yaml_files] == ["a.yaml"]
    [u] = lint_set.unreadable
    assert u.path == str(tmp_path / "weights.json") and "not UTF-8 text" in u.why
    [f] = unreadable_findings(lint_set)
    assert f.check == "SB100" and f.failed and f.evidence["file"] == u.path
