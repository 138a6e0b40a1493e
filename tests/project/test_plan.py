"""The local plan (project/plan.py, judge.py) on the shapes of issue 34's repositories, written here as minimal
projects. A resolution is a recorded fact for these pure tests (what uv resolved for the image: resolution.py's
`Resolution`); the resolution itself runs in the end-to-end tests. The judgement: refusals with fixes only where the
files (and the resolved set) decide; with no resolution, warnings, never a refusal on a guess."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpuops import knowledge as kb
from gpuops.project import plan as pp
from gpuops.project.resolution import Resolution
from gpuops.project.verdict import Plan, enforce, summary

IMAGES = kb.load_playbook("images", Path("/nonexistent"))
TABLES = pp.tables(Path("/nonexistent"))
IMAGE = pp.image_of(IMAGES)
IMAGE_PKGS = {"torch": "2.9.0+cu128"}


def write(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text if isinstance(text, bytes) else text.encode())
    return root


def resolved(*names: str, **kw) -> callable:
    """A resolver that answers what uv answered for the image: these packages (and records what it was asked)."""
    asked = []

    def resolver(request, image, *, timeout_s):
        asked.append(request)
        return Resolution(available=True, packages={n: "1.0" for n in names}, install_bytes=10**6, seconds=0.2, **kw)

    resolver.asked = asked
    return resolver


def offline(request, image, *, timeout_s):
    return Resolution(available=False, why="this machine cannot reach the index (dns error)")


def plan(root: Path, script: str, resolver=None, **settings) -> Plan:
    return pp.build(root, script, image=IMAGE, settings=pp.Settings(**settings), tables=TABLES, images_doc=IMAGES,
                    resolver=resolver)


def problems(p: Plan) -> list[str]:
    return [x for x, _ in p.certain + p.refusals]


def test_a_deep_import_is_judged_against_the_resolved_set_not_the_declared_names(tmp_path):
    """transitive-ok: tensordict brings orjson (declared nowhere): no refusal; deep-import: flash_attn 3 deep."""
    write(tmp_path, {"requirements.txt": "tensordict\n", "run.sh": "#!/bin/bash\nset -e\npython3 -m pkg.main\n",
                     "pkg/__init__.py": "", "pkg/main.py": "from pkg.utils import tracking\n",
                     "pkg/utils/__init__.py": "", "pkg/utils/tracking.py": "import orjson\nimport tensordict\n"})
    p = plan(tmp_path, "run.sh", resolved("tensordict", "orjson"))
    assert not p.refused and not p.warnings, p.to_json()
    assert {m.module: m.status for m in p.modules} == {"pkg.main": "project", "orjson": "installed",
                                                       "tensordict": "installed"}
    # the same project with no resolution: a warning for orjson, never a refusal
    p = plan(tmp_path, "run.sh", offline)
    assert not p.refused and len(p.warnings) == 1 and "imports orjson, which no dependency file names" in p.warnings[0]
    assert "no resolution here (this machine cannot reach the index (dns error))" in p.hints[0]
    # a module nothing resolved provides: refused, with the chain that reaches it and the fix
    write(tmp_path, {"pkg/utils/tracking.py": "import orjson\nimport tensordict\nfrom .hub import x\n",
                     "pkg/utils/hub.py": "import wandb\nx = 1\n"})
    p = plan(tmp_path, "run.sh", resolved("tensordict", "orjson"))
    (problem, fix), = p.refusals
    assert problem.startswith("pkg/utils/hub.py (imported by pkg/utils/tracking.py <- pkg/main.py <- run.sh) imports "
                              "wandb, which nothing setup installs provides (the plan resolved 2 package(s) for "
                              "lambda-stack-22-04")
    assert fix.startswith("fix: add wandb to requirements.txt")
    assert p.depth == 2


def test_what_the_resolution_is_asked_for(tmp_path):
    """requirements with includes and index lines, the PEP 723 block of a script the launch line runs."""
    write(tmp_path, {"requirements.txt": "-r reqs/base.txt\n--extra-index-url https://example.invalid/simple\n"
                                         "numpy>=1.26  # a comment\n",
                     "reqs/base.txt": "-i https://mirror.invalid/simple\neinops\n",
                     "run.sh": "accelerate launch --config_file z.yaml train.py \"$@\"\n",
                     "train.py": "# /// script\n# dependencies = [\n#   \"accelerate>=1.4\",\n#   \"tiktoken\",\n# ]\n"
                                 "# ///\nimport accelerate, tiktoken, einops, numpy\n",
                     "z.yaml": "distributed_type: MULTI_GPU\n"})
    r = resolved("accelerate", "tiktoken", "einops", "numpy")
    p = plan(tmp_path, "run.sh", r)
    req, = r.asked
    assert req.requirements == ("einops", "numpy>=1.26", "accelerate>=1.4", "tiktoken")
    assert req.index_lines == ("--index-url https://mirror.invalid/simple",
                               "--extra-index-url https://example.invalid/simple")
    assert not p.refused, p.to_json()
    # accelerate's config says DEEPSPEED and nothing installs deepspeed: refused, the fix names the script's block
    (tmp_path / "z.yaml").write_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n")
    p = plan(tmp_path, "run.sh", resolved("accelerate", "tiktoken", "einops", "numpy"))
    (problem, fix), = p.refusals
    assert problem == ("run.sh runs accelerate launch, and z.yaml says distributed_type: DEEPSPEED: nothing setup "
                       "installs provides deepspeed")
    assert fix == "fix: add deepspeed to the script's `# /// script` block"


def test_extras_setup_py_and_other_requirements_files_name_their_fix(tmp_path):
    """setup-py-extras (vllm only in setup.py's extra), setup-py-only (nothing installs the folder),
    requirements-subfolder (requirements/requirements.txt only)."""
    a = write(tmp_path / "a", {
        "pyproject.toml": '[project]\nname = "pkg"\nversion = "0.1"\ndynamic = ["dependencies", '
                          '"optional-dependencies"]\n',
        "setup.py": "from setuptools import setup\nVLLM = ['vllm>=0.8']\nsetup(install_requires=['numpy'], "
                    "extras_require={'vllm': VLLM, 'test': ['pytest']})\n",
        "run.sh": "python3 -m pkg.main\n", "pkg/__init__.py": "", "pkg/main.py": "import numpy\nfrom pkg import roll\n",
        "pkg/roll.py": "import vllm\n"})
    p = plan(a, "run.sh", resolved("numpy"))
    (problem, fix), = p.refusals
    assert problem == ("pkg/roll.py (imported by pkg/main.py <- run.sh) imports vllm, which the project lists only in "
                       "setup.py's extra vllm, which setup does not install")
    assert fix == "fix: add it to the profile's setup.extras (setup: {extras: [vllm]}), so setup installs the extra vllm"
    r = resolved("numpy", "vllm")
    assert not plan(a, "run.sh", r, extras=["vllm"]).refused
    assert r.asked[0].requirements == ("numpy", "vllm>=0.8")
    b = write(tmp_path / "b", {"setup.py": "from setuptools import setup\nsetup(name='proj', install_requires=["
                                           "'accelerate', 'tiktoken'])\n",
                               "run.sh": "accelerate launch --num_processes 8 src/proj/train.py\n",
                               "src/proj/__init__.py": "", "src/proj/train.py": "import tiktoken\n"})
    unknown = dict(IMAGES, images=[dict(i, packages=[]) for i in IMAGES["images"]])
    p = pp.build(b, "run.sh", image=IMAGE, settings=pp.Settings(), tables=TABLES, images_doc=unknown, resolver=None)
    #   nothing to install, and the image's packages not listed: warnings only
    assert not p.refused and any("setup installs nothing from this project, and setup.py's install_requires" in w
                                 for w in p.warnings)
    images = dict(IMAGES, images=[dict(i, packages=IMAGE_PKGS) for i in IMAGES["images"]])
    r = resolved()
    p = pp.build(b, "run.sh", image=IMAGE, settings=pp.Settings(), tables=TABLES, images_doc=images, resolver=r)
    assert r.asked == []  # nothing to install: the image's listed packages decide, no resolver asked
    assert problems(p)[0] == ("run.sh runs accelerate launch, which imports accelerate, which the project lists only "
                              "in setup.py's install_requires, which setup does not install")
    assert p.refusals[0][1].startswith("fix: setup does not install the folder (it has no pyproject.toml [project] "
                                       "table, and no requirements file installs it): write a requirements.txt "
                                       "holding `-e .`")
    write(b, {"requirements.txt": "-e .\n"})  # now setup installs the folder, and its install_requires with it
    r = resolved("accelerate", "tiktoken")
    p = pp.build(b, "run.sh", image=IMAGE, settings=pp.Settings(), tables=TABLES, images_doc=images, resolver=r)
    assert not p.refused and r.asked[0].requirements == ("accelerate", "tiktoken")
    c = write(tmp_path / "c", {"requirements/requirements.txt": "deepspeed\nnumpy<2.0\n",
                               "run.sh": "python deepy.py train.py configs/small.yml\n",
                               "deepy.py": "import deepspeed.launcher.runner\n"})
    p = pp.build(c, "run.sh", image=IMAGE, settings=pp.Settings(), tables=TABLES, images_doc=images, resolver=None)
    (problem, fix), = p.refusals  # setup installs nothing, the image's packages are listed: judged against them
    assert problem == ("deepy.py (run by run.sh) imports deepspeed, which the project lists only in "
                       "requirements/requirements.txt, which setup does not install")
    assert fix == ("fix: name it in the profile's setup.requirements (setup: {requirements: [requirements.txt, "
                   "requirements/requirements.txt]}): setup installs requirements.txt only")


def test_console_scripts_and_launchers(tmp_path):
    write(tmp_path, {"requirements.txt": "torch\n", "run.sh": "tune download x\ntune run lora --config c\n"
                     "nvidia-smi\nmkdir -p out\n"})
    p = plan(tmp_path, "run.sh", resolved("torch"))
    (problem, fix), = p.refusals  # tune is torchtune's console script; nvidia-smi and mkdir are not judged
    assert problem == "run.sh runs tune, torchtune's console script, which nothing setup installs provides"
    assert fix == "fix: add torchtune to requirements.txt"
    (tmp_path / "requirements.txt").write_text("torchtune\n")
    assert not plan(tmp_path, "run.sh", resolved("torchtune", "torchao")).refused
    # accelerate launch -m, torchrun -m, PYTHONPATH=. before torchrun
    write(tmp_path, {"run.sh": "accelerate launch --num_processes 8 -m pkg.train --lr 1e-5\n"
                               "PYTHONPATH=. torchrun --nproc_per_node=8 pkg/sub/go.py\n",
                     "requirements.txt": "accelerate\n", "pkg/__init__.py": "", "pkg/train.py": "import tiktoken\n",
                     "pkg/sub/go.py": "from pkg.data import x\n", "pkg/data.py": "import fvcore\nx = 1\n"})
    p = plan(tmp_path, "run.sh", resolved("accelerate"))
    assert problems(p) == [
        "pkg/train.py (run by run.sh) imports tiktoken, which nothing setup installs provides (the plan resolved 1 "
        "package(s) for lambda-stack-22-04; none of them, nor the image, provides it)",
        "pkg/data.py (imported by pkg/sub/go.py <- run.sh) imports fvcore, which nothing setup installs provides (the "
        "plan resolved 1 package(s) for lambda-stack-22-04; none of them, nor the image, provides it)"]


def test_what_torch_brings_is_never_a_module_to_add(tmp_path):
    write(tmp_path, {"requirements.txt": "numpy\n", "train.py": "import triton\nimport torch\nimport numpy\n"})
    p = plan(tmp_path, "train.py", resolved("numpy"))
    assert not p.refused and {m.module: m.status for m in p.modules} == {"triton": "torch", "torch": "image",
                                                                       "numpy": "image"}  # listed, unconfirmed
    from gpuops.project import gatefix
    from gpuops.project.closure import Need

    (_, (fix,)), = gatefix.problems([Need("triton", "triton", "train.py", "imports", "")], python="py",
                                    declared_names={}, table=TABLES["modules"], project_table=False, tables=TABLES)
    assert "triton comes with torch" in fix and "add triton" not in fix


def test_a_reraising_guard_is_no_guard(tmp_path):
    write(tmp_path, {"requirements.txt": "numpy\n", "train.py": "import pkg\n",
                     "pkg/__init__.py": "try:\n    import torchao\nexcept ImportError as e:\n    raise ImportError("
                                        "'install torchao') from e\ntry:\n    import hf_transfer\nexcept ImportError:"
                                        "\n    hf_transfer = None\n"})
    p = plan(tmp_path, "train.py", resolved("numpy"))
    assert [x.split(" imports ")[1].split(",")[0] for x in problems(p)] == ["torchao"]


def test_direct_torch_pins_are_judged_with_no_network(tmp_path):
    write(tmp_path, {"requirements.txt": "torch==2.10\nnumpy\n", "train.py": "import torch\n"})
    p = plan(tmp_path, "train.py", None)
    (problem, fix), = p.refusals
    assert problem.startswith("requirements.txt pins torch==2.10, which the image's torch 2.9.0+cu128 does not meet")
    assert "pin torch==2.9.0 (the image's)" in fix and "--force" in fix
    (tmp_path / "requirements.txt").write_text("torch>=2.6\ntorchvision==0.25.0\n")
    (problem, fix), = plan(tmp_path, "train.py", None).refusals
    assert problem.startswith("requirements.txt pins torchvision==0.25.0, which belongs to another torch")
    assert "pin torchvision==0.24.*" in fix
    (tmp_path / "requirements.txt").write_text("torch>=2.6\ntorchvision==0.24.0\n")
    assert not plan(tmp_path, "train.py", None).refused


def test_the_resolutions_own_verdicts_are_said(tmp_path):
    write(tmp_path, {"requirements.txt": "torch>=2.6\ntorchvision\n", "main.py": "import torch, torchvision\n"})
    r = resolved("torchvision", fixes=["torchvision 0.24.0 matches the image's torch 2.9.0"],
                 replaces_image=[("torch", "2.9.0+cu128", "2.14.1")])
    p = plan(tmp_path, "main.py", r)
    assert ("unpinned, pip alone would replace the image's torch 2.9.0+cu128 with 2.14.1: setup installs with the "
            "plan's pins instead, which keep the image's torch") in p.warnings
    assert "resolved: torchvision 0.24.0 matches the image's torch 2.9.0" in p.hints
    r = resolved(refusal=("no resolution keeps the image's torch: vllm pins torch==2.6.0", "fix: pin vllm<0.9"))
    p = plan(tmp_path, "main.py", r)
    assert p.refusals == [("no resolution keeps the image's torch: vllm pins torch==2.6.0", "fix: pin vllm<0.9")]
    # a refused resolution is no set of packages: torchvision (not among its packages) is not refused for it
    assert {m.module: m.status for m in p.modules}["torchvision"] != "missing"
    assert "setup installs 1 package(s), 0.00 GB, resolved for lambda-stack-22-04" in summary(plan(tmp_path, "main.py",
                                                                                                  resolved("x")))


def test_a_resolver_that_fails_never_blocks(tmp_path):
    write(tmp_path, {"requirements.txt": "numpy\n", "train.py": "import numpy, wandb\n"})

    def broken(request, image, *, timeout_s):
        raise OSError("uv: not found")

    p = plan(tmp_path, "train.py", broken)
    assert not p.refused and "the resolver failed: uv: not found" in p.hints[0]


def test_data_prep_lines_never_refuse_for_what_the_job_writes(tmp_path):
    write(tmp_path, {"requirements.txt": "numpy\n",
                     "run_home.sh": "python3 prep.py --local_save_dir ~/data/toy\npython3 train.py $HOME/data/toy/x\n",
                     "run.sh": "python prepare.py\ntorchrun --standalone --nproc_per_node=8 train.py\n",
                     "prep.py": "import argparse, os\nimport numpy as np\n", "prepare.py": "import numpy, tiktoken\n",
                     "train.py": "import sys\nimport numpy\n"})
    assert not plan(tmp_path, "run_home.sh", resolved("numpy")).refused
    (problem, _), = plan(tmp_path, "run.sh", resolved("numpy")).refusals
    assert problem.startswith("prepare.py (run by run.sh) imports tiktoken, which nothing setup installs provides")


def test_force_passes_what_a_resolution_decides_never_what_no_host_runs(tmp_path):
    from gpuops.errors import ChecksFailed

    write(tmp_path, {"requirements.txt": "torch==2.10\n", "train.py": "import torch\n"})
    p = plan(tmp_path, "train.py", None)
    with pytest.raises(ChecksFailed) as e:
        enforce(p, force=False, done="nothing was launched")
    assert e.value.message.endswith("; nothing was launched") and e.value.hint.endswith("to go on anyway: --force")

    class Out:
        said: list = []

        def warn(self, text):
            self.said.append(text)

    enforce(p, force=True, done="nothing was launched", out=Out())
    assert Out.said[0].endswith("(--force: going on anyway)")
    write(tmp_path, {"run.sh": b"#!/bin/bash\r\npython train.py\r\n"})
    with pytest.raises(ChecksFailed):
        enforce(plan(tmp_path, "run.sh", None), force=True, done="nothing was launched", out=Out())


def test_a_host_whose_image_is_unknown_judges_no_module(tmp_path):
    """train on an existing host: the static plan only; its modules are the gate's to ask."""
    write(tmp_path, {"train.py": "import wandb\nfrom pkg import gone\n", "pkg/__init__.py": ""})
    p = pp.build(tmp_path, "train.py", image=None, settings=pp.Settings(), tables=TABLES, resolver=None)
    assert [x.split(" (")[0] for x in problems(p)] == ["train.py"] and not p.warnings
    assert "imports gone from pkg (pkg/__init__.py), which has no module or name gone" in problems(p)[0]


def test_what_an_ubuntu_python_carries_is_never_refused(tmp_path):
    """cloud-init's yaml on every Lambda instance: undeclared, unresolved, said as a warning only."""
    write(tmp_path, {"requirements.txt": "numpy\n", "train.py": "import yaml\nimport numpy\n"})
    p = plan(tmp_path, "train.py", resolved("numpy"))
    assert not p.refused and {m.module: m.status for m in p.modules}["yaml"] == "system"
    assert "the image's system python may have it (a Debian package); add pyyaml to requirements.txt" in p.warnings[0]


def test_a_path_or_url_requirement_leaves_modules_to_the_instance(tmp_path):
    """A wheel file, a git checkout: what they install is known once installed; no resolution, no refusal."""
    write(tmp_path, {"requirements.txt": "./wheels/pinpkg-1.0-py3-none-any.whl\nnumpy\n", "train.py": "import pinpkg\n"})
    r = resolved("numpy")
    p = plan(tmp_path, "train.py", r)
    assert r.asked == [] and not p.refused
    assert "requirements.txt installs ./wheels/pinpkg-1.0-py3-none-any.whl, which names no distribution" in p.hints[0]
    (tmp_path / "requirements.txt").write_text("mylib @ git+https://example.invalid/mylib.git\n")
    assert plan(tmp_path, "train.py", resolved()).resolution.available is False


def test_a_distribution_named_around_the_module_is_no_refusal(tmp_path):
    """open-instruct: olmo_core comes from ai2-olmo-core, beaker from beaker-py, absl from absl-py: names the plan
    cannot map with certainty are never refused."""
    write(tmp_path, {"requirements.txt": "ai2-olmo-core\nbeaker-py\nabsl-py\n",
                     "train.py": "import olmo_core\nimport beaker\nimport absl\nimport tiktoken\n"})
    p = plan(tmp_path, "train.py", resolved("ai2-olmo-core", "beaker-py", "absl-py"))
    assert {m.module: m.status for m in p.modules} == {"olmo_core": "unknown", "beaker": "installed",
                                                       "absl": "installed", "tiktoken": "missing"}
    assert [x.split(" imports ")[1].split(",")[0] for x in problems(p)] == ["tiktoken"]
    assert "no distribution is known to provide it, and ai2-olmo-core may" in p.warnings[0]


def test_a_project_file_named_as_a_command_is_refused_with_its_interpreter(tmp_path):
    """`--prep prepare.py` (sh -c looks it up on PATH: `not found`, exit 127, after the preparation's instance
    billed), or a `train.py` line in a .sh: refused before the launch, with the line that works; --force passes."""
    write(tmp_path, {"prepare.py": "print('x')\n", "train.py": "print('y')\n", "run.sh": "#!/bin/bash\ntrain.py\n"})
    p = pp.build(tmp_path, "train.py", image=IMAGE, settings=pp.Settings(), tables=TABLES, images_doc=IMAGES,
                 run=pp.RunOptions(prep="prepare.py", prep_outs=("data",)))
    (problem, fix), = p.refusals
    assert problem.startswith("--prep runs `prepare.py`: the shell looks prepare.py up on PATH"), problem
    assert fix == "fix: run it with its interpreter, `python prepare.py` (--prep 'python prepare.py')"
    assert not p.certain  # a host's own PATH might have it: --force passes
    (problem, fix), = plan(tmp_path, "run.sh").refusals
    assert problem.startswith("run.sh runs `train.py`") and fix.endswith("`python train.py`")
    assert not plan(tmp_path, "train.py").refused
