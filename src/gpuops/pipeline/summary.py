"""`gpuops run`'s closing summary: the record rendered (rich, plain lines or --json) with what was fetched, the
checkpoints and where they are."""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Optional

from . import checkpoints as ck, prepplan, stages as pl


def _rel(path: Optional[str], project: Path) -> Optional[str]:
    """A fetched folder as the summary shows it: relative to the project folder where it is inside."""
    if not path:
        return None
    try:
        return str(Path(path).resolve().relative_to(project.resolve()))
    except ValueError:
        return str(path)


def _hms(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S")


def _resumable(c: dict) -> str:
    if not c.get("newest"):
        return ""
    return f"; resumable from {c['newest']}" + (f" (complete by: {c['evidence_said']})" if c.get("evidence_said")
                                                else "")


def _holds_files(path: Path) -> bool:
    """Does a fetch destination hold fetched files (not only a fetch's staging or recheck folder)?"""
    from ..transfer.plan import STAGING_DIR

    try:
        return any(not p.name.startswith(STAGING_DIR) for p in path.iterdir())
    except OSError:
        return False


def checkpoints_doc(rec: pl.Record, fetched: Optional[dict] = None, project: Optional[Path] = None) -> Optional[dict]:
    """Where this run's checkpoints are (pipeline.checkpoints.home), the newest that counts and the evidence that
    vouched for it, for the summary. `fetched` only when the fetch brought them here (`fetched`: what the fetch stage
    brought, or a fetch stage that ended ok) and they are here; `local` only when the folder here holds fetched
    files; on a filesystem and not fetched: how to get them later. None when the job never started: there are none
    (until #36 a run stopped during setup named runs/<id>/checkpoints, where nothing was ever fetched)."""
    home = ck.home(rec.id, rec.fetch, mount=rec.ck_filesystem)
    if home is None or not rec.run_id:
        return None
    newest = rec.checkpoint or {}
    st = rec.stages.get("fetch")
    here = (project or Path.cwd()) / home.local
    has = _holds_files(here)
    brought = home.name in (fetched or {}) or (st is not None and bool(st.ok))
    doc = {**home.to_json(), "local": home.local if has else None, "newest": ck.where(newest),
           "step": newest.get("step"), "fetched": bool(home.name in rec.fetch and brought and has),
           "evidence": list(newest.get("evidence") or []) if newest else None,
           "evidence_said": ck.said(newest.get("evidence"), ck.book(project)) if newest.get("evidence") else None,
           "warnings": list(newest.get("warnings") or [])}
    if home.filesystem and not doc["fetched"]:
        doc["get_later"] = ck.get_later(home, rec.file_systems[0], (rec.instance or {}).get("type") or
                                        rec.instance_type)
    return doc


def render_summary(out, rec: pl.Record, fetched: dict, now: float) -> dict:
    """The closing table: time and money per stage (and per instance, when one was replaced), where the checkpoints
    are, the environment snapshot."""
    rows = pl.summary(rec, now)
    total = pl.spend(rec, now)
    insts = pl.instances(rec, now)
    env = Path("runs") / rec.run_id / "environment" if rec.run_id else None
    doc = {"run": rec.id, "profile": rec.profile, "outcome": rec.outcome, "job": rec.job_state, "run_id": rec.run_id,
           "stages": rows, "instances": insts, "total_cost": round(total, 4), "fetched": fetched,
           "environment": str(env) if env and env.is_dir() else None, "overhead": pl.overhead(rec),
           "stop_reason": rec.stop_reason, "recoveries": len(rec.attempts), "resumed_from": rec.resume_from,
           "checkpoint": ck.where(rec.checkpoint), "checkpoints": checkpoints_doc(rec, fetched, Path.cwd()),
           "ttl_s": rec.ttl_s,
           "ttl_deadline_at": (datetime.fromtimestamp(rec.ttl_deadline).astimezone().isoformat(timespec="seconds")
                               if rec.ttl_deadline else None),
           "prep": prepplan.summary_doc(rec.prep, now),
           "ending": rec.ending,  # what the job died of (jobs/endings.py), None when it succeeded
           "warnings": list(dict.fromkeys(out.warnings)),  # every warning said on stderr, once each
           "plan": rec.plan}
    if out.json_mode:
        from .. import jsonvocab

        out.emit_json(jsonvocab.run(doc))  # docs/json.md's names; the caller reads `doc` under the runner's own
        return doc
    from ..jobs.watchtext import ending_lines, ending_title

    out.print(f"gpuops run {rec.id}: {rec.outcome}" + (f" (job {rec.job_state}" + (
        f": {ending_title(rec.ending)})" if rec.ending else ")") if rec.job_state else ""))

    for line in ending_lines(rec.ending, indent="    "):  # what it died of, the evidence and the fix
        out.print("  " + line)
    many = len([i for i in insts if i.get("role") != "prep"]) > 1
    for r in rows:
        mark = "ok" if r["ok"] else ("--" if r["ok"] is None else "FAILED")
        label = (f"#{r['instance']} " if many and r["instance"] else "") + r["label"]
        out.print(f"  {label:<32} {r['seconds']:>8.1f} s  ${r['cost']:>8.4f}  {mark}"
                  + (f"  {r['detail']}" if r["detail"] else ""))
    if many or rec.prep:
        for i in insts:
            if not many and i.get("role") != "prep":
                continue
            head = (f"instance #{i['instance']}" if i.get("role") != "prep" else "preparation's instance") + \
                f" {', '.join(i['ids']) or '?'}"
            when = f"{_hms(i['started'])}-{_hms(i['ended_at']) if i['ended_at'] else 'now'}" if i["started"] else ""
            out.print(f"  {head:<32} {i['seconds']:>8.1f} s  ${i['cost']:>8.4f}  {i['type'] or ''}"
                      f"{', ' + i['region'] if i['region'] else ''} {when}: {i['ended']}")
    out.print(f"  {'total':<32} {sum(r['seconds'] for r in rows):>8.1f} s  ${total:>8.4f}")
    if rec.max_cost is not None:
        from .money import covers

        out.print(f"  --max-cost ${rec.max_cost:.2f}: ${total:.4f} spent; {covers(rec.max_cost)}")
    for name, where in fetched.items():
        out.print(f"  {name}: {where} (verified)")
    for line in prepplan.summary_lines(doc["prep"]):
        out.print("  " + line)
    if doc["checkpoints"]:
        c = doc["checkpoints"]
        if c["filesystem"]:
            out.print(f"  checkpoints of this run: {c['filesystem']} on filesystem {rec.file_systems[0]}"
                      + (f", fetched into {c['local']}" if c["fetched"] else
                         f", not fetched ({'the fetch failed' if c['name'] in rec.fetch else 'no --fetch'}; they "
                         f"are intact there); to get them here later: {c['get_later']}")
                      + _resumable(c))
        elif c["local"]:
            out.print(f"  checkpoints of this run: {c['local']} here" + ("" if c["fetched"] else " (those fetched "
                      "while it trained; the final fetch did not bring the rest)") + f" (on the instance: "
                      f"{c['remote']})" + _resumable(c))
        else:
            out.print(f"  checkpoints of this run: not fetched (on the instance: {c['remote']})" + _resumable(c))
        for w in c["warnings"]:
            out.print(f"  warning: {w}")
    if doc["environment"]:
        out.print(f"  environment snapshot: {doc['environment']}")
    return doc
