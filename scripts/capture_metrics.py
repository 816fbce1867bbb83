"""Capture real /metrics text from vLLM CPU servers as unit-test fixtures.

Run with the engine installed (scripts/setup.sh):  .venv/bin/python scripts/capture_metrics.py
Writes tests/unit/fixtures/metrics/*.prom: before/after a PD handoff with speculation, a
handoff that fails open (decode reads another storage directory), and a server started
with --disable-log-stats (engine metrics absent).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from servebook import http
from servebook.backends.local import deployer as local
from servebook.recipe.resolve import resolve
from servebook.verify.smoke import long_prompt

OUT = Path(__file__).resolve().parent.parent / "tests" / "unit" / "fixtures" / "metrics"
PREFIX = "vllm-0.32.0-cpu"


def grab(url: str, name: str) -> None:
    text = http.get(url + "/metrics", timeout=10).text
    (OUT / f"{PREFIX}-{name}.prom").write_text(text)
    print(f"wrote {name} ({len(text)} bytes)")


def send(entry: str, prompt: str, max_tokens: int) -> dict[str, object]:
    r = http.post_json(
        entry + "/v1/completions",
        {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        timeout=120,
    )
    body = r.json()
    print("usage", body.get("usage"))
    return dict(body)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    plan = resolve("tiny-pd-spec", state_dir=local.state_dir_for("capture"))
    dep = local.up(plan, name="capture", say=print)
    try:
        grab(dep.role("decode").url, "pd-spec-decode-before")
        grab(dep.role("prefill").url, "pd-spec-prefill-before")
        body = send(dep.entry_url, long_prompt(300), 32)
        (OUT / f"{PREFIX}-pd-spec-probe-usage.json").write_text(json.dumps(body["usage"]))
        grab(dep.role("decode").url, "pd-spec-decode-after")
        grab(dep.role("prefill").url, "pd-spec-prefill-after")
    finally:
        local.down("capture")

    plan = resolve("tiny-pd", state_dir=local.state_dir_for("capture-open"))
    decode = plan.role("decode")
    i = decode.args.index("--kv-transfer-config") + 1
    cfg = json.loads(decode.args[i])
    cfg["kv_connector_extra_config"]["shared_storage_path"] = tempfile.mkdtemp()
    decode.args[i] = json.dumps(cfg)
    dep = local.up(plan, name="capture-open", say=print)
    try:
        grab(dep.role("decode").url, "pd-failopen-decode-before")
        grab(dep.role("prefill").url, "pd-failopen-prefill-before")
        send(dep.entry_url, long_prompt(300), 16)
        grab(dep.role("decode").url, "pd-failopen-decode-after")
        grab(dep.role("prefill").url, "pd-failopen-prefill-after")
    finally:
        local.down("capture-open")

    plan = resolve("tiny-mixed", state_dir=local.state_dir_for("capture-nostats"))
    plan.role("mixed").args.append("--disable-log-stats")
    dep = local.up(plan, name="capture-nostats", say=print)
    try:
        grab(dep.role("mixed").url, "mixed-disable-log-stats")
    finally:
        local.down("capture-nostats")


if __name__ == "__main__":
    sys.exit(main())
