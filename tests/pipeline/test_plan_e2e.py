"""Issue 34, "Know before you pay", end to end through the Lambda emulator: what a job's own files decide is refused by
`gpuops run` with no launch request at all (the emulator counts them), at any depth the launch line and the imports
reach; what they do not decide launches, and the run's --json summary carries the plan; `train` refuses before it
syncs. The reproductions are written here in the test's own words (the shapes of issue 34's repositories)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cloud import TYPE
from support.runs import remote_project


def write(files: dict) -> None:
    for rel, text in files.items():
        Path(rel).parent.mkdir(parents=True, exist_ok=True)
        (Path(rel).write_bytes if isinstance(text, bytes) else Path(rel).write_text)(text)


CASES = {
    # a child script saved with Windows line endings: bash would run it with `set -e` off
    "nested-crlf": ({"run.sh": "#!/bin/bash\nset -e\nbash scripts/train.sh \"$@\"\n",
                     "scripts/train.sh": b"#!/bin/bash\r\nset -e\r\nfalse\r\npython train.py\r\n",
                     "train.py": "print('hi')\n"}, "run.sh",
                    ["scripts/train.sh (run by run.sh) has Windows line endings (CRLF, 4 line(s))",
                     "sed -i 's/\\r$//' scripts/train.sh"]),
    # three levels down the project's own modules, a name its package does not have
    "deep-missing-name": ({"train.py": "from pkg.trainer import fit\nfit()\n", "pkg/__init__.py": "",
                           "pkg/trainer.py": "from .models.llama import Llama\n\ndef fit():\n    return Llama()\n",
                           "pkg/models/__init__.py": "",
                           "pkg/models/llama.py": "from pkg.models import attention\nclass Llama: pass\n"},
                          "train.py",
                          ["pkg/models/llama.py (line 1, imported by pkg/trainer.py <- train.py) imports attention "
                           "from pkg.models (pkg/models/__init__.py), which has no module or name attention",
                           "fix: add attention to pkg/models/__init__.py"]),
    # `deepspeed --module $VAR`, the module held in a here-document read earlier in the script
    "deepspeed-module-var": ({"run.sh": "#!/bin/bash\nset -x\nread -r -d '' cmds <<EOF\npkg.train_sft \\\n"
                                        "   --max_len 2048\nEOF\ndeepspeed --module $cmds\n",
                              "pkg/__init__.py": "", "pkg/train_sft.py": "from pkg import data_utils\n",
                              "requirements.txt": "deepspeed\n"}, "run.sh",
                             ["pkg/train_sft.py (line 1, run by run.sh) imports data_utils from pkg"]),
    # a requirements include pins another torch than the image's
    "torch-pin": ({"requirements.txt": "-r requirements/base.txt\n", "requirements/base.txt": "torch==2.0.0\n",
                   "train.py": "import torch\n"}, "train.py",
                  ["requirements/base.txt pins torch==2.0.0, which the image's torch 2.9.0+cu128 does not meet",
                   "pin torch==2.9.0 (the image's)", "--force"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_run_refuses_what_the_files_decide_with_no_launch_request(cloud, gpuops, case):
    files, script, said = CASES[case]
    write(files)
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", script)
    assert r.code == 1 and "nothing was launched" in r.err, r.all
    for words in said:
        assert words in r.err, r.all
    assert "Traceback" not in r.all
    assert cloud.launch_requests() == 0  # nothing billed, not even a request
    assert not Path("runs/pipelines").exists() or not list(Path("runs/pipelines").glob("*.json"))


def test_plan_shows_the_same_verdict_without_launching(cloud, gpuops):
    files, script, said = CASES["deepspeed-module-var"]
    write(files)
    r = gpuops("plan", "--script", script, "--json")
    assert r.code == 1, r.all
    doc = json.loads(r.out)
    assert doc["verdict"] == "refuse" and doc["scripts"] == ["run.sh"]
    assert doc["runs"][0] == {"kind": "module", "target": "pkg.train_sft", "launcher": "deepspeed", "by": "run.sh",
                              "line": "deepspeed --module pkg.train_sft --max_len 2048"}
    assert said[0] in doc["refusals"][0]["problem"]
    assert cloud.launch_requests() == 0
    Path("pkg/data_utils.py").write_text("import json\n")
    r = gpuops("plan", "--script", script)
    assert r.code == 0 and "gpuops run would launch this job" in r.err, r.all
    assert "runs: deepspeed module pkg.train_sft  (run by run.sh)" in r.out


def test_a_run_the_plan_lets_through_carries_the_plan_in_its_summary(cloud, gpuops):
    """data-prep's second shape: the first line writes what the second reads under $HOME: no false refusal; the run
    goes all the way and its --json summary says what the plan judged."""
    cloud.image("lambda-stack")
    write({"run_home.sh": "#!/bin/bash\nset -e\npython3 prep.py --out ~/data/toy\npython3 train.py $HOME/data/toy\n",
           "prep.py": "import argparse, os\nos.makedirs(os.path.expanduser('~/data/toy'), exist_ok=True)\n",
           "train.py": "import sys\nimport torch\nprint('trained', sys.argv[1:])\n"})
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "run_home.sh")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "succeeded", r.all
    plan = doc["plan"]
    assert plan["verdict"] == "launch" and plan["image"] == "lambda-stack-22-04"
    assert [x["target"] for x in plan["runs"]] == ["prep.py", "train.py"]
    assert {m["module"]: m["status"] for m in plan["modules"]}["torch"] == "image"
    assert "local plan for run_home.sh on lambda-stack-22-04" in r.err
    assert cloud.launch_requests() == 1


def test_train_refuses_a_nested_crlf_script_before_it_syncs(sandbox, gpuops):
    files, script, said = CASES["nested-crlf"]
    write(files)
    r = gpuops("train", "--script", script)
    assert r.code == 1 and said[0] in r.err and "nothing was synced or launched" in r.err, r.all
    assert not (remote_project(sandbox) / "run.sh").exists()


# -- with the resolution: uv, here, offline against the tests' index of metadata-only wheels ---------------------------
def requirements(index: Path, *names: str) -> str:
    return f"--no-index\n--find-links {index}\n" + "".join(f"{n}\n" for n in names)


def test_a_deep_import_nothing_resolved_provides_is_refused_with_no_launch_request(cloud, gpuops, wheel_index):
    """data-prep's first shape: the prep line imports tiktoken, which no file declares and nothing resolved brings."""
    write({"requirements.txt": requirements(wheel_index, "numpy"),
           "run.sh": "#!/bin/bash\nset -e\npython prepare.py\ntorchrun --standalone --nproc_per_node=8 train.py\n",
           "prepare.py": "import numpy\nfrom data import shards\n", "data/__init__.py": "",
           "data/shards.py": "import tiktoken\n", "train.py": "import numpy\n"})
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "run.sh")
    assert r.code == 1 and "nothing was launched" in r.err, r.all
    assert ("data/shards.py (imported by prepare.py <- run.sh) imports tiktoken, which nothing setup installs "
            "provides (the plan resolved") in r.err
    assert "fix: add tiktoken to requirements.txt" in r.err
    assert cloud.launch_requests() == 0


def test_a_module_a_dependency_brings_is_no_refusal_and_the_run_installs_what_the_plan_resolved(cloud, gpuops,
                                                                                               wheel_index):
    """transitive-ok: orjson is declared nowhere, tensordict brings it: the plan lets the run through, and setup on
    the instance installs the resolved pins; the job imports both."""
    cloud.image("lambda-stack")
    write({"requirements.txt": requirements(wheel_index, "tensordict"),
           "run.sh": "#!/bin/bash\nset -e\npython3 -m pkg.main\n", "pkg/__init__.py": "",
           "pkg/main.py": "from pkg.utils import tracking\nprint('tracking', tracking.dumps)\n",
           "pkg/utils/__init__.py": "", "pkg/utils/tracking.py": "import orjson\nimport tensordict\n"
                                                                "dumps = orjson.__version__\n"})
    r = gpuops("plan", "--script", "run.sh", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["resolution"]["available"] and doc["resolution"]["packages"] == {"orjson": "3.13.0",
                                                                               "tensordict": "0.10.0"}
    assert {m["module"]: m["status"] for m in doc["modules"]}["orjson"] == "installed"
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "run.sh")
    assert r.code == 0 and json.loads(r.out)["outcome"] == "succeeded", r.all
    assert json.loads(r.out)["plan"]["resolution"]["pins"]["tensordict"] == "0.10.0"
    assert cloud.launch_requests() == 1


def test_setup_says_before_it_connects_what_the_files_name_and_setup_does_not_install(sandbox, gpuops):
    write({"setup.py": "from setuptools import setup\nsetup(name='proj', install_requires=['accelerate'])\n",
           "train.py": "import accelerate\n"})
    r = gpuops("setup", "--dry-run")
    assert ("setup installs nothing from this project, and setup.py's install_requires name(s) its dependencies "
            "(fix: setup does not install the folder") in r.err, r.all
    assert "holding `-e .`" in r.err


def test_a_data_folder_of_the_project_is_said_where_the_job_finds_it(cloud, gpuops):
    """--data data: the folder is left out of the project's upload and put at $GPUOPS_DATA. The plan says so before
    the launch (a job reading data/train.bin stops there, as the run then shows), and nothing calls that rule the
    profile's sync.exclude (no profile was given)."""
    write({"data/train.bin": "hi", "train.py": "print(len(open('data/train.bin', 'rb').read()))\n"})
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "train.py",
               "--data", "data")
    assert ("warning: train.py (line 1) reads data/train.bin, inside the --data folder data: the instance has that "
            "folder at $GPUOPS_DATA, not at data") in r.err, r.err
    assert "sync.exclude" not in r.err, r.err
    doc = json.loads(r.out)
    assert r.code == 1 and doc["ending"]["cause"] == "file-missing", doc.get("ending")
