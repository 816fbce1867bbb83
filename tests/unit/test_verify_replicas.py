"""verify's registered checks (``verify.rules``) over real vLLM CPU counters: every replica
judged on its own, claims read from each engine's command line, KV failure counters."""

from __future__ import annotations

from pathlib import Path

from servebook.deployment.view import Claims, RoleView
from servebook.findings import Severity
from servebook.metrics.scrape import Snapshot, merge_replicas, snapshot_from_text, split_replicas
from servebook.verify import rules as R
from servebook.verify.checks import Window

FIX = Path(__file__).parent / "fixtures" / "metrics"
PROBE = 917  # vllm-0.32.0-cpu-pd-spec-probe-usage.json: the probe both windows served


def snap(name: str, extra: str = "") -> Snapshot:
    text = (FIX / f"vllm-0.32.0-cpu-{name}.prom").read_text()
    return snapshot_from_text(text + extra, url=f"http://{name}")


def claims(topology: str = "pd", speculative: bool = False, **kw: object) -> Claims:
    return Claims(topology, speculative, "tiny", "http://router", **kw)  # type: ignore[arg-type]


def two_decode_replicas(second: str = "pd-failopen") -> Window:
    """Decode with two replicas: one from a working PD pair, one from a pair whose handoff
    failed open (decode started without a connector); prefill likewise two."""

    def both(role: str, edge: str) -> Snapshot:
        return merge_replicas([snap(f"pd-spec-{role}-{edge}"), snap(f"{second}-{role}-{edge}")])

    return Window(
        before={r: both(r, "before") for r in ("prefill", "decode")},
        after={r: both(r, "after") for r in ("prefill", "decode")},
        prompt_tokens=[7, PROBE, PROBE],
        replica_names={"decode": ["pod-a", "pod-b"], "prefill": ["pod-p", "pod-q"]},
    )


def test_split_replicas_undoes_the_merge_and_keeps_each_url() -> None:
    merged = merge_replicas([snap("pd-spec-decode-after"), snap("pd-failopen-decode-after")])
    a, b = split_replicas(merged)
    assert (a.url, b.url) == ("http://pd-spec-decode-after", "http://pd-failopen-decode-after")
    assert a.samples == snap("pd-spec-decode-after").samples
    assert split_replicas(a) == [a]


def test_one_decode_replica_failing_open_among_two_fails_under_its_own_name() -> None:
    found = {f.subject: f for f in R.handoff(claims(), two_decode_replicas())}
    assert found["decode pod-a"].severity is Severity.PASS
    assert found["decode pod-b"].severity is Severity.FAIL
    assert "failed open" in found["decode pod-b"].message
    assert found["decode pod-b"].evidence["transferred_tokens"] == 0
    # the sum of both replicas would have hidden it: 896 of 1834 tokens, about half
    assert "decode" not in found and found["prefill"].severity is Severity.PASS


def test_two_working_replicas_both_pass() -> None:
    found = R.handoff(claims(), two_decode_replicas(second="pd-spec"))
    decode = [f for f in found if f.subject.startswith("decode ")]
    assert [f.severity for f in decode] == [Severity.PASS, Severity.PASS]


def test_a_replica_that_served_none_of_verifys_requests_is_not_passed() -> None:
    idle = merge_replicas([snap("pd-spec-decode-after"), snap("pd-spec-decode-after")])
    w = two_decode_replicas(second="pd-spec")
    w = Window(
        before={
            **w.before,
            "decode": merge_replicas([snap("pd-spec-decode-before"), snap("pd-spec-decode-after")]),
        },
        after={**w.after, "decode": idle},
        prompt_tokens=w.prompt_tokens,
        replica_names=w.replica_names,
    )
    found = {f.subject: f for f in R.handoff(claims(), w)}
    assert found["decode pod-b"].severity is Severity.FAIL
    assert "counted no prompt tokens" in found["decode pod-b"].message


def test_metrics_present_names_the_replica_whose_url_has_no_engine_counters() -> None:
    router_like = snapshot_from_text(
        "# HELP vllm:current_qps QPS\n# TYPE vllm:current_qps gauge\nvllm:current_qps 0.0\n",
        url="http://router:8000/metrics",
    )
    merged = merge_replicas([snap("pd-spec-decode-before"), router_like])
    w = Window(
        before={"decode": merged}, after={"decode": merged}, replica_names={"decode": ["a", "b"]}
    )
    found = {f.subject: f for f in R.metrics_present(claims(), w)}
    assert found["decode a"].severity is Severity.PASS
    assert found["decode b"].severity is Severity.FAIL
    assert found["decode b"].evidence["url"] == "http://router:8000/metrics"


SERVE = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
KV = ["--kv_transfer_config", '{"kv_connector":"ExampleConnector","kv_role":"kv_both"}']


def test_a_connector_on_one_role_and_not_the_other_is_named() -> None:
    targets = [
        RoleView("prefill", "engine", "http://p", argv=[*SERVE, *KV]),
        RoleView("decode", "engine", "http://d", argv=SERVE),
        RoleView("router", "router", "http://r"),
    ]
    [f] = R.connector_on_every_engine(claims(), targets)
    assert f.severity is Severity.FAIL and "no --kv-transfer-config on decode" in f.message
    targets[1] = RoleView(
        "decode",
        "engine",
        "http://d",
        argv=[*SERVE, "--kv-transfer-config.kv_connector", "ExampleConnector"],
    )
    [g] = R.connector_on_every_engine(claims(), targets)
    assert g.severity is Severity.PASS and "ExampleConnector on prefill, decode" in g.message
    assert R.connector_on_every_engine(claims("mixed"), targets) == []


def test_replicas_of_one_role_are_compared_each_by_its_own_command_line() -> None:
    decode = RoleView(
        "decode",
        "engine",
        "http://d1",
        argv=[*SERVE, *KV],
        replica_metrics_urls=["http://d2"],
        replica_names=["d1", "d2"],
        replica_argv=[[*SERVE, *KV], SERVE],
    )
    targets = [RoleView("prefill", "engine", "http://p", argv=[*SERVE, *KV]), decode]
    [f] = R.connector_on_every_engine(claims(), targets)
    assert f.severity is Severity.FAIL and "on decode d2" in f.message


def test_claims_not_determined_are_said_never_assumed() -> None:
    c = claims(argv_unread={"decode http://10.0.0.9:8200": "another machine"})
    [f] = R.claims_read(c, [])
    assert f.severity is Severity.WARN and "not determined: another machine" in f.message
    assert R.claims_read(claims(), []) == []


NIXL = (
    "# HELP vllm:nixl_num_failed_transfers Number of failed NIXL KV Cache transfers.\n"
    "# TYPE vllm:nixl_num_failed_transfers counter\n"
    'vllm:nixl_num_failed_transfers_total{{engine="0",model_name="tiny"}} {n}\n'
    'vllm:nixl_num_failed_transfers_created{{engine="0",model_name="tiny"}} 1.7645e+09\n'
)


def test_kv_failure_counters_must_stay_flat_and_created_is_no_value() -> None:
    def w(before: int, after: int) -> Window:
        return Window(
            before={
                "prefill": snap("pd-spec-prefill-before"),
                "decode": snap("pd-spec-decode-before", NIXL.format(n=before)),
            },
            after={
                "prefill": snap("pd-spec-prefill-after"),
                "decode": snap("pd-spec-decode-after", NIXL.format(n=after)),
            },
        )

    [flat] = R.kv_failures_flat(claims(), w(2, 2))  # prefill exports none: nothing to read
    assert flat.subject == "decode" and flat.severity is Severity.PASS
    [grew] = R.kv_failures_flat(claims(), w(2, 3))
    assert grew.severity is Severity.FAIL and "nixl_num_failed_transfers +1" in grew.message
    assert not any(n.endswith("_created") for n in w(0, 0).after["decode"].samples)


def test_speculation_is_judged_on_every_decoding_replica() -> None:
    w = two_decode_replicas(second="pd-failopen")
    found = {f.subject: f.severity for f in R.speculation(claims(speculative=True), w)}
    assert set(found) == {"decode pod-a", "decode pod-b"}
    assert found["decode pod-a"] is Severity.PASS
    assert R.speculation(claims(speculative=False), w) == []
