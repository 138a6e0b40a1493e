"""`gpuops plan --script X`: the local plan of a job, shown without launching anything (docs/plan.md)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .app import JsonOpt, app, output


@app.command("plan")
def plan_cmd(
    script: str = typer.Option(..., "--script", "-s", help="The job, as `gpuops run --script` takes it (.py or .sh)."),
    from_: Optional[str] = typer.Option(None, "--from", help="Take setup: and expect: from this profile, as `gpuops "
                                                             "run --from` does; a Slurm profile's: judged against its "
                                                             "nodes, as `gpuops verify` saved them here."),
    image: Optional[str] = typer.Option(None, "--image", help="Judge for this image family of playbooks/images.yaml "
                                                              "(default: the one a launch boots)."),
    no_resolve: bool = typer.Option(False, "--no-resolve", help="Do not resolve the requirements here (uv): the "
                                                                "static checks only."),
    timeout: float = typer.Option(20.0, "--timeout", help="Seconds the resolution may take before the plan falls "
                                                          "back to the static checks."),
    prep: Optional[str] = typer.Option(None, "--prep", metavar="CMD", help="Judge this preparation command too, "
                                                                          "as `gpuops run --prep CMD` does (first)."),
    prep_out: List[str] = typer.Option([], "--prep-out", metavar="PATH", help="What the preparation keeps for the "
                                                                              "job, as `gpuops run --prep-out`."),
    data: Optional[str] = typer.Option(None, "--data", metavar="SOURCE", help="The run's --data (a folder of the "
                                                                               "project is at $GPUOPS_DATA, not at "
                                                                               "its path)."),
    args: Optional[List[str]] = typer.Argument(None, help="The script's arguments, after --, as `gpuops run` takes "
                                                          "them.", show_default=False),
    json_: bool = JsonOpt,
) -> None:
    """Show what `gpuops run` would judge before it launches, and launch nothing: every script the launch line
    reaches, the modules the job imports at any depth and what provides each, the requirements resolved for the
    image (what setup installs, its size, what would replace the image's torch), refusals with their fixes, warnings
    and hints; the data the job reads that the project lacks. Exit 0 when `run` would launch, 1 when it would
    refuse."""
    from ..cloud.managed import template_for
    from ..jobs.plan import script_path
    from ..pipeline.prelaunch import run_options, settings_of
    from ..project.plan import local_plan
    from ..project.verdict import summary

    out = output(json_)
    project = Path.cwd()
    rel = script_path(script, project, must_exist=True)
    template = template_for(from_, project)
    cluster = _cluster_profile(from_, project)
    if prep is not None or prep_out:
        from ..pipeline.prepplan import check_outs

        if not (prep or "").strip():
            from ..errors import UsageError

            raise UsageError("--prep-out without --prep: give the preparation's command with --prep CMD"
                             if prep is None else "--prep '': the preparation's command is empty")
        prep_out = check_outs(prep_out)
    if data:
        from ..transfer.dataplan import parse

        parse(data, project)  # checked as run checks it
    run = run_options(project, args, {"command": prep, "outs": prep_out} if prep else None, data)
    if cluster is not None:  # a Slurm profile: judged against its nodes as `gpuops verify` found them
        from ..slurm.runs import cluster_plan

        plan = cluster_plan(cluster, project, rel, settings_of(template), image=image, resolve=not no_resolve,
                            timeout_s=timeout, run=run)
    else:
        plan = local_plan(project, rel, settings_of(template), image=image or "launched", resolve=not no_resolve,
                          timeout_s=timeout, run=run)
    if image and plan.image is None:
        from ..errors import UsageError

        raise UsageError(f"--image {image}: playbooks/images.yaml has no such image family")
    if json_:
        out.emit_json(plan.to_json())
        raise typer.Exit(1 if plan.refused else 0)
    out.print(summary(plan))
    for r in plan.runs:
        by = f"  (run by {r['by']})" if r["by"] else ""
        out.print(f"  runs: {r['launcher'] + ' ' if r['launcher'] else ''}{r['kind']} {r['target']}{by}")
    for m in plan.modules:
        if m.status not in ("stdlib", "project"):
            out.print(f"  module {m.module}: {m.status}" + (f" ({m.provider})" if m.provider else "")
                      + f"  <- {m.needed_by}")
    res = plan.resolution
    if res is not None and res.available:
        out.print("  setup installs: " + (", ".join(f"{k}=={v}" for k, v in sorted(res.packages.items())) or "nothing"))
    for p, f in plan.certain + plan.refusals:
        out.print(f"REFUSED: {p}")
        out.print(f"  {f}")
    for w in plan.warnings:
        out.warn(w)
    for h in plan.hints:
        out.info(h)
    if plan.refused:
        out.error((f"gpuops train -p {cluster.name} would refuse this job before submitting anything" if cluster
                   else "gpuops run would refuse this job before launching anything") +
                  ("" if plan.certain else " (--force launches past these)"))
        raise typer.Exit(1)
    out.success(f"gpuops train -p {cluster.name} would submit this job" if cluster else
                "gpuops run would launch this job (the instance's own checks come after)")


def _cluster_profile(name: Optional[str], project: Path):
    """The --from profile when it is a Slurm cluster's (a `slurm:` section), else None."""
    if not name:
        return None
    from ..profiles.model import resolve

    prof = resolve(name, project)
    return prof if getattr(prof, "slurm", None) is not None else None
