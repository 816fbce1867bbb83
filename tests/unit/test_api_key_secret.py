"""Kubernetes API keys (issue 15): `api_key_secret` renders references to a Secret and
never a key, and lint (SB114) flags a key written in clear without printing it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servebook.cli import app
from servebook.lint import loader, rules
from servebook.lint.rules.objects import pod_specs

REPO = Path(__file__).resolve().parents[2]
RENDER = REPO / "tests" / "unit" / "fixtures" / "render"
LINT = REPO / "tests" / "unit" / "fixtures" / "lint" / "sb114-secret-in-clear"
SECRET = "sk-live-123"


def _render(recipe: str, tmp_path: Path, *sets: str) -> Path:
    out = tmp_path / "out"
    args = ["render", recipe, "-f", str(RENDER / recipe / "values.yaml"), "-o", str(out)]
    for s in sets:
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


def _containers(out: Path) -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    for doc in loader.load_paths([out]).documents:
        for pod in pod_specs(doc):
            for _, c in pod.containers():
                found.append((doc.label, c))
    return found


def _ref(container: dict[str, Any], name: str) -> Any:
    for e in container.get("env") or []:
        if e["name"] == name:
            return e.get("valueFrom", {}).get("secretKeyRef")
    return None


@pytest.mark.parametrize("recipe", ["vllm-mixed", "vllm-pd", "tiny-pd"])
def test_api_key_secret_is_referenced_by_every_engine_and_the_router(
    recipe: str, tmp_path: Path
) -> None:
    out = _render(recipe, tmp_path, "api_key_secret=serving-key")
    containers = [(label, c) for label, c in _containers(out) if c["name"] in ("engine", "router")]
    assert containers
    for label, c in containers:
        want = "OPENAI_API_KEY" if c["name"] == "router" else "VLLM_API_KEY"
        assert _ref(c, want) == {"name": "serving-key", "key": "api-key"}, label
        assert not any("api-key" in str(a) for a in c.get("args") or [] if a.startswith("--"))
    found = rules.check(loader.load_paths([out]))
    assert [f for f in found if f.severity.value in ("fail", "warn")] == []
    assert "serving-key" in (out / "PARAMETERS.md").read_text()


def test_name_slash_key_picks_the_key(tmp_path: Path) -> None:
    out = _render("vllm-mixed", tmp_path, "api_key_secret=serving-key/token")
    (engine,) = [c for _, c in _containers(out) if c["name"] == "engine"]
    assert _ref(engine, "VLLM_API_KEY") == {"name": "serving-key", "key": "token"}


def test_unset_renders_no_key_reference(tmp_path: Path) -> None:
    out = _render("vllm-pd", tmp_path)
    text = "".join(p.read_text() for p in out.glob("*.yaml"))
    assert "secretKeyRef" not in text and "API_KEY" not in text


def test_a_bad_secret_name_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "render",
            "vllm-mixed",
            "-f",
            str(RENDER / "vllm-mixed" / "values.yaml"),
            "--set",
            "api_key_secret=Not_A_Name",
            "-o",
            str(tmp_path / "out"),
        ],
    )
    # A usage error (exit 2 from the command line) naming the setting and what it expects.
    assert result.exit_code != 0
    assert "api_key_secret" in str(result.exception)
    assert "Secret's name" in str(result.exception)


@pytest.mark.parametrize("name", ["fail-flag.yaml", "fail-env.yaml"])
def test_lint_flags_a_key_in_clear_without_printing_it(name: str) -> None:
    result = CliRunner().invoke(app, ["lint", str(LINT / name)])
    assert result.exit_code == 1, result.output
    assert "SB114" in result.output
    assert SECRET not in result.output and "hf_abcdef123" not in result.output
    found = rules.check(loader.load_paths([LINT / name]))
    assert all(SECRET not in repr(f) for f in found)
