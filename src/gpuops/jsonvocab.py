"""docs/json.md's vocabulary applied at the edge of a --json document (pure): times as ISO 8601 with a zone
(`*_at`), durations in seconds (`*_s`), sizes with their unit (`*_mib`). The internal rows keep their names (the
plain and rich renderings and the dashboard read them); only what a script reads is renamed here."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Optional


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
