"""Figures for `gpuops run --recover` through the local Lambda emulator (instances are sandbox hosts on 127.0.0.N:22):
the billed seconds a recovery costs beyond the new instance's boot, the checkpoint push aside. The old instance bills
from the fault until its termination is confirmed (a GPU that fell off the bus: the instance still runs; a preempted
one is counted the same way, though Lambda may stop billing it at once); the new one from its launch request to the
job's new start, less its boot (launch -> active) and the push. Goal: under 90 s. Not a pass/fail test.
Run: uv run python benchmarks/bench_recovery.py   (BENCH_FAULTS=xid,preempt; BENCH_CKPT_MB=64 per checkpoint)
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

FAULTS = [f for f in os.environ.get("BENCH_FAULTS", "xid,preempt").split(",") if f]
CKPT_MB = int(os.environ.get("BENCH_CKPT_MB", "64"))
TRAIN = """\
import os, sys, time
start = 0
src = os.environ.get("GPUOPS_RESUME_FROM")
if src:
    start = int(open(os.path.join(src, "step")).read())
for s in range(start + 1, 5):
    time.sleep(5)
    tmp = f"checkpoints/.tmp-{s}"
    os.makedirs(tmp, exist_ok=True)
    open(f"{tmp}/step", "w").write(str(s))
    open(f"{tmp}/model.bin", "wb").write(os.urandom(%d << 20))
    os.replace(tmp, f"checkpoints/checkpoint-{s}")
    print("step", s, flush=True)
""" % CKPT_MB


def _record(proj: Path) -> dict:
    (f,) = list((proj / "runs" / "pipelines").glob("*.json"))
    return json.loads(f.read_text())


def one(emu, env: dict, proj: Path, key: Path, fault: str) -> dict:
    g = [str(Path(sys.executable).parent / "gpuops")]
    p = subprocess.Popen(g + ["run", "--type", "gpu_1x_h100_pcie", "--script", "train.py", "--fetch", "checkpoints",
                              "--recover", "1", "--key", str(key), "--yes", "--json", "--name", f"b-{fault}"],
                         env=env, cwd=proj, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while True:  # until the second checkpoint was fetched and verified while training
        try:
            if ((_record(proj).get("checkpoint") or {}).get("step") or 0) >= 2:
                break
        except (ValueError, OSError):
            pass
        if p.poll() is not None:
            raise SystemExit(f"the run ended early: {p.communicate()[1][-2000:]}")
        time.sleep(0.2)
    (old,) = [i["id"] for i in emu.instances() if i["status"] == "active"]
    fault_at = time.time()
    emu.gpu_fault(old, "xid=79") if fault == "xid" else emu.preempt(old)
    out, err = p.communicate()
    doc, rec = json.loads(out), _record(proj)
    att, st = rec["attempts"][0], rec["stages"]
    new = emu._instances[rec["instance"]["ids"][0]]  # the emulator's own launch and boot times
    old_after = att["ended"] - fault_at
    boot = new["_active_at"] - new["_launched"]
    push = st["push"]["ended"] - st["push"]["started"]
    new_before = st["watch"]["started"] - new["_launched"]
    a1 = att["stages"]
    return {"fault": fault, "outcome": doc["outcome"], "detect": att["stages"]["watch"]["ended"] - fault_at,
            "recover": a1["recover"]["ended"] - a1["recover"]["started"], "old_after": old_after, "boot": boot,
            "to_launch": new["_launched"] - st["up"]["started"], "ssh": st["up"]["ended"] - new["_active_at"],
            "sync": st["sync"]["ended"] - st["sync"]["started"], "setup": st["setup"]["ended"] - st["setup"]["started"],
            "push": push, "launch": st["train"]["ended"] - st["train"]["started"],
            "billed": old_after + new_before - boot - push}


def main() -> None:
    from bench_run import emulated

    tmp, key, emu, env = emulated("gpuops-bench-recovery-")
    try:
        for fault in FAULTS:
            proj = tmp / f"proj-{fault}"
            proj.mkdir()
            (proj / "train.py").write_text(TRAIN)
            r = one(emu, env, proj, key, fault)
            print(f"{r['fault']:>7} ({r['outcome']}): fault -> noticed {r['detect']:.1f} s, recovery stage (fetch, "
                  f"terminate) {r['recover']:.1f} s: old instance billed {r['old_after']:.1f} s after the fault | "
                  f"new instance: launch request after {r['to_launch']:.1f} s, boot {r['boot']:.1f} s (aside), "
                  f"SSH {r['ssh']:.1f} s, sync {r['sync']:.1f} s, setup and verify {r['setup']:.1f} s, push of "
                  f"{CKPT_MB} MB {r['push']:.1f} s (aside), launch {r['launch']:.1f} s")
            print(f"{r['fault']:>7}: billed seconds the recovery costs beyond the new instance's boot, the push aside: "
                  f"{r['billed']:.1f} s (goal < 90 s)")
    finally:
        emu.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
