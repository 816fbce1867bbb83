"""Names and flags a command refuses while it reads its command line (the reliability probe
of 2026-12-04: D2, D14, D22, D23, D27, D30): exit 2, a message naming the flag, the rule
and an example, and nothing started or written.  Each case runs the real CLI.

Commands that could start an engine run with vLLM hidden from the import system
(``NO_ENGINE``): a name or number that slipped through would end in "vLLM is not
installed" here, never in an engine started on this shared machine."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from servebook import names, urls
from servebook.backends.state import state_dir_for
from servebook.errors import UsageError
from tests.conftest import CliResult

Cli = Callable[..., CliResult]
NO_ENGINE = ["vllm"]  # hidden from the import system: sys.modules["vllm"] = None
RULE = "a deployment name is a DNS-1123 label"


def said(r: CliResult) -> str:
    return " ".join((r.stdout + r.stderr).split())


def refused(r: CliResult, *words: str) -> str:
    text = said(r)
    assert r.returncode == 2, text
    assert "Traceback" not in text
    for w in words:
        assert w in text, (w, text)
    return text


# --- D2: a deployment name is a name, never a path -------------------------------------


def test_up_name_that_climbs_out_of_servebook_home_is_refused_before_anything(
    cli: Cli, tmp_path: Path, sb_home: Path
) -> None:
    victim = tmp_path / "victim"  # SERVEBOOK_HOME/deployments/../../victim
    (victim / "kv").mkdir(parents=True)
    (victim / "kv" / "important.txt").write_text("precious\n")
    r = cli("up", "tiny-pd", "--name", "../../victim", "--timeout", "5", hide=NO_ENGINE)
    refused(r, "--name '../../victim'", RULE, f"e.g. {names.EXAMPLE}")
    assert (victim / "kv" / "important.txt").read_text() == "precious\n"
    assert sorted(p.name for p in victim.iterdir()) == ["kv"]  # no logs/, no state.json
    assert not (sb_home / "deployments").exists()
    assert not (sb_home / "models").exists()


@pytest.mark.parametrize("bad", ["a/b", ".", "..", "Tiny-PD", "tiny_pd", "-pd", "x" * 64, ""])
def test_up_refuses_every_name_that_is_not_a_dns_label(cli: Cli, sb_home: Path, bad: str) -> None:
    r = cli("up", "tiny-mixed", "--name", bad, "--timeout", "5", hide=NO_ENGINE)
    refused(r, f"--name {bad!r}", RULE)
    assert not (sb_home / "deployments").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["run", "tiny-mixed", "--name", "a/b", "--timeout", "5"],
        ["status", "../x"],
        ["down", "../../victim"],
        ["verify", "a/b"],
        ["bench", ".", "-o", "OUT"],
        ["detach", "../x"],
        ["attach", "a/b", "--role", "mixed=http://127.0.0.1:1", "--entry", "http://127.0.0.1:1"],
    ],
    ids=lambda a: a[0],
)
def test_every_command_that_takes_a_deployment_name_checks_it(
    cli: Cli, tmp_path: Path, sb_home: Path, args: list[str]
) -> None:
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    r = cli(*args, hide=NO_ENGINE)
    refused(r, RULE, names.EXAMPLE)
    assert not (sb_home / "deployments").exists()
    assert not (tmp_path / "out").exists()


def test_a_recipe_file_whose_name_is_no_deployment_name_asks_for_name(
    cli: Cli, tmp_path: Path, sb_home: Path
) -> None:
    src = Path(__file__).parents[2] / "src/servebook/recipe/catalog/tiny-mixed.yaml"
    recipe = tmp_path / "My_Recipe.yaml"
    recipe.write_text(src.read_text())
    r = cli("up", str(recipe), "--timeout", "5", hide=NO_ENGINE)
    refused(r, "'My_Recipe'", "--name", RULE)


@pytest.mark.parametrize("bad", ["../../victim", "a/b", "/etc", ".", "..", "", "a\0b"])
def test_no_state_directory_lies_outside_the_deployments_directory(sb_home: Path, bad: str) -> None:
    with pytest.raises(UsageError, match="not a name but a path"):
        state_dir_for(bad)
    assert state_dir_for("my_dep_before_the_rule") == sb_home / "deployments" / (
        "my_dep_before_the_rule"
    )


def test_the_name_rule_accepts_what_kubernetes_accepts() -> None:
    for good in ["tiny-pd", "a", "0", "pd-2", "x" * 63]:
        assert names.deployment_name(good) == good
    with pytest.raises(UsageError) as e:
        names.deployment_name("a.b", "--name")
    assert str(e.value).startswith(f"--name 'a.b': {RULE}: at most 63 lowercase letters")


# --- D14, D23: time bounds and seeds ---------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_up_timeout_must_be_a_number_of_seconds_above_0(
    cli: Cli, sb_home: Path, value: str
) -> None:
    r = cli("up", "tiny-mixed", "--timeout", value, hide=NO_ENGINE)
    refused(r, f"--timeout {float(value)}: give a number of seconds above 0")
    assert not (sb_home / "deployments").exists()


BENCH = ["bench", "--url", "http://127.0.0.1:9", "--model", "tiny"]


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--seed", "-1", "--seed -1: a seed is a whole number from 0 to 9223372036854775807"),
        ("--request-timeout", "-1", "--request-timeout -1.0: give a number of seconds above 0"),
        ("--request-timeout", "nan", "--request-timeout nan: give a number of seconds above 0"),
        ("--request-timeout", "0", "--request-timeout 0.0: give a number of seconds above 0"),
        ("--load-start-timeout", "inf", "--load-start-timeout inf: give a number of seconds"),
    ],
)
def test_bench_refuses_a_bound_outside_its_range_before_any_load(
    cli: Cli, tmp_path: Path, flag: str, value: str, words: str
) -> None:
    out = tmp_path / "out"
    r = cli(*BENCH, "-o", str(out), flag, value)
    refused(r, words)
    assert "saved" not in said(r) and not out.exists()


@pytest.mark.parametrize("flag", ["--timeout", "--health-timeout"])
def test_verify_time_bounds_are_checked_too(cli: Cli, flag: str) -> None:
    refused(cli("verify", flag, "nan"), f"{flag} nan: give a number of seconds above 0")


# --- D22: URLs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:abc", "port 'abc' is not a TCP port (1-65535)"),
        ("http://127.0.0.1:99999", "port '99999' is not a TCP port (1-65535)"),
        ("http://[::1", "not a URL (Invalid IPv6 URL)"),
        ("http://127.0.0.1:8000\n/v1", "whitespace or a control character"),
        ("ftp://127.0.0.1", "not an http:// or https:// URL"),
        ("http://", "it names no host"),
    ],
)
def test_bench_refuses_a_url_no_client_can_use_naming_the_flag(
    cli: Cli, tmp_path: Path, url: str, why: str
) -> None:
    r = cli("bench", "--url", url, "--model", "tiny", "-o", str(tmp_path / "out"))
    refused(r, "--url", why, f"give a base URL such as {urls.EXAMPLE}")
    assert not (tmp_path / "out").exists()


def test_attach_refuses_an_unusable_entry_url(cli: Cli, sb_home: Path) -> None:
    r = cli("attach", "one", "--role", "mixed=http://[::1", "--entry", "http://[::1")
    refused(r, "--role mixed", "not a URL")
    assert not (sb_home / "deployments").exists()


def test_a_url_scheme_in_capitals_is_a_url() -> None:
    assert urls.server_url("HTTP://127.0.0.1:8000/v1", "--url") == "http://127.0.0.1:8000/v1"
    assert urls.server_url("https://[::1]:18003", "--url") == "https://[::1]:18003"


# --- D30: a parameter set twice ----------------------------------------------------------


def test_a_repeated_set_is_refused_like_a_repeated_key_in_a_values_file(
    cli: Cli, tmp_path: Path
) -> None:
    r = cli(
        "recipes", "show", "tiny-mixed", "--set", "max_model_len=256", "--set", "max_model_len=512"
    )
    refused(r, "--set max_model_len is given twice", "'256'", "'512'")
    values = tmp_path / "v.yaml"
    values.write_text("max_model_len: 256\nmax_model_len: 512\n")
    refused(cli("recipes", "show", "tiny-mixed", "-f", str(values)), "given twice")


def test_an_integer_no_engine_or_cluster_field_can_hold_is_refused(cli: Cli) -> None:
    # The probe's case: rendered without a word, to overflow where it lands.
    huge = "99999999999999999999999"
    r = cli("recipes", "show", "tiny-mixed", "--set", f"max_model_len={huge}")
    refused(r, "max_model_len", "too large", "2147483647")
    assert cli("recipes", "show", "tiny-mixed", "--set", "max_model_len=4096").returncode == 0


# --- D27: two `up` of one name ---------------------------------------------------------


def test_a_second_up_of_a_name_being_brought_up_names_the_first(cli: Cli, sb_home: Path) -> None:
    # The first `up`: the lock every `up` and `run` takes, held by another process.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from servebook.backends.state import bringing_up\n"
            "with bringing_up('tiny-mixed'):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, "SERVEBOOK_HOME": str(sb_home)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        r = cli("up", "tiny-mixed", "--timeout", "5", hide=NO_ENGINE)
        text = refused(
            r,
            "another `servebook up` (or `run`) of deployment 'tiny-mixed' is running "
            f"(pid {holder.pid})",
        )
        assert "--force" not in text
    finally:
        holder.kill()
        holder.wait()
    # Its lock went with it: the next `up` goes as far as this machine lets it.
    t0 = time.monotonic()
    r = cli("up", "tiny-mixed", "--timeout", "5", hide=NO_ENGINE)
    assert r.returncode == 2 and "vLLM is not installed" in said(r), said(r)
    assert time.monotonic() - t0 < 60
    # A refused up records nothing; the lock of the killed one went with its successor's.
    assert not (sb_home / "deployments").exists()
