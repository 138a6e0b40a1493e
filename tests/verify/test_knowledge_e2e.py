"""Issue #10's verify rules end to end through the sandbox: crafted Pythons on the host (a venv whose packages are
dist-info metadata, and for the arch rule a small fake torch that answers like a cu124 build on a Blackwell GPU),
the emulated GPUs, and each former false alarm staying quiet."""
from __future__ import annotations

import json
import time

from gpuops.sandbox import host
from support.runs import FOREVER, put, run_id_of
from support.envs import profile_from_sandbox
from support.envs import crafted_python


FAKE_TORCH = '''
__version__ = "2.6.0+cu124"
class version:
    cuda = "12.4"
class _Cudnn:
    @staticmethod
    def version():
        return 90100
class backends:
    cudnn = _Cudnn
class cuda:
    @staticmethod
    def is_available():
        return True
    @staticmethod
    def device_count():
        return 1
    @staticmethod
    def get_arch_list():
        return ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
    @staticmethod
    def get_device_name(i):
        return "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    @staticmethod
    def get_device_capability(i):
        return (12, 0)
    @staticmethod
    def synchronize(i):
        pass
    @staticmethod
    def is_bf16_supported():
        return True
def randn(*a, **k):
    raise RuntimeError("CUDA error: no kernel image is available for execution on the device")
'''


def verify_json(gpuops, profile: str = "sandbox", code: int | None = None) -> dict:
    r = gpuops("verify", profile, "--json", "--no-save")
    if code is not None:
        assert r.code == code, r.all
    return {c["id"]: c for c in json.loads(r.out)["checks"]}


def test_megatron_with_numpy2_fails_with_the_pin_and_opencv_warns(sandbox, gpuops):
    py = crafted_python(sandbox, "venv-megatron", {"megatron-core": "0.12.0", "numpy": "2.2.6",
                                                   "opencv-python-headless": "4.12.0.88"})
    profile_from_sandbox(sandbox, "mg", python=py)
    checks = verify_json(gpuops, "mg", code=1)
    mg = checks["packages.megatron-numpy2"]
    assert mg["status"] == "fail" and "numpy 2.2.6" in mg["measured"]
    # a venv without pip (as uv makes them): the fix runs there with uv's pip, not `python -m pip`
    assert mg["remediation"] == f"uv pip install --python {py} 'numpy<2.0' 'opencv-python-headless<4.12'"
    assert "seeds/003" in mg["detail"]
    assert checks["packages.opencv-pulls-numpy2"]["status"] == "warn"


def test_megatron_with_numpy1_and_opencv_411_stays_quiet(sandbox, gpuops):
    py = crafted_python(sandbox, "venv-megatron-ok", {"megatron-core": "0.12.0", "numpy": "1.26.4",
                                                      "opencv-python-headless": "4.11.0.86"})
    profile_from_sandbox(sandbox, "mgok", python=py)
    checks = verify_json(gpuops, "mgok")
    assert not [k for k in checks if k in ("packages.megatron-numpy2", "packages.opencv-pulls-numpy2")]
    # opencv 4.12 without Megatron is no concern either
    py2 = crafted_python(sandbox, "venv-opencv", {"numpy": "2.2.6", "opencv-python-headless": "4.12.0.88"})
    profile_from_sandbox(sandbox, "cv", python=py2)
    assert "packages.opencv-pulls-numpy2" not in verify_json(gpuops, "cv")


def test_torch_without_kernels_for_blackwell_is_a_torch_build_fault(sandbox, gpuops):
    host.up(gpu="rtxpro6000")
    py = crafted_python(sandbox, "venv-cu124", {"torch": "2.6.0+cu124", "megatron-core": "0.12.0", "numpy": "1.26.4"},
                        {"torch": FAKE_TORCH})
    profile_from_sandbox(sandbox, "bw", python=py, env_preset=None)  # the sandbox profile names the preset
    checks = verify_json(gpuops, "bw", code=1)
    arch = checks["cuda.arch"]
    assert arch["status"] == "fail" and "sm_90" in arch["measured"] and "sm_120" in arch["expected"]
    assert "not a GPU fault" in arch["remediation"] and "--index-url https://download.pytorch.org/whl/cu128" in arch["remediation"]
    rt = checks["cuda.runtime"]
    assert "not a hardware fault" in rt["remediation"] and "replace the instance" not in rt["remediation"]
    # an extension build (megatron-core) on sm_120 without TORCH_CUDA_ARCH_LIST: the preset for this GPU is named
    tal = checks["env.torch_cuda_arch_list"]
    assert tal["status"] == "warn" and "env_preset: blackwell-rtxpro" in tal["remediation"]
    # with the preset for this capability, that warning is gone
    profile_from_sandbox(sandbox, "bw2", python=py, env_preset="blackwell-rtxpro")
    assert "env.torch_cuda_arch_list" not in verify_json(gpuops, "bw2")


def test_b200_suggests_its_own_preset(sandbox, gpuops):
    host.up(gpu="b200")
    py = crafted_python(sandbox, "venv-b200", {"flash-attn": "2.8.3"})
    profile_from_sandbox(sandbox, "b2", python=py, env_preset=None)
    tal = verify_json(gpuops, "b2")["env.torch_cuda_arch_list"]
    assert "blackwell-b200" in tal["remediation"] and "10.0+PTX" in tal["expected"]


def test_opt_in_checks_by_name(sandbox, gpuops):
    py = crafted_python(sandbox, "venv-optin", {}, {"mbridge": "", "packaging": ""})
    profile_from_sandbox(sandbox, "opt", python=py, checks=["mbridge", "packaging"])
    r = gpuops("verify", "opt", "--json", "--no-save")
    assert r.code == 1, r.all
    checks = {c["title"]: c for c in json.loads(r.out)["checks"]}
    assert checks["mbridge (opt-in)"]["status"] == "pass"
    pz = checks["packaging (opt-in)"]  # no pyzmq in this venv
    assert pz["status"] == "fail" and f"uv pip install --python {py} packaging pyzmq" in pz["remediation"] \
        and "seeds/003" in pz["remediation"]
    # an unknown name is a profile error naming the known ones
    profile_from_sandbox(sandbox, "bad", checks=["nosuch"])
    r = gpuops("verify", "bad", "--no-save")
    assert r.code == 2 and "nosuch" in r.err and "mbridge" in r.err


def test_busy_gpu_the_job_does_not_see_stays_quiet(sandbox, gpuops):
    host.up(gpus=2)
    put(sandbox, "forever.py", FOREVER)
    rid = run_id_of(gpuops("train", "--script", "forever.py", "--no-sync", "--no-snapshot", "-e", "CUDA_VISIBLE_DEVICES=0"))
    try:
        time.sleep(0.5)
        busy = verify_json(gpuops)  # a job on GPU 0, the profile sees both: warned
        assert busy["gpu.busy"]["status"] == "warn" and "GPU 0" in busy["gpu.busy"]["measured"]
        profile_from_sandbox(sandbox, "gpu1", env={"CUDA_VISIBLE_DEVICES": "1"})
        assert "gpu.busy" not in verify_json(gpuops, "gpu1")  # the job sees only GPU 1: quiet
    finally:
        assert gpuops("stop", rid, "-p", "sandbox", "--grace", "2").code == 0


def test_missing_remote_dir_says_sync_creates_it(sandbox, gpuops):
    profile_from_sandbox(sandbox, "nodir", remote_dir="~/No-Such-Project")
    disk = verify_json(gpuops, "nodir")["system.disk"]
    assert "does not exist yet" in disk["measured"] and "gpuops sync" in disk["measured"]


def test_hung_nvidia_smi_is_detected_within_25s_on_the_default_budget(sandbox, gpuops):
    host.up(fail="hang")
    t = time.monotonic()
    r = gpuops("verify", "sandbox", "--no-save")
    took = time.monotonic() - t
    assert r.code == 1 and "nvidia-smi hung" in r.out
    assert took < 25, took


def test_a_hung_driver_on_an_image_with_a_cuda_torch_is_reported_without_waiting_for_cuda(sandbox, gpuops, tmp_path):
    """Lambda Stack's python has a CUDA torch, whose initialisation hangs with the driver (as the emulated one does).
    verify used to let the CUDA test start on a hung driver and wait out its 90 s; now it does not touch the GPU,
    says why, and ends within the nvidia-smi budget."""
    from gpuops.sandbox.image import build

    profile_from_sandbox(sandbox, "lstack", python=str(build(tmp_path / "image")))
    host.up(fail="hang")
    t = time.monotonic()
    r = gpuops("verify", "lstack", "--no-save", "--json")
    took = time.monotonic() - t
    checks = {c["id"]: c for c in json.loads(r.out)["checks"]}
    assert r.code == 1 and checks["gpu.nvidia_smi"]["status"] == "fail", r.all
    assert checks["cuda.runtime"]["measured"] == "not run: the driver does not answer", checks["cuda.runtime"]
    assert "2.9.0+cu128" in r.out  # the image's torch was found, and imported (below) without touching the GPU
    assert took < 30, took
