"""`verify --bench` on a Slurm profile: the all-reduce across the nodes (gpuops.slurm.allreduce_step, pure): the second
srun step's script (options, quoting), the worker, and what comes back judged: recorded NCCL_DEBUG=INFO lines of a run
over InfiniBand and of a silent fall back to TCP sockets (tests/data/ib), gloo's figure, the failures."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess

from gpuops.slurm import allreduce_step as A
from gpuops.slurm.probe_step import StepSpec
from gpuops.verify import checks_ib, facts_ib
from gpuops.verify.results import FAIL, INFO, PASS, WARN

from support import DATA

IB = DATA / "ib"
H100 = "NVIDIA H100 80GB HBM3"


def _spec(**kw) -> StepSpec:
    base = dict(nodes=2, partition="gpu", account="lab's $HOME", qos="normal", nodelist=["n1", "n2"],
                gpus_per_node=8, gpu_type="h100", wait_s=20, limit_s=A.LIMIT_S)
    return StepSpec(**{**base, **kw})


def _lines(rows: list[dict], *, label: int = 0) -> str:
    return "".join(f"{label}: {A.RESULT_MARK} {json.dumps(r)}\n" for r in rows)


def _row(size: int, busbw: float, *, world: int = 16, backend: str = "nccl", nodes=("gpu01", "gpu02"),
         gpu=H100, wrong: int = 0) -> dict:
    algbw = busbw * world / (2 * (world - 1))
    return {"bytes": size, "seconds": size / algbw / 1e9, "iters": 20, "algbw": algbw, "busbw": busbw,
            "wrong": wrong, "backend": backend, "world": world, "nodes": list(nodes), "gpu": gpu}


def _ib_node():
    return facts_ib.from_probe(json.loads((IB / "probe-ib-h100.json").read_text()))


def test_the_step_is_one_srun_over_the_verified_nodes_every_value_quoted():
    spec = _spec()
    script = A.step_script(spec, folder='"$HOME"/' + shlex.quote("my proj"), python="'~/venv one/bin/python' -X dev",
                           token="abc123", salt=7)
    words = shlex.split(script.replace('"$HOME"', "HOME"))
    srun = words[words.index("srun"):]
    for opt in ("--job-name=gpuops-allreduce", "--nodes=2", "--ntasks-per-node=1", "--label", "--input=none",
                "--immediate=20", "--time=3", "--kill-on-bad-exit=1", "--partition=gpu", "--account=lab's $HOME",
                "--qos=normal", "--gres=gpu:h100:8", "--nodelist=n1,n2"):
        assert opt in srun, opt
    assert "--exclude" not in script
    # the task: sh -c WRAPPER arg0, then the profile's python (its ~ kept for the remote shell) and the worker's file
    i = srun.index("sh")
    assert srun[i + 1] == "-c" and "NCCL_DEBUG=INFO" in srun[i + 2] and srun[i + 3] == "gpuops-allreduce"
    assert srun[i + 4:i + 8] == ["HOME/venv one/bin/python", "-X", "dev", ".gpuops/verify/allreduce-abc123.py;"]
    assert '"$HOME"/\'venv one/bin/python\' -X dev .gpuops/verify/allreduce-abc123.py' in script
    assert shlex.quote("--account=lab's $HOME") in script  # one word for the shell, never expanded
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0
    assert "exit 97" in script and "rm -f .gpuops/verify/allreduce-abc123.py; exit $rc" in script


def test_the_task_wrapper_finds_the_port_from_the_job_id_and_turns_ncclS_words_on(tmp_path):
    wrapper = A.TASK_WRAPPER % {"base": A.PORT_BASE, "span": A.PORT_SPAN, "salt": 5}
    for tool in ("sh", "head", "sed", "echo"):  # no Slurm on this PATH: the address stays empty, the port is known
        path = shutil.which(tool)
        if path:
            (tmp_path / tool).symlink_to(path)
    env = {"PATH": str(tmp_path), "SLURM_JOB_ID": "123", "SLURM_JOB_NODELIST": ""}
    p = subprocess.run(["sh", "-c", wrapper, "gpuops-allreduce", "sh", "-c",
                        'echo "$GPUOPS_AR_PORT $NCCL_DEBUG $NCCL_DEBUG_SUBSYS"'], env=env, capture_output=True,
                       text=True, timeout=30)
    assert p.stdout.split() == [str(A.PORT_BASE + 128), "INFO", "INIT,NET"], p.stderr
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in wrapper and "NodeAddr=" in wrapper


def test_the_worker_is_python_with_its_sizes_and_one_json_line_per_size():
    src = A.worker_source(gpu_sizes=[1 << 30], cpu_sizes=[16 << 20, 64 << 20], budget_s=0.5, init_s=30,
                           cpu_budget_s=0.2)
    compile(src, "allreduce.py", "exec")
    params = json.loads(eval(src.splitlines()[1][len("P = json.loads("):-1]))  # noqa: S307 - our own literal
    assert params == {"mark": A.RESULT_MARK, "gpu_sizes": [1 << 30], "cpu_sizes": [16 << 20, 64 << 20],
                      "budget_s": 0.5, "cpu_budget_s": 0.2, "init_s": 30}
    assert "torch.distributed.run" in src and '"nccl" if gpus else "gloo"' in src
    assert "busbw=algbw * 2 * (world - 1) / world" in src


def test_nccl_over_infiniband_passes_transport_and_bus_bandwidth():
    stdout = _lines([_row(64 << 20, 380.6), _row(256 << 20, 416.5), _row(1 << 30, 426.5)])
    stdout += "".join(f"0: {ln}\n" for ln in (IB / "nccl-ib-gdr.log").read_text().splitlines()
                      if not ln.startswith("##"))
    run = A.parse_step(stdout, "")
    assert run.backend == "nccl" and run.world == 16 and run.nodes == ["gpu01", "gpu02"] and not run.errors
    assert [r["size"] for r in run.allreduce.rows] == [64 << 20, 256 << 20, 1 << 30]
    assert run.nccl is not None and run.nccl.transport == "IB" and run.nccl.gdr
    res = {r.id: r for r in A.judge_run(run, ib=_ib_node(), reference=checks_ib.load_reference(),
                                        gpu_name=H100, gpus_per_node=8)}
    assert res["network.nccl_transport"].status == PASS
    assert res["network.busbw"].status == PASS and "426.5 GB/s at 1 GiB+" in res["network.busbw"].measured
    assert "h100-sxm-8x-ndr-multinode" in res["network.busbw"].expected
    doc = run.to_dict()
    assert doc["transport"] == "IB" and doc["busbw_gbs"] == 426.5 and len(doc["sizes"]) == 3


def test_a_silent_fall_back_to_tcp_sockets_fails_with_the_fix():
    stdout = _lines([_row(1 << 30, 22.4)])
    log = [ln for ln in (IB / "nccl-socket-fallback.log").read_text().splitlines() if not ln.startswith("##")]
    run = A.parse_step(stdout + "\n".join(log) + "\n", "")  # the log's lines keep srun's `1: ` and torchrun's prefix
    assert run.nccl.transport == "Socket" and run.nccl.no_ib_device
    res = {r.id: r for r in A.judge_run(run, ib=_ib_node(), reference=checks_ib.load_reference(),
                                        gpu_name=H100, gpus_per_node=8)}
    tr, bw = res["network.nccl_transport"], res["network.busbw"]
    assert tr.status == FAIL and "the classic multi-node failure" in tr.detail and "NCCL_IB_DISABLE" in tr.remediation
    assert bw.status == FAIL and "NCCL fell back to TCP sockets" in bw.remediation


def test_gloo_is_an_info_line_with_the_measured_figure_not_judged_against_a_gpu_reference():
    rows = [_row(16 << 20, 0.33, world=2, backend="gloo", nodes=("n1", "n2"), gpu=None),
            _row(64 << 20, 0.35, world=2, backend="gloo", nodes=("n1", "n2"), gpu=None)]
    stderr = "0: [W] Failed to initialize NumPy\n"
    run = A.parse_step(_lines(rows), stderr)
    assert run.nccl is None and run.backend == "gloo" and not run.errors
    [line] = A.judge_run(run, ib=facts_ib.IbFacts(), reference=checks_ib.load_reference(), gpu_name=H100,
                         gpus_per_node=8)
    assert line.id == "network.busbw" and line.status == INFO
    assert "0.35 GB/s bus bandwidth" in line.measured and "at 64 MiB" in line.measured
    assert "gloo over TCP: no NCCL on this cluster" in line.measured and "2 ranks on 2 nodes (n1, n2)" in line.measured
    wrong = A.parse_step(_lines([dict(rows[1], wrong=3)]), "")
    assert A.judge_run(wrong, ib=None, reference={}, gpu_name=None, gpus_per_node=None)[0].status == FAIL


def test_a_rank_that_cannot_reach_the_rendezvous_fails_with_the_ranks_words():
    err = {"error": "DistNetworkError: Connection refused (10.0.0.1:23456)", "rank": 1, "node": "n2"}
    run = A.parse_step(f"1: {A.RESULT_MARK} {json.dumps(err)}\n",
                       "srun: error: n2: task 1: Exited with exit code 1\n1: Traceback (most recent call last):\n")
    assert run.errors[0] == "rank 1 on n2: DistNetworkError: Connection refused (10.0.0.1:23456)"
    [line] = A.judge_run(run, ib=None, reference={}, gpu_name=None, gpus_per_node=None)
    assert line.id == "network.allreduce" and line.status == FAIL and "rendezvous port" in line.remediation
    no_torch = A.parse_step(f"0: {A.RESULT_MARK} " + json.dumps({"error": "no torch in /usr/bin/python3 on n1: x",
                                                                    "rank": 0, "node": "n1"}) + "\n", "")
    assert "set python:" in A.judge_run(no_torch, ib=None, reference={}, gpu_name=None,
                                        gpus_per_node=None)[0].remediation


def test_nodes_taken_between_the_two_steps_is_a_warning_not_a_node_failure():
    run = A.parse_step("", "srun: error: Unable to allocate resources: Requested nodes are busy\n")
    assert not run.started
    [line] = A.judge_run(run, ib=None, reference={}, gpu_name=None, gpus_per_node=None)
    assert line.status == WARN and "Requested nodes are busy" in line.measured
