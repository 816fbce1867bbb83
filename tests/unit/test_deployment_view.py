"""The deployment contract (``servebook.deployment``): a view survives its trip to a load
agent elsewhere field for field, and a replica has one name by every road (the view, the
builder, verify's per-replica checks, bench's per-replica evidence)."""

from __future__ import annotations

import dataclasses

from servebook.deployment.reach import Address, Reach, Record, ReplicaRecord, RoleRecord, build
from servebook.deployment.view import Claims, DeploymentView, RoleView, replica_names
from servebook.metrics.scrape import merge_replicas, snapshot_from_text
from servebook.recipe.resolve import resolve
from servebook.results.evidence import replica_evidence
from servebook.verify.checks import Window
from servebook.verify.rules import replica_windows

CALLABLES = {"alive", "describe", "log"}  # this process's own: never travel
METRICS = 'vllm:prompt_tokens_total{{engine="0",model_name="tiny"}} {n}\n'


def every_field() -> DeploymentView:
    """A view where no field holds its default."""
    plan = resolve("tiny-pd", [], [])
    roles = [
        RoleView(
            name="decode",
            kind="engine",
            api_url="http://d0:8200",
            metrics_url="http://d0:9200",
            argv=["python", "-m", "vllm", "--port", "8200"],
            env={"VLLM_X": "1"},
            alive=lambda: True,
            describe=lambda: "Pod d0",
            log=lambda: "log",
            replica_metrics_urls=("http://d1:8200",),
            replica_names=("pod-d0", "pod-d1"),
            replica_argv=(("python", "-m", "vllm", "a"), ("python", "-m", "vllm", "b")),
        ),
        RoleView("router", "router", "http://r:8000", "http://r:9000"),
    ]
    return DeploymentView(
        name="dep",
        backend="attached (kubernetes)",
        recipe="attached (llm-d)",
        plan=plan,
        served_model_name="tiny",
        entry_url="http://r:8000",
        roles=roles,
        local_model_dir="/models/tiny",
        accelerators=4,
        claimed=Claims("pd", True, "tiny", "http://r:8000", "rdma", {"decode pod-d1": "why"}),
        route="cluster-service",
        route_detail="from the Job",
    )


def data(view: DeploymentView) -> dict[str, object]:
    """Every field of the view and its roles but the callables."""
    out = {f.name: getattr(view, f.name) for f in dataclasses.fields(view) if f.name != "roles"}
    out["plan"] = view.plan.model_dump(mode="json")
    out["roles"] = [
        {
            f.name: tuple(map(tuple, v)) if f.name == "replica_argv" else v
            for f in dataclasses.fields(r)
            if f.name not in CALLABLES
            for v in [getattr(r, f.name)]
        }
        for r in view.roles
    ]
    for r in out["roles"]:
        r["argv"], r["replica_metrics_urls"] = list(r["argv"]), tuple(r["replica_metrics_urls"])
        r["replica_names"] = tuple(r["replica_names"])
    return out


def test_the_doc_round_trip_keeps_every_field() -> None:
    view = every_field()
    doc = view.to_doc()
    fields = {f.name for f in dataclasses.fields(DeploymentView)}
    assert set(doc) == fields
    assert set(doc["roles"][0]) == {f.name for f in dataclasses.fields(RoleView)} - CALLABLES
    back = DeploymentView.from_doc(doc)
    assert data(back) == data(view)
    assert back.to_doc() == doc


def test_from_doc_dials_every_url_through_the_readers_address() -> None:
    def address(url: str) -> str:
        return url.replace("http://", "http://via-")

    back = DeploymentView.from_doc(every_field().to_doc(), address)
    decode = back.role("decode")
    assert back.entry_url == "http://via-r:8000" == back.claims().entry_url
    assert decode.all_metrics_urls == ("http://via-d0:9200", "http://via-d1:8200")
    assert decode.api_url == "http://via-d0:8200"


def test_one_replica_naming_rule_by_every_road() -> None:
    """Replicas named by their place keep those names; unnamed, ``ROLE[i]``; a role of one
    is the role: the view, the builder, verify's subjects and bench's evidence agree."""
    assert replica_names("decode", (), 1) == ("decode",)
    assert replica_names("decode", (), 2) == ("decode[0]", "decode[1]")
    assert replica_names("decode", ("a", "b"), 2) == ("a", "b")

    plan = resolve("tiny-pd", [], [])
    for given in (("", ""), ("pod-a", "pod-b")):
        record = Record(
            "dep",
            "local",
            "tiny-pd",
            plan,
            "tiny",
            [RoleRecord("decode", "engine", [ReplicaRecord(n) for n in given])],
            entry_role="decode",
        )
        reach = Reach("direct", {"decode": [Address("http://a"), Address("http://b")]})
        role = build(record, reach).role("decode")
        names = role.all_replica_names
        assert names == (("pod-a", "pod-b") if given[0] else ("decode[0]", "decode[1]"))
        subjects = [r.subject for r in role.replicas()]
        assert subjects == (["decode pod-a", "decode pod-b"] if given[0] else list(names))

        snaps = [snapshot_from_text(METRICS.format(n=n)) for n in (1, 2)]
        merged = merge_replicas(snaps)
        given_names = {"decode": list(given) if given[0] else []}
        w = Window({"decode": merged}, {"decode": merged}, replica_names=given_names)
        assert [s for s, _ in replica_windows(w, "decode")] == subjects
        ev = replica_evidence({"decode": merged}, {"decode": merged}, None, {})
        if not given[0]:  # bench's evidence with no names given names them by the rule
            assert list(ev["decode"]) == list(names)
