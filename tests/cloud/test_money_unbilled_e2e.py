"""Issue #28's "Money" items through the Lambda emulator: a corrupt ledger never blocks the way out (ls, down NAME,
down INSTANCE-ID find instances by their tags); refused options leave no run record; a failed job's folder that was
never created keeps nothing billing; every run's instance has a TTL it states."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuops.cloud.ledger import Ledger, ledger_path
from support.cloud import TYPE, cloud_up, live_instances


CORRUPT = {"empty": "", "truncated": '{"records": {"abc": {"launch_id": "abc", "prof', "null": "null",
           "records-list": '{"records": []}'}


@pytest.mark.parametrize("form", list(CORRUPT))
def test_a_corrupt_ledger_never_blocks_ls_or_down(cloud, gpuops, form):
    cloud.capacity(TYPE, ["us-east-1"])
    for name in ("one", "two"):
        r = cloud_up(gpuops, cloud, name, "--no-verify", "--ttl", "2h")
        assert r.code == 0, r.all
    (one, two) = sorted(live_instances(cloud), key=lambda i: i["name"])
    led = ledger_path()
    led.write_text(CORRUPT[form])
    r = gpuops("ls", "--json")
    assert r.code == 0, r.all
    assert "internal error" not in r.all and "Traceback" not in r.all
    assert r.err.count("was passed over") == 1, r.err
    assert {row["id"] for row in json.loads(r.out)["instances"]} >= {one["id"], two["id"]}
    aside = list(led.parent.glob("ledger.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == CORRUPT[form]  # kept, never lost
    led.write_text(CORRUPT[form])  # corrupt again: down NAME and down ID must pass over it too
    r = gpuops("down", "one", "--yes")
    assert r.code == 0, r.all
    assert r.err.count("was passed over") == 1 and "internal error" not in r.all
    led.write_text(CORRUPT[form])
    r = gpuops("down", two["id"], "--yes")
    assert r.code == 0, r.all
    assert r.err.count("was passed over") == 1 and "internal error" not in r.all
    assert not live_instances(cloud)
    assert len(list(led.parent.glob("ledger.json.corrupt-*"))) == 3


def _records() -> list:
    d = Path.cwd() / "runs" / "pipelines"
    return sorted(d.glob("*.json")) if d.is_dir() else []


def test_refused_options_launch_nothing_and_leave_no_record_to_resume(cloud, gpuops):
    (Path.cwd() / "train.py").write_text("print('hi')\n")
    for ask in (["--gpu", "H100:8", "--max-price", "1"], ["--gpu", "H100:3"], ["--type", TYPE, "--key", "/nope"]):
        r = gpuops("run", "--key", str(cloud.key), *ask, "--script", "train.py", "--yes")  # the last --key wins
        assert r.code in (2, 3), (ask, r.all)  # 3: the key file
        assert not _records(), ask
    assert cloud.launch_requests() == 0 and not live_instances(cloud)
    r = gpuops("run", "--resume", "--yes")
    assert r.code == 2 and "no unfinished run to resume" in r.err, r.all


# -- a failed job keeps nothing billing; every run's instance has a TTL it states --------------------------------------
def _run(gpuops, cloud, *extra):
    return gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", *extra)


def _ttl_tag(inst: dict) -> float:
    return float({t["key"]: t["value"] for t in inst["tags"]}["gpuops-ttl-deadline"])


def test_a_job_that_fails_before_creating_the_fetched_folder_is_terminated(cloud, gpuops):
    (Path.cwd() / "train.py").write_text("print('bad config', flush=True)\nraise SystemExit(1)\n")
    r = _run(gpuops, cloud, "--script", "train.py", "--fetch", "checkpoints")
    assert r.code == 1, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "failed" and doc["job"] == "failed", doc
    assert "KEPT" not in r.err and "never created" in r.err, r.err
    assert [s["stage"] for s in doc["stages"]][-1] == "down" and all(
        s["ok"] for s in doc["stages"] if s["stage"] in ("fetch", "down"))
    assert "bad config" in (Path.cwd() / doc["fetched"]["log"]).read_text()
    assert not live_instances(cloud)


def test_a_run_without_ttl_gets_the_default_one_stated_and_tagged(cloud, gpuops):
    import time

    (Path.cwd() / "train.py").write_text("print('ok')\n")
    t = time.time()
    r = _run(gpuops, cloud, "--script", "train.py", "--keep")
    assert r.code == 0, r.all
    assert "TTL 24h, the default" in r.err and "GPUOPS_RUN_TTL" in r.err
    (inst,) = live_instances(cloud)
    assert abs(_ttl_tag(inst) - (t + 86400)) < 60  # on the instance: any gpuops' reap judges it by this
    (rec,) = [x for x in Ledger().records() if x.open]
    assert abs(rec.ttl_deadline - _ttl_tag(inst)) < 1
    doc = json.loads(r.out)
    assert doc["outcome"] == "kept" and doc["ttl_s"] == 86400 and doc["ttl_deadline_at"]
    assert "--keep:" in r.err and "until its TTL" in r.err  # the deadline of what it leaves billing, stated
    assert gpuops("down", doc["profile"], "--yes").code == 0


def test_the_default_ttl_is_changed_in_dotenv_and_reap_ends_a_kept_instance_at_it(cloud, gpuops):
    (Path.cwd() / "train.py").write_text("print('ok')\n")
    (Path.cwd() / ".env").write_text("GPUOPS_RUN_TTL=2h\n")
    r = _run(gpuops, cloud, "--script", "train.py", "--keep")
    assert r.code == 0, r.all
    assert "TTL 2h (GPUOPS_RUN_TTL" in r.err
    (inst,) = live_instances(cloud)
    import time

    assert abs(_ttl_tag(inst) - (time.time() + 7200)) < 60
    (rec,) = [x for x in Ledger().records() if x.open]
    Ledger().update(rec.launch_id, ttl_deadline=time.time() - 1)  # two hours later (the tag says the same to reap)
    r = gpuops("reap", "--yes")
    assert r.code == 0, r.all
    assert not live_instances(cloud)


# a fetch that fails every attempt, whatever the load: a sparse file larger than any disk here (it takes no space on
# the instance; the fetch's room check refuses it before rsync). A file rewritten under the fetch passed sometimes
# when the rewriting process was starved of CPU.
TOO_BIG = """\
import os
os.makedirs("outputs", exist_ok=True)
with open("outputs/huge.dat", "wb") as f:
    f.truncate(1 << 42)  # 4 TiB (ext4 takes up to 16)
print("started", flush=True)
"""


def test_a_fetch_that_fails_keeps_the_instance_and_states_its_deadline(cloud, gpuops):
    (Path.cwd() / "train.py").write_text(TOO_BIG)
    r = _run(gpuops, cloud, "--script", "train.py", "--fetch", "outputs", "--ttl", "3h")
    assert r.code == 1, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "kept", doc
    assert "FETCH FAILED, so the instance is KEPT" in r.err and "until its TTL" in r.err, r.err
    assert "not enough local disk" in r.err, r.err
    (inst,) = live_instances(cloud)
    import time

    assert abs(_ttl_tag(inst) - (time.time() + 3 * 3600)) < 120
    assert gpuops("down", doc["profile"], "--yes").code == 0


# -- a revoked key: no statement the API did not make -----------------------------------------------------------------
def _training_proc(cloud, *args):
    import time

    from support.pipeline import FOREVER, run_process, wait_stage, write_script

    write_script(text=FOREVER)
    p = run_process(cloud, "--script", "train.py", "--json", *args)
    wait_stage("watch")
    time.sleep(1.5)
    (iid,) = [i["id"] for i in live_instances(cloud)]
    return p, iid


def test_a_revoked_key_is_never_read_as_the_instance_running(cloud):
    p, iid = _training_proc(cloud, "--unreachable", "6s")
    cloud.fault("revoked-key")  # every API request from now on: 401 global/invalid-api-key
    cloud.unreachable(iid)
    out, err = p.communicate(timeout=180)
    cloud.clear_faults()
    assert p.returncode == 3, err
    assert "shows the instance running" not in err, err
    assert "could not ask the Lambda API" in err and "is not known" in err, err
    assert json.loads(out)["outcome"] == "detached"


def test_a_preempted_instance_is_not_said_to_bill_when_the_key_is_revoked(cloud):
    p, iid = _training_proc(cloud)
    cloud.fault("revoked-key", after=1)  # the run's next question sees the preemption; the key dies after it
    cloud.preempt(iid)
    out, err = p.communicate(timeout=180)
    cloud.clear_faults()
    assert f"instance {iid} is preempted" in err, err
    assert "STILL BILLING" not in err, err
    assert f"the Lambda API last showed {iid} preempted at" in err and "not confirmed" in err, err
    assert "gpuops ls once the Lambda API answers" in err


# -- a preemption is the first thing said, not the setup error it causes -----------------------------------------------
def test_a_replacement_preempted_during_setup_says_the_preemption_first(cloud):
    import time

    from support.pipeline import wait_stage

    p, first = _training_proc(cloud, "--recover", "1")
    cloud.preempt(first)
    deadline = time.monotonic() + 120
    while True:  # the replacement is being set up
        doc = wait_stage("setup")
        if doc["attempts"] and doc["stages"].get("setup", {}).get("started"):
            break
        assert time.monotonic() < deadline, "the replacement never reached setup"
        time.sleep(0.1)
    (second,) = [i["id"] for i in live_instances(cloud) if i["id"] != first]
    cloud.preempt(second)
    out, err = p.communicate(timeout=180)
    after = err.split(f"launched instance {second}", 1)[1]  # what is said of the replacement
    said = [ln for ln in after.splitlines() if ln.startswith("error:")]
    assert said and f"instance {second} is preempted" in said[0], err
    assert "setup failed" not in err, err
    assert json.loads(out)["outcome"] == "lost"


# -- the pure half ----------------------------------------------------------------------------------------------------
def test_run_ttl_and_what_is_said_of_an_instance_not_terminated():
    from gpuops.errors import UsageError
    from gpuops.pipeline.money import billing_said, run_ttl

    assert run_ttl(None, {})[0] == 86400 and "the default" in run_ttl(None, {})[1]
    assert run_ttl(None, {"GPUOPS_RUN_TTL": "3h"})[0] == 10800 and run_ttl("2h", {"GPUOPS_RUN_TTL": "3h"})[0] == 7200
    with pytest.raises(UsageError) as e:
        run_ttl(None, {"GPUOPS_RUN_TTL": "soon"})
    assert e.value.message.startswith("GPUOPS_RUN_TTL=soon") and "--ttl 7d" in e.value.hint
    assert billing_said(["a"], {"a": ("active", 0.0)}, 2.49) == ("STILL BILLING $2.49/h", True)
    assert billing_said(["a"], {}, 2.49)[1] is True  # never shown ended: it may bill
    text, billing = billing_said(["a", "b"], {"a": ("preempted", 0.0), "b": ("terminated", 60.0)}, 4.98)
    assert not billing and "a preempted at 00:00:00 UTC, b terminated at 00:01:00 UTC" in text
    assert billing_said(["a", "b"], {"a": ("preempted", 0.0), "b": ("active", 0.0)}, 4.98)[1] is True
