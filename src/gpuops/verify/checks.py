"""(facts, expectations, playbook, knowledge) -> check results. Pure: no I/O, unit-tested on recorded facts."""
from __future__ import annotations

import re
from typing import Iterable

from . import rules as _rules
from .facts import Facts
from .results import (AREAS, FAIL, INFO, PASS, TORCH_INDEX, WARN, CheckResult, cuda_tag, local_tag,  # noqa: F401
                      major_minor, _parse_version, spec_matches)

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

    @property
    def pip_install(self) -> str:
        """How to install into the profile's python, runnable there: its pip, or uv's pip for an environment uv made
        without pip (the probe says which it has)."""
        return _installer(self.f, self.p.python, "install")

    @property
    def pip_uninstall(self) -> str:
        return _installer(self.f, self.p.python, "uninstall")


def _installer(facts: Facts, python: str, verb: str) -> str:
    py = facts.python or {}
    if py.get("pip") is False and py.get("uv"):
        return f"uv pip {verb} --python {python}"
    return f"{python} -m pip {verb}" + (" -y" if verb == "uninstall" else "")


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
    if d.get("exists") is False:
        measured = f"{free_gb:.1f} GB free at {d.get('measured_at')} ({where} does not exist yet: `gpuops sync` creates it)"
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
    elif (want is not None and c.f.memory_available_bytes is not None and
          c.f.memory_available_bytes / 2**30 < want * float(c.th.get("memory_available_warn_fraction", 0.8))):
        yield CheckResult("system.memory", "System memory", WARN, measured,
                          f">= {want * float(c.th.get('memory_available_warn_fraction', 0.8)):g} GiB available "
                          f"({c.th.get('memory_available_warn_fraction', 0.8)} of min_memory_gib)",
                          remediation="the RAM is there but in use: `free -h` and `ps aux --sort=-rss | head` on the host "
                                      "show what holds it (an old run, a notebook); stop it before training",
                          detail="seeds/002 records the available memory, not only the total")
    elif (c.f.memory_available_bytes is not None and total and
          100 * c.f.memory_available_bytes / total < float(c.th.get("memory_available_warn_pct", 10))):
        yield CheckResult("system.memory", "System memory", WARN, measured,
                          f">= {c.th.get('memory_available_warn_pct', 10)}% available",
                          remediation="most RAM is in use: `ps aux --sort=-rss | head` on the host; data loaders and "
                                      "vLLM need free RAM", detail="seeds/002 records the available memory, not only the total")
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
    want = expected_gpu(c)
    if want is None:
        have = _host_gpu_rows(c)
        yield CheckResult("gpu.model", "GPU model", INFO, _describe_host(c, have))
        return
    row, itype, text = want
    have = _host_gpu_rows(c)
    if row is not None:
        ok = all(r is not None and r.id == row.id for r in have.values())
    else:  # an expect.gpu that names no row (e.g. 'H100'): a substring of nvidia-smi's name, as before
        ok = all(text.lower() in g.name.lower() for g in c.f.gpus)
    measured = _describe_host(c, have) if row is not None else ", ".join(names)
    expected = _describe_expected(row, itype, c.e.gpu if c.e.gpu else None) if row is not None else f"*{text}*"
    if ok:  # the short form; a mismatch spells out both sides
        short = (f"{row.name} (" + (f"expect.gpu: {c.e.gpu}" if c.e.gpu else str(itype)) + ")") if row is not None else expected
        yield CheckResult("gpu.model", "GPU model", PASS, measured, short)
        return
    host_rows = [r for r in have.values() if r is not None]
    fix = ("this host's GPU is not the one the profile expects: "
           + (f"launch {itype} (it has {row.name})" if row is not None and itype else "launch an instance with the expected GPU")
           + ", or set expect.gpu: " + (f"'{host_rows[0].aliases[0] if host_rows[0].aliases else host_rows[0].name}'"
                                        if host_rows else "to this host's GPU") + " if this host is the one you want")
    yield CheckResult("gpu.model", "GPU model", FAIL, measured, expected, remediation=fix)


def check_gpu_count(c: Context) -> Iterable[CheckResult]:
    want = c.e.gpu_count
    if want is None and c.e.gpu is None:  # instance_type alone says how many GPUs
        hit = _instance_gpu(c)
        want = hit[1] if hit else None
    if not c.gpu_host or want is None:
        return
    n = len(c.f.gpus)
    ok = n == want
    yield CheckResult("gpu.count", "GPU count", PASS if ok else FAIL, str(n),
                      str(want) if c.e.gpu_count is not None else f"{want} ({c.p.instance_type})",
                      remediation=None if ok else "a GPU may be missing (fallen off the bus) or the instance type differs; "
                                                  "check `nvidia-smi -L` and `dmesg | grep -i xid`")


# -- GPU identity (playbooks/gpus.yaml) ------------------------------------------------------------------------
MEMORY_TOLERANCE = 0.97  # nvidia-smi reports a little less than the datasheet size (ECC, reserved memory)


def _instance_gpu(c: Context):
    from . import gpus

    return gpus.for_instance_type(c.p.instance_type) if getattr(c.p, "instance_type", None) else None


def expected_gpu(c: Context):
    """(row or None, instance type that has it or None, the profile's words) or None when nothing is expected.
    expect.gpu wins; with instance_type alone, that type's GPU is expected."""
    from . import gpus

    hit = _instance_gpu(c)
    if c.e.gpu:
        row = gpus.match(c.e.gpu)
        itype = c.p.instance_type if hit and row is not None and hit[0].id == row.id else None
        return row, itype or (_type_for(row, len(c.f.gpus)) if row is not None else None), c.e.gpu
    if hit:
        return hit[0], c.p.instance_type, c.p.instance_type
    return None


def _type_for(row, n: int) -> str | None:
    """The Lambda instance type with this GPU and this many of them (else its first type)."""
    for t in row.lambda_instance_types:
        if t.lower().startswith(f"gpu_{n}x_"):
            return t
    return row.lambda_instance_types[0] if row.lambda_instance_types else None


def _host_gpu_rows(c: Context) -> dict:
    from . import gpus

    return {g.name: gpus.match(g.name) for g in c.f.gpus}


def _describe_host(c: Context, have: dict) -> str:
    from .gpus import describe

    parts = []
    for name, row in have.items():
        count = sum(1 for g in c.f.gpus if g.name == name)
        text = describe(row, name)
        parts.append(f"{count}x {text}" if len(have) > 1 else text)
    return ", ".join(parts)


def _describe_expected(row, itype: str | None, words: str | None) -> str:
    from .gpus import describe

    text = describe(row, None, itype)
    return f"{text} (expect.gpu: {words})" if words else text


def check_gpu_memory(c: Context) -> Iterable[CheckResult]:
    if not c.gpu_host:
        return
    mems = [g.memory_total_mib for g in c.f.gpus if g.memory_total_mib is not None]
    if not mems:
        yield CheckResult("gpu.memory", "GPU memory", WARN, "not reported ([N/A])")
        return
    low = min(mems)
    want = c.e.gpu_memory_mib
    if want is None and c.e.gpu is None and _instance_gpu(c) and _instance_gpu(c)[0].memory_mib:
        want = int(_instance_gpu(c)[0].memory_mib * MEMORY_TOLERANCE)  # the instance type's GPU, a little slack
    measured = f"{low:,.0f} MiB per GPU" if len(set(mems)) == 1 else f"{low:,.0f}–{max(mems):,.0f} MiB"
    if want is not None and low < want:
        yield CheckResult("gpu.memory", "GPU memory", FAIL, measured, f">= {want:,} MiB",
                          remediation="a smaller-memory GPU than the profile expects (e.g. 40 GB A100 vs 80 GB)")
    else:
        yield CheckResult("gpu.memory", "GPU memory", PASS if want is not None else INFO, measured,
                          f">= {want:,} MiB" if want is not None else None)
    busy_pct = float(c.th.get("gpu_memory_busy_warn_pct", 10))
    seen = _job_gpus(c)
    busy = [g for g in c.f.gpus if g.memory_used_mib and g.memory_total_mib and (seen is None or g.index in seen)
            and 100 * g.memory_used_mib / g.memory_total_mib >= busy_pct]
    if busy:
        yield CheckResult("gpu.busy", "GPU memory in use", WARN,
                          ", ".join(f"GPU {g.index}: {g.memory_used_mib:,.0f} MiB used" for g in busy),
                          f"< {busy_pct:g}% before training",
                          remediation="another process holds GPU memory (a previous run, a notebook): "
                                      "`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv`, then stop it")


def _job_gpus(c: Context) -> set[int] | None:
    """nvidia-smi indexes of the GPUs the job will see: CUDA_VISIBLE_DEVICES as the launch sets it (profile env over
    preset over the host's environment; indexes or GPU UUIDs); None = all."""
    value = next((env["CUDA_VISIBLE_DEVICES"] for env in (c.p.env, c.preset_env, c.f.env)
                  if env.get("CUDA_VISIBLE_DEVICES") is not None), None)
    return visible_gpus(value, c.f.gpus)


def visible_gpus(value: str | None, gpus) -> set[int] | None:
    """nvidia-smi indexes of the GPUs a CUDA_VISIBLE_DEVICES value names (indexes or GPU UUID prefixes); None (the
    variable not set) = all."""
    if value is None:
        return None
    seen: set[int] = set()
    for item in (v.strip() for v in str(value).split(",") if v.strip()):
        if item.isdigit():
            seen.add(int(item))
        else:
            seen.update(g.index for g in gpus if g.uuid and g.uuid.startswith(item))
    return seen


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
                              remediation=_install_fix(c, name, pin) or
                              f"{c.pip_install} {pin}" + _index_hint(c, name, spec))
            continue
        ok = spec_matches(have, spec)
        if ok is None:
            yield CheckResult(cid, name, FAIL, have, spec, remediation=f"{spec!r} is not a version specifier")
        else:
            yield CheckResult(cid, name, PASS if ok else FAIL, have, spec,
                              remediation=None if ok else f"{c.pip_install} '{name}{'==' + spec if spec[0].isdigit() else spec}'"
                                                          + _index_hint(c, name, spec))


def _install_fix(c: Context, name: str, pin: str) -> str | None:
    """Runnable install lines the runbooks learned the hard way (playbooks/rules.yaml): flash-attn builds throttled
    without build isolation (or SDPA instead); vllm pins torch so pip does not replace it."""
    rules = c.k.get("rules") or {}
    torch = (c.installed("torch") or "").split("+", 1)[0]
    if name == "flash-attn" and rules.get("flash_attn_fix"):
        caps = sorted({g.compute_cap for g in c.f.gpus if g.compute_cap})
        arch = f"TORCH_CUDA_ARCH_LIST='{caps[0]}' " if len(caps) == 1 and not c.p.env.get("TORCH_CUDA_ARCH_LIST") else ""
        fix = rules["flash_attn_fix"].format(python=c.p.python, pip_install=c.pip_install, arch=arch)
        return fix.replace("install flash-attn", f"install {pin}", 1)
    if name == "vllm" and rules.get("vllm_install_fix") and torch:
        return rules["vllm_install_fix"].format(python=c.p.python, pip_install=c.pip_install, torch=torch).replace("install vllm", f"install {pin}", 1)
    return None


def _index_hint(c: Context, name: str, spec: str) -> str:
    if name not in ("torch", "torchvision", "torchaudio"):
        return ""
    tag = local_tag(spec) or cuda_tag(c.e.cuda) or cuda_tag(c.f.cuda_driver)
    return f" --index-url {c.k.get('torch_index', TORCH_INDEX).format(tag=tag)}" if tag else ""


def check_torch_cuda_build(c: Context) -> Iterable[CheckResult]:
    torch = c.installed("torch")
    if not torch or not c.gpu_host:
        return
    rt = c.f.cuda_runtime or {}
    cpu_only = local_tag(torch) == "cpu" or (rt.get("imported") and rt.get("cuda") is None)
    if cpu_only:
        tag = cuda_tag(c.e.cuda) or cuda_tag(c.f.cuda_driver) or "cu128"
        base = torch.split("+", 1)[0]
        index = c.k.get("torch_index", TORCH_INDEX).format(tag=tag)
        rules = c.k.get("rules") or {}
        if (c.f.os or {}).get("arch") == "aarch64" and rules.get("aarch64_torch_fix"):
            yield CheckResult("packages.torch_cuda_build", "torch CUDA build", FAIL, f"torch {torch} is a CPU-only build",
                              "the image's CUDA torch (aarch64)", remediation=rules["aarch64_torch_fix"],
                              detail="aarch64 (GH200): the PyTorch index has no CUDA wheel for every release, the "
                                     f"image's system torch is one (source: {rules.get('aarch64_torch_source')})")
            return
        yield CheckResult("packages.torch_cuda_build", "torch CUDA build", FAIL, f"torch {torch} is a CPU-only build",
                          f"a CUDA build ({tag})",
                          remediation=f"{c.pip_install} --force-reinstall torch=={base} --index-url {index} "
                                      "(and torchvision/torchaudio from the same index)")
    else:
        yield CheckResult("packages.torch_cuda_build", "torch CUDA build", PASS,
                          f"torch {torch} (CUDA {rt.get('cuda') or local_tag(torch) or '?'})")


def check_torch_companions(c: Context) -> Iterable[CheckResult]:
    torch = c.installed("torch")
    if not torch:
        return
    tmm = major_minor(torch)
    row = next((r for r in c.k.get("torch_companions", []) if str(r["torch"]) == tmm), None)
    for comp in ("torchvision", "torchaudio"):
        have = c.installed(comp)
        if not have:
            continue
        cid = f"packages.{comp}_match"
        problems = []
        if row and major_minor(have) != str(row[comp]):
            owner = next((str(r["torch"]) for r in c.k.get("torch_companions", []) if str(r[comp]) == major_minor(have)), None)
            problems.append(f"{comp} {have} belongs to torch {owner or '?'}, torch {torch} needs {comp} {row[comp]}.x")
        lt, lc = local_tag(torch), local_tag(have)
        if lt and lc and lt != lc:
            problems.append(f"built for {lc}, torch for {lt}")
        if problems:
            want = f"{row[comp]}.*" if row else "the release matching torch"
            tag = lt or cuda_tag(c.e.cuda)
            index = f" --index-url {c.k.get('torch_index').format(tag=tag)}" if tag and c.k.get("torch_index") else ""
            yield CheckResult(cid, f"{comp} matches torch", FAIL, have, f"{comp} {want} for torch {tmm}",
                              remediation=f"{c.pip_install} '{comp}=={want}'{index}", detail="; ".join(problems))
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
                              remediation=f"{c.pip_uninstall} flash-attn && MAX_JOBS=4 {c.pip_install} "
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
        if "{pip_install}" in (spec.get("remediation") or ""):
            spec = dict(spec, remediation=spec["remediation"].replace("{pip_install}", c.pip_install))
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


# -- GPU health (issue #15): passive signals from one nvidia-smi query and the kernel log ----------------------
# Every rule and its source is listed in docs/verify.md. FAIL: the GPU needs a reset or the instance a replacement;
# WARN: it will run, slower or differently; INFO: context. An unknown value is never a warning.
SLOWDOWNS = {"clocks_event_reasons.hw_slowdown": "hardware slowdown",
             "clocks_event_reasons.hw_thermal_slowdown": "hardware thermal slowdown",
             "clocks_event_reasons.sw_thermal_slowdown": "software thermal slowdown",
             "clocks_event_reasons.hw_power_brake_slowdown": "power brake"}


def _reset_fix(c: Context, idx: list) -> str:
    iid = getattr(c.p, "instance_id", None)
    gpus_ = ",".join(str(i) for i in idx) or "0"
    return (f"reset the GPU if you own the host (`sudo nvidia-smi -r -i {gpus_}` with no process on it, else reboot); "
            f"on a rented instance terminate it{' (' + iid + ')' if iid else ''} and launch a new one")


def _with(c: Context, pred) -> list[int]:
    return [h.index for h in c.f.health or [] if pred(h)]


def _known(c: Context, field: str) -> bool:
    return any(h.values.get(field) is not None for h in c.f.health or [])


def _gpus(idx: list[int]) -> str:
    return ("GPU " if len(idx) == 1 else "GPUs ") + ", ".join(str(i) for i in idx)


def check_health_fields(c: Context) -> Iterable[CheckResult]:
    if not c.gpu_host:
        return
    if c.f.health is None:
        if "gpu_health" in c.f.errors:
            yield CheckResult("gpu.health_fields", "GPU health fields", INFO, "not read",
                              detail=c.f.errors["gpu_health"])
        return
    if c.f.health_unsupported:
        yield CheckResult("gpu.health_fields", "GPU health fields", INFO,
                          "not supported by this driver: " + ", ".join(c.f.health_unsupported),
                          detail="older drivers do not know these fields; the rules that need them are skipped")
    yield from _ecc(c)
    yield from _memory_repair(c)
    yield from _recovery(c)
    yield from _clocks(c)
    yield from _pcie(c)
    yield from _mig(c)
    yield from _persistence(c)
    yield from _power(c)


def _ecc(c: Context) -> Iterable[CheckResult]:
    f = "ecc.errors.uncorrected.volatile.total"
    corr = [(h.index, h.get("ecc.errors.corrected.volatile.total")) for h in c.f.health]
    corr_text = ", ".join(f"GPU {i}: {n}" for i, n in corr if isinstance(n, int) and n > 0)
    bad = _with(c, lambda h: isinstance(h.get(f), int) and h.get(f) > 0)
    if bad:
        counts = ", ".join(f"GPU {h.index}: {h.get(f)}" for h in c.f.health if h.index in bad)
        yield CheckResult("gpu.ecc", "ECC errors", FAIL, f"uncorrectable since boot: {counts}", "0 uncorrectable",
                          remediation=_reset_fix(c, bad), detail=f"{f} (correctable: {corr_text or '0'})")
    elif _known(c, f):
        yield CheckResult("gpu.ecc", "ECC errors", PASS if not corr_text else INFO,
                          "0 uncorrectable" + (f"; correctable: {corr_text}" if corr_text else ""), "0 uncorrectable")
    else:
        yield CheckResult("gpu.ecc", "ECC errors", INFO, "not reported (ECC off or not supported)")


def _memory_repair(c: Context) -> Iterable[CheckResult]:
    pend = _with(c, lambda h: h.get("remapped_rows.pending") is True)
    failed = _with(c, lambda h: h.get("remapped_rows.failure") is True)
    if pend or failed:
        what = ([f"row remapping pending on {_gpus(pend)}"] if pend else []) + \
               ([f"row remapping failed on {_gpus(failed)}"] if failed else [])
        yield CheckResult("gpu.row_remap", "Memory row remapping", FAIL, "; ".join(what), "none pending, no failure",
                          remediation=_reset_fix(c, sorted(set(pend + failed))) if pend and not failed else
                          "a failed remapping cannot be repaired by a reset: terminate the instance and launch a new one"
                          + (f" ({c.p.instance_id})" if getattr(c.p, "instance_id", None) else ""),
                          detail="remapped_rows.pending / remapped_rows.failure")
    elif _known(c, "remapped_rows.pending"):
        yield CheckResult("gpu.row_remap", "Memory row remapping", PASS, "none pending, no failure")
    retired = _with(c, lambda h: h.get("retired_pages.pending") is True)
    if retired:
        yield CheckResult("gpu.retired_pages", "Retired memory pages", FAIL, f"page retirement pending on {_gpus(retired)}",
                          "none pending", remediation=_reset_fix(c, retired), detail="retired_pages.pending")


def _recovery(c: Context) -> Iterable[CheckResult]:
    f = "gpu_recovery_action"
    bad = [(h.index, h.get(f)) for h in c.f.health if h.get(f) not in (None, "None")]
    if bad:
        yield CheckResult("gpu.recovery", "GPU recovery action", FAIL,
                          ", ".join(f"GPU {i}: {a}" for i, a in bad), "None",
                          remediation=f"the driver asks for '{bad[0][1]}': " + _reset_fix(c, [i for i, _ in bad]),
                          detail=f + " (driver R550+)")
    elif _known(c, f):
        yield CheckResult("gpu.recovery", "GPU recovery action", PASS, "None")


def _clocks(c: Context) -> Iterable[CheckResult]:
    slow = []
    for h in c.f.health:
        active = [label for field, label in SLOWDOWNS.items() if h.get(field) is True]
        if active:
            slow.append(f"GPU {h.index}: {', '.join(active)}")
    capped = _with(c, lambda h: h.get("clocks_event_reasons.sw_power_cap") is True)
    if slow:
        yield CheckResult("gpu.clocks", "Clock slowdown", WARN, "; ".join(slow), "no slowdown",
                          remediation="the GPU is throttled by heat or its power supply: check the temperature and the "
                                      "load (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE`); if it persists at idle, "
                                      "replace the instance",
                          detail="clocks_event_reasons.*" + (f"; power cap also active on {_gpus(capped)}" if capped else ""))
    elif any(_known(c, f) for f in SLOWDOWNS):
        yield CheckResult("gpu.clocks", "Clock slowdown", PASS,
                          "none" + (f" (at its power cap: {_gpus(capped)})" if capped else ""), "no slowdown")


def _pcie(c: Context) -> Iterable[CheckResult]:
    narrow, info = [], []
    for h in c.f.health:
        w, wmax = h.get("pcie.link.width.current"), h.get("pcie.link.width.max")
        g, gmax = h.get("pcie.link.gen.gpucurrent"), h.get("pcie.link.gen.max")
        if isinstance(w, int) and isinstance(wmax, int) and w < wmax:
            narrow.append(f"GPU {h.index}: x{w} of x{wmax}")
        if isinstance(g, int) and isinstance(w, int):
            info.append(f"GPU {h.index}: Gen{g} x{w}" + (f" (max Gen{gmax} x{wmax})" if (g, w) != (gmax, wmax) else ""))
    if narrow:
        yield CheckResult("gpu.pcie", "PCIe link", WARN, "; ".join(narrow), "full width",
                          remediation="the link trained narrower than the slot: host-device copies run at a fraction of "
                                      "their speed; reseat/replace (own host) or launch another instance",
                          detail="pcie.link.width.current < pcie.link.width.max")
    elif info:
        same = len(set(x.split(": ", 1)[1] for x in info)) == 1
        yield CheckResult("gpu.pcie", "PCIe link", INFO, info[0].split(": ", 1)[1] + " (every GPU)" if same and len(info) > 1
                          else info[0].split(": ", 1)[1] if same else "; ".join(info),
                          detail="an idle GPU lowers its link generation to save power; that alone is not a fault")


def _mig(c: Context) -> Iterable[CheckResult]:
    want = getattr(c.e, "mig", None)
    on = _with(c, lambda h: h.get("mig.mode.current") is True)
    off = _with(c, lambda h: h.get("mig.mode.current") is False)
    if on and want is not True:
        yield CheckResult("gpu.mig", "MIG mode", WARN, f"enabled on {_gpus(on)}", "disabled (expect.mig not set)",
                          remediation="CUDA sees MIG slices, not whole GPUs: `sudo nvidia-smi -i N -mig 0` and reset the "
                                      "GPU, or set expect.mig: true if slices are intended")
    elif off and want is True:
        yield CheckResult("gpu.mig", "MIG mode", WARN, f"disabled on {_gpus(off)}", "enabled (expect.mig: true)",
                          remediation="`sudo nvidia-smi -i N -mig 1`, reset the GPU and create the instances")


def _persistence(c: Context) -> Iterable[CheckResult]:
    off = _with(c, lambda h: h.get("persistence_mode") is False)
    if off:
        yield CheckResult("gpu.persistence", "Persistence mode", WARN, f"off on {_gpus(off)}", "on",
                          remediation="each CUDA start re-initialises the GPU (seconds), and settings reset when idle: "
                                      "`sudo systemctl enable --now nvidia-persistenced` (or `sudo nvidia-smi -pm 1`)")
    elif _known(c, "persistence_mode"):
        yield CheckResult("gpu.persistence", "Persistence mode", PASS, "on")


def _power(c: Context) -> Iterable[CheckResult]:
    limits = {h.index: h.get("power.limit") for h in c.f.health if isinstance(h.get("power.limit"), (int, float))}
    if not limits:
        return
    rows = _host_gpu_rows(c)
    row = next(iter(rows.values()), None) if len(rows) == 1 else None
    low = min(limits.values())
    text = f"{low:.0f} W" if len(set(limits.values())) == 1 else f"{low:.0f}–{max(limits.values()):.0f} W"
    ref = row.power_limit_w if row is not None else None
    note = f" (default {ref:.0f} W)" if ref else ""
    if ref and low < 0.9 * ref:
        note = f" — below this GPU's default {ref:.0f} W: expect lower speed"
    yield CheckResult("gpu.power", "Power limit", INFO, text + note)


def _xid_table(c: Context) -> dict:
    table = c.k.get("xid_table")
    if table is None:
        from ..knowledge import load_playbook

        table = load_playbook("xid")
    return {int(k): v for k, v in (table.get("xids") or {}).items()}


def _index_of_pci(c: Context, pci: str) -> int | None:
    key = pci.lower().split(":")[-2:]  # bus:device; the domain is printed with 4 or 8 digits
    for g in c.f.gpus:
        if g.bus_id and g.bus_id.lower().rsplit(".", 1)[0].split(":")[-2:] == key:
            return g.index
    return None


def _gpu_of_pci(c: Context, pci: str) -> str:
    i = _index_of_pci(c, pci)
    return f"GPU {i}" if i is not None else f"PCI {pci}"


def check_kernel_log(c: Context) -> Iterable[CheckResult]:
    k = c.f.kernel_log
    if k is None:
        if "kernel_log" in c.f.errors:
            yield CheckResult("gpu.xid", "Xid errors (kernel log)", INFO, "not read", detail=c.f.errors["kernel_log"])
        return
    if not k.get("readable"):
        yield CheckResult("gpu.xid", "Xid errors (kernel log)", INFO, "kernel log not readable by this user",
                          detail=(k.get("error") or "") + "; `sudo dmesg | grep -i xid` shows them")
        return
    if not c.f.xids:
        yield CheckResult("gpu.xid", "Xid errors (kernel log)", PASS, f"none since boot ({k.get('source')})")
        return
    table = _xid_table(c)
    rank = {FAIL: 3, WARN: 2, INFO: 1}
    worst, lines, failed = INFO, [], []
    for x in c.f.xids:
        row = table.get(x["code"])
        sev = {"fail": FAIL, "warn": WARN, "info": INFO}.get((row or {}).get("severity"), WARN)
        worst = sev if rank[sev] > rank[worst] else worst
        if sev == FAIL:  # the GPUs the reset must name (not GPU 0 whichever failed): its index, else its bus id
            i = _index_of_pci(c, x["pci"])
            gid = str(i) if i is not None else x["pci"] + ".0"  # nvidia-smi -i takes a PCI bus id too
            failed += [gid] if gid not in failed else []
        meaning = row["meaning"] if row else "not in playbooks/xid.yaml: look it up in NVIDIA's Xid catalog"
        lines.append(f"Xid {x['code']} on {_gpu_of_pci(c, x['pci'])}: {meaning}")
    uniq = list(dict.fromkeys(lines))
    codes = ", ".join(dict.fromkeys(str(x["code"]) for x in c.f.xids))
    fix = {FAIL: _reset_fix(c, failed) + " (a hardware Xid)",
           WARN: "watch for it again (`sudo dmesg | grep -i xid`); a recurring one means replace the instance",
           INFO: None}[worst]
    yield CheckResult("gpu.xid", "Xid errors (kernel log)", worst, f"Xid {codes} since boot ({len(c.f.xids)} line(s))",
                      "no hardware Xid", remediation=fix, detail="; ".join(uniq)[:600])


def check_bench(c: Context) -> Iterable[CheckResult]:
    if c.f.bench is None:
        return
    from .bench import judge

    yield from judge(c.f.bench, c.f, c.th)


REGISTRY = {
    "system.os": check_os, "system.disk": check_disk, "system.memory": check_memory,
    "gpu.nvidia_smi": check_nvidia_smi, "gpu.model": check_gpu_model, "gpu.count": check_gpu_count,
    "gpu.memory": check_gpu_memory, "gpu.health": check_gpu_health, "gpu.driver": check_driver,
    "gpu.cuda": check_cuda_driver, "python.version": check_python, "packages.expected": check_packages,
    "packages.torch_cuda_build": check_torch_cuda_build, "packages.torch_companions": check_torch_companions,
    "packages.flash_attn": check_imports, "cuda.runtime": check_cuda_runtime, "cuda.driver_compat": check_driver_compat,
    "env.conflicts": check_env_conflicts, "packages.rules": _rules.check_package_rules, "cuda.arch": _rules.check_arch, "user.checks": check_user,
    "gpu.health_fields": check_health_fields, "gpu.kernel_log": check_kernel_log, "gpu.bench": check_bench,
}


def evaluate(facts: Facts, profile, playbook: dict, knowledge: dict, presets: dict | None = None,
             preset_env: dict | None = None) -> list[CheckResult]:
    from ..errors import UsageError

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


def health_failures(health: list | None, xids: list[dict], *, xid_table: dict | None = None,
                    instance_id: str | None = None) -> list[CheckResult]:
    """A running job's GPU health (the health fields and the kernel log's Xid lines its watch samples), judged by the
    rules above: the FAIL results, each a fact that ends the GPU's usefulness (uncorrectable ECC errors, a row
    remapping pending or failed, retired pages pending, a recovery action asked by the driver, a hardware Xid).
    xid_table: playbooks/xid.yaml already loaded (else it is read here)."""
    from types import SimpleNamespace

    f = Facts(health=list(health or []), xids=list(xids), kernel_log={"readable": True, "source": "watch"})
    c = Context(f, SimpleNamespace(expect=None, instance_id=instance_id), {},
                {"xid_table": xid_table} if xid_table is not None else {}, {}, {})
    found = [*_ecc(c), *_memory_repair(c), *_recovery(c)] if f.health else []
    if f.xids:
        found += list(check_kernel_log(c))
    return [r for r in found if r.status == FAIL]
