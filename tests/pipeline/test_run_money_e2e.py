"""`gpuops run` and money, second pass (issue #21), through the Lambda emulator and real `gpuops` processes: the budget
from the launch on, an instance ended under the run (terminated elsewhere, preempted, its IP handed to another
machine), a dropped connection, SIGTERM/SIGHUP, a refused terminate, --resume with new options, --name checked."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx

from gpuops.cloud.ledger import Ledger
from support.cloud import API_KEY, TYPE
from support.cloud import live_instances
from support.pipeline import FOREVER, SLOW, TRAIN, run_json, run_process, wait_stage, write_script


def _record(doc_id: str) -> dict:
    return json.loads((Path.cwd() / "runs" / "pipelines" / f"{doc_id}.json").read_text())


def _only_record() -> dict:
    (f,) = list((Path.cwd() / "runs" / "pipelines").glob("*.json"))
    return json.loads(f.read_text())


def _launch_other(cloud) -> str:
    """Another party's new machine, launched through the API (it gets whatever address the emulator gives)."""
    h = {"Authorization": f"Bearer {API_KEY}"}
    key = httpx.get(cloud.url + "/ssh-keys", headers=h).json()["data"][0]["name"]
    got = httpx.post(cloud.url + "/instance-operations/launch", headers=h, json={
        "region_name": "us-east-1", "instance_type_name": TYPE, "ssh_key_names": [key]})
    got.raise_for_status()
    return got.json()["data"]["instance_ids"][0]


def _training(cloud, text: str, *args: str, settle: float = 1.5):
    """A real `gpuops run` process whose job is training: (the process, its instance id)."""
    write_script(text=text)
    p = run_process(cloud, "--script", "train.py", *args)
    wait_stage("watch")
    time.sleep(settle)
    (iid,) = [i["id"] for i in live_instances(cloud)]
    return p, iid


def _killed_while_training(cloud, *args: str) -> str:
    """The laptop's process dies mid-training (kill -9); the instance and the job go on. Its instance id."""
    p, iid = _training(cloud, SLOW, *args, settle=1.0)
    p.kill()
    p.communicate(timeout=30)
    return iid


def _address(cloud, iid: str) -> str:
    return next(i["_address"] for i in cloud.instances() if i["id"] == iid)


# -- --max-cost from the launch on -----------------------------------------------------------------------------------
def test_max_cost_is_checked_while_booting(cloud, gpuops):
    big = "gpu_8x_h100_sxm5"  # $23.92/h: $0.01 in 1.5 s
    cloud.capacity(big, ["us-east-1"])
    cloud.boot_seconds(10)
    write_script()
    t = time.monotonic()
    r = gpuops("run", "--type", big, "--script", "train.py", "--key", str(cloud.key), "--yes", "--json",
               "--max-cost", "0.01")
    assert r.code == 1, r.all
    doc = json.loads(r.out)
    assert "--max-cost $0.01 reached" in doc["stop_reason"], doc
    assert [s["stage"] for s in doc["stages"]] == ["up"]  # no setup, sync or launch after the budget is spent
    assert time.monotonic() - t < 10 and not live_instances(cloud)
    assert not [x for x in Ledger().records() if x.open]


# -- an instance ended under the run ---------------------------------------------------------------------------------
def test_instance_terminated_elsewhere_and_its_ip_handed_on_is_said_at_once(cloud):
    p, iid = _training(cloud, FOREVER, "--fetch", "checkpoints", "--json")
    ip = _address(cloud, iid)
    cloud.set_status(iid, "terminated")  # `gpuops reap` on another machine, at its TTL
    cloud.fault("recycle-ip")
    other = _launch_other(cloud)  # a stranger's new machine on the same IP
    assert _address(cloud, other) == ip
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1, err
    assert f"instance {iid} is terminated" in err and "checkpoints not fetched" in err, err
    assert "gpuops trust" not in out + err and "host key" not in err.split("written")[-1], err
    doc = json.loads(out)  # the summary is there
    assert doc["outcome"] == "lost" and doc["job"] == "lost"
    assert next(s for s in doc["stages"] if s["stage"] == "down")["ok"] is True
    assert not [x for x in Ledger().records() if x.open]
    assert [i["id"] for i in live_instances(cloud)] == [other]  # the stranger's machine is left alone


def test_preempted_mid_training_is_said_at_once(cloud):
    p, iid = _training(cloud, FOREVER, "--json")
    t = time.monotonic()
    cloud.preempt(iid)
    out, err = p.communicate(timeout=120)
    assert time.monotonic() - t < 30, err  # not 300 s of silent reconnecting
    assert p.returncode == 1 and f"instance {iid} is preempted" in err, err
    assert "gave up reconnecting" not in err and json.loads(out)["outcome"] == "lost"


def test_resume_of_a_run_whose_instance_was_ended_meanwhile_finishes(cloud, gpuops):
    iid = _killed_while_training(cloud, "--fetch", "checkpoints")
    rec = _only_record()
    assert gpuops("down", rec["profile"], "--yes").code == 0  # from another shell
    cloud.fault("recycle-ip")
    _launch_other(cloud)
    r = gpuops("run", "--resume", "--json")
    assert r.code == 1, r.all
    # `gpuops down` from this machine is found in the ledger: the user ended it, the run ends so (issue #27)
    assert "gpuops trust" not in r.all and f"instance {iid} was terminated by `gpuops down`" in r.err, r.all
    assert json.loads(r.out)["outcome"] == "ended"
    r = gpuops("run", "--resume")
    assert r.code == 2 and "no unfinished run" in r.err  # finished: nothing left to resume


def test_a_dropped_connection_asks_the_api_and_says_so(cloud):
    p, iid = _training(cloud, SLOW, "--fetch", "checkpoints", "--json", settle=2.0)
    assert cloud.drop_connections(iid) >= 1
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    assert "the Lambda API shows the instance running: reconnecting" in err and "reconnected" in err, err
    assert json.loads(out)["outcome"] == "succeeded"


# -- signals ---------------------------------------------------------------------------------------------------------
def test_sigterm_during_up_terminates_and_sighup_while_training_detaches_at_once(cloud, gpuops):
    write_script(text=FOREVER)
    cloud.boot_seconds(60)
    p = run_process(cloud, "--script", "train.py", "--name", "term")
    deadline = time.monotonic() + 60
    while not any(r.instance_id for r in Ledger().records()):
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "Traceback" not in err, err
    assert "interrupted (SIGTERM) while bringing the instance up" in err and not live_instances(cloud), err

    cloud.boot_seconds(0.5)
    p = run_process(cloud, "--script", "train.py", "--name", "hup", "--json")
    deadline = time.monotonic() + 120
    while True:
        docs = [json.loads(f.read_text()) for f in (Path.cwd() / "runs" / "pipelines").glob("hup-*.json")]
        if docs and (docs[0]["stages"].get("watch") or {}).get("started"):
            break
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()
        time.sleep(0.2)
    time.sleep(1.0)
    t = time.monotonic()
    p.send_signal(signal.SIGHUP)  # the terminal closed
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and time.monotonic() - t < 8, err  # no wait for a second Ctrl-C nobody can press
    assert "detached (SIGHUP)" in err and json.loads(out)["outcome"] == "detached", err
    assert len(live_instances(cloud)) == 1
    assert gpuops("down", docs[0]["profile"], "--yes").code == 0 and not live_instances(cloud)


# -- the end of a run ------------------------------------------------------------------------------------------------
def test_a_refused_terminate_at_the_end_says_what_bills_and_how_to_end_it(cloud, gpuops):
    write_script()
    cloud.fault("5xx", times=None, path="/instance-operations/terminate", error="unknown")
    r = run_json(gpuops, cloud, "--script", "train.py")
    assert r.code == 1, r.all
    doc = json.loads(r.out)  # the summary, whatever happened
    (iid,) = [i["id"] for i in live_instances(cloud)]
    assert doc["outcome"] == "kept" and next(s for s in doc["stages"] if s["stage"] == "down")["ok"] is False
    assert f"could not terminate instance {iid}" in r.err and "STILL BILLING $2.49/h" in r.err, r.err
    assert f"gpuops down {doc['profile']}" in r.err
    cloud.clear_faults()
    r = gpuops("run", "--resume", "--id", doc["run"], "--json")  # the run's own way to finish it
    assert r.code == 0, r.all
    assert json.loads(r.out)["outcome"] == "succeeded" and not live_instances(cloud)


def test_resume_takes_a_new_fetch_and_refuses_what_describes_a_new_run(cloud, gpuops):
    _killed_while_training(cloud)  # nothing named to fetch
    r = gpuops("run", "--resume", "--type", TYPE)
    assert r.code == 2 and "--type" in r.err, r.all
    r = gpuops("run", "--resume", "--fetch", "checkpoints", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["fetched"]["checkpoints"] and (Path.cwd() / doc["fetched"]["checkpoints"] / "final.bin").read_bytes() == b"x" * 100
    assert not live_instances(cloud)


def test_summary_after_resume_covers_the_whole_run(cloud, gpuops):
    _killed_while_training(cloud)
    first = _only_record()
    time.sleep(3.0)  # the laptop is closed a while; the instance bills on
    r = gpuops("run", "--resume", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    rec = _record(doc["run"])
    assert rec["stages"]["watch"]["started"] == first["stages"]["watch"]["started"]
    wall = rec["stages"]["down"]["ended"] - rec["stages"]["up"]["started"]
    assert sum(s["duration_s"] for s in doc["stages"]) >= wall - 1.0, (doc["stages"], wall)


def test_run_name_is_checked_before_anything_is_written(cloud, gpuops):
    write_script(text=TRAIN)
    r = gpuops("run", "--type", TYPE, "--script", "train.py", "--key", str(cloud.key), "--yes", "--name", "../../x")
    assert r.code == 2 and "--name" in r.err, r.all
    assert not list(Path.cwd().parent.rglob("x-*.json")) and cloud.launch_requests() == 0
