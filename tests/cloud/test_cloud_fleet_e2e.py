"""`gpuops up NAME --nodes N` and `gpuops down NAME` for a fleet, through the Lambda emulator (a real HTTP server whose
instances are real sandbox hosts, each on its own 127.0.0.N:22)."""
from __future__ import annotations

import json

import pytest
import yaml

from gpuops.cloud.ledger import Ledger
from support.cloud import TYPE
from support.schemas import valid


def _live(cloud):
    return [i for i in cloud.instances() if i["status"] not in ("terminated", "terminating", "preempted")]


def _profile(name):
    from gpuops.paths import config_dir

    return yaml.safe_load((config_dir() / "profiles" / f"{name}.yaml").read_text())


def _up(gpuops, cloud, name, *extra):
    return gpuops("up", name, "--type", TYPE, "--key", str(cloud.key), "--yes", *extra)


def test_up_nodes_writes_a_fleet_profile_every_command_uses_and_down_ends_them_all(cloud, gpuops):
    from gpuops.paths import known_hosts_file

    cloud.capacity(TYPE, ["us-east-1", "us-west-2"])
    r = _up(gpuops, cloud, "pair", "--nodes", "2", "--ttl", "2h", "--json")
    assert r.code == 0, r.all
    assert "launch 2 x gpu_1x_h100_pcie" in r.err and "= $4.98/hour" in r.err
    doc = json.loads(r.out)
    nodes = doc["nodes"]
    assert [n["rank"] for n in nodes] == [0, 1] and doc["price_per_hour_total"] == pytest.approx(4.98)
    live = {i["id"]: i for i in _live(cloud)}
    assert set(live) == {n["instance_id"] for n in nodes}
    assert {i["region"]["name"] for i in live.values()} == {doc["region"]}  # every node in one region
    assert doc["verify"]["fleet"]["verdict"] == "pass", doc["verify"]["fleet"]  # the fleet verify, as one document
    assert [h["code"] for h in doc["verify"]["hosts"]] == [0, 0]

    p = _profile("pair")
    assert "host" not in p and [h["host"] for h in p["hosts"]] == [n["host"] for n in nodes]
    assert [h["private_ip"] for h in p["hosts"]] == [live[n["instance_id"]]["private_ip"] for n in nodes]
    assert [x["instance_id"] for x in p["cloud"]["nodes"]] == [n["instance_id"] for n in nodes]
    assert p["cloud"]["instance_id"] == nodes[0]["instance_id"] and p["host_key_policy"] == "strict"
    kh = known_hosts_file().read_text()
    assert all(n["host"] in kh for n in nodes)
    recs = [x for x in Ledger().records() if x.open]
    assert sorted(x.instance_id for x in recs) == sorted(live)  # one launch record per node, each with its TTL
    assert len({x.ttl_deadline for x in recs}) == 1 and recs[0].ttl_deadline

    # every command works on the fleet profile: status on every host, ls shows both under the profile
    r = gpuops("status", "-p", "pair")
    assert r.code == 0, r.all
    assert "host #0" in r.out and "host #1" in r.out
    assert "2 instances (host #0:" in r.out and "$4.98/h" in r.out  # the cost guard counts the whole fleet
    r = gpuops("ls", "--json")
    rows = [x for x in json.loads(r.out)["instances"] if x["profile"] == "pair"]
    assert len(rows) == 2 and all(x["managed"] for x in rows)
    assert sorted(x["node"] for x in rows) == [0, 1]
    r = gpuops("ls")
    assert "pair#0" in r.out and "pair#1" in r.out

    r = gpuops("down", "pair", "--yes", "--json")
    assert r.code == 0, r.all
    d = json.loads(r.out)
    assert d["instance_ids"] == [n["instance_id"] for n in nodes] and d["host_keys_forgotten"] == 2
    assert all(s in ("terminating", "terminated") for s in d["statuses"])
    assert not _live(cloud) and _profile("pair")["cloud"]["state"] == "gone"
    assert all(not x.open for x in Ledger().records())
    kh = known_hosts_file().read_text()
    assert not any(n["host"] in kh for n in nodes)
    r = gpuops("down", "pair", "--yes")
    assert r.code == 0 and "already ended" in r.err


def test_a_node_without_capacity_in_the_first_nodes_region_ends_the_whole_fleet(cloud, gpuops):
    cloud.capacity(TYPE, ["us-west-2"])
    cloud.set_capacity(TYPE, "us-east-1", 1)  # room for one node only where the first one lands
    r = _up(gpuops, cloud, "short", "--nodes", "2", "--region", "us-east-1", "--no-verify")
    assert r.code == 1, r.all
    assert "no capacity for gpu_1x_h100_pcie in us-east-1" in r.err  # not another region: the nodes must meet
    assert "bring-up failed: terminating instance" in r.err
    assert not _live(cloud)
    states = sorted(x.state for x in Ledger().records())
    assert states == ["failed", "terminated"], states
    assert cloud.launch_requests() == 2  # the second one, refused for capacity, in us-east-1 only


def test_down_of_a_fleet_with_one_node_already_gone_ends_the_other(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    r = _up(gpuops, cloud, "half", "--nodes", "2", "--no-verify", "--json")
    assert r.code == 0, r.all
    nodes = json.loads(r.out)["nodes"]
    cloud.preempt(nodes[1]["instance_id"])  # the provider ended node 1 on its own
    r = gpuops("down", "half", "--yes", "--json")
    assert r.code == 0, r.all
    assert not _live(cloud)
    assert all(not x.open for x in Ledger().records())


def test_nodes_out_of_range_is_a_usage_error(cloud, gpuops):
    r = _up(gpuops, cloud, "many", "--nodes", "0")
    assert r.code == 2 and "Traceback" not in r.all
    assert cloud.launch_requests() == 0


def test_the_emulator_refuses_quantity_above_one_as_lambda_does(cloud):
    import httpx

    cloud.capacity(TYPE, ["us-east-1"])
    r = httpx.post(cloud.url + "/instance-operations/launch", headers={"Authorization": f"Bearer {cloud.api_key}"},
                   json={"region_name": "us-east-1", "instance_type_name": TYPE, "ssh_key_names": ["k"],
                         "quantity": 2})
    assert r.status_code == 400
    assert r.json()["error"] == {"code": "global/invalid-parameters", "message": "Requested too many instances."} \
        or r.json()["error"]["message"] == "Requested too many instances."
    assert not _live(cloud)


NODE_TRAIN = """\
import os, socket
rank = int(os.environ["GPUOPS_NODE_RANK"])
print(f"node {rank} of {os.environ['GPUOPS_NUM_NODES']} master {os.environ['GPUOPS_MASTER_ADDR']}", flush=True)
os.makedirs("checkpoints", exist_ok=True)
with open(f"checkpoints/rank{rank}.bin", "wb") as fh:
    fh.write(bytes([rank]) * 1000)
if rank == 1 and os.environ.get("FAIL_ON_1"):
    raise SystemExit(4)
"""


def _run(gpuops, cloud, *extra):
    return gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", *extra)


def test_run_on_two_nodes_trains_on_both_fetches_from_node_0_and_ends_both(cloud, gpuops):
    from pathlib import Path

    cloud.capacity(TYPE, ["us-east-1"])
    (Path.cwd() / "train.py").write_text(NODE_TRAIN)
    r = _run(gpuops, cloud, "--nodes", "2", "--launcher", "none", "--script", "train.py", "--fetch", "checkpoints")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "succeeded" and all(s["ok"] for s in doc["stages"]), doc["stages"]
    up = doc["stages"][0]
    assert up["stage"] == "up" and "2 instances in us-east-1" in up["detail"]
    assert "=== host #1" in r.err  # setup and sync on every host, a section each
    # the job ran on both nodes with its rank; node 0's checkpoints are fetched and verified, both logs kept
    assert (Path.cwd() / doc["fetched"]["checkpoints"] / "rank0.bin").read_bytes() == b"\0" * 1000
    assert not (Path.cwd() / doc["fetched"]["checkpoints"] / "rank1.bin").exists()
    assert "node 0 of 2" in (Path.cwd() / doc["fetched"]["log"]).read_text()
    assert "node 1 of 2" in (Path.cwd() / doc["fetched"]["log.host1"]).read_text()
    # billed for two instances: the summary's cost is twice one node's price over the same seconds
    total_s = sum(s["duration_s"] for s in doc["stages"])
    assert doc["total_cost"] == pytest.approx(total_s / 3600 * 2.49 * 2, rel=0.2)
    assert not _live(cloud)
    assert all(not x.open for x in Ledger().records())


def test_run_on_two_nodes_where_one_node_fails_fetches_the_logs_and_ends_both(cloud, gpuops):
    from pathlib import Path

    cloud.capacity(TYPE, ["us-east-1"])
    (Path.cwd() / "train.py").write_text(NODE_TRAIN.replace('os.environ.get("FAIL_ON_1")', "True").replace(
        "raise SystemExit(4)", "from json import nothing_here"))
    r = _run(gpuops, cloud, "--nodes", "2", "--launcher", "none", "--script", "train.py")
    assert r.code == 1, r.all
    doc = json.loads(r.out)
    valid("run", doc)
    watch = next(s for s in doc["stages"] if s["stage"] == "watch")
    assert watch["ok"] is False and "host #1: failed (an import failed: ImportError" in watch["detail"], watch
    # what host 1 died of, with its evidence: in the summary's ending (its host named) and said as the run waited
    e = doc["ending"]
    assert e["host"] == 1 and e["cause"] == "import-error", e
    assert any("cannot import name 'nothing_here'" in x for x in e["evidence"]), e
    assert "host #1: failed (exit 1): an import failed" in r.err, r.err
    assert doc["outcome"] == "failed"
    assert "node 1 of 2" in (Path.cwd() / doc["fetched"]["log.host1"]).read_text()
    assert not _live(cloud)


def test_run_on_two_nodes_with_torchrun_refused_by_the_gate_ends_both(cloud, gpuops):
    from pathlib import Path

    cloud.capacity(TYPE, ["us-east-1"])
    (Path.cwd() / "train.py").write_text(NODE_TRAIN)
    # the default launcher on a fleet is torchrun; the fresh instances' environment has no torch
    r = _run(gpuops, cloud, "--nodes", "2", "--script", "train.py")
    assert r.code == 1, r.all
    doc = json.loads(r.out)
    train = next(s for s in doc["stages"] if s["stage"] == "train")
    assert train["ok"] is False and "torch" in train["detail"], train
    assert not _live(cloud)


def test_reap_ends_every_node_of_a_fleet_past_its_ttl_and_marks_the_profile_gone_after_the_last(cloud, gpuops):
    import time

    cloud.capacity(TYPE, ["us-east-1"])
    r = _up(gpuops, cloud, "brief", "--nodes", "2", "--no-verify", "--ttl", "1s", "--json")
    assert r.code == 0, r.all
    ids = [n["instance_id"] for n in json.loads(r.out)["nodes"]]
    time.sleep(1.5)
    r = gpuops("ls")
    assert all(f"instance {i} (profile brief) is past its limit" in r.err for i in ids), r.err
    r = gpuops("reap", "--yes", "--json")
    assert r.code == 0, r.all
    assert sorted(x["id"] for x in json.loads(r.out)["terminated"]) == sorted(ids)
    assert not _live(cloud) and _profile("brief")["cloud"]["state"] == "gone"


def test_guard_on_instance_ends_every_node_of_a_fleet_at_its_ttl(cloud, gpuops):
    import time

    cloud.capacity(TYPE, ["us-east-1"])
    r = _up(gpuops, cloud, "watched", "--nodes", "2", "--no-verify", "--ttl", "4s", "--guard", "on-instance", "--json")
    assert r.code == 0, r.all
    assert r.err.count("guard installed on the instance") == 2  # each node guards itself
    ids = {n["instance_id"] for n in json.loads(r.out)["nodes"]}
    deadline = time.monotonic() + 30
    while ids & {i["id"] for i in _live(cloud)}:
        assert time.monotonic() < deadline, "the on-instance guards did not terminate the fleet"
        time.sleep(0.3)
    assert cloud.api_key not in r.all


def test_run_on_a_fleet_names_a_difference_between_its_nodes_found_by_the_fleet_verify(cloud, gpuops):
    from pathlib import Path

    cloud.capacity(TYPE, ["us-east-1"])
    cloud.fault("old-driver", times=1)  # node 0 comes from an older image: driver 535, node 1 has 570
    (Path.cwd() / "train.py").write_text(NODE_TRAIN)
    r = _run(gpuops, cloud, "--nodes", "2", "--launcher", "none", "--script", "train.py")
    assert r.code == 0, r.all  # a driver difference is a warning, not a refusal (a GPU or package one fails)
    # each host passes alone; the fleet check after setup names the difference, host by host
    assert "warning: fleet: same NVIDIA driver on every host: 535.183.01 on #0; 570.148.08 on #1" in r.err
    setup = next(s for s in json.loads(r.out)["stages"] if s["stage"] == "setup")
    assert setup["ok"] and "match the profile and each other" in setup["detail"]
    assert not _live(cloud)
