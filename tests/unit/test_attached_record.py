"""The attached-deployment record (``backends.attached.record``): its store under $SERVEBOOK_HOME,
and the deployment view it yields, found by name like servebook's own deployments."""

from __future__ import annotations

from pathlib import Path

import pytest

from servebook.backends import registry
from servebook.backends.attached.record import (
    AttachedDeployment,
    AttachedReplica,
    AttachedRole,
    read_record,
    record_path,
    remove_record,
    roles_problem,
    url_reach,
    view_of,
    write_record,
)
from servebook.errors import UsageError

SERVER = ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
KV = ["--kv-transfer-config", '{"kv_connector":"ExampleConnector","kv_role":"kv_both"}']


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SERVEBOOK_HOME", str(tmp_path))
    return tmp_path


def _rep(url: str, argv: list[str], unread: str = "") -> AttachedReplica:
    return AttachedReplica(name=url, api_url=url, metrics_url=url, argv=argv, argv_unread=unread)


def pd_record(decode_argv: list[str] | None = None) -> AttachedDeployment:
    return AttachedDeployment(
        name="prod-pd",
        entry="http://127.0.0.1:9000",
        served_model_name="tiny",
        roles=[
            AttachedRole(name="prefill", replicas=[_rep("http://127.0.0.1:8100", SERVER + KV)]),
            AttachedRole(
                name="decode",
                replicas=[
                    _rep(
                        "http://127.0.0.1:8200", SERVER + KV if decode_argv is None else decode_argv
                    ),
                    _rep("http://10.0.0.9:8200", [], unread="another machine (10.0.0.9)"),
                ],
            ),
        ],
    )


def test_record_round_trips_atomically_and_detach_removes_only_it(home: Path) -> None:
    write_record(pd_record())
    path = record_path("prod-pd")
    assert path == home / "deployments" / "prod-pd" / "attached.json"
    dep = read_record("prod-pd")
    assert dep is not None and dep.created and dep.topology == "pd"
    assert [len(r.replicas) for r in dep.roles] == [1, 2]
    assert not list(path.parent.glob(".*.tmp"))
    assert remove_record("prod-pd") is True
    assert read_record("prod-pd") is None and not path.parent.exists()
    assert remove_record("prod-pd") is False


def test_find_and_locate_reach_an_attached_deployment_by_name() -> None:
    write_record(pd_record())
    found = registry.find("prod-pd")
    assert found is not None and found[0].name == "attached" and found[1] == "prod-pd"
    only = registry.find(None)  # the only deployment recorded
    assert only is not None and (only[0].name, only[1]) == ("attached", "prod-pd")
    owner, name = registry.locate("prod-pd")
    with pytest.raises(UsageError, match="never stops it"):
        registry.deployer(owner, name, "stop")


def test_view_names_every_replica_adds_the_router_and_reads_claims_from_argv() -> None:
    spec = ["--speculative-config.method=ngram", "--speculative_config.num_speculative_tokens=3"]
    dep = pd_record(decode_argv=SERVER + KV + spec)
    view = view_of(dep, url_reach(dep))
    assert [r.name for r in view.roles] == ["prefill", "decode", "router"]
    decode = view.role("decode")
    assert decode.all_metrics_urls == ("http://127.0.0.1:8200", "http://10.0.0.9:8200")
    assert decode.all_replica_names == decode.all_metrics_urls
    claims = view.claims()
    assert claims.topology == "pd" and claims.speculative is True
    assert claims.argv_unread == {"decode http://10.0.0.9:8200": "another machine (10.0.0.9)"}
    assert view.plan.speculative == {"method": "ngram", "num_speculative_tokens": 3}
    targets = {t.name: t for t in view.roles}
    assert list(targets["decode"].replica_names) == list(decode.all_metrics_urls)


def test_a_mixed_role_whose_url_is_the_entry_has_no_router() -> None:
    dep = AttachedDeployment(
        name="one",
        entry="http://127.0.0.1:8000/",
        roles=[AttachedRole(name="mixed", replicas=[_rep("http://127.0.0.1:8000", SERVER)])],
    )
    view = view_of(dep, url_reach(dep))
    assert [r.name for r in view.roles] == ["mixed"] and view.claims().topology == "mixed"
    assert view.claims().speculative is False and view.claims().argv_unread == {}


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        (["decode"], "role decode without prefill"),
        (["mixed", "decode"], "mixed beside prefill/decode"),
        (["prefil", "decode"], "role(s) prefil"),
        ([], "no engine role"),
    ],
)
def test_roles_that_make_no_judgeable_deployment_are_named(names: list[str], problem: str) -> None:
    roles = [AttachedRole(name=n, replicas=[_rep("http://h:1", [])]) for n in names]
    assert problem in (roles_problem(roles) or "")
    ok = [AttachedRole(name=n, replicas=[_rep("http://h:1", [])]) for n in ("prefill", "decode")]
    assert roles_problem(ok) is None
