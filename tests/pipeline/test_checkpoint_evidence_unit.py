"""A checkpoint counts because of evidence, not the clock (issue 35): the rules of playbooks/checkpoints.yaml judged
by the pure pipeline/checkpoints.py on recorded listings of real frameworks' layouts, the vouching revoked at a
job's death, and the listing script's evidence (open handles, files cut short, markers) on real files and a real
process here (it runs on this machine as it runs on an instance)."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zipfile

import pytest

from gpuops.pipeline import checkpoints as ck
from gpuops.transfer import plan as tr
from gpuops.transfer.fetch import REMOTE_SCRIPT


def judge(rows, job="died", quiet=False, since=None, **seen):
    rows = [list(r) for r in rows]
    return ck.resumable(tr.step_dirs(rows), files=rows, since=since, job=job, quiet=quiet, seen=ck.Seen(**seen))


def test_every_marker_of_the_playbook_has_a_source_and_each_vouches_as_its_framework_writes_it():
    rules = ck.book()
    assert all(m.get("source") and m.get("files") for m in rules["markers"])
    assert all(t.get("source") for t in rules["temporary"]) and all(v.get("source") for v in rules["validity"])
    # DeepSpeed: `latest` beside the tag folders names the one written last (global_stepN, no underscore)
    ds = [("global_step100/mp_rank_00_model_states.pt", 9, 1.0), ("global_step200/mp_rank_00_model_states.pt", 9, 2.0),
          ("latest", 13, 2.5)]
    v = judge(ds, contents={"latest": "global_step200\n"})
    assert (v.dir, v.evidence) == ("global_step200", ["marker:deepspeed"])
    v = judge(ds, contents={"latest": "global_step100"})  # 200 still being written: 100 is what latest names
    assert v.dir == "global_step200" and v.evidence == ["predecessor"]  # ...yet 200 has 100's files, none smaller
    # Megatron: iter_0000200, the tracker file holds the step number
    mg = [("iter_0000100/mp_rank_00/model_optim_rng.pt", 9, 1.0), ("iter_0000200/mp_rank_00/model_optim_rng.pt", 4, 2.0),
          ("latest_checkpointed_iteration.txt", 3, 1.5)]
    v = judge(mg, contents={"latest_checkpointed_iteration.txt": "100"})
    assert (v.dir, v.evidence) == ("iter_0000100", ["marker:megatron"])
    assert "or one smaller" in v.reasons()  # iter 200's file is shorter: cut short
    # verl: global_step_N and the same tracker file
    v = judge([("global_step_5/actor/model.pt", 9, 1.0), ("latest_checkpointed_iteration.txt", 1, 1.5)],
              contents={"latest_checkpointed_iteration.txt": "5"})
    assert (v.dir, v.evidence) == ("global_step_5", ["marker:megatron"])
    # torch.distributed.checkpoint: .metadata, written once every rank's shards are
    dcp = [("checkpoint-1/__0_0.distcp", 9, 1.0), ("checkpoint-1/__1_0.distcp", 9, 1.0)]
    assert judge(dcp).dir is None
    assert judge(dcp + [("checkpoint-1/.metadata", 2, 1.1)]).evidence == ["marker:torch-dcp"]
    # HF Trainer: trainer_state.json after the model, optimizer, scheduler and RNG state
    hf = [("checkpoint-500/model.safetensors", 9, 1.0), ("checkpoint-500/optimizer.pt", 9, 1.0)]
    assert judge(hf).dir is None
    assert judge(hf + [("checkpoint-500/trainer_state.json", 9, 1.0)]).evidence == ["marker:hf-trainer"]
    # Orbax: a save folder under its temporary name never counts; the commit marker vouches
    assert judge([("checkpoint-7.orbax-checkpoint-tmp-3/checkpoint-7/x", 1, 1.0)]).dir is None
    ob = [("checkpoint-7/state/x", 1, 1.0), ("checkpoint-7/commit_success.txt", 1, 1.0)]
    assert judge(ob).evidence == ["marker:orbax"]


def test_what_rules_a_folder_out_whatever_vouches_for_it():
    base = [("checkpoint-1/model.pt", 9, 1.0), ("checkpoint-1/COMPLETE", 0, 1.0)]
    v = judge(base + [("checkpoint-1/optim.pt.tmp", 9, 1.0)])
    assert v.dir is None and "optim.pt.tmp has a temporary name" in v.reasons()
    v = judge(base, job="alive", quiet=True, open=frozenset({"checkpoint-1/model.pt"}))
    assert v.dir is None and "model.pt is open for writing by the job" in v.reasons()
    v = judge(base, invalid={"checkpoint-1/model.pt": "a zip (torch.save) without its end-of-central-directory "
                                                       "record: cut short or still written"})
    assert v.dir is None and "model.pt: a zip (torch.save) without" in v.reasons()


def test_the_atomic_rename_writers_newest_folder_counts_after_a_death():
    """Issue 35: written 2 s before a preemption, the newest folder was passed over for an older one (steps lost).
    It has its predecessor's files, none smaller: it counts, also once the job is dead."""
    rows = [(f"checkpoint-{s}/{n}", 20 + s, float(s)) for s in (1, 2, 3) for n in ("model.bin", "step")]
    v = judge(rows, job="died")
    assert (v.dir, v.evidence) == ("checkpoint-3", ["predecessor"])
    assert ck.durable(v.evidence)


def test_timing_alone_vouches_only_while_the_job_lives_and_its_death_revokes_it():
    v = judge([("model.bin", 9, 1.0)], job="alive", quiet=True)  # a folder of no step folders, held still
    assert (v.dir, v.evidence) == ("", ["quiet"]) and not ck.durable(v.evidence)
    assert judge([("model.bin", 9, 1.0)], job="died", quiet=True).dir is None
    good = ck.entry("checkpoints", "checkpoints", "checkpoint-2", 2, 10.0, "r", evidence=["successor"])
    timing = ck.entry("checkpoints", "checkpoints", "checkpoint-3", 3, 20.0, "r", evidence=["quiet"])
    assert ck.after_death([good, timing]) == (good, [timing])
    assert ck.after_death([timing]) == (None, [timing])
    legacy = {k: v for k, v in good.items() if k != "evidence"}  # a record from before evidence: it counted
    assert ck.after_death([legacy]) == (legacy, [])
    assert "the job moved past it" in ck.said(["successor"]) and "DeepSpeed" in ck.said(["marker:deepspeed"],
                                                                                         ck.book())


# -- the listing's own remote execution, run here ---------------------------------------------------------------
def _listing(root, run_id):
    spec = {"list": {"checkpoints": str(root)},
            "evidence": {"names": ["checkpoints"], **ck.evidence_spec(run_id, ck.book())}}
    r = subprocess.run([sys.executable, "-", json.dumps(spec)], input=REMOTE_SCRIPT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["roots"]["checkpoints"]


def _safetensors(path, cut=0):
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    data = struct.pack("<Q", len(header)) + header + b"\0" * 16
    path.write_bytes(data[:len(data) - cut])


def test_the_listing_sees_files_cut_short_markers_and_the_jobs_open_handles(tmp_path):
    root = tmp_path / "ckpt"
    (root / "checkpoint-1").mkdir(parents=True)
    with zipfile.ZipFile(root / "checkpoint-1" / "model.pt", "w") as z:  # what torch.save writes: a zip
        z.writestr("archive/data.pkl", b"x" * 1000)
    whole = (root / "checkpoint-1" / "model.pt").read_bytes()
    (root / "checkpoint-1" / "cut.pt").write_bytes(whole[:700])  # the same, cut short: no end record
    (root / "checkpoint-1" / "legacy.bin").write_bytes(b"\x80\x02 a pickle")  # not a zip: not judged
    _safetensors(root / "checkpoint-1" / "model.safetensors")
    _safetensors(root / "checkpoint-1" / "half.safetensors", cut=5)
    (root / "latest").write_text("checkpoint-1")
    (root / "checkpoint-1" / "optim.pt").write_bytes(b"")
    env = {**os.environ, "GPUOPS_RUN_ID": "job-evidence-1"}
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nf = open(sys.argv[1], 'ab')\n"
                               "print('open', flush=True)\ntime.sleep(60)", str(root / "checkpoint-1" / "optim.pt")],
                              env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        doc = _listing(root, "job-evidence-1")["evidence"]
        other = _listing(root, "job-someone-else")["evidence"]
    finally:
        holder.kill()
        holder.wait()
    assert doc["open"] == ["checkpoint-1/optim.pt"] and doc["pids"] == 1
    assert other["open"] == [] and other["pids"] == 0  # another run's processes are not this job's
    assert set(doc["invalid"]) == {"checkpoint-1/cut.pt", "checkpoint-1/half.safetensors",
                                   "checkpoint-1/optim.pt"}  # (empty: held open, and nothing written yet)
    assert "end-of-central-directory" in doc["invalid"]["checkpoint-1/cut.pt"]
    assert "cut short" in doc["invalid"]["checkpoint-1/half.safetensors"]
    assert doc["contents"] == {"latest": "checkpoint-1"}
    rows = _listing(root, "job-evidence-1")["files"]
    v = ck.resumable(tr.step_dirs(rows), files=rows, since=None, job="alive", quiet=True,
                     seen=ck.Seen.from_listing(doc))
    assert v.dir is None and "open for writing by the job" in v.reasons()


@pytest.mark.parametrize("name", ["checkpoint-3", "global_step3", "global_step_3", "iter_0000003"])
def test_the_step_folders_of_each_framework_are_recognised(name):
    assert tr.step_of(name) == 3


def test_files_cut_short_whatever_their_bytes_look_like(tmp_path):
    """review of #35: an empty torch.save file (opened, nothing written when the job died) was valid; a zip cut
    after bytes that hold another zip's end record (a checkpoint holding a zip: a tokenizer archive) was valid; a
    safetensors file longer than its header says was said "cut short"."""
    import io

    root = tmp_path / "ckpt"
    (root / "checkpoint-1").mkdir(parents=True)
    (root / "checkpoint-1" / "optim.pt").write_bytes(b"")
    (root / "checkpoint-1" / "rng.pth").write_bytes(b"PK")  # the first bytes of a zip, and no more
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("vocab.txt", b"a b c")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", inner.getvalue() + b"\0" * 40)
        z.writestr("archive/data/0", b"\1" * 4000)
    whole = buf.getvalue()
    cut = whole.index(inner.getvalue()) + len(inner.getvalue()) + 30  # 30 bytes after the inner end record
    (root / "checkpoint-1" / "model.pt").write_bytes(whole[:cut])
    (root / "checkpoint-1" / "whole.pt").write_bytes(whole)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (root / "checkpoint-1" / "long.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 20)
    inv = _listing(root, "job-x")["evidence"]["invalid"]
    assert set(inv) == {"checkpoint-1/optim.pt", "checkpoint-1/rng.pth", "checkpoint-1/model.pt",
                        "checkpoint-1/long.safetensors"}, inv
    assert "empty" in inv["checkpoint-1/optim.pt"]
    assert "end-of-central-directory" in inv["checkpoint-1/model.pt"]
    assert "cut short" not in inv["checkpoint-1/long.safetensors"] and "more bytes" in inv["checkpoint-1/long.safetensors"]


def test_a_marker_written_before_the_files_vouches_for_nothing_once_a_file_is_smaller_than_its_predecessors():
    """Issue 42: trainer_state.json first, model.bin half written when the job died. While the job lived its open
    file ruled it out; after the death only the sizes tell, and a marker does not outweigh them."""
    rows = [("checkpoint-2/trainer_state.json", 1, 1.0), ("checkpoint-2/model.bin", 200000, 1.1),
            ("checkpoint-3/trainer_state.json", 1, 2.0), ("checkpoint-3/model.bin", 100000, 2.1)]
    v = judge(rows, job="died")
    assert (v.dir, v.evidence) == ("checkpoint-2", ["marker:hf-trainer"]), v
    assert "checkpoint-3: a file smaller than in checkpoint-2" in v.reasons(), v.reasons()
    grown = [r if r[0] != "checkpoint-3/model.bin" else ("checkpoint-3/model.bin", 200000, 2.1) for r in rows]
    assert judge(grown, job="died").dir == "checkpoint-3"  # whole: its marker vouches
    assert judge(rows, job="succeeded").dir == "checkpoint-3"  # a job that succeeded wrote what it meant to


def test_a_deepspeed_latest_that_names_a_folder_not_there_is_said_with_the_fix():
    """Issue 42: `latest` names global_step99 beside global_step1-3; DeepSpeed's load_checkpoint without a tag reads
    it and fails. The verdict still resumes from the newest complete folder, and says so with the fix."""
    rows = [(f"global_step{i}/mp_rank_00_model_states.pt", 9, float(i)) for i in (1, 2, 3)] + [("latest", 12, 3.5)]
    v = judge(rows, job="succeeded", contents={"latest": "global_step99\n"})
    assert v.dir == "global_step3", v
    (w,) = v.warnings
    assert w.startswith("latest names global_step99, which is not there") and "load_checkpoint" in w, w
    assert "echo global_step3 > latest" in w, w
    assert judge(rows, job="succeeded", contents={"latest": "global_step3"}).warnings == []
    mg = [("ckpt/iter_0000100/model.pt", 9, 1.0), ("ckpt/latest_checkpointed_iteration.txt", 3, 1.5)]
    (w,) = judge(mg, contents={"ckpt/latest_checkpointed_iteration.txt": "300"}).warnings
    assert "ckpt/latest_checkpointed_iteration.txt names 300" in w and "echo 100 > ckpt/" in w, w
    e = ck.entry("checkpoints", "checkpoints", v.dir, v.step, 1.0, "r1", None, v.evidence, v.warnings)
    assert e["warnings"] == v.warnings
