"""`gpuops trust NAME [--reset]`: record a host's key (strict profiles), or forget a changed one."""
from __future__ import annotations

from typing import Optional

import typer

from .completion import profile_names
from .app import JsonOpt, ProfileOpt, app, output, pick_profile


@app.command()
def trust(
    name: Optional[str] = typer.Argument(None, help="Profile name.", show_default=False, autocompletion=profile_names),
    profile: Optional[str] = ProfileOpt,
    reset: bool = typer.Option(False, "--reset", help="Replace the recorded key (a recycled cloud IP, a rebuilt "
                                                      "instance): only once the new key is fetched and matches "
                                                      "--fingerprint, or you confirm it (--yes)."),
    fingerprint: Optional[str] = typer.Option(None, "--fingerprint", help="Only trust a key with this SHA256 fingerprint."),
    yes: bool = typer.Option(False, "--yes", "-y", help="With --reset and no --fingerprint: accept the new key "
                                                        "without asking."),
    json_: bool = JsonOpt,
) -> None:
    """Fetch the host's key and record it in gpuops' known_hosts, printing its SHA256 fingerprint. On any failure
    the recorded keys stay as they were."""
    import sys

    from ..remote import trust as core

    out = output(json_)
    prof = pick_profile(name, profile)

    def confirm(question: str) -> bool:
        if yes:
            return True
        if not sys.stdin.isatty():
            return False
        return typer.confirm(question, default=False, err=True)

    res = core.trust(prof, reset=reset, expected=fingerprint, confirm=confirm)
    if json_:
        out.emit_json(res)
        return
    if res["removed"]:
        out.info(f"forgot {res['removed']} recorded key(s) for {res['host_id']} and recorded the new one")
    if res["already"]:
        out.success(f"{res['host_id']} already trusted: {res['type']} {res['fingerprint']}")
    else:
        out.success(f"trusted {res['host_id']}: {res['type']} {res['fingerprint']} (in {res['file']})")
    if res.get("user_file_note"):
        out.warn(res["user_file_note"])
