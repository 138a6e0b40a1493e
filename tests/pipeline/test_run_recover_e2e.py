"""`gpuops run --recover N` end to end through the Lambda emulator and real `gpuops` processes (issue #24, recovery):
an instance preempted mid-training, or whose GPU falls off the bus (an Xid 79 in its kernel log), or that stops
answering, is replaced and the job resumed from the newest checkpoint fetched and verified; `--recover 0` ends as
before; a replacement that cannot be launched leaves nothing billing; Ctrl-C and --resume during a recovery."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from gpuops.cloud.ledger import Ledger
from test_cloud_e2e import TYPE, cloud, cloud_emu  # noqa: F401  (fixtures)
from test_run_e2e import _cli, _live, _project

STEPS = 6
# Resumes from GPUOPS_RESUME_FROM; each checkpoint written under a temporary name, then renamed (complete or absent).
# The first job is slow (a fault lands while it trains, whatever the machine's load), the resumed one quick.
RESUMABLE = """\
import os, sys, time
steps, delay = int(sys.argv[1]), float(sys.argv[2])
start = 0
src = os.environ.get("GPUOPS_RESUME_FROM")
if src:
    start, delay = int(open(os.path.join(src, "step")).read()), float(sys.argv[3])
    print(f"resumed from {src} at step {start}", flush=True)
for s in range(start + 1, steps + 1):
    time.sleep(delay)
    tmp = f"checkpoints/.tmp-{s}"
    os.makedirs(tmp, exist_ok=True)
    open(f"{tmp}/step", "w").write(str(s))
    open(f"{tmp}/model.bin", "w").write(f"weights of step {s}, written on {os.uname().nodename} "
                                        f"from {src or 'scratch'}")
    os.replace(tmp, f"checkpoints/checkpoint-{s}")
    print(f"step {s} saved", flush=True)
"""


def _billing(cloud) -> list[dict]:
    return [i for i in cloud.instances() if i["status"] not in ("terminated", "terminating", "preempted")]


def _records() -> list[dict]:
    d = Path.cwd() / "runs" / "pipelines"
    return [json.loads(f.read_text()) for f in d.glob("*.json")] if d.is_dir() else []


def _wait(pred, timeout: float = 120, what: str = "", p=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        if p is not None and p.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {p.communicate()}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _training_with_a_checkpoint(cloud, *args: str, step: int = 2):
    """A `gpuops run --recover` process whose job trains on its first instance and whose checkpoint-<step> was
    fetched and verified meanwhile: (the process, the instance id)."""
    _project(text=RESUMABLE)
    p = _cli(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", *args, "--", str(STEPS), "4.5", "0.5")
    _wait(lambda: (_records() or [{}])[0].get("checkpoint", {}) and
          (_records()[0]["checkpoint"] or {}).get("step", 0) >= step, what=f"checkpoint-{step} fetched", p=p)
    (iid,) = [i["id"] for i in _live(cloud)]
    return p, iid


def _finished_on_a_second_instance(p, first: str, cloud) -> tuple[dict, str]:
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err
    doc = json.loads(out)
    assert doc["outcome"] == "succeeded" and doc["job"] == "succeeded" and doc["recoveries"] == 1, doc
    assert [i["instance"] for i in doc["instances"]] == [1, 2] and doc["instances"][0]["ids"] == [first]
    assert all(i["duration_s"] > 0 and i["cost"] > 0 for i in doc["instances"])
    assert abs(sum(i["cost"] for i in doc["instances"]) - doc["total_cost"]) < 0.001
    assert not _billing(cloud) and not [x for x in Ledger().records() if x.open]
    launched = [x.instance_id for x in Ledger().records() if x.profile == doc["profile"]]
    assert sorted(launched) == sorted(i["ids"][0] for i in doc["instances"])  # each one recorded, each one closed
    return doc, err


def _both_halves_here(doc: dict) -> int:
    """Every checkpoint of the second instance, and the one it resumed from (from the first), verified here."""
    ck = Path.cwd() / doc["checkpoints"]["local"]  # the run's own folder (runs/<run id>/checkpoints)
    assert doc["checkpoints"]["local"] == f"runs/{doc['run']}/checkpoints"
    resumed = int(doc["resumed_from"].rsplit("-", 1)[1])
    assert doc["resumed_from"] == f"checkpoints/checkpoint-{resumed}" and resumed >= 2
    first = (ck / f"checkpoint-{resumed}" / "model.bin").read_text()
    assert "from scratch" in first  # written by the first job
    for s in range(resumed + 1, STEPS + 1):
        assert f"from checkpoints/checkpoint-{resumed}" in (ck / f"checkpoint-{s}" / "model.bin").read_text()
    log = (Path.cwd() / doc["fetched"]["log"]).read_text()
    assert f"resumed from checkpoints/checkpoint-{resumed} at step {resumed}" in log and f"step {STEPS} saved" in log
    return resumed


def test_preempted_mid_training_recovers_and_finishes_with_both_halves(cloud):
    p, first = _training_with_a_checkpoint(cloud, "--recover", "2")
    cloud.preempt(first)
    doc, err = _finished_on_a_second_instance(p, first, cloud)
    assert f"instance {first} is preempted" in err and "replacing the instance (recovery 1 of 2)" in err, err
    assert doc["instances"][0]["ended"].startswith(f"instance {first} is preempted")
    _both_halves_here(doc)
    stages = [(s["instance"], s["stage"]) for s in doc["stages"]]
    assert (1, "recover") in stages and (2, "push") in stages and (2, "up") in stages, stages


def test_xid_79_mid_training_recovers_the_same_way(cloud):
    p, first = _training_with_a_checkpoint(cloud, "--recover", "1")
    cloud.gpu_fault(first, "xid=79")  # the GPU falls off the bus: the job may hang, the API still says active
    doc, err = _finished_on_a_second_instance(p, first, cloud)
    assert "Xid 79" in err and "fallen off the bus" in err and "replacing the instance (recovery 1 of 1)" in err, err
    resumed = _both_halves_here(doc)
    log1 = Path.cwd() / doc["fetched"]["log.instance1"]  # the first job's log, fetched from the failing instance
    assert f"step {resumed} saved" in log1.read_text()
    (old,) = [r for r in Ledger().records() if r.instance_id == first]
    assert log1.stat().st_mtime <= old.ended_at  # terminated only after the fetch was tried
    assert doc["instances"][0]["ended"].startswith(f"{doc['profile']}: Xid errors (kernel log): Xid 79")


def test_recover_0_ends_as_before(cloud):
    """No --recover: a dead GPU is said and the job goes on where it is; a preemption ends the run (`lost`); no
    checkpoint is fetched while training and no second instance is launched."""
    _project(text=RESUMABLE)
    p = _cli(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--", "2", "8", "0")
    (iid,) = _wait(lambda: [i["id"] for i in _live(cloud)], what="the instance", p=p)
    _wait(lambda: ((_records() or [{}])[0].get("stages") or {}).get("watch"), what="training", p=p)
    cloud.gpu_fault(iid, "xid=79")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    doc = json.loads(out)
    assert "Xid 79" in err and "the GPU is no longer usable" in err and "--recover" in err, err
    assert doc["outcome"] == "succeeded" and doc["recoveries"] == 0 and len(doc["instances"]) == 1
    assert doc["checkpoint"] is None and cloud.launch_requests() == 1

    p = _cli(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--recover", "0", "--", "30", "1",
             "0")
    (iid,) = _wait(lambda: [i["id"] for i in _billing(cloud)], what="the instance", p=p)
    _wait(lambda: any((r.get("stages") or {}).get("watch") and r["outcome"] == "running" for r in _records()),
          what="training", p=p)
    cloud.preempt(iid)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1 and f"instance {iid} is preempted" in err and "replacing" not in err, err
    assert json.loads(out)["outcome"] == "lost" and cloud.launch_requests() == 2


def test_a_replacement_that_cannot_launch_ends_with_nothing_billing(cloud):
    p, first = _training_with_a_checkpoint(cloud, "--recover", "2")
    cloud.capacity(TYPE, [])  # no capacity anywhere any more
    cloud.preempt(first)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1, err
    doc = json.loads(out)
    assert doc["outcome"] == "failed" and doc["stop_reason"].startswith("recovery failed: no replacement instance")
    assert "no capacity" in doc["stop_reason"] and "nothing is left billing" in err, err
    assert not _billing(cloud) and not [x for x in Ledger().records() if x.open]
    assert (Path.cwd() / doc["checkpoint"] / "model.bin").is_file()  # what was fetched and verified stays here
    assert "Traceback" not in err


def test_sigterm_while_replacing_then_resume_finishes(cloud, gpuops):
    p, first = _training_with_a_checkpoint(cloud, "--recover", "1")
    cloud.fault("slow-answer", path="/instance-operations/terminate", seconds=4)  # a window inside `recover`
    cloud.gpu_fault(first, "xid=79")
    _wait(lambda: any((r.get("stages") or {}).get("recover") for r in _records()), what="the recovery", p=p)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "Traceback" not in err, err
    assert "interrupted (SIGTERM) while replacing the instance" in err and "goes on with the recovery" in err, err
    cloud.clear_faults()
    r = gpuops("run", "--resume", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "succeeded" and doc["recoveries"] == 1 and doc["instances"][0]["ids"] == [first]
    _both_halves_here(doc)
    assert not _billing(cloud) and not [x for x in Ledger().records() if x.open]


def test_ctrl_c_while_the_replacement_boots_terminates_it_and_resume_finishes(cloud, gpuops):
    p, first = _training_with_a_checkpoint(cloud, "--recover", "1")
    cloud.boot_seconds(60)
    cloud.preempt(first)
    _wait(lambda: [i for i in _billing(cloud) if i["id"] != first], what="the replacement's launch", p=p)
    p.send_signal(signal.SIGINT)  # _cli started it with default_sigint: Ctrl-C works in a suite run with it ignored
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "interrupted while bringing the instance up" in err, err
    assert not _billing(cloud) and not [x for x in Ledger().records() if x.open]  # nothing left billing
    cloud.boot_seconds(0.5)
    r = gpuops("run", "--resume", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "succeeded" and doc["recoveries"] == 1
    _both_halves_here(doc)
    assert not _billing(cloud)


def test_an_instance_unreachable_past_the_limit_is_replaced(cloud):
    p, first = _training_with_a_checkpoint(cloud, "--recover", "1", "--unreachable", "5s")
    cloud.unreachable(first)  # sshd gone, the job running, the API saying active
    doc, err = _finished_on_a_second_instance(p, first, cloud)
    assert "the Lambda API shows the instance running: reconnecting" in err, err
    assert "gave up reconnecting after 5s" in err and "replacing the instance (recovery 1 of 1)" in err, err
    _both_halves_here(doc)


def test_health_sampling_on_a_real_shell_with_an_old_driver(sandbox):
    """The stream's health lines through a real SSH execution on the sandbox host: a driver that refuses
    gpu_recovery_action (R535) answers the next field set; the Xid lines are sent once, not at every sample."""
    from gpuops import knowledge as kb
    from gpuops.jobs import watch as w
    from gpuops.profiles.model import resolve
    from gpuops.remote.connection import connect
    from gpuops.sandbox import host

    host.up(driver="535.183.01", cuda="12.2", faults=["ecc=2", "xid=79"])
    fns, beat, _ = w._extras_script(w.Extras(health=True))
    with connect(resolve("sandbox")) as remote:
        res = remote.run("sh -s", stdin=fns + beat + beat, timeout=60)
    evs = [e for e in map(w.parse_stderr_line, res.stderr.splitlines()) if e]
    health = [e for e in evs if e["type"] == "health"]
    assert len(health) == 2 and health[0]["fields"] == w.HEALTH_FIELD_SETS[1].split(","), res.stderr
    assert [e["type"] for e in evs].count("xid") == 1
    hw = w.HealthWatch(kb.load_playbook("xid"), kb.knowledge().get("nvidia_smi_failures"))
    found = [f for e in evs for f in hw.apply(e)]
    assert any("uncorrectable since boot: GPU 0: 2" in f for f in found), found
    assert any("Xid 79" in f for f in found), found


def test_a_fleet_with_a_preempted_node_is_replaced_whole_and_every_node_resumes(cloud):
    """A torchrun job dies with any of its nodes: the whole fleet is replaced (every node terminated after the fetch
    was tried, a new fleet launched in one region) and the checkpoint pushed to every new node, each of which
    resumes from it."""
    p, first = _fleet_training_with_a_checkpoint(cloud)
    cloud.preempt(first[1])
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    doc = json.loads(out)
    assert doc["outcome"] == "succeeded" and doc["recoveries"] == 1, doc
    assert doc["instances"][0]["ids"] == first and len(doc["instances"][1]["ids"]) == 2
    assert not _billing(cloud) and not [x for x in Ledger().records() if x.open]
    assert f"instance {first[1]} is preempted" in err and "replacing the whole fleet, its 2 instances" in err, err
    assert "stopping the job on every node and fetching from node 0" in err, err
    resumed = _both_halves_here(doc)
    # node 0's job was stopped when node 1 ended (a torchrun job would hang there), not left to run to its end
    log0 = (Path.cwd() / doc["fetched"]["log.instance1"]).read_text()
    assert f"step {resumed} saved" in log0 and f"step {STEPS} saved" not in log0, log0
    log1 = (Path.cwd() / doc["fetched"]["log.host1"]).read_text()  # node 1 resumed from the pushed checkpoint too
    assert f"resumed from {doc['resumed_from']}" in log1 and f"step {STEPS} saved" in log1, log1
    push = next(s for s in doc["stages"] if s["stage"] == "push")
    assert push["ok"] and "on 2 hosts" in push["detail"], push


def test_a_gpu_that_falls_off_the_bus_on_another_node_replaces_the_fleet(cloud):
    """Node 0's stream does not see node 1's GPU: with --recover, each other node's health is streamed beside it
    (one long-lived command per node). An Xid 79 on node 1 replaces the fleet; node 0's checkpoint is fetched from
    it (it still answers) before anything is terminated."""
    p, first = _fleet_training_with_a_checkpoint(cloud)
    cloud.gpu_fault(first[1], "xid=79")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    doc = json.loads(out)
    assert doc["outcome"] == "succeeded" and doc["recoveries"] == 1, doc
    assert "host #1: Xid errors" in err and "Xid 79" in err and "replacing the whole fleet" in err, err
    assert doc["instances"][0]["ids"] == first and len(doc["instances"][1]["ids"]) == 2
    assert not _billing(cloud) and not [x for x in Ledger().records() if x.open]
    resumed = _both_halves_here(doc)
    log0 = (Path.cwd() / doc["fetched"]["log.instance1"]).read_text()  # fetched from node 0 before terminating
    assert f"step {resumed} saved" in log0 and f"step {STEPS} saved" not in log0, log0


def _fleet_training_with_a_checkpoint(cloud):
    """A `gpuops run --nodes 2 --recover 1` process whose job trains on both nodes (slowly) and whose checkpoint-2
    was fetched from node 0 meanwhile: (the process, the instance ids in rank order)."""
    cloud.capacity(TYPE, ["us-east-1"])
    _project(text=RESUMABLE)
    p = _cli(cloud, "--nodes", "2", "--launcher", "none", "--script", "train.py", "--fetch", "checkpoints", "--json",
             "--recover", "1", "--", str(STEPS), "6", "0.5")
    _wait(lambda: ((_records() or [{}])[0].get("checkpoint") or {}).get("step", 0) >= 2,
          what="checkpoint-2 fetched", p=p)
    first = list((_records()[0].get("instance") or {}).get("ids") or [])  # rank order
    assert len(first) == 2 and sorted(first) == sorted(i["id"] for i in _live(cloud))
    return p, first
