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


def run_options(project: Path, args=None, prep: Optional[dict] = None, data: Optional[str] = None):
    """What the plan reads of the run beyond --script (project.plan.RunOptions): the script's arguments, --prep
    and its --prep-out paths (judged with the job, first), --data (a folder of the project is not at its path on the
    instance: it is at $GPUOPS_DATA)."""
    from ..project.plan import RunOptions

    data_dir = None
    if data:
        from ..transfer.dataplan import parse, project_exclude

        data_dir = (project_exclude(parse(data, project), project) or "").strip("/") or None
    return RunOptions(args=tuple(args or ()), prep=(prep or {}).get("command"),
                      prep_outs=tuple((prep or {}).get("outs") or ()), data_dir=data_dir, data_given=bool(data))


def findings(project: Path, script: str, template: Optional[dict] = None, *, resolve: bool = True,
             timeout_s: float = 20.0, run=None):
    """The local plan of `script` (with `run`: project.plan.RunOptions) for the image a launch boots
    (playbooks/images.yaml `launched`)."""
    from ..project.plan import local_plan

    return local_plan(project, script, settings_of(template), resolve=resolve, timeout_s=timeout_s, run=run)


def check(project: Path, script: str, out, template: Optional[dict] = None, *, force: bool = False,
          resolve: bool = True, run=None) -> dict:
    """Build the plan (the --prep command's with the job's: `run`), say it, and refuse (ChecksFailed, exit 1) what
    it refuses; before anything is launched. Returns the plan's JSON document (the run's record carries it)."""
    from ..profiles.model import dotenv_problems
    from ..project.verdict import enforce, report

    plan = findings(project, script, template, resolve=resolve, run=run)
    report(plan, out)
    for w in dotenv_problems(project / ".env"):  # a line the job will not get, said before anything bills
        out.warn_once(w)
    enforce(plan, force=force, done="nothing was launched", out=out)
    return plan.to_json()
