from __future__ import annotations

import pytest

from servebook.lint.docs import check_markdown, code_blocks, shell_commands
from servebook.lint.loader import MarkdownFile


def lint_md(text: str) -> list[tuple[str, int]]:
    return [(f.check, f.evidence["line"]) for f in check_markdown(MarkdownFile("d.md", text))]


def test_fences_pair_by_character_and_length() -> None:
    text = "````md\n```bash\ninner\n```\n````\n~~~\nx\n~~~\n"
    blocks = code_blocks(text)
    assert [(b.fence_line, b.closed, b.language) for b in blocks] == [
        (1, True, "md"),
        (6, True, ""),
    ]
    assert lint_md(text) == []


def test_unclosed_fence_is_reported_at_its_opening_line() -> None:
    assert lint_md("# t\n\n```bash\necho hi\n\n## later heading\n") == [("SB120", 3)]


def test_backtick_fence_with_backtick_in_info_is_not_a_fence() -> None:
    assert lint_md("``` not `a` fence\ntext\n") == []


@pytest.mark.parametrize(
    "line,found",
    [
        ("kubectl logs deploy/<prefill|decode>", True),
        ("servebook render <vllm-pd|vllm-pd-spec> --set a=b", True),
        ("echo '<prefill|decode>'", False),
        ('echo "<a|b>"', False),
        ("kubectl logs x 2>&1 | grep y > out", False),
        ("# kubectl logs deploy/<prefill|decode>", False),
    ],
)
def test_angle_alternatives_only_outside_quotes_and_comments(line: str, found: bool) -> None:
    assert (("SB121", 2) in lint_md(f"```bash\n{line}\n```\n")) is found


@pytest.mark.parametrize(
    "line,ok",
    [
        ("curl http://x/health", False),
        ("curl -s http://x | jq .", False),
        ("/usr/bin/curl -s http://x", False),
        ("curl --max-time 5 http://x", True),
        ("curl --max-time=5 http://x", True),
        ("curl -m 5 http://x", True),
        ("curl -sSm5 http://x", True),
        ("timeout 10 curl http://x", True),
        ("curl -m 5 http://x && curl http://y", False),
        ("curl -m 5 http://x 2>&1 | tee log", True),
        ("echo 'curl http://x'", True),
        ("libcurl-config --version", True),
        ("kubectl exec p -- curl http://x", False),
    ],
)
def test_curl_needs_an_explicit_timeout(line: str, ok: bool) -> None:
    assert (not any(c == "SB122" for c, _ in lint_md(f"```sh\n{line}\n```\n"))) is ok


def test_curl_options_on_continuation_lines_count() -> None:
    text = "```bash\ncurl -s http://x/v1/completions \\\n  -H 'a: b' \\\n  --max-time 30\n```\n"
    assert lint_md(text) == []


def test_console_blocks_check_prompt_lines_only() -> None:
    text = (
        "```console\n$ curl -m 5 http://x\ncurl: (28) Operation timed out\n$ curl http://y\n```\n"
    )
    assert lint_md(text) == [("SB122", 4)]


def test_console_blocks_without_prompts_are_commands() -> None:
    """vLLM's docs (docs/deployment/k8s.md) write console blocks as bare commands, no `$`:
    their test curl is a command someone pastes (held-out corpus, vllm/k8s.md)."""
    text = (
        "```console\nkubectl apply -f deployment.yaml\ncurl http://x/v1/completions \\\n"
        "  -H 'Content-Type: application/json'\n```\n"
    )
    assert lint_md(text) == [("SB122", 3)]
    bounded = "```console\nkubectl apply -f d.yaml\ncurl -m 10 http://x\n```\n"
    assert lint_md(bounded) == []


def test_heredoc_bodies_are_data() -> None:
    text = "```bash\ncat <<EOF > run.sh\ncurl http://x\nEOF\ncurl http://y\n```\n"
    assert lint_md(text) == [("SB122", 5)]


def test_non_shell_blocks_are_not_checked() -> None:
    assert lint_md("```python\ncurl <a|b>\n```\n\n```yaml\ncommand: [curl, x]\n```\n") == []


def test_shell_commands_join_continuations_and_keep_first_line() -> None:
    block = code_blocks("```bash\na \\\n  b\nc # comment\n```\n")[0]
    assert list(shell_commands(block)) == [(2, "a  b"), (4, "c")]
