"""docs/json.md's vocabulary applied at the edge of a --json document (pure): times as ISO 8601 with a zone
(`*_at`), durations in seconds (`*_s`), sizes with their unit (`*_mib`). The internal rows keep their names (the
plain and rich renderings and the dashboard read them); only what a script reads is renamed here."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Optional


def iso(epoch: Optional[float]) -> Optional[str]:
    """An epoch (seconds) as ISO 8601 in UTC with its zone; None stays None."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(float(epoch), tz=timezone.utc).isoformat(timespec="seconds")


def gpu(g: dict) -> dict:
    """A GPU sample: `mem_used`/`mem_total` (MiB, as nvidia-smi reports them) as `mem_used_mib`/`mem_total_mib`."""
    names = {"mem_used": "mem_used_mib", "mem_total": "mem_total_mib"}
    return {names.get(k, k): v for k, v in g.items()}


def run_row(r: dict) -> dict:
    """A status row: `started` (epoch) as `started_at` (ISO), `elapsed` as `elapsed_s`."""
    doc = {}
    for k, v in r.items():
        if k == "started":
            doc["started_at"] = iso(v)
        elif k == "elapsed":
            doc["elapsed_s"] = v
        else:
            doc[k] = v
    return doc


def status(doc: dict) -> dict:
    """`gpuops status --json`: one host's runs and GPUs, or a fleet's hosts each with theirs."""
    out = dict(doc)
    if "runs" in doc:
        out["runs"] = [run_row(r) for r in doc.get("runs") or []]
    if "gpus" in doc:
        out["gpus"] = [gpu(g) for g in doc.get("gpus") or []]
    if "hosts" in doc:
        out["hosts"] = [status(h) for h in doc["hosts"]]
    return out
