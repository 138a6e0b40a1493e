"""Values for shell completion (`gpuops --install-completion`): profile names, run ids, fetch names.

Read from local files only (./profiles/, the user config folder, the packaged examples; ./runs/; the profile's
fetch: keys), never over a connection. Imported at start-up, so only typer here; the modules that read the files are
imported inside the callbacks, which run only when the shell asks. A callback never raises: no values is the answer
to anything unexpected.
"""
from __future__ import annotations

from typing import List

import typer


def profile_names(incomplete: str) -> List[str]:
    try:
        from ..profiles import model as profiles

        return [n for n in profiles.available() if n.startswith(incomplete)]
    except Exception:
        return []


def run_ids(ctx: typer.Context, incomplete: str) -> List[str]:
    try:
        from ..jobs import plan as runs

        prof = ctx.params.get("profile") or ctx.params.get("name")
        found = runs.local_runs(prof if prof and "/" not in prof else None) or runs.local_runs()
        return [m["run_id"] for m in found if str(m["run_id"]).startswith(incomplete)]
    except Exception:
        return []


def fetch_names(ctx: typer.Context, incomplete: str) -> List[str]:
    try:
        from pathlib import Path

        from ..profiles import model as profiles

        prof = profiles.resolve(ctx.params.get("profile"), Path.cwd())
        return [n for n in prof.fetch if n.startswith(incomplete)]
    except Exception:
        return []
