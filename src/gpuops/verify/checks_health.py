"""GPU health (issue #15, pure): passive signals from one nvidia-smi query (ECC, row remapping, retired pages, the
driver's recovery action, clocks slowed down, PCIe link, MIG, persistence, power) and the kernel log's Xid lines
(playbooks/xid.yaml); `health_failures` judges a running job's GPUs with the same rules."""
from __future__ import annotations

from typing import Iterable

from .checks_context import Context
from .checks_gpu import _host_gpu_rows
from .facts import Facts
from .results import CheckResult, FAIL, INFO, PASS, WARN


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
