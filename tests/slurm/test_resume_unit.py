"""slurm/resume.py: the judge a requeued attempt runs on the cluster is gpuops' own (transfer/ckptjudge.py shipped
whole): run as its own process on real folders, it chooses what pipeline.checkpoints.resumable chooses here after a
death, for every shape the recovery tests know (markers, successors, predecessors, a half-written step, an earlier
run's folder, a temporary name, a DeepSpeed `latest`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuops.pipeline import checkpoints as ck
from gpuops.slurm import resume
from gpuops.transfer import plan as tr


def _step(root: Path, name: str, files: dict, age: float = 0.0) -> None:
    d = root / name
    d.mkdir(parents=True)
    for rel, data in files.items():
        (d / rel).write_bytes(data)
        if age:
            os.utime(d / rel, (time.time() - age, time.time() - age))


SHAPES = {
    "hf, the newest half written": lambda r: [
        _step(r, f"checkpoint-{n}", {"trainer_state.json": b"{}", "model.bin": b"w" * size})
        for n, size in ((1, 500), (2, 500), (3, 250))],
    "no marker, same files as the step before": lambda r: [
        _step(r, f"step/global_step{n}", {"model.pt": b"w" * 300}) for n in (1, 2, 3)],
    "an earlier run's newer step": lambda r: [
        _step(r, "checkpoint-1", {"trainer_state.json": b"{}", "model.bin": b"w" * 500}),
        _step(r, "checkpoint-7", {"trainer_state.json": b"{}", "model.bin": b"w" * 500}, age=7200)],
    "a temporary name": lambda r: [
        _step(r, "checkpoint-1", {"trainer_state.json": b"{}", "model.bin": b"w"}),
        _step(r, "checkpoint-2", {"trainer_state.json": b"{}", "model.bin.tmp": b"w"})],
    "deepspeed latest, the newest cut short": lambda r: [
        _step(r, f"global_step{n}", {"mp_rank_00_model_states.pt": b"w" * size}) for n, size in ((1, 100), (2, 50))]
        + [(r / "latest").write_text("global_step1")],
    "nothing complete": lambda r: [_step(r, "checkpoint-1", {"model.bin": b"w"})],
    "no step folders, no marker": lambda r: [(r.mkdir(), (r / "model.pt").write_bytes(b"w"))],
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_shipped_judge_chooses_what_gpuops_chooses_here(tmp_path, shape):
    run, root = tmp_path / "run", tmp_path / "ck"
    run.mkdir()
    if shape != "no step folders, no marker":
        root.mkdir()
    start = time.time() - 60
    (run / "attempts").write_text(f"{int(start)} 0 5 n1\n{int(time.time())} 1 5 n2\n")
    SHAPES[shape](root)
    rules = ck.book()
    (run / resume.JUDGE_NAME).write_text(resume.judge_script(rules))
    res = subprocess.run([sys.executable, "-I", str(run / resume.JUDGE_NAME), str(run), str(root), "1", "5"],
                         capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert res.returncode == 0, res.stderr

    rows = [[str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime] for p in sorted(root.rglob("*"))
            if p.is_file()]
    contents = {r[0]: (root / r[0]).read_text() for r in rows if r[0].rsplit("/", 1)[-1] == "latest"}
    here = ck.resumable(tr.step_dirs(rows), files=rows, since=float(int(start)), job="died", quiet=False,
                        seen=ck.Seen(contents=contents), rules=rules)
    [doc] = resume.parse_resumes((run / resume.RESUMES_FILE).read_text())
    assert doc["dir"] == here.dir and doc["evidence"] == (here.evidence or [])
    assert [tuple(x) for x in doc["passed_over"]] == list(here.passed_over or [])
    if here.dir is None:
        assert not (run / "resume_from").exists() and doc["checkpoint"] is None
        assert "no complete checkpoint of this run" in res.stdout
    else:
        want = str(root) + ("/" + here.dir if here.dir else "")
        assert (run / "resume_from").read_text() == want + "\n" == doc["checkpoint"] + "\n"
        assert f"attempt 2 resumes from {want}" in res.stdout


def test_the_expected_choices(tmp_path):
    """What the shapes above resolve to, said once: the comparison is not between two wrong answers."""
    want = {"hf, the newest half written": "checkpoint-2",
            "no marker, same files as the step before": "step/global_step3",
            "an earlier run's newer step": "checkpoint-1", "a temporary name": "checkpoint-1",
            "deepspeed latest, the newest cut short": "global_step1", "nothing complete": None,
            "no step folders, no marker": None}
    for shape, expect in want.items():
        root = tmp_path / shape.replace(" ", "_").replace(",", "").replace("'", "")
        if shape != "no step folders, no marker":
            root.mkdir()
        SHAPES[shape](root)
        rows = [[str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime] for p in sorted(root.rglob("*"))
                if p.is_file()]
        contents = {r[0]: (root / r[0]).read_text() for r in rows if r[0].rsplit("/", 1)[-1] == "latest"}
        v = ck.resumable(tr.step_dirs(rows), files=rows, since=time.time() - 60, job="died", quiet=False,
                         seen=ck.Seen(contents=contents))
        assert v.dir == expect, (shape, v)


def test_a_kept_resume_file_and_a_torn_line():
    assert resume.parse_resumes('{"attempt": 1}\n{"attem\n') == [{"attempt": 1}]
    doc = {"attempt": 2, "checkpoint": "/s/p/ck/checkpoint-4", "evidence_words": "the job moved past it",
           "passed_over": [["checkpoint-5", "a file smaller than in checkpoint-4"]]}
    assert resume.words(doc, "/s/p") == ("attempt 3 resumed from ck/checkpoint-4 (complete by: the job moved past "
                                         "it); passed over checkpoint-5: a file smaller than in checkpoint-4")
    assert json.loads(json.dumps(doc)) == doc
