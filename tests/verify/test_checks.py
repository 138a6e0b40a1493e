"""Pure checks on recorded facts: the failures users hit (seeds/000-004) each give a named fail and a fix."""
import pytest

from gpuops import knowledge
from gpuops.verify.checks import FAIL, INFO, PASS, WARN, evaluate, spec_matches, verdict
from gpuops.verify.facts import from_probe
from gpuops.profiles.model import Profile

from support.helpers import healthy_cuda, probe_doc, smi


KN = knowledge.knowledge()
PRESETS = knowledge.presets()
PLAYBOOK = knowledge.load_playbook("verify")
FAILURES = KN["nvidia_smi_failures"]


def h100_profile(**over):
    data = {"name": "lambda-h100", "host": "209.20.157.194",
            "expect": {"gpu": "H100 PCIe", "gpu_count": 1, "gpu_memory_mib": 81000, "driver": "570.148.08",
                       "cuda": "12.8", "python": "3.10", "packages": {"torch": "2.9.0", "vllm": "0.12.0"},
                       "min_disk_gb": 100, "min_memory_gib": 200}}
    data.update(over)
    return Profile.model_validate(data)


def run(doc, profile=None, playbook=None, preset=None):
    profile = profile or h100_profile()
    f = from_probe(doc, failures=FAILURES)
    penv = knowledge.preset_env(preset or profile.env_preset)
    return {r.id: r for r in evaluate(f, profile, playbook or PLAYBOOK, KN, PRESETS, penv)}


def healthy_doc(**over):
    kw = dict(query=smi("h100_pcie_x1.csv"), table=smi("h100_legacy_header.txt"),
              packages={"torch": "2.9.0+cu128", "vllm": "0.12.0", "numpy": "2.1.2"}, cuda=healthy_cuda())
    kw.update(over)
    return probe_doc(**kw)


def test_healthy_lambda_h100_passes():
    res = run(healthy_doc())
    assert verdict(list(res.values())) == PASS, {k: (r.status, r.measured) for k, r in res.items() if r.status != PASS}
    assert res["gpu.driver"].status == PASS and res["cuda.runtime"].status == PASS
    assert res["packages.torch"].measured == "2.9.0+cu128"


@pytest.mark.parametrize("version,spec,ok", [
    ("12.8", "12.8", True), ("12.8.1", "12.8", True), ("12.4", "12.8", False), ("2.9.0+cu128", "2.9.0", True),
    ("2.9.0+cu126", "2.9.0+cu128", False), ("570.148.08", ">=570", True), ("550.90.07", ">=570", False),
    ("3.10.12", "3.10", True), ("3.12.2", ">=3.10,<3.13", True), ("0.12.0", "*", True), (None, "*", False),
])
def test_spec_matches(version, spec, ok):
    assert spec_matches(version, spec) is ok


def test_invalid_specifier_is_a_fail_with_a_message():
    res = run(healthy_doc(), h100_profile(expect={"driver": "~~570"}))
    assert res["gpu.driver"].status == FAIL and "not a version specifier" in res["gpu.driver"].remediation


def test_cpu_only_torch_on_gpu_host():
    cuda = {"imported": True, "version": "2.9.0+cpu", "cuda": None, "available": False, "device_count": 0, "devices": []}
    res = run(healthy_doc(packages={"torch": "2.9.0+cpu", "vllm": "0.12.0"}, cuda=cuda))
    r = res["packages.torch_cuda_build"]
    assert r.status == FAIL and "CPU-only" in r.measured
    assert "--index-url https://download.pytorch.org/whl/cu128" in r.remediation and "torch==2.9.0" in r.remediation
    assert res["cuda.runtime"].status == FAIL


def test_torchvision_023_with_torch_29_is_a_mismatch():
    res = run(healthy_doc(packages={"torch": "2.9.0+cu128", "torchvision": "0.23.0+cu128", "vllm": "0.12.0"}))
    r = res["packages.torchvision_match"]
    assert r.status == FAIL and "belongs to torch 2.8" in r.detail and "torchvision==0.24.*" in r.remediation


def test_torchvision_024_with_torch_29_passes_and_cuda_tags_must_agree():
    res = run(healthy_doc(packages={"torch": "2.9.0+cu128", "torchvision": "0.24.0+cu128", "vllm": "0.12.0"}))
    assert res["packages.torchvision_match"].status == PASS
    res = run(healthy_doc(packages={"torch": "2.9.0+cu128", "torchvision": "0.24.0+cu126", "vllm": "0.12.0"}))
    assert res["packages.torchvision_match"].status == FAIL and "cu126" in res["packages.torchvision_match"].detail


def test_flash_attn_built_against_another_torch():
    err = ("ImportError: /usr/lib/python3/dist-packages/flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so: "
           "undefined symbol: _ZN3c104cuda9SetDeviceEi")
    res = run(healthy_doc(packages={"torch": "2.9.0+cu128", "vllm": "0.12.0", "flash-attn": "2.7.4.post1"},
                          imports={"flash_attn": {"ok": False, "error": err}}))
    r = res["packages.flash_attn"]
    assert r.status == FAIL and "another torch" in r.measured and "--no-build-isolation" in r.remediation


def test_expandable_segments_with_vllm_warns_from_preset_and_remote_env():
    res = run(healthy_doc(), h100_profile(env_preset="h100"))
    r = res["env.expandable-segments-vllm"]
    assert r.status == WARN and "preset 'h100'" in r.measured and "unset PYTORCH_CUDA_ALLOC_CONF" in r.remediation
    res = run(healthy_doc(env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}))
    assert "remote environment" in res["env.expandable-segments-vllm"].measured
    res = run(healthy_doc(packages={"torch": "2.9.0+cu128"}), h100_profile(env_preset="h100", expect={}))
    assert "env.expandable-segments-vllm" not in res  # no vLLM: no conflict


def test_driver_550_runs_cu128_through_minor_version_compatibility():
    q = smi("rtx6000ada_x2_busy.csv")
    table = smi("h100_legacy_header.txt").replace("570.148.08", "550.90.07").replace("CUDA Version: 12.8", "CUDA Version: 12.4")
    prof = Profile.model_validate({"name": "ada", "host": "x", "expect": {"gpu": "RTX 6000 Ada", "gpu_count": 2, "cuda": "12.8",
                                                                         "driver": "550.90.07"}})
    res = run(probe_doc(query=q, table=table, packages={"torch": "2.9.0+cu128"}, cuda=healthy_cuda(2, cap="8.9")), prof)
    assert res["gpu.cuda"].status == PASS and "minor-version compatibility" in res["gpu.cuda"].detail
    assert res["cuda.driver_compat"].status == PASS
    assert res["gpu.busy"].status == WARN  # GPU 0 already holds 21 GB


def test_old_driver_cannot_run_cuda12():
    table = smi("h100_legacy_header.txt").replace("570.148.08", "470.82.01").replace("CUDA Version: 12.8", "CUDA Version: 11.4")
    res = run(healthy_doc(table=table, query=smi("h100_pcie_x1.csv").replace("570.148.08", "470.82.01")))
    assert res["gpu.cuda"].status == FAIL and "upgrade the NVIDIA driver" in res["gpu.cuda"].remediation
    assert res["cuda.driver_compat"].status == FAIL
    assert res["gpu.driver"].status == FAIL


@pytest.mark.parametrize("fixture,fid,words", [
    ("fail_driver_not_loaded.txt", "driver-not-loaded", "modprobe"),
    ("fail_version_mismatch.txt", "version-mismatch", "reboot"),
    ("fail_no_devices.txt", "no-devices", "lspci"),
    ("fail_gpu_lost.txt", "gpu-lost", "reboot"),
])
def test_nvidia_smi_failures_fail_with_named_cause(fixture, fid, words):
    rc = {"driver-not-loaded": 9, "version-mismatch": 18, "no-devices": 6, "gpu-lost": 15}[fid]
    res = run(healthy_doc(query=smi(fixture), query_rc=rc, table=smi(fixture), table_rc=rc))
    r = res["gpu.nvidia_smi"]
    assert r.status == FAIL and words in r.remediation
    title = next(row["title"] for row in FAILURES if row["id"] == fid)
    assert r.measured == title
    assert "gpu.model" not in res  # nothing judged on GPUs we could not list


def test_cuda_802_on_healthy_looking_nvidia_smi():
    cuda = {"imported": True, "version": "2.9.0+cu128", "cuda": "12.8", "available": False, "device_count": 0, "devices": [],
            "init_error": "RuntimeError: CUDA error: system not yet initialized (802)"}
    res = run(healthy_doc(cuda=cuda))
    r = res["cuda.runtime"]
    assert r.status == FAIL and "fabricmanager" in r.remediation


def test_matmul_failure_on_one_gpu():
    cuda = healthy_cuda(1)
    cuda["devices"][0] = {"index": 0, "error": "RuntimeError: CUDA error: an illegal memory access was encountered"}
    res = run(healthy_doc(cuda=cuda))
    assert res["cuda.runtime"].status == FAIL and "illegal memory access" in res["cuda.runtime"].detail


def test_wrong_gpu_count_model_memory_and_small_disk():
    prof = h100_profile(expect={"gpu": "H100 SXM", "gpu_count": 8, "gpu_memory_mib": 90000, "min_disk_gb": 500,
                                "min_memory_gib": 400})
    res = run(healthy_doc(), prof)
    for cid in ("gpu.model", "gpu.count", "gpu.memory", "system.disk", "system.memory"):
        assert res[cid].status == FAIL and res[cid].remediation, cid


def test_missing_package_and_wrong_python():
    res = run(healthy_doc(packages={"torch": "2.9.0+cu128"}, python_version="3.8.10"))
    assert res["packages.vllm"].status == FAIL and "pip install vllm==0.12.0" in res["packages.vllm"].remediation
    assert res["python.version"].status == FAIL


def test_host_without_python():
    from gpuops.remote.gather import _parse_fallback

    doc = _parse_fallback("@@gpuops-no-python\n@@smi_query 0\n" + smi("h100_pcie_x1.csv") + "@@smi 0\n"
                          + smi("h100_legacy_header.txt"), "python3")
    res = run(doc)
    assert res["python.version"].status == FAIL and "not found" in res["python.version"].measured
    assert res["gpu.model"].status == PASS  # GPU facts still gathered without Python
    assert "packages.torch" not in res


def test_user_checks_exit_substring_regex():
    pb = dict(PLAYBOOK)
    pb["user_checks"] = [
        {"name": "dataset present", "command": "ls data", "expect_regex": "^math500$"},
        {"name": "hf login", "command": "huggingface-cli whoami", "expect_contains": "gilbert", "severity": "warn"},
        {"name": "exit code", "command": "false", "expect_exit": 1},
    ]
    uc = {"dataset present": {"ok": True, "value": {"rc": 0, "stdout": "math500\n", "stderr": ""}},
          "hf login": {"ok": True, "value": {"rc": 0, "stdout": "Not logged in\n", "stderr": ""}},
          "exit code": {"ok": True, "value": {"rc": 1, "stdout": "", "stderr": ""}}}
    res = run(healthy_doc(user_checks=uc), playbook=pb)
    assert res["user.dataset_present"].status == PASS
    assert res["user.hf_login"].status == WARN and "lacks 'gilbert'" in res["user.hf_login"].detail
    assert res["user.exit_code"].status == PASS


def test_no_nvidia_smi_is_a_fail_with_install_hint():
    res = run(healthy_doc(smi_found=False))
    assert res["gpu.nvidia_smi"].status == FAIL and "driver" in res["gpu.nvidia_smi"].remediation


def test_unknown_check_in_playbook_is_usage_error():
    from gpuops.errors import UsageError

    with pytest.raises(UsageError, match="gpu.modle"):
        run(healthy_doc(), playbook={"checks": ["gpu.modle"]})


def test_info_rows_are_not_failures():
    res = run(healthy_doc(), h100_profile(expect={}))
    assert all(r.status in (PASS, INFO, WARN) for r in res.values())
