"""The pure parts of verify on a Slurm cluster: the srun step's arguments and script, its output split back per node
(slurm/probe_step.py), and the profile's `slurm:` judged against sinfo and scontrol (slurm/cluster_checks.py), on
Slurm 22.05's recorded outputs where there are ones."""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuops.profiles.model import SlurmSettings
from gpuops.slurm import cluster_checks as cc
from gpuops.slurm import probe_step as ps
from gpuops.slurm.nodes import parse_sinfo

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm" / "22.05"

SINFO = """n1|gpu*|idle|gpu:8|16|64000|Unknown|Unknown|none
n2|gpu*|mixed|gpu:8|16|64000|Unknown|Unknown|none
n3|gpu*|drained|gpu:8|16|64000|root|2026-12-06T23:04:07|gpu xid 79 on GPU 2
n4|gpu*|down*|gpu:8|16|64000|slurm|2026-12-06T23:05:00|Not responding
c1|cpu|idle|(null)|64|256000|Unknown|Unknown|none
"""
PARTS = ("PartitionName=gpu AllowAccounts=ALL AllowQos=ALL Default=YES MaxTime=1-00:00:00 Nodes=n[1-4] State=UP "
         "TotalNodes=4\nPartitionName=cpu AllowAccounts=physics AllowQos=ALL Default=NO MaxTime=UNLIMITED "
         "Nodes=c1 State=UP TotalNodes=1\n")


def test_srun_argv_asks_one_task_per_node_with_every_option():
    spec = ps.StepSpec(nodes=3, partition="gpu", account="ml lab", qos="high", exclude=["n3"], gpus_per_node=8,
                       gpu_type="h100", wait_s=15, limit_s=150)
    argv = ps.srun_argv(spec)
    assert argv[:2] == ["srun", "--job-name=gpuops-verify"]
    assert {"--nodes=3", "--ntasks-per-node=1", "--label", "--immediate=15", "--time=3", "--partition=gpu",
            "--account=ml lab", "--qos=high", "--exclude=n3", "--gres=gpu:h100:8"} <= set(argv)
    spec.gpu_option = "gpus-per-node"
    assert "--gpus-per-node=h100:8" in ps.srun_argv(spec)
    script = ps.step_script(spec, folder='"$HOME"/\'my proj\'', python="~/venv/bin/python", token="abc")
    assert "'--account=ml lab'" in script and '"$HOME"/venv/bin/python' in script  # quoted; ~ kept as the home
    assert "cat > .gpuops/verify/probe-abc.py" in script and "rm -f .gpuops/verify/probe-abc.py" in script


def test_the_tagged_probe_splits_back_per_node_from_interleaved_labelled_output():
    docs = {"n1": {"a": "x" * 2000, "n": 1}, "n2": {"b": "é" * 900, "n": 2}}
    lines = {}
    for rank, (node, doc) in enumerate(docs.items()):
        code = ps.TAG_PRELUDE + f"import json\nprint(json.dumps({doc!r}))\nsys.stdout.flush()\n"
        proc = subprocess.run([sys.executable, "-c", "import sys\n" + code], capture_output=True, text=True,
                              env={"SLURMD_NODENAME": node, "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stderr
        assert all(len(ln) < 1024 for ln in proc.stdout.splitlines())
        lines[rank] = [f"{rank}: {ps.TASK_MARK} {rank} {node}"] + [f"{rank}: {ln}" for ln in proc.stdout.splitlines()]
    mixed = [ln for pair in itertools.zip_longest(lines[0], lines[1]) for ln in pair if ln]  # each in turn
    out = ps.split_step("\n".join(mixed), "1: Traceback (most recent call last)\nsrun: error: n2: task 1: Exited\n")
    assert {n: json.loads(t) for n, t in out.docs.items()} == docs
    assert out.nodes == ["n1", "n2"] and out.task_errors == {"n2": ["Traceback (most recent call last)"]}
    assert out.srun_errors == ["srun: error: n2: task 1: Exited"] and ps.allocation_failed(out) is None


def test_a_cut_document_is_not_taken_and_a_refused_step_says_why():
    out = ps.split_step(f"0: {ps.NODE_MARK} n1 0/2 {{\"a\"", "")
    assert out.docs == {} and out.partial == ["n1"]
    busy = ps.split_step("", "srun: job 12 queued and waiting for resources\nsrun: error: Unable to allocate "
                             "resources: Requested nodes are busy\n")
    assert busy.job_id == "12" and ps.nodes_busy(busy)
    assert ps.allocation_failed(busy) == "Unable to allocate resources: Requested nodes are busy"
    bad = ps.split_step("", "srun: error: Unable to allocate resources: Requested node configuration is not "
                            "available\n")
    assert not ps.nodes_busy(bad) and "configuration" in ps.allocation_failed(bad)


def test_login_script_sections_parse():
    text = ("@@gpuops sinfo\nn1|gpu*|idle|gpu:8|16|64000|Unknown|Unknown|none\n@@gpuops rc 0\n@@gpuops partitions\n"
            "@@gpuops rc 1\n@@gpuops home\n/home/me\n@@gpuops rc 0\n")
    sec = ps.parse_sections(text)
    assert sec["sinfo"][0] == 0 and sec["sinfo"][1].startswith("n1|") and sec["partitions"] == (1, "")
    assert sec["home"] == (0, "/home/me")
    assert "sinfo --all --noheader --Node" in ps.login_script() and "sacctmgr" in ps.login_script()


def _plan(**settings):
    s = SlurmSettings(**settings)
    return s, cc.resolve(s, parse_sinfo(SINFO), cc.parse_partitions(PARTS))


def test_drained_and_down_nodes_are_named_with_slurms_reason_and_the_fix():
    s, plan = _plan(partition="gpu", nodes=4, gpus_per_node=8)
    assert not plan.problems and [n.name for n in plan.usable] == ["n1", "n2"]
    res = {r.id: r for r in cc.node_results(s, plan)}
    assert res["slurm.node.n1"].status == "pass" and res["slurm.node.n2"].status == "pass"
    n3 = res["slurm.node.n3"]
    assert n3.status == "fail" and "gpu xid 79 on GPU 2, set by root at 2026-12-06T23:04:07" in n3.measured
    assert "slurm.exclude: [n3]" in n3.remediation and "--exclude=n3" in n3.remediation
    assert res["slurm.node.n4"].status == "fail" and "not responding" in res["slurm.node.n4"].measured
    assert res["slurm.nodes"].status == "fail" and "2 usable" in res["slurm.nodes"].measured
    s, plan = _plan(nodes=2, exclude=["n4"])  # enough without them: the drained one is a warning, the excluded said
    res = {r.id: r for r in cc.node_results(s, plan)}
    assert plan.partition.name == "gpu" and res["slurm.node.n3"].status == "warn"
    assert res["slurm.node.n4"].status == "info" and res["slurm.nodes"].status == "pass"


@pytest.mark.parametrize("settings, words", [
    ({"partition": "nosuch"}, "partition 'nosuch' does not exist on this cluster (its partitions: gpu (default), cpu)"),
    ({"gpus_per_node": 9}, "offer at most 8 (gres gpu:8)"),
    ({"gpu_type": "a100", "gpus_per_node": 1}, "name no GPU type"),
    ({"nodes": 5}, "5 nodes asked; partition gpu has 4"),
    ({"nodelist": ["n[1-2]", "n9"]}, "slurm.nodelist names n9"),
    ({"time": "2-00:00:00"}, "over partition gpu's limit (MaxTime 1-00:00:00)"),
    ({"time": "soon"}, "is not a Slurm time"),
    ({"partition": "cpu", "account": "ml"}, "may not use partition cpu (AllowAccounts physics)"),
])
def test_what_slurm_would_refuse_is_a_profile_problem(settings, words):
    _, plan = _plan(**settings)
    assert any(words in p for p in plan.problems), plan.problems


def test_accounts_are_judged_only_where_the_cluster_has_accounting():
    s = SlurmSettings(account="ml", qos="high")
    nodes, parts = parse_sinfo(SINFO), cc.parse_partitions(PARTS)
    assert not cc.resolve(s, nodes, parts, None).problems
    assoc = cc.parse_assoc("physics|gpu|normal,high\n")
    assert any("'ml' is not one of your accounts on this cluster (physics)" in p
               for p in cc.resolve(s, nodes, parts, assoc).problems)


def test_recorded_sinfo_of_slurm_22_05_with_a_drained_node():
    text = (DATA / "sinfo_nodes_drained.txt").read_text()
    nodes = parse_sinfo(text, fields=("node", "state", "gres", "cpus", "memory_mb", "reason"))
    for n in nodes:
        n.partition, n.default_partition = "gpu", True
    s = SlurmSettings(nodes=4, gpus_per_node=8)
    plan = cc.resolve(s, nodes, [])
    res = {r.id: r for r in cc.node_results(s, plan)}
    assert res["slurm.node.n3"].status == "fail" and "gpu xid 79 on GPU 2" in res["slurm.node.n3"].measured
    assert res["slurm.node.n1"].status == "pass" and "allocated" in res["slurm.node.n1"].measured


def test_a_node_without_a_report_says_why_and_fleet_differences_are_named_by_node():
    from types import SimpleNamespace

    from gpuops.slurm import verify_cluster as vc
    from gpuops.verify.results import CheckResult

    prof = SimpleNamespace(name="cl", user="me", port=22, python="python3")
    step = ps.split_step(f"0: {ps.TASK_MARK} 0 n1\n1: {ps.TASK_MARK} 1 n2\n",
                         "1: python3: can't open file '/x/.gpuops/verify/probe-a.py': [Errno 2] No such file\n")
    from datetime import datetime, timezone

    rep = vc.no_report(prof, "n2", 1, step, datetime(2026, 12, 6, tzinfo=timezone.utc))
    assert rep["verdict"] == "fail" and "filesystem the login node and the nodes share" in rep["checks"][0]["remediation"]
    hosts = [{"host": "n2", "code": 1, "report": rep}]
    assert vc.failed_nodes(hosts)[0]["fix"].startswith("keep jobs off it: `slurm.exclude: [n2]`")
    r = vc._named(CheckResult("fleet.driver", "same NVIDIA driver on every host", "warn",
                              measured="570 on #0, #2; 580 on #1"),
                  [{"node": 0, "slurm_node": "n1"}, {"node": 1, "slurm_node": "n2"}, {"node": 2, "slurm_node": "n4"}])
    assert r.measured == "570 on n1, n4; 580 on n2" and r.title == "same NVIDIA driver on every node"


def test_a_partition_for_other_groups_is_a_profile_problem():
    parts = cc.parse_partitions(PARTS.replace("PartitionName=gpu AllowAccounts=ALL", "PartitionName=gpu "
                                              "AllowGroups=admins,ops AllowAccounts=ALL"))
    s = SlurmSettings(partition="gpu")
    plan = cc.resolve(s, parse_sinfo(SINFO), parts, None, ["me", "users"])
    assert plan.problems == ["partition gpu is for the groups admins, ops (AllowGroups); yours: me, users"]
    assert not cc.resolve(s, parse_sinfo(SINFO), parts, None, ["ops"]).problems
    assert not cc.resolve(s, parse_sinfo(SINFO), parts, None, None).problems  # unknown: not judged
