"""tiny-mixed on real vLLM with a key required: the engine gets it in its environment, not on
its command line; verify and bench pass with the key from the environment, and without it
both exit 2 saying the server requires a key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from servebook import auth, http
from servebook.backends.local import deployer as local
from servebook.recipe.resolve import resolve
from servebook.results.schema import RESULTS_NAME
from servebook.results.store import load_results
from tests.engine.conftest import deployed

pytestmark = pytest.mark.engine

KEY = "sk-engine-test-7c1f09e2b4"
CATALOG = Path(__file__).parents[2] / "src" / "servebook" / "recipe" / "catalog"


def servebook(*args: str, key: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in auth.ENV_VARS}
    if key is not None:
        env["OPENAI_API_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "servebook", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "COLUMNS": "200"},
    )


def test_tiny_mixed_with_a_key_required_serves_only_with_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = tmp_path / "tiny-mixed-key.yaml"
    recipe.write_text((CATALOG / "tiny-mixed.yaml").read_text() + "require_api_key: true\n")
    plan = resolve(str(recipe), state_dir=local.state_dir_for("k-mixed"))
    assert plan.require_api_key
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setattr(auth, "_given", None)
    with deployed(plan, "k-mixed") as dep:
        engine = dep.role("mixed")
        cmdline = Path(f"/proc/{engine.pid}/cmdline").read_bytes().decode()
        environ = Path(f"/proc/{engine.pid}/environ").read_bytes().decode()
        assert KEY not in cmdline  # `ps` shows nothing
        assert f"VLLM_API_KEY={KEY}" in environ.split("\0")
        assert KEY not in Path(dep.state_dir, local.STATE_FILE).read_text()
        # The server is protected: a request without the key is refused.
        assert http.get(engine.url + "/v1/models", timeout=10).status == 401

        ok = servebook("verify", "k-mixed", key=KEY)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        out = tmp_path / "sweep"
        sweep = [
            "bench",
            "k-mixed",
            "--concurrency",
            "1",
            "--repetitions",
            "1",
            "--precision",
            "off",
            "--duration",
            "4s",
            "--warmup",
            "1s",
            "--min-requests",
            "3",
            "--input-len",
            "64",
            "--output-len",
            "8",
            "--max-client-lag-ms",
            "250",
            "--min-achieved-concurrency",
            "0.5",
        ]
        ok = servebook(*sweep, "-o", str(out), key=KEY)
        assert ok.returncode == 0, ok.stdout + ok.stderr

        for args in (["verify", "k-mixed"], [*sweep, "-o", str(tmp_path / "nokey")]):
            refused = servebook(*args, key=None)
            assert refused.returncode == 2, refused.stdout + refused.stderr
            assert auth.MISSING in " ".join(refused.stderr.split())
            assert KEY not in refused.stdout + refused.stderr
        assert not (tmp_path / "nokey" / RESULTS_NAME).exists()

    res = load_results(out / RESULTS_NAME)
    assert [p.valid for p in res.points] == [True]
    assert KEY not in (out / RESULTS_NAME).read_text()
    # The key never entered the record: the engine's recorded environment is the recipe's.
    mixed = next(r for r in res.provenance.roles if r.name == "mixed")
    assert "VLLM_API_KEY" not in mixed.env
