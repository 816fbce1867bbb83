"""One error type, one handler: every error a command ends with is printed by ``cli.main``
the same way (label, message, then the fix on its own line), redacted, with its exit code."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest

from servebook import cli, commands, redact
from servebook.backends.base import UpFailed
from servebook.errors import ServebookError, UsageError

MainRaising = Callable[[BaseException], tuple[int, str]]


@pytest.fixture
def main_raising(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> MainRaising:
    """``cli.main`` over an app that raises the given exception: its exit code and stderr."""

    def run(exc: BaseException) -> tuple[int, str]:
        def app() -> None:
            raise exc

        monkeypatch.setattr(commands, "app", app)
        with pytest.raises(SystemExit) as e:
            cli.main()
        code = e.value.code
        assert isinstance(code, int)
        return code, capsys.readouterr().err

    return run


def test_usage_error_prints_the_message_then_the_fix_on_its_own_line_and_exits_2(
    main_raising: MainRaising,
) -> None:
    exc = UsageError("port 8000 on 127.0.0.1 is already taken.", hint="Choose one with --port.")
    code, err = main_raising(exc)
    assert code == 2
    assert err.splitlines() == [
        "error: port 8000 on 127.0.0.1 is already taken.",
        "fix: Choose one with --port.",
    ]


def test_an_error_without_a_hint_prints_one_line(main_raising: MainRaising) -> None:
    code, err = main_raising(UsageError("no deployment named 'x' is up."))
    assert code == 2 and err.splitlines() == ["error: no deployment named 'x' is up."]


def test_up_failed_keeps_its_label_and_exit_1_through_the_same_handler(
    main_raising: MainRaising,
) -> None:
    exc = UpFailed("timed out waiting for /health: mixed.", role="mixed", hint="Raise --timeout.")
    code, err = main_raising(exc)
    assert code == 1
    assert err.splitlines() == [
        "up failed: timed out waiting for /health: mixed.",
        "fix: Raise --timeout.",
    ]


def test_message_and_hint_are_redacted_and_never_read_as_markup(main_raising: MainRaising) -> None:
    redact.remember("s3cret-key-value")
    exc = ServebookError(
        "refused [bold]s3cret-key-value[/bold]", hint="unset s3cret-key-value", exit_code=1
    )
    code, err = main_raising(exc)
    assert code == 1
    assert "s3cret-key-value" not in err
    assert "[bold]" in err  # printed as text, not as a style


def test_an_error_keeps_its_hint_and_exit_code_across_processes() -> None:
    # Bench workers send their errors back pickled.
    exc = pickle.loads(pickle.dumps(ServebookError("m", hint="h", exit_code=1, label="bench")))
    assert (str(exc), exc.hint, exc.exit_code, exc.label) == ("m", "h", 1, "bench")
    up = pickle.loads(pickle.dumps(UpFailed("m", role="decode", log_tail="t")))
    assert (up.role, up.log_tail, up.exit_code) == ("decode", "t", 1)
