"""slurm/batch.py: the batch script for several shapes of job, every value quoted (injection attempts included),
`bash -n` on what it writes, and the script run by bash with a stand-in srun and scontrol (the environment, the
arguments and the resume file reaching the job as given, SIGUSR1's note, --recover's bound)."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from gpuops.errors import UsageError
from gpuops.slurm import batch
from gpuops.slurm.batch import BatchJob

from support import DATA

RUN = "/shared/proj/.gpuops/runs/r1"


def job(**kw) -> BatchJob:
    base = dict(run_id="r1", run_dir=RUN, project_dir="/shared/proj", argv=("python3", "-u", "train.py", "--lr", "3e-4"),
                nodes=2, gpus_per_node=8, partition="gpu", time="04:00:00", cpus_per_task=32)
    base.update(kw)
    return BatchJob(**base)


def bash_n(text: str, tmp_path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    p = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def sbatch_options(text: str) -> list[str]:
    return [ln[len("#SBATCH "):] for ln in text.splitlines() if ln.startswith("#SBATCH ")]


def test_torchrun_over_two_nodes_of_eight_gpus(tmp_path):
    text = batch.batch_script(job(account="lab", qos="normal", exclude=("gpu03",), extra_sbatch=("--exclusive",)))
    assert sbatch_options(text) == [
        "--job-name=gpuops-r1", "--nodes=2", "--ntasks-per-node=1", "--partition=gpu", "--account=lab", "--qos=normal",
        "--gres=gpu:8", "--exclude=gpu03", "--cpus-per-task=32", "--time=04:00:00", "--requeue",
        "--signal=B:USR1@120", f"--output={RUN}/slurm-%j.out", f"--error={RUN}/slurm-%j.out", "--exclusive"]
    assert "# --signal=B:USR1@120: 120 s before the time limit Slurm sends SIGUSR1 to this batch shell only" in text
    assert 'gpuops_head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in text
    srun = next(ln for ln in text.splitlines() if ln.startswith("srun "))
    assert srun.startswith('srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 --label '
                           '--cpus-per-task="$SLURM_CPUS_PER_TASK" bash -c ')
    assert ('python3 -m torch.distributed.run --nnodes="$SLURM_NNODES" --nproc_per_node=8 --rdzv_id="$SLURM_JOB_ID" '
            '--rdzv_backend=c10d --rdzv_endpoint="$gpuops_head:$gpuops_port" train.py --lr 3e-4 &') in srun
    assert "gpuops_port=$((20000 + SLURM_JOB_ID % 10000))" in text
    bash_n(text, tmp_path)


def test_other_shapes_gpus_per_node_a_typed_gres_a_cpu_job_a_script_and_a_command(tmp_path):
    t = batch.batch_script(job(gpu_option="gpus-per-node", gpu_type="h100", rdzv_port=29500, signal_before_s=300,
                               requeue=False, nodelist=("gpu[01-02]",)))
    opts = sbatch_options(t)
    assert "--gpus-per-node=h100:8" in opts and "--no-requeue" in opts and "--signal=B:USR1@300" in opts
    assert "--nodelist=gpu[01-02]" in opts and "gpuops_port=29500" in t
    bash_n(t, tmp_path)
    cpu = batch.batch_script(job(gpus_per_node=0, nodes=4, cpus_per_task=None, time=None, partition=None))
    opts = sbatch_options(cpu)
    assert not any(o.startswith(("--gres", "--gpus", "--partition", "--time", "--cpus")) for o in opts)
    assert "--nproc_per_node=1" in cpu and "--cpus-per-task" not in cpu.split("#SBATCH --requeue")[1]
    bash_n(cpu, tmp_path)
    sh = batch.batch_script(job(launcher="none", argv=("bash", "scripts/train.sh", "--epochs", "3")))
    assert "torch.distributed.run" not in sh and "gpuops-node bash scripts/train.sh --epochs 3 &" in sh
    bash_n(sh, tmp_path)
    uv = batch.batch_script(job(launcher="none", argv=(), command="uv run python train.py --fast"))
    assert "gpuops-node bash -c 'uv run python train.py --fast' &" in uv
    bash_n(uv, tmp_path)
    venv = batch.batch_script(job(python="~/venvs/p/bin/python"))
    assert 'gpuops_py="$HOME"/venvs/p/bin/python' in venv  # the environment first on PATH, as a host's launch does
    assert '"$HOME"/venvs/p/bin/python -m torch.distributed.run' in venv
    notpy = batch.batch_script(job(argv=("./run.sh", "x")))
    assert "--no-python ./run.sh x" in notpy  # torchrun's own rule for a job that is not a .py
    no_signal = batch.batch_script(job(signal_before_s=None))
    assert "--signal" not in no_signal
    bash_n(no_signal, tmp_path)


@pytest.mark.parametrize("kw", [
    dict(partition="gpu\n#SBATCH --account=theirs"), dict(account="lab; rm -rf ~"), dict(qos="a b"),
    dict(name="my job"), dict(time="4 hours"), dict(run_dir="relative/runs/r1"), dict(run_dir="/shared/my runs/r1"),
    dict(run_dir="/shared/$(id)/r1"), dict(project_dir="/shared/proj'x"), dict(exclude=("gpu01 gpu02",)),
    dict(extra_sbatch=("--comment=$(id)",)), dict(extra_sbatch=("--mem=0\n--exclusive",)), dict(gpu_type="h100:8 x"),
    dict(env={"BAD NAME": "1"}), dict(unset=("X;Y",)), dict(launcher="ray"), dict(argv=(), command=None),
    dict(command="echo hi"), dict(nodes=0), dict(gpu_option="mig")])
def test_what_an_sbatch_line_or_a_shell_cannot_carry_is_refused(kw):
    with pytest.raises(UsageError):
        batch.batch_script(job(**kw))


def test_a_percent_in_the_run_folder_is_not_read_as_a_pattern(tmp_path):
    t = batch.batch_script(job(run_dir="/shared/100%/r1", project_dir="/shared/100%"))
    assert "#SBATCH --output=/shared/100%%/r1/slurm-%j.out" in t
    bash_n(t, tmp_path)


def test_sbatch_argv_and_the_job_id_it_prints():
    assert batch.sbatch_argv(f"{RUN}/job.sbatch") == ["sbatch", "--parsable", f"{RUN}/job.sbatch"]
    assert batch.sbatch_argv("s", test_only=True, exclude=("gpu03", "gpu[05-06]")) == [
        "sbatch", "--parsable", "--test-only", "--exclude=gpu03,gpu[05-06]", "s"]
    with pytest.raises(UsageError):
        batch.sbatch_argv("s", exclude=("a;b",))
    assert batch.job_id_of((DATA / "slurm" / "22.05" / "sbatch_parsable.txt").read_text()) == "1"  # the local cluster
    assert batch.job_id_of("4242;lab\n") == "4242" and batch.job_id_of("sbatch: error: Invalid account") is None
    assert batch.resume_text("ckpt/step_00400") == "ckpt/step_00400\n"
    with pytest.raises(UsageError):
        batch.resume_text("a\nrm -rf ~")
    assert batch.parse_attempts("1700000000 0 41 gpu[03-04]\n1700003600 1 41 gpu[01,05]\n") == [
        {"at": 1700000000, "restarts": 0, "job_id": "41", "node_list": "gpu[03-04]"},
        {"at": 1700003600, "restarts": 1, "job_id": "41", "node_list": "gpu[01,05]"}]


# -- the script, run by bash with a stand-in srun and scontrol ------------------------------------------------------
EVIL = ["$(touch pwned-arg)", "`touch pwned-tick`", "a b'c\"d", "; touch pwned-semi", "\\n", "x\ny", "*"]
RECORD = ("import json, os, sys; json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, "
          "open(os.path.join(os.environ['GPUOPS_RUN_DIR'], 'seen.json'), 'w'))")


@pytest.fixture
def cluster(tmp_path):
    """A bin/ with srun (drops its own options, runs the rest once: one node) and scontrol (the node list's first
    host), the Slurm variables of a 2-node allocation, and the run and project folders."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text('#!/bin/bash\nwhile [ "${1#--}" != "$1" ]; do shift; done\nSLURM_NODEID=0 exec "$@"\n')
    (bin_ / "scontrol").write_text("#!/bin/bash\necho n1\necho n2\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    run, proj = tmp_path / "runs" / "r1", tmp_path / "proj"
    proj.mkdir()
    env = {"PATH": f"{bin_}:{os.environ['PATH']}", "HOME": str(tmp_path), "SLURM_JOB_ID": "4123",
           "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_CPUS_PER_TASK": "4"}
    return {"run": run, "proj": proj, "env": env, "tmp": tmp_path}


def run_script(cluster, bj: BatchJob, extra_env=None, wait=True):
    path = cluster["tmp"] / "job.sbatch"
    path.write_text(batch.batch_script(bj))
    p = subprocess.Popen(["bash", str(path)], cwd=cluster["tmp"], env={**cluster["env"], **(extra_env or {})},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return p
    out, err = p.communicate(timeout=60)
    return p.returncode, out, err


def plain(cluster, **kw) -> BatchJob:
    return job(run_dir=str(cluster["run"]), project_dir=str(cluster["proj"]), launcher="none", python=sys.executable,
               argv=(sys.executable, "-c", RECORD, *EVIL), **kw)


def test_values_reach_the_job_as_given_and_nothing_of_them_runs(cluster):
    env = {"EVIL_" + str(i): v for i, v in enumerate(EVIL)}
    rc, out, err = run_script(cluster, plain(cluster, env=env, unset=("LANGUAGE",), run_id="r1; touch pwned-id"),
                              extra_env={"LANGUAGE": "xx"})
    assert rc == 0, err
    seen = json.loads((cluster["run"] / "seen.json").read_text())
    assert seen["argv"] == EVIL
    assert all(seen["env"][k] == v for k, v in env.items())
    assert "LANGUAGE" not in seen["env"] and seen["env"]["GPUOPS_RUN_ID"] == "r1; touch pwned-id"
    assert seen["env"]["GPUOPS_NODE_RANK"] == "0" and seen["env"]["MASTER_ADDR"] == "n1"
    assert seen["env"]["MASTER_PORT"] == str(20000 + 4123 % 10000) and seen["env"]["GPUOPS_NUM_NODES"] == "2"
    assert "GPUOPS_RESUME_FROM" not in seen["env"]
    assert not list(cluster["tmp"].rglob("pwned*"))
    (line,) = (cluster["run"] / batch.ATTEMPTS_FILE).read_text().splitlines()
    assert line.split()[1:] == ["0", "4123", "n[1-2]"]


def test_a_requeued_job_resumes_from_the_checkpoint_gpuops_chose(cluster):
    cluster["run"].mkdir(parents=True)
    ckpt = "ckpt/step_00400 $(touch pwned-resume)"
    (cluster["run"] / batch.RESUME_FILE).write_text(batch.resume_text(ckpt))
    rc, out, err = run_script(cluster, plain(cluster), extra_env={"SLURM_RESTART_COUNT": "1"})
    assert rc == 0, err
    seen = json.loads((cluster["run"] / "seen.json").read_text())
    assert seen["env"]["GPUOPS_RESUME_FROM"] == ckpt and f"gpuops: resuming from {ckpt}" in out
    assert not list(cluster["tmp"].rglob("pwned*"))
    assert (cluster["run"] / batch.ATTEMPTS_FILE).read_text().split()[1] == "1"


def test_recover_bounds_the_requeues(cluster):
    rc, out, err = run_script(cluster, plain(cluster, max_requeues=2), extra_env={"SLURM_RESTART_COUNT": "3"})
    assert rc == 1 and "requeued 3 times, more than --recover 2 allows" in err
    assert not (cluster["run"] / "seen.json").exists()
    rc, _, err = run_script(cluster, plain(cluster, max_requeues=2), extra_env={"SLURM_RESTART_COUNT": "2"})
    assert rc == 0, err


def test_slurms_warning_before_the_time_limit_reaches_the_job_as_a_file(cluster):
    wait_for_file = ("import os, sys, time\nf = os.environ['GPUOPS_TIME_LIMIT_FILE']\n"
                     "open(os.path.join(os.environ['GPUOPS_RUN_DIR'], 'started'), 'w').close()\n"
                     "t = time.time()\nwhile not os.path.exists(f) and time.time() - t < 20: time.sleep(0.05)\n"
                     "sys.exit(0 if os.path.exists(f) else 9)\n")
    bj = job(run_dir=str(cluster["run"]), project_dir=str(cluster["proj"]), launcher="none", python=sys.executable,
             argv=(sys.executable, "-c", wait_for_file))
    p = run_script(cluster, bj, wait=False)
    deadline = time.time() + 20
    while not (cluster["run"] / "started").exists() and time.time() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@120 does: to the batch shell only
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert "Slurm's time limit is 120 s away (SIGUSR1)" in err
    assert (cluster["run"] / batch.TIME_LIMIT_FILE).exists()


def test_torchrun_gets_the_allocation_from_slurms_variables(cluster):
    fake = cluster["tmp"] / "python"
    fake.write_text("#!/bin/bash\nprintf '%s\\n' \"$@\" > \"$GPUOPS_RUN_DIR/torchrun.args\"\n")
    fake.chmod(0o755)
    bj = job(run_dir=str(cluster["run"]), project_dir=str(cluster["proj"]), python=str(fake),
             argv=(str(fake), "-u", "train.py", "--name", "a b"))
    rc, out, err = run_script(cluster, bj)
    assert rc == 0, err
    assert (cluster["run"] / "torchrun.args").read_text().splitlines() == [
        "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=8", "--rdzv_id=4123", "--rdzv_backend=c10d",
        f"--rdzv_endpoint=n1:{20000 + 4123 % 10000}", "train.py", "--name", "a b"]
    assert shlex.quote("a b") in batch.batch_script(bj)
