"""Any GPU that fits, end to end through the Lambda emulator: several --type in order, --gpu NAME:COUNT through the
GPU table (cheapest first), --max-price, --wait-for-capacity on the emulator's fast clock, a --from template's
expect.gpu as a constraint, `gpuops cloud types --available` in the order tried, and `gpuops run --gpu`."""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from gpuops.cloud.ledger import Ledger

PCIE, SXM, SXM8, GDR8 = "gpu_1x_h100_pcie", "gpu_1x_h100_sxm5", "gpu_8x_h100_sxm5", "gpu_8x_h100_sxm5gdr"


def _up(gpuops, cloud, name, *extra):
    return gpuops("up", name, "--key", str(cloud.key), "--yes", *extra)


def _live(cloud):
    return [i for i in cloud.instances() if i["status"] not in ("terminated", "terminating")]


def _types(cloud):
    return {i["id"]: i["instance_type"]["name"] for i in _live(cloud)}


def _profile(name):
    from gpuops.paths import config_dir

    return yaml.safe_load((config_dir() / "profiles" / f"{name}.yaml").read_text())


def test_no_capacity_for_the_first_type_the_second_launches_and_the_ledger_says_which(cloud, gpuops):
    cloud.capacity(PCIE, ["us-east-1"], failing=["us-east-1"])  # listed, but its launch is refused
    cloud.capacity(SXM, ["us-west-1"])
    r = _up(gpuops, cloud, "second", "--type", PCIE, "--type", SXM, "--ttl", "2h", "--idle", "1h", "--no-verify",
            "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["instance_type"] == SXM and doc["region"] == "us-west-1" and doc["price_per_hour"] == 3.29
    assert "no capacity in us-east-1 for gpu_1x_h100_pcie" in r.err and "trying gpu_1x_h100_sxm5 in us-west-1" in r.err
    assert "the first with capacity of gpu_1x_h100_pcie ($2.49/h), gpu_1x_h100_sxm5 ($3.29/h) (in the order given)" \
        in r.err
    assert cloud.launch_requests() == 2 and list(_types(cloud).values()) == [SXM]
    [rec] = Ledger().records()  # one launch, its record rewritten before each request: the type that launched
    assert (rec.instance_type, rec.price_cents_per_hour, rec.region) == (SXM, 329, "us-west-1")
    assert rec.ttl_deadline and rec.idle_limit_s == 3600 and rec.profile == "second" and rec.regions_tried == [
        "us-east-1", "us-west-1"]
    p = _profile("second")
    assert p["instance_type"] == SXM and p["price_per_hour"] == 3.29
    assert p["expect"] == {"gpu": "H100 80GB HBM3", "gpu_count": 1, "gpu_memory_mib": 79112}
    assert gpuops("down", "second", "--yes").code == 0


def test_gpu_picks_the_cheapest_fitting_type_with_capacity(cloud, gpuops):
    cloud.capacity(SXM8, ["us-west-1"])
    cloud.capacity(GDR8, ["us-east-1"])
    r = _up(gpuops, cloud, "cheap", "--gpu", "H100:8", "--no-verify", "--json")
    assert r.code == 0, r.all
    assert json.loads(r.out)["instance_type"] == SXM8 and cloud.launch_requests() == 1
    assert "launch H100:8: the first with capacity of gpu_8x_h100_sxm5 ($23.92/h), gpu_8x_h100_sxm5gdr ($35.92/h) " \
           "(cheapest first) in any region, at most $35.92/hour" in r.err
    assert _profile("cheap")["expect"]["gpu_count"] == 8
    assert gpuops("down", "cheap", "--yes").code == 0
    cloud.capacity(SXM8, [])  # the cheapest lists no capacity anywhere: the next one, without a wasted request
    r = _up(gpuops, cloud, "dear", "--gpu", "H100:8", "--no-verify", "--json")
    assert r.code == 0, r.all
    assert json.loads(r.out)["instance_type"] == GDR8 and cloud.launch_requests() == 2


def test_max_price_excludes_and_nothing_is_launched(cloud, gpuops):
    cloud.capacity(SXM8, [])
    cloud.capacity(GDR8, ["us-east-1"])  # free, but over the price
    r = _up(gpuops, cloud, "thrifty", "--gpu", "H100:8", "--max-price", "30", "--no-verify")
    assert r.code == 1, r.all
    assert "not tried: gpu_8x_h100_sxm5gdr ($35.92/h): $35.92/h is over --max-price $30.00" in r.err
    assert "no capacity for H100:8 at most $30.00/h (gpu_8x_h100_sxm5) in any region (none listed)" in r.err
    assert cloud.launch_requests() == 0 and not _live(cloud)
    assert [x.state for x in Ledger().records()] == ["failed"]
    r = _up(gpuops, cloud, "thrifty2", "--type", GDR8, "--max-price", "30", "--no-verify")
    assert r.code == 2 and "no instance type fits gpu_8x_h100_sxm5gdr at most $30.00/h" in r.err, r.all
    assert cloud.launch_requests() == 0 and len(Ledger().records()) == 1  # refused before any record


def test_wait_for_capacity_waits_then_launches_and_says_since_when(cloud, gpuops):
    cloud.capacity(SXM8, [])
    cloud.capacity(GDR8, [])
    cloud.clock_rate(120)  # two emulated minutes a second
    cloud.capacity_later(GDR8, ["us-west-1"], after=240)
    r = _up(gpuops, cloud, "patient", "--gpu", "H100:8", "--wait-for-capacity", "2m", "--no-verify", "--json")
    assert r.code == 0, r.all
    lines = [x for x in r.err.splitlines() if x.startswith("waiting for capacity")]
    assert lines, r.err
    since = re.match(r"waiting for capacity since (\d\d:\d\d:\d\d) ", lines[0]).group(1)
    assert all(x.startswith(f"waiting for capacity since {since} (") for x in lines)  # one start, said each time
    assert ("H100:8: gpu_8x_h100_sxm5 ($23.92/h), gpu_8x_h100_sxm5gdr ($35.92/h) in any region; checking again in"
            in lines[0])
    assert json.loads(r.out)["instance_type"] == GDR8 and cloud.launch_requests() == 1


def test_wait_for_capacity_that_runs_out_fails_and_closes_the_record(cloud, gpuops):
    cloud.capacity(PCIE, [])
    r = _up(gpuops, cloud, "never", "--type", PCIE, "--wait-for-capacity", "2s", "--no-verify")
    assert r.code == 1 and "no capacity for gpu_1x_h100_pcie in any region (none listed)" in r.err, r.all
    assert r.err.count("waiting for capacity since") >= 2 and cloud.launch_requests() == 0
    assert [x.state for x in Ledger().records()] == ["failed"]


def test_cloud_types_available_lists_what_would_be_tried_in_order(cloud, gpuops):
    cloud.capacity(PCIE, [])
    cloud.capacity(SXM, ["us-west-1", "us-east-1"])
    r = gpuops("cloud", "types", "--gpu", "H100", "--json")
    assert r.code == 0, r.all
    rows = json.loads(r.out)["instance_types"]
    assert [(x["order"], x["name"], x["regions_with_capacity"]) for x in rows] == [
        (1, PCIE, []), (2, SXM, ["us-east-1", "us-west-1"])]  # the API's region order
    r = gpuops("cloud", "types", "--gpu", "H100", "--available", "--region", "us-west-1", "--region", "us-east-1")
    assert r.code == 0, r.all
    body = [x.split() for x in r.out.splitlines()[1:]]
    assert [(x[0], x[1]) for x in body] == [("1", SXM)] and r.out.rstrip().endswith("us-west-1, us-east-1")
    r = gpuops("cloud", "types", "--gpu", "H100:8", "--max-price", "30", "--json")
    doc = json.loads(r.out)
    assert [x["name"] for x in doc["instance_types"]] == [SXM8]
    assert doc["left_out"] == [{"name": GDR8, "price_per_hour": 35.92, "why": "$35.92/h is over --max-price $30.00"}]
    r = gpuops("cloud", "types", "--type", SXM, "--type", PCIE, "--available")
    assert [x.split()[1] for x in r.out.splitlines()[1:]] == [SXM]
    assert gpuops("cloud", "types", "--gpu", "H100:0").code == 2


def test_a_templates_expect_gpu_chooses_the_type_and_verify_passes(cloud, gpuops):
    (Path.cwd() / "profiles").mkdir()
    (Path.cwd() / "profiles" / "sxm.yaml").write_text("host: gpu.example.com\nexpect:\n  gpu: H100 SXM\n"
                                                      "  gpu_count: 8\n")
    cloud.capacity(PCIE, ["us-east-1"])  # cheaper and free, but not the GPU the template expects
    cloud.capacity(SXM, ["us-east-1"])
    r = _up(gpuops, cloud, "fits", "--gpu", "H100", "--from", "sxm")
    assert r.code == 0, r.all  # verify ran on the instance and passed: the GPU is the one expected
    assert "not tried: gpu_1x_h100_pcie ($2.49/h): its GPU (H100 (80 GB PCIe)) is not the template's expect.gpu " \
           "'H100 SXM'" in r.err
    assert _profile("fits")["instance_type"] == SXM and _profile("fits")["expect"]["gpu"] == "H100 80GB HBM3"
    assert gpuops("down", "fits", "--yes").code == 0
    r = _up(gpuops, cloud, "nofit", "--type", PCIE, "--from", "sxm")
    assert r.code == 2 and "nothing was launched" in r.err, r.all
    assert cloud.launch_requests() == 1


def test_a_fleet_takes_node_zeros_type_and_region(cloud, gpuops):
    cloud.capacity(PCIE, [])
    cloud.capacity(SXM, ["us-west-1"], slots=2)
    r = _up(gpuops, cloud, "pair", "--gpu", "H100", "--nodes", "2", "--no-verify", "--json")
    assert r.code == 0, r.all
    assert sorted(_types(cloud).values()) == [SXM, SXM]
    assert {i["region"]["name"] for i in _live(cloud)} == {"us-west-1"}
    assert {rec.instance_type for rec in Ledger().records()} == {SXM}
    assert gpuops("down", "pair", "--yes").code == 0


def test_run_with_gpu_end_to_end(cloud, gpuops):
    (Path.cwd() / "train.py").write_text("import os\nos.makedirs('ckpt', exist_ok=True)\n"
                                         "open('ckpt/w.bin', 'wb').write(b'w' * 256)\nprint('done', flush=True)\n")
    cloud.capacity(PCIE, [])
    cloud.capacity(SXM, ["us-east-1"])
    r = gpuops("run", "--gpu", "H100", "--max-price", "5", "--wait-for-capacity", "1m", "--script", "train.py",
               "--fetch", "ckpt", "--key", str(cloud.key), "--yes", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["outcome"] == "succeeded" and (Path.cwd() / doc["fetched"]["ckpt"] / "w.bin").read_bytes() == b"w" * 256
    up = next(st for st in doc["stages"] if st["stage"] == "up")
    assert f"({SXM})" in up["detail"]  # the summary says which type the run got
    p = _profile(doc["profile"])
    assert p["instance_type"] == SXM and p["expect"]["gpu"] == "H100 80GB HBM3"  # the type it got
    from gpuops.pipeline import stages as pl

    rec = pl.Record.from_json(json.loads((pl.records_dir(Path.cwd()) / f"{doc['run']}.json").read_text()))
    assert (rec.gpu, rec.max_price, rec.wait_for_capacity_s, rec.types) == ("H100", 5, 60, [])  # what was asked
    assert not _live(cloud)
    r = gpuops("run", "--type", PCIE, "--gpu", "H100", "--script", "train.py", "--key", str(cloud.key), "--yes")
    assert r.code == 2 and "give one of them" in r.err, r.all


def test_a_fleet_that_waited_for_capacity_launches_its_other_nodes_without_waiting_again(cloud, gpuops):
    cloud.capacity(PCIE, [])
    cloud.capacity(SXM, [])
    cloud.clock_rate(120)
    # capacity 8 emulated minutes on (4 s): gpuops has started and waited by then even on a loaded machine (at 1 s it
    # could find the capacity already there and never wait); the 15-minute limit leaves it room
    cloud.capacity_later(SXM, ["us-west-1"], after=480, slots=2)
    r = _up(gpuops, cloud, "late", "--gpu", "H100", "--nodes", "2", "--wait-for-capacity", "15m", "--no-verify")
    assert r.code == 0, r.all
    waits = [x for x in r.err.splitlines() if x.startswith("waiting for capacity")]
    assert waits and all("in any region;" in x for x in waits), r.err  # node 1 knew the capacity node 0 found
    assert sorted(_types(cloud).values()) == [SXM, SXM] and cloud.launch_requests() == 2
    assert gpuops("down", "late", "--yes").code == 0


def test_trying_the_next_type_waits_for_the_launch_slot(cloud, gpuops, monkeypatch):
    monkeypatch.setenv("GPUOPS_CLOUD_LAUNCH_INTERVAL_S", "1.5")  # the ledger's slot, as Lambda's 12 s
    cloud.launch_window(1.5)  # the emulator refuses (429) a launch request within 1.5 s of the last one
    cloud.capacity(PCIE, ["us-east-1"], failing=["us-east-1"])
    cloud.capacity(SXM, ["us-east-1"])
    r = _up(gpuops, cloud, "slotted", "--type", PCIE, "--type", SXM, "--no-verify", "--json")
    assert r.code == 0, r.all
    assert "rate limited" not in r.err and cloud.launch_requests() == 2  # the second request waited its turn
    assert json.loads(r.out)["instance_type"] == SXM
