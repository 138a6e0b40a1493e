"""Pipeline records (pipeline/stages.py) with stages done, for the pure tests of run and recovery."""
from __future__ import annotations

from gpuops.pipeline import stages as pl


def rec(**kw):
    return pl.Record(id="r1", profile="p", instance_type="gpu_1x_h100_pcie", script="train.py", created=0, **kw)


def done(r, *names, ok=True, t0=0.0, dur=10.0):
    for i, n in enumerate(names):
        s = r.stage(n)
        s.started, s.ended, s.ok = t0 + i * dur, t0 + (i + 1) * dur, ok
    return r
