"""`gpuops plan --from` and `gpuops train` on a Slurm profile judge the job against the cluster's nodes as `gpuops
verify` saved them, before anything is submitted: through the CLI, against the real local cluster (tests/conftest.py
`slurm_idle`: 4 nodes). The nodes' python is the tests' CPU torch environment (`dist_python`: torch, Ray, PyYAML,
no numpy), not the machine's python3, whose packages differ from one machine to another. PyYAML is not among the
packages verify checks by name: the nodes have it because verify on a cluster lists every distribution. Every wait
polls; nothing sleeps a fixed time."""
from __future__ import annotations

from pathlib import Path

from support.slurm import submitted, write_profile


def test_plan_and_train_judge_against_the_verified_nodes_and_submit_nothing_they_refuse(slurm_idle, gpuops, isolated,
                                                                                       dist_python):
    c = slurm_idle
    write_profile(c, isolated, nodes=2, python=dist_python)
    Path("train.py").write_text("import yaml\nimport nosuchmodule_xyz\nprint('never')\n")
    Path("ok.py").write_text("import yaml\nprint('yaml', yaml.__version__, flush=True)\n")

    before = gpuops("plan", "--from", "clu", "-s", "train.py")  # no verify saved here: said, never refused on
    assert before.code == 0, before.all
    assert ("no `gpuops verify` of this cluster saved here: judged against lambda-stack-22-04; run gpuops verify -p "
            "clu first") in before.err

    v = gpuops("verify", "-p", "clu", "--no-cuda-check")  # CPU torch on emulated H100s: its CUDA check fails,
    assert v.code == 1 and "reports saved under" in v.err, v.all  # the reports (python, packages) are saved
    r = gpuops("plan", "--from", "clu", "-s", "train.py")
    assert r.code == 1, r.all
    assert r.out.startswith("local plan for train.py on the nodes of clu, as verified "), r.out
    assert "module yaml: image (pyyaml)" in r.out and "module nosuchmodule_xyz: missing" in r.out
    assert "REFUSED: train.py imports yaml" not in r.out
    assert "REFUSED: train.py imports nosuchmodule_xyz, which nothing setup installs provides" in r.out
    assert "gpuops train -p clu would refuse this job before submitting anything" in r.err
    assert "no `gpuops verify`" not in r.all

    t = gpuops("train", "-p", "clu", "--script", "train.py")
    assert t.code == 1, t.all
    assert t.err.count("error:") == 1 and "Traceback" not in t.all
    assert ("train.py imports nosuchmodule_xyz, which nothing setup installs provides" in t.err
            and "nothing was synced, written or submitted" in t.err and "fix: add nosuchmodule_xyz" in t.err), t.err
    assert not c.run(["squeue", "-h", "-o", "%i"]).stdout.strip()  # no sbatch
    assert not (c.shared / isolated.name / "train.py").exists()  # nothing synced
    assert not (c.shared / isolated.name / ".gpuops" / "runs").exists() and not Path("runs").exists()

    dry = gpuops("train", "-p", "clu", "--script", "train.py", "--dry-run")  # the plan runs on a dry run too
    assert dry.code == 1 and "nosuchmodule_xyz" in dry.err, dry.all
    forced = gpuops("train", "-p", "clu", "--script", "train.py", "--dry-run", "--force")
    assert forced.code == 0, forced.all
    assert "imports nosuchmodule_xyz, which nothing setup installs provides" in forced.err
    assert "(--force: going on anyway)" in forced.err and "#SBATCH --nodes=2" in forced.out

    rid, job_id = submitted(gpuops("train", "-p", "clu", "--script", "ok.py"))  # what the nodes have: submitted
    assert c.wait_job(job_id)["JobState"] == "COMPLETED"
    assert (Path("runs") / rid / "meta.json").is_file()
