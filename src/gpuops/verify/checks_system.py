"""The system checks (pure): the OS, the disk, the memory."""
from __future__ import annotations

from typing import Iterable

from .checks_context import Context
from .results import CheckResult, FAIL, INFO, PASS, WARN


def _gib(n: int | None) -> str:
    return f"{n / 2**30:.1f} GiB" if n is not None else "unknown"


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
