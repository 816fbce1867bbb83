"""``servebook.kube.stacks``: the seven stacks' Pods (tests/unit/fixtures/attach, each
file citing where its shapes come from) are recognised by their own labels, every replica
found with its engine's port, its counters' port and its argv; an unknown labelling is
refused naming the explicit flags, which attach it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from servebook.engines.cmdline import parse_argv
from servebook.errors import UsageError
from servebook.kube import attach_argv, stacks
from tests.unit.conftest import stack_objects


def found(name: str, ns: str, **kw: Any) -> stacks.Found:
    return stacks.discover(ns, stack_objects(name), **kw)


def ports(f: stacks.Found) -> dict[str, list[tuple[str, int, int, str]]]:
    """role -> [(node, api port, metrics port, metrics scheme+path)] per replica."""
    return {
        r.name: [
            (p.node, p.api.port, p.metrics.port, f"{p.metrics.scheme}:{p.metrics.path}")
            for p in r.replicas
        ]
        for r in f.roles
    }


def connector(replica: stacks.Replica) -> str | None:
    cmd = parse_argv(replica.argv)
    assert cmd is not None, replica.argv
    config, err = cmd.json_value("--kv-transfer-config")
    assert err is None
    return None if config is None else config.get("kv_connector")


def test_llm_d_decode_engine_is_read_behind_the_routing_proxy_every_replica() -> None:
    f = found("llm-d", "llm-d")
    assert f.stack == "llm-d" and f.topology == "pd"
    assert ports(f) == {
        "prefill": [("gpu-node-1", 8000, 8000, "http:/metrics")],
        "decode": [
            ("gpu-node-2", 8200, 8200, "http:/metrics"),
            ("gpu-node-3", 8200, 8200, "http:/metrics"),
        ],
    }
    decode = f.roles[1]
    assert decode.selector == "llm-d.ai/role=decode"
    assert all(
        "routing-proxy on 8000 proxies to 8200" in " ".join(p.notes) for p in decode.replicas
    )
    assert {connector(p) for r in f.roles for p in r.replicas} == {"NixlConnector"}
    assert f.entry is not None
    assert (f.entry.service, f.entry.port, f.entry.target_port) == (
        "infra-sim-inference-gateway-istio",
        80,
        80,
    )
    assert f.undetermined() == []


def test_dynamo_older_labels_counters_on_the_system_port() -> None:
    f = found("dynamo", "dynamo")
    assert f.stack == "dynamo" and f.topology == "pd"
    assert ports(f) == {
        "prefill": [("gpu-node-1", 9090, 9090, "http:/metrics")],
        "decode": [("gpu-node-2", 9090, 9090, "http:/metrics")],
    }
    assert f.roles[1].selector == (
        "nvidia.com/dynamo-component-type=worker,nvidia.com/dynamo-sub-component-type=decode,"
        "nvidia.com/dynamo-graph-deployment-name=vllm-disagg"
    )
    # the sh -c string of the prefill worker and the plain argv of decode read alike
    prefill, decode = (r.replicas[0] for r in f.roles)
    assert prefill.form == "sh -c script" and decode.form == "argv"
    for p, mode in ((prefill, "prefill"), (decode, "decode")):
        cmd = parse_argv(p.argv)
        assert cmd is not None and cmd.value("--disaggregation-mode") == mode
        assert connector(p) == "NixlConnector"
    assert f.entry is not None and (f.entry.service, f.entry.port, f.entry.target_port) == (
        "vllm-disagg-frontend",
        8000,
        8000,
    )


def test_dynamo_v1beta1_labels() -> None:
    objs = stack_objects("dynamo")
    for pod in objs.pods:
        labels = pod["metadata"]["labels"]
        sub = labels.pop("nvidia.com/dynamo-sub-component-type", None)
        if sub:
            labels["nvidia.com/dynamo-component-type"] = sub
    f = stacks.discover("dynamo", objs)
    assert [(r.name, len(r.replicas)) for r in f.roles] == [("prefill", 1), ("decode", 1)]
    assert f.roles[1].selector.startswith("nvidia.com/dynamo-component-type=decode")


def test_kserve_decode_behind_the_sidecar_https_flags_from_vllm_additional_args() -> None:
    f = found("kserve", "kserve-llm")
    assert f.stack == "kserve"
    assert ports(f) == {
        "prefill": [("gpu-node-1", 8000, 8000, "https:/metrics")],
        "decode": [("gpu-node-2", 8001, 8001, "https:/metrics")],
    }
    prefill, decode = (r.replicas[0] for r in f.roles)
    assert decode.form == "sh -c script via eval"
    assert "llm-d-routing-sidecar on 8000 proxies to 8001" in " ".join(decode.notes)
    # VLLM_ADDITIONAL_ARGS (underscore spelling) and $@ (the container args) are read
    assert connector(decode) == connector(prefill) == "NixlConnector"
    cmd = parse_argv(prefill.argv)
    assert cmd is not None and cmd.value("--max-model-len") == "2048"
    assert f.entry is not None
    assert (f.entry.service, f.entry.port, f.entry.target_port, f.entry.scheme) == (
        "tiny-pd-kserve-workload-svc",
        8000,
        8000,
        "https",
    )


def test_aibrix_one_shell_string_and_metric_port_label_entry_undetermined() -> None:
    f = found("aibrix", "aibrix")
    assert f.stack == "aibrix"
    assert ports(f) == {
        "prefill": [("gpu-node-1", 8000, 8000, "http:/metrics")],
        "decode": [("gpu-node-2", 8000, 8000, "http:/metrics")],
    }
    assert all(r.replicas[0].form == "sh -c script" for r in f.roles)
    assert connector(f.roles[1].replicas[0]) == "NixlConnector"
    assert f.entry is None
    assert any("Envoy gateway" in u and "--entry svc/NAME:PORT" in u for u in f.undetermined())


def test_production_stack_roles_from_the_router_args_and_the_router_is_only_the_entry() -> None:
    f = found("production-stack", "prodstack")
    assert f.stack == "production-stack"
    assert [(r.name, r.selector) for r in f.roles] == [
        ("prefill", "model=llama-prefill,helm-release-name=pd"),
        ("decode", "model=llama-decode,helm-release-name=pd"),
    ]
    every = [p for r in f.roles for p in r.replicas]
    assert all(p.container == "vllm" for p in every)  # never router-container
    assert "pd-deployment-router-6f5e4d3c2-rtr01" not in {p.pod for p in every}
    assert ports(f)["decode"] == [("gpu-node-2", 8000, 8000, "http:/metrics")]
    assert connector(every[0]) == "LMCacheConnectorV1"
    assert f.entry is not None and (f.entry.service, f.entry.port, f.entry.target_port) == (
        "pd-router-service",
        80,
        8000,
    )
    assert f.entry.pods == ["pd-deployment-router-6f5e4d3c2-rtr01"]


def test_ome_engine_decoder_metrics_from_annotations_and_router_entry() -> None:
    f = found("ome", "ome")
    assert f.stack == "ome"
    assert ports(f) == {
        "prefill": [("gpu-node-1", 8080, 8080, "http:/metrics")],
        "decode": [("gpu-node-2", 8080, 8080, "http:/metrics")],
    }
    # $(MODEL_PATH) is the kubelet's expansion of the container's env
    cmd = parse_argv(f.roles[0].replicas[0].argv)
    assert cmd is not None and cmd.model == "/mnt/models/tiny"
    assert f.entry is not None and (f.entry.service, f.entry.target_port) == ("tiny-isvc", 8080)


def test_disaggregatedset_leaders_only_and_the_user_service_given() -> None:
    f = found("disaggregatedset", "lws")
    assert f.stack == "disaggregatedset"
    assert {r.name: [p.pod for p in r.replicas] for r in f.roles} == {
        "prefill": ["tiny-dset-0-prefill-0"],
        "decode": ["tiny-dset-0-decode-0"],
    }
    assert ports(f)["decode"] == [("gpu-node-3", 8080, 8080, "http:/metrics")]
    assert f.entry is None and any("the entry" in u for u in f.unknown)
    given = found("disaggregatedset", "lws", entry="svc/tiny-dset-router:8000")
    assert given.entry is not None and given.entry.pods == ["tiny-dset-router-5d4c3b2a1-ro001"]


def test_leaderworkerset_alone_is_one_mixed_role_of_its_leaders() -> None:
    objs = stack_objects("disaggregatedset")
    pods = [p for p in objs.pods if "-decode-" in p["metadata"]["name"]]
    for p in pods:
        for k in list(p["metadata"]["labels"]):
            if k.startswith("disaggregatedset"):
                del p["metadata"]["labels"][k]
    f = stacks.discover("lws", stacks.Objects(pods, objs.services))
    assert f.stack == "leaderworkerset" and f.topology == "mixed"
    assert [p.pod for p in f.roles[0].replicas] == ["tiny-dset-0-decode-0"]


def test_an_unknown_labelling_is_refused_naming_the_explicit_flags() -> None:
    with pytest.raises(UsageError) as e:
        found("in-house", "inhouse")
    assert e.value.exit_code == 2
    text = f"{e.value} {e.value.hint}"
    assert stacks.EXPLICIT_FLAGS in text
    assert "team.example.com/tier" in text  # the labels that are there


def test_explicit_selectors_attach_what_no_stack_labels() -> None:
    f = stacks.explicit(
        "inhouse",
        stack_objects("in-house"),
        [("prefill", "team.example.com/tier=prefill"), ("decode", "team.example.com/tier=decode")],
        "svc/chat:80",
    )
    assert f.stack == "explicit" and f.topology == "pd"
    assert ports(f) == {
        "prefill": [("gpu-a", 9000, 9000, "http:/metrics")],
        "decode": [("gpu-b", 9000, 9000, "http:/metrics")],
    }
    decode = parse_argv(f.roles[1].replicas[0].argv)
    assert decode is not None
    assert decode.json_value("--speculative-config")[0] == {
        "method": "ngram",
        "num_speculative_tokens": 3,
    }
    assert f.entry is not None and (f.entry.service, f.entry.port, f.entry.target_port) == (
        "chat",
        80,
        8080,
    )


@pytest.mark.parametrize(
    ("roles", "entry", "says"),
    [
        ([("prefill", "team.example.com/tier=prefill")], "svc/chat:80", "both roles"),
        ([("mixed", "team.example.com/tier=nothing")], "svc/chat:80", "matches no Pod"),
        ([("worker", "a=b")], None, "one of prefill, decode, mixed"),
        ([("mixed", "team.example.com/tier=decode")], "chat:80", "svc/NAME:PORT"),
        ([("mixed", "team.example.com/tier=decode")], "svc/nope:80", "no Service nope"),
        ([("mixed", "team.example.com/tier=decode")], "svc/chat:81", "no port 81"),
        ([("mixed", "a in (b)")], None, "is not KEY=VALUE"),
    ],
)
def test_explicit_bad_input_is_exit_2_naming_it(
    roles: list[tuple[str, str]], entry: str | None, says: str
) -> None:
    with pytest.raises(UsageError) as e:
        stacks.explicit("inhouse", stack_objects("in-house"), roles, entry)
    assert says in f"{e.value} {e.value.hint}"


def test_two_instances_of_one_stack_are_refused_naming_them() -> None:
    objs = stack_objects("dynamo")
    twin = yaml.safe_load(yaml.safe_dump(objs.pods[2]))
    twin["metadata"]["name"] += "-b"
    twin["metadata"]["labels"]["nvidia.com/dynamo-graph-deployment-name"] = "other"
    with pytest.raises(UsageError) as e:
        stacks.discover("dynamo", stacks.Objects([*objs.pods, twin], objs.services))
    assert "other" in str(e.value) and "vllm-disagg" in str(e.value)


def test_the_sidecar_port_is_never_taken_for_metrics() -> None:
    """A stack label naming the sidecar's port for metrics is overridden by the engine's."""
    objs = stack_objects("llm-d")
    pod = objs.pods[1]
    pod["metadata"]["labels"]["model.aibrix.ai/metric-port"] = "8000"
    pod["metadata"]["labels"]["storm-service-name"] = "x"
    pod["metadata"]["labels"]["role-name"] = "decode"
    from servebook.kube import attach_pods

    r = attach_pods.read_replica("aibrix", pod)
    assert r["metrics"][0] == 8200
    assert any("routing-proxy's" in u for u in r["unknown"])


def test_script_expansion_quotes_as_the_shell_does() -> None:
    c = {
        "command": ["bash", "-c", 'A="--x 1"\nexec vllm serve m $A "$B" ${C:-"--y"} "$@"', "--"],
        "args": ["--served-model-name", "two words"],
        "env": [{"name": "B", "value": "--z"}, {"name": "S", "valueFrom": {"secretKeyRef": {}}}],
    }
    r = attach_argv.resolve(c)
    assert r.argv == [
        "vllm", "serve", "m", "--x", "1", "--z", "--y", "--served-model-name", "two words"
    ]  # fmt: skip
    assert r.unknown == []
    r = attach_argv.resolve({**c, "command": ["sh", "-c", "exec vllm serve m $S $D", "--"]})
    assert r.argv == ["vllm", "serve", "m"]
    assert any("$S" in u and "Secret" in u for u in r.unknown)
    assert any("$D" in u for u in r.unknown)
