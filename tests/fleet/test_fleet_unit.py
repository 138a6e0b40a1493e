"""Fleets, pure parts: profiles with hosts:, launchers' command lines, a run's nodes and exit (the host pool:
test_hostpool.py; the fleet checks: tests/verify/test_fleet_checks.py)."""
from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from gpuops.jobs import launchers
from gpuops.errors import ProfileError, UsageError
from gpuops.profiles.model import Profile, load_profile
from gpuops.jobs.plan import fleet_exit, node_meta, RunInfo


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


RAY_DIRS = ("/tmp/gpuops-ray-aa-0", "/tmp/gpuops-ray-bb-1")


def ray_script(command: str) -> str:
    """The script a node's `sh -c` runs, checked to parse."""
    words = shlex.split(command)
    assert words[:2] == ["sh", "-c"] and len(words) == 3
    assert subprocess.run(["sh", "-n", "-c", words[2]], capture_output=True).returncode == 0
    return words[2]


def test_ray_head_waits_for_every_node_then_runs_the_job_and_ends_its_own_ray():
    fl = launchers.Fleet(("10.0.0.1", "10.0.0.2"))
    head = ray_script(launchers.ray_command(["python3", "-u", "job.py"], python="python3", fleet=fl, rank=0,
                                            temp_dirs=RAY_DIRS, port=6390, num_gpus=8, join_timeout=42))
    start = head.index("python3 -m ray.scripts.scripts start --node-ip-address=10.0.0.1 --disable-usage-stats --head "
                       "--port=6390 --dashboard-host=127.0.0.1 --temp-dir=/tmp/gpuops-ray-aa-0 --num-gpus=8 || ")
    wait = head.index("ray.init(address=address")
    expected = '\'[[0, "10.0.0.1", "/tmp/gpuops-ray-aa-0"], [1, "10.0.0.2", "/tmp/gpuops-ray-bb-1"]]\''
    args = head.index(f"\' 10.0.0.1:6390 42 {expected} || gpuops_end $?")
    job = head.index("RAY_ADDRESS=10.0.0.1:6390; export RAY_ADDRESS\npython3 -u job.py\ngpuops_end $?\n")
    assert start < wait < args < job  # the job starts only once the wait has passed
    assert 'gpuops_ray_dir=/tmp/gpuops-ray-aa-0\n' in head
    assert "trap 'gpuops_sig=1' INT TERM HUP" in head  # gpuops stop's signals: Ray ends before the node's script
    assert "scripts stop" not in head  # no `ray stop`: it ends every Ray process of the user on the machine


def test_ray_worker_waits_for_the_head_as_long_joins_and_leaves_when_it_has_gone():
    fl = launchers.Fleet(("10.0.0.1", "10.0.0.2"))
    worker = ray_script(launchers.ray_command(["python3", "-u", "job.py"], python="python3", fleet=fl, rank=1,
                                              temp_dirs=RAY_DIRS, port=6390, join_timeout=42))
    assert "-ge 42 ]; then echo 'gpuops: the Ray head at 10.0.0.1:6390 did not answer in 42 s' >&2; exit 1" in worker
    assert ("start --node-ip-address=10.0.0.2 --disable-usage-stats --address=10.0.0.1:6390 "
            "--temp-dir=/tmp/gpuops-ray-bb-1 || ") in worker
    assert "gpuops: this host could not join the Ray cluster at 10.0.0.1:6390" in worker
    assert worker.endswith("echo 'gpuops: the Ray head has gone; leaving the cluster'\ngpuops_end 0\n")
    assert "job.py" not in worker and "scripts stop" not in worker and "ray.init" not in worker


def test_join_timeout_comes_from_the_jobs_environment():
    assert launchers.join_timeout({}) == launchers.RAY_JOIN_TIMEOUT == 180
    assert launchers.join_timeout({"GPUOPS_RAY_JOIN_TIMEOUT": " 600 "}) == 600
    for bad in ("0", "-5", "1.5", "ten"):
        with pytest.raises(UsageError, match="GPUOPS_RAY_JOIN_TIMEOUT must be a whole number of seconds") as e:
            launchers.join_timeout({"GPUOPS_RAY_JOIN_TIMEOUT": bad})
        assert e.value.code == 2


def test_ray_temp_dirs_are_short_and_one_per_run_and_node():
    a = launchers.ray_temp_dir("train-20261125-101010", 0, "ubuntu@10.0.0.1:22:~/proj")
    assert a == launchers.ray_temp_dir("train-20261125-101010", 0, "ubuntu@10.0.0.1:22:~/proj")
    assert a.startswith("/tmp/gpuops-ray-") and a.endswith("-0") and len(a) <= 30  # + Ray's ~70-byte socket paths
    assert launchers.ray_temp_dir("train-20261125-101010", 0, "ubuntu@10.0.0.1:22:~/other") != a  # same id
    assert launchers.ray_temp_dir("train-20261125-101010", 1, "ubuntu@10.0.0.2:22:~/proj").endswith("-1")


# Ray's node table as `ray.nodes()` gives it (Ray 2.60, trimmed), a head and a worker on one machine
HEAD_NODE = {"NodeID": "f114", "Alive": True, "NodeManagerAddress": "192.0.2.2", "NodeName": "192.0.2.2",
             "RayletSocketName": "/tmp/gpuops-ray-aa-0/session_2026-11-25_14-31-41_413652_7890/sockets/raylet",
             "ObjectStoreSocketName": "/tmp/gpuops-ray-aa-0/session_2026-11-25_14-31-41_413652_7890/sockets/plasma_store"}
WORKER_NODE = {**HEAD_NODE, "NodeID": "2b91",
               "RayletSocketName": "/tmp/gpuops-ray-bb-1/session_2026-11-25_14-31-41_413652_7890/sockets/raylet"}


def test_ray_missing_names_the_nodes_rays_table_lacks():
    expected = [[0, "127.0.0.1", RAY_DIRS[0]], [1, "127.0.0.1", RAY_DIRS[1]]]
    assert launchers.ray_missing(expected, [HEAD_NODE]) == [[1, "127.0.0.1"]]  # same address: by temp dir
    assert launchers.ray_missing(expected, [HEAD_NODE, WORKER_NODE]) == []
    assert launchers.ray_missing(expected, [HEAD_NODE, {**WORKER_NODE, "Alive": False}]) == [[1, "127.0.0.1"]]
    # a Ray that keeps the head's temp dir on every node: distinct addresses still tell the nodes apart
    old = {**WORKER_NODE, "NodeManagerAddress": "10.0.0.2", "RayletSocketName": HEAD_NODE["RayletSocketName"]}
    spread = [[0, "10.0.0.1", RAY_DIRS[0]], [1, "10.0.0.2", RAY_DIRS[1]], [2, "10.0.0.3", "/tmp/gpuops-ray-cc-2"]]
    assert launchers.ray_missing(spread, [HEAD_NODE, old]) == [[2, "10.0.0.3"]]
    # the wait runs this function's own source on the head
    assert "def ray_missing(" in launchers._wait_source()


# What `ps -e -o pid= -o ppid= -o pgid= -o args=` and `ls -l /proc/*/fd/` show on a Ray node (rank 0 of run group
# 1000, temp dir /tmp/gpuops-ray-aa-0), with another Ray cluster and a user's processes beside it
PS = """\
    1     0     0 /sbin/init
  500     1   500 sshd: ubuntu [priv]
 1000     1  1000 sh /home/ubuntu/p/.gpuops/runs/r/launch.sh
 1001  1000  1000 sh -c trap 'gpuops_sig=1' ... python3 -m ray.scripts.scripts start --temp-dir=/tmp/gpuops-ray-aa-0
 1010     1  1000 /v/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/gpuops-ray-aa-0/session_x/logs
 1011     1  1000 /v/bin/python -u /v/lib/python3.11/site-packages/ray/_private/log_monitor.py --session-dir=/tmp/gpuops-ray-aa-0/session_x
 1012     1  1000 /v/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/gpuops-ray-aa-0/session_x/sockets/raylet
 1013  1012  1000 ray::DashboardAgent
 1014  1012  1014 ray::train_step
 1015  1014  1014 /v/bin/python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)
 1020  1001  1000 /v/bin/python -u job.py
 1021     1  1000 /v/bin/python -u my_own_helper.py
 1030     1  1030 ray::Holder
 1100     1  1000 /v/lib/python3.9/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/ray/session_y/sockets/raylet
 2000     1  2000 /v/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/gpuops-ray-aa-01/session_z/logs
 2001     1  2000 /v/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/gpuops-ray-aa-01/session_z/sockets/raylet
 2002  2001  2002 ray::IDLE
 2100   500  2100 tail -f /tmp/gpuops-ray-aa-0/session_x/logs/raylet.out
 3000  1001  1000 sh -c trap 'gpuops_sig=1'
 3001  3000  1000 ps -e -ww -o pid= -o ppid= -o pgid= -o args=
 3002  1001  1000 awk
"""
FDS = """\
/proc/1030/fd/:
total 0
l-wx------ 1 ubuntu ubuntu 64 Nov 25 14:33 1 -> /tmp/gpuops-ray-aa-0/session_x/logs/worker-77-ffffffff-1030.out
/proc/2002/fd/:
l-wx------ 1 ubuntu ubuntu 64 Nov 25 14:33 1 -> /tmp/gpuops-ray-aa-01/session_z/logs/worker-88.out
/proc/2100/fd/:
lr-x------ 1 ubuntu ubuntu 64 Nov 25 14:33 3 -> /tmp/gpuops-ray-aa-0/session_x/logs/raylet.out
"""


def ray_select(temp_dir: str, group: str, self_pid: str) -> set[int]:
    from gpuops.jobs.launchers import RAY_PROCS_FN

    res = subprocess.run(["sh", "-c", RAY_PROCS_FN + 'printf "%s@fd\\n%s" "$PS" "$FDS" | gpuops_ray_select "$@"',
                          "sh", temp_dir, group, self_pid],
                         env={"PATH": os.environ["PATH"], "PS": PS, "FDS": FDS}, capture_output=True, text=True,
                         check=True)
    return {int(x) for x in res.stdout.split()}


def test_a_ray_node_ends_its_own_ray_processes_and_nothing_else():
    # its daemons (temp dir), the raylet's children and theirs (own process groups), a worker whose raylet died
    # (its log open under the temp dir), a Ray daemon in the run's group that ignored --temp-dir (Ray < 2.51)
    ours = {1010, 1011, 1012, 1013, 1014, 1015, 1030, 1100}
    assert ray_select("/tmp/gpuops-ray-aa-0", "1000", "1001") == ours
    # never: the node's script (1001) and its ancestors, its own listing (3000-3002), the job and the user's
    # processes, another cluster (2000-2002, a temp dir that only begins like this one), a `tail -f` of a Ray log
    assert ray_select("/tmp/gpuops-ray-aa-0", "", "1001") == ours - {1100}  # no run group known: by temp dir
    assert ray_select("/tmp/gpuops-ray-aa-01", "", "9999") == {2000, 2001, 2002}


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
