"""The Python and package checks (pure): the python version, expected packages and their fixes (the install line for
this host, the index a torch build comes from), torch's CUDA build, its companions (torchvision, torchaudio), the
imports a profile expects (flash_attn)."""
from __future__ import annotations

import re
from typing import Iterable

from .checks_context import Context
from .results import CheckResult, FAIL, INFO, PASS, TORCH_INDEX, cuda_tag, local_tag, major_minor, spec_matches


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
