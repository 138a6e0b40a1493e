"""slurm/runstate.py (pure) on Slurm 22.05's recorded outputs (tests/data/slurm/22.05/): a run's row from squeue,
scontrol and the run folder's files, and its ending given to the endings classifier."""
from __future__ import annotations

from support import ROOT

from gpuops.jobs import endings as en
from gpuops.slurm import runstate
from gpuops.slurm.commands import LoginNode, quoted
from gpuops.slurm.reasons import load_reasons

DATA = ROOT / "tests" / "data" / "slurm" / "22.05"


def rec(name: str) -> str:
    return (DATA / f"scontrol_job_{name}.txt").read_text()


def test_a_pending_job_from_squeue_json_completed_by_scontrol():
    q = runstate.queue_job("4", (DATA / "squeue_json_pending.txt").read_text(), True, rec("pending_resources"))
    assert q.state == "PENDING" and q.reason == "Resources"
    doc = runstate.slurm_doc(job_id="4", q=q, ending=None, attempts=[], gpus=32, price=2.0,
                             reasons=load_reasons(), now=0)
    assert doc["reason"] == "Resources" and doc["reason_words"] and doc["gpu_hours"] is None and doc["cost"] is None
    assert runstate.gpuops_state(q.state, None, False) == runstate.PENDING
    lines = runstate.words({"run_id": "r", "state": runstate.PENDING, "slurm": doc})
    assert lines[0].startswith("r: Slurm job 4 PENDING (Resources): ")


def test_a_job_only_scontrol_knows():
    q = runstate.queue_job("13", None, False, rec("pending_too_many_nodes"))
    assert q.state == "PENDING" and q.reason == "PartitionConfig" and q.nodes == 5


def test_states_in_gpuops_words():
    assert runstate.gpuops_state("RUNNING", None, False) == "running"
    assert runstate.gpuops_state(None, None, False) == "lost"
    ending = runstate.ending_of("8", rec("failed"), None)
    assert runstate.gpuops_state("FAILED", ending, False) == "failed"
    assert runstate.gpuops_state("CANCELLED", runstate.ending_of("2", rec("cancelled_running"), None), True) == \
        "stopped"
    done = runstate.ending_of("1", rec("completed"), None)
    assert runstate.gpuops_state("COMPLETED", done, False) == "succeeded"


def test_timeout_is_said_with_slurms_evidence_and_gpu_hours_from_elapsed():
    ending = runstate.ending_of("3", rec("timeout"), None)
    tail = ["0: started", "slurmstepd-n4: error: *** JOB 3 ON n4 CANCELLED AT 2026-12-06T23:05:17 DUE TO TIME LIMIT ***",
            "srun: forcing job termination"]
    v = runstate.classify("r", ending, tail, None, en.load(), en.xid_table())
    assert v["cause"] == "slurm-timeout" and v["evidence"][0].startswith("scontrol: State=TIMEOUT")
    doc = runstate.slurm_doc(job_id="3", q=None, ending=ending, attempts=[], gpus=8, price=1.0, reasons={}, now=0)
    assert doc["gpu_hours"] == round(29 * 8 / 3600, 6) and doc["cost"] == round(29 * 8 / 3600, 4)


def test_a_failed_jobs_log_names_the_cause_not_srun():
    ending = runstate.ending_of("8", rec("failed"), None)
    tail = ["0: Traceback (most recent call last):", '0:   File "crash.py", line 2, in <module>',
            "0: RuntimeError: boom", "srun: error: n1: task 0: Exited with exit code 1",
            "srun: launch/slurm: _step_signal: Terminating StepId=8.0"]
    assert runstate.job_lines(tail)[-1] == "RuntimeError: boom"
    v = runstate.classify("r", ending, tail, None, en.load(), en.xid_table())
    assert "RuntimeError: boom" in v["title"] + " ".join(v["evidence"])


def test_a_requeued_jobs_attempts_are_said():
    q = runstate.queue_job("10", None, False, rec("requeued_running"))
    attempts = runstate.attempts_of("1796598292 0 10 n2\n1796598307 1 10 n3\n")
    doc = runstate.slurm_doc(job_id="10", q=q, ending=None, attempts=attempts, gpus=8, price=None, reasons={}, now=0)
    assert doc["restarts"] == 1 and [a["node_list"] for a in doc["attempts"]] == ["n2", "n3"]
    lines = runstate.words({"run_id": "r", "state": "running", "slurm": doc})
    assert any("requeued 1 time by Slurm" in x and "#1 on n2; #2 on n3" in x for x in lines)


class _Remote:
    """A stand-in connection: records what it was asked and answers with canned text."""

    def __init__(self, stdout: str):
        self.stdout, self.asked = stdout, []

    def run(self, command, *, timeout=30, stdin=None):
        from gpuops.remote.connection import Result

        self.asked.append((command, stdin))
        return Result(0, self.stdout, "", 0.0)


def test_every_word_is_quoted_and_sacct_without_accounting_is_learnt():
    assert quoted(["scancel", "--signal=TERM", "1; rm -rf ~"]) == "scancel --signal=TERM '1; rm -rf ~'"
    text = ("@@squeue 1\n" + (DATA / "squeue_json_pending.txt").read_text() + "\n@@squeue 0\n"
            "@@scontrol 4\n" + rec("pending_resources") + "\n@@sacct\nSlurm accounting storage is disabled\n"
            "@@sacctrc 1\n")
    node = LoginNode(_Remote(text))
    g = node.gather(["4"])
    assert node.json is True and g.squeue_json and g.accounting is False and node.accounting is False
    assert "JobId=4" in g.scontrol["4"]
    script = node.remote.asked[0][1]
    assert "squeue --json --jobs=4" in script and "sacct --parsable2" in script
    node.remote.stdout = "@@scontrol 4\n" + rec("pending_resources") + "\n"
    node.gather(["4"])
    again = node.remote.asked[1][1]
    assert "sacct" not in again and "squeue --noheader" not in again  # learnt: JSON works, no accounting


def test_the_first_task_that_failed_is_the_jobs_end_not_srun_killing_the_others():
    ending = runstate.ending_of("8", rec("failed").replace("ExitCode=3:0", "ExitCode=143:0"), None)
    assert ending.exit_status == 143
    tail = ["1: step 1", "srun: error: n2: task 1: Exited with exit code 1",
            "srun: launch/slurm: _step_signal: Terminating StepId=9.0", "0: step 1",
            "srun: error: n1: task 0: Terminated", "srun: Force Terminated StepId=9.0"]
    assert runstate.first_task_failure(tail) == {"node": "n2", "tasks": "1", "code": 1}
    v = runstate.classify("r", ending, tail, None, en.load(), en.xid_table())
    assert v["cause"] != "killed-outside" and "SIGTERM" not in v["title"]
    assert any("task 1 on n2 exited 1 first" in e for e in v["evidence"])
