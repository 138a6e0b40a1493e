"""Issue #28, "Before anything is billed": the pure parts. Setup's plan refuses what it cannot install or run
(a poetry/pdm/conda project with nothing setup installs, a requires-python the host's python misses) and installs a
project once; the gate reads accelerate/deepspeed lines and words its fixes; the project's own checks before a launch
(pipeline/prelaunch.py)."""
from __future__ import annotations

from pathlib import Path

from gpuops import knowledge as kb
from gpuops.setup import plan as sp

from test_setup_unit import KNOW, facts, profile

TOOLS = kb.load_playbook("images", Path("/nonexistent"))["project_tools"]
POETRY1 = """[tool.poetry]
name = "rl"
version = "0.1.0"

[tool.poetry.dependencies]
python = "^3.10"
six = "^1.16"
"""
PROJECT = '[project]\nname = "rl"\nversion = "0.1"\nrequires-python = "{spec}"\ndependencies = ["six"]\n'


def test_a_poetry_project_with_nothing_setup_installs_is_blocked_naming_poetry_and_the_export():
    f = facts({"pyproject.toml": POETRY1, "poetry.lock": "# lock\n"})
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj", tools=TOOLS)
    assert not plan.steps and not plan.nothing_to_do  # was: "nothing to do"
    assert "poetry project (poetry.lock)" in plan.blocked
    assert "poetry export -f requirements.txt --output requirements.txt" in plan.blocked_hint
    assert plan.lines()[0].startswith("CANNOT INSTALL the project: this is a poetry project")
    # with a requirements file (the export), setup installs it and says the lock is not read
    f = facts({"pyproject.toml": POETRY1, "poetry.lock": "# lock\n", "requirements.txt": "six==1.16.0\n"})
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj", tools=TOOLS)
    assert plan.blocked is None and [s.id for s in plan.steps] == ["environment", "deps"]
    assert any("setup does not read poetry's lock" in n for n in plan.notes)


def test_pdm_and_conda_projects_are_named():
    f = facts({"pdm.lock": "# lock\n", "pyproject.toml": "[tool.pdm]\ndistribution = false\n"})
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj", tools=TOOLS)
    assert "pdm project (pdm.lock)" in plan.blocked and "pdm export -o requirements.txt" in plan.blocked_hint
    f = facts({"environment.yml": "name: rl\ndependencies:\n  - pytorch\n"})
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj", tools=TOOLS)
    assert "conda project (environment.yml)" in plan.blocked and "requirements.txt" in plan.blocked_hint


def test_requires_python_the_hosts_python_misses_is_blocked_before_any_step():
    f = facts({"pyproject.toml": PROJECT.format(spec=">=3.13")})  # the base python is 3.10.12
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj", tools=TOOLS)
    assert not plan.steps
    assert plan.blocked == ('pyproject.toml says requires-python = ">=3.13", and the python the environment is made '
                            'from (python3) is 3.10.12')
    assert "gpuops setup" not in plan.blocked_hint  # nothing a second setup would change
    assert "Lower requires-python if the code runs on Python 3.10" in plan.blocked_hint
    f = facts({"pyproject.toml": PROJECT.format(spec=">=3.10")})
    assert sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj", tools=TOOLS).blocked is None


def test_dash_e_dot_in_requirements_beside_a_project_table_installs_the_project_once():
    f = facts({"pyproject.toml": PROJECT.format(spec=">=3.8"), "requirements.txt": "six\n-e .\n"})
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj", tools=TOOLS)
    deps = plan.steps[-1]
    assert deps.command.count("gpuops_install") == 1 and "-r requirements.txt" in deps.command
    assert any("installs the project folder itself (-e .)" in n for n in plan.notes)
    # not a self-install: a sub-folder's package
    f = facts({"pyproject.toml": PROJECT.format(spec=">=3.8"), "requirements.txt": "-e ./lib\n"})
    deps = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj", tools=TOOLS).steps[-1]
    assert "gpuops_install -e ." in deps.command
