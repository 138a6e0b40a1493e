"""slurm/reasons.py: a pending job's reason in words, with its fix and Slurm's estimated start, from
playbooks/slurm_reasons.yaml, on recorded squeue/scontrol outputs (tests/data/slurm/)."""
from __future__ import annotations

import re

from gpuops.slurm import reasons, states

from support import DATA

SLURM = DATA / "slurm"


def recorded(name: str) -> str:
    """A recorded output without its `## ` header (where its shape comes from)."""
    return "\n".join(ln for ln in (SLURM / name).read_text().splitlines() if not ln.startswith("## "))


def by_id(jobs):
    return {j.job_id: j for j in jobs}


TABLE = reasons.load_reasons()


def test_the_reasons_table_is_data_with_a_source_for_every_row():
    rows = TABLE["reasons"]
    codes = [r["code"] for r in rows if r.get("code")]
    assert len(codes) == len(set(codes)) >= 30
    for r in rows:
        assert (r.get("code") or r.get("match")) and r.get("words") and r.get("source"), r
        if r.get("match"):
            re.compile(r["match"])
    for code in ("Resources", "Priority", "Dependency", "QOSMaxGRESPerUser", "QOSMaxJobsPerUserLimit", "AssocGrpGRES",
                 "ReqNodeNotAvail", "PartitionDown", "PartitionTimeLimit", "BeginTime", "JobHeldUser",
                 "JobHeldAdmin", "launch failed requeued held", "BadConstraints", "InvalidQOS", "InvalidAccount"):
        assert reasons.reason_row(code, TABLE) is not None, code


def test_a_pending_job_said_in_words_with_its_fix_and_estimated_start():
    j = by_id(states.parse_squeue_json(recorded("23.11/squeue.json")))
    w = reasons.explain_pending(j["5201"], TABLE)
    assert w.code == "ReqNodeNotAvail" and w.nodes == ["gpu03", "gpu04"] and "gpu03, gpu04" in w.words
    assert "--exclude" in w.fix and not w.wait
    w = reasons.explain_pending(j["5202"], TABLE, qos="gpu-normal")
    assert "as many GPUs" in w.words and "gpu-normal" in w.words and "fewer GPUs" in w.fix
    w = reasons.explain_pending(j["5203"], TABLE)
    assert w.wait and w.estimated_start == "2025-05-07T17:46:40 UTC"
    assert w.line() == ("pending (Resources): waiting for nodes: the nodes and GPUs it asked for are in use by other "
                        "jobs; it is next in line for them; Slurm's estimated start: 2025-05-07T17:46:40 UTC")
    held = by_id(states.parse_squeue_json(recorded("23.02/squeue.json")))["4101"]
    w = reasons.explain_pending(held, TABLE)  # JobHeldUser, said by what led to the hold
    assert w.code == "launch failed requeued held" and "scontrol release" in w.fix


def test_families_of_limits_and_an_unknown_reason():
    def words(code, **kw):
        return reasons.explain_pending(states.QueueJob("1", "PENDING", reason=code), TABLE, **kw)

    assert "used up its allocation" in words("AssocGrpGRESMinutes", account="lab").words
    assert "account lab as a whole" in words("AssocGrpCpuLimit", account="lab").words
    assert "allows one job" in words("QOSMaxNodePerJobLimit", qos="short").words
    assert "QOS normal" in words("QOSMaxCpuPerUserLimit", qos="normal").words
    odd = words("SomethingNew")
    assert odd.words == "Slurm says SomethingNew: a reason this table does not know" and not odd.wait
    assert "Slurm has not given a reason yet" in words(None).words


def test_slurms_year_away_placeholder_is_no_estimate():
    """22.05 on the local cluster: a pending job it cannot place gets StartTime = submit + 365 days."""
    rec = states.parse_scontrol(recorded("22.05/scontrol_job_pending_resources.txt"))[0]
    job = states.job_from_scontrol(rec)
    import time

    submitted = time.mktime(time.strptime(rec["SubmitTime"], "%Y-%m-%dT%H:%M:%S"))
    assert reasons.explain_pending(job, TABLE).estimated_start == job.start  # without a clock: as Slurm said it
    assert reasons.explain_pending(job, TABLE, now=submitted).estimated_start is None
    soon = states.QueueJob("2", "PENDING", reason="Resources", start_epoch=submitted + 3600)
    assert reasons.explain_pending(soon, TABLE, now=submitted).estimated_start is not None


def test_the_local_clusters_22_05_pending_jobs_in_words():
    """Recorded on the local cluster (sandbox/slurm.py): a job asking for more nodes than the partition has, a node
    drained by an admin, a requeued job waiting to start again."""
    def words(name):
        rec = states.parse_scontrol(recorded(f"22.05/{name}.txt"))[0]
        return reasons.explain_pending(states.job_from_scontrol(rec), TABLE)

    too_many = words("scontrol_job_pending_too_many_nodes")
    assert too_many.code == "PartitionConfig" and "not configured to give" in too_many.words and not too_many.wait
    notavail = words("scontrol_job_pending_reqnodenotavail")
    assert notavail.nodes == ["n3"] and "--exclude" in notavail.fix
    assert words("scontrol_job_requeued_pending").wait
