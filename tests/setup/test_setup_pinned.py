"""Setup installs exactly what the local plan resolved (issue 34): the pins as a constraints file every install of the
project's files takes, the packages that build against torch first, as the plan said (recorded facts, pure)."""
from __future__ import annotations

import subprocess

from gpuops.setup import pinned
from gpuops.setup import plan as sp
from support.setup_facts import KNOW, facts, profile

REQS = "torch>=2.6\ntorchvision\nflash-attn==2.8.3\n"
RESOLUTION = {
    "available": True,
    "packages": {"torchvision": "0.24.0", "flash-attn": "2.8.3", "einops": "0.8.1"},
    "pins": {"torch": "2.9.0+cu128", "torchvision": "0.24.0", "numpy": "1.21.5", "flash-attn": "2.8.3",
             "einops": "0.8.1"},
    "install_bytes": 300_000_000,
    "builds": [{"name": "flash-attn", "version": "2.8.3", "how": "wheel", "then": "no-build-isolation",
                "template": "https://example.invalid/v{version}/flash_attn-{version}+cu{cuda_major}torch{torch_mm}"
                            "cxx11abi{abi}-{py}-{py}-linux_{machine}.whl",
                "build_requires": ["packaging", "ninja"], "env": {"MAX_JOBS": "4"},
                "why": "builds against torch: the prebuilt wheel ... else --no-build-isolation"},
               {"name": "deepspeed", "version": "0.19.5", "how": "isolated", "why": "its build needs no torch"}],
}


def plan_for(resolution, reqs=REQS, **kw):
    prof = profile(expect={"packages": {}}, **kw)
    return sp.make_plan(facts({"requirements.txt": reqs}), prof, KNOW, remote_dir="~/p", resolution=resolution)


def test_the_pins_constrain_every_install_of_the_project_files():
    plan = plan_for(RESOLUTION)
    assert plan.pins.splitlines() == ["einops==0.8.1", "flash-attn==2.8.3", "numpy==1.21.5", "torch==2.9.0",
                                      "torchvision==0.24.0"]
    deps = next(s for s in plan.steps if s.id == "deps")
    assert 'gpuops_install -r requirements.txt -c "$D/pins.txt"' in deps.command
    script = sp.render_script(plan, setup_dir="~/p/.gpuops/setup")
    # the file is written before the first step, from the plan (never a second resolution on the host)
    assert script.index('> "$D/pins.txt"') < script.index("@@step 1/")
    assert plan.stamp["deps"]["pins"]  # a new resolution installs again


def test_the_pins_file_the_script_writes_is_the_plans(tmp_path):
    plan = plan_for(RESOLUTION)
    script = sp.render_script(plan, setup_dir=str(tmp_path))
    line = next(ln for ln in script.splitlines() if "pins.txt" in ln and ln.startswith("printf"))
    subprocess.run(["sh", "-c", f"D={tmp_path}; {line}"], check=True)
    assert (tmp_path / "pins.txt").read_text() == plan.pins


def test_a_package_that_builds_against_torch_comes_first_as_the_plan_said():
    plan = plan_for(RESOLUTION)
    ids = [s.id for s in plan.steps]
    assert ids.index("build-flash-attn") < ids.index("deps")
    assert "build-deepspeed" not in ids  # it builds in isolation like any package
    step = plan.steps[ids.index("build-flash-attn")]
    assert "install flash-attn==2.8.3 (builds against torch)" == step.title
    assert 'url="https://example.invalid/v2.8.3/flash_attn-2.8.3+cu$cutorch$tmmcxx11abi$abi-$py-$py-linux_$machine' \
        '.whl"' in step.command
    assert "gpuops_install --no-build-isolation flash-attn==2.8.3" in step.command
    assert "MAX_JOBS=" in step.command and "gpuops_install packaging ninja" in step.command


def test_no_resolution_installs_as_before():
    plan = plan_for(None)
    assert plan.pins == "" and "pins.txt" not in sp.render_script(plan, setup_dir="~/p/.gpuops/setup")
    assert "pins" not in plan.stamp["deps"]


def test_a_torch_the_profile_pins_is_left_to_its_own_step():
    prof = profile(expect={"packages": {"torch": "2.10.0"}})
    plan = sp.make_plan(facts({"requirements.txt": REQS}), prof, KNOW, remote_dir="~/p", resolution=RESOLUTION)
    assert "torch==" not in plan.pins and "torchvision==0.24.0" in plan.pins


def test_a_uv_lock_decides_by_itself():
    pyproject = '[project]\nname = "p"\nversion = "0.1"\ndependencies = ["torch"]\n'
    prof = profile(expect={"packages": {}})
    plan = sp.make_plan(facts({"pyproject.toml": pyproject, "uv.lock": "x"}), prof, KNOW, remote_dir="~/p",
                        resolution=RESOLUTION)
    assert plan.pins == "" and "sync --locked" in next(s for s in plan.steps if s.id == "deps").command


def test_pins_text_leaves_out_urls_and_local_labels():
    text = pinned.pins_text({"pins": {"torch": "2.9.0+cu128", "pkg": "https://x/y.whl", "a": "1"}})
    assert text == "a==1\ntorch==2.9.0\n"
