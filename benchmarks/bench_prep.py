"""The money a preparation on the cheap type saves (issue 38): `gpuops run --prep` against the same pass on the
training instance. Not a pass/fail test.

Measured, through the local Lambda emulator (its instances are sandbox hosts on this machine; a filesystem is a folder
every instance attaching it sees): a tokenizer pass (a character-level tokenizer over a generated corpus, single
threaded Python, BENCH_CORPUS_MB megabytes) run with --prep ahead of a training job on the training type:
  - what the preparation's instance billed beyond the pass itself: its bring-up (the emulator's boot aside), sync,
    setup, the move onto the filesystem and its termination (gpuops' overhead, in seconds);
  - a second run with the same preparation: skipped, no preparation instance.
Then the money, with the emulator's prices (Lambda's public price list: src/gpuops/cloud/emulator/catalog.py) and a
stated CPU-time model:
  - the pass needs W CPU-seconds; a fraction p of it runs in parallel over the instance's vCPUs (Amdahl's law), so
    on v vCPUs it takes  T(v) = W * ((1 - p) + p / v);
  - W is set so that the pass takes H hours on the training type (the issue's case: an hour on 8x H100);
  - inline (on the training instance): the training instance bills T(v_train) at its price, the GPUs idle;
  - with --prep: the cheap instance bills T(v_prep) + its boot (BENCH_BOOT_MIN, default 5 minutes: an assumption,
    Lambda's boot is minutes; the emulator's is 1 s) + gpuops' measured overhead, at its price; the training
    instance boots after it either way, so its own boot is the same in both.
Run: uv run python benchmarks/bench_prep.py   (BENCH_TRAIN_TYPE=gpu_8x_h100_sxm5, BENCH_CORPUS_MB=8,
     BENCH_BOOT_MIN=5)
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

TRAIN_TYPE = os.environ.get("BENCH_TRAIN_TYPE", "gpu_8x_h100_sxm5")
CORPUS_MB = float(os.environ.get("BENCH_CORPUS_MB", "8"))
BOOT_MIN = float(os.environ.get("BENCH_BOOT_MIN", "5"))

PREPARE = """\
import array, os, time
t0 = time.time()
text = open("corpus.txt", encoding="utf-8").read()
vocab = {c: i for i, c in enumerate(sorted(set(text)))}
ids = array.array("H", (vocab[c] for c in text))
os.makedirs("data", exist_ok=True)
with open("data/train.bin.tmp", "wb") as fh:
    ids.tofile(fh)
os.replace("data/train.bin.tmp", "data/train.bin")
print(f"tokenized {len(ids)} tokens in {time.time() - t0:.2f} s", flush=True)
"""
TRAIN = "import os\nprint('training on', os.path.getsize('data/train.bin'), 'bytes', flush=True)\n"


def run(g, *args, env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(g + list(args), env=env, cwd=cwd, capture_output=True, text=True)


def measure(tmp: Path) -> dict:
    """Two runs through the emulator: the preparation's overhead (seconds its instance billed beyond the pass), and
    the second run's skip."""
    from benchenv import emulated_cloud, isolated

    env = isolated(tmp)
    g, key, emu = emulated_cloud(tmp, env)
    proj = tmp / "proj"
    proj.mkdir()
    (proj / "prepare.py").write_text(PREPARE)
    (proj / "train.py").write_text(TRAIN)
    line = "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.\n"
    (proj / "corpus.txt").write_text(line * int(CORPUS_MB * 1e6 / len(line)))
    args = ["run", "--type", TRAIN_TYPE, "--script", "train.py", "--key", str(key), "--yes", "--json", "--fs",
            "corpus", "--prep", "python prepare.py", "--prep-out", "data/train.bin"]
    try:
        assert run(g, "fs", "create", "corpus", "--region", "us-east-1", env=env, cwd=proj).returncode == 0
        t0 = time.perf_counter()
        p = run(g, *args, env=env, cwd=proj)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"the run failed (exit {p.returncode}): {p.stderr[-1500:]}")
        doc = json.loads(p.stdout)
        prep = doc["prep"]
        (inst,) = [i for i in doc["instances"] if i.get("role") == "prep"]
        state = json.loads((proj / "runs" / prep["job"] / "state.json").read_text())
        job_s = state["ended"] - state["started"]
        p2 = run(g, *args, env=env, cwd=proj)
        doc2 = json.loads(p2.stdout) if p2.returncode == 0 else {}
        return {"wall": wall, "prep_type": prep["type_used"], "billed_s": inst["duration_s"], "job_s": job_s,
                "prep_cost": inst["cost"], "stage_s": prep["duration_s"], "bytes": prep["outputs"]["bytes"],
                "second": (doc2.get("prep") or {}).get("state"), "second_cost": (doc2.get("prep") or {}).get("cost"),
                "second_instances": [i.get("role", "train") for i in doc2.get("instances") or []],
                "boot_s": 1.0}
    finally:
        emu.close()


def main() -> None:
    from gpuops.cloud.emulator import catalog

    with tempfile.TemporaryDirectory(prefix="gpuops-bench-prep-") as d:
        m = measure(Path(d))
    train, cheap = catalog.TYPES[TRAIN_TYPE], catalog.TYPES[m["prep_type"]]
    p_train, v_train = train[2] / 100.0, train[3]
    p_cheap, v_cheap = cheap[2] / 100.0, cheap[3]
    overhead_s = max(0.0, m["billed_s"] - m["job_s"] - m["boot_s"])  # gpuops' own seconds on the prep instance
    print(f"measured through the emulator (a {CORPUS_MB:g} MB corpus, {m['bytes']} bytes of tokens):")
    print(f"  the pass itself on the preparation's instance ({m['prep_type']}): {m['job_s']:.1f} s")
    print(f"  the preparation's instance billed {m['billed_s']:.1f} s: emulated boot {m['boot_s']:.0f} s + gpuops' "
          f"overhead {overhead_s:.1f} s (bring-up, sync, setup, move onto the filesystem, termination)")
    print(f"  a second run with the same preparation: {m['second']}, ${m['second_cost'] or 0:.4f}, instances "
          f"launched: {', '.join(m['second_instances'])}")
    print(f"\nprices (the emulator's, Lambda's public list): {TRAIN_TYPE} ${p_train:.2f}/h ({v_train} vCPUs), "
          f"{m['prep_type']} ${p_cheap:.2f}/h ({v_cheap} vCPUs)")
    print(f"model: T(v) = W * ((1 - p) + p / v); W set so the pass takes H h on {TRAIN_TYPE}; with --prep: "
          f"T({v_cheap}) + boot {BOOT_MIN:g} min (assumed) + overhead {overhead_s:.0f} s (measured)")
    print(f"  {'H on training type':>19} {'p':>5} {'T on cheap':>11} {'inline $':>9} {'--prep $':>9} {'saved $':>9}"
          f" {'2nd run saved $':>16}")
    for hours in (0.25, 1.0, 4.0):
        for par in (0.0, 0.9, 0.99):
            ratio = ((1 - par) + par / v_cheap) / ((1 - par) + par / v_train)
            t_cheap = hours * ratio
            inline = hours * p_train
            with_prep = (t_cheap + BOOT_MIN / 60.0 + overhead_s / 3600.0) * p_cheap
            print(f"  {hours:>17.2f} h {par:>5.2f} {t_cheap:>9.2f} h {inline:>9.2f} {with_prep:>9.2f} "
                  f"{inline - with_prep:>9.2f} {inline:>16.2f}")
    print("  (2nd run: the preparation is kept on the filesystem, so the whole inline cost is saved again)")


if __name__ == "__main__":
    main()
