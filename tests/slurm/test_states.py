"""slurm/states.py on recorded outputs of Slurm 21.08 to 24.05 (tests/data/slurm/, each file's header says where its
shape comes from; 22.05/ is recorded on the local cluster): a job in the queue, its end, GPU-hours; and Slurm's ending
facts through the endings classifier (jobs/endings.py with playbooks/endings.yaml's Slurm rows)."""
from __future__ import annotations

import pytest

from gpuops import knowledge
from gpuops.jobs import endings
from gpuops.jobs.endfacts import EndFacts
from gpuops.slurm import states

from support import DATA

SLURM = DATA / "slurm"
SPEC = endings.load()


def recorded(name: str) -> str:
    """A recorded output without its `## ` header (where its shape comes from)."""
    return "\n".join(ln for ln in (SLURM / name).read_text().splitlines() if not ln.startswith("## "))


def by_id(jobs):
    return {j.job_id: j for j in jobs}


# -- the small readers ----------------------------------------------------------------------------------------------
def test_host_lists_expand_as_slurm_writes_them():
    assert states.expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert states.expand_hostlist("n[1-2]-ib[0-1]") == ["n1-ib0", "n1-ib1", "n2-ib0", "n2-ib1"]
    assert states.expand_hostlist("n[8-10]") == ["n8", "n9", "n10"]
    assert states.expand_hostlist("(null)") == states.expand_hostlist("None assigned") == states.expand_hostlist("") == []


@pytest.mark.parametrize("text,seconds", [("1-02:03:04", 93784), ("02:03:04", 7384), ("03:04", 184), ("1-02", 93600),
                                          ("365-00:00:00", 31536000), ("60", 3600), ("UNLIMITED", None),
                                          ("INVALID", None), ("", None), ("Partition_Limit", None)])
def test_durations(text, seconds):
    assert states.duration_s(text) == seconds


def test_exit_codes_are_code_and_signal():
    assert states.exit_pair("0:15") == (0, 15)
    assert states.exit_pair("143:0") == (143, 0)
    assert states.exit_pair("") == (None, None)


def test_gpus_from_tres():
    assert states.tres_gpus("billing=128,cpu=128,energy=2479441,gres/gpu=16,mem=1000G,node=2") == 16
    assert states.tres_gpus("cpu=64,gres/gpu:h100=8,mem=500G") == 8  # typed only
    assert states.tres_gpus("cpu=8,gres/gpu=16,gres/gpu:h100=16") == 16  # the untyped count, not twice
    assert states.tres_gpus("cpu=1,node=1,billing=1") is None


def test_the_formats_the_talking_part_passes():
    assert states.squeue_argv(["12"]) == ["squeue", "--noheader", "--format=%i|%T|%D|%M|%l|%S|%P|%N|%b|%j|%r",
                                          "--jobs=12"]
    assert states.squeue_argv(["12", "13"], as_json=True) == ["squeue", "--json", "--jobs=12,13"]
    assert states.sacct_argv(["12"])[:4] == ["sacct", "--parsable2", "--noheader", "--duplicates"]
    assert states.sacct_argv(["12"])[-1] == "--format=" + ",".join(states.SACCT_FIELDS)
    assert states.scontrol_job_argv("12") == ["scontrol", "--oneliner", "show", "job", "12"]
    # a format's fields and its % codes agree in number: what is asked is what is parsed
    assert len(states.SQUEUE_FORMAT.split("|")) == len(states.SQUEUE_FIELDS)


# -- a job in the queue, every version ------------------------------------------------------------------------------
def test_squeue_json_of_21_08_and_22_05_plain_numbers():
    j = by_id(states.parse_squeue_json(recorded("21.08/squeue.json")))
    assert (j["7001"].state, j["7001"].node_list, j["7001"].time_limit_s) == ("RUNNING", "gpu[01-02]", 86400)
    assert (j["7002"].state, j["7002"].reason, j["7002"].nodes, j["7002"].start_epoch) == ("PENDING", "Priority", 4,
                                                                                            None)
    j = by_id(states.parse_squeue_json(recorded("22.05/squeue_json_drained.txt")))
    pending = {k: v for k, v in j.items() if v.pending}
    assert {v.reason for v in pending.values()} == {"Resources", "Priority", "ReqNodeNotAvail"}
    notavail = next(v for v in pending.values() if v.reason == "ReqNodeNotAvail")
    assert notavail.reason_detail == "UnavailableNodes:n3"  # from state_description


def test_squeue_json_of_23_02_numbers_as_objects_and_a_held_requeued_job():
    j = by_id(states.parse_squeue_json(recorded("23.02/squeue.json")))
    held = j["4101"]
    assert (held.state, held.reason, held.restarts, held.description, held.time_limit_s) == (
        "PENDING", "JobHeldUser", 1, "launch failed requeued held", 7200)
    assert j["4102"].start_epoch == 1694690000.0 and j["4103"].hosts == ["gpu01", "gpu02"]
    assert (j["4103"].batch_host, j["4103"].requeue) == ("gpu01", True)
    assert j["4103"].std_out == "/shared/proj/.gpuops/runs/r4103/slurm-4103.out"


def test_squeue_json_of_23_11_and_24_05_state_lists_time_objects_exit_structures():
    j = by_id(states.parse_squeue_json(recorded("23.11/squeue.json")))
    assert j["5201"].reason == "ReqNodeNotAvail" and j["5201"].reason_detail == "UnavailableNodes:gpu[03-04]"
    assert j["5203"].start_epoch == 1746640000.0 and j["5203"].nodes == 4
    assert j["5204"].reason == "BeginTime" and j["5204"].restarts == 1
    j = by_id(states.parse_squeue_json(recorded("24.05/squeue.json")))
    t = j["9202"]
    assert (t.state, t.reason, t.signal, t.exit_code) == ("TIMEOUT", "TimeLimit", 15, None)
    assert j["9203"].state == "RUNNING" and j["9203"].exit_code == 0


def test_squeue_plain_format_and_the_local_clusters_own_formats():
    j = by_id(states.parse_squeue(recorded("23.11/squeue-plain.txt")))
    assert j["6101"].reason == "ReqNodeNotAvail" and j["6101"].reason_detail == "UnavailableNodes:gpu[03-04,06]"
    assert j["6102"].start == "2026-10-07T18:30:00" and j["6102"].time_limit_s == 86400
    assert j["6103"].reason == "launch failed requeued held"
    assert j["6104"].time_used_s == 3723 and j["6104"].time_limit_s is None and j["6104"].hosts == ["gpu01", "gpu02"]
    assert j["6105"].gres is None
    long = by_id(states.parse_squeue(recorded("22.05/squeue_long_pending.txt"), fields=(
        "job_id", "name", "state", "time_used", "time_limit", "nodes", "reason_or_nodes", "gres")))
    assert (long["4"].reason, long["5"].reason, long["2"].node_list) == ("Resources", "Priority", "n1")
    short = by_id(states.parse_squeue(recorded("22.05/squeue_state_pending.txt"),
                                      fields=("job_id", "state", "reason", "start", "node_list")))
    assert short["4"].pending and short["4"].start and short["2"].node_list == "n1"


def test_scontrol_one_line_records_of_jobs():
    recs = {r["JobId"]: r for r in states.parse_scontrol(recorded("23.11/scontrol-jobs.txt"))}
    assert recs["5301"]["Command"] == "/shared/proj/.gpuops/runs/r5301/job.sbatch"
    assert recs["5301"]["AllocNode:Sid"] == "login1:4722" and recs["5301"]["CPUs/Task"] == "32"
    pending = states.job_from_scontrol(recs["5301"])
    assert (pending.reason, pending.reason_detail, pending.nodes) == ("ReqNodeNotAvail",
                                                                      "UnavailableNodes:gpu[03-04]", 2)
    held = states.job_from_scontrol(recs["5302"])
    assert held.reason == "launch failed requeued held" and held.restarts == 1  # scontrol's _ read as spaces
    running = states.job_from_scontrol(recs["5304"])
    assert running.state == "RUNNING" and running.restarts == 1 and running.time_limit_s == 86400
    assert (running.batch_host, running.requeue) == ("gpu01", True)
    assert running.std_out == "/shared/proj/.gpuops/runs/r5304/slurm-5304.out"
    local = states.job_from_scontrol(states.parse_scontrol(recorded("22.05/scontrol_job_requeued_running.txt"))[0])
    assert local.state == "RUNNING" and local.restarts == 1


# -- the end of a job ----------------------------------------------------------------------------------------------
def test_sacct_endings_recorded_on_23_11():
    text = recorded("23.11/sacct-endings.txt")
    e = {j: states.ending_from_sacct(text, j) for j in ("301", "302", "303", "306", "307", "308", "309")}
    assert (e["301"].state, e["301"].signal, e["301"].exit_status) == ("TIMEOUT", 15, 143)  # 0:0, .batch 0:15
    assert (e["302"].state, e["302"].exit_status, e["302"].by_scheduler) == ("TIMEOUT", 0, True)  # trapped TERM
    assert (e["303"].state, e["303"].exit_status, e["303"].by_scheduler) == ("FAILED", 3, False)
    assert (e["306"].cancelled_by, e["306"].exit_status, e["306"].nodes) == ("0", None, ())  # before it started
    assert (e["307"].cancelled_by, e["307"].signal_name, e["307"].exit_status) == ("1000", "SIGTERM", 143)
    assert (e["308"].state, e["308"].exit_status, e["308"].cancelled_by) == ("FAILED", 137, None)  # OverMemoryKill
    assert (e["309"].state, e["309"].exit_status, e["309"].nodes) == ("NODE_FAIL", None, ("cn01",))


def test_sacct_gpu_jobs_requeues_oom_and_gpu_hours():
    text = recorded("23.11/sacct-gpu.txt")
    t = states.ending_from_sacct(text, "4401")
    assert (t.state, t.reason, t.exit_status, t.gpus, t.nodes) == ("TIMEOUT", "TimeLimit", 143, 16, ("gpu01", "gpu02"))
    assert t.gpu_hours == pytest.approx(16 * 14426 / 3600)
    assert t.words() == "sacct: State=TIMEOUT ExitCode=0:15 (SIGTERM) Reason=TimeLimit on gpu[01-02]"
    r = states.ending_from_sacct(text, "4402")  # NODE_FAIL on gpu[03-04], requeued, completed on gpu[01,05]
    assert (r.state, r.restarts, r.attempts[0]["state"], r.attempts[0]["node_list"]) == ("COMPLETED", 1, "NODE_FAIL",
                                                                                       "gpu[03-04]")
    assert r.gpu_hours == pytest.approx(16 * (3600 + 7200) / 3600)  # both attempts are billed
    assert "requeued 1 time (NODE_FAIL on gpu[03-04])" in r.words()
    oom = states.ending_from_sacct(text, "4403")
    assert (oom.state, oom.signal, oom.signal_name, oom.exit_status, oom.gpus) == ("OUT_OF_MEMORY", 125, "OOM kill",
                                                                                  137, 8)
    assert states.ending_from_sacct(text, "4404").cancelled_by == "1000"
    assert states.ending_from_sacct(text, "4405").exit_status == 1
    assert states.ending_from_sacct(text, "4406") is None  # requeued twice, pending again: not ended
    assert states.ending_from_sacct(text, "4407") is None  # running
    hours = states.gpu_hours(text)
    assert hours["4402"] == pytest.approx(48.0) and hours["4406"] == pytest.approx(8 * 900 / 3600)
    assert states.gpu_cost(hours["4402"], 2.49) == pytest.approx(119.52)
    assert states.gpu_cost(hours["4402"], None) is None and r.cost(2.0) == pytest.approx(96.0)


def test_scontrol_endings_without_accounting():
    e = states.ending_from_scontrol(recorded("23.11/scontrol-jobs.txt"), "5303")
    assert (e.state, e.signal, e.exit_status, e.gpus, e.elapsed_s, e.source) == ("TIMEOUT", 15, 143, 16, 14427,
                                                                                 "scontrol")
    assert states.ending_from_scontrol(recorded("23.11/scontrol-jobs.txt"), "5301") is None  # pending
    nf = states.ending_from_scontrol(recorded("22.05/scontrol_job_node_fail.txt"))
    assert (nf.state, nf.reason, nf.exit_status, nf.nodes) == ("NODE_FAIL", "NodeDown", None, ("n2",))
    failed = states.ending_from_scontrol(recorded("22.05/scontrol_job_failed.txt"))
    assert (failed.state, failed.exit_status, failed.by_scheduler) == ("FAILED", 3, False)
    cancelled = states.ending_from_scontrol(recorded("22.05/scontrol_job_cancelled_pending.txt"))
    assert cancelled.state == "CANCELLED" and cancelled.exit_status is None and cancelled.nodes == ()
    assert states.ending_from_scontrol(recorded("22.05/scontrol_job_running.txt")) is None


# -- Slurm's ending facts through the endings classifier -------------------------------------------------------------
def judge(ending, log=(), **kw):
    f = EndFacts(run_id="r", exit_code=ending.exit_status if ending else kw.pop("exit_code", None), alive=False,
                 log_tail=list(log), scheduler=ending.facts() if ending else None, **kw)
    return endings.classify(f, SPEC, {})


def test_timeout_node_fail_oom_preempted_cancelled_are_slurms_words():
    text = recorded("23.11/sacct-endings.txt")
    e = judge(states.ending_from_sacct(text, "302"), ["step 900 loss 1.2"])  # trapped TERM, exit 0: still ended
    assert e["cause"] == "slurm-timeout" and e["evidence"][0] == "sacct: State=TIMEOUT ExitCode=0:0 on cn01"
    assert "slurm.time" in e["fix"]
    e = judge(states.ending_from_sacct(text, "309"))
    assert e["cause"] == "slurm-node-fail" and "--exclude" in e["fix"]
    assert not any("its launcher ended with it" in x for x in e["evidence"])  # Slurm says why there is no code
    gpu = recorded("23.11/sacct-gpu.txt")
    assert judge(states.ending_from_sacct(gpu, "4403"))["cause"] == "slurm-oom"
    e = judge(states.ending_from_sacct(gpu, "4404"), ["Traceback (most recent call last):", "KeyboardInterrupt"])
    assert e["cause"] == "slurm-cancelled" and e["title"] == "cancelled by uid 1000, not by gpuops (CANCELLED)"
    pre = states.SlurmEnding("9", "PREEMPTED", exit_code=0, signal=15, node_list="gpu10", nodes=("gpu10",))
    assert judge(pre)["cause"] == "slurm-preempted"
    boot = states.SlurmEnding("9", "BOOT_FAIL", exit_code=0, signal=0)
    assert judge(boot)["cause"] == "slurm-boot-fail"
    dl = states.SlurmEnding("9", "DEADLINE", exit_code=0, signal=0)
    assert judge(dl)["cause"] == "slurm-deadline"


def test_failed_alone_is_never_the_answer():
    """Slurm's FAILED is the job's own exit: the log's tail says why, as for any job, with Slurm's line added."""
    failed = states.ending_from_sacct(recorded("23.11/sacct-gpu.txt"), "4405")
    e = judge(failed, ["Traceback (most recent call last):", "  File \"train.py\", line 3, in <module>",
                       "ModuleNotFoundError: No module named 'flash_attn'"])
    assert e["cause"] == "module-missing"
    assert failed.words() in e["evidence"]
    e = judge(failed, ["step 3 loss 2.0"])
    assert e["cause"] == "failed" and e["title"] == "it exited with code 1" and "FAILED" not in e["title"]
    assert "sacct: State=FAILED ExitCode=1:0 Reason=NonZeroExitCode on gpu08" in e["evidence"]


def test_a_job_gpuops_stopped_is_stopped_whatever_slurm_calls_it():
    cancelled = states.ending_from_sacct(recorded("23.11/sacct-gpu.txt"), "4404")
    e = judge(cancelled, stopped={"by": "gpuops stop", "signal": "TERM"})
    assert e["cause"] == "stopped"


def test_a_cluster_that_forgot_the_job_still_has_slurmstepds_line():
    """No accounting and the controller past MinJobAge: the job's own output carries slurmstepd's words."""
    blocks = recorded("23.11/slurmstepd-lines.txt").split("\n--\n")
    causes = [endings.classify(EndFacts(run_id="r", exit_code=143, alive=False, log_tail=b.splitlines()), SPEC, {})
              ["cause"] for b in blocks]
    assert causes == ["slurm-timeout", "killed-outside", "slurm-oom", "slurm-node-fail", "slurm-oom",
                      "slurm-preempted"]


def test_a_completed_slurm_job_needs_no_explanation():
    done = states.ending_from_sacct(recorded("23.11/sacct-gpu.txt"), "4402")
    assert judge(done) is None


def test_the_endings_playbook_loads_with_the_slurm_rows():
    ids = [r["id"] for r in knowledge.load_playbook("endings")["causes"]]
    assert ids.index("slurm-timeout") < ids.index("host-oom") and ids.index("gpu-failed") == 0
    for state in states.SCHEDULER_ENDS:
        assert any(state in (r.get("scheduler") or []) for r in SPEC["causes"]), state


def test_the_local_clusters_22_05_endings_explained():
    """Recorded on the local cluster (sandbox/slurm.py, no accounting: scontrol is the only witness)."""
    def ending(name):
        return states.ending_from_scontrol(recorded(f"22.05/{name}.txt"))

    timeout = ending("scontrol_job_timeout")
    assert (timeout.state, timeout.reason, timeout.exit_status) == ("TIMEOUT", "TimeLimit", 143)
    assert judge(timeout)["cause"] == "slurm-timeout"
    assert judge(ending("scontrol_job_node_fail"))["cause"] == "slurm-node-fail"
    e = judge(ending("scontrol_job_cancelled_running"))
    assert e["cause"] == "slurm-cancelled" and "Slurm did not record who" in e["title"]
    e = judge(ending("scontrol_job_failed"), ["step 1"])
    assert (e["cause"], e["title"]) == ("failed", "it exited with code 3")
    assert judge(ending("scontrol_job_completed_two_nodes")) is None


def test_the_local_clusters_22_05_accounting():
    """Recorded on the local cluster with slurmdbd (sacct -P with a header, Elapsed instead of ElapsedRaw)."""
    text = recorded("22.05/sacct_endings_duplicates.txt")
    e = {j: states.ending_from_sacct(text, j) for j in "12345"}
    assert e["1"].state == "COMPLETED" and judge(e["1"]) is None
    assert (e["2"].state, e["2"].exit_status, judge(e["2"], ["x"])["cause"]) == ("FAILED", 3, "failed")
    assert (e["3"].state, e["3"].cancelled_by, e["3"].exit_status) == ("CANCELLED", "0", 137)
    assert (e["4"].state, e["4"].exit_status, judge(e["4"])["cause"]) == ("TIMEOUT", 143, "slurm-timeout")
    assert e["4"].elapsed_s == 30  # from Elapsed: the fields asked here had no ElapsedRaw
    requeued = e["5"]  # its node lost (NODE_FAIL), requeued, then cancelled while it waited to start again
    assert (requeued.restarts, requeued.attempts[0]["state"], requeued.attempts[0]["node_list"]) == (1, "NODE_FAIL",
                                                                                                   "n2")
    assert "requeued 1 time (NODE_FAIL on n2)" in requeued.words()
    assert states.gpu_hours(text) == {}  # the local cluster's AllocTRES names no GPU: no GPU-hours invented
    plain = states.ending_from_sacct(recorded("22.05/sacct_endings.txt"), "5")  # without --duplicates: one attempt
    assert plain.restarts == 0 and plain.state == "CANCELLED"
