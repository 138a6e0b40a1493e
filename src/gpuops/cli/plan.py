"""`gpuops plan --script X`: the local plan of a job, shown without launching anything (docs/plan.md)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .app import JsonOpt, app, output


@app.command("plan")
def plan_cmd(
    script: str = typer.Option(..., "--script", "-s", help="The job, as `gpuops run --script` takes it (.py or .sh)."),
    from_: Optional[str] = typer.Option(None, "--from", help="Take setup: and expect: from this profile, as `gpuops "
                                                             "run --from` does."),
    image: Optional[str] = typer.Option(None, "--image", help="Judge for this image family of playbooks/images.yaml "
                                                              "(default: the one a launch boots)."),
    no_resolve: bool = typer.Option(False, "--no-resolve", help="Do not resolve the requirements here (uv): the "
                                                                "static checks only."),
    timeout: float = typer.Option(20.0, "--timeout", help="Seconds the resolution may take before the plan falls "
                                                          "back to the static checks."),
    json_: bool = JsonOpt,
) -> None:
    """Show what `gpuops run` would judge before it launches, and launch nothing: every script the launch line
    reaches, the modules the job imports at any depth and what provides each, the requirements resolved for the
    image (what setup installs, its size, what would replace the image's torch), refusals with their fixes, warnings
    and hints. Exit 0 when `run` would launch, 1 when it would refuse."""
    from ..cloud.managed import template_for
    from ..jobs.plan import script_path
    from ..pipeline.prelaunch import settings_of
    from ..project.plan import local_plan
    from ..project.verdict import summary

    out = output(json_)
    project = Path.cwd()
    rel = script_path(script, project, must_exist=True)
    template = template_for(from_, project)
    plan = local_plan(project, rel, settings_of(template), image=image or "launched", resolve=not no_resolve,
                      timeout_s=timeout)
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
        out.error("gpuops run would refuse this job before launching anything" +
                  ("" if plan.certain else " (--force launches past these)"))
        raise typer.Exit(1)
    out.success("gpuops run would launch this job (the instance's own checks come after)")
