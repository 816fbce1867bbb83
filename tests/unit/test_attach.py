"""`servebook attach` by URL: the argv of the process listening on each port, read from
/proc; claims from it; what could not be determined said plainly; `detach`."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from servebook.backends.attached.listener import read_listener, user_name
from servebook.engines.cmdline import parse_argv, speculative_config
from tests.conftest import CliResult
from tests.unit.engine_standin import engine, free_port

Cli = Callable[..., CliResult]
KV = ["--kv_transfer_config", '{"kv_connector":"ExampleConnector","kv_role":"kv_both"}']


def test_listener_reads_the_engine_argv_and_its_vllm_environment_but_no_secret() -> None:
    env = {"VLLM_ADDITIONAL_ARGS": "--enforce-eager", "VLLM_API_KEY": "sk-secret"}
    with engine(["--speculative-config.method=ngram"], env=env) as url:
        who = read_listener(url)
    assert who.unread == "" and who.pid is not None
    assert who.argv[-1] == "--speculative-config.method=ngram"
    assert f"pid {who.pid} listening on port {url.rsplit(':', 1)[1]}" in who.source
    assert who.env.get("VLLM_ADDITIONAL_ARGS") == "--enforce-eager"
    assert "VLLM_API_KEY" not in who.env
    cmd = parse_argv(who.argv, env=who.env)
    assert cmd is not None and speculative_config(cmd) == ({"method": "ngram"}, None)


def test_listener_says_plainly_what_it_cannot_read() -> None:
    port = free_port()
    assert read_listener(f"http://127.0.0.1:{port}").unread == (
        f"no process on this machine listens on port {port}"
    )
    far = read_listener("http://192.0.2.10:8000")  # TEST-NET-1: never this machine
    assert "is another machine" in far.unread and far.argv == []


def _proc_with_socket(root: Path, uid: int) -> Path:
    """/proc as the kernel shows it to a user who may not read the owner's fd links: the
    socket listed in net/tcp (port 8080 on 127.0.0.1, its owner's uid, inode 4242), and
    no fd link that this user can see pointing at it."""
    (root / "net").mkdir(parents=True)
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
    header += "   uid  timeout inode\n"
    row = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000"
    row += f" {uid:>5}        0 4242 1 0 100 0 0 10 0\n"
    (root / "net" / "tcp").write_text(header + row)
    (root / "net" / "tcp6").write_text(header)
    (root / "1").mkdir()  # a process whose fd directory this user cannot list
    return root


def test_another_users_socket_is_named_not_guessed(tmp_path: Path) -> None:
    other = 65534 if os.getuid() != 65534 else 65533
    who = read_listener("http://127.0.0.1:8080", proc=_proc_with_socket(tmp_path / "a", other))
    assert f"belongs to {user_name(other)}" in who.unread and who.argv == []
    mine = read_listener(
        "http://127.0.0.1:8080", proc=_proc_with_socket(tmp_path / "b", os.getuid())
    )
    assert "another PID namespace" in mine.unread and mine.argv == []


def test_a_shell_script_reads_its_flags_from_the_environment_and_its_args() -> None:
    """KServe's shape (reference/stacks.md): `bash -c 'exec vllm serve M
    ${VLLM_ADDITIONAL_ARGS} $@' --` with flags in the env, underscores as its samples write."""
    argv = [
        "/bin/bash",
        "-c",
        "exec vllm serve /mnt/models \\\n ${VLLM_ADDITIONAL_ARGS} $@",
        "--",
        "--port",
        "8001",
    ]
    env = {
        "VLLM_ADDITIONAL_ARGS": " ".join(
            ["--kv_transfer_config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
        )
    }
    cmd = parse_argv(argv, env=env)
    assert cmd is not None and cmd.value("--port") == "8001"
    assert cmd.json_value("--kv-transfer-config") == (
        {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
        None,
    )
    unexpanded = parse_argv(argv)
    assert unexpanded is not None and unexpanded.json_value("--kv-transfer-config") == (None, None)


def test_attach_dry_run_says_what_it_found_and_records_nothing(cli: Cli, sb_home: Path) -> None:
    with engine(KV) as p, engine(KV) as d:
        port = free_port()
        r = cli(
            "attach", "pd", "--role", f"prefill={p}", "--role", f"decode={d}",
            "--role", f"decode=http://127.0.0.1:{port}", "--entry", p, "--dry-run", "--json",
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert found["recorded"] is False and found["topology"] == "pd"
    assert found["served_model_name"] == "tiny"  # from the entry's /v1/models
    decode = next(x for x in found["roles"] if x["name"] == "decode")
    ok, gone = decode["replicas"]
    assert ok["claims"]["kv_connector"] == "ExampleConnector" and ok["metrics"]["engine"] == "vllm"
    assert gone["claims"]["determined"] is False
    assert any(
        f"no engine counters at http://127.0.0.1:{port}/metrics (port {port})" in u
        for u in found["undetermined"]
    )
    assert not (sb_home / "deployments").exists() or not any(
        (sb_home / "deployments").rglob("attached.json")
    )


def test_attach_records_status_reads_it_and_detach_forgets_it(cli: Cli, sb_home: Path) -> None:
    with engine() as m:
        r = cli("attach", "one", "--role", f"mixed={m}", "--entry", m)
        assert r.returncode == 0, r.stderr
        assert "attached: one" in r.stdout and "next: `servebook verify one`" in r.stdout
        st = cli("status", "one", "--json")
        assert st.returncode == 0, st.stderr
        status = json.loads(st.stdout)
        assert status["backend"] == "attached (url)" and status["roles"][0]["ok"] is True
        again = cli("attach", "one", "--role", f"mixed={m}", "--entry", m)
        assert again.returncode == 2 and "already recorded" in again.stderr
        down = cli("down", "one")
        assert down.returncode == 2 and "servebook detach one" in down.stderr
    gone = cli("detach", "one")
    assert gone.returncode == 0 and "nothing on it was touched" in gone.stdout
    assert not (sb_home / "deployments" / "one").exists()
    assert cli("detach", "one").returncode == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--role", "decode=http://h:1", "--entry", "http://h:1"], "role decode without prefill"),
        (["--role", "mixed=h:1", "--entry", "http://h:1"], "give a base URL"),
        (
            ["--role", "mixed=http://h:1,metric=http://h:2", "--entry", "http://h:1"],
            "is not metrics=URL",
        ),
        (["--entry", "http://h:1"], "no --role given"),
    ],
)
def test_bad_roles_are_exit_2_naming_the_flag(cli: Cli, args: list[str], message: str) -> None:
    r = cli("attach", "x", *args, "--model", "m")
    assert r.returncode == 2 and message in r.stderr


def test_open_reads_each_command_line_again_so_a_restarted_engine_claims_what_it_runs(
    sb_home: Path,
) -> None:
    from servebook.backends.attached.place import AttachedBackend
    from servebook.backends.attached.record import (
        AttachedDeployment,
        AttachedReplica,
        AttachedRole,
        write_record,
    )

    with engine(["--speculative-config", '{"method":"ngram"}']) as url:
        stale = AttachedReplica(name=url, api_url=url, metrics_url=url, argv=["vllm", "serve", "m"])
        write_record(
            AttachedDeployment(
                name="re", entry=url, roles=[AttachedRole(name="mixed", replicas=[stale])]
            )
        )
        with AttachedBackend().open("re") as view:
            assert view.role("mixed").argv[-1] == '{"method":"ngram"}'
            assert view.claims().speculative is True
