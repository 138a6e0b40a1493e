"""cli/main._app_for: a call builds only the command it names (typer reads every registered command's signature and
type hints when it builds an app: issue 42's sync paid it at each call). What a user sees must not change: every
command's and group subcommand's --help, and a usage error, are the same as the whole app's."""
from __future__ import annotations

import contextlib
import io

from typer.main import get_command_name

from gpuops.cli import main


def _said(app, args: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            app(args=args, prog_name="gpuops", standalone_mode=False)
        except BaseException as exc:  # click's usage errors, typer's Exit
            buf.write(f"raised {type(exc).__name__}: {exc}")
    return buf.getvalue()


def _names(typer_app) -> list[str]:
    return [c.name or get_command_name(c.callback.__name__) for c in typer_app.registered_commands]


def test_every_command_says_the_same_as_with_the_whole_app():
    groups = {g.name or g.typer_instance.info.name: g.typer_instance for g in main.app.registered_groups}
    calls = [[w, extra] for w in _names(main.app) + list(groups) for extra in ("--help", "--no-such-option")]
    calls += [[g, sub, "--help"] for g, t in groups.items() for sub in _names(t)]
    assert len(calls) > 60
    for args in calls:
        slim = main._app_for(args)
        assert slim is not main.app and len(slim.registered_commands) + len(slim.registered_groups) == 1, args
        assert _said(slim, args) == _said(main.app, args), args


def test_no_command_or_an_unknown_word_gets_the_whole_app():
    for args in ([], ["--help"], ["--version"], ["nosuch"], ["-p", "x"]):
        assert main._app_for(args) is main.app, args
    assert "sync" in _said(main._app_for(["--help"]), ["--help"])
