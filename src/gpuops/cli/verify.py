"""`gpuops verify [NAME]`: is the remote GPU stack what the profile expects?"""
from __future__ import annotations

from typing import Optional

import typer

from .app import JsonOpt, ProfileOpt, app, output, pick_profile


@app.command()
def verify(
    name: Optional[str] = typer.Argument(None, help="Profile name (e.g. lambda-h100, sandbox).", show_default=False),
    profile: Optional[str] = ProfileOpt,
    playbook: Optional[str] = typer.Option(None, "--playbook", help="Playbook YAML (default: ./playbooks/verify.yaml, "
                                                                    "else the built-in one)."),
    json_: bool = JsonOpt,
    no_save: bool = typer.Option(False, "--no-save", help="Do not save the report under logs/env_checks/."),
    no_cuda: bool = typer.Option(False, "--no-cuda-check", help="Skip the CUDA tensor test (faster on busy GPUs)."),
    fail_on_warn: bool = typer.Option(False, "--fail-on-warn", help="Exit 1 on warnings too (for CI gates)."),
) -> None:
    """Check GPUs, driver, CUDA, Python and packages in one remote execution; report pass/warn/fail with fixes."""
    from .. import verify as core

    out = output(json_)
    prof = pick_profile(name, profile)
    code = core.run_verify(prof, out, playbook=playbook, save=not no_save, cuda_check=not no_cuda,
                           fail_on_warn=fail_on_warn)
    raise typer.Exit(code)
