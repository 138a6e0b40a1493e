"""`gpuops verify` on a Slurm profile, end to end through the real local cluster (Debian's slurmctld/slurmd/munge, 4
nodes n1..n4 of 8 emulated GPUs each, its login node a sandbox sshd): the CLI in-process, the login node's one
connection, one srun step for every node's probe."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from support.schemas import valid


def write_profile(cluster, name: str = "cl", **slurm) -> Path:
    """A profile of the cluster's login node in this test's project folder (profiles/<name>.yaml)."""
    login = cluster.info["login"]
    doc = {"host": login["host"], "port": login["port"], "user": login["user"], "key": login["key"],
           "remote_dir": str(cluster.shared), "host_key_policy": "accept-new",
           "slurm": {"partition": "gpu", "nodes": 4, "gpus_per_node": 8, **slurm}}
    path = Path("profiles") / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def test_four_nodes_pass_in_one_srun_step(slurm_idle, gpuops, isolated):
    write_profile(slurm_idle)
    r = gpuops("verify", "cl", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    valid("verify", doc)
    assert doc["remote_executions"] == 2 and doc["srun_steps"] == 1  # the cluster's facts, then ONE srun step
    assert [h["host"] for h in doc["hosts"]] == ["n1", "n2", "n3", "n4"]
    assert all(h["code"] == 0 and h["report"]["emulated"] for h in doc["hosts"])
    for h in doc["hosts"]:  # verify's checks per node, and the InfiniBand family's (no IB here: INFO)
        ids = {c["id"]: c["status"] for c in h["report"]["checks"]}
        assert {"gpu.nvidia_smi", "gpu.xid", "python.version"} <= set(ids) and ids["network.ib_ports"] == "info"
    assert doc["slurm"]["partition"] == "gpu" and doc["slurm"]["nodes_verified"] == ["n1", "n2", "n3", "n4"]
    assert doc["fleet"]["verdict"] == "pass" and doc["code"] == 0
    assert {c["id"] for c in doc["checks"]} >= {"slurm.partition", "slurm.node.n1", "slurm.gres", "slurm.nodes",
                                               "slurm.step"}
    saved = sorted(p.name for p in (isolated / "logs" / "env_checks").iterdir())
    assert any(n.endswith("_cl-cluster.json") for n in saved) and len(saved) == 2 + 2 * 4
    assert not list(slurm_idle.shared.glob(".gpuops/verify/probe-*.py"))  # the probe file is removed after the step

    r = gpuops("verify", "cl", "--no-save")
    assert r.code == 0, r.all
    assert "=== cluster: cl" in r.out and "=== node n4 ===" in r.out and "4/4 nodes passed" in r.out
    assert "2 remote execution(s) over one connection, 1 srun step" in r.out
    assert "Traceback" not in r.all


def test_a_drained_node_is_named_with_slurms_reason_and_the_exclude_fix(slurm_idle, gpuops):
    write_profile(slurm_idle)
    slurm_idle.drain("n3", "gpu xid 79 on GPU 2")
    r = gpuops("verify", "cl", "--no-save", "--no-cuda-check")
    assert r.code == 1, r.all
    assert "FAIL  node n3: drained: gpu xid 79 on GPU 2, set by" in r.out
    assert "slurm.exclude: [n3]" in r.out and "--exclude=n3" in r.out
    assert "nodes the job can have: 3 usable (n1, n2, n4)" in r.out
    assert "=== node n3 ===" not in r.out  # Slurm gives no step to a drained node
    # told to keep off it and to ask for 3 nodes, the cluster passes
    write_profile(slurm_idle, nodes=3, exclude=["n3"])
    r = gpuops("verify", "cl", "--no-save", "--no-cuda-check", "--json")
    doc = json.loads(r.out)
    assert r.code == 0, r.all
    assert sorted(h["host"] for h in doc["hosts"]) == ["n1", "n2", "n4"]
    n3 = next(c for c in doc["checks"] if c["id"] == "slurm.node.n3")
    assert n3["status"] == "info" and "slurm.exclude" in n3["measured"]


def test_a_node_whose_gpu_shows_an_xid_is_named(slurm_idle, gpuops):
    write_profile(slurm_idle)
    slurm_idle.set_gpu_fault("n2", "xid=79")
    r = gpuops("verify", "cl", "--no-save", "--no-cuda-check", "--json")
    assert r.code == 1, r.all
    doc = json.loads(r.out)
    by_node = {h["host"]: h for h in doc["hosts"]}
    assert by_node["n2"]["code"] == 1 and all(by_node[n]["code"] == 0 for n in ("n1", "n3", "n4"))
    xid = next(c for c in by_node["n2"]["report"]["checks"] if c["id"] == "gpu.xid")
    assert xid["status"] == "fail" and "79" in xid["measured"]
    assert doc["failed_nodes"][0]["node"] == "n2" and "slurm.exclude: [n2]" in doc["failed_nodes"][0]["fix"]
    r = gpuops("verify", "cl", "--no-save", "--no-cuda-check")
    assert "node n2 failed verify: Xid errors" in r.out and "(failed: n2)" in r.out


def test_a_wrong_partition_is_one_message_and_exit_2(slurm_idle, gpuops):
    write_profile(slurm_idle, partition="nosuch")
    r = gpuops("verify", "cl", "--no-save")
    assert r.code == 2, r.all
    assert "partition 'nosuch' does not exist on this cluster (its partitions: gpu (default))" in r.err
    assert "Traceback" not in r.all and r.err.count("error:") == 1
    write_profile(slurm_idle, gpus_per_node=9)
    r = gpuops("verify", "cl", "--no-save")
    assert r.code == 2 and "offer at most 8 (gres gpu:8)" in r.err, r.all


def test_busy_nodes_do_not_hang_verify(slurm_idle, gpuops):
    write_profile(slurm_idle)
    job = slurm_idle.sbatch("-N4", "--exclusive", "--wrap", "sleep 120")
    slurm_idle.wait_job(job, ("RUNNING",))
    r = gpuops("verify", "cl", "--no-save", "--alloc-wait", "2")
    assert r.code == 1, r.all
    assert "partition gpu has no 4 free node(s) within 2 s" in r.out and "Requested nodes are busy" in r.out
    assert "pending (Resources)" in r.out and f"{job}|" in r.out, r.out  # squeue's reason, and who holds the nodes


def test_profiles_new_slurm_writes_a_profile_verify_accepts(slurm_idle, gpuops, isolated):
    login = slurm_idle.info["login"]
    r = gpuops("profiles", "new", "mycl", "--slurm", "--host", login["host"], "--port", str(login["port"]),
               "--user", login["user"], "--key", login["key"], "--remote-dir", str(slurm_idle.shared))
    assert r.code == 0, r.all
    text = (isolated / "profiles" / "mycl.yaml").read_text()
    prof = yaml.safe_load(text)
    assert prof["slurm"] == {"partition": "gpu", "nodes": 1, "gpus_per_node": 8}
    assert "partition gpu (the default), 4 nodes (4 usable now), gres gpu:8" in text
    assert "filesystem the login node and every node share" in text and prof["remote_dir"] == str(slurm_idle.shared)
    r = gpuops("verify", "mycl", "--no-save", "--no-cuda-check", "--json")
    assert r.code == 0, r.all
    assert len(json.loads(r.out)["hosts"]) == 1
    r = gpuops("profiles", "new", "other", "--slurm", "--host", login["host"], "--port", str(login["port"]),
               "--user", login["user"], "--key", login["key"], "--partition", "nosuch")
    assert r.code == 2 and "--partition 'nosuch': the cluster has no such partition (its partitions: gpu (default))" \
        in r.err, r.all
    assert not (isolated / "profiles" / "other.yaml").exists()


def test_sandbox_up_slurm_then_verify_slurm(starts_hosts, gpuops, monkeypatch, tmp_path):
    """What a user types: `gpuops sandbox up --slurm N && gpuops verify slurm`."""
    monkeypatch.setenv("GPUOPS_STATE_DIR", str(tmp_path / "state"))
    try:
        up = gpuops("sandbox", "up", "--slurm", "2", "--gpus", "4", "--json")
        assert up.code == 0, up.all
        info = json.loads(up.out)
        prof = yaml.safe_load(Path(info["profile_path"]).read_text())
        assert prof["slurm"] == {"partition": "gpu", "nodes": 2, "gpus_per_node": 4}
        assert prof["remote_dir"] == info["shared_dir"]
        r = gpuops("verify", "slurm", "--no-save", "--no-cuda-check")
        assert r.code == 0, r.all
        assert "=== node n1 ===" in r.out and "=== node n2 ===" in r.out and "2/2 nodes passed" in r.out
    finally:
        gpuops("sandbox", "down")


def test_an_account_slurm_does_not_know_is_one_message_where_the_cluster_has_accounting(slurm_accounting_cluster,
                                                                                       gpuops):
    c = slurm_accounting_cluster
    write_profile(c, nodes=2, account="nosuch")
    r = gpuops("verify", "cl", "--no-save", "--no-cuda-check")
    assert r.code == 2, r.all
    assert "slurm.account: 'nosuch' is not one of your accounts on this cluster (" in r.err and "gpuops" in r.err
    write_profile(c, nodes=2, account="gpuops")
    r = gpuops("verify", "cl", "--no-save", "--no-cuda-check")
    assert r.code == 0, r.all
    assert "2/2 nodes passed" in r.out


def test_a_lost_node_is_named_not_responding_and_kept_out_of_the_step(slurm_idle, gpuops):
    write_profile(slurm_idle, nodes=3)
    slurm_idle.kill_node("n4")
    slurm_idle.wait("n4 not responding", lambda: slurm_idle.node_states().get("n4", "").endswith("*"))
    r = gpuops("verify", "cl", "--no-save", "--no-cuda-check", "--json")
    doc = json.loads(r.out)
    n4 = next(c for c in doc["checks"] if c["id"] == "slurm.node.n4")
    assert n4["status"] == "warn" and "not responding" in n4["measured"] and "slurm.exclude: [n4]" in n4["remediation"]
    assert r.code == 0 and sorted(doc["slurm"]["nodes_verified"]) == ["n1", "n2", "n3"], r.all
