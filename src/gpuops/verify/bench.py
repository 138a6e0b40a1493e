"""`verify --bench` judgement: measured speeds vs the GPU's reference in playbooks/gpus.yaml. Pure.

The remote part (remote/probe.py BENCH_CHECK) measures per GPU a bf16 matmul (TFLOP/s) and a device-to-device copy
(TB/s, read + write), samples nvidia-smi half-way through the matmul, and on several GPUs all-reduces across them.
Below `bench_warn_fraction` (0.8) of the reference is a WARN naming what nvidia-smi showed at that moment. The
references are what a healthy GPU sustains in this same loop and size (issue #23), so a healthy GPU reads ~100 %.
"""
from __future__ import annotations

from typing import Iterable

from .results import FAIL, INFO, PASS, WARN, CheckResult
from .facts import Facts, parse_health

POWER_CAP = "power cap reached"
REASONS = {"clocks_event_reasons.hw_slowdown": "hardware slowdown",
           "clocks_event_reasons.hw_thermal_slowdown": "hardware thermal slowdown",
           "clocks_event_reasons.sw_thermal_slowdown": "software thermal slowdown",
           "clocks_event_reasons.hw_power_brake_slowdown": "power brake",
           "clocks_event_reasons.sw_power_cap": POWER_CAP}
# clocks_event_reasons.active bits (nvml.h NVML_CLOCKS_EVENT_REASON_*), used when the single fields are unknown
REASON_BITS = {0x4: POWER_CAP, 0x8: "hardware slowdown", 0x20: "software thermal slowdown",
               0x40: "hardware thermal slowdown", 0x80: "power brake"}


def sample_by_gpu(sample: dict | None) -> tuple[dict, dict]:
    """({gpu index: GpuHealth}, {bus id: [(pid, MiB)]}) from the nvidia-smi sample taken during the matmul."""
    if not sample or not sample.get("gpus"):
        return {}, {}
    rows = {h.index: h for h in parse_health(sample["gpus"], sample.get("fields") or [])}
    apps: dict = {}
    for line in (sample.get("apps") or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            apps.setdefault(parts[1].lower(), []).append((int(parts[0]), parts[2] if len(parts) > 2 else "?"))
    return rows, apps


def likely_causes(h, apps_on_gpu: list, own_pids: set, row, thresholds: dict) -> list[str]:
    """What nvidia-smi showed during the matmul that explains a slow GPU (an empty list when nothing does).
    The power cap is not a cause at the GPU's default power limit: an H100 or H200 at full load holds its SM clock
    at 1350-1500 of 1980 MHz there, every time (the references in gpus.yaml are measured so); a lowered limit is."""
    if h is None:
        return []
    causes = _reasons(h)
    capped = POWER_CAP in causes
    causes = [c for c in causes if c != POWER_CAP]
    lowered = _lowered_limit(h, row)
    if lowered:
        causes.append((f"{POWER_CAP} at " if capped else "") + lowered)
    temp = h.get("temperature.gpu")
    if isinstance(temp, (int, float)) and temp >= float(thresholds.get("gpu_temperature_warn_c", 85)):
        causes.append(f"temperature {temp:.0f} C")
    others = [(pid, mem) for pid, mem in apps_on_gpu if pid not in own_pids]
    if others:
        causes.append("another process on the GPU (" + ", ".join(f"pid {p}, {m} MiB" for p, m in others[:3]) + ")")
    sm, smax = h.get("clocks.sm"), h.get("clocks.max.sm")
    if isinstance(sm, (int, float)) and isinstance(smax, (int, float)) and smax and sm < 0.8 * smax and not causes \
            and not capped:  # at its power cap the clock is low by design
        causes.append(f"SM clock {sm:.0f} of {smax:.0f} MHz")
    return causes


def _lowered_limit(h, row) -> str | None:
    limit = h.get("power.limit")
    if row is not None and row.power_limit_w and isinstance(limit, (int, float)) and limit < 0.95 * row.power_limit_w:
        return f"power limit {limit:.0f} W (this GPU's default is {row.power_limit_w:.0f} W)"
    return None


def _reasons(h) -> list[str]:
    """The clocks event reasons active in a sample: the single fields, else the bits of the mask."""
    active = [label for field, label in REASONS.items() if h.get(field) is True]
    mask = h.get("clocks_event_reasons.active")
    if not active and isinstance(mask, int):
        active = [label for bit, label in REASON_BITS.items() if mask & bit]
    return active


def _capped_at_default(h, row) -> bool:
    """At its power cap, with the power limit at the GPU's default: normal at full load, not a cause."""
    return h is not None and row is not None and POWER_CAP in _reasons(h) and not _lowered_limit(h, row)


def figure(x: float) -> str:
    """A measured figure at the precision a person reads: 672 (TFLOP/s), 2.95 (TB/s), 0.0412 (a CPU's TFLOP/s)."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _row_for(d: dict, facts: Facts):
    from . import gpus

    row = gpus.match(d.get("name") or "")
    if row is None:
        g = next((g for g in facts.gpus if g.index == d.get("index")), None)
        row = gpus.match(g.name) if g else None
    return row


def _bus(pci) -> list:
    """'00000000:18:00.0' and '0000:18:00' -> ['18', '00'] (bus, device; the domain's width varies)."""
    return str(pci or "").lower().rsplit(".", 1)[0].split(":")[-2:]


def _pct(x: float, ref: float) -> str:
    return f"{100 * x / ref:.0f} % of {figure(ref)}"


def judge(bench: dict, facts: Facts, thresholds: dict | None = None) -> Iterable[CheckResult]:
    th = thresholds or {}
    warn_at = float(th.get("bench_warn_fraction", 0.8))
    if bench.get("error") and not bench.get("devices"):
        yield CheckResult("bench.run", "Benchmark", WARN, "did not run", detail=str(bench["error"])[:400],
                          remediation="nvidia-smi hung: the bench would hang too (see gpu.nvidia_smi)"
                          if bench.get("driver_hung") else
                          "the bench needs torch with CUDA on the host (see cuda.runtime)"
                          if "CUDA" in str(bench["error"]) or "torch" in str(bench["error"]) else
                          "run it again; if it hangs, a GPU may be wedged (see the health checks)")
        return
    own = {bench.get("pid")}
    for d in bench.get("devices") or []:
        i = d.get("index")
        cid, title = f"bench.gpu{i}", f"GPU {i} speed"
        if d.get("error"):
            yield CheckResult(cid, title, WARN, "bench failed", detail=d["error"][:400],
                              remediation="the GPU errors on a matmul or copy: see the CUDA and health checks")
            continue
        row = _row_for(d, facts) if bench.get("device", "cuda") == "cuda" else None  # CPU runs: no GPU reference
        tf, tb = d.get("bf16_tflops"), d.get("copy_tbps")
        measured = ", ".join(f"{what} {figure(x)} {unit}" for what, x, unit in
                             (("bf16", tf, "TFLOP/s"), ("copy", tb, "TB/s")) if isinstance(x, (int, float)))
        ref_tf, ref_tb = (row.ref("bf16_tflops"), row.ref("copy_tbps")) if row is not None else (None, None)
        if ref_tf is None and ref_tb is None:
            yield CheckResult(cid, title, INFO, measured,
                              detail=f"no reference speed for {row.name if row else d.get('name')} in gpus.yaml yet")
            continue
        parts, slow = [], []
        for what, x, ref, unit in (("bf16", tf, ref_tf, "TFLOP/s"), ("copy", tb, ref_tb, "TB/s")):
            if ref and isinstance(x, (int, float)):
                parts.append(f"{what} {figure(x)} {unit} ({_pct(x, ref)})")
                if x < warn_at * ref:
                    slow.append(what)
        text = ", ".join(parts) or measured
        expected = f">= {warn_at:.0%} of the {row.name} reference"
        if not slow:
            yield CheckResult(cid, title, PASS, text, expected)
            continue
        rows, apps = sample_by_gpu(d.get("sample"))
        h = rows.get(i)
        if d.get("pci"):  # torch's GPU i is not nvidia-smi's i under CUDA_VISIBLE_DEVICES: match by PCI address
            h = next((x for x in rows.values() if _bus(x.get("pci.bus_id")) == _bus(d["pci"])), h)
        bus = (h.get("pci.bus_id") or "").lower() if h else ""
        causes = likely_causes(h, apps.get(bus, []), own, row, th)
        why = ("likely cause, seen during the matmul: " + "; ".join(causes)) if causes else \
              ("nothing visible in nvidia-smi explains it" if h else "nvidia-smi could not be sampled during the bench")
        if not causes and _capped_at_default(h, row):
            why += f" (its power cap at the default {row.power_limit_w:.0f} W limit is normal at full load)"
        yield CheckResult(cid, title, WARN, text, expected, detail=why,
                          remediation=("remove the cause above and run `gpuops verify --bench` again" if causes else
                                       "compare with another instance of the same type; a GPU that is slow for no "
                                       "visible reason is worth replacing before a long run"))
    ar = bench.get("allreduce")
    if ar:
        yield from _judge_allreduce(ar, bench, facts, th)


def _judge_allreduce(ar: dict, bench: dict, facts: Facts, th: dict) -> Iterable[CheckResult]:
    cid, title = "bench.allreduce", f"All-reduce across {ar.get('world')} GPUs"
    if ar.get("error"):
        yield CheckResult(cid, title, WARN, "failed", detail=str(ar["error"])[:400],
                          remediation="NCCL could not all-reduce across the GPUs: run with NCCL_DEBUG=INFO to see why "
                                      "(P2P, NVLink/NVSwitch fabric manager, shared memory size)")
        return
    bw = float(ar.get("busbw_gbps") or 0)
    rows = {r.id: r for r in (_row_for(d, facts) for d in bench.get("devices") or []) if r is not None}
    row = next(iter(rows.values())) if len(rows) == 1 else None
    measured = f"bus bandwidth {bw:.1f} GB/s ({ar.get('backend', 'nccl')}, {ar.get('bytes', 0) / 2**20:.0f} MiB)"
    if row is None or not row.link_gbps or bench.get("device") == "cpu":
        yield CheckResult(cid, title, INFO, measured)
        return
    refs = row.allreduce_refs(int(ar.get("world") or 0), int(ar.get("bytes") or 0))
    if refs:  # a measured figure for this GPU model, count and message size (gpus.yaml `allreduce`)
        yield _against_reference(cid, title, measured, bw, row, refs, th)
        return
    frac = float(th.get("bench_allreduce_warn_fraction", 0.3))
    link = f"{row.interconnect or 'link'} {row.link_gbps:g} GB/s per direction"
    expected = f">= {frac:.0%} of {link}"
    if bw < frac * row.link_gbps:
        yield CheckResult(cid, title, WARN, f"{measured}: {100 * bw / row.link_gbps:.0f} % of {link}", expected,
                          remediation="GPUs talk slower than their interconnect allows: check `nvidia-smi topo -m` "
                                      "(NVLink present?), nvidia-fabricmanager on NVSwitch systems, NCCL_P2P_DISABLE",
                          detail="NCCL bus bandwidth = algorithm bandwidth x 2(n-1)/n (nccl-tests' definition)")
    else:
        yield CheckResult(cid, title, PASS, f"{measured}: {100 * bw / row.link_gbps:.0f} % of {link}", expected)


def _against_reference(cid: str, title: str, measured: str, bw: float, row, refs: list[dict],
                       th: dict) -> CheckResult:
    """The all-reduce judged by what a healthy machine of this GPU model and count reaches at this message size:
    the lowest reference that applies (NCCL's ring; NVLink SHARP reaches more), WARN below
    bench_allreduce_reference_fraction (80 %) of it."""
    ref = min(refs, key=lambda r: float(r["busbw_gbps"]))
    frac = float(th.get("bench_allreduce_reference_fraction", 0.8))
    want = float(ref["busbw_gbps"])
    others = ", ".join(f"{r.get('algorithm', '?')} ~{float(r['busbw_gbps']):g} GB/s" for r in refs if r is not ref)
    about = (f"{ref.get('gpus')}x {row.name} at >= {ref.get('min_mib', 0)} MiB: {ref.get('algorithm', 'nccl')} "
             f"~{want:g} GB/s bus bandwidth" + (f" ({others})" if others else ""))
    expected = f">= {frac:.0%} of {want:g} GB/s"
    text = f"{measured}: {100 * bw / want:.0f} % of the reference"
    detail = f"reference: {about}; source: {ref.get('source')}"
    if bw < frac * want:
        return CheckResult(cid, title, WARN, text, expected, detail=detail,
                           remediation="GPUs talk slower than a healthy machine of this type: check `nvidia-smi topo "
                                       "-m` (every pair NV18 on H100 SXM?), nvidia-fabricmanager running, "
                                       "NCCL_P2P_DISABLE / NCCL_NVLS_ENABLE in the environment; compare with "
                                       "nccl-tests' all_reduce_perf -b 256M -e 4G")
    return CheckResult(cid, title, PASS, text, expected, detail=detail)


__all__ = ["judge", "likely_causes", "sample_by_gpu", "FAIL"]
