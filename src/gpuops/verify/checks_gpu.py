"""The GPU checks (pure): nvidia-smi answers, the model, count and memory the profile expects (playbooks/gpus.yaml:
an instance type's GPUs), the GPUs a job sees (CUDA_VISIBLE_DEVICES), nvidia-smi's own health line."""
from __future__ import annotations

from typing import Iterable

from .checks_context import Context
from .results import CheckResult, FAIL, INFO, PASS, WARN


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
