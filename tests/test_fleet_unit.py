"""Fleets, pure parts: profiles with hosts:, the worst exit code, launchers' command lines, fleet checks."""
from __future__ import annotations

import shlex

import pytest

from gpuops import fleet, launchers
from gpuops.errors import ConnectError, ProfileError, UsageError
from gpuops.profiles import Profile, load_profile
from gpuops.runs import fleet_exit, node_meta, RunInfo


def prof(**kw):
    return Profile.model_validate({"name": "f", **kw})


def test_hosts_are_strings_or_mappings_and_rank0_stands_for_the_profile():
    p = prof(hosts=["10.0.0.1", {"host": "10.0.0.2", "port": 2222, "user": "alice", "private_ip": "192.168.1.2",
                                 "python": "~/venv/bin/python"}], user="ubuntu", python="python3", remote_dir="~/proj")
    assert (p.host, p.port, p.user, p.is_fleet) == ("10.0.0.1", 22, "ubuntu", True)
    n0, n1 = p.nodes()
    assert (n0.rank, n0.host, n0.user, n0.address, n0.remote_dir) == (0, "10.0.0.1", "ubuntu", "10.0.0.1", "~/proj")
    assert (n1.rank, n1.host, n1.port, n1.user, n1.python, n1.address) == (1, "10.0.0.2", 2222, "alice",
                                                                           "~/venv/bin/python", "192.168.1.2")
    assert not n1.is_fleet and n1.name == "f"


def test_rank0_overrides_apply_to_the_profile_but_not_to_other_hosts():
    p = prof(hosts=[{"host": "a", "port": 2200}, "b"], port=22)
    assert p.port == 2200
    assert [n.port for n in p.nodes()] == [2200, 22]


def test_one_host_profile_is_its_own_only_node():
    p = prof(host="a")
    assert p.nodes() == [p] and p.node(None) is p and p.node(0) is p and not p.is_fleet
    with pytest.raises(ProfileError, match="--host 1"):
        p.node(1)


@pytest.mark.parametrize("text, msg", [
    ("host: a\nhosts: [b]\n", "either host"),
    ("hosts: []\n", "non-empty"),
    ("hosts: [{port: 22}]\n", "hosts.0.host"),
    ("hosts: [{host: a, colour: red}]\n", "colour: unknown key"),
])
def test_bad_fleet_profiles_are_profile_errors(tmp_path, text, msg):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ProfileError, match=msg):
        load_profile(f)


def test_worst_code_orders_interrupt_connection_usage_failure_ok():
    assert fleet.worst_code([0, 1, 0]) == 1
    assert fleet.worst_code([1, 3, 2]) == 3
    assert fleet.worst_code([2, 1]) == 2
    assert fleet.worst_code([130, 3]) == 130
    assert fleet.worst_code([]) == 0


def test_for_each_runs_in_parallel_keeps_rank_order_and_captures_errors():
    import threading
    import time

    p = prof(hosts=["a", "b", "c", "d"])
    seen = set()

    def fn(node):
        seen.add(threading.get_ident())
        time.sleep(0.2)
        if node.host == "c":
            raise ConnectError("refused")
        if node.host == "d":
            raise ValueError("odd")
        return node.host

    t0 = time.monotonic()
    res = fleet.for_each(p.nodes(), fn, parallel=4)
    assert time.monotonic() - t0 < 0.6 and len(seen) == 4
    assert [r.value for r in res] == ["a", "b", None, None]
    assert [r.code for r in res] == [0, 0, 3, 1]
    assert res[2].message == "refused" and "odd" in res[3].message
    assert fleet.worst_code(r.code for r in res) == 3


def test_node_env_has_gpuops_and_torch_names():
    fl = launchers.Fleet(("10.0.0.1", "10.0.0.2", "10.0.0.3"), master_port=29511, gpus_per_node=8)
    env = launchers.node_env(fl, 2)
    assert env == {"GPUOPS_NODE_RANK": "2", "GPUOPS_NUM_NODES": "3", "GPUOPS_NODE_IPS": "10.0.0.1,10.0.0.2,10.0.0.3",
                   "GPUOPS_MASTER_ADDR": "10.0.0.1", "GPUOPS_MASTER_PORT": "29511", "GPUOPS_GPUS_PER_NODE": "8",
                   "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29511", "NODE_RANK": "2", "WORLD_SIZE": "24"}


def test_torchrun_wraps_a_py_job_and_runs_anything_else_with_no_python():
    fl = launchers.Fleet(("h0", "h1"), gpus_per_node=2)
    py = launchers.torchrun_argv(["~/v/bin/python", "-X", "dev", "-u", "train.py", "--lr", "1"],
                                 python="~/v/bin/python -X dev", fleet=fl, rank=1, nproc_per_node=2)
    assert py == ["~/v/bin/python", "-X", "dev", "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", "1",
                  "--master_addr", "h0", "--master_port", "29500", "--nproc_per_node", "2", "train.py", "--lr", "1"]
    sh = launchers.torchrun_argv(["bash", "run.sh"], python="python3", fleet=fl, rank=0, nproc_per_node=1)
    assert sh[-3:] == ["--no-python", "bash", "run.sh"]


def test_ray_head_runs_the_job_then_stops_and_workers_join_and_leave():
    fl = launchers.Fleet(("10.0.0.1", "10.0.0.2"))
    head = launchers.ray_command(["python3", "-u", "job.py"], python="python3", fleet=fl, rank=0, port=6390,
                                 num_gpus=8, temp_dir="/tmp/r-0")
    assert head.startswith("python3 -m ray.scripts.scripts start --node-ip-address=10.0.0.1 --disable-usage-stats "
                           "--head --port=6390 --dashboard-host=127.0.0.1 --temp-dir=/tmp/r-0 --num-gpus=8 && ")
    assert "RAY_ADDRESS=10.0.0.1:6390" in head and "python3 -u job.py" in head and "stop --force" in head
    worker = launchers.ray_command(["python3", "-u", "job.py"], python="python3", fleet=fl, rank=1, port=6390)
    inner = shlex.split(worker)
    assert inner[:2] == ["sh", "-c"] and "--address=10.0.0.1:6390" in inner[2] and "job.py" not in inner[2]
    assert "exit 0" in inner[2]


def test_values_reaching_the_shell_are_quoted():
    fl = launchers.Fleet(("10.0.0.1;reboot", "$(x)"))
    head = launchers.ray_command(["python3", "a b.py"], python="python3", fleet=fl, rank=0)
    assert "'--node-ip-address=10.0.0.1;reboot'" in head and "'a b.py'" in head
    pre = launchers.ifname_prelude("1.2.3.4'; reboot; '")
    awk = pre.split("$(", 1)[1].split("')\n", 1)[0] + "'"
    assert "a=1.2.3.4'; reboot; '" in shlex.split(awk)  # one word: the address never runs


def _report(gpu="NVIDIA H100 80GB HBM3", n=8, driver="570.148.08", torch="2.9.0+cu128", reach=None):
    rep = {"facts": {"gpus": [{"name": gpu}] * n, "driver": driver, "cuda_driver": "12.8",
                     "python": {"version": "3.10.12"}, "packages": {"torch": torch, "vllm": None}}}
    if reach is not None:
        rep["reach"] = reach
    return rep


def test_fleet_compare_names_the_differences_per_host():
    res = {r.id: r for r in fleet.compare([_report(), _report(driver="550.54.15"), _report(torch="2.8.0+cu126")])}
    assert res["fleet.gpu_model"].status == "pass"
    assert res["fleet.driver"].status == "warn"
    assert res["fleet.driver"].measured == "570.148.08 on #0, #2; 550.54.15 on #1"
    assert res["fleet.pkg.torch"].status == "fail" and "2.8.0+cu126 on #2" in res["fleet.pkg.torch"].measured
    assert "fleet.pkg.vllm" not in res  # absent everywhere: nothing to compare


def test_fleet_compare_skips_unreachable_hosts():
    res = {r.id: r for r in fleet.compare([_report(), None, _report()])}
    assert all(r.status == "pass" for r in res.values())


def test_reach_refused_counts_as_reachable_timeout_fails():
    ok = {"ok": True, "value": {"result": "refused", "ms": 0.2}}
    bad = {"ok": True, "value": {"result": "timeout", "ms": 5000}}
    res = fleet.reach_results([_report(), _report(reach=ok), _report(reach=bad)], "10.0.0.1", 29500)
    assert [r.status for r in res] == ["pass", "fail"]
    assert "open TCP 29500" in res[1].remediation


def test_node_meta_and_fleet_exit():
    meta = {"run_id": "r", "remote_run_dir": "~/a/.gpuops/runs/r",
            "nodes": [{"remote_run_dir": "~/a/.gpuops/runs/r", "pid": 1}, {"remote_run_dir": "~/b/.gpuops/runs/r",
                                                                           "pid": 2}]}
    assert node_meta(meta, 1)["remote_run_dir"] == "~/b/.gpuops/runs/r" and node_meta(meta, 1)["pid"] == 2
    with pytest.raises(UsageError):
        node_meta(meta, 2)
    ok = RunInfo(run_id="r", exists=True, pid=1, alive=False, exit_code=0, started=1, ended=2)
    bad = RunInfo(run_id="r", exists=True, pid=1, alive=False, exit_code=1, started=1, ended=2)
    assert fleet_exit([ok, ok]) == 0 and fleet_exit([ok, bad]) == 1 and fleet_exit([ok, None]) == 1
