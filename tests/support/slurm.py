"""The local Slurm cluster in tests (gpuops.sandbox.slurm): one per xdist worker (tests/conftest.py `slurm_cluster`),
driven through this handle: Slurm commands with the cluster's environment, jobs, node events and SSH to its login
node. Every wait polls; nothing sleeps a fixed time.

Run as a script, it records what this machine's Slurm prints (tests/data/slurm/<version>/, see record()):
    uv run python tests/support/slurm.py record
"""
from __future__ import annotations

import getpass
import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuops.sandbox import slurm, slurm_nodes

ENDED = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE")


def parse_oneliner(text: str) -> dict[str, str]:
    """`scontrol show job -o` / `show node -o`: Key=Value pairs on one line; a value with spaces (a Reason) runs to
    the next word that starts a key (enough for the tests: their reasons hold no '=')."""
    out: dict[str, str] = {}
    key = None
    for word in text.strip().split(" "):
        k, eq, v = word.partition("=")
        if eq and re.fullmatch(r"[A-Za-z][\w/:]*", k):
            key = k
            out[key] = v
        elif key is not None:
            out[key] += " " + word
    return out


@dataclass
class SlurmCluster:
    """A running local cluster (its folder `dir`) and what a test does with it."""

    dir: Path
    info: dict = field(default_factory=dict)
    started_in: float = 0.0

    @property
    def shared(self) -> Path:
        return Path(self.info["shared_dir"])

    @property
    def nodes(self) -> list[str]:
        return list(self.info["nodes"])

    # -- commands --------------------------------------------------------------------------------------------------
    def run(self, args: list[str], *, check: bool = False, timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm client command with the cluster's environment."""
        return slurm.run(self.dir, args, check=check, timeout=timeout)

    def ssh(self, command: str, *, input: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
        """A non-interactive command on the login node, over SSH, as gpuops runs them."""
        login = self.info["login"]
        argv = ["ssh", "-i", login["key"], "-p", str(login["port"]), "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                f"{login['user']}@{login['host']}", command]
        return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)

    def sbatch(self, *args: str, script: str | None = None) -> str:
        """Submit (sbatch --parsable ARGS, the script on stdin when given); returns the job id."""
        proc = subprocess.run(["sbatch", "--parsable", *args], input=script, capture_output=True, text=True,
                              env=slurm.client_env(self.dir), cwd=self.shared, timeout=30)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o ID` as a dict ({} once Slurm has forgotten it)."""
        proc = self.run(["scontrol", "show", "job", "-o", job_id])
        return parse_oneliner(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else {}

    def node(self, name: str) -> dict[str, str]:
        return parse_oneliner(self.run(["scontrol", "show", "node", "-o", name], check=True).stdout)

    def node_states(self) -> dict[str, str]:
        return slurm.node_states(self.dir)

    # -- waiting ---------------------------------------------------------------------------------------------------
    def wait(self, what: str, test, timeout: float = 30, every: float = 0.05):
        """Poll `test()` until it returns something true; that value is returned. Fails naming `what` and the last
        value seen."""
        deadline = time.monotonic() + timeout
        while True:
            value = test()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout} s (last: {value!r})")
            time.sleep(every)

    def wait_job(self, job_id: str, states: tuple[str, ...] = ENDED, timeout: float = 30,
                 every: float = 0.05) -> dict[str, str]:
        """Until the job's JobState is one of `states`; returns its scontrol record."""
        def seen():
            job = self.job(job_id)
            return job if job.get("JobState") in states else None
        return self.wait(f"job {job_id} in {states}", seen, timeout, every)

    def wait_nodes(self, states: tuple[str, ...] = ("idle",), nodes: list[str] | None = None,
                   timeout: float = 30) -> dict[str, str]:
        return slurm.wait_nodes(self.dir, states, nodes, timeout=timeout)

    # -- what happens to nodes -------------------------------------------------------------------------------------
    def drain(self, node: str, reason: str) -> None:
        slurm_nodes.drain(self.dir, node, reason)

    def resume(self, node: str) -> None:
        slurm_nodes.resume(self.dir, node)

    def kill_node(self, node: str) -> list[int]:
        return slurm_nodes.kill_node(self.dir, node)

    def restart_node(self, node: str, wait: bool = True) -> str:
        return slurm_nodes.restart_node(self.dir, node, wait=wait)

    def set_gpu_fault(self, node: str, fault: str, kill_jobs: bool = False) -> list[str]:
        return slurm_nodes.set_gpu_fault(self.dir, node, fault, kill_jobs=kill_jobs)

    def node_dir(self, node: str) -> Path:
        return slurm_nodes.node_dir(self.dir, node)

    def reset(self, timeout: float = 30) -> None:
        """Back to a fresh cluster for the next test: no job left, every node's slurmd running and its GPUs healthy,
        every node idle (drained and down ones resumed)."""
        self.run(["scancel", "--state=PENDING", "-u", getpass.getuser()])  # pending first: none starts meanwhile
        self.run(["scancel", "-u", getpass.getuser()])
        for n in self.nodes:
            if slurm_nodes.node_lost(self.dir, n):
                slurm_nodes.restart_node(self.dir, n, wait=False)
        slurm_nodes.clear_gpu_faults(self.dir)
        self.wait("no job left", lambda: not self.run(["squeue", "-h", "-o", "%i"]).stdout.strip(), timeout)
        for n, state in self.node_states().items():
            if state.rstrip("*~#$@") in ("drained", "draining", "down", "drain", "fail", "failing"):
                self.resume(n)
        self.wait_nodes(("idle",), timeout=timeout)


def start(d: Path, nodes: int = 4, accounting: bool = False) -> SlurmCluster:
    """A cluster of `nodes` nodes (with slurmdbd and MariaDB when `accounting`) and its login node, in `d`."""
    from gpuops.sandbox import slurm_login

    t = time.monotonic()
    slurm.start(d, nodes=nodes, accounting=accounting)
    slurm_login.start_login(d)
    return SlurmCluster(Path(d), slurm.cluster_info(d), time.monotonic() - t)


# -- recording what real Slurm prints ----------------------------------------------------------------------------------
SINFO = {"sinfo": [], "sinfo_parts": ["-h", "-o", "%P|%a|%l|%D|%T|%N|%G"],
         "sinfo_nodes": ["-h", "-N", "-o", "%N|%T|%G|%c|%m|%E"], "sinfo_R": ["-R"],
         "sinfo_R_parsable": ["-h", "-R", "-o", "%N|%T|%E|%U|%H"], "sinfo_json": ["--json"]}
SQUEUE = {"squeue": [], "squeue_state": ["-h", "-o", "%i|%T|%r|%S|%N"],
          "squeue_long": ["-h", "-o", "%i|%j|%T|%M|%l|%D|%R|%b"], "squeue_json": ["--json"]}


class Recorder:
    """Outputs of real Slurm commands, each saved as <out>/<name>.txt with the command in <out>/README.md."""

    def __init__(self, cluster: SlurmCluster, out: Path):
        self.c, self.out, self.lines = cluster, out, []
        out.mkdir(parents=True, exist_ok=True)

    def save(self, name: str, args: list[str], note: str = "") -> str:
        proc = self.c.run(args)
        text = proc.stdout + (proc.stderr if proc.returncode or not proc.stdout else "")
        (self.out / f"{name}.txt").write_text(text)
        cmd = " ".join(shlex.quote(a) for a in args)
        self.lines.append(f"- `{name}.txt`: `{cmd}`" + (f" (exit {proc.returncode})" if proc.returncode else "")
                          + (f": {note}" if note else ""))
        return proc.stdout

    def views(self, moment: str, what: dict, note: str) -> None:
        for name, args in what.items():
            self.save(f"{name}_{moment}", [name.split("_")[0], *args], note)

    def job(self, name: str, job_id: str, note: str) -> None:
        self.save(f"scontrol_job_{name}", ["scontrol", "show", "job", "-o", job_id], note)

    def all(self) -> None:
        c = self.c
        sh = str(c.shared)
        sleeper = ["-o", f"{sh}/%x-%j.out", "--wrap", "trap 'echo got TERM; exit 143' TERM; sleep 300 & wait"]
        self.views("idle", SINFO, "4 idle nodes")
        self.save("sbatch_parsable", ["sbatch", "--parsable", "-J", "parsable", "-o", f"{sh}/%x-%j.out", "--wrap",
                                      "true"], "a submission")
        running = c.sbatch("-J", "running", "--exclusive", "-w", "n1", "-o", f"{sh}/%x-%j.out", "--wrap", "sleep 300")
        timeout = c.sbatch("-J", "timeout", "-w", "n4", *sleeper)
        c.wait_job(timeout, ("RUNNING",))
        c.wait_job(running, ("RUNNING",))
        c.run(["scontrol", "update", f"JobId={timeout}", "TimeLimit=0"], check=True)
        resources = c.sbatch("-J", "resources", "-N4", "--wrap", "true")
        priority = c.sbatch("-J", "priority", "-N4", "--wrap", "true")
        c.wait_job(resources, ("PENDING",))
        c.wait("a reason for the 4-node jobs", lambda: c.job(priority).get("Reason") == "Priority"
               and c.job(resources).get("Reason") == "Resources")
        self.job("running", running, "running, --exclusive on n1")
        self.job("pending_resources", resources, "4 nodes asked while n1 is taken")
        self.job("pending_priority", priority, "behind the Resources job")
        self.views("pending", SQUEUE, "one running on n1, two 4-node jobs pending (Resources, Priority)")
        c.drain("n3", "gpu xid 79 on GPU 2")
        notavail = c.sbatch("-J", "notavail", "-w", "n3", "--wrap", "true")
        c.wait("ReqNodeNotAvail", lambda: c.job(notavail).get("Reason", "").startswith("ReqNodeNotAvail"))
        self.job("pending_reqnodenotavail", notavail, "-w n3 while n3 is drained")
        self.views("drained", SQUEUE, "n3 drained, a job asking for it pending")
        self.views("drained", SINFO, "n1 allocated, n3 drained")
        self.save("scontrol_nodes_drained", ["scontrol", "show", "node", "-o"], "n1 allocated, n3 drained")
        for j in (resources, priority, notavail):
            c.run(["scancel", j], check=True)
        self.job("cancelled_pending", c.wait_job(notavail, ("CANCELLED",))["JobId"], "scancel while pending")
        c.run(["scancel", running], check=True)
        self.job("cancelled_running", c.wait_job(running, ("CANCELLED",))["JobId"],
                 "scancel while running (a batch script without a trap: killed by SIGTERM)")
        c.resume("n3")
        self._endings(sh)
        self._node_failure(sleeper)
        self.job("timeout", c.wait_job(timeout, ("TIMEOUT",), timeout=60)["JobId"],
                 "scontrol update TimeLimit=0 while running: TIMEOUT at slurmctld's next time-limit check")
        self.save("sacct_no_accounting", ["sacct", "-j", timeout], "no slurmdbd: accounting is off")
        self.save("scontrol_job_unknown", ["scontrol", "show", "job", "-o", "999999"], "a job id Slurm does not know")
        self.save("squeue_unknown", ["squeue", "-h", "-j", "999999"], "a job id Slurm does not know")
        self.save("sbatch_bad_partition", ["sbatch", "-p", "nosuch", "--wrap", "true"])
        self.save("sbatch_bad_gres", ["sbatch", "--gres=gpu:9", "--wrap", "true"], "9 GPUs asked of 8-GPU nodes")
        many = self.save("sbatch_too_many_nodes", ["sbatch", "--parsable", "-N5", "--wrap", "true"],
                         "5 nodes asked of 4: accepted, and pending").strip()
        c.wait("a reason for 5 nodes", lambda: c.job(many).get("Reason") not in (None, "None"))
        self.job("pending_too_many_nodes", many, "5 nodes asked of a 4-node partition")
        c.run(["scancel", many], check=True)
        self.save("scontrol_partition", ["scontrol", "show", "partition", "-o"])
        self.save("sinfo_version", ["sinfo", "--version"])
        (self.out / "README.md").write_text(
            f"# Slurm {c.info.get('slurm_version')} outputs (Debian 12's slurm-wlm), recorded\n\n"
            "Printed by the real commands against the local cluster of `gpuops.sandbox.slurm` (4 nodes n1..n4, 16 "
            "CPUs and 8 GPUs each, partition `gpu`, no accounting), by `uv run python tests/support/slurm.py record`. "
            "Each file, and the command that printed it (stderr is kept where the command failed or printed "
            "nothing on stdout):\n\n" + "\n".join(self.lines) + "\n")

    def _endings(self, sh: str) -> None:
        c = self.c
        done = c.sbatch("-J", "completed", "-o", f"{sh}/%x-%j.out", "--wrap", "echo hello")
        failed = c.sbatch("-J", "failed", "-o", f"{sh}/%x-%j.out", "--wrap", "echo bad; exit 3")
        self.job("completed", c.wait_job(done)["JobId"], "exit 0")
        self.job("failed", c.wait_job(failed)["JobId"], "the batch script exited 3")
        self.save("squeue_ended", ["squeue", "-h", "-t", "all", "-j", f"{done},{failed}", "-o", "%i|%T|%r|%S|%N"],
                  "ended jobs, within MinJobAge")
        two = c.sbatch("-J", "twonode", "-N2", "--ntasks-per-node=1", "--gres=gpu:8", "-o", f"{sh}/%x-%j.out",
                       "--wrap", "srun bash -c 'echo $SLURMD_NODENAME $SLURM_PROCID $CUDA_VISIBLE_DEVICES'")
        self.job("completed_two_nodes", c.wait_job(two)["JobId"], "2 nodes, --gres=gpu:8, srun on each")

    def _node_failure(self, sleeper: list[str]) -> None:
        c = self.c
        requeue = c.sbatch("-J", "requeue", "--requeue", "-w", "n2", *sleeper)
        nofail = c.sbatch("-J", "nodefail", "--no-requeue", "-w", "n2", *sleeper)
        c.wait_job(requeue, ("RUNNING",))
        c.wait_job(nofail, ("RUNNING",))
        c.kill_node("n2")
        c.wait("n2 not responding", lambda: c.node_states().get("n2", "").endswith("*"), timeout=30)
        self.views("node_not_responding", SINFO, "n2's slurmd stopped answering (jobs running there)")
        self.job("node_fail", c.wait_job(nofail, ("NODE_FAIL",))["JobId"], "--no-requeue, its node lost")
        c.wait("requeued", lambda: c.job(requeue).get("Reason") == "BeginTime" and c.job(requeue)["Restarts"] == "1")
        self.job("requeued_pending", requeue, "--requeue, its node lost: requeued, held until its BeginTime "
                 "(AuthInfo cred_expire + 1 s after the requeue)")
        self.views("node_down", SINFO, "n2 down (not responding)")
        self.views("node_down", SQUEUE, "the requeued job pending")
        self.save("scontrol_node_down", ["scontrol", "show", "node", "-o", "n2"], "n2 lost")
        c.restart_node("n2")
        self.job("requeued_running", c.wait_job(requeue, ("RUNNING",))["JobId"], "started again after n2 came back")
        c.run(["scancel", requeue], check=True)
        c.wait_job(requeue, ("CANCELLED",))


SACCT = ["-P", "-o", "JobID,JobName,State,ExitCode,DerivedExitCode,Reason,NodeList,Start,End,Elapsed,AllocTRES"]


def record_accounting(c: SlurmCluster, out: Path) -> None:
    """sacct's answers (a cluster with slurmdbd): completed, failed, cancelled, timed out, a requeue after a lost
    node (both attempts with --duplicates). Lines appended to <out>/README.md."""
    r = Recorder(c, out)
    sleeper = ["--wrap", "sleep 300"]
    done = c.sbatch("-J", "completed", "--wrap", "echo hello")
    failed = c.sbatch("-J", "failed", "--wrap", "exit 3")
    cancelled = c.sbatch("-J", "cancelled", "-w", "n1", *sleeper)
    timeout = c.sbatch("-J", "timeout", "-w", "n1", *sleeper)
    requeue = c.sbatch("-J", "requeue", "--requeue", "-w", "n2", *sleeper)
    for j in (cancelled, timeout, requeue):
        c.wait_job(j, ("RUNNING",))
    c.run(["scancel", cancelled], check=True)
    c.run(["scontrol", "update", f"JobId={timeout}", "TimeLimit=0"], check=True)
    c.kill_node("n2")
    c.wait("requeued", lambda: c.job(requeue).get("Restarts") == "1")
    c.restart_node("n2")
    c.wait_job(requeue, ("RUNNING",))
    c.run(["scancel", requeue], check=True)
    for j in (done, failed, cancelled, requeue):
        c.wait_job(j)
    c.wait_job(timeout, timeout=60)
    ids = ",".join((done, failed, cancelled, timeout, requeue))
    c.wait("sacct has every ending", lambda: "RUNNING" not in c.run(["sacct", "-n", "-X", "-j", ids, "-o",
                                                                       "State"]).stdout)
    r.save("sacct_endings", ["sacct", "-j", ids, *SACCT], "completed, failed (exit 3), cancelled, timed out, a "
           "requeued job (node lost, then cancelled)")
    r.save("sacct_endings_duplicates", ["sacct", "--duplicates", "-j", ids, *SACCT], "the same, every attempt")
    r.save("sacct_endings_allocations", ["sacct", "-X", "--duplicates", "-j", ids, *SACCT], "-X: jobs, no steps")
    r.save("sacct_endings_json", ["sacct", "--json", "-j", ids], "the same as JSON")
    r.save("sacct_default", ["sacct", "-j", ids], "sacct's own columns")
    readme = out / "README.md"
    readme.write_text(readme.read_text() + "\nWith accounting (slurmdbd and MariaDB, `accounting=True`; 2 nodes):\n\n"
                      + "\n".join(r.lines) + "\n")


if __name__ == "__main__" and sys.argv[1:2] == ["record"]:
    import tempfile

    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "slurmctld"], capture_output=True, text=True)
    dest = Path(__file__).resolve().parents[1] / "data" / "slurm" / ".".join(version.stdout.split(".")[:2])
    with tempfile.TemporaryDirectory(prefix="gslr-") as tmp:
        cluster = start(Path(tmp) / "c", 4)
        try:
            Recorder(cluster, dest).all()
        finally:
            slurm.stop(cluster.dir)
        cluster = start(Path(tmp) / "a", 2, accounting=True)
        try:
            record_accounting(cluster, dest)
        finally:
            slurm.stop(cluster.dir)
    print(f"recorded into {dest}")


# -- a test's profile and runs on the cluster (tests/slurm/) ------------------------------------------------------------
def write_profile(cluster, project: Path, name: str = "clu", python: str = "python3", **slurm) -> Path:
    """A profile of the cluster's login node (its slurm: section), remote_dir a folder of this test on the shared
    filesystem."""
    import os

    login = cluster.info["login"]
    settings = {"nodes": 1, "gpus_per_node": 8, "launcher": "none", "price_per_gpu_hour": 2.5, **slurm}
    lines = [f"  {k}: {json.dumps(v)}" for k, v in settings.items()]
    text = (f"host: {login['host']}\nport: {login['port']}\nuser: {login['user']}\nkey: {login['key']}\n"
            f"remote_dir: {cluster.shared / project.name}\npython: {python}\nhost_key_policy: accept-new\n"
            "slurm:\n" + "\n".join(lines) + "\n")
    path = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def submitted(res) -> tuple[str, str]:
    """(run id, job id) of a `train` that printed them."""
    assert res.code == 0, res.all
    m = re.search(r"submitted (\S+) to Slurm on \S+: job (\d+)", res.err)
    assert m, res.err
    assert res.out.strip() == m.group(1)
    return m.group(1), m.group(2)


def status_of(gpuops, rid: str) -> dict:
    res = gpuops("status", rid, "-p", "clu", "--json")
    assert res.code == 0, res.all
    doc = json.loads(res.out)
    from support.schemas import valid

    valid("status", doc)
    return next(r for r in doc["runs"] if r["run_id"] == rid)


def text_of(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
