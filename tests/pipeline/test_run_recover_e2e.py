"""`gpuops run --recover N` end to end through the Lambda emulator and real `gpuops` processes (issue #24, recovery):
an instance preempted mid-training, or whose GPU falls off the bus (an Xid 79 in its kernel log), or that stops
answering, is replaced and the job resumed from the newest checkpoint fetched and verified; `--recover 0` ends as
before; a replacement that cannot be launched leaves nothing billing; Ctrl-C and --resume during a recovery."""
from __future__ import annotations

import json
import signal
from pathlib import Path

from gpuops.cloud.ledger import Ledger
from support.cloud import TYPE, live_instances
from support.pipeline import run_process, write_script
from support.recovery import RESUMABLE, STEPS, billing, finished_on_a_second_instance, records, training_with_a_checkpoint, wait_run


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
    p, first = training_with_a_checkpoint(cloud, "--recover", "2")
    cloud.preempt(first)
    doc, err = finished_on_a_second_instance(p, first, cloud)
    assert f"instance {first} is preempted" in err and "replacing the instance (recovery 1 of 2)" in err, err
    assert doc["instances"][0]["ended"].startswith(f"instance {first} is preempted")
    _both_halves_here(doc)
    stages = [(s["instance"], s["stage"]) for s in doc["stages"]]
    assert (1, "recover") in stages and (2, "push") in stages and (2, "up") in stages, stages


def test_xid_79_mid_training_recovers_the_same_way(cloud):
    p, first = training_with_a_checkpoint(cloud, "--recover", "1")
    cloud.gpu_fault(first, "xid=79")  # the GPU falls off the bus: the job may hang, the API still says active
    doc, err = finished_on_a_second_instance(p, first, cloud)
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
    write_script(text=RESUMABLE)
    p = run_process(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--", "2", "8", "0")
    (iid,) = wait_run(lambda: [i["id"] for i in live_instances(cloud)], what="the instance", p=p)
    wait_run(lambda: ((records() or [{}])[0].get("stages") or {}).get("watch"), what="training", p=p)
    cloud.gpu_fault(iid, "xid=79")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    doc = json.loads(out)
    assert "Xid 79" in err and "the GPU is no longer usable" in err and "--recover" in err, err
    assert doc["outcome"] == "succeeded" and doc["recoveries"] == 0 and len(doc["instances"]) == 1
    # nothing fetched while training: the newest checkpoint is judged once, after the job succeeded
    assert doc["checkpoints"]["evidence"] == ["succeeded"] and cloud.launch_requests() == 1
    assert not [e for e in records()[0]["vouched"] if e["evidence"] != ["succeeded"]]

    p = run_process(cloud, "--script", "train.py", "--fetch", "checkpoints", "--json", "--recover", "0", "--", "30", "1",
             "0")
    (iid,) = wait_run(lambda: [i["id"] for i in billing(cloud)], what="the instance", p=p)
    wait_run(lambda: any((r.get("stages") or {}).get("watch") and r["outcome"] == "running" for r in records()),
          what="training", p=p)
    cloud.preempt(iid)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1 and f"instance {iid} is preempted" in err and "replacing" not in err, err
    assert json.loads(out)["outcome"] == "lost" and cloud.launch_requests() == 2


def test_a_replacement_that_cannot_launch_ends_with_nothing_billing(cloud):
    p, first = training_with_a_checkpoint(cloud, "--recover", "2")
    cloud.capacity(TYPE, [])  # no capacity anywhere any more
    cloud.preempt(first)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1, err
    doc = json.loads(out)
    assert doc["outcome"] == "failed" and doc["stop_reason"].startswith("recovery failed: no replacement instance")
    assert "no capacity" in doc["stop_reason"] and "nothing is left billing" in err, err
    assert not billing(cloud) and not [x for x in Ledger().records() if x.open]
    assert (Path.cwd() / doc["checkpoint"] / "model.bin").is_file()  # what was fetched and verified stays here
    assert "Traceback" not in err


def test_sigterm_while_replacing_then_resume_finishes(cloud, gpuops):
    p, first = training_with_a_checkpoint(cloud, "--recover", "1")
    cloud.fault("slow-answer", path="/instance-operations/terminate", seconds=4)  # a window inside `recover`
    cloud.gpu_fault(first, "xid=79")
    wait_run(lambda: any((r.get("stages") or {}).get("recover") for r in records()), what="the recovery", p=p)
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
    assert not billing(cloud) and not [x for x in Ledger().records() if x.open]


def test_ctrl_c_while_the_replacement_boots_terminates_it_and_resume_finishes(cloud, gpuops):
    p, first = training_with_a_checkpoint(cloud, "--recover", "1")
    cloud.boot_seconds(60)
    cloud.preempt(first)
    wait_run(lambda: [i for i in billing(cloud) if i["id"] != first], what="the replacement's launch", p=p)
    p.send_signal(signal.SIGINT)  # _cli started it with default_sigint: Ctrl-C works in a suite run with it ignored
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "interrupted while bringing the instance up" in err, err
    assert not billing(cloud) and not [x for x in Ledger().records() if x.open]  # nothing left billing
    cloud.boot_seconds(0.5)
    r = gpuops("run", "--resume", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "succeeded" and doc["recoveries"] == 1
    _both_halves_here(doc)
    assert not billing(cloud)


def test_an_instance_unreachable_past_the_limit_is_replaced(cloud):
    p, first = training_with_a_checkpoint(cloud, "--recover", "1", "--unreachable", "5s")
    cloud.unreachable(first)  # sshd gone, the job running, the API saying active
    doc, err = finished_on_a_second_instance(p, first, cloud)
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
    assert not billing(cloud) and not [x for x in Ledger().records() if x.open]
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
    assert not billing(cloud) and not [x for x in Ledger().records() if x.open]
    resumed = _both_halves_here(doc)
    log0 = (Path.cwd() / doc["fetched"]["log.instance1"]).read_text()  # fetched from node 0 before terminating
    assert f"step {resumed} saved" in log0 and f"step {STEPS} saved" not in log0, log0


def _fleet_training_with_a_checkpoint(cloud):
    """A `gpuops run --nodes 2 --recover 1` process whose job trains on both nodes (held at step 2), checkpoint-2
    was fetched from node 0 meanwhile: (the process, the instance ids in rank order)."""
    cloud.capacity(TYPE, ["us-east-1"])
    write_script(text=RESUMABLE)
    p = run_process(cloud, "--nodes", "2", "--launcher", "none", "--script", "train.py", "--fetch", "checkpoints", "--json",
             "--recover", "1", "--", str(STEPS), "0.5", "0.5", "2")  # both nodes' first jobs hold at checkpoint-2
    wait_run(lambda: ((records() or [{}])[0].get("checkpoint") or {}).get("step", 0) >= 2,
          what="checkpoint-2 fetched", p=p)
    first = list((records()[0].get("instance") or {}).get("ids") or [])  # rank order
    assert len(first) == 2 and sorted(first) == sorted(i["id"] for i in live_instances(cloud))
    return p, first
