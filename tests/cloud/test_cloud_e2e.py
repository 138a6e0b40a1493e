"""`gpuops up / ls / down / reap` end to end through the local Lambda API emulator: a real HTTP server following the
OpenAPI file whose instances are real sandbox hosts (sshd on 127.0.0.N:22, emulated nvidia-smi).

The emulator is gpuops.cloud.emulator (`gpuops sandbox up --cloud`); its knobs set capacity, faults, boot time and the
launch window."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from gpuops.cloud.ledger import Ledger
from support.cloud import API_KEY, TYPE, cloud_up, live_instances
from support.helpers import default_sigint


def _profile(name):
    from gpuops.paths import config_dir

    return yaml.safe_load((config_dir() / "profiles" / f"{name}.yaml").read_text())


def test_up_verifies_and_every_command_then_works_on_the_profile(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    r = cloud_up(gpuops, cloud, "box", "--ttl", "2h")
    assert r.code == 0, r.all
    assert "$2.49/hour" in r.err or "/hour" in r.err
    assert "PASS" in r.out  # verify's report
    p = _profile("box")
    assert p["host_key_policy"] == "strict" and p["region"] == "us-east-1" and p["instance_type"] == TYPE
    assert p["cloud"]["instance_id"] and p["cloud"]["launch_id"] and p["cloud"]["ttl_deadline"]
    r = gpuops("status", "-p", "box")
    assert r.code == 0, r.all
    assert "cost so far $" in r.out and "TTL left 1h59m" in r.out
    r = gpuops("down", "box", "--yes")
    assert r.code == 0, r.all


def test_capacity_only_in_the_second_region(cloud, gpuops):
    cloud.capacity(TYPE, ["us-west-2"])
    r = cloud_up(gpuops, cloud, "second", "--region", "us-east-1", "--region", "us-west-2", "--no-verify", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["region"] == "us-west-2"
    assert [i["region"]["name"] for i in live_instances(cloud)] == ["us-west-2"]
    assert cloud.launch_requests() == 1  # the region listing no capacity cost no launch request


def test_listed_but_failed_capacity_moves_to_the_next_region(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1", "us-west-2"], failing=["us-east-1"])
    r = cloud_up(gpuops, cloud, "listed", "--region", "us-east-1", "--region", "us-west-2", "--no-verify", "--json")
    assert r.code == 0, r.all
    assert "no capacity in us-east-1" in r.err
    assert json.loads(r.out)["region"] == "us-west-2"
    assert len(live_instances(cloud)) == 1


def test_no_capacity_anywhere_fails_at_once_and_closes_the_record(cloud, gpuops):
    cloud.capacity(TYPE, [])
    r = cloud_up(gpuops, cloud, "none", "--no-verify")
    assert r.code == 1 and "no capacity for gpu_1x_h100_pcie" in r.err and "--wait-for-capacity" in r.err
    assert cloud.launch_requests() == 0 and not live_instances(cloud)
    assert [x.state for x in Ledger().records()] == ["failed"]


def test_dropped_launch_response_is_adopted_not_duplicated(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    cloud.fault("drop-launch-response")
    r = cloud_up(gpuops, cloud, "dropped", "--no-verify", "--json")
    assert r.code == 0, r.all
    assert "adopted instance" in r.err
    live = live_instances(cloud)
    assert len(live) == 1 and live[0]["id"] == json.loads(r.out)["instance_id"]


def test_429_is_backed_off(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1", "us-west-2"], failing=["us-east-1"])
    cloud.launch_window(1.5)  # the emulator's one-launch-per-window rule, shortened from Lambda's 12 s
    r = cloud_up(gpuops, cloud, "limited", "--region", "us-east-1", "--region", "us-west-2", "--no-verify", "--json")
    assert r.code == 0, r.all
    assert "rate limited by the API (HTTP 429)" in r.err
    assert len(live_instances(cloud)) == 1


def test_ctrl_c_during_boot_leaves_no_untracked_instance(cloud, isolated):
    cloud.capacity(TYPE, ["us-east-1"])
    cloud.boot_seconds(60)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "gpuops", "up", "ctrlc", "--type", TYPE, "--key", str(cloud.key),
                          "--yes", "--no-verify"], env=env, cwd=isolated, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 30
        while not any(r.instance_id for r in Ledger().records()):
            assert time.monotonic() < deadline and p.poll() is None, p.communicate()
            time.sleep(0.1)
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert "interrupted: terminating instance" in err
    tracked = {r.instance_id for r in Ledger().records() if r.open}
    assert all(i["id"] in tracked for i in live_instances(cloud)), (cloud.instances(), Ledger().records())
    assert not live_instances(cloud)


def test_down_is_confirmed_and_forgets_the_host_key(cloud, gpuops):
    from gpuops.paths import known_hosts_file

    cloud.capacity(TYPE, ["us-east-1"])
    r = cloud_up(gpuops, cloud, "gone", "--no-verify", "--json")
    assert r.code == 0, r.all
    ip = json.loads(r.out)["host"]
    assert ip in known_hosts_file().read_text()
    r = gpuops("down", "gone", "--yes", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["status"] in ("terminating", "terminated") and doc["host_keys_forgotten"] == 1
    assert ip not in known_hosts_file().read_text()
    assert _profile("gone")["cloud"]["state"] == "gone" and not live_instances(cloud)
    assert all(not x.open for x in Ledger().records())
    r = gpuops("down", "gone", "--yes")
    assert r.code == 0 and "already" in r.err


def test_a_host_presenting_another_key_than_pinned_is_refused(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    cloud.fault("ignore-user-data-host-key")
    r = cloud_up(gpuops, cloud, "mitm", "--no-verify")
    assert r.code == 3, r.all
    assert "presented a host key other than the one gpuops generated and pinned" in r.err
    assert "terminating instance" in r.err and not live_instances(cloud)


def test_ttl_expiry_is_shown_by_ls_and_acted_on_by_reap(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    r = cloud_up(gpuops, cloud, "short", "--no-verify", "--ttl", "1s", "--json")
    assert r.code == 0, r.all
    iid = json.loads(r.out)["instance_id"]
    time.sleep(1.5)
    r = gpuops("ls")
    assert r.code == 0, r.all
    assert iid in r.out and "short" in r.out
    assert f"instance {iid} (profile short) is past its limit: TTL passed" in r.err
    r = gpuops("status", "-p", "short")
    assert "is past its limit" in r.err  # every command on the profile warns
    r = gpuops("reap", "--yes", "--json")
    assert r.code == 0, r.all
    assert [x["id"] for x in json.loads(r.out)["terminated"]] == [iid]
    assert not live_instances(cloud) and _profile("short")["cloud"]["state"] == "gone"
    r = gpuops("ls", "--json")
    assert not json.loads(r.out)["warnings"]


def test_api_key_is_absent_from_every_output_and_file(cloud, gpuops, tmp_path):
    cloud.capacity(TYPE, ["us-east-1"])
    outputs = [cloud_up(gpuops, cloud, "secret", "--ttl", "1h"), gpuops("--debug", "ls"), gpuops("ls", "--json"),
               gpuops("cloud", "types", "--json"), gpuops("cloud", "keys"), gpuops("status", "-p", "secret"),
               gpuops("--debug", "down", "secret", "--yes"), gpuops("--debug", "up", "x", "--type", "gpu_bogus",
                                                                   "--key", str(cloud.key), "--yes")]
    assert outputs[0].code == 0, outputs[0].all
    assert outputs[-1].code == 2
    for r in outputs:
        assert API_KEY not in r.all
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert any(f.name == "ledger.json" for f in files) and any(f.name == "secret.yaml" for f in files)
    for f in files:
        assert API_KEY.encode() not in f.read_bytes(), f


def test_wait_for_capacity_rereads_until_it_appears(cloud, gpuops):
    cloud.capacity(TYPE, [])
    cloud.clock_rate(60)  # the emulator's minute passes in a second
    cloud.capacity_later(TYPE, ["us-west-1"], after=60)
    r = cloud_up(gpuops, cloud, "patient", "--no-verify", "--wait-for-capacity", "20s", "--json")
    assert r.code == 0, r.all
    assert re.search(r"waiting for capacity since \d\d:\d\d:\d\d \(\d+s\): gpu_1x_h100_pcie in any region; "
                     r"checking again in [\d.]+s \(\d+s left\)", r.err), r.err
    assert json.loads(r.out)["region"] == "us-west-1"
    assert cloud.launch_requests() == 1  # no request while nothing listed capacity


def test_guard_on_instance_terminates_it_at_the_ttl(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    r = cloud_up(gpuops, cloud, "guarded", "--no-verify", "--ttl", "3s", "--guard", "on-instance", "--json")
    assert r.code == 0, r.all
    assert "guard installed on the instance" in r.err
    iid = json.loads(r.out)["instance_id"]
    deadline = time.monotonic() + 20
    while any(i["id"] == iid for i in live_instances(cloud)):
        assert time.monotonic() < deadline, "the on-instance guard did not terminate the instance"
        time.sleep(0.3)
    assert API_KEY not in r.all


def test_reap_confirms_idleness_on_the_host_before_terminating(cloud, gpuops, isolated):
    cloud.capacity(TYPE, ["us-east-1"])
    r = cloud_up(gpuops, cloud, "idle", "--no-verify", "--idle", "1s", "--json")
    assert r.code == 0, r.all
    iid = json.loads(r.out)["instance_id"]
    (isolated / "job.sh").write_text("#!/bin/sh\nsleep 60\n")
    r = gpuops("train", "-p", "idle", "--script", "job.sh")
    assert r.code == 0, r.all
    time.sleep(1.5)
    r = gpuops("reap", "--yes", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert not doc["terminated"] and doc["skipped"][0]["id"] == iid  # a run is running: busy, kept
    assert "idle not confirmed" in doc["skipped"][0]["why"]
    r = gpuops("stop", "-p", "idle", "--grace", "0.1")
    assert r.code in (0, 130), r.all
    time.sleep(1.5)
    r = gpuops("reap", "--yes", "--json")
    assert [x["id"] for x in json.loads(r.out)["terminated"]] == [iid], r.all
    assert not live_instances(cloud)


def test_trust_new_accepts_another_key_and_prints_it(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    cloud.fault("ignore-user-data-host-key")
    r = cloud_up(gpuops, cloud, "tofu", "--no-verify", "--trust-new")
    assert r.code == 0, r.all
    assert "--trust-new" in r.err and "trusted new host key for 127.0.0." in r.err and "SHA256:" in r.err
    r = gpuops("status", "-p", "tofu")
    assert r.code == 0, r.all  # the key it presented is now the recorded one


def test_an_instance_is_judged_by_the_key_pinned_at_its_launch_not_by_a_stale_entry_for_its_address(cloud, gpuops):
    """Issue 42: Lambda reuses addresses. A known_hosts entry for the same address left by an instance that is gone
    (here written after the pin, as a second gpuops that had met the gone instance could) neither blocks the new
    instance nor is trusted for it: the profile `up` wrote carries its instance's key (host_key:), and that key alone
    is checked, by gpuops' own connection and by OpenSSH (rsync, gpuops ssh). Before: exit 3, 'has CHANGED'."""
    from gpuops.paths import known_hosts_file
    from gpuops.remote.hostkeys import host_id

    cloud.capacity(TYPE, ["us-east-1"])
    r = cloud_up(gpuops, cloud, "reused", "--no-verify", "--json")
    assert r.code == 0, r.all
    p = _profile("reused")
    assert p["host_key"].startswith("ssh-ed25519 "), p
    stale = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK9X8ZP2b9c0S4L0H7r5h3kqf3cVxZx7HvCz1l2Kk1yY"
    f = known_hosts_file()
    f.write_text("".join(ln + "\n" for ln in f.read_text().splitlines() if not ln.startswith(p["host"] + " "))
                 + f"{host_id(p['host'], 22)} {stale}\n")
    r = gpuops("status", "-p", "reused")
    assert r.code == 0 and "CHANGED" not in r.all, r.all
    r = gpuops("ssh", "-p", "reused", "--", "true")  # OpenSSH itself (its output is not captured here)
    assert r.code == 0, r.all
    assert stale in f.read_text()  # left as it was: gpuops never trusts it for this instance, nor removes it
    # the other way round: a profile whose pin is not what the host presents is refused, whatever known_hosts says
    text = (Path(p_file := _profile_file("reused"))).read_text().replace(p["host_key"], stale)
    Path(p_file).write_text(text)
    f.write_text(f"{host_id(p['host'], 22)} {p['host_key']}\n")
    r = gpuops("status", "-p", "reused")
    assert r.code == 3 and "not the one pinned at its launch" in r.all, r.all
    r = gpuops("ssh", "-p", "reused", "--", "true")
    assert r.code == 3, r.all
    assert gpuops("down", "reused", "--yes").code in (0, 1)


def _profile_file(name):
    from gpuops.paths import config_dir

    return config_dir() / "profiles" / f"{name}.yaml"


def test_down_fetch_first_pulls_checkpoints_before_terminating(cloud, gpuops, isolated):
    cloud.capacity(TYPE, ["us-east-1"])
    r = cloud_up(gpuops, cloud, "keepdata", "--no-verify", "--json")
    assert r.code == 0, r.all
    remote = cloud.home(json.loads(r.out)["instance_id"]) / isolated.name / "checkpoints" / "global_step_7"
    remote.mkdir(parents=True)
    data = os.urandom(4096)
    (remote / "model.bin").write_bytes(data)
    r = gpuops("down", "keepdata", "--fetch-first", "--yes", "--json")
    assert r.code == 0, r.all
    assert json.loads(r.out)["fetched"] == ["checkpoints"]
    assert (isolated / "checkpoints" / "global_step_7" / "model.bin").read_bytes() == data
    assert not live_instances(cloud) and not remote.exists()  # termination wiped the disk: the fetch came first


def test_quota_exceeded_fails_at_once_with_lambdas_message(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1", "us-west-2"])
    cloud.fault("quota-exceeded")
    r = cloud_up(gpuops, cloud, "quota", "--no-verify")
    assert r.code == 1, r.all
    assert "global/quota-exceeded: Quota exceeded." in r.err and "hint: Contact Support to increase your quota." in r.err
    assert cloud.launch_requests() == 1 and [x.state for x in Ledger().records()] == ["failed"]


def test_preempted_while_booting_fails_at_once(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    cloud.boot_seconds(30)
    cloud.fault("preempt-while-booting")
    t = time.monotonic()
    r = cloud_up(gpuops, cloud, "preempted", "--no-verify")
    assert r.code == 1 and "became preempted while booting" in r.err, r.all
    assert time.monotonic() - t < 10


def test_up_json_is_one_document_with_the_verify_report_inside(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    r = cloud_up(gpuops, cloud, "jsonbox", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)  # one document, nothing else on stdout
    assert doc["verified"] is True and doc["verify"]["profile"] == "jsonbox" and doc["verify"]["verdict"] in ("pass", "warn")
    assert doc["api_calls"] >= 4 and doc["host_key"].startswith("SHA256:")
