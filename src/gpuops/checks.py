"""(facts, expectations, playbook, knowledge) -> check results. Pure: no I/O, unit-tested on recorded facts."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Iterable

from .facts import Facts

PASS, WARN, FAIL, INFO = "pass", "warn", "fail", "info"
TORCH_INDEX = "https://download.pytorch.org/whl/{tag}"  # used when knowledge.yaml has no torch_index
AREAS = {"system": "System", "gpu": "GPU", "python": "Python", "packages": "Packages", "cuda": "CUDA runtime",
         "env": "Environment", "user": "Your checks"}


@dataclass
class CheckResult:
    id: str
    title: str
    status: str
    measured: str | None = None
    expected: str | None = None
    remediation: str | None = None
    detail: str | None = None

    @property
    def area(self) -> str:
        return self.id.split(".", 1)[0]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["area"] = self.area
        return d


# -- versions ------------------------------------------------------------------------------
def _parse_version(text: str):
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text)
    except InvalidVersion:
        m = re.match(r"[\d.]+", text or "")
        return Version(m.group(0).strip(".")) if m and m.group(0).strip(".") else None


def spec_matches(version: str | None, spec: str) -> bool | None:
    """True/False, or None when the specifier is invalid. A bare version means 'this release or a patch of it'
    ("12.8" matches 12.8 and 12.8.1; "2.9.0" matches 2.9.0+cu128); "*" means installed."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    if version is None:
        return False
    spec = spec.strip()
    if spec in ("*", ""):
        return True
    v = _parse_version(version)
    if v is None:
        return False
    if spec[0].isdigit():
        if "+" in spec:
            return version == spec
        want = _parse_version(spec)
        if want is None:
            return None
        n = len(want.release)
        return v.release[:n] == want.release
    try:
        return SpecifierSet(spec, prereleases=True).contains(v, prereleases=True)
    except InvalidSpecifier:
        return None


def _major_minor(version: str | None) -> str | None:
    if not version:
        return None
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def _cuda_tag(cuda: str | None) -> str | None:
    mm = _major_minor(cuda)
    return "cu" + mm.replace(".", "") if mm else None


def _local_tag(version: str | None) -> str | None:
    return version.split("+", 1)[1] if version and "+" in version else None


def _gib(n: int | None) -> str:
    return f"{n / 2**30:.1f} GiB" if n is not None else "unknown"


# -- the checks ----------------------------------------------------------------------------
class Context:
    def __init__(self, facts: Facts, profile, playbook: dict, knowledge: dict, presets: dict, preset_env: dict):
        self.f = facts
        self.p = profile
        self.e = profile.expect
        self.pb = playbook
        self.th = playbook.get("thresholds", {}) or {}
        self.k = knowledge
        self.presets = presets
        self.preset_env = preset_env

    @property
    def gpu_host(self) -> bool:
        return self.f.smi.state == "ok" and bool(self.f.gpus)

    def installed(self, name: str) -> str | None:
        return self.f.packages.get(name)


def check_os(c: Context) -> Iterable[CheckResult]:
    o = c.f.os
    yield CheckResult("system.os", "Operating system", INFO if o else WARN,
                      measured=f"{o.get('pretty') or '?'} (kernel {o.get('kernel') or '?'}, {o.get('arch') or '?'})" if o else None,
                      detail=None if o else c.f.errors.get("os"))


def check_disk(c: Context) -> Iterable[CheckResult]:
    d = c.f.disk
    if not d:
        yield CheckResult("system.disk", "Free disk", WARN, detail=c.f.errors.get("disk", "not measured"),
                          remediation="the disk probe failed or timed out (a hung network mount?): check `df -h` on the host")
        return
    free_gb = d["free_bytes"] / 1e9
    where = d.get("path")
    measured = f"{free_gb:.1f} GB free at {where}"
    want = c.e.min_disk_gb
    if want is not None and free_gb < want:
        yield CheckResult("system.disk", "Free disk", FAIL, measured, f">= {want:g} GB",
                          remediation=f"free space under {d.get('measured_at')} (old checkpoints: `gpuops fetch` them, then delete), "
                                      "or attach a larger filesystem")
    elif free_gb < float(c.th.get("disk_free_warn_gb", 20)):
        yield CheckResult("system.disk", "Free disk", WARN, measured, f">= {c.th.get('disk_free_warn_gb', 20)} GB (warning threshold)",
                          remediation="checkpoints of large models need tens of GB each; free space before training")
    else:
        yield CheckResult("system.disk", "Free disk", PASS, measured, f">= {want:g} GB" if want is not None else None)


def check_memory(c: Context) -> Iterable[CheckResult]:
    total = c.f.memory_total_bytes
    measured = f"{_gib(total)} total, {_gib(c.f.memory_available_bytes)} available" if total else None
    want = c.e.min_memory_gib
    if total is None:
        yield CheckResult("system.memory", "System memory", WARN, detail=c.f.errors.get("memory", "not measured"))
    elif want is not None and total / 2**30 < want:
        yield CheckResult("system.memory", "System memory", FAIL, measured, f">= {want:g} GiB",
                          remediation="choose an instance type with more RAM (see instance_type in the profile)")
    else:
        yield CheckResult("system.memory", "System memory", PASS if want is not None else INFO, measured,
                          f">= {want:g} GiB" if want is not None else None)


def check_nvidia_smi(c: Context) -> Iterable[CheckResult]:
    s = c.f.smi
    no_gpu_expected = c.e.gpu_count == 0
    if s.state == "ok":
        n = len(c.f.gpus)
        note = " (EMULATED by the gpuops sandbox)" if c.f.emulated else ""
        yield CheckResult("gpu.nvidia_smi", "nvidia-smi", PASS if n else FAIL, f"{n} GPU(s){note}",
                          remediation=None if n else "nvidia-smi lists no GPU")
    elif s.state == "missing" and no_gpu_expected:
        yield CheckResult("gpu.nvidia_smi", "nvidia-smi", INFO, "not installed (profile expects no GPU)")
    else:
        yield CheckResult("gpu.nvidia_smi", "nvidia-smi", FAIL, s.title, "working nvidia-smi",
                          remediation=s.remediation, detail=s.message)


def check_gpu_model(c: Context) -> Iterable[CheckResult]:
    if not c.gpu_host:
        return
    names = sorted({g.name for g in c.f.gpus})
    want = c.e.gpu
    if want is None:
        yield CheckResult("gpu.model", "GPU model", INFO, ", ".join(names))
    elif all(want.lower() in g.name.lower() for g in c.f.gpus):
        yield CheckResult("gpu.model", "GPU model", PASS, ", ".join(names), f"*{want}*")
    else:
        yield CheckResult("gpu.model", "GPU model", FAIL, ", ".join(names), f"*{want}*",
                          remediation="this is not the instance type the profile describes: check host: and instance_type:")


def check_gpu_count(c: Context) -> Iterable[CheckResult]:
    if not c.gpu_host or c.e.gpu_count is None:
        return
    n = len(c.f.gpus)
    ok = n == c.e.gpu_count
    yield CheckResult("gpu.count", "GPU count", PASS if ok else FAIL, str(n), str(c.e.gpu_count),
                      remediation=None if ok else "a GPU may be missing (fallen off the bus) or the instance type differs; "
                                                  "check `nvidia-smi -L` and `dmesg | grep -i xid`")


def check_gpu_memory(c: Context) -> Iterable[CheckResult]:
    if not c.gpu_host:
        return
    mems = [g.memory_total_mib for g in c.f.gpus if g.memory_total_mib is not None]
    if not mems:
        yield CheckResult("gpu.memory", "GPU memory", WARN, "not reported ([N/A])")
        return
    low = min(mems)
    want = c.e.gpu_memory_mib
    measured = f"{low:,.0f} MiB per GPU" if len(set(mems)) == 1 else f"{low:,.0f}–{max(mems):,.0f} MiB"
    if want is not None and low < want:
        yield CheckResult("gpu.memory", "GPU memory", FAIL, measured, f">= {want:,} MiB",
                          remediation="a smaller-memory GPU than the profile expects (e.g. 40 GB A100 vs 80 GB)")
    else:
        yield CheckResult("gpu.memory", "GPU memory", PASS if want is not None else INFO, measured,
                          f">= {want:,} MiB" if want is not None else None)
    busy_pct = float(c.th.get("gpu_memory_busy_warn_pct", 10))
    busy = [g for g in c.f.gpus if g.memory_used_mib and g.memory_total_mib and
            100 * g.memory_used_mib / g.memory_total_mib >= busy_pct]
    if busy:
        yield CheckResult("gpu.busy", "GPU memory in use", WARN,
                          ", ".join(f"GPU {g.index}: {g.memory_used_mib:,.0f} MiB used" for g in busy),
                          f"< {busy_pct:g}% before training",
                          remediation="another process holds GPU memory (a previous run, a notebook): "
                                      "`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv`, then stop it")


def check_gpu_health(c: Context) -> Iterable[CheckResult]:
    if not c.gpu_host:
        return
    limit = float(c.th.get("gpu_temperature_warn_c", 85))
    hot = [g for g in c.f.gpus if g.temperature_c is not None and g.temperature_c >= limit]
    notes = sorted({f"{k.replace('_', ' ')}: {v}" for g in c.f.gpus for k, v in g.unavailable.items()})
    detail = ("not reported by this GPU/driver: " + "; ".join(notes)) if notes else None
    if hot:
        yield CheckResult("gpu.health", "GPU temperature", WARN,
                          ", ".join(f"GPU {g.index}: {g.temperature_c:.0f} C" for g in hot), f"< {limit:g} C",
                          remediation="a GPU is hot before training; it will throttle. Check the load and cooling", detail=detail)
    else:
        temps = [g.temperature_c for g in c.f.gpus if g.temperature_c is not None]
        yield CheckResult("gpu.health", "GPU temperature", PASS,
                          f"max {max(temps):.0f} C" if temps else "not reported", f"< {limit:g} C", detail=detail)


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
    mm = _major_minor(cuda)
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
                          remediation=f"upgrade the NVIDIA driver to >= {row['toolkit'] if row else 'a newer release'} "
                                      f"or use PyTorch wheels built for CUDA {c.f.cuda_driver}", detail=note)


def check_python(c: Context) -> Iterable[CheckResult]:
    if not c.f.python_ok:
        yield CheckResult("python.version", "Python", FAIL, f"'{c.f.python_missing}' not found on the host", c.e.python or ">=3.8",
                          remediation=f"install it (`sudo apt-get install -y python3 python3-venv`) or set 'python:' in the "
                                      f"profile to the interpreter you train with (e.g. ~/venv/bin/python)")
        return
    v = c.f.python.get("version")
    want = c.e.python
    if want is None:
        yield CheckResult("python.version", "Python", INFO, f"{v} ({c.f.python.get('executable')})")
        return
    ok = spec_matches(v, want)
    yield CheckResult("python.version", "Python", PASS if ok else FAIL, f"{v} ({c.f.python.get('executable')})", want,
                      remediation=None if ok else f"use an interpreter matching {want}: set 'python:' in the profile "
                                                  "(e.g. a venv or conda env's python)")


def check_packages(c: Context) -> Iterable[CheckResult]:
    if not c.f.python_ok:
        return
    for name, spec in c.e.packages.items():
        have = c.installed(name)
        cid = f"packages.{name}"
        if have is None:
            pin = f"{name}=={spec}" if spec and spec[0].isdigit() else (f"'{name}{spec}'" if spec != "*" else name)
            yield CheckResult(cid, name, FAIL, "not installed", spec,
                              remediation=f"{c.p.python} -m pip install {pin}" + _index_hint(c, name, spec))
            continue
        ok = spec_matches(have, spec)
        if ok is None:
            yield CheckResult(cid, name, FAIL, have, spec, remediation=f"{spec!r} is not a version specifier")
        else:
            yield CheckResult(cid, name, PASS if ok else FAIL, have, spec,
                              remediation=None if ok else f"{c.p.python} -m pip install '{name}{'==' + spec if spec[0].isdigit() else spec}'"
                                                          + _index_hint(c, name, spec))


def _index_hint(c: Context, name: str, spec: str) -> str:
    if name not in ("torch", "torchvision", "torchaudio"):
        return ""
    tag = _local_tag(spec) or _cuda_tag(c.e.cuda) or _cuda_tag(c.f.cuda_driver)
    return f" --index-url {c.k.get('torch_index', TORCH_INDEX).format(tag=tag)}" if tag else ""


def check_torch_cuda_build(c: Context) -> Iterable[CheckResult]:
    torch = c.installed("torch")
    if not torch or not c.gpu_host:
        return
    rt = c.f.cuda_runtime or {}
    cpu_only = _local_tag(torch) == "cpu" or (rt.get("imported") and rt.get("cuda") is None)
    if cpu_only:
        tag = _cuda_tag(c.e.cuda) or _cuda_tag(c.f.cuda_driver) or "cu128"
        base = torch.split("+", 1)[0]
        index = c.k.get("torch_index", TORCH_INDEX).format(tag=tag)
        yield CheckResult("packages.torch_cuda_build", "torch CUDA build", FAIL, f"torch {torch} is a CPU-only build",
                          f"a CUDA build ({tag})",
                          remediation=f"{c.p.python} -m pip install --force-reinstall torch=={base} --index-url {index} "
                                      "(and torchvision/torchaudio from the same index)")
    else:
        yield CheckResult("packages.torch_cuda_build", "torch CUDA build", PASS,
                          f"torch {torch} (CUDA {rt.get('cuda') or _local_tag(torch) or '?'})")


def check_torch_companions(c: Context) -> Iterable[CheckResult]:
    torch = c.installed("torch")
    if not torch:
        return
    tmm = _major_minor(torch)
    row = next((r for r in c.k.get("torch_companions", []) if str(r["torch"]) == tmm), None)
    for comp in ("torchvision", "torchaudio"):
        have = c.installed(comp)
        if not have:
            continue
        cid = f"packages.{comp}_match"
        problems = []
        if row and _major_minor(have) != str(row[comp]):
            owner = next((str(r["torch"]) for r in c.k.get("torch_companions", []) if str(r[comp]) == _major_minor(have)), None)
            problems.append(f"{comp} {have} belongs to torch {owner or '?'}, torch {torch} needs {comp} {row[comp]}.x")
        lt, lc = _local_tag(torch), _local_tag(have)
        if lt and lc and lt != lc:
            problems.append(f"built for {lc}, torch for {lt}")
        if problems:
            want = f"{row[comp]}.*" if row else "the release matching torch"
            tag = lt or _cuda_tag(c.e.cuda)
            index = f" --index-url {c.k.get('torch_index').format(tag=tag)}" if tag and c.k.get("torch_index") else ""
            yield CheckResult(cid, f"{comp} matches torch", FAIL, have, f"{comp} {want} for torch {tmm}",
                              remediation=f"{c.p.python} -m pip install '{comp}=={want}'{index}", detail="; ".join(problems))
        else:
            yield CheckResult(cid, f"{comp} matches torch", PASS if row else INFO, have,
                              f"{comp} {row[comp]}.x for torch {tmm}" if row else None,
                              detail=None if row else f"no compatibility row for torch {tmm} in knowledge.yaml")


def check_imports(c: Context) -> Iterable[CheckResult]:
    if not c.f.python_ok:
        return
    patterns = c.k.get("abi_mismatch_patterns", [])
    if "imports" in c.f.errors and not c.f.imports:
        yield CheckResult("packages.imports", "Imports", FAIL, c.f.errors["imports"],
                          remediation="the import check itself failed or timed out on the host")
        return
    for mod, res in c.f.imports.items():
        cid = "packages.flash_attn" if mod == "flash_attn" else f"packages.import_{mod}"
        title = f"import {mod}"
        if res.get("ok"):
            yield CheckResult(cid, title, PASS, f"imports ({res.get('version') or 'no __version__'})")
            continue
        err = res.get("error", "")
        abi = any(re.search(p, err) for p in patterns)
        if mod == "flash_attn" and abi:
            yield CheckResult(cid, title, FAIL, "built against another torch", f"imports with torch {c.installed('torch')}",
                              remediation=f"{c.p.python} -m pip uninstall -y flash-attn && MAX_JOBS=4 {c.p.python} -m pip install "
                                          "flash-attn --no-build-isolation   (rebuilds against the installed torch)",
                              detail=err[:300])
        elif abi:
            yield CheckResult(cid, title, FAIL, "binary extension does not match", "imports",
                              remediation=f"reinstall {mod} for the installed torch/CUDA", detail=err[:300])
        else:
            yield CheckResult(cid, title, FAIL, err.split(":", 1)[0] or "import failed", "imports",
                              remediation=f"{c.p.python} -c 'import {mod}' on the host shows the full error", detail=err[:300])


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
                              (f"{c.p.python} -m pip install torch --index-url "
                               f"{c.k.get('torch_index', '').format(tag=_cuda_tag(c.e.cuda or c.f.cuda_driver) or 'cu128')}"
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
                          remediation=None if ok else f"install torch built for CUDA {c.e.cuda}: "
                                                      f"--index-url {c.k.get('torch_index', '').format(tag=_cuda_tag(c.e.cuda))}")
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
    if not rt_cuda and torch and _local_tag(torch) and _local_tag(torch).startswith("cu"):
        t = _local_tag(torch)[2:]
        rt_cuda = f"{t[:-1]}.{t[-1]}"
    if not rt_cuda or not c.f.driver:
        return
    status, note = _driver_supports(c, rt_cuda)
    row = _driver_row(c, rt_cuda)
    yield CheckResult("cuda.driver_compat", "driver runs torch's CUDA", status, f"CUDA {rt_cuda} on driver {c.f.driver}",
                      f"driver >= {row['minor_compat']}" if row else None, detail=note,
                      remediation=None if status != FAIL else f"upgrade the driver to >= {row['toolkit'] if row else '?'}, "
                                                              f"or install torch built for CUDA {c.f.cuda_driver}")


def check_env_conflicts(c: Context) -> Iterable[CheckResult]:
    sources = [("remote environment", c.f.env), (f"preset '{c.p.env_preset}'", c.preset_env), ("profile env", c.p.env)]
    for conflict in c.presets.get("conflicts", []) or []:
        when = conflict.get("when", {})
        hits = []
        for label, env in sources:
            if all(_env_has(env.get(k), v) for k, v in (when.get("env") or {}).items()):
                hits.append(label)
        pkg_ok = True
        for name, spec in (when.get("package") or {}).items():
            have = c.installed(name)
            expected = c.e.packages.get(name)
            pkg_ok = pkg_ok and (spec_matches(have, spec) if have else bool(expected and spec_matches(expected.lstrip("=<>~ "), spec)))
        if hits and pkg_ok:
            yield CheckResult(f"env.{conflict['id']}", "known conflict", WARN, f"set in {', '.join(hits)}",
                              remediation=conflict.get("remediation"), detail=f"{conflict['message']} (source: {conflict.get('source')})")


def _env_has(value: str | None, want: str) -> bool:
    return value is not None and (value == want or want in value.split(","))


def check_user(c: Context) -> Iterable[CheckResult]:
    for spec in c.pb.get("user_checks") or []:
        name = spec["name"]
        res = c.f.user_checks.get(name)
        sev = FAIL if spec.get("severity", "fail") == "fail" else WARN
        cid = "user." + re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
        if res is None or not res.get("ok"):
            yield CheckResult(cid, name, sev, "did not run", detail=(res or {}).get("error"), remediation=spec.get("remediation"))
            continue
        r = res["value"]
        if r.get("timeout"):
            yield CheckResult(cid, name, sev, "timed out", remediation=spec.get("remediation"))
            continue
        out = (r.get("stdout") or "") + (r.get("stderr") or "")
        problems = []
        if r.get("rc") != spec.get("expect_exit", 0):
            problems.append(f"exit {r.get('rc')} (expected {spec.get('expect_exit', 0)})")
        if "expect_contains" in spec and spec["expect_contains"] not in out:
            problems.append(f"output lacks {spec['expect_contains']!r}")
        if "expect_regex" in spec and not re.search(spec["expect_regex"], out, re.MULTILINE):
            problems.append(f"output does not match /{spec['expect_regex']}/")
        first = next((ln.strip() for ln in out.splitlines() if ln.strip()), "")
        yield CheckResult(cid, name, sev if problems else PASS, first[:80] or f"exit {r.get('rc')}",
                          detail="; ".join(problems) or None, remediation=spec.get("remediation") if problems else None)


REGISTRY = {
    "system.os": check_os, "system.disk": check_disk, "system.memory": check_memory,
    "gpu.nvidia_smi": check_nvidia_smi, "gpu.model": check_gpu_model, "gpu.count": check_gpu_count,
    "gpu.memory": check_gpu_memory, "gpu.health": check_gpu_health, "gpu.driver": check_driver,
    "gpu.cuda": check_cuda_driver, "python.version": check_python, "packages.expected": check_packages,
    "packages.torch_cuda_build": check_torch_cuda_build, "packages.torch_companions": check_torch_companions,
    "packages.flash_attn": check_imports, "cuda.runtime": check_cuda_runtime, "cuda.driver_compat": check_driver_compat,
    "env.conflicts": check_env_conflicts, "user.checks": check_user,
}


def evaluate(facts: Facts, profile, playbook: dict, knowledge: dict, presets: dict | None = None,
             preset_env: dict | None = None) -> list[CheckResult]:
    from .errors import UsageError

    c = Context(facts, profile, playbook, knowledge, presets or {}, preset_env or {})
    results: list[CheckResult] = []
    for cid in playbook.get("checks") or list(REGISTRY):
        fn = REGISTRY.get(cid)
        if fn is None:
            raise UsageError(f"playbook names an unknown check '{cid}'; known: {', '.join(REGISTRY)}")
        results.extend(fn(c))
    return results


def verdict(results: list[CheckResult]) -> str:
    if any(r.status == FAIL for r in results):
        return FAIL
    if any(r.status == WARN for r in results):
        return WARN
    return PASS
