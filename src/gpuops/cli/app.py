"""The typer application and the options every command shares. Keep imports light: this runs on `--help`."""
from __future__ import annotations

import typer
import typer.core

# output, with_warnings, pick_profile, confirmer and the --debug flag they read live in basics.py (no typer there:
# `gpuops sync` may start without it: quick.py); imported here for every command module
from .basics import confirmer, output, pick_profile, with_warnings  # noqa: F401
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


def _show_version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"gpuops {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_show_version,
                                       help="Show the version and exit.")) -> None:
    pass
