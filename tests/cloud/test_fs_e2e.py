"""`gpuops fs ls|create|rm`, `up --fs` and `gpuops ls`'s filesystems end to end through the Lambda API emulator (whose
filesystems are folders every instance attaching them sees at the mount point the API reports)."""
from __future__ import annotations

import json
import time

import pytest
import yaml

from support.cloud import TYPE


def _profile(name):
    from gpuops.paths import config_dir

    return yaml.safe_load((config_dir() / "profiles" / f"{name}.yaml").read_text())


def _live(cloud):
    return [i for i in cloud.instances() if i["status"] not in ("terminated", "terminating")]


def _up(gpuops, cloud, name, *extra):
    return gpuops("up", name, "--type", TYPE, "--key", str(cloud.key), "--yes", "--no-verify", *extra)


def test_fs_create_ls_rm_and_their_refusals(cloud, gpuops):
    r = gpuops("fs", "create", "data-1", "--region", "us-east-1")
    assert r.code == 0 and "data-1 created in us-east-1" in r.err, r.all
    r = gpuops("fs", "create", "data-1", "--region", "us-east-1")
    assert r.code == 2 and "exists already" in r.err and "Traceback" not in r.all
    r = gpuops("fs", "create", "1bad", "--region", "us-east-1")
    assert r.code == 2 and "not a usable filesystem name" in r.err
    r = gpuops("fs", "create", "data-2", "--region", "mars-1")  # an unknown region: said as such, not "name or region"
    assert r.code == 2 and "in region 'mars-1'" in r.err and "not one Lambda knows" in r.err, r.all
    (cloud.fs_dir("data-1") / "blob").write_bytes(b"x" * 3 * 1024 * 1024)
    r = gpuops("fs", "ls", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    [row] = doc["filesystems"]
    assert row["name"] == "data-1" and row["region"] == "us-east-1" and row["bytes_used"] == 3 * 1024 * 1024
    assert row["mount_point"].endswith("/lambda/nfs/data-1") and row["instances"] == []
    assert row["cost_per_month"] is None and "no filesystem price" in doc["price_note"]
    r = gpuops("fs", "ls")
    assert r.code == 0 and "data-1" in r.out and "3.0 MiB" in r.out and "cost per month" in r.err
    # no terminal and no --yes: nothing deleted, the command to run said
    r = gpuops("fs", "rm", "data-1")
    assert r.code == 2 and "gpuops fs rm data-1 --yes" in r.err
    assert cloud.fs_dir("data-1").is_dir()
    r = gpuops("fs", "rm", "nope", "--yes")
    assert r.code == 2 and "no filesystem named 'nope'" in r.err
    r = gpuops("fs", "rm", "data-1", "--yes")
    assert r.code == 0 and "deleted" in r.err, r.all
    assert json.loads(gpuops("fs", "ls", "--json").out)["filesystems"] == []


def test_a_price_from_the_project_playbook_gives_the_cost_per_month(cloud, gpuops, isolated):
    (isolated / "playbooks").mkdir()
    (isolated / "playbooks" / "filesystems.yaml").write_text(
        "price:\n  usd_per_gib_month: 0.5\n  source: 'Lambda console at creation, test'\n  regions: {us-west-2: 1.0}\n")
    assert gpuops("fs", "create", "east", "--region", "us-east-1").code == 0
    assert gpuops("fs", "create", "west", "--region", "us-west-2").code == 0
    (cloud.fs_dir("east") / "g").write_bytes(b"\0" * (1024 ** 3 // 4))  # a quarter GiB
    (cloud.fs_dir("west") / "g").write_bytes(b"\0" * (1024 ** 3 // 4))
    doc = json.loads(gpuops("fs", "ls", "--json").out)
    cost = {r["name"]: r["cost_per_month"] for r in doc["filesystems"]}
    assert cost == {"east": pytest.approx(0.125), "west": pytest.approx(0.25)}
    assert doc["total_per_month"] == pytest.approx(0.375) and doc["price_source"].startswith("Lambda console")
    r = gpuops("ls")
    assert r.code == 0 and "filesystems (2)" in r.out and "$0.12/month" in r.out and "in all: $0.38/month" in r.out


def test_up_fs_tries_only_its_region_mounts_it_and_rm_is_refused_while_mounted(cloud, gpuops):
    cloud.capacity(TYPE, ["us-west-2", "us-east-1"])
    assert gpuops("fs", "create", "ckpts", "--region", "us-east-1").code == 0
    r = _up(gpuops, cloud, "withfs", "--fs", "ckpts")
    assert r.code == 0, r.all
    assert "filesystem ckpts is in us-east-1: trying only us-east-1" in r.err
    # the price line (the question without --yes) names that region, not "any region"
    assert f"launch {TYPE} (" in r.err and " in us-east-1 at $" in r.err and "any region" not in r.err, r.err
    [inst] = _live(cloud)
    assert inst["region"]["name"] == "us-east-1" and inst["file_system_names"] == ["ckpts"]
    mount = inst["file_system_mounts"][0]["mount_point"]
    p = _profile("withfs")
    assert p["env"]["GPUOPS_FS"] == mount and p["setup"]["cache_dir"] == f"{mount}/gpuops/cache"
    assert p["env"]["HF_HOME"] == f"{mount}/gpuops/cache/huggingface"  # models and datasets: downloaded once
    assert p["cloud"]["filesystems"] == [{"name": "ckpts", "id": inst["file_system_mounts"][0]["file_system_id"],
                                         "mount_point": mount}]
    assert cloud.launch_requests() == 1
    r = gpuops("fs", "rm", "ckpts", "--yes")
    assert r.code == 1 and inst["id"] in r.err and "mounted by instance" in r.err
    assert f"`gpuops down {inst['id']}`" in r.err, r.err  # the command that works, not a placeholder
    r = gpuops("fs", "ls", "--json")
    assert [i["id"] for i in json.loads(r.out)["filesystems"][0]["instances"]] == [inst["id"]]
    r = gpuops("ls")
    assert r.code == 0 and "ckpts" in r.out and f"mounted by {inst['id']}" in r.out
    assert gpuops("down", inst["id"], "--yes").code == 0  # as the hint says
    assert gpuops("fs", "rm", "ckpts", "--yes").code == 0


def test_up_fs_no_capacity_in_its_region_is_refused_before_any_launch(cloud, gpuops):
    cloud.capacity(TYPE, ["us-west-2"])
    assert gpuops("fs", "create", "far", "--region", "us-east-1").code == 0
    r = _up(gpuops, cloud, "nocap", "--fs", "far")
    assert r.code == 1 and "no capacity for gpu_1x_h100_pcie in us-east-1" in r.err and "--wait-for-capacity" in r.err
    assert cloud.launch_requests() == 0 and not _live(cloud)
    r = _up(gpuops, cloud, "nocap", "--fs", "far", "--region", "us-west-2")
    assert r.code == 2 and "'far' is in us-east-1, not in us-west-2" in r.err
    assert cloud.launch_requests() == 0


def test_up_fs_waits_for_capacity_in_its_region(cloud, gpuops):
    cloud.capacity(TYPE, ["us-west-2"])
    cloud.capacity_later(TYPE, ["us-east-1"], after=1.5)
    assert gpuops("fs", "create", "later", "--region", "us-east-1").code == 0
    r = _up(gpuops, cloud, "waits", "--fs", "later", "--wait-for-capacity", "1m", "--json")
    assert r.code == 0, r.all
    assert json.loads(r.out)["region"] == "us-east-1" and "waiting" in r.err.lower()
    assert gpuops("down", "waits", "--yes").code == 0


def test_a_missing_filesystem_is_created_with_yes_and_refused_without_a_terminal(cloud, gpuops):
    cloud.capacity(TYPE, ["us-west-2"])
    r = gpuops("up", "mk", "--type", TYPE, "--key", str(cloud.key), "--no-verify", "--fs", "newfs")
    assert r.code == 2 and "`gpuops fs create newfs --region us-west-2`" in r.err and "--yes" in r.err
    assert cloud.launch_requests() == 0 and json.loads(gpuops("fs", "ls", "--json").out)["filesystems"] == []
    r = _up(gpuops, cloud, "mk", "--fs", "newfs")
    assert r.code == 0, r.all
    assert "created filesystem 'newfs' in us-west-2" in r.err
    [row] = json.loads(gpuops("fs", "ls", "--json").out)["filesystems"]
    assert row["region"] == "us-west-2" and row["is_in_use"]
    assert gpuops("down", "mk", "--yes").code == 0


def test_reap_never_deletes_a_filesystem(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    assert gpuops("fs", "create", "keepme", "--region", "us-east-1").code == 0
    (cloud.fs_dir("keepme") / "weights.pt").write_text("w")
    r = _up(gpuops, cloud, "short", "--fs", "keepme", "--ttl", "2s")
    assert r.code == 0, r.all
    time.sleep(2.5)
    r = gpuops("reap", "--yes")
    assert r.code == 0 and "terminated" in r.out, r.all
    assert not _live(cloud)
    [row] = json.loads(gpuops("fs", "ls", "--json").out)["filesystems"]
    assert row["name"] == "keepme" and (cloud.fs_dir("keepme") / "weights.pt").read_text() == "w"


def test_a_fleet_attaches_the_filesystem_on_every_node(cloud, gpuops):
    cloud.capacity(TYPE, ["us-west-2", "us-east-1"])
    assert gpuops("fs", "create", "shared", "--region", "us-east-1").code == 0
    r = _up(gpuops, cloud, "pair", "--nodes", "2", "--fs", "shared")
    assert r.code == 0, r.all
    live = _live(cloud)
    assert len(live) == 2 and all(i["file_system_names"] == ["shared"] and i["region"]["name"] == "us-east-1"
                                  for i in live)
    [row] = json.loads(gpuops("fs", "ls", "--json").out)["filesystems"]
    assert sorted(i["id"] for i in row["instances"]) == sorted(i["id"] for i in live)
    assert gpuops("down", "pair", "--yes").code == 0


def test_fs_rm_right_after_down_waits_for_the_terminating_instance(cloud, gpuops):
    """Before: refused while the instance was still terminating, with the hint "end the instance first"."""
    cloud.capacity(TYPE, ["us-east-1"])
    cloud.terminate_seconds(4)
    assert gpuops("fs", "create", "soon", "--region", "us-east-1").code == 0
    assert _up(gpuops, cloud, "soonfs", "--fs", "soon").code == 0
    [inst] = _live(cloud)
    assert gpuops("down", inst["id"], "--yes").code == 0
    r = gpuops("fs", "rm", "soon", "--yes")
    assert r.code == 0, r.all
    assert f"instance {inst['id']} mounting 'soon' is terminating: waiting for it to end" in r.err, r.err
    assert "end it first" not in r.err
