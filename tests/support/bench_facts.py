"""Recorded figures of verify --bench (nvidia-smi samples, per-GPU results) for the pure tests."""
from __future__ import annotations

from gpuops.verify.bench import judge
from gpuops.verify.facts import Facts, Gpu


FIELDS = ["index", "pci.bus_id", "clocks_event_reasons.active", "clocks_event_reasons.hw_slowdown",
          "clocks_event_reasons.hw_thermal_slowdown", "clocks_event_reasons.sw_thermal_slowdown",
          "clocks_event_reasons.hw_power_brake_slowdown", "clocks_event_reasons.sw_power_cap", "temperature.gpu",
          "power.draw", "power.limit", "clocks.sm", "clocks.max.sm", "utilization.gpu"]


BUS = "00000000:18:00.0"


def sample(thermal=False, limit="700.00", temp=62, apps="", mask=None):
    hw_t = "Active" if thermal else "Not Active"
    active = mask or ("0x0000000000000040" if thermal else "0x0000000000000000")
    line = f"0, {BUS}, {active}, Not Active, {hw_t}, Not Active, Not Active, Not Active, {temp}, 650.10, {limit}, " \
           f"{1230 if thermal else 1980}, 1980, 100"
    return {"t": 0.6, "fields": FIELDS, "gpus": line + "\n", "apps": apps}


def facts(name="NVIDIA H100 80GB HBM3", n=1):
    return Facts(gpus=[Gpu(index=i, name=name, bus_id=BUS) for i in range(n)])


def dev(tf, tb, name="NVIDIA H100 80GB HBM3", i=0, **kw):
    return {"index": i, "name": name, "bf16_tflops": tf, "copy_tbps": tb, "matmul_seconds": 1.0, "copy_seconds": 0.5,
            "sample": kw.pop("sample", sample()), **kw}


def results(bench, f=None, th=None):
    return {r.id: r for r in judge(bench, f or facts(), th or {})}
