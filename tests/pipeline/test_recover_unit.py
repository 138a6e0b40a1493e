"""`gpuops run --recover`, the pure half (issue #24): the stages of a replacement, money and time across instances,
when an instance is (not) replaced, the stream's health and checkpoint lines and how they are judged (verify's own
rules on the kernel log's and nvidia-smi's recorded formats)."""
from __future__ import annotations

import pytest

from gpuops.jobs import watch as w
from gpuops.pipeline import stages as pl
from support.stages import done, rec

XID79 = "[ 5231.774012] NVRM: Xid (PCI:0000:08:00): 79, pid=48213, name=python3, GPU has fallen off the bus."
XID79_JOURNAL = "Nov 23 03:25:52 sandbox kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python3, GPU has fallen off the bus."
XID13 = ("[ 812.113920] NVRM: Xid (PCI:0000:08:00): 13, pid=48213, name=python3, Graphics SM Warp Exception on "
         "(GPC 0, TPC 0, SM 0): Out Of Range Address")
FULL = w.HEALTH_FIELD_SETS[0]


# -- the stages of a replacement -------------------------------------------------------------------------------------
def test_a_replacement_recovers_then_starts_again_at_up_and_pushes_before_the_launch():
    r = done(rec(recover=2, price_per_hour=3.6, fetch=["checkpoints"]), "up", "sync", "setup", "train")
    r.stage("watch").started = 40
    r.recovering = {"kind": "lost", "reason": "instance i-1 is preempted", "at": 50, "ended": None}
    assert pl.next_stage(r) == "recover"
    r.lost = "never both"  # a replacement under way comes first
    assert pl.next_stage(r) == "recover"
    r.lost = None
    r.recovering["ended"] = 60
    from gpuops.pipeline import checkpoints as ck

    r.checkpoint = ck.entry("checkpoints", "checkpoints", "checkpoint-2", 2, 45, r.id)
    r.resume_from = r.checkpoint["path"]
    att = pl.archive(r, 60)
    assert att["started"] == 0 and att["ended"] == 60 and att["reason"] == "instance i-1 is preempted"
    assert r.stages == {} and r.recovering is None and r.run_id is None and r.attempts == [att]
    assert pl.next_stage(r) == "up"
    done(r, "up", "sync", "setup", t0=70)
    assert pl.next_stage(r) == "push"
    r.stage("push").started = 100  # the local process died (or detached) while pushing: pushed again
    assert pl.next_stage(r) == "push"
    done(r, "push", t0=100)
    assert pl.next_stage(r) == "train"


def test_push_only_with_a_checkpoint_and_a_failed_push_terminates():
    r = done(rec(), "up", "sync", "setup")
    assert pl.next_stage(r) == "train"  # nothing to resume from: no push
    r.resume_from = "checkpoints/checkpoint-2"
    assert pl.next_stage(r) == "push"
    done(r, "push", ok=False, t0=40)
    assert pl.next_stage(r) == "down"


def test_spend_and_instances_cover_every_instance():
    r = done(rec(recover=1, price_per_hour=3.6), "up", dur=100)  # 0..100
    r.instance = {"ids": ["i-1"], "type": "gpu_1x_h100_pcie", "region": "us-east-1"}
    r.recovering = {"kind": "gpu", "reason": "Xid 79", "ended": 400.0}
    assert pl.spend(r, 10_000) == pytest.approx(400 / 3600 * 3.6)  # billed until its termination, not now
    pl.archive(r, 400.0)
    r.price_per_hour = 7.2  # the replacement: another price
    r.stage("up").started = 500
    r.instance = {"ids": ["i-2"], "type": "gpu_1x_a100", "region": "us-west-2"}
    assert pl.spend(r, 1400) == pytest.approx(0.4 + 900 / 3600 * 7.2)
    rows = pl.instances(r, 1400)
    assert [(x["instance"], x["ids"], x["seconds"], x["ended"]) for x in rows] == [
        (1, ["i-1"], 400.0, "Xid 79"), (2, ["i-2"], 900.0, "running")]
    assert sum(x["cost"] for x in rows) == pytest.approx(pl.spend(r, 1400))
    assert [(x["instance"], x["stage"]) for x in pl.summary(r, 1400)] == [(1, "up"), (2, "up")]


def test_when_an_instance_is_not_replaced():
    assert pl.why_not_recover(rec(), 0) == "no --recover"
    r = rec(recover=1)
    assert pl.why_not_recover(r, 0) is None
    r.attempts = [{"started": 0, "ended": 1, "price_per_hour": 1.0}]
    assert "every replacement used" in pl.why_not_recover(r, 0)
    assert "ended (succeeded)" in pl.why_not_recover(rec(recover=1, job_state="succeeded"), 0)
    assert "stopping" in pl.why_not_recover(rec(recover=1, stop_reason="interrupted twice"), 0)
    b = rec(recover=1, price_per_hour=3.6, max_cost=1.0)
    b.stage("up").started = 0
    assert "--max-cost" in pl.why_not_recover(b, 1000)
    t = rec(recover=1, ttl_s=3600, ttl_deadline=3600.0)
    assert pl.why_not_recover(t, 3000) is None and pl.ttl_left(t, 3000) == 600
    assert "--ttl" in pl.why_not_recover(t, 3400)
    assert pl.ttl_left(rec(ttl_s=60), 0) == 60 and pl.ttl_left(rec(), 0) is None


def test_which_checkpoint_and_where():
    from gpuops.pipeline import checkpoints as ck

    assert ck.checkpoint_name(["outputs", "checkpoints"]) == "checkpoints"
    assert ck.checkpoint_name(["ckpt", "outputs"]) == "ckpt"
    assert ck.checkpoint_name([]) is None
    e = ck.entry("ckpt", "out/ckpt/", "checkpoint-500", 500, 1.0, "r-1")
    assert (e["path"], e["local"]) == ("out/ckpt/checkpoint-500", "runs/r-1/ckpt/checkpoint-500")
    e = ck.entry("ckpt", "/lambda/nfs/ckpt", None, None, 1.0, "r-1")
    assert (e["path"], e["local"]) == ("/lambda/nfs/ckpt", "runs/r-1/ckpt")


def test_record_with_attempts_round_trips(tmp_path):
    r = done(rec(recover=1, fetch=["checkpoints"]), "up", "watch")
    r.recovering = {"kind": "lost", "reason": "x", "ended": 30}
    pl.archive(r, 30)
    done(r, "up", t0=40)
    pl.save(r, tmp_path)
    back = pl.find(tmp_path, "r1")
    assert back.to_json() == r.to_json() and pl.summary(back, 99) == pl.summary(r, 99)


# -- the stream's lines ----------------------------------------------------------------------------------------------
def test_stream_lines_for_health_and_checkpoints():
    assert w.parse_stderr_line(f"HG {FULL} 0, 2, Yes, No, No, None") == {
        "type": "health", "fields": FULL.split(","), "line": "0, 2, Yes, No, No, None"}
    assert w.parse_stderr_line("HX " + XID79) == {"type": "xid", "line": XID79}
    assert w.parse_stderr_line("CK 12 3735928559") == {"type": "checkpoints", "sig": ("12", "3735928559")}
    assert w.parse_stderr_line("H 1795622718") == {"type": "heartbeat", "at": 1795622718.0}  # the host's clock (#37)
    cmd = w.stream_command("r", "~/p/.gpuops/runs/r", offset=0, extras=w.Extras(health=True, checkpoints="~/p/ck"))
    assert "gpuops_health" in cmd and "gpuops_ck" in cmd and '"$HOME"/p/ck' in cmd
    plain = w.stream_command("r", "~/p/.gpuops/runs/r", offset=0)
    assert "gpuops_health" not in plain and "gpuops_ck" not in plain  # `gpuops watch` streams as before


def _health(*evs):
    from gpuops import knowledge as kb

    hw = w.HealthWatch(kb.load_playbook("xid"), kb.knowledge().get("nvidia_smi_failures"))
    return hw, [hw.apply(e) for e in evs]


def test_health_judged_by_verify_rules_each_said_once():
    hw, got = _health({"type": "xid", "line": XID13}, {"type": "health", "fields": FULL.split(","),
                                                       "line": "0, 0, No, No, No, None"})
    assert got == [[], []]  # an application's Xid and healthy fields end nothing
    got = hw.apply({"type": "xid", "line": XID79})
    assert len(got) == 1 and "Xid 79" in got[0] and "fallen off the bus" in got[0]
    assert hw.apply({"type": "xid", "line": XID79}) == []  # said once
    hw, got = _health({"type": "xid", "line": XID79_JOURNAL})
    assert "Xid 79" in got[0][0]


def test_uncorrectable_ecc_recovery_action_and_a_lost_gpu_end_it():
    hw, got = _health({"type": "health", "fields": FULL.split(","), "line": "0, 0, No, No, No, None"},
                      {"type": "health", "fields": FULL.split(","), "line": "1, 3, Yes, No, No, None"})
    assert got[0] == [] and any("uncorrectable since boot: GPU 1: 3" in f for f in got[1])
    _, got = _health({"type": "health", "fields": FULL.split(","), "line": "0, 0, No, No, No, Reset"})
    assert any("GPU recovery action" in f for f in got[0])
    old = w.HEALTH_FIELD_SETS[-1]  # an old driver's answer: the ECC count alone
    _, got = _health({"type": "health", "fields": old.split(","), "line": "0, [N/A]"})
    assert got == [[]]
    _, got = _health({"type": "gpu_error", "message": "Unable to determine the device handle for GPU0000:08:00.0: "
                                                      "GPU is lost.  Reboot the system to recover this GPU"},
                     {"type": "gpu_error", "message": "Failed to initialize NVML: Unknown Error"})
    assert "GPU lost" in got[0][0] and got[1] == []


def test_a_checkpoint_is_fetched_once_it_held_still():
    cw = w.CheckpointWatch()
    ck = lambda n, crc: {"type": "checkpoints", "sig": (n, crc)}  # noqa: E731
    assert [cw.apply(ck("0", "1")), cw.apply(ck("0", "1"))] == [False, False]  # empty folder
    assert cw.apply(ck("2", "10")) is False  # changed: not yet
    assert cw.apply(ck("2", "10")) is True  # held still a sample: fetch
    assert cw.apply(ck("2", "10")) is False  # under way
    assert cw.apply(ck("4", "20")) is False and cw.apply(ck("4", "20")) is False  # still under way
    cw.done()
    assert cw.apply(ck("4", "20")) is True  # the newer one, now
    cw.done()
    assert cw.apply(ck("4", "20")) is False  # fetched in that state
    assert cw.apply({"type": "sample"}) is False


def test_an_api_outage_is_said_once_and_its_end_once(monkeypatch, tmp_path):
    """A fleet's watch asks the API every 10 s: an outage used to be a warning at every ask (360 an hour)."""
    import io
    from types import SimpleNamespace

    from gpuops.cloud import managed as instances
    from gpuops.console import Output
    from gpuops.errors import GpuopsError
    from gpuops.pipeline import runner as rn

    ids = ["i-0", "i-1"]
    monkeypatch.setattr(instances, "managed_profile", lambda name: SimpleNamespace(cloud=SimpleNamespace(instance_ids=ids)))
    answers = ["down", "down", "down", "up", "down"]

    class Client:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def instances(self):
            if answers.pop(0) == "down":
                raise GpuopsError("Lambda API: global/internal-error (HTTP 500)")
            return [SimpleNamespace(id=i, status="active") for i in ids]

    err = io.StringIO()
    out = Output(json_mode=False, stdout=io.StringIO(), stderr=err)
    rec = rn.new_record(script="train.py", args=[], regions=[], nodes=2, fetch=[], keep=False, ttl_s=None,
                        max_cost=None, key=None, name="t")
    runner = rn.Runner(rec, out, tmp_path, lambda: SimpleNamespace(client=Client()))
    assert [runner._fate() for _ in range(5)] == [None] * 5
    said = err.getvalue()
    assert said.count("could not ask the Lambda API") == 2, said  # the first outage, then the second
    assert said.count("answers again") == 1, said


def test_an_eager_watch_looks_as_the_folder_changes_and_again_once_it_holds_still():
    """Issue 42: a job that checkpoints more often than its folder holds still for two samples (a loaded machine
    stretches the samples) had nothing taken before a preemption. Eager, each change is looked at once (one look
    under way at a time); the look as it holds still follows, for the evidence only stillness gives."""
    cw = w.CheckpointWatch(eager=True)
    ck = lambda n, crc: {"type": "checkpoints", "sig": (n, crc)}  # noqa: E731
    assert cw.apply(ck("0", "1")) is False  # empty folder
    assert cw.apply(ck("2", "10")) is True and cw.mode == "changed"  # changed: looked at at once
    assert cw.apply(ck("3", "11")) is False  # changed again while that look is under way
    cw.done()
    assert cw.apply(ck("4", "12")) is True and cw.mode == "changed"  # never still: every change still looked at
    cw.done()
    assert cw.apply(ck("4", "12")) is True and cw.mode == "quiet"  # held still a sample: the quiet look
    cw.done()
    assert cw.apply(ck("4", "12")) is False  # looked at in that state, both ways
    plain = w.CheckpointWatch()
    assert plain.apply(ck("2", "10")) is False  # not eager: only once it held still, as before
