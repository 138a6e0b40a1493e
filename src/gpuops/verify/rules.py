"""Operator knowledge as rules (playbooks/rules.yaml), judged on probe facts. Pure: no I/O.

- package rules: installed-package combinations known to break (Megatron-core with numpy 2, ...);
- the torch build vs the GPU's compute capability (a torch without kernels for a Blackwell GPU is a torch-build
  problem, not a hardware fault), and extension builds that need TORCH_CUDA_ARCH_LIST;
- opt-in checks a profile turns on by name (`checks: [vllm, apex]`), run on the host like user_checks.
The rules document reaches the checks as knowledge["rules"] (verify loads it beside knowledge.yaml)."""
from __future__ import annotations

import re
from typing import Iterable

from ..errors import UsageError


def rule_packages(rules: dict) -> list[str]:
    """Package names the rules need measured on the host (added to the probe's package list)."""
    names: set[str] = set()
    for r in rules.get("package_rules") or []:
        names.update((r.get("when") or {}).keys())
        names.update(r.get("also_installed") or [])
    names.update((rules.get("arch_list_extensions") or {}).get("packages") or [])
    return sorted(names)


def optional_user_checks(rules: dict, names: list[str], python: str, torch: str | None = None) -> list[dict]:
    """The opt-in checks a profile names, as user_checks entries ({python} and {torch} filled in). Unknown names are
    a profile error (exit 2)."""
    from ..remote.shell import shell_command

    table = rules.get("optional_checks") or {}
    out = []
    for name in names:
        spec = table.get(name)
        if spec is None:
            raise UsageError(f"profile checks: unknown check '{name}'; known: {', '.join(sorted(table)) or 'none'} "
                             "(playbooks/rules.yaml optional_checks)")
        fill = {"python": shell_command(python), "torch": torch or "<the installed torch version>"}
        entry = {k: (v.format(**fill) if isinstance(v, str) and k == "command" else v) for k, v in spec.items()}
        if isinstance(entry.get("remediation"), str):
            # {pip_install} stays until the facts say whether the python has pip (checks.check_user fills it)
            entry["remediation"] = entry["remediation"].format(**{**fill, "python": python,
                                                                  "pip_install": "{pip_install}"})
        entry["name"] = f"{name} (opt-in)"
        if entry.get("source"):
            entry["remediation"] = f"{entry.get('remediation', '')}   [source: {entry['source']}]".strip()
        out.append(entry)
    return out


def _cap_tuple(cap: str | None):
    m = re.match(r"(\d+)\.(\d+)", cap or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def torch_runs_on(arch_list: list[str], cap: str) -> bool | None:
    """Whether a torch built for `arch_list` (torch.cuda.get_arch_list(): sm_90, compute_90, ...) has kernels for
    compute capability `cap`: its own sm_XY, an sm of the same major at or below it (binary compatible within a
    major), or PTX (compute_XY) at or below it to JIT. None when unknown."""
    c = _cap_tuple(cap)
    if not arch_list or c is None:
        return None
    for a in arch_list:
        m = re.match(r"(sm|compute)_(\d+)(\d)[a-z]?$", a)
        if not m:
            continue
        major, minor = int(m.group(2)), int(m.group(3))
        if m.group(1) == "sm" and major == c[0] and minor <= c[1]:
            return True
        if m.group(1) == "compute" and (major, minor) <= c:
            return True
    return False


def no_kernel_image(rt: dict) -> bool:
    return any("no kernel image is available" in (d.get("error") or "") for d in rt.get("devices") or []) or \
        "no kernel image is available" in (rt.get("init_error") or "")


def arch_problem(c) -> dict | None:
    """{capability, arch_list, gpu} when torch lacks kernels for a GPU the job sees; None otherwise."""
    rt = c.f.cuda_runtime or {}
    arch = rt.get("arch_list") or []
    for d in rt.get("devices") or []:
        cap = d.get("capability")
        if cap and torch_runs_on(arch, cap) is False:
            return {"capability": cap, "arch_list": arch, "gpu": d.get("name") or f"cuda:{d.get('index')}"}
    if no_kernel_image(rt):
        cap = next((g.compute_cap for g in c.f.gpus if g.compute_cap), None)
        return {"capability": cap or "?", "arch_list": arch, "gpu": c.f.gpus[0].name if c.f.gpus else "the GPU"}
    return None


def check_package_rules(c) -> Iterable:
    from .results import FAIL, WARN, CheckResult, spec_matches

    rules = c.k.get("rules") or {}
    for r in rules.get("package_rules") or []:
        when = r.get("when") or {}
        have = {name: c.installed(name) for name in when}
        if not all(v and spec_matches(v, str(spec)) for (name, spec), v in zip(when.items(), have.values())):
            continue
        if r.get("also_installed") and not any(c.installed(n) for n in r["also_installed"]):
            continue
        status = FAIL if r.get("status", "fail") == "fail" else WARN
        yield CheckResult(f"packages.{r['id']}", r.get("title", r["id"]), status,
                          " with ".join(f"{n} {v}" for n, v in have.items()), None,
                          remediation=str(r.get("fix", "")).format(python=c.p.python, pip_install=c.pip_install) or None,
                          detail=f"{r.get('message', '')} (source: {r.get('source', '?')})")


def check_arch(c) -> Iterable:
    """torch's kernels vs the GPU's compute capability, and extension builds without TORCH_CUDA_ARCH_LIST."""
    from .results import FAIL, PASS, WARN, CheckResult

    rules = c.k.get("rules") or {}
    rt = c.f.cuda_runtime or {}
    prob = arch_problem(c) if rt.get("imported") else None
    if prob:
        torch = c.installed("torch") or rt.get("version") or "?"
        base = torch.split("+", 1)[0]
        v = _cap_tuple(base)
        pin = f"torch=={base}" if v and v >= (2, 7) else "'torch>=2.7'"
        index = c.k.get("torch_index", "https://download.pytorch.org/whl/{tag}").format(tag="cu128")
        yield CheckResult("cuda.arch", "torch has kernels for the GPU", FAIL,
                          f"torch {torch} built for {' '.join(prob['arch_list']) or '?'}",
                          f"sm_{prob['capability'].replace('.', '')} ({prob['gpu']})",
                          remediation=f"{c.pip_install} --force-reinstall {pin} "
                                      f"--index-url {index}   (a torch build problem, not a GPU fault: Blackwell "
                                      "needs a CUDA 12.8+ build, torch >= 2.7)",
                          detail="`no kernel image is available for execution on the device` comes from this "
                                 "(source: seeds/003, RTX PRO 6000 Blackwell compute capability 12.0 runs torch 2.9 cu128)")
    elif rt.get("arch_list") and rt.get("devices"):
        caps = sorted({d.get("capability") for d in rt["devices"] if d.get("capability")})
        yield CheckResult("cuda.arch", "torch has kernels for the GPU", PASS,
                          f"sm_{', sm_'.join(cap.replace('.', '') for cap in caps)} in {' '.join(rt['arch_list'])}")
    ext = rules.get("arch_list_extensions") or {}
    if not ext or not c.gpu_host:
        return
    floor = _cap_tuple(str(ext.get("min_capability", "10.0")))
    caps = [g.compute_cap for g in c.f.gpus if _cap_tuple(g.compute_cap) and _cap_tuple(g.compute_cap) >= floor]
    builds = [p for p in ext.get("packages") or [] if c.installed(p) or p in c.e.packages]
    if not caps or not builds:
        return
    sources = [c.f.env, c.preset_env, c.p.env]
    if any(env.get("TORCH_CUDA_ARCH_LIST") for env in sources):
        return
    cap = caps[0]
    preset = {"10": "blackwell-b200", "12": "blackwell-rtxpro"}.get(cap.split(".")[0])
    yield CheckResult("env.torch_cuda_arch_list", "TORCH_CUDA_ARCH_LIST for extension builds", WARN, "unset",
                      f"{cap}+PTX for {', '.join(builds)} on sm_{cap.replace('.', '')}",
                      remediation=(f"set env_preset: {preset} in the profile" if preset else
                                   f"add TORCH_CUDA_ARCH_LIST: \"{cap}+PTX\" to the profile's env:")
                      + f" (or env: {{TORCH_CUDA_ARCH_LIST: \"{cap}+PTX\"}})",
                      detail=f"building or JIT-compiling {', '.join(builds)} without it crashes or builds for the "
                             f"wrong arch (source: {ext.get('source', '?')})")
