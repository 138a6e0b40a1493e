"""Entry point: a plain `gpuops sync` to quick.py, anything else to typer (commands.py); every error is one message
and an exit code."""
from __future__ import annotations

import os
import sys

from . import basics as _basics

DEBUG = False
_basics.debug_flag = lambda: DEBUG  # the flag commands read through output(), without importing this module


def _full_app():
    """The typer app with every command registered (commands.py imports each command module). Not imported by a
    start quick.py answers: `gpuops sync` runs without typer."""
    from .commands import app

    return app


def __getattr__(name: str):
    if name == "app":  # `from gpuops.cli.main import app`, as before the start without typer
        return _full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run(argv: list[str] | None = None) -> int:
    """Console script `gpuops`. Returns (and exits with) the documented exit code."""
    global DEBUG
    args = list(sys.argv[1:] if argv is None else argv)
    cut = args.index("--") if "--" in args else len(args)
    if "--debug" in args[:cut]:
        args.remove("--debug")
        DEBUG = True
    DEBUG = DEBUG or bool(os.environ.get("GPUOPS_DEBUG"))
    from ..errors import ExitCode, GpuopsError, set_command

    set_command(_command_name(args[:cut]))
    _quiet_libraries(DEBUG)

    code: int
    try:
        from .quick import take

        rv = take(args)  # a plain `gpuops sync` on a kept profile: no typer, no pydantic (quick.py)
        if rv is None:
            rv = _app_for(args[:cut])(args=args, prog_name="gpuops", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
        if code == ExitCode.INTERRUPTED:  # typer turns Ctrl-C into exit 130
            print("interrupted", file=sys.stderr)
    except GpuopsError as exc:
        _report(exc.message, exc.hint, exc)
        code = int(exc.code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = int(ExitCode.INTERRUPTED)
    except Exception as exc:  # click usage errors and anything unexpected
        code = _click_or_internal(exc, args)
    if argv is None:
        _no_stale_interrupt()
        sys.exit(code)
    return code


def _no_stale_interrupt() -> None:
    """gpuops has decided its exit status: make sure CPython does not override it. A KeyboardInterrupt (Ctrl-C, or
    SIGTERM/SIGHUP through interrupts.py) that escapes code run from a string (`exec` of source text: every
    dataclass and namedtuple defined during a lazy import) sets CPython's "unhandled KeyboardInterrupt" flag even when
    gpuops catches it later, and `python -m gpuops` then ends by SIGINT on its way out (-2, not the 130 said): a
    SIGTERM during `down` that landed while tenacity was being imported did so. Running any source string clears
    that flag as it starts (CPython's run_eval_code_obj), so one no-op does it, on every Python."""
    exec("pass", {})


def _app_for(args: list[str]):
    """The app typer turns into click commands for this call: only the command it names (a group whole), beside the
    root's callback. Typer reads every registered command's signature and type hints at each call (about 40 ms for
    gpuops' 40-odd commands, paid by every command, `gpuops sync` included); the one named is all a call runs. A word
    that names no command, or none given (`gpuops`, `gpuops --help`), gets the whole app: its listing and its
    suggestions."""
    import copy

    from typer.main import get_command_name

    app = _full_app()
    word = next((a for a in args if not a.startswith("-")), None)
    if word is None:
        return app
    cmds = [c for c in app.registered_commands if (c.name or get_command_name(c.callback.__name__)) == word]
    groups = [g for g in app.registered_groups if (g.name or g.typer_instance.info.name) == word]
    if not cmds and not groups:
        return app
    slim = copy.copy(app)
    slim.registered_commands, slim.registered_groups = cmds, groups
    return slim


GROUPS = ("profiles", "cloud", "sandbox")  # command groups: their subcommand is part of the name


def _command_name(args: list[str]) -> str:
    """"gpuops sync", "gpuops profiles new": the words before the first option or argument that is not a command."""
    words = [a for a in args if not a.startswith("-")][:2]
    name = words[:2] if words and words[0] in GROUPS else words[:1]
    return " ".join(["gpuops", *name])


_SILENT = []  # the handler that keeps paramiko's log (a traceback per failed handshake) off stderr


class _WhenParamikoComes:
    """A finder on sys.meta_path that finds nothing: it sees paramiko's import come and quiets its log first (a
    command that never connects through paramiko, a plain sync, imports neither paramiko nor logging)."""

    def __init__(self, debug: bool) -> None:
        self.debug = debug

    def find_spec(self, name, path=None, target=None):
        if name == "paramiko":
            _unhook()
            _quiet_now(self.debug)
        return None


def _unhook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _WhenParamikoComes)]


def _quiet_libraries(debug: bool) -> None:
    """Paramiko logs every failed handshake (a host that drops the connection before the SSH banner) as an ERROR
    with a traceback, which Python's last-resort handler prints on stderr: 44-66 lines before gpuops' one message.
    Without --debug that log goes nowhere; with it, it is printed as before. Done when paramiko is imported (or now,
    if it is already)."""
    _unhook()
    if "paramiko" in sys.modules or "logging" in sys.modules:
        _quiet_now(debug)
    else:
        sys.meta_path.insert(0, _WhenParamikoComes(debug))


def _quiet_now(debug: bool) -> None:
    import logging

    log = logging.getLogger("paramiko")
    if not _SILENT:
        _SILENT.append(logging.NullHandler())
    log.propagate = debug  # nor through a handler some library set on the root logger
    if debug:
        log.removeHandler(_SILENT[0])
    elif _SILENT[0] not in log.handlers:
        log.addHandler(_SILENT[0])


def _report(message: str, hint: str | None, exc: BaseException | None) -> None:
    """The one error line (+hint) and, with --debug, the traceback: every text scrubbed of the API key in each form
    it can take (an exception of any library may carry it, escaped or as bytes)."""
    from ..console import Output

    api = sys.modules.get("gpuops.cloud.api")  # a key is only ever loaded through it: not imported, nothing to hide
    scrub = api.redact if api else (lambda text: text)
    out = Output(debug=DEBUG)
    if DEBUG and exc is not None:
        import traceback

        sys.stderr.write(scrub("".join(traceback.format_exception(type(exc), exc, exc.__traceback__))))
        sys.stderr.flush()
    out.error(scrub(message), scrub(hint) if hint else None)


def _from_paramiko(exc: BaseException) -> bool:
    """Was exc raised inside paramiko (a write on a closed socket: a bare EOFError), rather than at a prompt whose
    input ended?"""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}paramiko{os.sep}" in tb.tb_frame.f_code.co_filename


def _click_or_internal(exc: Exception, args: list[str] = ()) -> int:
    """Usage errors (typer's vendored click), typer's Abort/Exit, and the last resort for anything unexpected: one
    line and exit 1, a traceback only with --debug. Nothing in here may raise (it is the fallback)."""
    try:
        import typer
        from typer._click import exceptions as cx

        if isinstance(exc, cx.ClickException):
            exc.show()
            from .slips import hint

            said = hint(exc, list(args))
            if said:
                print(f"hint: {said}", file=sys.stderr)
            return exc.exit_code
        if isinstance(exc, typer.Abort):
            cause = exc.__context__
            if isinstance(cause, EOFError) and _from_paramiko(cause):  # click takes any EOFError for Ctrl-C
                _report(f"the connection to the host was lost ({type(cause).__name__} in the SSH transport)",
                        "run the command again; a job already started keeps running", cause)
                from ..errors import ExitCode

                return int(ExitCode.CONNECTION)
            print("interrupted", file=sys.stderr)
            return 130
        if isinstance(exc, typer.Exit):
            return int(getattr(exc, "exit_code", 0) or 0)
    except Exception:  # noqa: BLE001 - the fallback must not fail itself
        pass
    text = str(exc).splitlines()[0] if str(exc) else ""
    _report(f"internal error: {type(exc).__name__}: {text}", None if DEBUG else "run again with --debug for a traceback",
            exc)
    return 1
