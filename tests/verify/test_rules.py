"""Issue #10's rules on recorded facts (pure): playbooks/rules.yaml's package rules, the torch-arch rule, runnable
fixes, the false alarms that stay quiet. Each rule's e2e through the sandbox is in test_knowledge_e2e.py."""
import shlex

import pytest

from gpuops import knowledge
from gpuops.verify import rules
from gpuops.verify.checks import FAIL, PASS, WARN, evaluate
from gpuops.verify.facts import from_probe
from gpuops.profiles.model import Profile

from support.helpers import healthy_cuda, probe_doc, smi


KN = {**knowledge.knowledge(), "rules": knowledge.load_playbook("rules")}
PRESETS = knowledge.presets()
PLAYBOOK = knowledge.load_playbook("verify")


def prof(**over):
    data = {"name": "p", "host": "h", "python": "~/venv/bin/python"}
    data.update(over)
    return Profile.model_validate(data)


def run(doc, profile=None, preset=None, arch=None):
    profile = profile or prof()
    if arch:
        doc["os"]["value"]["arch"] = arch
    f = from_probe(doc, failures=KN["nvidia_smi_failures"])
    return {r.id: r for r in evaluate(f, profile, PLAYBOOK, KN, PRESETS, knowledge.preset_env(preset or profile.env_preset))}


def h100(**kw):
    base = dict(query=smi("h100_pcie_x1.csv"), table=smi("h100_legacy_header.txt"),
                packages={"torch": "2.9.0+cu128", "numpy": "1.26.4"}, cuda=healthy_cuda())
    base.update(kw)
    return probe_doc(**base)


def test_every_rule_names_its_source():
    r = KN["rules"]
    for row in r["package_rules"]:
        assert row["source"].startswith("seeds/"), row
    for name, row in r["optional_checks"].items():
        assert row["source"].startswith("seeds/"), name
    assert r["arch_list_extensions"]["source"].startswith("seeds/")


def test_megatron_numpy2_fail_with_runnable_pin():
    res = run(h100(packages={"torch": "2.9.0+cu128", "megatron-core": "0.12.0", "numpy": "2.2.6"}))
    r = res["packages.megatron-numpy2"]
    assert r.status == FAIL and r.remediation == "~/venv/bin/python -m pip install 'numpy<2.0' 'opencv-python-headless<4.12'"
    shlex.split(r.remediation)  # runnable as printed: one shell line
    assert "packages.megatron-numpy2" not in run(h100(packages={"megatron-core": "0.12.0", "numpy": "1.26.4"}))


@pytest.mark.parametrize("archs,cap,ok", [
    (["sm_80", "sm_86", "sm_90"], "12.0", False), (["sm_80", "sm_90", "sm_100", "sm_120"], "12.0", True),
    (["sm_80", "sm_90", "sm_120"], "10.0", False), (["sm_80", "sm_86"], "8.9", True), (["sm_90", "compute_90"], "10.0", True),
    ([], "9.0", None),
])
def test_torch_runs_on(archs, cap, ok):
    assert rules.torch_runs_on(archs, cap) is ok


def test_no_kernel_image_on_blackwell_is_a_torch_build_problem_not_hardware():
    cuda = healthy_cuda(cap="12.0", version="2.6.0+cu124", cuda="12.4")
    cuda["arch_list"] = ["sm_80", "sm_90"]
    cuda["devices"][0].update(matmul_ok=None, error="RuntimeError: CUDA error: no kernel image is available for execution on the device")
    res = run(h100(packages={"torch": "2.6.0+cu124"}, cuda=cuda))
    assert res["cuda.arch"].status == FAIL and "not a GPU fault" in res["cuda.arch"].remediation
    assert "'torch>=2.7'" in res["cuda.arch"].remediation and "/whl/cu128" in res["cuda.arch"].remediation
    assert "replace the instance" not in res["cuda.runtime"].remediation
    # a real matmul failure with a matching torch is still a hardware fault
    cuda2 = healthy_cuda()
    cuda2["arch_list"] = ["sm_80", "sm_90"]
    cuda2["devices"][0].update(matmul_ok=False, error="RuntimeError: CUDA error: an illegal memory access was encountered")
    res2 = run(h100(cuda=cuda2))
    assert "replace the instance" in res2["cuda.runtime"].remediation and res2["cuda.arch"].status == PASS


def test_torch_cuda_arch_list_needed_for_extension_builds_on_blackwell_only():
    q = smi("h100_pcie_x1.csv").replace(", 9.0,", ", 12.0,")
    assert ", 12.0," in q
    res = run(h100(query=q, packages={"torch": "2.9.0+cu128", "flash-attn": "2.8.3"}))
    assert res["env.torch_cuda_arch_list"].status == WARN and "blackwell-rtxpro" in res["env.torch_cuda_arch_list"].remediation
    # set on the host, in the profile, or by the preset: quiet
    assert "env.torch_cuda_arch_list" not in run(h100(query=q, packages={"flash-attn": "2.8.3"}, env={"TORCH_CUDA_ARCH_LIST": "12.0"}))
    assert "env.torch_cuda_arch_list" not in run(h100(query=q, packages={"flash-attn": "2.8.3"}), prof(env_preset="blackwell-rtxpro"))
    # Hopper: no warning (torch's wheels cover it)
    assert "env.torch_cuda_arch_list" not in run(h100(packages={"flash-attn": "2.8.3"}))


def test_blackwell_presets_one_per_capability():
    assert knowledge.preset_env("blackwell-b200")["TORCH_CUDA_ARCH_LIST"] == "10.0+PTX"
    assert knowledge.preset_env("blackwell-rtxpro")["TORCH_CUDA_ARCH_LIST"] == "12.0+PTX"
    from gpuops.verify import gpus

    assert gpus.match("NVIDIA B200").preset == "blackwell-b200"
    assert gpus.match("NVIDIA RTX PRO 6000 Blackwell Server Edition").preset == "blackwell-rtxpro"


def test_aarch64_cpu_torch_fix_is_system_site_packages():
    cuda = {"imported": True, "version": "2.9.0+cpu", "cuda": None, "available": False, "device_count": 0, "devices": []}
    res = run(h100(packages={"torch": "2.9.0+cpu"}, cuda=cuda), arch="aarch64")
    r = res["packages.torch_cuda_build"]
    assert r.status == FAIL and "--system-site-packages" in r.remediation and "index-url" not in r.remediation
    x86 = run(h100(packages={"torch": "2.9.0+cpu"}, cuda=cuda))["packages.torch_cuda_build"]
    assert "--index-url https://download.pytorch.org/whl/cu128" in x86.remediation


def test_driver_too_old_suggests_the_newest_wheel_cuda_it_runs_never_cu114():
    table = smi("h100_legacy_header.txt").replace("570.148.08", "470.82.01").replace("CUDA Version: 12.8", "CUDA Version: 11.4")
    res = run(h100(table=table, query=smi("h100_pcie_x1.csv").replace("570.148.08", "470.82.01")),
              prof(expect={"cuda": "12.8"}))
    for cid in ("gpu.cuda", "cuda.driver_compat"):
        fix = res[cid].remediation
        assert "cu114" not in fix and "/whl/cu118" in fix and "torch==2.9.0" in fix, fix


def test_torch_cuda_runtime_fix_is_a_command():
    res = run(h100(packages={"torch": "2.9.0+cu126"}, cuda=healthy_cuda(cuda="12.6", version="2.9.0+cu126")),
              prof(expect={"cuda": "12.8"}))
    fix = res["cuda.version"].remediation
    assert fix.startswith("~/venv/bin/python -m pip install --force-reinstall torch==2.9.0 --index-url "
                          "https://download.pytorch.org/whl/cu128")


def test_missing_flash_attn_and_vllm_fixes():
    res = run(h100(), prof(expect={"packages": {"flash-attn": "*", "vllm": "0.12.0"}}))
    fa = res["packages.flash-attn"].remediation
    assert "--no-build-isolation" in fa and "MAX_JOBS=4" in fa and "NVCC_APPEND_FLAGS='--threads 2'" in fa
    assert "attn_implementation=sdpa" in fa and "TORCH_CUDA_ARCH_LIST='9.0'" in fa
    vl = res["packages.vllm"].remediation
    assert "install vllm==0.12.0 'torch==2.9.0'" in vl


def test_busy_gpu_judged_only_where_the_job_runs():
    parts = [p.strip() for p in smi("h100_pcie_x1.csv").strip().split(",")]  # a 2-GPU query: GPU 0 busy, 1 idle
    g1 = list(parts)
    g1[0], g1[2] = "1", "GPU-aaaa"
    parts[4] = "40000"  # memory.used
    q = ", ".join(parts) + "\n" + ", ".join(g1) + "\n"
    res = run(h100(query=q, cuda=healthy_cuda(2)))
    assert res["gpu.busy"].status == WARN and "GPU 0" in res["gpu.busy"].measured
    assert "gpu.busy" not in run(h100(query=q, cuda=healthy_cuda(2)), prof(env={"CUDA_VISIBLE_DEVICES": "1"}))
    assert "gpu.busy" not in run(h100(query=q, cuda=healthy_cuda(2), env={"CUDA_VISIBLE_DEVICES": "1"}))
    assert "gpu.busy" in run(h100(query=q, cuda=healthy_cuda(2)), prof(env={"CUDA_VISIBLE_DEVICES": "0,1"}))
    assert "gpu.busy" not in run(h100(query=q, cuda=healthy_cuda(2)), prof(env={"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}))


def test_available_memory_judged():
    doc = h100()
    doc["memory"]["value"]["available_bytes"] = 5 * 2**30  # 221 GiB total, 5 available
    r = run(doc, prof(expect={"min_memory_gib": 200}))["system.memory"]
    assert r.status == WARN and "5.0 GiB available" in r.measured
    r2 = run(doc)["system.memory"]  # no expectation: under 10 % available still warns
    assert r2.status == WARN
    assert run(h100(), prof(expect={"min_memory_gib": 200}))["system.memory"].status == PASS


def test_optional_checks_are_user_checks_with_python_quoted():
    out = rules.optional_user_checks(KN["rules"], ["apex", "uv"], "~/venv/bin/python -X dev", "2.9.0")
    assert out[0]["name"] == "apex (opt-in)" and out[0]["command"].startswith('"$HOME"/venv/bin/python -X dev -c ')
    assert "seeds/003" in out[0]["remediation"] and "seeds/000" in out[1]["remediation"]
    from gpuops.errors import UsageError

    with pytest.raises(UsageError, match="unknown check 'nope'"):
        rules.optional_user_checks(KN["rules"], ["nope"], "python3")
