"""Fault injection: break a real deployment on purpose and check that verify fails with
the right check id and a message that names the cause; healthy deployments pass."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from servebook.backends.local import deployer as local
from servebook.findings import Finding, exit_code
from servebook.recipe.resolve import resolve
from servebook.verify.smoke import Options, Report
from servebook.verify.smoke import run as verify_run
from tests.engine.conftest import Shared, deployed

pytestmark = pytest.mark.engine


def verify(dep: local.Deployment, **kw: Any) -> Report:
    return verify_run(local.view(dep).roles, local.view(dep).claims(), Options(max_tokens=32, **kw))


def failing(rep: Report) -> list[Finding]:
    return [f for f in rep.findings if f.failed]


@pytest.mark.shares("tiny-pd")
def test_tiny_pd_passes_then_a_frozen_then_a_killed_role_fails_verify(shared: Shared) -> None:
    dep = shared.get("tiny-pd")  # frozen and killed below: the next user brings it up anew
    healthy = verify(dep)
    assert exit_code(healthy.findings) == 0, [f.to_dict() for f in failing(healthy)]
    handoff = [f for f in healthy.findings if f.check == "SB302" and f.subject == "decode"]
    assert handoff and handoff[0].evidence["share"] >= handoff[0].evidence["threshold"] > 0

    decode = dep.role("decode")
    os.kill(decode.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        frozen = verify(dep, health_timeout_s=3)
        took = time.monotonic() - t0
    finally:
        os.kill(decode.pid, signal.SIGCONT)
    assert took < 30, f"verify took {took:.0f} s against a frozen role"
    assert exit_code(frozen.findings) == 1
    assert [(f.check, f.subject) for f in failing(frozen) if f.check == "SB305"] == [
        ("SB305", "decode")
    ]
    msg = next(f.message for f in failing(frozen) if f.check == "SB305")
    assert "did not answer /health within 3 s" in msg and "SIGSTOP" in msg
    assert any(f.check == "SB301" and "no request sent" in f.message for f in failing(frozen))

    os.kill(dep.role("prefill").pid, signal.SIGKILL)
    time.sleep(1)
    killed = verify(dep)
    assert exit_code(killed.findings) == 1
    dead = [f for f in failing(killed) if f.check == "SB305"]
    assert [f.subject for f in dead] == ["prefill"]
    assert "not running" in dead[0].message


def test_handoff_that_fails_open_is_a_failure_naming_decode_and_its_share(
    tmp_path: Path,
) -> None:
    plan = resolve("tiny-pd", state_dir=local.state_dir_for("v-open"))
    decode = plan.role("decode")
    i = decode.args.index("--kv-transfer-config") + 1
    cfg = json.loads(decode.args[i])
    elsewhere = tmp_path / "other-storage"
    elsewhere.mkdir()
    cfg["kv_connector_extra_config"]["shared_storage_path"] = str(elsewhere)
    decode.args[i] = json.dumps(cfg)
    with deployed(plan, "v-open") as dep:
        rep = verify(dep)
        # Answers still come back: only the counters show decode recomputed the prompt.
        assert all(not f.failed for f in rep.findings if f.check == "SB301")
        bad = [f for f in failing(rep) if f.check == "SB302"]
        assert [f.subject for f in bad] == ["decode"]
        assert bad[0].evidence["share"] == 0.0
        assert "0.0%" in bad[0].message and "failed open" in bad[0].message
        assert exit_code(rep.findings) == 1


def test_speculation_switched_off_on_the_serving_role_is_not_engaged() -> None:
    plan = resolve("tiny-mixed-spec", state_dir=local.state_dir_for("v-nospec"))
    mixed = plan.role("mixed")
    i = mixed.args.index("--speculative-config")
    del mixed.args[i : i + 2]
    with deployed(plan, "v-nospec") as dep:
        rep = verify(dep)
        bad = [f for f in failing(rep) if f.check == "SB303"]
        assert [f.subject for f in bad] == ["mixed"]
        assert "not configured on this role" in bad[0].message
        assert exit_code(rep.findings) == 1
