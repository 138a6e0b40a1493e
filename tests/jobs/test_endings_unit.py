"""The classifier of a job's end (jobs/endings.py) on recorded facts (jobs/endfacts.py's lines, as the host prints
them), and the playbook it reads (playbooks/endings.yaml): every cause a row with its fix and source."""
from __future__ import annotations

import re

import pytest

from gpuops.jobs import endfacts as ef
from gpuops.jobs import endings as en
from gpuops.jobs.plan import RunInfo

NOW = 1_700_000_000.0
UPTIME = 5000.0  # the host booted at NOW - 5000
SPEC = en.load()
XIDS = en.xid_table()


def judge(lines, *, rc=1, started=NOW - 100, ended=NOW - 5, alive=False, stopped=None, **extra):
    info = RunInfo(run_id="r", exit_code=rc, started=started, ended=ended, alive=alive, stopped=stopped)
    host = [f"EN - now {NOW:.0f} {UPTIME}"]
    return en.classify(ef.facts_for(ef.parse(host + list(lines)), info, **extra), SPEC, XIDS)


def log(*lines):
    return [f"EN r L {x}" for x in lines]


def dmesg(at: float, msg: str) -> str:
    """A dmesg line for an event at epoch `at` on the host above."""
    return f"EN - K [{at - (NOW - UPTIME):12.6f}] {msg}"


OOM_KILL = ("Out of memory: Killed process 4242 (python3) total-vm:90000000kB, anon-rss:81234567kB, file-rss:0kB, "
            "shmem-rss:0kB, UID:1000 pgtables:160000kB oom_score_adj:0")


def test_a_job_that_succeeded_or_runs_has_no_ending():
    assert judge(log("done"), rc=0) is None
    assert judge(log("step 3"), rc=None, alive=True) is None


def test_every_row_has_a_title_a_fix_a_source_and_valid_patterns():
    ids = [r["id"] for r in SPEC["causes"]]
    assert len(ids) == len(set(ids)) >= 18
    for r in SPEC["causes"]:
        assert r.get("title") and r.get("fix") and r.get("source"), r["id"]
        assert r.get("fact") or r.get("match") or r.get("exit") or r.get("scheduler"), r["id"]
        for p in ([r["match"]] if isinstance(r.get("match"), str) else r.get("match") or []):
            re.compile(p)
        if r.get("fact"):
            assert hasattr(en.Judge, "fact_" + r["fact"]), r["fact"]
    assert ids[-1] == "failed"  # whatever else: the exit code, never nothing


def test_host_oom_placed_in_the_jobs_life_and_told_apart_from_cuda_oom():
    e = judge(log("step 3") + [dmesg(NOW - 6, OOM_KILL)], rc=137)
    assert e["cause"] == "host-oom" and "process 4242 python3, 77.5 GB resident" in e["title"]
    assert e["evidence"] == [f"kernel log: {OOM_KILL}", "tied to the job by time only: the kill fell in its lifetime "
                             "(no list of its processes to name the pid)", "exit code 137 (128 + 9: SIGKILL)"]
    # an OOM kill of another process an hour before the job started is not this job's
    e = judge(log("step 3") + [dmesg(NOW - 3600, OOM_KILL)], rc=137)
    assert e["cause"] == "killed-outside"
    # journalctl's own clock (-o short-unix) places it as well
    e = judge(log("step 3") + [f"EN - K {NOW - 6:.6f} gpu-host kernel: {OOM_KILL}"], rc=137)
    assert e["cause"] == "host-oom"
    # CUDA OOM in the log, nothing in the kernel's: the GPU's memory, not the host's
    e = judge(log("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert e["cause"] == "cuda-oom" and not any("kernel" in x for x in e["evidence"])


def test_the_cgroups_oom_kill_count_is_evidence_too():
    e = judge(log("step 3") + ["EN r F oom_kill 0 1", f"EN r F at {NOW - 5:.0f}"], rc=137)
    assert e["cause"] == "host-oom" and "memory.events oom_kill 0 -> 1" in " ".join(e["evidence"])
    assert judge(log("step 3") + ["EN r F oom_kill 2 2"], rc=137)["cause"] == "killed-outside"


def test_an_unreadable_kernel_log_is_said_where_an_oom_kill_cannot_be_ruled_out():
    e = judge(log("step 3") + ["EN - K @unreadable"], rc=137)
    assert e["cause"] == "killed-outside" and any("could not be read" in x for x in e["evidence"])


def test_a_full_disk_and_exhausted_inodes():
    df_full = "EN r F df /dev/vda1 2024000000 2024000000 0 100% /"
    e = judge(log("OSError: [Errno 28] No space left on device: 'ckpt/optim.pt'") + [df_full])
    assert e["cause"] == "disk-full" and e["title"].endswith("(/ 100% used)")
    assert "df at the end: / 100% used, 0 KB free of 1.9 TB" in e["evidence"]
    inodes = "EN r F dfi /dev/vda1 1000000 1000000 0 100% /"
    e = judge(log("OSError: [Errno 28] No space left on device") + [inodes,
                                                                     "EN r F df /dev/vda1 200000 1000 199000 1% /"])
    assert e["cause"] == "inodes-full" and "0 inodes free" in e["title"]
    # ENOSPC in the log alone (df not read): still a full disk
    assert judge(log("write failed: No space left on device"))["cause"] == "disk-full"


def test_a_gpu_failing_under_the_job_is_the_hardwares():
    xid = "NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python3, GPU has fallen off the bus."
    e = judge(log("RuntimeError: CUDA error: unspecified launch failure") + [dmesg(NOW - 7, xid)], rc=1)
    assert e["cause"] == "gpu-failed" and "Xid 79" in e["title"]
    assert e["evidence"][0].startswith("kernel log: NVRM: Xid") and "last exception: RuntimeError" in e["evidence"][-1]
    # an application's own Xid (13: its bad pointer) is not the GPU's failure
    e = judge(log("RuntimeError: CUDA error: an illegal memory access was encountered") +
              [dmesg(NOW - 7, xid.replace(": 79,", ": 13,"))])
    assert e["cause"] == "cuda-error" and e["title"] == "a CUDA error: an illegal memory access was encountered"
    # nvidia-smi says the GPU is lost (no kernel line readable)
    e = judge(log("step 4"), rc=137, gpu_error="Unable to determine the device handle for GPU0000:08:00.0: GPU is lost.")
    assert e["cause"] == "gpu-failed" and "GPU is lost" in e["title"]


def test_nccl_timeout_hang_and_a_plain_stop():
    e = judge(log("[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
                  "WorkNCCL(SeqNum=20, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600045 milliseconds"), rc=134)
    assert e["cause"] == "nccl-timeout" and "gpuops logs --all" in e["fix"]
    stop = {"by": "gpuops stop", "signal": "INT", "requested": NOW - 10, "ended": NOW - 5, "log_mtime": NOW - 900}
    e = judge(log("step 12", "Traceback (most recent call last):", "KeyboardInterrupt"), rc=130, stopped=stop,
              gpu_util=[100.0] * 12)
    assert e["cause"] == "hang" and e["title"] == "it hung: no output for 14m50s before it was stopped"
    assert any("GPU utilisation in its last 10 samples: 100-100 %" in x for x in e["evidence"])
    e = judge(log("step 12"), rc=130, stopped={**stop, "log_mtime": NOW - 12})
    assert e["cause"] == "stopped" and e["title"] == "stopped by gpuops stop (SIGINT)"
    assert e["fix"] == "nothing to fix: it was stopped on purpose"
    # killed from outside after 20 minutes of silence: a hang too (the log's time against the end)
    e = judge(["EN r M %d" % (NOW - 1300)] + log("step 12"), rc=137, ended=NOW - 100)
    assert e["cause"] == "hang" and e["title"].endswith("before it was killed")


def test_python_exceptions_name_what_and_where():
    e = judge(log("Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
                  "    import flash_attn", "ModuleNotFoundError: No module named 'flash_attn'"))
    assert e["cause"] == "module-missing" and e["title"] == "the job's python has no module flash_attn"
    assert "flash_attn to the project's dependencies" in e["fix"]
    e = judge(log("ImportError: cannot import name 'LlamaFlashAttention2' from 'transformers.models.llama'"))
    assert e["cause"] == "import-error"
    e = judge(log("FileNotFoundError: [Errno 2] No such file or directory: 'data/train.bin'"))
    assert e["cause"] == "file-missing" and e["title"].endswith(": data/train.bin")
    e = judge(log("ConnectionError: Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)"))
    assert e["cause"] == "hub-unreachable" and "HF_HUB_OFFLINE" in e["fix"]
    e = judge(log("huggingface_hub.errors.GatedRepoError: 403 Client Error. Cannot access gated repo"))
    assert e["cause"] == "hub-auth" and "HF_TOKEN" in e["fix"]
    e = judge(log("Traceback (most recent call last):", "ValueError: bad shape (3, 4)"))
    assert e["cause"] == "exception" and e["title"] == "the job raised ValueError: bad shape (3, 4)"
    # a caught error printed earlier does not hide the exception the job died of
    e = judge(log("ModuleNotFoundError: No module named 'wandb' (falling back to print)", "step 1",
                  "Traceback (most recent call last):", "KeyError: 'labels'"))
    assert e["cause"] == "exception" and e["title"] == "the job raised KeyError: 'labels'"


def test_signals_crashes_and_the_last_resort():
    e = judge(log("train.sh: line 3:  4242 Killed                  python train.py"), rc=137)
    assert e["cause"] == "killed-in-script" and "4242 Killed" in e["title"]
    e = judge(log("step 3"), rc=143)
    assert e["cause"] == "killed-outside" and e["title"] == "killed by SIGTERM, which gpuops did not send"
    assert judge(log("Fatal Python error: Segmentation fault"), rc=139)["cause"] == "segfault"
    assert judge(log("train.sh: line 2: deepspeed: command not found"), rc=127)["cause"] == "command-not-found"
    e = judge(log("step 3", "giving up"), rc=3)
    assert e["cause"] == "failed" and e["title"] == "it exited with code 3" and e["evidence"] == ["exit code 3"]


def test_no_exit_code_a_reboot_or_a_kill_of_the_whole_group():
    e = judge(log("step 3"), rc=None, ended=None, started=NOW - 4000)  # booted 5000 s ago: before the start
    assert e["cause"] == "killed-outside" and e["evidence"][0].startswith("no exit code: the launcher")
    e = judge(log("step 3"), rc=None, ended=None, started=NOW - 9000)  # booted after the job started
    assert e["cause"] == "host-rebooted"


def test_a_projects_own_row_is_read_first(tmp_path):
    book = tmp_path / "playbooks" / "endings.yaml"
    book.parent.mkdir()
    from gpuops.paths import data_dir

    text = (data_dir("playbooks") / "endings.yaml").read_text()
    book.write_text(text.replace("causes:\n", "causes:\n  - id: reward-server\n    title: \"the reward server went "
                                 "away\"\n    match: [\"RewardServerGone\"]\n    fix: \"start it first\"\n    "
                                 "source: \"our runbook\"\n", 1))
    spec = en.load(tmp_path)
    info = RunInfo(run_id="r", exit_code=1, started=NOW - 100, ended=NOW - 5)
    f = ef.facts_for(ef.parse(log("RewardServerGone: connection refused")), info)
    assert en.classify(f, spec)["cause"] == "reward-server"


@pytest.mark.parametrize("line,expected", [
    ("[  123.456789] Out of memory: Killed process 1 (x)", NOW - UPTIME + 123.456789),
    (f"{NOW:.6f} host kernel: Out of memory: Killed process 1 (x)", NOW),
])
def test_kernel_lines_are_placed_on_the_hosts_clock(line, expected):
    t, msg = ef.kernel_time(line, NOW - UPTIME, NOW)
    assert abs(t - expected) < 1e-3 and msg == "Out of memory: Killed process 1 (x)"


def test_df_rows_and_the_launchers_facts_parse():
    r = ef.parse_df("/dev/nvme0n1p1 7812500000 7000000000 812500000 90% /home/ubuntu/my data", False)
    assert r.mount == "/home/ubuntu/my data" and r.use_pct == 90 and r.avail == 812500000
    assert ef.parse_df("tmpfs - - - - /run", False) is None
    f = ef.facts_for(ef.parse(["EN r F signal TERM", "EN r F at 123", "EN r F oom_kill - 0"]),
                     RunInfo(run_id="r", exit_code=143))
    assert f.launcher_signal == "TERM" and f.ended_at == 123 and f.oom_kill == (None, 0) and f.end_facts


def test_the_docs_table_of_causes_is_the_playbooks():
    """docs/playbooks.md lists every cause of playbooks/endings.yaml, in its order, with its title."""
    from support import ROOT

    text = (ROOT / "docs" / "playbooks.md").read_text().split("## endings.yaml", 1)[1].split("\n## ", 1)[0]
    rows = [ln.split(" | ") for ln in text.splitlines() if ln.startswith("| `")]
    assert [(r[0].strip("| `"), r[1]) for r in rows] == [(c["id"], c["title"]) for c in SPEC["causes"]]


def test_an_oom_kill_is_tied_to_the_job_by_its_pid_when_the_launcher_listed_the_jobs_processes():
    """issue 35 (review): the kernel line names the pid it killed ("Killed process 4242 (python3)"); the launcher's
    list of the job's processes (end.facts `pids`) ties the kill to the job, or not, whatever the clock says."""
    ours = ["EN r F pids 4100 4242 4243"]
    e = judge(log("step 3") + ours + [dmesg(NOW - 6, OOM_KILL)], rc=137)
    assert e["cause"] == "host-oom"
    assert any("process 4242 was one of the job's processes" in x for x in e["evidence"]), e
    # the same kill in the job's lifetime, of a process that was not the job's: not its cause, but said
    theirs = ["EN r F pids 4100 4101"]
    e = judge(log("step 3") + theirs + [dmesg(NOW - 6, OOM_KILL)], rc=137)
    assert e["cause"] == "killed-outside", e
    assert any("not one of the job's processes" in x and "4242" in x for x in e["evidence"]), e
    # a line that cannot be placed in time, of the job's process: the pid ties it
    e = judge(log("step 3") + ours + [f"EN - K {OOM_KILL}"], rc=1)
    assert e["cause"] == "host-oom", e
    # no list (an older launcher, a host without /proc): by time, as before, and said so
    e = judge(log("step 3") + [dmesg(NOW - 6, OOM_KILL)], rc=137)
    assert e["cause"] == "host-oom" and any("by time only" in x for x in e["evidence"]), e


def test_the_launchers_own_killed_line_is_not_a_command_of_a_script():
    """review: launch.sh (dash) prints a bare `Killed` after its job died of SIGKILL; that is the job killed (from
    outside, or by the OOM killer), not "a command of the script was killed"; bash's line inside a .sh job is."""
    e = judge(log("step 3", "Killed"), rc=137)
    assert e["cause"] == "killed-outside", e
    e = judge(log("step 3", "train.sh: line 4:  4242 Killed                  python train.py", "done?"), rc=1)
    assert e["cause"] == "killed-in-script" and "line 4" in e["title"], e
    e = judge(log("step 3", "Killed", "cleanup done"), rc=1)  # a script went on after its command was killed
    assert e["cause"] == "killed-in-script", e


def test_a_fleets_ending_is_the_first_host_whose_death_is_not_a_consequence_of_anothers():
    nccl = {"cause": "nccl-timeout", "title": "an NCCL collective timed out", "evidence": [], "fix": "", "source": ""}
    oom = {"cause": "host-oom", "title": "killed by the kernel's OOM killer", "evidence": [], "fix": "", "source": ""}
    assert en.root({0: nccl, 1: oom}, SPEC) == {**oom, "host": 1}
    assert en.root({0: nccl, 1: dict(nccl)}, SPEC) == {**nccl, "host": 0}  # only consequences: the lowest rank
    assert en.root({1: oom}, SPEC)["host"] == 1 and en.root({}, SPEC) is None
    from gpuops.jobs.watchtext import ending_lines

    assert ending_lines({**oom, "host": 1})[0] == "why it ended: host #1: killed by the kernel's OOM killer"


def test_a_full_list_of_the_jobs_pids_rules_nothing_out():
    """The launcher keeps at most endfacts.PIDS_MAX pids: past that, a pid the list lacks may still be the job's."""
    e = judge(log("step 3") + ["EN r F pids 4100 4101", "EN r F pids_full", dmesg(NOW - 6, OOM_KILL)], rc=137)
    assert e["cause"] == "host-oom" and any("by time only" in x for x in e["evidence"]), e
    assert "PIDS_MAX" not in ef.LAUNCHER_BEFORE and f"-ge {ef.PIDS_MAX} ]" in ef.LAUNCHER_BEFORE
