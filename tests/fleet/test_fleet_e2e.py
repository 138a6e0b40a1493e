"""Fleets end to end: several hosts in one profile through real sshd, real rsync, real torchrun (gloo on CPU torch)
and a real Ray cluster.

The hosts are the session's sandbox sshd reached as different hosts: each entry has its own remote folder (and, where
a test needs it, its own Python), so runs, logs and syncs are separate per host exactly as on separate machines; the
nodes reach each other on 127.0.0.1."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from support import wait_for
from support.runs import alive, group_alive, kill_run_groups, write


DDP = """\
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} on node {os.environ['GPUOPS_NODE_RANK']} "
      f"sum {t.item():g} master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
      f"ifname {os.environ.get('NCCL_SOCKET_IFNAME')}/{os.environ.get('GLOO_SOCKET_IFNAME')}", flush=True)
dist.destroy_process_group()
"""

RAY_JOB = """\
import os, ray
ray.init()
alive = [n for n in ray.nodes() if n["Alive"]]
print("RAYNODES", len(alive), flush=True)
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

@ray.remote(num_cpus=0)
def node_rank():
    return os.environ["GPUOPS_NODE_RANK"]

ranks = ray.get([node_rank.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
                 for n in alive])
print("ray tasks ran on nodes", sorted(ranks), flush=True)
"""

# a detached actor on each node (a Ray worker in its own process group, outliving the driver), each with a child
# process of its own (what a task's data loader or tool would be)
RAY_HOLDERS = """\
import os, subprocess, time, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init()
alive = [n for n in ray.nodes() if n["Alive"]]

@ray.remote(num_cpus=0)
class Holder:
    def __init__(self):
        self.child = subprocess.Popen(["sleep", "300"])

    def pids(self):
        return [os.getpid(), self.child.pid]

holders = [Holder.options(name=f"holder{i}", lifetime="detached",
                          scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
           for i, n in enumerate(alive)]
print("RAYNODES", len(alive), "holders", *[p for h in holders for p in ray.get(h.pids.remote())], flush=True)
time.sleep(300)
"""

SLEEPER = """\
import os, time
print("node", os.environ["GPUOPS_NODE_RANK"], "pid", os.getpid(), flush=True)
open(f"pid-{os.environ['GPUOPS_NODE_RANK']}", "w").write(str(os.getpgid(0)))
time.sleep(300)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_dir(sandbox, rank: int) -> Path:
    return Path(sandbox["dir"]) / "home" / f"{Path.cwd().name}-n{rank}"


def fleet_profile(sandbox, n: int = 2, pythons: list | None = None, name: str = "fleet") -> str:
    base = yaml.safe_load(Path(sandbox["profile"]).read_text())
    doc = {k: base[k] for k in ("port", "user", "key", "python", "host_key_policy") if k in base}
    doc["expect"] = {"gpu_count": 1}
    doc["hosts"] = []
    for i in range(n):
        h = {"host": "127.0.0.1", "remote_dir": f"~/{Path.cwd().name}-n{i}"}
        if pythons and pythons[i]:
            h["python"] = pythons[i]
        doc["hosts"].append(h)
    write(Path.cwd() / "profiles" / f"{name}.yaml", yaml.safe_dump(doc))
    return name


def ray_dirs(sandbox, rid: str, n: int = 2) -> list[str]:
    """Each node's Ray temp dir, as the node's launcher was given it (`--temp-dir` in its recorded command)."""
    dirs = []
    for i in range(n):
        m = json.loads((node_dir(sandbox, i) / ".gpuops" / "runs" / rid / "meta.json").read_text())
        dirs.append(re.search(r"--temp-dir=(/[^\s'\"]+)", m["command_shell"]).group(1))
    return dirs


def ray_processes(dirs) -> dict[int, str]:
    """The live processes of the Ray nodes with these temp dirs: {pid: command line}. Ray's daemons name the dir
    on their command lines; its workers rename themselves `ray::...` but keep their logs there open."""
    found = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            if (p / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            files = []
            for fd in (p / "fd").iterdir():
                try:
                    files.append(os.readlink(fd))
                except OSError:
                    pass
        except OSError:
            continue
        if any(f"{d}/" in cmd or any(f.startswith(f"{d}/") for f in files) for d in dirs):
            found[int(p.name)] = cmd
    return found


def end_ray(dirs) -> None:
    for pid in ray_processes(dirs):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def cleanup(sandbox):
    yield
    runs = list(Path(sandbox["dir"], "home").glob(f"{Path.cwd().name}-n*/.gpuops/runs/*"))
    kill_run_groups(runs)
    for d in runs:  # a failed test's Ray nodes, and the Ray files every run leaves in /tmp
        try:
            text = (d / "meta.json").read_text()
        except OSError:
            continue
        end_ray(re.findall(r"--temp-dir=(/tmp/gpuops-ray-[0-9a-f]+-[0-9]+)", text))


@pytest.fixture(scope="module")
def other_ray(dist_python):
    """A Ray cluster that is not this run's (another run's, or the user's own) on the same machine: gpuops must leave
    it running."""
    d = tempfile.mkdtemp(prefix="gpuops-other-ray-", dir="/tmp")
    port = free_port()
    subprocess.run([dist_python, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}",
                    "--node-ip-address=127.0.0.1", f"--temp-dir={d}", "--disable-usage-stats",
                    "--include-dashboard=false", "--num-cpus=1"],
                   check=True, capture_output=True, start_new_session=True, timeout=180)
    daemons = {pid for pid, cmd in ray_processes([d]).items() if f"{d}/" in cmd}  # not its workers: Ray ends idle ones
    assert len(daemons) >= 3, daemons  # GCS, raylet, the monitors: what a `ray stop` would end

    def alive() -> bool:
        with socket.socket() as s:
            s.settimeout(2)
            reachable = s.connect_ex(("127.0.0.1", port)) == 0
        return reachable and daemons <= set(ray_processes([d]))

    yield SimpleNamespace(dir=d, port=port, daemons=daemons, alive=alive)
    end_ray([d])


pytestmark = pytest.mark.usefixtures("cleanup")


def test_verify_runs_every_host_in_parallel_and_names_differences(sandbox, gpuops, dist_python):
    p = fleet_profile(sandbox, 2, pythons=[None, dist_python])
    res = gpuops("verify", p, "--json", "--no-cuda-check")
    doc = json.loads(res.out)
    assert [h["rank"] for h in doc["hosts"]] == [0, 1] and all(h["report"] for h in doc["hosts"]), doc["hosts"]
    checks = {c["id"]: c for c in doc["fleet"]["checks"]}
    assert checks["fleet.gpu_model"]["status"] == "pass"
    assert checks["fleet.pkg.torch"]["status"] == "fail"
    assert "2.13.0+cpu on #1" in checks["fleet.pkg.torch"]["measured"] and "- on #0" in checks["fleet.pkg.torch"]["measured"]
    assert checks["fleet.reach.1"]["status"] == "pass"  # the path to rank 0's rendezvous port works
    assert res.code == 1
    # plain: one section per host, the fleet section and a summary line
    res = gpuops("verify", p, "--no-cuda-check", "--no-save")
    assert "=== host #0" in res.out and "=== host #1" in res.out and "=== fleet: 2 hosts ===" in res.out
    assert "same torch on every host" in res.out and res.code == 1
    # --host N is one host, as a one-host profile (host 1's CPU-only torch on a GPU host fails on its own)
    res = gpuops("verify", p, "--host", "0", "--json", "--no-cuda-check", "--no-save")
    assert json.loads(res.out)["facts"]["packages"]["torch"] is None and res.code == 0, res.all
    res = gpuops("verify", p, "--host", "1", "--json", "--no-cuda-check", "--no-save")
    assert json.loads(res.out)["facts"]["packages"]["torch"] == "2.13.0+cpu" and res.code == 1, res.all
    assert gpuops("verify", p, "--host", "2").code == 2


def test_verify_runs_every_host_of_a_fleet_at_once(sandbox, gpuops, tmp_path):
    """Ten hosts, more than the 8 at a time verify's pool used to hold: each host's probe waits (a user check) until
    all ten probes have started. With 8 at a time, the first eight waited for hosts that could not start until they
    gave up; with every host at once, all ten meet."""
    from gpuops.paths import data_dir

    n = 10
    p = fleet_profile(sandbox, n)
    meet = tmp_path / "meet"
    meet.mkdir()
    wait = (f"touch {meet}/$$; i=0; while [ $(ls {meet} | wc -l) -lt {n} ] && [ $i -lt 600 ]; do sleep 0.1; "
            f"i=$((i+1)); done; [ $(ls {meet} | wc -l) -ge {n} ]")
    pb = yaml.safe_load((data_dir("playbooks") / "verify.yaml").read_text())
    pb["user_checks"] = [{"name": "meet", "command": wait, "timeout": 90}]
    write(tmp_path / "meet.yaml", yaml.safe_dump(pb))
    res = gpuops("verify", p, "--json", "--no-cuda-check", "--no-save", "--playbook", str(tmp_path / "meet.yaml"))
    doc = json.loads(res.out)
    met = [next(c["status"] for c in h["report"]["checks"] if c["id"] == "user.meet") for h in doc["hosts"]]
    assert met == ["pass"] * n, met
    assert len(list(meet.iterdir())) == n


def test_unreachable_host_is_its_own_result_and_exit_3(sandbox, gpuops):
    p = fleet_profile(sandbox, 2)
    doc = yaml.safe_load((Path.cwd() / "profiles" / f"{p}.yaml").read_text())
    doc["hosts"][1]["port"] = free_port()  # nothing listens there
    doc["connect_timeout"] = 2
    write(Path.cwd() / "profiles" / f"{p}.yaml", yaml.safe_dump(doc))
    res = gpuops("verify", p, "--no-cuda-check", "--no-save")
    assert res.code == 3
    assert "=== host #0" in res.out and "PASS" in res.out
    assert "host #1 (127.0.0.1)" in res.err


def test_sync_to_every_host(sandbox, gpuops):
    p = fleet_profile(sandbox, 3)
    write(Path.cwd() / "train.py", "print('hi')\n")
    res = gpuops("sync", "-p", p)
    assert res.code == 0, res.all
    assert res.out.count("synced to") == 3 and "sync: 3/3 hosts ok" in res.out
    for i in range(3):
        assert (node_dir(sandbox, i) / "train.py").read_text() == "print('hi')\n"


def test_torchrun_across_two_hosts_all_reduces(sandbox, gpuops, dist_python):
    p = fleet_profile(sandbox, 2, pythons=[dist_python, dist_python])
    write(Path.cwd() / "ddp.py", DDP)
    port = free_port()
    res = gpuops("train", "-p", p, "--script", "ddp.py", "--launcher", "torchrun", "--master-port", str(port),
                 "--no-snapshot", "--json", "--force")  # CPU torch on emulated GPUs: the launch gate's refusal
    assert res.code == 0, res.all
    doc = json.loads(res.out)
    rid = doc["run_id"]
    assert [n["rank"] for n in doc["nodes"]] == [0, 1] and doc["nproc_per_node"] == 1
    res = gpuops("logs", "-f", rid, "-p", p)  # rank 0's log, until every host's job has ended
    assert res.code == 0, res.all
    assert f"rank 0 of 2 on node 0 sum 3 master 127.0.0.1:{port} ifname lo/lo" in res.out  # the interface of 127.0.0.1
    res = gpuops("logs", "--all", rid, "-p", p)
    assert "[#0 127.0.0.1] rank 0 of 2 on node 0 sum 3" in res.out
    assert "[#1 127.0.0.1] rank 1 of 2 on node 1 sum 3" in res.out
    m = json.loads((node_dir(sandbox, 1) / ".gpuops" / "runs" / rid / "meta.json").read_text())
    assert m["env"]["NODE_RANK"] == "1" and m["env"]["WORLD_SIZE"] == "2" and m["env"]["GPUOPS_NUM_NODES"] == "2"
    assert m["command"][:4] == [dist_python, "-m", "torch.distributed.run", "--nnodes"]


def ray_fleet(sandbox, dist_python, pythons=None) -> str:
    return fleet_profile(sandbox, 2, pythons=pythons or [dist_python, dist_python])


def train_ray(gpuops, p: str, script: str, *extra) -> str:
    res = gpuops("train", "-p", p, "--script", script, "--launcher", "ray", "--master-port", str(free_port()),
                 "--no-snapshot", "--json", "--force", *extra)  # --force: CPU torch on emulated GPUs (the gate)
    assert res.code == 0, res.all
    return json.loads(res.out)["run_id"]


def test_ray_cluster_across_two_hosts_runs_a_task_on_each(sandbox, gpuops, dist_python, other_ray):
    p = ray_fleet(sandbox, dist_python)
    write(Path.cwd() / "rayjob.py", RAY_JOB)
    rid = train_ray(gpuops, p, "rayjob.py")
    res = gpuops("logs", "-f", rid, "-p", p)
    assert res.code == 0, res.all
    assert "RAYNODES 2" in res.out  # every node joined before the script started: it waits for nothing itself
    assert "ray tasks ran on nodes ['0', '1']" in res.out
    assert "gpuops: 2 of 2 Ray nodes joined" in res.out
    m = json.loads((Path.cwd() / "runs" / rid / "meta.json").read_text())
    assert "--port=" in m["command_shell"] and "--dashboard-host=127.0.0.1" in m["command_shell"]
    res = gpuops("logs", "--all", rid, "-p", p)
    assert "[#1 127.0.0.1] gpuops: the Ray head has gone; leaving the cluster" in res.out
    dirs = ray_dirs(sandbox, rid)
    wait_for(lambda: not ray_processes(dirs), timeout=5, what=f"no Ray process of {rid} left")
    assert other_ray.alive()  # another cluster on the same machine is not this run's to end


def test_stop_ends_every_ray_process_of_the_run_and_only_those(sandbox, gpuops, dist_python, other_ray):
    p = ray_fleet(sandbox, dist_python)
    write(Path.cwd() / "holders.py", RAY_HOLDERS)
    rid = train_ray(gpuops, p, "holders.py")
    runs = [node_dir(sandbox, i) / ".gpuops" / "runs" / rid for i in range(2)]
    line = wait_for(lambda: next((x for x in (runs[0] / "log").read_text().splitlines() if x.startswith("RAYNODES")),
                                 None), timeout=120, what="the job's detached actors")
    pids = [int(x) for x in line.split()[3:]]
    assert line.startswith("RAYNODES 2 holders") and len(pids) == 4, line
    dirs = ray_dirs(sandbox, rid)
    for d in dirs:  # each node has its Ray processes, the actors and their children (own process groups) among them
        assert any("raylet" in c for c in ray_processes([d]).values())
    assert set(pids) <= set(ray_processes(dirs))
    res = gpuops("stop", rid, "-p", p, "--grace", "2")
    assert res.code == 0, res.all
    wait_for(lambda: not ray_processes(dirs), timeout=3, what=f"no Ray process of {rid} left")
    assert not [pid for pid in pids if alive(pid)]
    assert other_ray.alive()


def test_a_node_that_never_joins_fails_the_run_in_the_bounded_wait(sandbox, gpuops, dist_python, other_ray):
    # host #1's python has no Ray: its node never starts, so it never joins the head (the preflight names this;
    # --force, needed anyway for CPU torch on emulated GPUs, launches regardless)
    p = ray_fleet(sandbox, dist_python, pythons=[dist_python, sys.executable])
    write(Path.cwd() / "rayjob.py", RAY_JOB)
    rid = train_ray(gpuops, p, "rayjob.py", "--env", "GPUOPS_RAY_JOIN_TIMEOUT=8")
    res = gpuops("logs", "-f", rid, "-p", p)  # until every host's job has ended
    assert res.code == 1, res.all
    # the wait was the 8 s asked for, never the default 3 minutes: the head says so (its own words, not a clock here,
    # which a loaded machine's slow head start would make flaky)
    head = node_dir(sandbox, 0) / ".gpuops" / "runs" / rid
    assert (head / "exit_code").read_text().strip() == "69"
    assert "RAYNODES" not in res.out  # the script never started
    assert "1 of 2 Ray nodes joined in 8 s; missing: host #1 (127.0.0.1)" in res.out, res.out
    res = gpuops("logs", "--all", rid, "-p", p)
    assert "[#1 127.0.0.1] gpuops: this host could not join the Ray cluster at 127.0.0.1:" in res.out, res.out
    dirs = ray_dirs(sandbox, rid)
    wait_for(lambda: not ray_processes(dirs), timeout=5, what=f"no Ray process of {rid} left")
    assert other_ray.alive()


def test_a_join_timeout_that_is_not_seconds_is_refused_before_anything_happens(sandbox, gpuops):
    p = fleet_profile(sandbox, 2)
    write(Path.cwd() / "rayjob.py", RAY_JOB)
    res = gpuops("train", "-p", p, "--script", "rayjob.py", "--launcher", "ray", "--env",
                 "GPUOPS_RAY_JOIN_TIMEOUT=soon")
    assert res.code == 2, res.all
    assert "GPUOPS_RAY_JOIN_TIMEOUT must be a whole number of seconds, at least 1 (got 'soon')" in res.err
    assert not node_dir(sandbox, 0).exists()  # not even synced


def test_stop_ends_the_job_on_every_host_and_status_shows_each(sandbox, gpuops):
    p = fleet_profile(sandbox, 2)
    write(Path.cwd() / "sleeper.py", SLEEPER)
    res = gpuops("train", "-p", p, "--script", "sleeper.py", "--no-snapshot", "--json")
    assert res.code == 0, res.all
    rid = json.loads(res.out)["run_id"]
    pgids = [int(wait_for(lambda i=i: (node_dir(sandbox, i) / f"pid-{i}").exists() and
                          (node_dir(sandbox, i) / f"pid-{i}").read_text(), what=f"node {i}")) for i in range(2)]
    res = gpuops("status", "-p", p)
    assert res.out.count("running") >= 2 and "=== host #1" in res.out, res.all
    res = gpuops("stop", rid, "-p", p, "--grace", "1")
    assert res.code == 0, res.all
    assert "host #0" in res.err and "host #1" in res.err
    for g in pgids:
        wait_for(lambda g=g: not group_alive(g), what="job ended")
    res = gpuops("status", "-p", p, "--json")
    states = [r["state"] for h in json.loads(res.out)["hosts"] for r in h["runs"]]
    assert states == ["stopped", "stopped"], res.out


def test_one_host_failing_to_launch_stops_the_others(sandbox, gpuops):
    p = fleet_profile(sandbox, 2)
    write(Path.cwd() / "sleeper.py", SLEEPER)
    assert gpuops("sync", "-p", p).code == 0
    (node_dir(sandbox, 1) / ".gpuops").mkdir(exist_ok=True)
    (node_dir(sandbox, 1) / ".gpuops" / "runs").write_text("not a folder")  # run folders cannot be made on host 1
    res = gpuops("train", "-p", p, "--script", "sleeper.py", "--no-sync", "--no-snapshot")
    assert res.code == 1, res.all
    assert "failed to launch" in res.err and "host #1" in res.err
    runs = list((node_dir(sandbox, 0) / ".gpuops" / "runs").iterdir())
    assert len(runs) == 1
    wait_for(lambda: (runs[0] / "exit_code").exists(), what="host 0's job stopped")
    assert (runs[0] / "stop.json").exists()
    assert not (Path.cwd() / "runs").exists() or not any((Path.cwd() / "runs").iterdir())


def test_setup_on_every_host_in_parallel(sandbox, gpuops):
    home = Path(sandbox["dir"]) / "home"
    tag = Path.cwd().name
    p = fleet_profile(sandbox, 2, pythons=[f"~/{tag}-env0/bin/python", f"~/{tag}-env1/bin/python"])
    f = Path.cwd() / "profiles" / f"{p}.yaml"
    doc = yaml.safe_load(f.read_text())
    doc["setup"] = {"index_url": "file:///opt/pypi/simple", "install_uv": False}
    doc["expect"] = {"gpu_count": 1, "packages": {"six": "1.17.0"}}
    f.write_text(yaml.safe_dump(doc))
    write(Path.cwd() / "requirements.txt", "six==1.17.0\n")
    assert gpuops("sync", "-p", p).code == 0
    r = gpuops("setup", p)
    assert r.code == 0, r.all
    assert "=== host #0" in r.out and "=== host #1" in r.out and "setup: 2/2 hosts ok" in r.out
    for i in range(2):
        assert (home / f"{tag}-env{i}" / "bin" / "python").exists()
    r = gpuops("setup", p)  # idempotent on every host
    assert r.code == 0 and r.out.count("nothing installed") == 2, r.all


def test_watch_shows_every_hosts_gpus_and_host_0s_log(sandbox, gpuops):
    p = fleet_profile(sandbox, 2)
    write(Path.cwd() / "short.py", "import os, time\nfor i in range(8):\n"
                                   "    print('node', os.environ['GPUOPS_NODE_RANK'], 'step', i, flush=True)\n"
                                   "    time.sleep(0.5)\n")
    res = gpuops("train", "-p", p, "--script", "short.py", "--no-snapshot", "--json")
    assert res.code == 0, res.all
    rid = json.loads(res.out)["run_id"]
    res = gpuops("watch", rid, "-p", p, "--json", "--interval", "0.3")
    assert res.code == 0, res.all
    docs = [json.loads(line) for line in res.out.splitlines() if line.strip()]
    samples = [d for d in docs if d["type"] == "sample"]
    assert {d["rank"] for d in samples} == {0, 1}, samples  # host 1's GPUs through its own sample stream
    logs = [d["line"] for d in docs if d["type"] == "log"]
    assert "node 0 step 7" in logs and not any(line.startswith("node 1") for line in logs)  # host 0's log


TWO_DEATHS = """\
import os, time
rank = os.environ["GPUOPS_NODE_RANK"]
print("node", rank, flush=True)
time.sleep(1.0)
if rank == "1":
    from json import nothing_here
open("data/train.bin", "rb")
"""


def test_every_hosts_death_is_explained_in_watch_and_status(sandbox, gpuops):
    """issue 35 (review): only the followed host got an ending; host 1's ImportError was `failed (exit 1)` alone,
    and `status` showed host 0's cause for host 1 (one state.json for both)."""
    p = fleet_profile(sandbox, 2)
    write(Path.cwd() / "deaths.py", TWO_DEATHS)
    res = gpuops("train", "-p", p, "--script", "deaths.py", "--no-snapshot", "--json")
    assert res.code == 0, res.all
    rid = json.loads(res.out)["run_id"]
    res = gpuops("watch", rid, "-p", p, "--interval", "0.3", "--lines", "50")
    assert res.code == 1, res.all
    assert "why it ended: a file the job reads is not on the instance: data/train.bin" in res.err, res.err
    assert ("host #1: failed (exit 1): an import failed: ImportError: cannot import name 'nothing_here' from "
            "'json'") in res.err, res.err
    assert "evidence: log: ImportError: cannot import name 'nothing_here'" in res.err
    assert res.err.strip().splitlines()[-1] == f"run {rid}: failed (the hosts above say which, and why)", res.err
    res = gpuops("watch", rid, "-p", p, "--json", "--interval", "0.3")
    from support.schemas import valid

    docs = [json.loads(x) for x in res.out.splitlines() if x.strip()]
    for d in docs:
        valid("watch", d)
    ends = [d for d in docs if d["type"] == "ending"]
    assert docs[-1]["type"] == "ending"
    assert {(e.get("rank"), e["cause"]) for e in ends} == {(1, "import-error"), (None, "file-missing")}, ends
    st = json.loads(gpuops("status", "-p", p, "--json").out)
    valid("status", st)
    causes = [[r.get("ending", {}).get("cause") for r in h["runs"] if r["run_id"] == rid] for h in st["hosts"]]
    assert causes == [["file-missing"], ["import-error"]], causes
    plain = gpuops("status", "-p", p).out
    assert f"{rid}: why it ended: an import failed" in plain, plain
