"""The pure half of setup (plan from recorded facts) and of train's launch gate (verdict from recorded probe facts)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpuops import knowledge as kb
from gpuops import runs as core
from gpuops import setup_plan as sp
from gpuops.errors import ProfileError
from gpuops.profiles import Profile

DATA = Path(__file__).parent / "data" / "snapshot"
KNOW = kb.knowledge(Path("/nonexistent"))

# what remote/setup.py's facts script prints on a fresh Lambda H100 (Lambda Stack: no uv, system pip, no venv)
FRESH_LAMBDA = """home=/home/ubuntu
user=ubuntu
uv=
python3=/usr/bin/python3
pip_user_ok=1
env_python=0
@file uv.lock 1111
@file pyproject.toml 2222
running=0
@gpu 0, 570.148.08, 9.0
cuda_driver=12.8
home_disk=/dev/vda1 10485760
@disk /tmp /dev/vda1 10485760
@disk /lambda /dev/nvme0n1 400000000
"""


def profile(**kw) -> Profile:
    base = {"host": "h", "python": "~/venv/bin/python", "expect": {"packages": {"torch": "2.9.0", "flash-attn": "*"}}}
    base.update(kw)
    return Profile(**base)


def test_fresh_lambda_plan_orders_steps_with_reasons_index_and_cache():
    f = sp.parse_facts(FRESH_LAMBDA)
    plan = sp.make_plan(f, profile(setup={"extras": ["train"]}), KNOW, remote_dir="~/proj")
    assert [s.id for s in plan.steps] == ["uv", "environment", "deps", "torch", "flash-attn"]
    assert plan.env_dir == "~/venv"
    deps = plan.steps[2]
    assert "\"$UV\" sync --locked --extra train" in deps.command and "UV_PROJECT_ENVIRONMENT" in deps.command
    torch = plan.steps[3]
    assert plan.torch_index == "https://download.pytorch.org/whl/cu128"  # the driver's CUDA 12.8
    assert "--reinstall-torch torch==2.9.0 " in torch.command and "--index-url https://download.pytorch.org/whl/cu128" in torch.command
    fa = plan.steps[4]
    assert "MAX_JOBS=4" in fa.command and "--no-build-isolation" in fa.command and "TORCH_CUDA_ARCH_LIST=9.0" in fa.command
    assert "cxx11abi$abi" in fa.command  # the prebuilt wheel is tried first
    assert plan.disk_mb >= 8000
    assert plan.cache_dir == "/lambda/gpuops-cache-ubuntu"  # home is short: cache on the roomiest other disk
    assert "sudo" not in sp.render_script(plan, setup_dir="~/proj/.gpuops/setup")


def test_no_pip_no_uv_uses_venv_and_requirements():
    text = FRESH_LAMBDA.replace("pip_user_ok=1", "pip_user_ok=0").replace("@file uv.lock 1111\n@file pyproject.toml 2222",
                                                                        "@file requirements.txt 33")
    plan = sp.make_plan(sp.parse_facts(text), profile(expect={}), KNOW, remote_dir="~/proj")
    assert [s.id for s in plan.steps] == ["environment", "deps"]
    assert "python3 -m venv" in plan.steps[0].reason and "-r requirements.txt" in plan.steps[1].command
    assert any("python3 -m venv" in n for n in plan.notes)


def test_matching_host_has_nothing_to_do_and_changed_lock_only_reinstalls_deps():
    f = sp.parse_facts(FRESH_LAMBDA.replace("env_python=0", "env_python=1\n@pkg torch=2.9.0+cu128\n"
                                            "@pkg flash-attn=2.8.3\nflash_attn=ok"))
    prof = profile()
    f.stamp = {"deps": sp._sha_key(f, prof)}
    assert sp.make_plan(f, prof, KNOW, remote_dir="~/proj").nothing_to_do
    f2 = copy.deepcopy(f)
    f2.files["uv.lock"] = "changed"
    ids = [s.id for s in sp.make_plan(f2, prof, KNOW, remote_dir="~/proj").steps]
    assert ids == ["deps", "torch", "flash-attn"]  # torch pinned again after sync, flash-attn rebuilt against it


def test_cpu_torch_on_a_gpu_host_is_replaced_unless_the_index_is_cpu():
    f = sp.parse_facts(FRESH_LAMBDA.replace("env_python=0", "env_python=1\n@pkg torch=2.9.0+cpu"))
    prof = profile(expect={"packages": {"torch": "2.9.0"}})
    f.stamp = {"deps": sp._sha_key(f, prof)}
    plan = sp.make_plan(f, prof, KNOW, remote_dir="~/proj")
    assert [s.id for s in plan.steps] == ["torch"] and "CPU-only build on a GPU host" in plan.steps[0].reason
    cpu = profile(expect={"packages": {"torch": "2.9.0"}}, setup={"torch_index": "file:///idx/cpu/simple"})
    assert sp.make_plan(f, cpu, KNOW, remote_dir="~/proj").nothing_to_do


def test_python_outside_a_venv_and_pins():
    with pytest.raises(ProfileError):
        sp.env_dir_of("python3")
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
