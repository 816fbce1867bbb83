"""Every lint fixture, and exactly the findings it must produce.

Failing fixtures name the (check, severity) pairs they must raise, no more and no fewer;
passing fixtures must produce nothing at all.  The field-notes fixtures are the broken
manifests from ``reference/field-notes.md`` rebuilt; ``third-party/`` holds llm-d,
vLLM production-stack (Helm output) and NVIDIA Dynamo layouts.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from servebook.findings import Check, Finding
from servebook.lint import docs, loader, rules
from servebook.lint.rules.registry import DOCUMENT_RULES, ENGINE_RULES, PAIR_RULES, SET_RULES

FIXTURES = Path(__file__).parent / "fixtures" / "lint"

EXPECTED: dict[str, list[tuple[str, str]]] = {
    # The field notes, rebuilt.
    "field-notes/node-placeholder.yaml": [("SB101", "fail")],
    "field-notes/model-dir-placeholder.yaml": [("SB101", "fail")],
    "field-notes/unpinned-server-worker.yaml": [("SB103", "fail"), ("SB103", "fail")],
    "field-notes/directory-or-create-probe.yaml": [("SB104", "fail")],
    "field-notes/pd-spec-decode-only.yaml": [("SB105", "fail")],
    "field-notes/duplicate-flag.yaml": [("SB108", "fail")],
    "field-notes/namespace-created-by-none.yaml": [("SB109", "warn")],
    "field-notes/image-header-comment.yaml": [("SB110", "fail")],
    # One directory per rule: fail-* raise exactly these, pass* raise nothing.
    "sb101-placeholder/fail-placeholders.yaml": [("SB101", "fail")] * 4,
    "sb101-placeholder/fail-recipe.yaml": [("SB101", "fail")] * 2,
    "sb101-placeholder/pass-false-positives.yaml": [],
    "sb101-placeholder/pass-recipe.yaml": [],
    "sb102-label-value/fail.yaml": [("SB102", "fail")] * 4,
    "sb102-label-value/pass.yaml": [],
    "sb103-hostpath-pinning/fail-lws.yaml": [("SB103", "fail")] * 2,
    "sb103-hostpath-pinning/fail-affinity-two-nodes.yaml": [("SB103", "fail")] * 2,
    "sb103-hostpath-pinning/pass.yaml": [],
    "sb103-hostpath-pinning/pass-node-list.yaml": [],
    "sb103-hostpath-pinning/fail-node-list-no-anti-affinity.yaml": [("SB103", "fail")],
    "sb103-hostpath-pinning/fail-lws-worker-unpinned.yaml": [("SB103", "fail")],
    "sb104-hostpath-create/fail.yaml": [("SB104", "fail"), ("SB104", "warn")],
    "sb104-hostpath-create/pass.yaml": [],
    "sb105-pd-speculative/fail-differ.yaml": [("SB105", "fail")],
    "sb105-pd-speculative/pass-identical.yaml": [],
    "sb106-pd-connector/fail.yaml": [("SB106", "fail")] * 2,
    "sb106-pd-connector/pass.yaml": [],
    "sb107-pd-settings/fail.yaml": [("SB107", "fail")] * 5,
    "sb107-pd-settings/pass-nixl-hetero-tp.yaml": [],
    "sb108-duplicate-flag/fail.yaml": [("SB108", "fail")] * 4,
    "sb108-duplicate-flag/pass.yaml": [],
    "sb109-namespace/fail.yaml": [("SB109", "warn")],
    "sb109-namespace/pass.yaml": [],
    "sb110-image/fail-recipe-description.yaml": [("SB110", "fail")],
    "sb110-image/readme-stale": [("SB110", "fail")],
    "sb110-image/readme-current": [],
    "sb111-engine-json/fail.yaml": [("SB111", "fail")] * 2,
    "sb111-engine-json/pass.yaml": [],
    "sb112-kv-over-tcp/fail.yaml": [("SB112", "warn")],
    "sb112-kv-over-tcp/fail-libfabric-tcp.yaml": [("SB112", "warn")],
    "sb112-kv-over-tcp/pass.yaml": [],
    "sb113-group-members/pass.yaml": [],
    "sb113-group-members/fail.yaml": [("SB113", "fail")],
    "sb113-group-members/fail-not-headless.yaml": [("SB113", "fail")],
    "sb113-group-members/fail-start-rank.yaml": [("SB113", "fail")],
    "sb114-secret-in-clear/fail-flag.yaml": [("SB114", "fail")] * 3,
    "sb114-secret-in-clear/fail-env.yaml": [("SB114", "fail")],
    "sb114-secret-in-clear/pass.yaml": [],
    # The controller's template is information; the Helm template beside it was not checked.
    "sb115-template/fail-controller-template.yaml": [("SB115", "info"), ("SB115", "error")],
    "sb115-template/pass.yaml": [],
    "sb116-unbounded-wait/fail.yaml": [("SB116", "fail")] * 2,
    "sb116-unbounded-wait/pass.yaml": [],
    "sb117-script-flags/fail.yaml": [("SB117", "warn")],
    "sb117-script-flags/pass.yaml": [],
    "docs/fail-unclosed-fence.md": [("SB120", "fail")],
    "docs/fail-alternatives.md": [("SB121", "fail")],
    "docs/fail-curl.md": [("SB122", "fail")] * 2,
    "docs/pass.md": [],
    # Third-party layouts.
    # Its UCX_TLS (cuda_ipc,cuda_copy,tcp) moves PD's KV over TCP: a true SB112.
    "third-party/llm-d-pd-helm.yaml": [("SB112", "warn")],
    "third-party/production-stack-helm.yaml": [],
    "third-party/dynamo-pd-fail.yaml": [("SB107", "fail")],
}


def lint(path: Path) -> list[Finding]:
    lint_set = loader.load_paths([path])
    return rules.check(lint_set) + docs.check(lint_set.markdown_files)


def test_every_fixture_file_is_listed() -> None:
    on_disk = {
        str(p.relative_to(FIXTURES))
        for p in FIXTURES.rglob("*")
        if p.is_file()
        and "sb110-image/readme-" not in str(p)
        # The field corpora are scored by benchmarks/lint_corpus.py (test_lint_corpus.py).
        and not str(p.relative_to(FIXTURES)).startswith(("corpus/", "heldout/"))
    }
    listed = {k for k in EXPECTED if not k.startswith("sb110-image/readme-")}
    assert on_disk == listed


def test_every_lint_check_has_a_failing_and_a_passing_fixture() -> None:
    kinds = (DOCUMENT_RULES, ENGINE_RULES, PAIR_RULES, SET_RULES)
    checks = [c for kind in kinds for c, _ in kind]
    checks += [v for v in vars(docs).values() if isinstance(v, Check)]
    assert len(checks) >= 17
    failing = {check for expected in EXPECTED.values() for check, _ in expected}
    passing_dirs = {k.split("/")[0] for k, v in EXPECTED.items() if not v}
    for c in checks:
        assert c.id in failing, f"{c.id} has no failing fixture"
        home = "docs" if c.id.startswith("SB12") else c.id.lower()
        assert any(d.startswith(home) for d in passing_dirs), f"{c.id} has no passing fixture"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_produces_exactly_its_findings(name: str) -> None:
    findings = lint(FIXTURES / name)
    got = Counter((f.check, f.severity.value) for f in findings)
    detail = "\n".join(f"{f.check} {f.severity.value} {f.subject}: {f.message}" for f in findings)
    assert got == Counter(EXPECTED[name]), detail
