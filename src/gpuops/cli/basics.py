"""What every command shares and that needs no typer: its Output, the --json warnings, the profile it acts on, the
yes/no before something costly. typer is not imported here (`gpuops sync` may start without it: quick.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional


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

    given = one_profile(name, option)
    return introduce(profiles.resolve(given, Path.cwd()), given, out, announce=announce)


def one_profile(name: Optional[str], option: Optional[str]) -> Optional[str]:
    """The profile a command was given, by name or -p (both: the same, else a usage error), or None."""
    if name and option and name != option:
        from ..errors import UsageError

        raise UsageError(f"two profiles given: '{name}' and --profile '{option}'")
    return name or option


def introduce(prof, given: Optional[str], out=None, *, announce: bool = True):
    """The command's first line (which profile and why) and a managed profile's warnings, for `prof` as chosen."""
    from ..profiles.locate import selected_how

    if announce:
        (out or output()).info(f"profile: {prof.name} ({selected_how(given, prof, Path.cwd())})")
    if prof.cloud is not None:  # a gpuops-managed instance: warn when past its TTL or idle limit (no network)
        from ..cloud.meter import warnings

        for w in warnings(prof):
            (out or output()).warn(w)
    return prof


def confirmer(yes: bool):
    """A question asked before something costly (a launch, a large upload): at a terminal, typer's yes/no (default
    no); answered yes with --yes, and without a terminal (the warning said before it stays on stderr)."""
    import sys

    def confirm(question: str) -> bool:
        if yes or not sys.stdin.isatty():
            return True
        import typer

        return typer.confirm(question, default=False, err=True)

    return confirm
