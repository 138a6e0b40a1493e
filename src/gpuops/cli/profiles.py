"""`gpuops profiles` and `gpuops profiles show NAME`: what profiles exist, and what one resolves to."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .app import Group, JsonOpt, app, output, pick_profile

profiles_app = typer.Typer(cls=Group, help="List profiles, or show one as gpuops resolves it (secret values masked).",
                           invoke_without_command=True)
app.add_typer(profiles_app, name="profiles")

SECRET_HINTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD")


@profiles_app.callback()
def list_profiles(ctx: typer.Context, json_: bool = JsonOpt) -> None:
    """List the profiles found (project, user, packaged examples), and which one is selected here."""
    if ctx.invoked_subcommand:
        return
    from .. import profiles

    out = output(json_)
    cwd = Path.cwd()
    found = profiles.available(cwd)
    mine = profiles.available(cwd, examples=False)
    last = profiles.last_used(cwd)
    rows = [{"name": n, "file": str(p), "example": n not in mine, "last_used_here": n == last} for n, p in found.items()]
    if json_:
        out.emit_json(rows)
        return
    if not rows:
        out.print("no profiles found; `gpuops sandbox up` writes one named 'sandbox'")
        return
    for r in rows:
        flags = " (example)" if r["example"] else ""
        flags += " (last used here)" if r["last_used_here"] else ""
        out.print(f"{r['name']:<28} {r['file']}{flags}")


@profiles_app.command("show")
def show(name: Optional[str] = typer.Argument(None, help="Profile name or path.", show_default=False),
         json_: bool = JsonOpt) -> None:
    """Print a profile as resolved (defaults filled, ${VAR} expanded, secret-looking values masked)."""
    out = output(json_)
    prof = pick_profile(name)
    data = prof.model_dump(mode="json", exclude={"source"})
    secret_names = set(prof.secrets) | {"WANDB_API_KEY"}
    data["env"] = {k: ("***" if k in secret_names or any(h in k.upper() for h in SECRET_HINTS) else v)
                   for k, v in data["env"].items()}
    data["file"] = str(prof.source)
    if json_:
        out.emit_json(data)
        return
    import yaml

    out.print(f"# {prof.source}")
    out.print(yaml.safe_dump(data, sort_keys=False).rstrip())
