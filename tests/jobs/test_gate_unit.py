"""The launch gate's pure parts on recorded facts: a GPU held by another process, the GPU count of a job pinned by
CUDA_VISIBLE_DEVICES, other judges' problems in the verdict, and the preflight's active runs with their pids."""
from __future__ import annotations

import os

from gpuops.jobs import plan as core
from gpuops.remote import probe

from support.gate_facts import ADA0, ADA1, KNOW, ada, profile


def test_a_foreign_process_on_a_gpu_the_job_sees_is_a_problem_naming_pid_memory_and_command():
    doc = ada(f"4242, 21528, {ADA0}, /opt/conda/bin/python\n",
              {"4242": {"exists": True, "pgid": 4242, "sid": 4100, "user": "alice", "environ": False}})
    got = core.gpu_holders(doc, [])
    assert got == [("GPU 0 holds 21528 MiB of process 4242 (/opt/conda/bin/python, user alice), which is not a gpuops "
                    "run",
                    ["fix (process 4242): see it with `nvidia-smi --query-compute-apps=pid,process_name,used_memory "
                     "--format=csv` and `ps -o pid,user,etime,cmd -p 4242`; stop it, or give the job another GPU "
                     "(CUDA_VISIBLE_DEVICES in the profile's env: or --env)"])]
    # the job pinned to GPU 1 (the plan's CUDA_VISIBLE_DEVICES, an index or a UUID): GPU 0 is not its business
    assert core.gpu_holders(doc, [], {"CUDA_VISIBLE_DEVICES": "1"}) == []
    assert core.gpu_holders(doc, [], {"CUDA_VISIBLE_DEVICES": ADA1[:12]}) == []
    assert len(core.gpu_holders(doc, [], {"CUDA_VISIBLE_DEVICES": "0,1"})) == 1
    # unset by --env NAME= : the job sees every GPU again, whatever the host's environment says
    host_pinned = ada(f"4242, 21528, {ADA0}, python\n", env={"CUDA_VISIBLE_DEVICES": "1"})
    assert core.gpu_holders(host_pinned, []) == []
    assert len(core.gpu_holders(host_pinned, [], {"CUDA_VISIBLE_DEVICES": None})) == 1


def test_a_gpuops_runs_processes_are_not_foreign():
    apps = f"5001, 20000, {ADA0}, python3\n5002, 900, {ADA0}, python3\n5003, [N/A], {ADA1}, python3\n"
    procs = {"5001": {"pgid": 5000, "sid": 5000, "environ": True, "run_id": None},  # group of an active launcher
             "5002": {"pgid": 5002, "sid": 6000, "environ": True, "run_id": "train-20260101-000000"},  # our env
             "5003": {"pgid": 7000, "sid": 7000, "environ": False}}  # unreadable and not ours: foreign
    got = core.gpu_holders(ada(apps, procs), [5000])
    assert [p for p, _ in got] == ["GPU 1 holds memory ([N/A]) of process 5003 (python3), which is not a gpuops run"]
    # a pid this /proc does not show (another pid namespace): foreign too
    assert len(core.gpu_holders(ada(f"9, 1, {ADA0}, x\n", {"9": {"exists": False}}), [])) == 1
    # not gathered, or nvidia-smi failed: no judgement
    no = ada()
    del no["gpu_apps"]
    assert core.gpu_holders(no, []) == []
    failed = ada()
    failed["gpu_apps"]["value"]["rc"] = 2
    assert core.gpu_holders(failed, []) == []


def test_the_gpu_count_compares_with_the_gpus_the_job_is_given():
    """Runbook 000's workstation pins single-GPU jobs to GPU 1: torch sees 1 GPU, and that is right."""
    prof = profile(env={"CUDA_VISIBLE_DEVICES": "1"})
    pinned = {"CUDA_VISIBLE_DEVICES": "1"}
    assert core.gate_results(ada(torch_sees=1), prof, KNOW, pinned) == []
    # given both GPUs, torch must see both
    rs = core.gate_results(ada(torch_sees=1), prof, KNOW, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert [(r.id, r.measured, r.expected) for r in rs] == [
        ("cuda.device_count", "torch sees 1 GPU(s)", "2: CUDA_VISIBLE_DEVICES=0,1")]
    # not pinned: expect.gpu_count, as before
    assert [r.id for r in core.gate_results(ada(torch_sees=1), profile(), KNOW, {})] == ["cuda.device_count"]
    # pinned by the host's own environment (the probe's env fact)
    assert core.gate_results(ada(torch_sees=1, env=pinned), profile(), KNOW, {}) == []
    # torchrun's --nproc-per-node auto counts the GPUs the job is given
    assert core.job_gpu_count(ada(), pinned, 2) == 1 and core.job_gpu_count(ada(), {}, 2) == 2
    assert core.job_gpu_count(ada(), {"CUDA_VISIBLE_DEVICES": "1,7"}, 2) == 1 and core.job_gpu_count(None, {}, 3) == 3


def test_other_judges_problems_refuse_with_their_fixes_and_force_records_them():
    extra = [("train.py imports wandb, which python3 cannot import",
              ["fix (wandb): add wandb to the project's requirements, then gpuops setup"]),
             ("GPU 0 holds 100 MiB of process 7 (x), which is not a gpuops run", ["fix (process 7): ..."])]
    v = core.judge_preflight(core.Preflight(gpus=["0"]), script_found=True, script="train.py", remote_dir="~/p",
                             min_disk_gb=None, force=False, synced=True, extra=extra)
    assert v.error.code == 1 and v.error.message == (
        "train.py imports wandb, which python3 cannot import; GPU 0 holds 100 MiB of process 7 (x), which is not a "
        "gpuops run; not launching")
    assert v.error.hint.splitlines() == ["fix (wandb): add wandb to the project's requirements, then gpuops setup",
                                         "fix (process 7): ...", "add --force to launch anyway"]
    v = core.judge_preflight(core.Preflight(gpus=["0"]), script_found=True, script="train.py", remote_dir="~/p",
                             min_disk_gb=None, force=True, synced=True, extra=extra)
    assert v.error is None and v.forced == [p for p, _ in extra]


def test_preflight_active_runs_carry_their_launchers_pid():
    pf = core.parse_preflight("@gpu\n0, H100, 80000\n@gpu_rc 0\n@active\nrun-a 4100\nrun-b\n@end\n")
    assert pf.active == ["run-a", "run-b"] and pf.active_pids == [4100]


def test_gate_params_carry_the_jobs_environment_and_modules():
    p = core.gate_params(profile(), "~/proj", env={"CUDA_VISIBLE_DEVICES": "1", "PYTORCH_CUDA_ALLOC_CONF": None},
                         modules={"": ["wandb"]})
    assert p["job_env"] == {"CUDA_VISIBLE_DEVICES": "1", "PYTORCH_CUDA_ALLOC_CONF": None}
    assert p["find_modules"] == {"cwd": "~/proj", "groups": {"": ["wandb"]}} and p["gpu_apps"] is True
    assert "CUDA_VISIBLE_DEVICES" in p["env"]


def test_the_probes_process_facts_and_job_environment():
    me = probe.proc_info(os.getpid())
    assert me["exists"] and me["pgid"] == os.getpgid(0) and me["sid"] == os.getsid(0) and me["environ"] is True
    assert probe.job_environ({}) is None
    env = probe.job_environ({"CUDA_VISIBLE_DEVICES": "1", "HOME": None})
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and "HOME" not in env and env["PATH"] == os.environ["PATH"]
    assert probe.proc_info(2 ** 22 + 12345) == {"exists": False, "environ": False}


def test_a_cuda_refusal_says_the_driver_the_jobs_torch_needs_and_whose_torch_it_is():
    """Issue 34: pip replaced the image's torch with a CUDA 13.0 build; the gate said only "torch cannot use the GPUs
    nvidia-smi shows". Now verify's cause (CUDA 13.0 needs driver 580, the host has 550) and which torch the job
    imports (the environment's, not the image's) are in the refusal, with the fixes."""
    from support.helpers import probe_doc, smi

    venv = "/home/ubuntu/.venvs/gpuops"
    cuda = {"imported": True, "version": "2.14.1+cu130", "cuda": "13.0", "available": False, "device_count": 0,
            "init_error": "RuntimeError: The NVIDIA driver on your system is too old (found version 12080).",
            "file": f"{venv}/lib/python3.10/site-packages/torch/__init__.py", "prefix": venv, "base_prefix": "/usr"}
    doc = probe_doc(query=smi("rtx6000ada_x2_busy.csv"), packages={"torch": "2.14.1+cu130"}, cuda=cuda)
    r, = [x for x in core.gate_results(doc, profile(), KNOW, {}) if x.id == "cuda.runtime"]
    assert r.measured.startswith("torch.cuda.is_available() is False: CUDA 13.0 on driver 550.90.07 (driver "
                                 "550.90.07 is older than 580.65.06, the minimum for CUDA 13.0)")
    assert (f"the job imports torch 2.14.1+cu130 from {venv}/lib/python3.10/site-packages/torch (the job's "
            "environment's, installed there by setup: not the image's, which it shadows)") in r.measured
    assert r.remediation.startswith("upgrade the driver to >= 580.65.06, or install torch built for CUDA 12.")
    assert "keep the image's torch: pin the project's torch, torchvision and torchaudio" in r.remediation
    assert "gpuops plan --script" in r.remediation
    # the image's own torch that cannot use the GPUs: said as the image's, no pin advice
    cuda.update(file="/usr/lib/python3/dist-packages/torch/__init__.py", prefix="/usr")
    r, = [x for x in core.gate_results(doc, profile(), KNOW, {}) if x.id == "cuda.runtime"]
    assert "the job imports torch 2.14.1+cu130 from /usr/lib/python3/dist-packages/torch (the image's: the system " \
           "python's)" in r.measured
    assert "keep the image's torch" not in r.remediation
