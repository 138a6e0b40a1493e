"""The checkpoint a requeued attempt resumes from, chosen on the cluster by the attempt itself (pure: text in and
out).

Slurm requeues a job (a node failed, it was preempted) at any hour, while no gpuops process may be looking. So the
choice cannot wait for gpuops: the run's folder holds `resume_judge.py` (written at submission, `judge_script`), and
the batch script runs it at the start of every requeued attempt (SLURM_RESTART_COUNT > 0), with the profile's
python, on the allocation's first node, before the job starts. It is transfer/ckptjudge.py itself, the file gpuops'
own fetcher and recovery judge with, followed by transfer/fetch.py's listing script and the rules of
playbooks/checkpoints.yaml as JSON: the same code and the same rules decide here and there.

What it judges: the run's checkpoint folder (`slurm.checkpoints` or `train --checkpoints`, the job's
GPUOPS_CHECKPOINT_DIR) on the shared filesystem, as a host's recovery judges it after a death (`job="died"`: what
counted only by timing does not; a step with a file smaller than its predecessor's is passed over whatever marker it
has), and only what this run wrote: a step folder older than the run's first attempt (the `attempts` file's first
line) is not this run's. What it does:
  - the newest complete checkpoint found: its absolute path replaces `resume_from` (written beside it, renamed over
    it), which the batch script then reads into GPUOPS_RESUME_FROM;
  - none: `resume_from` stays as it was (what gpuops wrote, or nothing: a fresh start);
  - either way one JSON line appended to the run folder's `resumes` (RESUMES_FILE): the attempt, the job id, the
    checkpoint and its evidence, each newer folder passed over and why. `gpuops status` reads it and says it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

JUDGE_NAME = "resume_judge.py"
RESUMES_FILE = "resumes"

_MAIN = r'''

# -- what the batch script runs (slurm/resume.py) ------------------------------------------------------------------
import contextlib as _contextlib
import io as _io
import json as _json
import os as _os
import sys as _sys
import time as _time


def _listing(path):
    spec = {"list": {"c": path}, "evidence": {"names": ["c"], **evidence_spec(None, RULES)}}
    buf, argv = _io.StringIO(), _sys.argv
    _sys.argv = [argv[0], _json.dumps(spec)]
    try:
        with _contextlib.redirect_stdout(buf):
            exec(compile(LISTING, "gpuops-listing", "exec"), {"__name__": "gpuops_listing"})
    finally:
        _sys.argv = argv
    return _json.loads(buf.getvalue())["roots"]["c"]


def _first_start(run_dir):
    try:
        with open(_os.path.join(run_dir, "attempts")) as fh:
            for line in fh:
                parts = line.split()
                if parts and parts[0].isdigit():
                    return float(parts[0])
    except OSError:
        pass
    return None


def _write(path, text):
    tmp = "%s.%d.tmp" % (path, _os.getpid())
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        _os.fsync(fh.fileno())
    _os.replace(tmp, path)


def main(run_dir, folder, attempt, job_id):
    since = _first_start(run_dir)
    root = _listing(folder)
    doc = {"attempt": int(attempt), "job_id": job_id, "at": _time.time(), "folder": root.get("path") or folder,
           "since": since, "checkpoint": None, "dir": None, "step": None, "evidence": [], "passed_over": [],
           "warnings": []}
    if not root.get("is_dir"):
        doc["passed_over"] = [["", "no checkpoint folder %s" % folder]]
    else:
        files = root.get("files") or []
        v = judge(step_dirs(files), files=files, since=since, job="died", quiet=False,
                  seen=Seen.from_listing(root.get("evidence")), rules=RULES)
        doc.update(dir=v.dir, step=v.step, evidence=list(v.evidence or []), warnings=list(v.warnings or []),
                   passed_over=[list(x) for x in v.passed_over or []])
        doc["evidence_words"] = said(v.evidence, RULES)
        if v.dir is not None:
            doc["checkpoint"] = root["path"].rstrip("/") + ("/" + v.dir if v.dir else "")
    if doc["checkpoint"]:
        _write(_os.path.join(run_dir, "resume_from"), doc["checkpoint"] + "\n")
        print("gpuops: attempt %d resumes from %s (complete by: %s)" % (int(attempt) + 1, doc["checkpoint"],
                                                                       doc["evidence_words"]))
    else:
        why = "".join("; %s: %s" % (d or "the folder", w) for d, w in doc["passed_over"][:3])
        print("gpuops: attempt %d: no complete checkpoint of this run in %s%s" % (int(attempt) + 1, folder, why))
    with open(_os.path.join(run_dir, "resumes"), "a") as fh:
        fh.write(_json.dumps(doc) + "\n")


if __name__ == "__main__":
    main(*_sys.argv[1:5])
'''


def judge_script(rules: dict) -> str:
    """The text of the run folder's resume_judge.py (stdlib only, Python 3.7+)."""
    from ..transfer import ckptjudge, fetch

    source = Path(ckptjudge.__file__).read_text(encoding="utf-8")
    return ("#!/usr/bin/env python3\n# generated by gpuops at submission (slurm/resume.py): chooses the checkpoint a "
            "requeued attempt of this run resumes from\n" + source
            + f"\n\nLISTING = {json.dumps(fetch.REMOTE_SCRIPT)}\nRULES = __import__('json').loads("
            + f"{json.dumps(json.dumps(rules, sort_keys=True))})\n" + _MAIN)


def parse_resumes(text: Optional[str]) -> list[dict]:
    """The run folder's `resumes` file: one dict per requeued attempt's choice, in order (a torn line is skipped)."""
    from ..jsonvocab import json_objects

    return json_objects((text or "").splitlines())


def words(doc: dict, project_dir: Optional[str] = None) -> str:
    """One requeued attempt's choice in words, for status: "attempt 1 resumed from checkpoints/checkpoint-4 (complete
    by: marker:hf-trainer); passed over checkpoint-5: ...". project_dir: paths under it are said relative."""
    def rel(p: str) -> str:
        if project_dir and p.startswith(project_dir.rstrip("/") + "/"):
            return p[len(project_dir.rstrip("/")) + 1:]
        return p

    n = doc.get("attempt", "?")
    if doc.get("checkpoint"):
        line = f"attempt {int(n) + 1 if str(n).isdigit() else n} resumed from {rel(doc['checkpoint'])} " \
               f"(complete by: {doc.get('evidence_words') or ', '.join(doc.get('evidence') or []) or '-'})"
    else:
        line = f"attempt {int(n) + 1 if str(n).isdigit() else n}: no complete checkpoint of this run in " \
               f"{rel(doc.get('folder') or '?')}: started from the beginning (or the resume file gpuops wrote)"
    over = [f"{d or 'the folder'}: {why}" for d, why in (doc.get("passed_over") or [])][:3]
    if over and doc.get("checkpoint"):
        line += "; passed over " + "; ".join(over)
    return line
