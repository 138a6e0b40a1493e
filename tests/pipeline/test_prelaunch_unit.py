"""Issue #28, "Before anything is billed": the pure parts. Setup's plan refuses what it cannot install or run
(a poetry/pdm/conda project with nothing setup installs, a requires-python the host's python misses) and installs a
project once; the gate reads accelerate/deepspeed lines and words its fixes; the project's own checks before a launch
(pipeline/prelaunch.py)."""
from __future__ import annotations

from pathlib import Path

from gpuops import knowledge as kb
from gpuops.setup import plan as sp

from support.setup_facts import KNOW, facts, profile


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
    assert any("poetry.lock: setup does not install from poetry's files; it installs requirements.txt" in n
               for n in plan.notes)


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
    # said also inside a run that was not refused (some image's python meets it): the rule, not "always refuses"
    assert "refuses such a project before it launches when no image's python meets it" in plan.blocked_hint
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


# -- the gate's reading and its fixes ---------------------------------------------------------------------------------
from types import SimpleNamespace  # noqa: E402

from gpuops.project import closure, gatefix, launch, needs as jneeds  # noqa: E402

ji = SimpleNamespace(job_needs=jneeds.job_needs, Need=closure.Need, problems=gatefix.problems,
                     declared=gatefix.declared, extras_only=gatefix.extras_only,
                     script_problems=launch.script_problems,
                     shell_invocations=lambda text: [r for r in launch.read_launch(_shell(text), "job.sh").runs])


def _shell(text: str) -> Path:
    import tempfile

    d = Path(tempfile.mkdtemp())
    (d / "job.sh").write_text(text)
    return d

TABLE = kb.load_playbook("modules", Path("/nonexistent"))["modules"]


def _project(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text if isinstance(text, bytes) else text.encode())
    return root


def test_accelerate_deepspeed_and_torchrun_with_variables_are_read_like_torchrun(tmp_path):
    root = _project(tmp_path, {"train.py": "import wandb\n", "job.sh": (
        "#!/bin/bash\nset -e\naccelerate launch --num_processes 8 --mixed_precision bf16 train.py --lr 1\n"
        "deepspeed --num_gpus 8 train.py --deepspeed ds.json\n"
        "python -m accelerate.commands.launch --multi_gpu train.py\n"
        "torchrun --nproc_per_node=$NGPUS --nnodes \"$NNODES\" train.py\n")})
    needs = {(n.module, n.how) for n in ji.job_needs(root, "job.sh")}
    assert needs == {("accelerate", "runs accelerate launch, which imports"), ("wandb", "imports"),
                     ("deepspeed", "runs deepspeed, which imports"), ("torch", "runs torchrun, which imports")}
    assert ji.shell_invocations("torchrun --nproc_per_node 8 $SCRIPT\n") == []  # the script itself unknown: not read


def test_a_module_only_an_extra_provides_names_setup_extras(tmp_path):
    root = _project(tmp_path, {"pyproject.toml": '[project]\nname = "rl"\nversion = "0"\ndependencies = ["six"]\n'
                                                 '[project.optional-dependencies]\ntrack = ["wandb>=0.17"]\n'})
    gone = [ji.Need("wandb", "wandb", "train.py", "imports", "")]
    args = dict(python="py", declared_names=ji.declared(root), table=TABLE, project_table=True,
                extras=ji.extras_only(root))
    fix = ji.problems(gone, **args)[0][1][0]
    assert fix == ("fix (wandb): the project lists wandb only in pyproject.toml's extra track, which setup does not "
                   "install: add it to the profile's setup.extras (setup: {extras: [track]}), then gpuops setup")
    assert "setup.extras" not in ji.problems(gone, wanted_extras=["track"], **args)[0][1][0]  # then setup installs it
    assert "setup.extras" not in ji.problems(gone, wanted_extras="all", **args)[0][1][0]


def test_script_problems_crlf_and_relative_imports(tmp_path):
    root = _project(tmp_path, {"job.sh": b"#!/bin/bash\r\nset -e\r\npython train.py\r\n", "ok.sh": "set -e\n",
                               "pkg/__init__.py": "", "pkg/train.py": "import os\nfrom .model import Net\n",
                               "guarded.py": "try:\n    from .m import x\nexcept ImportError:\n    from m import x\n",
                               "win.py": b"import os\r\nprint(1)\r\n"})
    (problem, fix), = ji.script_problems(root, "job.sh")
    assert "job.sh has Windows line endings (CRLF, 3 line(s))" in problem and "sed -i 's/\\r$//' job.sh" in fix
    (problem, fix), = ji.script_problems(root, "pkg/train.py")
    assert "relative imports (from .model import ...)" in problem and "-m pkg.train" in fix
    assert ji.script_problems(root, "ok.sh") == ji.script_problems(root, "guarded.py") == []
    assert ji.script_problems(root, "win.py") == []  # python reads CRLF source fine


def test_a_python_that_does_not_exist_yet_says_run_setup_not_does_not_compile():
    from gpuops.jobs import plan as core

    pf = core.parse_preflight("@python 0\n@compile sh: 1: /home/u/.venvs/gpuops/bin/python: not found\n"
                              "@gpu_rc 0\n@gpu\n0, H100\n")
    v = core.judge_preflight(pf, script_found=True, script="train.py", remote_dir="~/p", min_disk_gb=None,
                             force=False, synced=True, python="~/.venvs/gpuops/bin/python")
    assert "the profile's python ~/.venvs/gpuops/bin/python does not exist on the host yet" in v.error.message
    assert "does not compile" not in v.error.message and "run `gpuops setup`" in v.error.hint


# -- run, before the launch -------------------------------------------------------------------------------------------
from gpuops.pipeline import prelaunch  # noqa: E402

IMAGES = kb.load_playbook("images", Path("/nonexistent"))


def test_requires_python_is_judged_against_every_image_a_launch_may_boot(tmp_path):
    pp = tmp_path / "pyproject.toml"
    _project(tmp_path, {"train.py": "print(1)\n"})
    pp.write_text(PROJECT.format(spec=">=3.13"))
    (problem, fix), = prelaunch.findings(tmp_path, "train.py", resolve=False).certain
    assert problem == ('pyproject.toml says requires-python = ">=3.13", and the python of the image a launch boots '
                       'does not meet it (lambda-stack-22-04: 3.10.12, lambda-stack-24-04: 3.12.3)')
    pp.write_text(PROJECT.format(spec=">=3.11"))
    got = prelaunch.findings(tmp_path, "train.py", resolve=False)
    assert not got.refused and "lambda-stack-22-04: 3.10.12" in got.warnings[0]
    pp.write_text(PROJECT.format(spec=">=3.10"))
    got = prelaunch.findings(tmp_path, "train.py", resolve=False)
    assert not got.refused and not got.warnings


def test_run_refuses_tool_projects_and_conda_jobs_before_the_launch(tmp_path):
    _project(tmp_path, {"train.py": "print(1)\n", "pyproject.toml": POETRY1, "poetry.lock": "",
                        "job.sh": "#!/bin/bash\nsource ~/miniconda3/etc/profile.d/conda.sh\nconda activate rl\n"
                                  "python train.py\n"})
    problems = [p for p, _ in prelaunch.findings(tmp_path, "job.sh", resolve=False).certain]
    assert problems[0].startswith("this is a poetry project (poetry.lock)")
    assert problems[1] == "job.sh runs `conda activate`, and the images a launch boots have no conda"


def test_the_telling_line_of_a_failed_install():
    pip_tail = ["fatal: unable to access 'https://github.com/acme/tools.git/': Could not resolve host: github.com",
                "error: subprocess-exited-with-error", "× git clone --filter=blob:none --quiet ... did not run "
                "successfully.", "│ exit code: 128", "╰─> See above for output.",
                "note: This error originates from a subprocess, and is likely not a problem with pip."]
    pats = KNOW["setup_error_lines"]
    assert sp.telling_line(pip_tail, pats).endswith("Could not resolve host: github.com")
    uv_tail = ["× No solution found when resolving dependencies:", "╰─▶ Because there is no version of six==9 and "
               "you require six==9, we can conclude that your requirements are unsatisfiable."]
    assert sp.telling_line(uv_tail, pats).startswith("╰─▶ Because there is no version of six==9")
    assert sp.telling_line(["ERROR: No matching distribution found for six==9", "x"], pats) == \
        "ERROR: No matching distribution found for six==9"
    assert sp.telling_line(["all fine", "still fine"], pats) is None
