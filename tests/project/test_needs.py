"""What a job imports (project/needs.py over launch.py and closure.py), read from crafted local projects, and the
gate's fix worded for a missing module (project/gatefix.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from types import SimpleNamespace

from gpuops import knowledge
from gpuops.project import closure, gatefix, judge, launch, needs as jneeds


def _shell_invocations(text: str):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "job.sh").write_text(text)
        return launch.read_launch(Path(d), "job.sh").runs


ji = SimpleNamespace(required_imports=closure.required_imports, check_name=closure.check_name,
                     job_needs=jneeds.job_needs, project_module_names=closure.project_module_names,
                     shell_invocations=_shell_invocations, probe_groups=jneeds.probe_groups,
                     declared=gatefix.declared, has_project_table=gatefix.has_project_table,
                     problems=gatefix.problems, missing=gatefix.missing, Need=closure.Need,
                     namespaces=judge.namespaces)

TABLE = knowledge.load_playbook("modules", Path("/nonexistent")).get("modules")
NS = ji.namespaces(TABLE)


def project(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def needs(root: Path, script: str) -> list[tuple[str, str, str, str]]:
    return [(n.module, n.source, n.how, n.path0) for n in ji.job_needs(root, script, NS)]


def names(root: Path, script: str) -> list[str]:
    return [n.module for n in ji.job_needs(root, script, NS)]


def test_module_level_imports_count_and_guarded_conditional_or_function_ones_do_not():
    src = """
import os, json as j
import torch.nn.functional as F
from transformers import AutoModel
from . import sibling
from .pkg import thing
import google.protobuf.message
try:
    import wandb
except ImportError:
    wandb = None
try:
    import deepspeed
except (ModuleNotFoundError, OSError):
    pass
try:
    import apex
except Exception:
    pass
try:
    import xformers
except:
    pass
try:
    import required_in_try
except KeyError:
    pass
from contextlib import suppress
with suppress(ImportError):
    import bitsandbytes
with open("f") as fh:
    import yaml
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    import pandas
import typing
if typing.TYPE_CHECKING:
    import polars
if sys.platform == "win32":
    import msvcrt
def f():
    import scipy
class C:
    import numpy
if __name__ == "__main__":
    import cv2
else:
    import only_when_imported
"""
    got = [m for m, _ in ji.required_imports(src)]
    assert got == ["os", "json", "torch.nn.functional", "transformers", "google.protobuf.message",
                   "required_in_try", "contextlib", "yaml", "typing", "typing", "numpy", "cv2"]
    as_module = [m for m, _ in ji.required_imports(src, as_main=False)]
    assert "cv2" not in as_module and "only_when_imported" in as_module
    assert ji.required_imports("x = = 1\n") == []  # does not parse: the remote compile check says why
    assert ji.check_name("google.protobuf.message", NS) == "google.protobuf"
    assert ji.check_name("torch.nn.functional", NS) == "torch"


def test_the_projects_own_modules_at_any_depth_and_layouts(tmp_path):
    root = project(tmp_path, {
        "train.py": "import mylib\nfrom pkg import sub\nfrom pkg.util import helper\nimport mypkg\nimport numpy\n",
        "mylib.py": "import wandb\nimport deeper\n",
        "deeper.py": "import never_read\n",
        "pkg/__init__.py": "import einops\nfrom . import sub\n",
        "pkg/sub.py": "import sklearn\n",
        "pkg/util.py": "def helper():\n    import lazy\n",
        "src/mypkg/__init__.py": "import PIL\n",
    })
    got = needs(root, "train.py")
    assert [g[0] for g in got] == ["mylib", "pkg", "mypkg", "numpy", "wandb", "deeper", "einops", "sklearn", "PIL",
                                   "never_read"]
    assert ("wandb", "mylib.py (imported by train.py)", "imports", "") in got
    assert ("sklearn", "pkg/sub.py (imported by train.py)", "imports", "") in got
    assert ("never_read", "deeper.py (imported by mylib.py <- train.py)", "imports", "") in got  # depth 2
    assert "lazy" not in names(root, "train.py")  # inside a function
    own = {n.module: (n.local, n.local_root) for n in ji.job_needs(root, "train.py", NS) if n.local}
    assert own == {"mylib": ("mylib.py", ""), "pkg": ("pkg/__init__.py", ""), "mypkg": ("src/mypkg/__init__.py", "src"),
                   "deeper": ("deeper.py", "")}


def test_a_script_in_a_subfolder_finds_modules_from_its_folder_first(tmp_path):
    root = project(tmp_path, {"scripts/train.py": "import helpers\nimport common\n",
                              "scripts/helpers.py": "import rich\n", "common.py": "import httpx\n"})
    got = {n.module: n for n in ji.job_needs(root, "scripts/train.py", NS)}
    assert got["helpers"].path0 == "scripts" and got["helpers"].local_root == "scripts"
    assert got["common"].local_root == "" and "rich" in got and "httpx" in got


def test_a_file_that_changes_sys_path_needs_only_what_the_project_does_not_have(tmp_path):
    root = project(tmp_path, {
        "scripts/train.py": "import os, sys\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))\n"
                            "import wandb\nfrom utils.io import load\nimport models\n",
        "utils/io.py": "", "models/__init__.py": "",
        "run.sh": "export PYTHONPATH=$PWD/lib:$PYTHONPATH\npython main.py\n",
        "main.py": "import helper\nimport einops\n", "lib/helper.py": "",
        "venv/pyvenv.cfg": "", "venv/lib/wandb/__init__.py": ""})
    assert names(root, "scripts/train.py") == ["os", "sys", "wandb"]
    assert names(root, "run.sh") == ["einops"]
    assert ji.project_module_names(root, limit=3) is None  # too big to search: nothing loose is required
    assert ji.project_module_names(root) >= {"utils", "io", "models", "lib", "helper", "scripts", "train"}


def test_shell_scripts_python_module_and_torchrun_lines():
    text = r"""#!/bin/bash
set -euo pipefail
# python commented.py
export WANDB_MODE=offline
python3 -u train.py --lr 1e-4 \
   --epochs 3
exec nohup python -m pkg.mod --flag &
OMP_NUM_THREADS=4 time python3.11 -W ignore scripts/eval.py
uv run --extra gpu --frozen python -X dev other.py
uv run tool.py
env A=1 B=2 python -um amodule
torchrun --nproc_per_node 2 --standalone dist.py --x 1
python -m torch.distributed.run --nnodes=1 --nproc_per_node=8 ddp.py
torchrun --nproc_per_node=2 -m pkg.launch
python - <<'PY'
import inside_heredoc
python heredoc_line.py
PY
python -c "import q"
$PYTHON var.py
python "$SCRIPT"
PYTHONPATH=src python with_path.py
uv run --with rich python with_extra.py
./venv/bin/python by_path.py
./tinker-local/bin/with_local_tinker python3 -u wrapped.py
cd sub && python in_sub.py
cd "$(dirname "$0")"
python -m after_unknown_cd
"""
    got = [(i.kind, i.target, i.launcher == "torchrun", i.cwd) for i in ji.shell_invocations(text)
           if i.kind != "command"]
    assert got == [
        ("script", "train.py", False, None), ("module", "pkg.mod", False, None),
        ("script", "scripts/eval.py", False, None), ("script", "other.py", False, None),
        ("script", "tool.py", False, None), ("module", "amodule", False, None),
        ("script", "dist.py", True, None), ("script", "ddp.py", True, None), ("module", "pkg.launch", True, None),
        ("script", "with_path.py", False, None),  # PYTHONPATH=src is read: src is searched too
        ("script", "in_sub.py", False, "sub"), ("module", "after_unknown_cd", False, None)]
    assert [r.pythonpath for r in ji.shell_invocations(text) if r.target == "with_path.py"] == [("src",)]
    assert ji.shell_invocations("source .venv/bin/activate\npython train.py\n") == []
    assert ji.shell_invocations("conda activate rl\npython train.py\n") == []
    assert [r.kind for r in ji.shell_invocations("echo hello\nls -la\n")] == ["command"]  # ls: judged only if a
    #                                                                    console script of modules.yaml


def test_a_shell_jobs_needs_follow_its_scripts_and_modules(tmp_path):
    root = project(tmp_path, {
        "run.sh": "python train.py\npython -m pkg.mod\npython -m missing_tool\ntorchrun --standalone dist.py\n"
                  "python absent.py\n",
        "train.py": "import wandb\nimport mylib\n", "mylib.py": "import datasets\n",
        "pkg/__init__.py": "import einops\n", "pkg/mod.py": "import peft\nif __name__ == '__main__':\n    import trl\n",
        "dist.py": "import deepspeed\n",
    })
    got = needs(root, "run.sh")
    assert ("wandb", "train.py (run by run.sh)", "imports", "") in got
    assert ("datasets", "mylib.py (imported by train.py <- run.sh)", "imports", "") in got
    assert ("pkg", "run.sh", "runs python -m", "") in got
    assert ("peft", "pkg/mod.py (run by run.sh)", "imports", "") in got
    assert ("trl", "pkg/mod.py (run by run.sh)", "imports", "") in got  # it runs as __main__
    assert ("einops", "pkg/__init__.py (run by run.sh)", "imports", "") in got
    assert ("missing_tool", "run.sh", "runs python -m", "") in got
    assert ("torch", "run.sh", "runs torchrun, which imports", "") in got
    assert ("deepspeed", "dist.py (run by run.sh)", "imports", "") in got
    assert len(got) == len({(g[0], g[3]) for g in got})  # each module asked once
    assert ji.probe_groups(ji.job_needs(root, "run.sh", NS))[""][:3] == ["wandb", "mylib", "datasets"]
    # a bash script without .sh, by its #! line; a script of another kind yields nothing
    (root / "go").write_text("#!/usr/bin/env bash\npython train.py\n")
    assert "wandb" in names(root, "go")
    (root / "py.sh").write_text("#!/usr/bin/env python3\nimport os\nos.system('python train.py')\n")
    assert names(root, "py.sh") == []  # another interpreter runs it: not read
    (root / "job.pl").write_text("system('python train.py')\n")
    assert names(root, "job.pl") == [] and names(root, "nosuch.py") == []


def test_a_shell_script_that_cds_into_its_folder(tmp_path):
    root = project(tmp_path, {"scripts/run.sh": 'cd "$(dirname "$0")"\npython -m tool\npython step.py\n',
                              "scripts/tool.py": "import rich\n", "scripts/step.py": "import httpx\n"})
    got = {n.module: n for n in ji.job_needs(root, "scripts/run.sh", NS)}
    assert got["tool"].path0 == "scripts" and got["httpx"].path0 == "scripts" and "rich" in got


def test_declared_distributions_from_every_dependency_file(tmp_path):
    root = project(tmp_path, {
        "requirements.txt": "# main\n-r reqs/base.txt\n--extra-index-url https://x/simple\ntorch==2.9.0  # pinned\n"
                            "-e .\ngit+https://github.com/org/repo.git#egg=Some_Pkg\n",
        "reqs/base.txt": "numpy>=1.26\n-r ../requirements.txt\nopencv-python-headless; sys_platform=='linux'\n",
        "requirements-dev.txt": "pytest\n",
        "pyproject.toml": '[project]\nname = "myproj"\ndependencies = ["transformers>=4.40", "PyYAML"]\n'
                          '[project.optional-dependencies]\ngpu = ["flash_attn"]\n'
                          '[dependency-groups]\ndev = ["ruff", {include-group = "x"}]\n',
        "uv.lock": 'version = 1\n[[package]]\nname = "tokenizers"\nversion = "0.21.0"\n',
    })
    d = ji.declared(root)
    assert d["torch"] == "requirements.txt" and d["numpy"] == "reqs/base.txt"
    assert d["opencv-python-headless"] == "reqs/base.txt" and d["some-pkg"] == "requirements.txt"
    assert d["pytest"] == "requirements-dev.txt" and d["transformers"] == "pyproject.toml"
    assert d["pyyaml"] == "pyproject.toml" and d["flash-attn"] == "pyproject.toml" and d["ruff"] == "pyproject.toml"
    assert d["tokenizers"] == "uv.lock" and d["myproj"] == "pyproject.toml"
    assert ji.has_project_table(root)
    tools_only = project(tmp_path / "t", {"pyproject.toml": "[tool.ruff]\nline-length = 100\n"})
    assert ji.declared(tools_only) == {} and not ji.has_project_table(tools_only)


def fixes(gone, declared=None, project_table=False, python="~/.venvs/gpuops/bin/python"):
    return ji.problems(gone, python=python, declared_names=declared or {}, table=TABLE, project_table=project_table)


def test_the_problem_and_its_fix():
    n = lambda m, **kw: ji.Need(m, kw.pop("shown", m), kw.pop("source", "train.py"), kw.pop("how", "imports"),  # noqa
                                kw.pop("path0", ""), **kw)
    got = fixes([n("wandb"), n("cv2"), n("PIL", source="mylib.py (imported by train.py)")],
                declared={"opencv-python-headless": "requirements.txt"})
    assert got[0][0] == "train.py imports wandb and cv2, which ~/.venvs/gpuops/bin/python cannot import"
    assert got[0][1] == ["fix (wandb): add wandb to the project's requirements, then gpuops setup",
                         "fix (cv2): gpuops setup (the project lists opencv-python-headless in requirements.txt; "
                         "setup installs it)"]
    assert got[1][0].startswith("mylib.py (imported by train.py) imports PIL, which")
    assert got[1][1] == ["fix (PIL): add pillow to the project's requirements, then gpuops setup"]
    g = fixes([n("google.protobuf"), n("flash_attn")], declared={"flash-attn": "pyproject.toml"})[0][1]
    assert g[0] == "fix (google.protobuf): add protobuf to the project's requirements, then gpuops setup"
    assert g[1].startswith("fix (flash_attn): flash-attn is built for the exact torch, CUDA and Python: name it in "
                           "the profile's expect.packages")  # issue #28: never "add it to the requirements" 
    m = fixes([n("pkg", shown="pkg.mod", source="run.sh", how="runs python -m")])[0]
    assert m[0] == "run.sh runs python -m pkg.mod, which ~/.venvs/gpuops/bin/python cannot import"
    own = fixes([n("mylib", local="mylib.py", local_root="")])[0][1][0]
    assert "not on the host: sync the project" in own
    src = n("mypkg", local="src/mypkg/__init__.py", local_root="src")
    assert "gpuops setup installs the project" in fixes([src], project_table=True)[0][1][0]
    assert "--env PYTHONPATH=src" in fixes([src])[0][1][0]


def test_only_a_plain_false_from_the_host_is_missing():
    a, b, c = (ji.Need(m, m, "t.py", "imports", "") for m in ("a", "b", "c"))
    d = ji.Need("d", "d", "t.py", "imports", "sub")
    found = {"": {"a": True, "b": False, "c": "ValueError: x.__spec__ is None"}, "sub": {"d": False}}
    assert ji.missing([a, b, c, d], found) == [b, d]
    assert ji.missing([a, b], None) == [] and ji.missing([d], {"": {"d": False}}) == []


def test_the_probes_find_check_sets_sys_path_0_and_does_not_import(tmp_path):
    """FIND_CHECK (remote/probe.py) as the host runs it: a module beside the script is found only with that folder
    as sys.path[0]; a module's code is not run; a missing one is false."""
    from gpuops.remote.probe import FIND_CHECK

    project(tmp_path, {"scripts/helper_mod.py": "raise SystemExit('imported!')\n", "top_mod.py": ""})
    groups = {"scripts": ["helper_mod", "top_mod", "json", "no_such_mod_xyz"], "": ["helper_mod", "top_mod"]}
    p = subprocess.run([sys.executable, "-c", FIND_CHECK, json.dumps(groups)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert json.loads(p.stdout) == {"scripts": {"helper_mod": True, "top_mod": False, "json": True,
                                                "no_such_mod_xyz": False},
                                    "": {"helper_mod": False, "top_mod": True}}
