"""`gpuops setup [NAME]`: bring the host to the profile's stack (plan, detached steps, re-attach, verify)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .app import HostOpt, JsonOpt, ProfileOpt, app, output, pick_profile


@app.command()
def setup(
    name: Optional[str] = typer.Argument(None, help="Profile name.", show_default=False),
    profile: Optional[str] = ProfileOpt,
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the plan (steps, reasons, which torch the job will "
                                                          "import, indexes, disk) and stop."),
    force: bool = typer.Option(False, "--force", help="Install the project's dependencies again even if nothing "
                                                      "they are read from has changed."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Do not run verify after the steps."),
    json_: bool = JsonOpt,
    host: Optional[int] = HostOpt,
) -> None:
    """Make the host match the profile: create the python: environment (seeing the system's packages, so an image's
    CUDA torch is used; a profile without python: gets ~/.venvs/gpuops), install the synced project's dependencies
    (uv.lock, requirements files with their includes, pyproject editable; setup.extras, `all` too) with the host's
    pip configuration, torch for the driver's CUDA when the project or expect.packages pins one the image lacks,
    and flash-attn; refuses a plan that does not fit the disk; long steps run detached (run setup again to
    re-attach); ends with verify. Idempotent."""
    from ..setup import apply as setup_ops
    from ..verify.host import exit_code, show

    out = output(json_)
    fleet_prof = pick_profile(name, profile)
    if fleet_prof.is_fleet and host is None:
        raise typer.Exit(_setup_fleet(fleet_prof, out, dry_run=dry_run, verify=not no_verify, force=force))
    prof = fleet_prof.node(host)
    _local_plan(prof, out)
    notes_shown = []

    def on_plan(plan) -> None:
        for line in plan.lines():
            out.print(line)
        for n in plan.notes:
            out.warn(n)
        notes_shown.append(plan)

    doc = setup_ops.setup(prof, out, Path.cwd(), dry_run=dry_run, verify=not no_verify, force=force, on_plan=on_plan)
    results = doc.pop("verify_results", None)
    code = 0
    if doc["verify"] is not None:
        if not json_:
            show(out, doc["verify"], results)
        code = exit_code(doc["verify"])
    if json_:
        out.emit_json(doc)
    elif doc["plan"] and doc["plan"]["nothing_to_do"]:
        out.success(f"{prof.name} already matches the profile: nothing installed "
                    f"({doc['executions']} remote execution)")
    elif dry_run:
        out.info("dry run: nothing was changed on the host")
    elif code == 0:
        out.success(f"{prof.name} is set up" + ("" if no_verify else " and verify passes"))
    from ..profiles import model as profiles

    profiles.remember(prof, Path.cwd())
    raise typer.Exit(code)


def _local_plan(prof, out) -> None:
    """What the project's files say before setup connects (gpuops.project): dependency files setup will not install
    (a setup.py no requirements file installs, requirements/*.txt setup is not told about), said as warnings."""
    from ..project.plan import Settings, local_plan
    from ..project.verdict import report

    report(local_plan(Path.cwd(), "", Settings.of_profile(prof), image=None, resolve=False), out, quiet=True)


def _setup_fleet(prof, out, *, dry_run: bool, verify: bool, force: bool = False) -> int:
    """Every host of a fleet profile in parallel (hostpool.for_each: a bounded pool, a section per host in rank order);
    the worst host's exit code."""
    from ..setup import apply as setup_ops
    from ..hostpool import for_each_buffered
    from ..verify.host import exit_code, show

    def one(node, node_out):
        def on_plan(plan) -> None:
            for line in plan.lines():
                node_out.print(line)

        doc = setup_ops.setup(node, node_out, Path.cwd(), dry_run=dry_run, verify=verify, force=force,
                              on_plan=on_plan)
        results = doc.pop("verify_results", None)
        if doc["verify"] is not None and results is not None and not node_out.json_mode:
            show(node_out, doc["verify"], results)
        if doc["verify"] is not None and exit_code(doc["verify"]):
            from ..errors import ChecksFailed

            raise ChecksFailed(f"verify fails on host #{node.rank} after setup")
        return doc

    def render(node_out, doc) -> None:
        if doc["plan"] and doc["plan"]["nothing_to_do"]:
            node_out.print("already matches the profile: nothing installed")
        elif dry_run:
            node_out.info("dry run: nothing was changed on the host")
        else:
            node_out.success("set up" + (" and verify passes" if verify else ""))

    code = for_each_buffered(prof, out, one, render, title="setup")
    if code == 0:
        from ..profiles import model as profiles

        profiles.remember(prof, Path.cwd())
    return code
