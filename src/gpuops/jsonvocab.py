"""docs/json.md's vocabulary applied at the edge of a --json document (pure): times as ISO 8601 with a zone
(`*_at`), durations in seconds (`*_s`), sizes with their unit (`*_mib`). The internal rows keep their names (the
plain and rich renderings and the dashboard read them); only what a script reads is renamed here."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Optional


def json_objects(lines) -> list[dict]:
    """The JSON objects of a JSON-lines text's lines (an append-only ledger: a torn or foreign line is skipped)."""
    import json

    out = []
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def iso(epoch: Optional[float], timespec: str = "seconds") -> Optional[str]:
    """An epoch (seconds) as ISO 8601 in UTC with its zone; None stays None."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(float(epoch), tz=timezone.utc).isoformat(timespec=timespec)


RENAMED = {"mem_used": "mem_used_mib", "mem_total": "mem_total_mib", "elapsed": "elapsed_s",
           "seconds_left": "remaining_s", "delay": "delay_s"}
EPOCHS = {"started": "started_at", "ended": "ended_at"}


def renamed(d: dict) -> dict:
    """One object's fields in the vocabulary: epochs (`started`, `ended`) as ISO `*_at`, durations as `*_s`, GPU
    memory (MiB, as nvidia-smi reports it) as `*_mib`; a run's `progress` and a sample's `processes` likewise."""
    doc = {}
    for k, v in d.items():
        if k in EPOCHS:
            doc[EPOCHS[k]] = iso(v)
        elif k == "progress" and isinstance(v, dict):
            doc[k] = renamed(v)
        elif k == "processes" and isinstance(v, list):
            doc[k] = [renamed(x) if isinstance(x, dict) else x for x in v]
        else:
            doc[RENAMED.get(k, k)] = v
    return doc


def status(doc: dict) -> dict:
    """`gpuops status --json`: one host's runs and GPUs, or a fleet's hosts each with theirs."""
    out = dict(doc)
    if "runs" in doc:
        out["runs"] = [renamed(r) for r in doc.get("runs") or []]
    if "gpus" in doc:
        out["gpus"] = [renamed(g) for g in doc.get("gpus") or []]
    if "hosts" in doc:
        out["hosts"] = [status(h) for h in doc["hosts"]]
    return out


UP = {"ip": "host", "profile_file": "profile_path", "ttl_deadline": "ttl_deadline_at"}


def up(doc: dict) -> dict:
    """`gpuops up --json`: the instance's address as `host` (was `ip`), the profile's file as `profile_path` (was
    `profile_file`), the TTL's end as `ttl_deadline_at`; a fleet's nodes likewise (`private_ip` stays: Lambda's own
    name for the address inside the region). The pipeline reads the summary up() returns under its own names."""
    out = {UP.get(k, k): v for k, v in doc.items()}
    if isinstance(doc.get("nodes"), list):
        out["nodes"] = [{UP.get(k, k): v for k, v in n.items()} for n in doc["nodes"]]
    return out


def ls(doc: dict, shown: list) -> dict:
    """`gpuops ls --json`: each instance's address as `host` (was `ip`); what needs the user (was `alerts`) is the
    document's `warnings`, with every other warning the command showed (`shown`: a ledger passed over...)."""
    out = {k: v for k, v in doc.items() if k != "alerts"}
    out["instances"] = [{("host" if k == "ip" else k): v for k, v in r.items()} for r in doc.get("instances") or []]
    alerts = list(doc.get("alerts") or [])
    out["warnings"] = alerts + [w for w in shown if w not in alerts]
    return out


RUN_INSTANCE = {"seconds": "duration_s"}


def run(doc: dict) -> dict:
    """`gpuops run --json`, the closing summary: a stage's and an instance's billed time as `duration_s` (was
    `seconds`), an instance's start and end as ISO `started_at`/`ended_at` (were epochs; `ended` stays: how it
    ended, in words). The runner and `--notify` read the summary under its own names."""
    out = dict(doc)
    out["stages"] = [{("duration_s" if k == "seconds" else k): v for k, v in s.items()} for s in doc.get("stages") or []]
    rows = []
    for r in doc.get("instances") or []:
        row = {}
        for k, v in r.items():
            if k == "started":
                row["started_at"] = iso(v, "milliseconds")
            elif k == "ended_at":
                row["ended_at"] = iso(v, "milliseconds")
            else:
                row[RUN_INSTANCE.get(k, k)] = v
        rows.append(row)
    out["instances"] = rows
    return out
