"""`gpuops run`, before anything is launched (issues #28, #34): the local plan (gpuops.project.plan) of the job's
files for the image a launch boots, said and enforced before the first launch request, so that a job whose own files
decide it cannot run is refused before an instance bills. What it judges is project/plan.py's: the launch line and
every script it reaches, the import closure at any depth, the dependency files, a resolution for the image.

`findings` returns the plan (pure but for reading the files and the resolver); `check` says it and refuses."""
from __future__ import annotations

from pathlib import Path
from typing import Optional


def settings_of(template: Optional[dict]):
    """The setup settings the run's profile will have: its --from template's `setup:` and `expect:`."""
    from ..project.plan import Settings

    t = template or {}
    return Settings.of(t.get("setup"), t.get("expect"))


def findings(project: Path, script: str, template: Optional[dict] = None, *, resolve: bool = True,
             timeout_s: float = 20.0):
    """The local plan of `script` for the image a launch boots (playbooks/images.yaml `launched`)."""
    from ..project.plan import local_plan

    return local_plan(project, script, settings_of(template), resolve=resolve, timeout_s=timeout_s)


def check(project: Path, script: str, out, template: Optional[dict] = None, *, force: bool = False,
          resolve: bool = True) -> dict:
    """Build the plan, say it, and refuse (ChecksFailed, exit 1) what it refuses; before anything is launched.
    Returns the plan's JSON document (the run's record carries it)."""
    from ..profiles.model import dotenv_problems
    from ..project.verdict import enforce, report

    plan = findings(project, script, template, resolve=resolve)
    report(plan, out)
    for w in dotenv_problems(project / ".env"):  # a line the job will not get, said before anything bills
        out.warn_once(w)
    enforce(plan, force=force, done="nothing was launched", out=out)
    return plan.to_json()
