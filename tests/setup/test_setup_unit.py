"""The pure half of setup (plan from recorded facts) and of train's launch gate (verdict from recorded probe facts)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpuops.jobs import plan as core
from gpuops.setup import plan as sp
from gpuops.errors import ProfileError
from support.setup_facts import KNOW, b64, facts, profile
from support import DATA as TEST_DATA


DATA = TEST_DATA / "snapshot"


UV_PROJECT = """[project]
name = "rlvr"
version = "0.1.0"
requires-python = ">=3.10"
dependencies = ["numpy", "transformers>=4.40"]

[project.optional-dependencies]
train = ["wandb"]
eval = ["vllm==0.12.0"]
"""
TOOLS_ONLY = "[tool.ruff]\nline-length = 100\n\n[tool.black]\nline-length = 100\n"

# what setup/scripts.py's facts script prints on a fresh Lambda H100 (Lambda Stack: the system python3 has a CUDA
# torch and pip, no uv, no venv yet), for a uv project with its lock
FRESH_LAMBDA = f"""home=/home/ubuntu
user=ubuntu
uv=
python3=/usr/bin/python3
pip_user_ok=1
@file uv.lock 1111
@file pyproject.toml 2222
@text pyproject.toml {b64(UV_PROJECT)}
base_python_version=3.10.12
base_prefix=/usr
base_pip=1
base_torch=2.9.0+cu128
base_torch_path=/usr/lib/python3/dist-packages
arch=x86_64
@pipconf {{"sources": []}}
env_python=0
running=0
@gpu 0, 570.148.08, 9.0
cuda_driver=12.8
home_disk=/dev/vda1 10485760
@disk /tmp /dev/vda1 10485760
@disk /lambda /dev/nvme0n1 400000000
"""


def test_fresh_lambda_plan_orders_steps_with_reasons_index_and_cache():
    f = sp.parse_facts(FRESH_LAMBDA)
    plan = sp.make_plan(f, profile(setup={"extras": ["train"]}), KNOW, remote_dir="~/proj")
    assert [s.id for s in plan.steps] == ["uv", "environment", "deps", "torch", "flash-attn"]
    assert plan.env_dir == "~/venv" and plan.system_site and "--system-site-packages" in plan.steps[1].command
    assert "the image's torch 2.9.0+cu128" in plan.steps[1].reason
    deps = plan.steps[2]
    assert "\"$UV\" sync --locked --extra train" in deps.command and "UV_PROJECT_ENVIRONMENT" in deps.command
    torch = plan.steps[3]
    assert plan.torch_index == "https://download.pytorch.org/whl/cu128"  # the driver's CUDA 12.8
    assert "--reinstall-torch torch==2.9.0 " in torch.command and "--index-url https://download.pytorch.org/whl/cu128" in torch.command
    fa = plan.steps[4]
    assert "MAX_JOBS=4" in fa.command and "--no-build-isolation" in fa.command and "TORCH_CUDA_ARCH_LIST=9.0" in fa.command
    assert "cxx11abi$abi" in fa.command  # the prebuilt wheel is tried first
    assert plan.disk_mb >= 5000
    assert plan.cache_dir == "/lambda/gpuops-cache-ubuntu"  # home is short: cache on the roomiest other disk
    assert plan.refusal is None  # the cache goes elsewhere, the environment fits
    assert "sudo" not in sp.render_script(plan, setup_dir="~/proj/.gpuops/setup")


def test_no_pip_no_uv_uses_venv_and_requirements():
    text = FRESH_LAMBDA.replace("pip_user_ok=1", "pip_user_ok=0").replace("base_pip=1", "base_pip=0")
    text = text.replace("@file uv.lock 1111\n@file pyproject.toml 2222", "@file requirements.txt 33")
    text = "\n".join(x for x in text.splitlines() if not x.startswith(("@text", "base_torch"))) + "\n"
    plan = sp.make_plan(sp.parse_facts(text), profile(expect={}), KNOW, remote_dir="~/proj")
    assert [s.id for s in plan.steps] == ["environment", "deps"]
    assert "python3 -m venv --system-site-packages" in plan.steps[0].reason
    assert "-r requirements.txt" in plan.steps[1].command and plan.installer == "pip"
    assert any("python3 -m venv" in n for n in plan.notes)


def test_matching_host_has_nothing_to_do_and_changed_lock_only_reinstalls_deps():
    f = sp.parse_facts(FRESH_LAMBDA.replace("env_python=0", "env_python=1\nenv_venv=1\nenv_system_site=1\n"
                                            "@pkg torch=2.9.0+cu128\n@pkg flash-attn=2.8.3\nflash_attn=ok"))
    prof = profile()
    f.stamp = {"deps": sp._sha_key(f, prof)}
    assert sp.make_plan(f, prof, KNOW, remote_dir="~/proj").nothing_to_do
    f2 = copy.deepcopy(f)
    f2.files["uv.lock"] = "changed"
    ids = [s.id for s in sp.make_plan(f2, prof, KNOW, remote_dir="~/proj").steps]
    assert ids == ["deps", "torch", "flash-attn"]  # torch pinned again after sync, flash-attn rebuilt against it
    # --force installs again with nothing changed
    assert [s.id for s in sp.make_plan(f, prof, KNOW, remote_dir="~/proj", force=True).steps][0] == "deps"


def test_cpu_torch_on_a_gpu_host_is_replaced_unless_the_index_is_cpu():
    f = sp.parse_facts(FRESH_LAMBDA.replace("env_python=0", "env_python=1\n@pkg torch=2.9.0+cpu"))
    prof = profile(expect={"packages": {"torch": "2.9.0"}})
    f.stamp = {"deps": sp._sha_key(f, prof)}
    plan = sp.make_plan(f, prof, KNOW, remote_dir="~/proj")
    assert [s.id for s in plan.steps] == ["torch"] and "CPU-only build on a GPU host" in plan.steps[0].reason
    cpu = profile(expect={"packages": {"torch": "2.9.0"}}, setup={"torch_index": "file:///idx/cpu/simple"})
    assert sp.make_plan(f, cpu, KNOW, remote_dir="~/proj").nothing_to_do


def test_python_outside_a_venv_and_pins():
    for system in ("python3", "/usr/bin/python3", "/usr/local/bin/python3.11"):
        with pytest.raises(ProfileError, match="installs nothing into a system Python"):
            sp.env_dir_of(system)
    assert sp.env_dir_of("~/p/.venv/bin/python3.11") == "~/p/.venv"
    assert sp.pin("torch", "2.9.0") == "torch==2.9.0" and sp.pin("torch", ">=2.8") == "torch>=2.8"
    assert sp.pin("torch", "*") == "torch"


def test_script_marks_steps_fails_on_first_error_and_stamps_at_the_end():
    f = sp.parse_facts(FRESH_LAMBDA)
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/my proj")
    text = sp.render_script(plan, setup_dir="~/my proj/.gpuops/setup")
    assert "@@step 1/3 uv" in text and "@@failed" in text and text.rstrip().endswith("gpuops_end 0")
    assert text.index("done.json") > text.index("@@step 3/3")
    assert "cd \"$HOME\"/'my proj'" in text


# -- projects as users make them, on images that ship a CUDA torch (issue #20) --------------------------------------
def test_image_torch_is_used_through_system_site_packages_and_pip():
    """Lambda Stack + requirements naming torch: the environment sees the image's torch; pip installs the rest and
    counts it as installed (uv would fetch another copy); the plan says which torch the job imports."""
    reqs = "torch>=2.5\nnumpy\n-r reqs/base.txt\n"
    f = facts({"requirements.txt": reqs, "reqs/base.txt": "wandb\n"})
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj")
    assert [s.id for s in plan.steps] == ["environment", "deps"]
    assert plan.installer == "pip" and "counts the image's torch 2.9.0+cu128" in plan.installer_reason
    assert plan.torch_source.startswith("torch 2.9.0+cu128 from the image's python")
    assert "satisfies requirements.txt's torch>=2.5" in plan.torch_source
    assert plan.steps[1].disk_mb < 1000  # torch is not downloaded again
    assert "GPUOPS_INSTALLER=pip" in sp.render_script(plan, setup_dir="~/proj/.gpuops/setup")


def test_a_torch_the_project_pins_is_installed_for_the_drivers_cuda_first():
    f = facts({"requirements.txt": "torch==2.10.0\ntorchvision==0.25.0\nsix\n"})
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj")
    assert [s.id for s in plan.steps] == ["environment", "torch", "deps"]
    t = plan.steps[1]
    assert "torch==2.10.0 torchvision==0.25.0" in t.command and "whl/cu128" in t.command
    assert "the image's 2.9.0+cu128 does not match" in t.reason
    assert plan.torch_source == "torch==2.10.0 from https://download.pytorch.org/whl/cu128 (requirements.txt pins it)"
    assert plan.disk_mb >= KNOW["setup_disk_mb"]["torch_cuda"]


def test_without_pip_uv_installs_and_says_the_image_torch_is_copied():
    f = facts({"requirements.txt": "torch\n"}, base_pip=False)
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj")
    assert plan.installer == "uv" and any("beside the image's 2.9.0+cu128" in n for n in plan.notes)
    assert [s.id for s in plan.steps] == ["environment", "torch", "deps"]


def test_a_tool_only_pyproject_installs_the_requirements_not_the_folder():
    f = facts({"pyproject.toml": TOOLS_ONLY, "requirements.txt": "six\n"})
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj")
    deps = plan.steps[-1]
    assert "gpuops_install -r requirements.txt" in deps.command and "-e" not in deps.command
    assert " . " not in deps.command + " " and any("no [project] table" in n for n in plan.notes)


def test_a_pyproject_without_a_lock_is_installed_editable_with_all_extras():
    f = facts({"pyproject.toml": UV_PROJECT, "requirements.txt": "six\n"})
    plan = sp.make_plan(f, profile(expect={}, setup={"extras": "all"}), KNOW, remote_dir="~/proj")
    deps = plan.steps[-1]
    assert "gpuops_install -r requirements.txt && gpuops_install -e '.[eval,train]'" in deps.command
    assert "editable" in deps.title


def test_a_uv_project_with_all_extras_syncs_them_all():
    f = facts({"pyproject.toml": UV_PROJECT, "uv.lock": "lock"})
    plan = sp.make_plan(f, profile(expect={}, setup={"extras": ["all"]}), KNOW, remote_dir="~/proj")
    assert "sync --locked --all-extras" in plan.steps[-1].command and plan.installer == "uv"
    plan = sp.make_plan(f, profile(expect={}, setup={"extras": ["train", "nope"]}), KNOW, remote_dir="~/proj")
    assert "--extra train --extra nope" in plan.steps[-1].command
    assert any("nope" in n and "does not define" in n for n in plan.notes)


def test_a_changed_include_is_not_nothing_to_do():
    files = {"requirements.txt": "-r reqs/base.txt\n-c reqs/pins.txt\n", "reqs/base.txt": "six\n",
             "reqs/pins.txt": "six==1.17.0\n"}
    f = facts(files, env="env_python=1\nenv_venv=1\nenv_system_site=1")
    prof = profile(expect={})
    f.stamp = {"deps": sp._sha_key(f, prof)}
    assert sp.make_plan(f, prof, KNOW, remote_dir="~/proj").nothing_to_do
    for changed in ("reqs/base.txt", "reqs/pins.txt"):
        g = facts({**files, changed: files[changed] + "idna\n"}, env="env_python=1\nenv_venv=1\nenv_system_site=1")
        g.stamp = f.stamp
        plan = sp.make_plan(g, prof, KNOW, remote_dir="~/proj")
        assert [s.id for s in plan.steps] == ["deps"], changed
    assert [r.name for r in sp.parse_requirements(sp.parse_facts("").texts | files, "requirements.txt")] == ["six"]


def test_requirements_markers_are_evaluated_for_the_host():
    """A requirements file with a torch per platform (a Mac for development, Linux for training) used to plan
    `install torch==2.3.0 torch==2.10.0` (pip refuses both at once) from the first line whatever its marker, and to
    count packages for other platforms in the disk estimate."""
    reqs = ('torch==2.3.0 ; sys_platform == "darwin"\n'
            "torch==2.10.0 ; sys_platform == 'linux' and platform_machine == 'x86_64'\n"
            'tensorflow ; platform_machine == "arm64"\nsix ; python_version >= "3.8"\n')
    f = facts({"requirements.txt": reqs})
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj")
    torch = next(s for s in plan.steps if s.id == "torch")
    assert "--reinstall-torch torch==2.10.0 --index-url" in torch.command and "2.3.0" not in torch.command
    assert plan.torch_source.startswith("torch==2.10.0 from")
    deps = next(s for s in plan.steps if s.id == "deps")
    assert deps.disk_mb == KNOW["setup_disk_mb"]["package"]  # six; not tensorflow (arm64 only), not torch again
    # the same in a pyproject's dependencies
    pyproject = ('[project]\nname = "p"\nversion = "0"\n'
                 'dependencies = ["torch==2.3.0; sys_platform == \'darwin\'", "torch>=2.5; sys_platform == \'linux\'"]\n')
    plan = sp.make_plan(facts({"pyproject.toml": pyproject}), profile(expect={}), KNOW, remote_dir="~/proj")
    assert [s.id for s in plan.steps] == ["environment", "deps"]  # the image's 2.9.0+cu128 satisfies torch>=2.5
    assert "satisfies pyproject.toml's torch>=2.5" in plan.torch_source


def test_expect_packages_torch_is_installed_once_and_before_a_project_that_names_it():
    """expect.packages pins torch and the project's requirements name it too: the pin used to come after the
    project's install, which fetched the project's torch from its own index first (a second CUDA torch of GBs,
    replaced a minute later and counted once in the estimate). A pin the image already satisfies used to be
    reinstalled after every project install (6.5 GB in the estimate, a second copy with uv)."""
    f = facts({"requirements.txt": "torch==2.8.0\nsix\n"})
    plan = sp.make_plan(f, profile(expect={"packages": {"torch": "2.8.0"}}), KNOW, remote_dir="~/proj")
    assert [s.id for s in plan.steps] == ["environment", "torch", "deps"]
    assert plan.disk_mb < KNOW["setup_disk_mb"]["torch_cuda"] + 1000
    # a project torch the pin does not satisfy: the pin comes after (expect.packages wins)
    f = facts({"requirements.txt": "torch==2.10.0\nsix\n"})
    plan = sp.make_plan(f, profile(expect={"packages": {"torch": "2.8.0"}}), KNOW, remote_dir="~/proj")
    assert [s.id for s in plan.steps] == ["environment", "deps", "torch"]
    # the image's torch is the one expect.packages asks for: the project's install keeps it, nothing to re-pin
    for reqs, base_pip in (("six\n", True), ("torch>=2.5\nsix\n", True), ("six\n", False)):
        plan = sp.make_plan(facts({"requirements.txt": reqs}, base_pip=base_pip),
                            profile(expect={"packages": {"torch": "2.9.0"}}), KNOW, remote_dir="~/proj")
        assert [s.id for s in plan.steps] == ["environment", "deps"], (reqs, base_pip)
        assert plan.disk_mb < 1000
        assert plan.torch_source.startswith("torch 2.9.0+cu128 from the image's python")
    # ... but uv (no pip to run) does not see it: the pin goes into the environment before the project's install,
    # which then finds it there instead of fetching another torch from the project's index
    plan = sp.make_plan(facts({"requirements.txt": "torch>=2.5\nsix\n"}, base_pip=False),
                        profile(expect={"packages": {"torch": "2.9.0"}}), KNOW, remote_dir="~/proj")
    assert plan.installer == "uv" and [s.id for s in plan.steps] == ["environment", "torch", "deps"]
    assert "uv does not see the image's torch" in plan.steps[1].reason


def test_a_torch_pinned_with_its_cuda_build_comes_from_that_builds_index():
    """`torch==2.3.0+cu121` (with `--extra-index-url .../whl/cu121` in the file, as PyTorch's install page writes it)
    used to be fetched from the driver's index (cu128), which has no such build: the step failed."""
    reqs = "--extra-index-url https://download.pytorch.org/whl/cu121\ntorch==2.3.0+cu121\ntorchvision==0.18.0+cu121\n"
    plan = sp.make_plan(facts({"requirements.txt": reqs}), profile(expect={}), KNOW, remote_dir="~/proj")
    torch = next(s for s in plan.steps if s.id == "torch")
    assert "--index-url https://download.pytorch.org/whl/cu121" in torch.command
    assert plan.torch_index == "https://download.pytorch.org/whl/cu121"
    plan = sp.make_plan(facts({"requirements.txt": "six\n"}), profile(expect={"packages": {"torch": "2.3.0+cu118"}}),
                        KNOW, remote_dir="~/proj")
    assert "whl/cu118" in next(s for s in plan.steps if s.id == "torch").command
    mirror = profile(expect={}, setup={"torch_index": "https://mirror.example/whl"})  # the profile's index wins
    plan = sp.make_plan(facts({"requirements.txt": reqs}), mirror, KNOW, remote_dir="~/proj")
    assert plan.torch_index == "https://mirror.example/whl"


def test_a_plan_that_cannot_fit_is_refused_with_its_estimate():
    f = facts({"requirements.txt": "torch==2.10.0\nvllm\n"}, free_kb=3 * 2**20)  # 3 GB free
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj")
    assert plan.refusal and "GB installed" in plan.refusal and "home has 3.0 GB free" in plan.refusal
    assert sp.make_plan(f, profile(expect={}, setup={"disk_check": False}), KNOW, remote_dir="~/proj").refusal is None


def test_lock_estimate_takes_this_platforms_wheels():
    lock = """version = 1
[[package]]
name = "torch"
version = "2.9.0"
wheels = [
    { url = "https://x/torch-2.9.0-cp310-cp310-manylinux_2_28_x86_64.whl", size = 900000000 },
    { url = "https://x/torch-2.9.0-cp310-cp310-manylinux_2_28_aarch64.whl", size = 100000000 },
]
[[package]]
name = "six"
version = "1.17.0"
wheels = [{ url = "https://x/six-1.17.0-py2.py3-none-any.whl", size = 11000 }]
"""
    assert sp.lock_estimate_mb(lock, "x86_64") == int((900000000 + 11000) * 2 / 2**20)
    assert sp.lock_estimate_mb(lock, "x86_64", skip=frozenset({"torch"})) == 0
    assert sp.lock_estimate_mb("not toml [", "x86_64") is None


def test_a_torch_step_and_a_lock_count_torchs_cuda_libraries_once():
    """A uv project whose lock has torch with its nvidia-* CUDA wheels and triton, and an expect.packages torch that
    replaces it: the torch step's figure (setup_disk_mb.torch_cuda) already holds the CUDA libraries, which the lock's
    estimate used to count again (GBs more, a false refusal on a tight disk)."""
    lock = """version = 1
[[package]]
name = "torch"
version = "2.8.0"
wheels = [{ url = "https://x/torch-2.8.0-cp310-cp310-manylinux_2_28_x86_64.whl", size = 900000000 }]
[[package]]
name = "nvidia-cudnn-cu12"
version = "9.10.2.21"
wheels = [{ url = "https://x/nvidia_cudnn_cu12-9.10.2.21-py3-none-manylinux_2_27_x86_64.whl", size = 700000000 }]
[[package]]
name = "triton"
version = "3.4.0"
wheels = [{ url = "https://x/triton-3.4.0-cp310-cp310-manylinux_2_27_x86_64.whl", size = 150000000 }]
[[package]]
name = "six"
version = "1.17.0"
wheels = [{ url = "https://x/six-1.17.0-py2.py3-none-any.whl", size = 11000 }]
"""
    f = facts({"pyproject.toml": UV_PROJECT, "uv.lock": lock})
    plan = sp.make_plan(f, profile(expect={"packages": {"torch": "2.9.0"}}), KNOW, remote_dir="~/proj",
                        lock_text=lock)
    assert [s.id for s in plan.steps] == ["environment", "deps", "torch"]
    assert next(s for s in plan.steps if s.id == "deps").disk_mb == 0  # six; torch's own are in the torch step
    # without a torch step the lock's torch and its CUDA libraries are what is installed, counted once
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj", lock_text=lock)
    assert next(s for s in plan.steps if s.id == "deps").disk_mb == int((900 + 700 + 150) * 1e6 * 2 / 2**20)


def test_indexes_reach_the_installers_through_the_environment_not_a_command_line():
    f = facts({"requirements.txt": "privpkg\n"}, base_torch=None)
    prof = profile(expect={}, setup={"index_url": "https://user:tok3n@mirror.example/simple",
                                     "extra_index_url": "https://priv.example/simple"})
    plan = sp.make_plan(f, prof, KNOW, remote_dir="~/proj")
    assert all("tok3n" not in s.command for s in plan.steps)
    doc = json.dumps(plan.to_dict())
    assert "tok3n" not in doc and "https://***@mirror.example/simple" in doc
    text = sp.render_script(plan, setup_dir="~/proj/.gpuops/setup")
    assert "GPUOPS_INDEX=https://user:tok3n@mirror.example/simple; export GPUOPS_INDEX" in text
    assert "pip_config(" in text and 'eval "$(python3 -c' in text  # the host's pip.conf, read there, for uv


def _pip_config_as_read(env: dict) -> dict:
    """setup/scripts.py's pip configuration reader, run as setup runs it on a host (a python of its own)."""
    import subprocess
    import sys

    from gpuops.setup.plan import PIPCONF

    code = PIPCONF + "import json\nprint(json.dumps(pip_config('', strip=False)))\n"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def _pip_looks_in(env: dict, image: Path) -> str:
    """The indexes pip itself uses for an install with this environment (its `Looking in indexes:` line), run by the
    python of an emulated instance image (this machine's own python3 may be Debian's, which refuses to install)."""
    import subprocess

    from gpuops.sandbox.image import build

    py = build(image)
    r = subprocess.run([str(py), "-m", "pip", "install", "--dry-run", "--no-deps", "gpuops-no-such-pkg"],
                       env=env, capture_output=True, text=True)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("Looking in indexes:")), "")
    assert line, f"pip printed no index line: {r.stdout}{r.stderr}"
    return line


def test_the_hosts_pip_configuration_is_read_as_pip_reads_it(tmp_path):
    """[install] beats [global] whichever file each is in (pip merges the files, then the sections): a global file's
    [install] index-url used to lose to the user file's [global] one, so uv was given another index than pip used.
    PIP_CONFIG_FILE=/dev/null makes pip read no file at all."""
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (tmp_path / "xdg" / "pip").mkdir(parents=True)
    a, b, c = (f"file://{tmp_path}/{n}/simple" for n in "abc")
    (tmp_path / "xdg" / "pip" / "pip.conf").write_text(f"[install]\nindex-url = {a}\n")
    (home / ".config" / "pip" / "pip.conf").write_text(f"[global]\nindex-url = {b}\nextra-index-url = {c}\n")
    env = {"HOME": str(home), "XDG_CONFIG_DIRS": str(tmp_path / "xdg"), "PATH": "/usr/bin:/bin"}
    cfg = _pip_config_as_read(env)
    assert cfg["index-url"] == a and cfg["extra-index-url"] == [c]
    assert f"Looking in indexes: {a}, {c}" == _pip_looks_in(env, tmp_path / "image")  # what pip itself does
    cfg = _pip_config_as_read({**env, "PIP_INDEX_URL": b})  # a PIP_* variable beats every file
    assert cfg["index-url"] == b and "environment" in cfg["sources"]
    cfg = _pip_config_as_read({**env, "PIP_CONFIG_FILE": "/dev/null"})
    assert "index-url" not in cfg and "extra-index-url" not in cfg and cfg["sources"] == []


def test_run_template_takes_a_system_python_as_the_base_of_its_environment():
    from gpuops.pipeline import bringup as run_ops
    from gpuops.errors import UsageError

    t, note = run_ops.run_template({"python": "python3", "setup": {"extras": ["train"]}}, "h100")
    assert t["python"] == run_ops.RUN_PYTHON and t["setup"] == {"extras": ["train"], "base_python": "python3"}
    assert "is the system's" in note
    same = {"python": "~/venv/bin/python"}
    assert run_ops.run_template(same, "x") == (same, None)
    with pytest.raises(UsageError, match="nothing was launched"):
        run_ops.run_template({"python": "conda run -n x"}, "x")


# -- the launch gate --------------------------------------------------------------------------
def gate_doc(**cuda):
    doc = json.loads((DATA / "probe_h100_torch29_cu128.json").read_text())
    doc["cuda"]["value"]["result"].update(cuda)
    return doc


def test_gate_passes_a_good_stack_and_names_cpu_torch_with_verifys_fix():
    prof = profile(expect={"packages": {"torch": "2.9.0"}, "gpu_count": 2})
    assert core.gate_results(gate_doc(), prof, KNOW) == []
    doc = gate_doc(cuda=None, available=False, version="2.9.0+cpu")
    doc["packages"]["value"]["torch"] = "2.9.0+cpu"
    rs = core.gate_results(doc, prof, KNOW)
    ids = [r.id for r in rs]
    assert ids == ["packages.torch_cuda_build", "cuda.runtime"]
    assert "--index-url https://download.pytorch.org/whl/cu128" in rs[0].remediation
    v = core.judge_preflight(core.Preflight(gpus=["0"]), script_found=True, script="t.py", remote_dir="~/p",
                             min_disk_gb=None, force=False, synced=True, stack=rs)
    assert v.error and v.error.code == 1 and rs[0].remediation in v.error.hint
    v = core.judge_preflight(core.Preflight(gpus=["0"]), script_found=True, script="t.py", remote_dir="~/p",
                             min_disk_gb=None, force=True, synced=True, stack=rs)
    assert v.error is None and len(v.forced) == 2


def test_gate_gpu_count_hidden_devices_and_flash_attn():
    prof = profile(expect={"gpu_count": 2, "imports": ["flash_attn"]})
    doc = gate_doc(device_count=1)
    doc["imports"] = {"ok": True, "value": {"rc": 0, "result": {"flash_attn": {
        "ok": False, "error": "ImportError: flash_attn_2_cuda.so: undefined symbol: _ZN3c10"}}}}
    rs = core.gate_results(doc, prof, KNOW)
    assert [r.id for r in rs] == ["packages.flash_attn", "cuda.device_count"]
    assert "--no-build-isolation" in rs[0].remediation


def test_compile_error_parsed_and_refused():
    pf = core.parse_preflight("@gpu\n0, H100, 80000\n@gpu_rc 0\n@compile SyntaxError: invalid syntax (line 2)\n@end\n")
    assert pf.compile_error == "SyntaxError: invalid syntax (line 2)"
    v = core.judge_preflight(pf, script_found=True, script="t.py", remote_dir="~/p", min_disk_gb=None, force=False,
                             synced=True)
    assert "does not compile" in v.error.message
    assert core.parse_preflight("@gpu\n0\n@gpu_rc 0\n@compile ok\n").compile_error is None


def test_an_include_that_is_not_on_the_host_stops_the_plan_before_it_starts():
    f = facts({"requirements.txt": "six\n-r reqs/gone.txt\n"})
    f.missing.append("reqs/gone.txt")
    plan = sp.make_plan(f, profile(expect={}), KNOW, remote_dir="~/proj")
    assert plan.cannot and "includes reqs/gone.txt, which is not on the host" in plan.cannot


def test_pips_constraint_files_reach_uv_too():
    """This kind of machine caps torch with a pip constraint file (/etc/xdg/pip/pip.conf); uv must honour it as pip
    does, through UV_CONSTRAINT."""
    import os
    import subprocess
    import sys
    import tempfile

    from gpuops.setup.plan import PIP_TO_ENV

    with tempfile.TemporaryDirectory() as d:
        conf = Path(d) / "pip.conf"
        conf.write_text("[global]\nconstraint = ~/caps.txt\ncert = /etc/ssl/ca.pem\n")
        env = {"PATH": os.environ["PATH"], "HOME": d, "PIP_CONFIG_FILE": str(conf)}
        out = subprocess.run([sys.executable, "-c", PIP_TO_ENV, ""], env=env, capture_output=True, text=True).stdout
    assert f"UV_CONSTRAINT={d}/caps.txt; export UV_CONSTRAINT" in out and "SSL_CERT_FILE=/etc/ssl/ca.pem" in out
