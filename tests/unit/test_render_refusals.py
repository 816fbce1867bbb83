"""`servebook render` refuses what the API server, its controllers or vLLM would refuse
later, half-way through an apply or minutes after an image pull: exit 2, nothing written,
naming the parameter and the rule (issue 23 point 5, issue 24 point 5)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from servebook.commands.render import render_files
from servebook.errors import UsageError
from servebook.kube.names import derived_names, name_errors
from tests.conftest import CliResult

Cli = Callable[..., CliResult]
WIDE_EP = [
    "image=vllm/vllm-openai:v0.20.0",
    "model_dir=/data/models/m",
    "prefill_nodes=gpu-a,gpu-b",
    "decode_nodes=gpu-c,gpu-d",
    "fabric=ib-shared",
]
TINY = ["image=vllm/vllm-openai-cpu:v0.32.0-x86_64"]


def _sets(values: list[str]) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def test_a_name_starting_with_a_digit_is_refused_as_a_service_name(
    cli: Cli, tmp_path: Path
) -> None:
    out = tmp_path / "deploy"
    r = cli("render", "tiny-mixed", *_sets(TINY), "--name", "8b-test", "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert "deployment name '8b-test'" in r.stderr
    assert "Service/8b-test" in r.stderr and "DNS-1035 label" in r.stderr
    assert "start with an alphabetic character" in r.stderr
    assert not out.exists()


def test_a_long_name_whose_statefulset_pods_could_not_be_created_is_refused(
    cli: Cli, tmp_path: Path
) -> None:
    """kubernetes#64023: a StatefulSet's Pods carry controller-revision-hash=NAME-HASH;
    the LeaderWorkerSet's worker StatefulSet is LWS-0, so 44 characters leave no room."""
    name = "a" * 44
    out = tmp_path / "deploy"
    r = cli("render", "vllm-pd-wide-ep", *_sets(WIDE_EP), "--name", name, "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert f"worker StatefulSet {name}-prefill-lws-0" in r.stderr
    assert "controller-revision-hash" in r.stderr
    assert "a label value may have at most 63" in r.stderr
    # 63 - len("-prefill-lws-0") - len("-") - 10 = 38
    assert "at most 38 characters" in r.stderr
    assert "--name" in r.stderr
    assert not out.exists()


def test_the_longest_name_the_limit_names_renders() -> None:
    render_files("vllm-pd-wide-ep", WIDE_EP, name="a" * 38)
    with pytest.raises(UsageError, match="at most 38 characters"):
        render_files("vllm-pd-wide-ep", WIDE_EP, name="a" * 39)


def test_the_revision_label_limit_counts_every_group_of_a_leaderworkerset() -> None:
    """With 11 groups the last worker StatefulSet is LWS-10: one character less room."""
    _, objects, _ = render_files("vllm-pd-wide-ep", WIDE_EP, name="a" * 20)
    lws = next(o for o in objects if o["kind"] == "LeaderWorkerSet")
    lws["spec"]["replicas"] = 11
    texts = [d.text for d in derived_names([lws]) if d.pad]
    assert f"{lws['metadata']['name']}-10" in texts


@pytest.mark.parametrize(
    ("text", "rule", "bad"),
    [
        ("8b-test", "dns1035", True),
        ("b8-test", "dns1035", False),
        ("8b-test", "dns1123-label", False),
        ("a" * 64, "dns1123-label", True),
        ("a.b", "dns1123-subdomain", False),
        ("a.b", "dns1123-label", True),
        ("", "label-value", False),
        ("-x", "label-value", True),
    ],
)
def test_name_rules_are_the_api_servers(text: str, rule: str, bad: bool) -> None:
    assert bool(name_errors(text, rule)) is bad
