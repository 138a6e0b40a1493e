"""The typer application and the options every command shares. Keep imports light: this runs on `--help`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
import typer.core

from .completion import profile_names

class Group(typer.core.TyperGroup):
    """typer's group, minus one cost: typer coerces an absent --help flag (None) through a pydantic adapter, which
    imports pydantic on every `gpuops CMD --help` (~150 ms). An absent flag is simply False."""

    def get_help_option(self, ctx):
        opt = super().get_help_option(ctx)
        if opt is not None and not getattr(opt, "_gpuops_plain", False):
            coerce = opt.process_value
            opt.process_value = lambda c, value: coerce(c, False if value is None else value)
            opt._gpuops_plain = True
        return opt

    def get_params(self, ctx):
        """The same cost for typer's --install-completion/--show-completion (absent: None, coerced through pydantic
        before any subcommand runs): an absent completion flag is passed through as it is, unconverted."""
        params = super().get_params(ctx)
        for p in params:
            if p.name in ("install_completion", "show_completion") and not getattr(p, "_gpuops_plain", False):
                full = p.process_value
                p.process_value = lambda c, value, full=full: None if value is None else full(c, value)
                p._gpuops_plain = True
        return params


app = typer.Typer(
    name="gpuops",
    cls=Group,
    help="Train on rented cloud GPUs from one CLI: verify the GPU stack, sync, train, watch, fetch checkpoints.\n\n"
         "Exit codes: 0 ok, 1 checks or job failed, 2 usage/profile error, 3 connection/authentication/host key, "
         "130 interrupted. Add --debug to any command for a traceback.",
    no_args_is_help=True,
    add_completion=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

ProfileOpt = typer.Option(None, "--profile", "-p", metavar="NAME", autocompletion=profile_names, help="Profile name or YAML path (default: $GPUOPS_PROFILE, "
                                                        "this project's default (`gpuops profiles use`), or the only "
                                                        "one).", show_default=False)
JsonOpt = typer.Option(False, "--json", help="Print one JSON document on stdout (names, units and its schema: "
                                                  "docs/json.md).")
HostOpt = typer.Option(None, "--host", metavar="N", min=0, help="Only host N of a fleet profile (hosts:, 0 = rank 0).",
                       show_default=False)


def _no_debug() -> bool:
    return False


debug_flag = _no_debug  # cli/main.py points this at its --debug flag (main imports this module, never the reverse)


def output(json_mode: bool = False):
    """The Output for this command (console.py decides rich / plain / JSON)."""
    from ..console import Output

    return Output(json_mode=json_mode, debug=debug_flag())


def with_warnings(doc: dict, *outs) -> dict:
    """The --json document with every warning shown while it was made (`warnings`, a list, empty when none): a
    warning printed only on stderr is lost to a script reading stdout."""
    seen: list[str] = []
    for o in outs:
        seen += [w for w in o.warnings if w not in seen]
    if doc.get("warning") and doc["warning"] not in seen:
        seen.append(doc["warning"])
    doc["warnings"] = seen
    return doc


def pick_profile(name: Optional[str], option: Optional[str] = None, out=None, *, announce: bool = True):
    """Positional name wins, then --profile, then the chain in profiles.resolve(). The command's first line says
    which profile and why (`profile: h100 (the default here)`, on stderr; announce=False for a command that only
    shows the profile). The profile's warnings go to `out` (so a --json document can carry them), else to a fresh
    Output."""
    from ..profiles import model as profiles

    if name and option and name != option:
        from ..errors import UsageError

        raise UsageError(f"two profiles given: '{name}' and --profile '{option}'")
    prof = profiles.resolve(name or option, Path.cwd())
    if announce:
        (out or output()).info(f"profile: {prof.name} ({profiles.selected_how(name or option, prof, Path.cwd())})")
    if prof.cloud is not None:  # a gpuops-managed instance: warn when past its TTL or idle limit (no network)
        from ..cloud.meter import warnings

        for w in warnings(prof):
            (out or output()).warn(w)
    return prof


def _show_version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"gpuops {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_show_version,
                                       help="Show the version and exit.")) -> None:
    pass


def confirmer(yes: bool):
    """A question asked before something costly (a launch, a large upload): at a terminal, typer's yes/no (default
    no); answered yes with --yes, and without a terminal (the warning said before it stays on stderr)."""
    import sys

    def confirm(question: str) -> bool:
        if yes or not sys.stdin.isatty():
            return True
        return typer.confirm(question, default=False, err=True)

    return confirm
