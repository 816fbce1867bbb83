"""servebook.redact: what counts as a secret, and that the rest of a record is kept."""

from __future__ import annotations

import pytest

from servebook import auth, redact
from servebook.redact import REDACTED

SECRET = "sk-live-0123456789abcdef"

pytestmark = pytest.mark.usefixtures("no_secrets_known")


@pytest.mark.parametrize(
    "name",
    [
        "--api-key",
        "--hf-token",
        "--hf_token",
        "--password",
        "--client-secret",
        "HF_TOKEN",
        "VLLM_API_KEY",
        "OPENAI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "hfToken",
        "access_token",
        "X-Amz-Signature",
        "sig",
    ],
)
def test_names_that_say_secret_are_secret(name: str) -> None:
    assert redact.is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "--max-num-batched-tokens",
        "--tokenizer",
        "--num-speculative-tokens",
        "--api-key-validation-urls",
        "--ssl-keyfile",
        "TOKENIZERS_PARALLELISM",
        "VLLM_CPU_KVCACHE_SPACE",
        "max_tokens",
        "token_ids",
        "--kv-transfer-config",
    ],
)
def test_settings_that_merely_mention_tokens_are_kept(name: str) -> None:
    assert not redact.is_secret_name(name)


def test_a_command_line_loses_secret_values_in_both_flag_forms_and_keeps_the_flags() -> None:
    argv = [
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--api-key",
        SECRET,
        "--hf-token=hf_abcdef",
        "--enforce-eager",
        "--max-num-batched-tokens",
        "512",
        "--prefill",
        "https://user:pw0rd@host:8000/x?token=t0k3n&a=1",
    ]
    out, notes = redact.argv(argv)
    assert out == [
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--api-key",
        REDACTED,
        f"--hf-token={REDACTED}",
        "--enforce-eager",
        "--max-num-batched-tokens",
        "512",
        "--prefill",
        f"https://{REDACTED}@host:8000/x?token={REDACTED}&a=1",
    ]
    assert notes == ["--api-key", "--hf-token", "credentials in a URL", "URL query token"]


def test_a_secret_flag_without_a_value_leaves_the_next_flag_alone() -> None:
    assert redact.argv(["--api-key", "--port", "8000"])[0] == ["--api-key", "--port", "8000"]


def test_environment_secrets_are_replaced_and_other_settings_kept() -> None:
    env, notes = redact.env(
        {
            "HF_TOKEN": "hf_x",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HTTPS_PROXY": "http://me:pw@proxy:3128",
        }
    )
    assert env == {
        "HF_TOKEN": REDACTED,
        "HTTPS_PROXY": f"http://{REDACTED}@proxy:3128",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    assert notes == ["HF_TOKEN", "HTTPS_PROXY (credentials in a URL)"]


@pytest.mark.parametrize(
    "line",
    [
        f"starting: ['python', '--api-key', '{SECRET}', '--port', '8000']",
        f'argv: ["--api-key", "{SECRET}"]',
        f"vllm serve m --api-key {SECRET} --port 1",
        f"vllm serve m --api-key={SECRET}",
        f"Authorization: Bearer {SECRET}",
        f"VLLM_API_KEY={SECRET} python -m vllm",
        f'{{"api_key": "{SECRET}"}}',
        f"non-default args: {{'api_key': ['{SECRET}']}}",
        f"GET https://u:{SECRET}@example.com/v1/models",
        f"GET https://example.com/v1/models?api_key={SECRET}&x=1",
    ],
)
def test_free_text_loses_the_secret_in_every_shape_a_log_or_message_quotes_it(line: str) -> None:
    out = redact.text(line)
    assert SECRET not in out and REDACTED in out


def test_a_remembered_value_is_replaced_wherever_it_appears() -> None:
    redact.remember(SECRET)
    assert redact.text(f"the key was {SECRET}, really") == f"the key was {REDACTED}, really"


def test_provenance_is_redacted_with_notes_that_name_where_and_what_never_the_value() -> None:
    doc = {
        "target": {"url": f"https://bench:{SECRET}@llm.example.com", "api": "completions"},
        "roles": [
            {
                "name": "decode",
                "command": ["python", "--api-key", SECRET, "--enforce-eager"],
                "env": {"VLLM_API_KEY": SECRET, "VLLM_CPU_KVCACHE_SPACE": "1"},
                "url": "http://127.0.0.1:8000",
            }
        ],
        "seed": 0,
    }
    out = redact.provenance(doc)
    assert SECRET not in repr(out)
    assert out["roles"][0]["command"] == ["python", "--api-key", REDACTED, "--enforce-eager"]
    assert out["roles"][0]["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert out["seed"] == 0 and out["target"]["api"] == "completions"
    assert out["redacted"] == [
        "target.url credentials in a URL",
        "roles[decode].command --api-key",
        "roles[decode].env VLLM_API_KEY",
    ]
    # Redacting again changes nothing and keeps the notes.
    assert redact.provenance(out) == out


def test_the_key_comes_from_the_flag_then_openai_then_vllm_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(auth, "_given", None)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert auth.resolve(None) is None
    monkeypatch.setenv("VLLM_API_KEY", "vllm-key-1")
    assert auth.resolve(None) == "vllm-key-1"
    monkeypatch.setenv("OPENAI_API_KEY", "openai-key-1")
    assert auth.resolve(None) == "openai-key-1"
    assert auth.resolve("flag-key-1") == "flag-key-1"
    assert auth.for_engines() == "flag-key-1"
    assert redact.text("flag-key-1 openai-key-1") == f"{REDACTED} {REDACTED}"


def test_a_refusal_without_a_key_says_to_pass_one_and_never_shows_credentials() -> None:
    e = auth.rejected(401, "https://u:pw@h.example/v1/completions", None)
    assert auth.MISSING in str(e) and "pw" not in str(e) and e.exit_code == 2
    wrong = auth.rejected(403, "http://h/v1/models", "k")
    assert "refused the API key" in str(wrong) and "--api-key" in str(wrong)


@pytest.mark.parametrize(
    "line",
    [
        auth.MISSING,
        "the server requires an API key: pass it with --api-key or set OPENAI_API_KEY",
        "--hf-token is missing",
        "no token: the hub refused",
    ],
)
def test_prose_about_keys_is_left_as_written(line: str) -> None:
    assert redact.text(line) == line


# --- the redactor's gaps (D8, the reliability probe of 2026-12-04) ---------------------------


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ("GET http://admin:hunter2@TAIL99@h.example/v1/models: refused", "TAIL99"),
        ("Authorization: Token abc123def", "abc123def"),
        ("proxy-authorization: Digest zzq4k3y", "zzq4k3y"),
        ("api-key=sk-12345", "sk-12345"),
        ("DB_PASS=x1234y", "x1234y"),
        ("OPENAI_API_KEYS=k1a2b3,k4d5e6", "k1a2b3"),
        ("vllm serve m --api-key -startsdash --port 1", "startsdash"),
        ('vllm serve m --api-key "sk with space" --port 1', "with space"),
        ("argv: ['--api-key', 'sk with space']", "with space"),
        ('{"api_key": "sk with space"}', "with space"),
        ("HF_TOKEN='hf with space'", "with space"),
        ("--api-key --hf-token hf_after_a_bare_flag", "hf_after_a_bare_flag"),
    ],
)
def test_d8_secrets_the_probe_found_unredacted_are_replaced(line: str, secret: str) -> None:
    out = redact.text(line)
    assert secret not in out and REDACTED in out


@pytest.mark.parametrize(
    "line",
    [
        "--slo 'foo=1ms': 'foo=1ms' is not KEY=VALUE with KEY one of ttft, itl, tpot, e2e",
        "`--set api_key_secret=NAME` (key api-key, or NAME/KEY): every engine then gets "
        "VLLM_API_KEY from it. Remove --api-key (or the secret) from extra_engine_args.",
        "env: {name: VLLM_API_KEY, valueFrom: {secretKeyRef: {name: vllm-key, key: api-key}}}",
        "args: [--api-key, $(VLLM_API_KEY)]",
        "secretName: hf-token",
        "vLLM prints --api-key *** in its log",
        "--max-num-batched-tokens 512 --num-speculative-tokens 3 json.dumps(sort_keys=True)",
    ],
)
def test_d8_hints_references_and_settings_are_not_garbled(line: str) -> None:
    assert redact.text(line) == line


def test_d8_a_command_line_value_starting_with_a_dash_is_the_secret_flags_value() -> None:
    out, notes = redact.argv(["vllm", "--api-key", "-k3y-value", "--port", "8000"])
    assert out == ["vllm", "--api-key", REDACTED, "--port", "8000"]
    assert notes == ["--api-key"]
    # A reference to a secret stays readable, as in a rendered manifest.
    assert redact.argv(["--api-key", "$(VLLM_API_KEY)"])[0] == ["--api-key", "$(VLLM_API_KEY)"]


def test_d8_a_kubernetes_env_entry_loses_its_value_and_a_secret_reference_is_kept() -> None:
    env = [
        {"name": "HF_TOKEN", "value": "hf_literal_value"},
        {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "k", "key": "api-key"}}},
        {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
    ]
    out, notes = redact.scrub({"env": env})
    assert out["env"][0] == {"name": "HF_TOKEN", "value": REDACTED}
    assert out["env"][1:] == env[1:]
    assert notes == ["env[HF_TOKEN] HF_TOKEN"]


def test_redacting_twice_changes_nothing_even_for_a_remembered_value() -> None:
    redact.remember("redacted", SECRET)  # the first is part of the mark itself
    once = redact.text(f"Authorization: Bearer {SECRET} api-key={SECRET} the redacted text")
    assert SECRET not in once and "the redacted text" in once
    assert redact.text(once) == once


def test_d8_a_lookup_key_is_kept_and_a_key_in_a_url_query_is_not() -> None:
    spec = {
        "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "vllm-key", "key": "k"}}}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
    }
    assert redact.scrub(spec) == (spec, [])
    assert redact.text("'foo=1ms' is not KEY=VALUE") == "'foo=1ms' is not KEY=VALUE"
    assert redact.url("https://maps.example/v1?key=AIzaSy0123") == (
        f"https://maps.example/v1?key={REDACTED}"
    )
