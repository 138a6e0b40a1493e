"""`gpuops run` end to end through the local Lambda emulator (a real HTTP server whose instances are real sandbox
hosts): up -> sync -> setup -> train -> watch -> fetch -> down, and every way it can end."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from support.cloud import TYPE, live_instances
from support.pipeline import FOREVER, SLOW, run_json, run_process, wait_stage, write_script


def test_whole_run_fetches_verified_checkpoints_and_terminates(cloud, gpuops):
    write_script()
    r = run_json(gpuops, cloud, "--script", "train.py", "--fetch", "checkpoints")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "succeeded" and doc["job"] == "succeeded"
    assert [s["stage"] for s in doc["stages"]] == ["up", "sync", "setup", "train", "watch", "fetch", "down"]
    assert all(s["ok"] for s in doc["stages"])
    for s in (1, 2, 3):
        assert (Path.cwd() / doc["fetched"]["checkpoints"] / f"step_{s}" / "model.bin").stat().st_size == 4096
    log = (Path.cwd() / doc["fetched"]["log"]).read_text()
    assert "step 3 loss 0.3333" in log and "/.venvs/gpuops/bin/python" in log  # trained in setup's environment
    assert not live_instances(cloud)  # terminated
    assert doc["total_cost"] > 0 and doc["overhead"]["after_job_s"] is not None


def test_failing_job_still_fetches_its_log_and_terminates(cloud, gpuops):
    write_script(text="print('about to fail', flush=True)\nraise SystemExit(3)\n")
    r = run_json(gpuops, cloud, "--script", "train.py")
    assert r.code == 1, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "failed" and doc["job"] == "failed"
    assert "about to fail" in (Path.cwd() / doc["fetched"]["log"]).read_text()
    assert not live_instances(cloud)


def test_launch_gate_refusal_terminates_the_instance(cloud, gpuops):
    write_script(text="def broken(:\n    pass\n")
    r = run_json(gpuops, cloud, "--script", "train.py")
    assert r.code == 1, r.all
    doc = json.loads(r.out)
    train = next(s for s in doc["stages"] if s["stage"] == "train")
    assert train["ok"] is False and "watch" not in [s["stage"] for s in doc["stages"]]
    assert "not launched" in r.err
    assert not live_instances(cloud)


def test_a_fetch_name_never_created_is_said_and_nothing_is_kept_for_it(cloud, gpuops):
    write_script()  # a fetch that fails keeps the instance: tests/cloud/test_money_unbilled_e2e.py
    r = run_json(gpuops, cloud, "--script", "train.py", "--fetch", "no-such-folder")
    assert r.code == 1, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "failed" and doc["job"] == "succeeded"  # what was asked for did not come back
    assert "KEPT" not in r.err and "no-such-folder: nothing to fetch" in r.err and "never created" in r.err
    assert not live_instances(cloud)


def test_max_cost_stops_the_job_fetches_and_terminates(cloud, gpuops):
    write_script(text="import time\nwhile True:\n    print('step', flush=True)\n    time.sleep(0.5)\n")
    r = run_json(gpuops, cloud, "--script", "train.py", "--max-cost", "0.01")  # $2.49/h: about 15 s
    assert r.code == 1, r.all
    doc = json.loads(r.out)
    assert "--max-cost $0.01 reached" in doc["stop_reason"] and doc["job"] == "stopped"
    assert "step" in (Path.cwd() / doc["fetched"]["log"]).read_text()
    assert not live_instances(cloud)


def test_ctrl_c_once_detaches_twice_terminates(cloud, gpuops):
    write_script(text=FOREVER)
    p = run_process(cloud, "--script", "train.py")
    wait_stage("watch")
    time.sleep(1.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "detached" in err and "gpuops run --resume" in err
    assert len(live_instances(cloud)) == 1  # everything keeps running
    # again, and this time twice: stop, fetch what exists, terminate
    p = run_process(cloud, "--script", "train.py", "--name", "twice", "--json")
    time.sleep(0.5)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the second run's own watch stage
        docs = [json.loads(f.read_text()) for f in (Path.cwd() / "runs" / "pipelines").glob("twice-*.json")]
        if docs and (docs[0]["stages"].get("watch") or {}).get("started"):
            break
        time.sleep(0.2)
    time.sleep(1.5)
    p.send_signal(signal.SIGINT)
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    doc = json.loads(out)
    assert doc["stop_reason"] == "interrupted twice" and doc["job"] == "stopped", err
    assert len(live_instances(cloud)) == 1  # only the first (detached) run's instance is left
    for inst in live_instances(cloud):
        gpuops("down", inst["name"] or "", "--yes")


def test_resume_after_the_local_process_is_killed(cloud, gpuops):
    write_script(text=SLOW)
    p = run_process(cloud, "--script", "train.py", "--fetch", "checkpoints")
    wait_stage("watch")
    time.sleep(1.0)
    p.kill()  # the laptop's process dies mid-training; the instance and the job go on
    p.communicate(timeout=30)
    assert len(live_instances(cloud)) == 1
    r = gpuops("run", "--resume", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "succeeded" and (Path.cwd() / doc["fetched"]["checkpoints"] / "final.bin").read_bytes() == b"x" * 100
    assert not live_instances(cloud)


def test_resume_after_a_kill_during_up_terminates_the_orphan_and_goes_on(cloud, gpuops):
    from gpuops.cloud.ledger import Ledger

    write_script()
    cloud.boot_seconds(60)  # the first instance stays booting: the process is killed before it writes the profile
    p = run_process(cloud, "--script", "train.py")
    try:
        deadline = time.monotonic() + 60
        while not any(r.instance_id for r in Ledger().records()):
            assert time.monotonic() < deadline and p.poll() is None, p.communicate()
            time.sleep(0.1)
    finally:
        p.kill()
        p.communicate(timeout=30)
    orphans = [i["id"] for i in live_instances(cloud)]
    assert len(orphans) == 1
    cloud.boot_seconds(0.5)
    r = gpuops("run", "--resume", "--json")
    assert r.code == 0, r.all
    assert f"was cut off before writing its profile: terminating instance {orphans[0]}" in r.err
    assert json.loads(r.out)["outcome"] == "succeeded"
    assert not live_instances(cloud)
    assert all(not x.open for x in Ledger().records())


TEMPLATE = """\
host: gpu.example.com   # never contacted: the launch replaces the host part
user: me
port: 2222
env:
  FOO: from-template
fetch:
  ckpt: out/ckpt
expect:
  gpu: H100
  gpu_count: 8
"""


def test_run_from_a_project_profile_carries_its_settings_onto_the_instance(cloud, gpuops):
    import yaml

    (Path.cwd() / "profiles").mkdir()
    (Path.cwd() / "profiles" / "tmpl.yaml").write_text(TEMPLATE)
    write_script(text="import os\nos.makedirs('out/ckpt', exist_ok=True)\n"
                  "open('out/ckpt/w.bin', 'wb').write(b'w' * 64)\nprint('FOO', os.environ['FOO'], flush=True)\n")
    r = run_json(gpuops, cloud, "--script", "train.py", "--from", "tmpl", "--fetch", "ckpt")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert "FOO from-template" in (Path.cwd() / doc["fetched"]["log"]).read_text()  # the template's env
    assert doc["fetched"]["ckpt"] == f"runs/{doc['run']}/ckpt"  # the run's own folder
    assert (Path.cwd() / doc["fetched"]["ckpt"] / "w.bin").read_bytes() == b"w" * 64  # its fetch: map, verified
    from gpuops.paths import config_dir

    p = yaml.safe_load((config_dir() / "profiles" / f"{doc['profile']}.yaml").read_text())
    assert p["host"].startswith("127.0.0.") and p["port"] == 22 and p["user"] != "me"  # the launch's host part
    # the type launched (its GPU, count and memory): the template's `gpu: H100` was a constraint it meets
    assert p["expect"] == {"gpu": "H100 PCIe", "gpu_count": 1, "gpu_memory_mib": 79112}
    assert p["env"] == {"FOO": "from-template"} and p["python"] == "~/.venvs/gpuops/bin/python"
    assert not live_instances(cloud)


def test_up_from_a_profile_that_does_not_exist_launches_nothing(cloud, gpuops):
    r = gpuops("up", "x", "--type", TYPE, "--key", str(cloud.key), "--yes", "--from", "nope")
    assert r.code == 2 and "Traceback" not in r.all, r.all
    assert cloud.launch_requests() == 0
