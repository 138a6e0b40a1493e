"""A run's checkpoints are its own, and a recovery that knows what happened (issue #27), end to end through the
Lambda emulator, its sandbox instances and real `gpuops run` processes: each test reproduces one of the issue's
"what goes wrong today" and fails on the code before it."""
from __future__ import annotations

import json
import time
from pathlib import Path

from gpuops.cloud.ledger import Ledger
from test_cloud_e2e import TYPE, cloud, cloud_emu  # noqa: F401  (fixtures)
from test_run_e2e import _cli, _project
from test_run_recover_e2e import _billing, _records, _wait

# argv: steps, delay, delay once resumed, a tag for its weights, the checkpoint folder. Each checkpoint written under
# a temporary name then renamed; the weights name the run (the tag) that wrote them.
TAGGED = """\
import os, sys, time
steps, delay, tag, d = int(sys.argv[1]), float(sys.argv[2]), sys.argv[4], sys.argv[5]
start = 0
src = os.environ.get("GPUOPS_RESUME_FROM")
if src:
    start, delay = int(open(os.path.join(src, "step")).read()), float(sys.argv[3])
    print(f"resumed from {src} at step {start}: " + open(os.path.join(src, "model.bin")).read(), flush=True)
for s in range(start + 1, steps + 1):
    time.sleep(delay)
    tmp = f"{d}/.tmp-{s}"
    os.makedirs(tmp, exist_ok=True)
    open(f"{tmp}/step", "w").write(str(s))
    open(f"{tmp}/model.bin", "w").write(f"weights of step {s} by run {tag}")
    os.replace(tmp, f"{d}/checkpoint-{s}")
    print(f"step {s} saved", flush=True)
"""


def _rec(prefix: str) -> dict:
    return next((r for r in _records() if r["id"].startswith(prefix + "-")), {})


def _checkpoint_step(prefix: str) -> int:
    return ((_rec(prefix).get("checkpoint") or {}).get("step")) or 0


def _done(p) -> tuple[dict, str]:
    out, err = p.communicate(timeout=300)
    assert "Traceback" not in err, err
    return json.loads(out), err


def _log(doc: dict) -> str:
    return (Path.cwd() / doc["fetched"]["log"]).read_text()


def test_two_runs_in_one_project_folder_each_resume_from_their_own_checkpoint(cloud):
    """Run A trains with --recover; run B of the same project runs to its end meanwhile, fetching checkpoints of
    the same names. A is preempted: its replacement resumes from A's own weights (before: B's, pushed from the
    shared ./checkpoints), and each run's checkpoints are in its own folder."""
    _project(text=TAGGED)
    a = _cli(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--recover", "1", "--name", "runa",
             "--", "12", "8", "0.3", "A", "checkpoints")
    _wait(lambda: _checkpoint_step("runa") >= 2, what="run A's checkpoint-2 fetched", p=a)
    (first,) = [i["id"] for i in _billing(cloud)]  # A's
    b = _cli(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--name", "runb",
             "--", "6", "0.1", "0", "B", "checkpoints")
    doc_b, err_b = _done(b)
    assert b.returncode == 0 and doc_b["outcome"] == "succeeded", err_b
    assert a.poll() is None, "run A ended before its preemption"
    cloud.preempt(first)
    doc_a, err_a = _done(a)
    assert a.returncode == 0 and doc_a["outcome"] == "succeeded" and doc_a["recoveries"] == 1, err_a
    step = int(doc_a["resumed_from"].rsplit("-", 1)[1])
    assert f"resumed from checkpoints/checkpoint-{step} at step {step}: weights of step {step} by run A" in _log(doc_a)
    a_dir, b_dir = Path.cwd() / doc_a["checkpoints"]["local"], Path.cwd() / doc_b["fetched"]["checkpoints"]
    assert a_dir != b_dir and a_dir.parent.name == doc_a["run"] and b_dir.parent.name == doc_b["run"]
    assert (a_dir / "checkpoint-12" / "model.bin").read_text() == "weights of step 12 by run A"
    assert (b_dir / "checkpoint-6" / "model.bin").read_text() == "weights of step 6 by run B"
    assert doc_a["checkpoints"]["newest"].startswith(doc_a["checkpoints"]["local"] + "/checkpoint-")
    assert not _billing(cloud) and not [x for x in Ledger().records() if x.open]


def test_a_stale_step_folder_in_the_project_is_never_resumed_from(cloud):
    """`ckpt/checkpoint-99`, left here by an earlier experiment, is neither uploaded nor taken as the newest
    checkpoint (before: sync uploaded it, the fetcher took it, the replacement resumed from step 99)."""
    _project(text=TAGGED)
    stale = Path.cwd() / "ckpt" / "checkpoint-99"
    stale.mkdir(parents=True)
    (stale / "step").write_text("99")
    (stale / "model.bin").write_text("weights of an earlier experiment")
    p = _cli(cloud, "--script", "train.py", "--fetch", "ckpt", "--json", "--recover", "1",
             "--", "6", "4.5", "0.3", "A", "ckpt")
    _wait(lambda: _checkpoint_step("train") >= 2, what="checkpoint-2 fetched", p=p)
    (first,) = [i["id"] for i in _billing(cloud)]
    assert not (cloud.home(first) / Path.cwd().name / "ckpt" / "checkpoint-99").exists()  # never uploaded
    cloud.preempt(first)
    doc, err = _done(p)
    assert p.returncode == 0 and doc["outcome"] == "succeeded" and doc["recoveries"] == 1, err
    step = int(doc["resumed_from"].rsplit("-", 1)[1])
    assert 2 <= step < 6 and "checkpoint-99" not in err, err
    assert f"resumed from ckpt/checkpoint-{step} at step {step}: weights of step {step} by run A" in _log(doc)
    assert (stale / "model.bin").read_text() == "weights of an earlier experiment"  # left alone here
