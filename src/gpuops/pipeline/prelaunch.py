"""`gpuops run`, before anything is launched (issue #28): what this machine can know about the job, read from the
project's files and judged against knowledge, so that a job that cannot run is refused before an instance bills.

- the script itself: Windows line endings, relative imports run as a file (jobs/script_imports.script_problems,
  as `train` refuses them);
- the project's dependency files: a poetry, pdm or conda project with nothing setup installs (setup/project.py
  tool_project), a requires-python that the python of the image a launch boots does not meet (playbooks/images.yaml:
  none of them -> refused; only some -> a warning, and setup checks the python the instance has);
- a .sh job that switches to a conda environment, where the launched images have no conda.

Pure apart from reading the local files: `findings` returns what `check` raises or warns."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

CONDA_SWITCH = re.compile(r"(^|[\s;&|(])(conda|mamba|micromamba)\s+(activate|run)\b", re.M)
DEPENDENCY_FILES = ("uv.lock", "pyproject.toml", "poetry.lock", "pdm.lock", "environment.yml", "environment.yaml")


@dataclass
class Findings:
    problems: list[tuple[str, str]] = field(default_factory=list)  # (problem, fix): refused
    warnings: list[str] = field(default_factory=list)


def _text(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def findings(project: Path, script: str, images_doc: dict, template: Optional[dict] = None) -> Findings:
    from ..jobs.script_imports import script_problems
    from ..setup import project as sproj

    found = Findings(problems=list(script_problems(project, script)))
    setup = (template or {}).get("setup") or {}
    requirements = list(setup.get("requirements") or ["requirements.txt"])
    files = {f for f in (*DEPENDENCY_FILES, *requirements) if (project / f).is_file()}
    pyproject = _text(project / "pyproject.toml") if "pyproject.toml" in files else None
    images = {str(i.get("family")): i for i in images_doc.get("images") or [] if isinstance(i, dict)}
    launched = [images[f] for f in images_doc.get("launched") or [] if f in images]

    tp = sproj.tool_project(files, pyproject, requirements, images_doc.get("project_tools") or [])
    if tp is not None and not tp.installable:
        problem, hint = sproj.tool_refusal(tp, requirements)
        found.problems.append((problem, "fix: " + hint))

    spec = sproj.requires_python(pyproject) if sproj.parse_pyproject(pyproject)["project"] else None
    image_python = str(setup.get("base_python") or "python3") in ("python3", "python", "/usr/bin/python3")
    if spec and launched and image_python:
        misses = [i for i in launched if sproj.python_meets(spec, str(i.get("python"))) is False]
        said = ", ".join(f"{i['family']}: {i['python']}" for i in misses)
        if len(misses) == len(launched):
            found.problems.append((f"pyproject.toml says requires-python = \"{spec}\", and the python of the image a "
                                   f"launch boots does not meet it ({said})",
                                   "fix: lower requires-python if the code runs on that python (the image's python "
                                   "has the CUDA torch); the images' pythons are in playbooks/images.yaml"))
        elif misses:
            found.warnings.append(f"pyproject.toml says requires-python = \"{spec}\", which the python of some images a "
                                  f"launch may boot does not meet ({said}): setup refuses such an instance before it "
                                  "installs anything")

    if script.endswith((".sh", ".bash")) and launched and not any(i.get("conda") for i in launched):
        text = _text(project / script) or ""
        m = CONDA_SWITCH.search(text)
        if m:
            found.problems.append((f"{script} runs `{m.group(2)} {m.group(3)}`, and the images a launch boots have no "
                                   f"{m.group(2)}", "fix: drop that line: the job runs in the run's environment "
                                   "(setup installs the project's requirements into it, and its bin/ is first on the "
                                   "job's PATH)"))
    return found


def check(project: Path, script: str, out, template: Optional[dict] = None) -> None:
    """Refuse (ChecksFailed, exit 1) what `findings` finds, or say its warnings; before anything is launched."""
    from .. import knowledge as kb
    from ..errors import ChecksFailed

    from ..profiles.model import dotenv_problems

    got = findings(project, script, kb.load_playbook("images", project), template)
    for w in got.warnings:
        out.warn(w)
    for w in dotenv_problems(project / ".env"):  # a line the job will not get, said before anything bills
        out.warn_once(w)
    if got.problems:
        raise ChecksFailed("; ".join(p for p, _ in got.problems) + "; nothing was launched",
                           hint="\n".join(f for _, f in got.problems))
