"""(facts, expectations, playbook, knowledge) -> check results. Pure: no I/O, unit-tested on recorded facts.

This module is the registry (a check id -> its function), `evaluate` and `verdict`; the checks are one module per
family: checks_system (os, disk, memory), checks_gpu (nvidia-smi, model, count, memory: the GPU table), checks_cuda
(driver, CUDA, the runtime test), checks_packages (python, packages, torch builds and companions, imports),
checks_health (health fields, kernel log, `health_failures` for a running job), checks_env (env conflicts, the
user's checks); checks_context is the Context every check reads, rules.py the playbook's package rules.
CheckResult, the statuses and the version rules are verify/results.py's (imported here too, as before).
"""
from __future__ import annotations

from typing import Iterable

from . import rules as _rules
from .facts import Facts
from .results import (AREAS, FAIL, INFO, PASS, TORCH_INDEX, WARN, CheckResult, cuda_tag, local_tag,  # noqa: F401
                      major_minor, _parse_version, spec_matches)
from .checks_context import Context
from .checks_cuda import check_cuda_driver, check_cuda_runtime, check_driver, check_driver_compat
from .checks_env import check_env_conflicts, check_user
from .checks_gpu import check_gpu_count, check_gpu_health, check_gpu_memory, check_gpu_model, check_nvidia_smi
from .checks_health import check_health_fields, check_kernel_log
from .checks_packages import check_imports, check_packages, check_python, check_torch_companions, check_torch_cuda_build
from .checks_system import check_disk, check_memory, check_os


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
