"""`gpuops run`'s closing summary: the record rendered (rich, plain lines or --json) with what was fetched, the
checkpoints and where they are."""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Optional

from . import checkpoints as ck, stages as pl


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


def checkpoints_doc(rec: pl.Record) -> Optional[dict]:
    """Where this run's checkpoints are (pipeline.checkpoints.home) and the newest that counts, for the summary;
    on a filesystem and not fetched: how to get them later."""
    home = ck.home(rec.id, rec.fetch, mount=rec.ck_filesystem)
    if home is None:
        return None
    newest = rec.checkpoint or {}
    doc = {**home.to_json(), "newest": ck.where(newest), "step": newest.get("step"), "fetched": home.name in rec.fetch,
           "evidence": list(newest.get("evidence") or []) if newest else None,
           "evidence_said": ck.said(newest.get("evidence"), ck.book()) if newest.get("evidence") else None}
    if home.filesystem and home.name not in rec.fetch:
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
           "checkpoint": (rec.checkpoint or {}).get("local"), "checkpoints": checkpoints_doc(rec), "ttl_s": rec.ttl_s,
           "ttl_deadline_at": (datetime.fromtimestamp(rec.ttl_deadline).astimezone().isoformat(timespec="seconds")
                               if rec.ttl_deadline else None),
           "warnings": list(dict.fromkeys(out.warnings))}  # every warning said on stderr, once each
    if out.json_mode:
        from .. import jsonvocab

        out.emit_json(jsonvocab.run(doc))  # docs/json.md's names; the caller reads `doc` under the runner's own
        return doc
    out.print(f"gpuops run {rec.id}: {rec.outcome}" + (f" (job {rec.job_state})" if rec.job_state else ""))
    many = len(insts) > 1
    for r in rows:
        mark = "ok" if r["ok"] else ("--" if r["ok"] is None else "FAILED")
        label = (f"#{r['instance']} " if many else "") + r["label"]
        out.print(f"  {label:<32} {r['seconds']:>8.1f} s  ${r['cost']:>8.4f}  {mark}"
                  + (f"  {r['detail']}" if r["detail"] else ""))
    if many:
        for i in insts:
            head = f"instance #{i['instance']} {', '.join(i['ids']) or '?'}"
            when = f"{_hms(i['started'])}-{_hms(i['ended_at']) if i['ended_at'] else 'now'}" if i["started"] else ""
            out.print(f"  {head:<32} {i['seconds']:>8.1f} s  ${i['cost']:>8.4f}  {i['type'] or ''}"
                      f"{', ' + i['region'] if i['region'] else ''} {when}: {i['ended']}")
    out.print(f"  {'total':<32} {sum(r['seconds'] for r in rows):>8.1f} s  ${total:>8.4f}")
    for name, where in fetched.items():
        out.print(f"  {name}: {where} (verified)")
    if doc["checkpoints"]:
        c = doc["checkpoints"]
        if c["filesystem"]:
            out.print(f"  checkpoints of this run: {c['filesystem']} on filesystem {rec.file_systems[0]}"
                      + (f", fetched into {c['local']}" if c["fetched"] else ", not fetched (nothing of them crossed "
                         f"this machine); to get them here later: {c['get_later']}")
                      + _resumable(c))
        else:
            out.print(f"  checkpoints of this run: {c['local']} here (on the instance: {c['remote']})" + _resumable(c))
    if doc["environment"]:
        out.print(f"  environment snapshot: {doc['environment']}")
    return doc
