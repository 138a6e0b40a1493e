"""Figures for the training-signal model (src/gpuops/jobs/signals.py) that watch runs on every log line.

Prints: log lines per second through SignalModel.line (a mixed trainer log: step/loss lines, VERL lines, HF Trainer
dicts, noise) and the model's memory bound (losses kept). Not a pass/fail test.
Run: uv run python benchmarks/bench_signals.py
"""
from __future__ import annotations

import time

from gpuops.jobs import signals as sg

N = 200_000


def main() -> None:
    spec = sg.load_spec()
    lines = []
    for i in range(N // 4):
        lines += [f"step {i} | loss {1.0 / (i + 1):.4f} | lr 1e-4",
                  f"step:{i} - actor/pg_loss:0.0{i % 10} - critic/score/mean:0.5 - timing_s/step:12.5",
                  f"{{'loss': {0.5 + i % 3}, 'grad_norm': 3.2, 'learning_rate': 5e-05, 'epoch': {i / 100}}}",
                  f"[rank0] rollout batch {i}: 512 sequences, mean length 1536 tokens"]
    m = sg.SignalModel(spec, started=0.0, price_per_hour=3.0)
    t = time.perf_counter()
    for k, ln in enumerate(lines):
        m.line(ln, float(k))
    dt = time.perf_counter() - t
    print(f"signal model: {len(lines):,} lines in {dt:.2f} s = {len(lines) / dt:,.0f} lines/s "
          f"({dt / len(lines) * 1e6:.1f} us/line); losses kept: {len(m.losses)} (bounded); signals: {len(m.signals)}")


if __name__ == "__main__":
    main()
