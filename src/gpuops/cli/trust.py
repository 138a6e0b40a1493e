"""`gpuops trust NAME [--reset]`: record a host's key (strict profiles), or forget a changed one."""
from __future__ import annotations

from typing import Optional

import typer

from .app import JsonOpt, ProfileOpt, app, output, pick_profile


@app.command()
def trust(
    name: Optional[str] = typer.Argument(None, help="Profile name.", show_default=False),
    profile: Optional[str] = ProfileOpt,
    reset: bool = typer.Option(False, "--reset", help="Forget the recorded key first (a recycled cloud IP, a rebuilt instance)."),
    fingerprint: Optional[str] = typer.Option(None, "--fingerprint", help="Only trust a key with this SHA256 fingerprint."),
    json_: bool = JsonOpt,
) -> None:
    """Fetch the host's key and record it in gpuops' known_hosts, printing its SHA256 fingerprint."""
    from ..remote import trust as core

    out = output(json_)
    prof = pick_profile(name, profile)
    res = core.trust(prof, reset=reset, expected=fingerprint)
    if json_:
        out.emit_json(res)
        return
    if res["removed"]:
        out.info(f"forgot {res['removed']} recorded key(s) for {res['host']}")
    if res["already"]:
        out.success(f"{res['host']} already trusted: {res['type']} {res['fingerprint']}")
    else:
        out.success(f"trusted {res['host']}: {res['type']} {res['fingerprint']} (in {res['file']})")
    if res.get("user_file_note"):
        out.warn(res["user_file_note"])
