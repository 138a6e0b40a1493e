"""`gpuops verify --bench` on a Slurm profile adds an all-reduce ACROSS the nodes, end to end through the real local
cluster (4 nodes on this machine, CPU only, emulated nvidia-smi): a second srun step over the nodes the probe
verified, torch.distributed over gloo (no CUDA: no NCCL), its figure in the cluster's report. Without --bench there
is no such step. The figures are loopback's, not a cluster's network (docs/slurm.md says so)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from support.schemas import valid


def _profile(cluster, python: str, nodes: int = 2) -> None:
    login = cluster.info["login"]
    doc = {"host": login["host"], "port": login["port"], "user": login["user"], "key": login["key"],
           "remote_dir": str(cluster.shared), "host_key_policy": "accept-new", "python": python,
           "slurm": {"partition": "gpu", "nodes": nodes, "gpus_per_node": 8}}
    Path("profiles").mkdir(exist_ok=True)
    Path("profiles/cl.yaml").write_text(yaml.safe_dump(doc))


def _allreduce_jobs(cluster) -> set[str]:
    """The all-reduce steps' jobs slurmctld still remembers (finished ones too, for MinJobAge)."""
    p = cluster.run(["squeue", "--noheader", "--states=all", "--name=gpuops-allreduce", "--format=%i"])
    return set(p.stdout.split())


def test_bench_all_reduces_across_two_nodes_over_gloo_and_reports_the_figure(slurm_idle, gpuops, dist_python,
                                                                             isolated):
    _profile(slurm_idle, dist_python)
    before = _allreduce_jobs(slurm_idle)
    r = gpuops("verify", "-p", "cl", "--bench", "--no-cuda-check", "--json")
    doc = json.loads(r.out)
    valid("verify", doc)
    assert "Traceback" not in r.all
    assert doc["remote_executions"] == 3 and doc["srun_steps"] == 2  # the cluster's facts, the probe, the all-reduce
    ar = doc["allreduce"]
    assert ar["backend"] == "gloo" and ar["world"] == 2 and ar["nodes"] == doc["slurm"]["nodes_verified"], ar
    assert [s["size_bytes"] for s in ar["sizes"]] == [16 << 20, 64 << 20] and not ar["errors"]
    assert all(s["busbw_gbs"] > 0 and s["wrong"] == 0 and s["iters"] >= 3 for s in ar["sizes"])
    assert ar["transport"] is None and ar["busbw_gbs"] == max(s["busbw_gbs"] for s in ar["sizes"])
    line = next(c for c in doc["checks"] if c["id"] == "network.busbw")
    assert line["status"] == "info" and f"{ar['busbw_gbs']:.2f} GB/s bus bandwidth" in line["measured"]
    assert "gloo over TCP: no NCCL on this cluster" in line["measured"] and "2 ranks on 2 nodes" in line["measured"]
    assert doc["slurm"]["verdict"] == "pass"  # the figure is INFO: the nodes' own checks (CPU torch) are theirs
    assert len(_allreduce_jobs(slurm_idle) - before) == 1  # one srun step of its own
    text = next((isolated / "logs" / "env_checks").glob("*_cl-cluster.txt")).read_text()
    assert "INFO  all_reduce across 2 nodes (gloo):" in text and "3 remote execution(s)" in text
    assert not list(slurm_idle.shared.glob(".gpuops/verify/allreduce-*.py"))  # the worker is removed after


def test_without_bench_no_all_reduce_step_runs(slurm_idle, gpuops, dist_python, isolated):
    _profile(slurm_idle, dist_python)
    before = _allreduce_jobs(slurm_idle)
    r = gpuops("verify", "-p", "cl", "--no-cuda-check", "--no-save", "--json")
    doc = json.loads(r.out)
    assert doc["remote_executions"] == 2 and doc["srun_steps"] == 1 and "allreduce" not in doc
    assert not any(c["id"].startswith("network.") for c in doc["checks"])
    assert _allreduce_jobs(slurm_idle) == before
