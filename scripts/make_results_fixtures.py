"""Write the results files the report and compare tests read
(``tests/unit/fixtures/results/*/results.json``), deterministically.

Each file is built with servebook's own models (``servebook.results``): provenance, points
judged by ``protocol.judge`` (so validity and reasons are the real ones), server evidence
computed by ``results.evidence.server_evidence`` from Prometheus text in vLLM's metric
names, and aggregates from ``results.aggregate``.  The per-repetition figures are chosen by
hand so the tests can pin hand-computed verdicts:

* ``mixed-tp2`` (A): one TP=2 engine on 2 of a host's 8 H200s, c = 1, 4, 16, 3 reps;
* ``pd-2p2d`` (B): the same model as PD, 2 GPUs prefill + 2 GPUs decode; its c=16 rep 2
  failed 6% of requests (invalid, SB403) and carries an absurd 9999 tok/s that must never
  reach a figure, a line or a ratio;
* ``mixed-tp2-rerun``: A again with another seed, host port and interpreter path; c=1
  has one valid repetition (two windows cut short, SB401);
* ``tiny-pd-spec-cpu``: the built-in tiny PD + ngram recipe on vLLM's CPU build (no
  accelerator count), with a rate level.
* ``trial-mixed-spec`` and ``trial-pd-spec``: ``scripts/make_trial_fixtures.py``.

Run:  .venv/bin/python scripts/make_results_fixtures.py
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servebook.bench.protocol import ProtocolSettings, Thresholds, apply_verdict, judge
from servebook.engines.vllm import SOURCE_EXTERNAL, M
from servebook.files import write_atomic
from servebook.metrics.scrape import snapshot_from_text
from servebook.results.aggregate import aggregate
from servebook.results.evidence import server_evidence
from servebook.results.schema import (
    Accelerator,
    ClientEvidence,
    Latency,
    ModelInfo,
    Point,
    Provenance,
    Results,
    RoleProvenance,
    WindowInfo,
)

OUT = Path(__file__).resolve().parent.parent / "tests" / "unit" / "fixtures" / "results"
WINDOW_S = 60.0

GPU_MODEL = ModelInfo(
    name="meta-llama/Llama-3.1-8B-Instruct",
    config_hash="sha256:0b1f3c1e5a7d9e2f4c6b8a0d2e4f6a8c0e2b4d6f8a0c2e4b6d8f0a2c4e6b8d0f",
    path="/models/llama-3.1-8b-instruct",
)
GPU_HOST = {
    "hostname": "bench-client-0",
    "os": "Linux-6.8.0-45-generic-x86_64-with-glibc2.39",
    "python": "3.11.9",
    "cpu_model": "AMD EPYC 9654 96-Core Processor",
    "cpu_cores": 16,
}
GPU_PACKAGES = {
    "servebook": "0.1.0",
    "aiohttp": "3.10.5",
    "numpy": "2.1.1",
    "tokenizers": "0.20.0",
    "uvloop": "0.20.0",
}
IMAGE = "vllm/vllm-openai:v0.11.0"
PY = "/usr/bin/python3"
SERVER = [PY, "-m", "vllm.entrypoints.openai.api_server"]
GPU_ARGS = [
    "--model",
    GPU_MODEL.path or "",
    "--served-model-name",
    "llama-3.1-8b",
    "--max-model-len",
    "8192",
    "--tensor-parallel-size",
    "2",
    "--gpu-memory-utilization",
    "0.90",
]
KV = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


def workload(input_len: int, output_len: int, seed: int, tokenizer: str) -> dict[str, Any]:
    return {
        "kind": "random",
        "tokenizer": tokenizer,
        "input_len": input_len,
        "input_len_counts": "server-side prompt tokens, special tokens included",
        "output_len": output_len,
        "seed": seed,
        "api": "completions",
    }


# --- server evidence from counters ---------------------------------------------------------


def prom(c: dict[str, float]) -> str:
    """Prometheus text in vLLM's names for the counters ``server_evidence`` reads."""
    lbl = 'model_name="m"'
    lines = [
        f"# TYPE {M.PROMPT_TOKENS[:-6]} counter",
        f"{M.PROMPT_TOKENS}{{{lbl}}} {c['prompt']}",
        f"# TYPE {M.GENERATION_TOKENS[:-6]} counter",
        f"{M.GENERATION_TOKENS}{{{lbl}}} {c['generation']}",
        f"# TYPE {M.REQUEST_SUCCESS[:-6]} counter",
        f'{M.REQUEST_SUCCESS}{{finished_reason="length",{lbl}}} {c["ok"]}',
        f'{M.REQUEST_SUCCESS}{{finished_reason="abort",{lbl}}} {c.get("aborted", 0.0)}',
        f"# TYPE {M.PREEMPTIONS[:-6]} counter",
        f"{M.PREEMPTIONS}{{{lbl}}} {c.get('preemptions', 0.0)}",
    ]
    if "transferred" in c:
        lines += [
            f"# TYPE {M.PROMPT_TOKENS_BY_SOURCE[:-6]} counter",
            f'{M.PROMPT_TOKENS_BY_SOURCE}{{source="{SOURCE_EXTERNAL}",{lbl}}} {c["transferred"]}',
            f'{M.PROMPT_TOKENS_BY_SOURCE}{{source="local_compute",{lbl}}} '
            f"{c['prompt'] - c['transferred']}",
            f"# TYPE {M.EXTERNAL_PREFIX_HITS[:-6]} counter",
            f"{M.EXTERNAL_PREFIX_HITS}{{{lbl}}} {c['transferred']}",
        ]
    if "drafts" in c:
        lines += [
            f"# TYPE {M.SPEC_DRAFT_TOKENS[:-6]} counter",
            f"{M.SPEC_DRAFT_TOKENS}{{{lbl}}} {c['drafts']}",
            f"# TYPE {M.SPEC_ACCEPTED_TOKENS[:-6]} counter",
            f"{M.SPEC_ACCEPTED_TOKENS}{{{lbl}}} {c['accepted']}",
        ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Server:
    roles: tuple[str, ...]
    decode: str | None = None
    handoff: float | None = None  # share of decode's prompt tokens transferred
    spec_acceptance: float | None = None


def evidence(
    srv: Server, requests: int, input_len: int, output_tokens: int, url: str
) -> dict[str, Any]:
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    for i, role in enumerate(srv.roles):
        base = {"prompt": 5000.0 * (i + 1), "generation": 700.0, "ok": 40.0}
        d = {
            "prompt": float(requests * input_len),
            "generation": float(output_tokens) if role != "prefill" else float(requests),
            "ok": float(requests),
        }
        if role == srv.decode and srv.handoff is not None:
            base["transferred"] = 1000.0
            d["transferred"] = round(srv.handoff * d["prompt"])
        if srv.spec_acceptance is not None and role != "prefill":
            base |= {"drafts": 300.0, "accepted": 120.0}
            drafts = float(3 * output_tokens)
            d |= {"drafts": drafts, "accepted": round(srv.spec_acceptance * drafts)}
        after_c = {k: base.get(k, 0.0) + d.get(k, 0.0) for k in set(base) | set(d)}
        before[role] = snapshot_from_text(prom(base), url=f"{url}/{role}/metrics")
        after[role] = snapshot_from_text(prom(after_c), url=f"{url}/{role}/metrics")
    return server_evidence(before, after, decode_role=srv.decode)


# --- points --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rep:
    """One repetition's hand-chosen figures."""

    tok_s: float
    tpot: float  # ms, p50
    ttft: float  # ms, p50
    errors: int = 0
    window_s: float = WINDOW_S


def latency(p50: float, p99_factor: float, n: int) -> Latency:
    return Latency(
        p50=p50, p90=p50 * (1 + (p99_factor - 1) * 0.6), p99=p50 * p99_factor, mean=p50 * 1.05, n=n
    )


def make_point(
    *,
    concurrency: int | None,
    rate: float | None,
    repetition: int,
    rep: Rep,
    output_len: int,
    input_len: int,
    accelerators: int | None,
    server: Server,
    url: str,
    minute: int,
) -> Point:
    req_s = rep.tok_s / output_len
    ok = round(req_s * rep.window_s)
    tokens = round(rep.tok_s * rep.window_s)
    e2e = rep.ttft + rep.tpot * (output_len - 1)
    return Point(
        concurrency=concurrency,
        rate=rate,
        repetition=repetition,
        valid=True,
        requests_ok=ok,
        errors=rep.errors,
        error_samples=["HTTP 503: Service Unavailable"] if rep.errors else [],
        output_tokens_per_s=rep.tok_s,
        output_tokens_per_s_per_accelerator=rep.tok_s / accelerators if accelerators else None,
        requests_per_s=req_s,
        ttft_ms=latency(rep.ttft, 2.0, ok),
        itl_ms=latency(rep.tpot * 0.98, 1.6, ok * (output_len - 1)),
        tpot_ms=latency(rep.tpot, 1.3, ok),
        e2e_ms=latency(e2e, 1.4, ok),
        window=WindowInfo(
            warmup_s=10.0,
            duration_s=rep.window_s,
            requests_scheduled=ok + rep.errors + (concurrency or 1),
            requests_unfinished=concurrency or 1,
        ),
        client=ClientEvidence(
            workers=1, cpu_fraction=0.31, send_lag_p99_ms=0.4, loop_lag_p99_ms=0.9
        ),
        server=evidence(server, ok, input_len, tokens, url),
        started_at=f"2026-03-02T10:{minute:02d}:00+00:00",
        ended_at=f"2026-03-02T10:{minute + 1:02d}:15+00:00",
    )


def judged(point: Point, settings: ProtocolSettings, pd: bool) -> Point:
    level = next(
        lv
        for lv in settings.levels()
        if lv.concurrency == point.concurrency and lv.rate == point.rate
    )
    findings = judge(
        point,
        duration_s=settings.duration_s,
        min_requests=settings.min_requests_for(level),
        thresholds=settings.thresholds,
        pd=pd,
    )
    return apply_verdict(point, findings)


def build(
    *,
    provenance: Provenance,
    settings: ProtocolSettings,
    reps: dict[tuple[int | None, float | None], Sequence[Rep]],
    output_len: int,
    input_len: int,
    server: Server,
    pd: bool,
) -> Results:
    points = []
    minute = 0
    for (conc, rate), rs in reps.items():
        for i, rep in enumerate(rs):
            p = make_point(
                concurrency=conc,
                rate=rate,
                repetition=i,
                rep=rep,
                output_len=output_len,
                input_len=input_len,
                accelerators=provenance.accelerators_used,
                server=server,
                url=str(provenance.target.get("url", "")),
                minute=minute,
            )
            minute += 1
            points.append(judged(p, settings, pd))
    return Results(provenance=provenance, points=points, aggregates=aggregate(points))


def gpu_provenance(
    *,
    recipe: str,
    topology: str,
    roles: list[RoleProvenance],
    accelerators_used: int,
    settings: ProtocolSettings,
    url: str,
    started: str,
) -> Provenance:
    return Provenance(
        servebook_version="0.1.0",
        engine="vllm",
        engine_version="0.11.0",
        model=GPU_MODEL,
        target={"url": url, "api": "completions", "recipe": recipe, "topology": topology},
        roles=roles,
        packages=dict(GPU_PACKAGES),
        accelerator=Accelerator(kind="gpu", model="NVIDIA H200", count=8),
        accelerators_used=accelerators_used,
        host=dict(GPU_HOST),
        protocol=settings.to_dict(),
        workload=workload(1024, 128, settings.seed, GPU_MODEL.path or ""),
        seed=settings.seed,
        started_at=started,
        ended_at=started.replace("T09:", "T10:"),
    )


def role(name: str, argv: list[str], env: dict[str, str] | None = None) -> RoleProvenance:
    return RoleProvenance(
        name=name,
        command=argv,
        env=env or {},
        url=None,
        engine_version="0.11.0" if name != "router" else None,
        image=IMAGE if name != "router" else "lmcache/vllm-router:0.1.17",
    )


def fixtures() -> dict[str, Results]:
    out: dict[str, Results] = {}
    gpu_env = {"VLLM_LOGGING_LEVEL": "INFO", "CUDA_VISIBLE_DEVICES": "0,1"}

    # A: mixed, TP=2 on 2 GPUs.
    s_a = ProtocolSettings(concurrencies=(1, 4, 16), repetitions=3, seed=0)
    mixed = role("mixed", [*SERVER, *GPU_ARGS, "--host", "0.0.0.0", "--port", "8000"], gpu_env)
    out["mixed-tp2"] = build(
        provenance=gpu_provenance(
            recipe="vllm-mixed",
            topology="mixed",
            roles=[mixed],
            accelerators_used=2,
            settings=s_a,
            url="http://10.0.0.5:8000",
            started="2026-03-02T09:00:00+00:00",
        ),
        settings=s_a,
        reps={
            (1, None): [Rep(100, 8.0, 40), Rep(102, 8.1, 41), Rep(98, 7.9, 39)],
            (4, None): [Rep(380, 9.0, 55), Rep(390, 9.2, 57), Rep(370, 8.8, 53)],
            (16, None): [Rep(1200, 12.0, 120), Rep(1230, 12.3, 125), Rep(1170, 11.7, 115)],
        },
        output_len=128,
        input_len=1024,
        server=Server(("mixed",)),
        pd=False,
    )

    # B: PD, 2 GPUs prefill + 2 GPUs decode, behind a router.
    s_b = ProtocolSettings(
        concurrencies=(1, 4, 16),
        repetitions=3,
        seed=0,
        thresholds=Thresholds(min_handoff_share=0.5),
    )
    kv = ["--kv-transfer-config", KV]
    out["pd-2p2d"] = build(
        provenance=gpu_provenance(
            recipe="vllm-pd",
            topology="pd",
            roles=[
                role(
                    "prefill",
                    [*SERVER, *GPU_ARGS, *kv, "--host", "0.0.0.0", "--port", "8100"],
                    gpu_env,
                ),
                role(
                    "decode",
                    [*SERVER, *GPU_ARGS, *kv, "--host", "0.0.0.0", "--port", "8200"],
                    {**gpu_env, "CUDA_VISIBLE_DEVICES": "2,3"},
                ),
                role(
                    "router",
                    [
                        "vllm-router",
                        "--vllm-pd-disaggregation",
                        "--prefill",
                        "http://10.0.0.6:8100",
                        "--decode",
                        "http://10.0.0.7:8200",
                        "--port",
                        "8000",
                    ],
                ),
            ],
            accelerators_used=4,
            settings=s_b,
            url="http://10.0.0.6:8000",
            started="2026-03-02T09:30:00+00:00",
        ),
        settings=s_b,
        reps={
            (1, None): [Rep(110, 7.0, 60), Rep(112, 7.1, 62), Rep(108, 6.9, 58)],
            (4, None): [Rep(385, 9.1, 70), Rep(395, 9.3, 72), Rep(375, 8.9, 68)],
            (16, None): [
                Rep(1500, 10.0, 150),
                Rep(1540, 10.2, 155),
                Rep(9999, 30.0, 900, errors=300),  # 300 of ~5k failed: SB403
            ],
        },
        output_len=128,
        input_len=1024,
        server=Server(("decode", "prefill"), decode="decode", handoff=0.97),
        pd=True,
    )

    # A again: another seed, another port and interpreter path; two c=1 windows cut short.
    s_r = ProtocolSettings(concurrencies=(1, 4, 16), repetitions=3, seed=1)
    mixed_r = role(
        "mixed",
        [
            "/opt/venv/bin/python",
            *SERVER[1:],
            *GPU_ARGS,
            "--host",
            "10.0.0.5",
            "--port",
            "8100",
        ],
        {**gpu_env, "CUDA_VISIBLE_DEVICES": "4,5"},
    )
    out["mixed-tp2-rerun"] = build(
        provenance=gpu_provenance(
            recipe="vllm-mixed",
            topology="mixed",
            roles=[mixed_r],
            accelerators_used=2,
            settings=s_r,
            url="http://10.0.0.5:8100",
            started="2026-03-03T09:00:00+00:00",
        ),
        settings=s_r,
        reps={
            (1, None): [
                Rep(101, 8.0, 40),
                Rep(99, 8.1, 41, window_s=30.0),
                Rep(100, 7.9, 40, window_s=30.0),
            ],
            (4, None): [Rep(382, 9.1, 55), Rep(388, 9.0, 56), Rep(376, 8.9, 54)],
            (16, None): [Rep(1195, 12.1, 121), Rep(1225, 12.2, 124), Rep(1180, 11.8, 117)],
        },
        output_len=128,
        input_len=1024,
        server=Server(("mixed",)),
        pd=False,
    )

    # The built-in tiny PD + ngram recipe on vLLM's CPU build: no accelerator count.
    s_c = ProtocolSettings(
        concurrencies=(1, 2),
        rates=(0.5,),
        repetitions=2,
        seed=0,
        duration_s=30.0,
        thresholds=Thresholds(min_handoff_share=0.5),
    )
    home = "/root/.servebook/deployments/tiny-pd-spec"
    tiny = "/root/.servebook/models/tiny-llama"
    cpu_args = [
        "--model",
        tiny,
        "--served-model-name",
        "tiny",
        "--enforce-eager",
        "--dtype",
        "bfloat16",
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}',
        "--kv-transfer-config",
        '{"kv_connector":"ExampleConnector","kv_role":"kv_both",'
        f'"kv_connector_extra_config":{{"shared_storage_path":"{home}/kv"}}}}',
    ]
    cpu_env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": "<redacted>"}
    venv_py = "/work/main/.venv/bin/python"

    def cpu_role(name: str, port: int) -> RoleProvenance:
        return RoleProvenance(
            name=name,
            command=[venv_py, *SERVER[1:], *cpu_args, "--host", "127.0.0.1", "--port", str(port)],
            env=cpu_env,
            url=f"http://127.0.0.1:{port}",
            engine_version="0.32.0",
        )

    out["tiny-pd-spec-cpu"] = build(
        provenance=Provenance(
            servebook_version="0.1.0",
            engine="vllm",
            engine_version="0.32.0",
            model=ModelInfo(
                name="tiny",
                config_hash="sha256:5c0de7a1c0ffee0ddba11c0ffee5eed5c0de7a1c0ffee0ddba11c0ffee5eed5",
                path=tiny,
            ),
            target={
                "url": "http://127.0.0.1:18000",
                "api": "completions",
                "recipe": "tiny-pd-spec",
                "topology": "pd",
                "deployment": "tiny-pd-spec",
            },
            roles=[
                cpu_role("prefill", 18001),
                cpu_role("decode", 18002),
                RoleProvenance(
                    name="router",
                    command=[venv_py, "-m", "servebook.backends.router", "--port", "18000"],
                ),
            ],
            packages={
                "servebook": "0.1.0",
                "vllm-cpu": "0.32.0",
                "torch": "2.13.0+cpu",
                "aiohttp": "3.10.5",
                "numpy": "2.1.1",
            },
            accelerator=Accelerator(
                kind="cpu",
                model="Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
                count=2,
                cores=2,
            ),
            accelerators_used=None,
            host={
                "hostname": "dev-box",
                "os": "Linux-6.1.0-x86_64-with-glibc2.36",
                "python": "3.11.2",
                "cpu_model": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
                "cpu_cores": 2,
            },
            protocol=s_c.to_dict(),
            workload=workload(200, 16, 0, tiny),
            seed=0,
            started_at="2026-03-04T08:00:00+00:00",
            ended_at="2026-03-04T08:20:00+00:00",
        ),
        settings=s_c,
        reps={
            (1, None): [Rep(20.1, 45.0, 180), Rep(19.7, 46.0, 185)],
            (2, None): [Rep(35.2, 52.0, 240), Rep(36.0, 51.0, 236)],
            (None, 0.5): [Rep(10.1, 44.0, 175), Rep(9.9, 45.0, 178)],
        },
        output_len=16,
        input_len=200,
        server=Server(("decode", "prefill"), decode="decode", handoff=0.9, spec_acceptance=0.42),
        pd=True,
    )
    return out


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else OUT
    for name, results in fixtures().items():
        write_atomic(out / name / "results.json", results.to_json() + "\n")
        valid = sum(p.valid for p in results.points)
        print(f"{out / name / 'results.json'}: {valid}/{len(results.points)} valid points")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
