"""The driver and CUDA checks (pure): the driver version, the CUDA the driver supports against the torch wheel's, the
runtime test (a tensor on every GPU), the driver's compatibility with the toolkit, the GPU architecture torch was
built for."""
from __future__ import annotations

from typing import Iterable

from .checks_context import Context
from .results import (CheckResult, FAIL, INFO, PASS, TORCH_INDEX, WARN, _parse_version, cuda_tag, local_tag, major_minor,
                      spec_matches)
from . import rules as _rules


def check_driver(c: Context) -> Iterable[CheckResult]:
    if not c.f.driver:
        return
    want = c.e.driver
    if want is None:
        yield CheckResult("gpu.driver", "NVIDIA driver", INFO, c.f.driver)
        return
    ok = spec_matches(c.f.driver, want)
    if ok is None:
        yield CheckResult("gpu.driver", "NVIDIA driver", FAIL, c.f.driver, want,
                          remediation=f"expect.driver {want!r} is not a version specifier (use e.g. '>=570' or '570.148.08')")
    else:
        yield CheckResult("gpu.driver", "NVIDIA driver", PASS if ok else FAIL, c.f.driver, want,
                          remediation=None if ok else "a different driver than the profile expects: pick the matching image, "
                                                      "or update expect.driver if the new one is intended")


def _driver_row(c: Context, cuda: str | None) -> dict | None:
    mm = major_minor(cuda)
    for row in c.k.get("cuda_drivers", []):
        if str(row["cuda"]) == mm:
            return row
    return None


def _driver_supports(c: Context, cuda: str) -> tuple[str, str]:
    """(status, note) for running CUDA runtime `cuda` on this driver."""
    row = _driver_row(c, cuda)
    drv = _parse_version(c.f.driver or "")
    if row is None or drv is None:
        return INFO, f"no driver table row for CUDA {cuda}"
    if drv >= _parse_version(str(row["toolkit"])):
        return PASS, f"driver {c.f.driver} >= {row['toolkit']} (CUDA {row['cuda']} toolkit driver)"
    if drv >= _parse_version(str(row["minor_compat"])):
        return PASS, (f"driver {c.f.driver} runs CUDA {row['cuda']} through minor-version compatibility "
                      f"(>= {row['minor_compat']}); PTX JIT of newer code needs >= {row['toolkit']}")
    return FAIL, f"driver {c.f.driver} is older than {row['minor_compat']}, the minimum for CUDA {row['cuda']}"


def _wheel_fix(c: Context) -> str:
    """A runnable torch install for the newest CUDA that has PyTorch wheels and that this driver runs (never a CUDA
    without wheels, such as cu114): playbooks/rules.yaml torch_wheel_cudas against the driver table."""
    cudas = (c.k.get("rules") or {}).get("torch_wheel_cudas") or ["12.8", "12.6", "12.4", "12.1", "11.8"]
    best = next((str(cu) for cu in cudas if _driver_supports(c, str(cu))[0] == PASS), None)
    if best is None:
        return "no PyTorch wheel's CUDA runs on this driver: the driver must be upgraded"
    torch = (c.installed("torch") or "").split("+", 1)[0]
    pin = f"torch=={torch}" if torch else "torch"
    return (f"install torch built for CUDA {best}, the newest with wheels this driver runs: {c.pip_install} "
            f"--force-reinstall {pin} --index-url {c.k.get('torch_index', TORCH_INDEX).format(tag=cuda_tag(best))} "
            "(torch releases differ in the CUDA builds they ship: drop the pin if this one has none)")


def check_cuda_driver(c: Context) -> Iterable[CheckResult]:
    """The CUDA version the profile expects vs what the driver supports (nvidia-smi header)."""
    if not c.gpu_host:
        return
    measured = f"driver supports CUDA {c.f.cuda_driver}" if c.f.cuda_driver else "not in nvidia-smi header"
    if c.f.smi_header_style == "kmd":
        measured += " (R610+ header: KMD / CUDA UMD Version)"
    want = c.e.cuda
    if want is None:
        yield CheckResult("gpu.cuda", "CUDA (driver)", INFO, measured)
        return
    have = _parse_version(c.f.cuda_driver or "")
    need = _parse_version(want.lstrip(">=~= ")) if want[0] in "<>=~!" else _parse_version(want)
    if have is not None and need is not None and have.release[:2] >= need.release[:2]:
        yield CheckResult("gpu.cuda", "CUDA (driver)", PASS, measured, want)
        return
    status, note = _driver_supports(c, want.lstrip(">=~= "))
    if status == PASS:
        yield CheckResult("gpu.cuda", "CUDA (driver)", PASS, measured, want, detail=note)
    else:
        row = _driver_row(c, want.lstrip(">=~= "))
        yield CheckResult("gpu.cuda", "CUDA (driver)", FAIL, measured, want,
                          remediation=f"upgrade the NVIDIA driver to >= {row['toolkit'] if row else 'a newer release'}, "
                                      f"or {_wheel_fix(c)}", detail=note)


def check_cuda_runtime(c: Context) -> Iterable[CheckResult]:
    rt = c.f.cuda_runtime
    if not c.f.python_ok or rt is None:
        return
    if not rt:
        return  # CUDA check disabled
    if rt.get("timeout"):
        yield CheckResult("cuda.runtime", "CUDA tensor test", FAIL, "timed out",
                          remediation="CUDA initialisation hung: a GPU is wedged or busy; reboot the instance", detail=rt.get("error"))
        return
    if rt.get("driver_hung"):
        yield CheckResult("cuda.runtime", "CUDA tensor test", FAIL, "not run: the driver does not answer",
                          remediation="nvidia-smi hung (see gpu.nvidia_smi), and CUDA's initialisation hangs with it: "
                                      "reboot the instance; replace it if that does not help")
        return
    if rt.get("crashed"):
        yield CheckResult("cuda.runtime", "CUDA tensor test", FAIL, "the test process crashed", detail=rt.get("error"),
                          remediation="run `python -c 'import torch; torch.zeros(1).cuda()'` on the host to see the crash")
        return
    if not rt.get("imported"):
        err = rt.get("error", "")
        if "No module named" in err:
            expected = "torch" in c.e.packages
            yield CheckResult("cuda.runtime", "CUDA tensor test", FAIL if expected else (WARN if c.gpu_host else INFO),
                              "torch not installed: CUDA not tested", "torch with CUDA" if c.gpu_host else None,
                              remediation="install torch (see packages.torch)" if expected else
                              (f"{c.pip_install} torch --index-url "
                               f"{c.k.get('torch_index', '').format(tag=cuda_tag(c.e.cuda or c.f.cuda_driver) or 'cu128')}"
                               if c.gpu_host else None))
        else:
            yield CheckResult("cuda.runtime", "CUDA tensor test", FAIL, "import torch failed", detail=err[:300],
                              remediation="torch is installed but does not import: reinstall it")
        return
    n_smi = len(c.f.gpus)
    if not rt.get("available"):
        if not c.gpu_host:
            yield CheckResult("cuda.runtime", "CUDA tensor test", INFO if c.e.gpu_count == 0 else FAIL,
                              "CUDA not available (no working GPU)")
            return
        init = rt.get("init_error") or ""
        remedy = "torch cannot use the GPUs nvidia-smi shows"
        if "802" in init or "system not yet initialized" in init:
            remedy = ("CUDA error 802 (system not yet initialized) on an NVSwitch system: "
                      "`sudo systemctl restart nvidia-fabricmanager` (start it if inactive), else reboot")
        elif rt.get("cuda") is None:
            remedy = "torch is a CPU-only build; see packages.torch_cuda_build"
        yield CheckResult("cuda.runtime", "CUDA tensor test", FAIL, f"torch.cuda.is_available() is False", f"{n_smi} GPU(s)",
                          remediation=remedy, detail=init[:300] or None)
        return
    devs = rt.get("devices", [])
    bad = [d for d in devs if d.get("error") or not d.get("matmul_ok")]
    if bad and _arch_problem(c):  # torch lacks kernels for this GPU: a torch build problem (see cuda.arch)
        yield CheckResult("cuda.runtime", "CUDA tensor test", FAIL, f"{len(bad)} of {len(devs)} GPU(s) failed a matmul",
                          "every GPU computes", remediation="torch has no kernels for this GPU's architecture: "
                          "see cuda.arch (not a hardware fault)", detail="; ".join(f"cuda:{d['index']}: {d.get('error')}" for d in bad)[:400])
        return
    if bad:
        yield CheckResult("cuda.runtime", "CUDA tensor test", FAIL,
                          f"{len(bad)} of {len(devs)} GPU(s) failed a matmul", "every GPU computes",
                          remediation="a GPU errors on real work although nvidia-smi looks healthy; reboot, and if it persists "
                                      "replace the instance", detail="; ".join(f"cuda:{d['index']}: {d.get('error')}" for d in bad)[:400])
        return
    count_ok = rt.get("device_count") == n_smi
    yield CheckResult("cuda.runtime", "CUDA tensor test", PASS if count_ok else WARN,
                      f"torch sees {rt.get('device_count')} GPU(s), matmul ok on each (CUDA {rt.get('cuda')})",
                      f"{n_smi} GPU(s)",
                      remediation=None if count_ok else "CUDA_VISIBLE_DEVICES hides some GPUs, or a GPU is unusable")
    if c.e.cuda and rt.get("cuda"):
        ok = spec_matches(rt["cuda"], c.e.cuda)
        yield CheckResult("cuda.version", "torch CUDA runtime", PASS if ok else FAIL, rt["cuda"], c.e.cuda,
                          remediation=None if ok else f"{c.pip_install} --force-reinstall "
                                                      f"torch=={(c.installed('torch') or rt.get('version') or '').split('+', 1)[0]} "
                                                      f"--index-url {c.k.get('torch_index', TORCH_INDEX).format(tag=cuda_tag(c.e.cuda))}"
                                                      "   (and torchvision/torchaudio from the same index)")
    caps = [d.get("capability") for d in devs if d.get("capability")]
    floor = _parse_version(str(c.k.get("bf16_min_compute_capability", "8.0")))
    if rt.get("bf16") is False and caps and all(_parse_version(cap) >= floor for cap in caps):
        yield CheckResult("cuda.bf16", "bf16 support", WARN, "not supported by torch", "supported (compute capability >= 8.0)",
                          remediation="torch reports no bf16 on an Ampere+ GPU: an old torch or CUDA build; upgrade torch")
    elif rt.get("bf16") is not None:
        yield CheckResult("cuda.bf16", "bf16 support", PASS if rt["bf16"] else INFO, "yes" if rt["bf16"] else "no")


def check_driver_compat(c: Context) -> Iterable[CheckResult]:
    """torch's CUDA runtime vs the installed driver, from the knowledge table."""
    rt_cuda = (c.f.cuda_runtime or {}).get("cuda") or None
    torch = c.installed("torch")
    if not rt_cuda and torch and local_tag(torch) and local_tag(torch).startswith("cu"):
        t = local_tag(torch)[2:]
        rt_cuda = f"{t[:-1]}.{t[-1]}"
    if not rt_cuda or not c.f.driver:
        return
    status, note = _driver_supports(c, rt_cuda)
    row = _driver_row(c, rt_cuda)
    yield CheckResult("cuda.driver_compat", "driver runs torch's CUDA", status, f"CUDA {rt_cuda} on driver {c.f.driver}",
                      f"driver >= {row['minor_compat']}" if row else None, detail=note,
                      remediation=None if status != FAIL else f"upgrade the driver to >= {row['toolkit'] if row else '?'}, "
                                                              f"or {_wheel_fix(c)}")


def _arch_problem(c: Context):
    return _rules.arch_problem(c) if (c.f.cuda_runtime or {}).get("imported") else None
