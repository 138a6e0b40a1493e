"""Figures for `gpuops run --recover` through the local Lambda emulator (instances are sandbox hosts on 127.0.0.N:22):
the billed seconds a recovery costs beyond the new instance's boot, the checkpoint push aside. The old instance bills
from the fault until its termination is confirmed (a GPU that fell off the bus: the instance still runs; a preempted
one is counted the same way, though Lambda may stop billing it at once); the new one from its launch request to the
job's new start, less its boot (launch -> active) and the push. Goal: under 90 s. Not a pass/fail test.
Run: uv run python benchmarks/bench_recovery.py   (BENCH_FAULTS=xid,preempt; BENCH_CKPT_MB=64 per checkpoint)

BENCH_COMPARE=1 compares a checkpoint's two homes (issue #27): a 1 GB checkpoint (BENCH_BIG_MB) fetched through this
machine over a link throttled to 12.5 MB/s (BENCH_RATE_MBS; tests/support/proxy.py between this machine and every instance)
and pushed back to the replacement, against the same checkpoint kept on a Lambda filesystem (`run --fs`): for each,
seconds from the preemption to the replacement's first step, and the bytes that crossed this machine.
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


def _wait_checkpoint(proj: Path, p, step: int) -> None:
    """Until the run's record holds a checkpoint of at least `step` (the run ending first ends the benchmark)."""
    while True:
        try:
            if ((_record(proj).get("checkpoint") or {}).get("step") or 0) >= step:
                return
        except (ValueError, OSError):
            pass
        if p.poll() is not None:
            raise SystemExit(f"the run ended early: {p.communicate()[1][-3000:]}")
        time.sleep(0.2)


def one(emu, env: dict, proj: Path, key: Path, fault: str) -> dict:
    g = [str(Path(sys.executable).parent / "gpuops")]
    p = subprocess.Popen(g + ["run", "--type", "gpu_1x_h100_pcie", "--script", "train.py", "--fetch", "checkpoints",
                              "--recover", "1", "--key", str(key), "--yes", "--json", "--name", f"b-{fault}"],
                         env=env, cwd=proj, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_checkpoint(proj, p, 2)  # the second checkpoint fetched and verified while training
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


# -- the two homes of a checkpoint (issue #27): through this machine over a throttled link, or on a filesystem --------
RATE = float(os.environ.get("BENCH_RATE_MBS", "12.5")) * 1e6  # bytes/s of this machine's link (tests/support/proxy.py)
BIG_MB = int(os.environ.get("BENCH_BIG_MB", "1024"))
BIG = """\
import os, sys, time
src = os.environ.get("GPUOPS_RESUME_FROM")
start = 0
if src:
    start = int(open(os.path.join(src, "step")).read())
    print("resumed from", src, "at", round(time.time(), 3), flush=True)
for s in range(start + 1, start + 4 if src else 10 ** 6):
    if s == 1:  # one big checkpoint, written under a temporary name, marked complete, then renamed
        tmp = "checkpoints/.tmp-1"
        os.makedirs(tmp, exist_ok=True)
        block = os.urandom(16 << 20)
        with open(f"{tmp}/model.bin", "wb") as fh:
            for _ in range(%d // 16):
                fh.write(block)
        open(f"{tmp}/step", "w").write("1")
        open(f"{tmp}/COMPLETE", "w").write("")
        os.replace(tmp, "checkpoints/checkpoint-1")
    print(f"step {s} at {time.time():.3f}", flush=True)
    time.sleep(1)
""" % BIG_MB


def _free_address() -> str:
    import socket

    for k in range(250, 100, -1):
        s = socket.socket()
        try:
            s.bind((f"127.0.0.{k}", 22))
            return f"127.0.0.{k}"
        except OSError:
            continue
        finally:
            s.close()
    raise SystemExit("no free 127.0.0.K:22 for the throttling proxy")


class Throttled:
    """Every instance the emulator starts is reached through a proxy throttled to RATE (tests/support/proxy.py): the API
    reports the proxy's address, so every byte between this machine and an instance crosses the slow link."""

    def __init__(self, emu):
        import threading

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        self.emu, self.proxies, self.stop = emu, {}, threading.Event()
        self.thread = threading.Thread(target=self._route, daemon=True)
        self.thread.start()

    def _route(self) -> None:
        from support.proxy import Proxy

        while not self.stop.is_set():
            with self.emu.lock:
                for iid, inst in self.emu._instances.items():
                    if iid not in self.proxies and inst.get("_address") and inst.get("status") == "booting":
                        addr = _free_address()
                        self.proxies[iid] = Proxy(22, target_host=inst["_address"], rate=RATE, listen_host=addr,
                                                  listen_port=22)
                        inst["_address"] = addr
            time.sleep(0.02)

    def bytes(self) -> int:
        return sum(p.bytes_down + p.bytes_up for p in self.proxies.values())

    def close(self) -> None:
        self.stop.set()
        for p in self.proxies.values():
            p.close()


def _first_step_after(log: str, t0: float) -> float:
    import re

    after = [float(t) for t in re.findall(r"step \d+ at ([0-9.]+)", log) if float(t) > t0]
    return min(after) - t0 if after else float("nan")


def home_case(emu, env: dict, proj: Path, key: Path, fs: bool) -> dict:
    g = [str(Path(sys.executable).parent / "gpuops")]
    args = ["--fs", "benchfs"] if fs else ["--fetch", "checkpoints"]
    p = subprocess.Popen(g + ["run", "--type", "gpu_1x_h100_pcie", "--script", "train.py", "--recover", "1", *args,
                              "--key", str(key), "--yes", "--json", "--name", "fs" if fs else "local"],
                         env=env, cwd=proj, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_checkpoint(proj, p, 1)  # the big checkpoint fetched and verified here, or judged complete on the filesystem
    (old,) = [i["id"] for i in emu.instances() if i["status"] == "active"]
    t0 = time.time()
    emu.preempt(old)
    out, err = p.communicate()
    doc = json.loads(out)
    log = (proj / doc["fetched"]["log"]).read_text() if doc.get("fetched", {}).get("log") else ""
    return {"outcome": doc["outcome"], "to_first_step": _first_step_after(log, t0), "resumed": doc["resumed_from"],
            "err": err[-2000:] if doc["outcome"] != "succeeded" else ""}


def compare() -> None:
    """BENCH_COMPARE=1: a BIG_MB checkpoint through this machine over a link throttled to RATE, against the same
    checkpoint on a Lambda filesystem: seconds from the preemption to the replacement's first step, and the bytes
    that crossed this machine."""
    from bench_run import emulated

    cases = [c for c in os.environ.get("BENCH_CASES", "local,fs").split(",") if c]
    for case in cases:
        tmp, key, emu, env = emulated(f"gpuops-bench-home-{case}-")
        link = Throttled(emu)
        try:
            proj = tmp / "proj"
            proj.mkdir()
            (proj / "train.py").write_text(BIG)
            r = home_case(emu, env, proj, key, fs=case == "fs")
            what = (f"a {BIG_MB} MB checkpoint through this machine at {RATE / 1e6:g} MB/s" if case == "local" else
                    f"the {BIG_MB} MB checkpoint on a Lambda filesystem")
            print(f"{case:>5} ({r['outcome']}, resumed from {r['resumed']}): {what}: preemption -> the replacement's "
                  f"first step {r['to_first_step']:.1f} s; bytes that crossed this machine {link.bytes():,}"
                  + (f"\n{r['err']}" if r["err"] else ""), flush=True)
        finally:
            link.close()
            emu.close()
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    from bench_run import emulated

    if os.environ.get("BENCH_COMPARE"):
        return compare()

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
