"""Why a Slurm job waits, in words (pure): Slurm's reason code -> a sentence and, where the user can do something, the
fix, from playbooks/slurm_reasons.yaml (knowledge as data: a row per code, a row per family of limits), with Slurm's
estimated start when it has one. The codes themselves are parsed by slurm/states.py (split_reason)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from .states import QueueJob, epoch_text, expand_hostlist


# -- a pending job's reason in words (playbooks/slurm_reasons.yaml) -----------------------------------------------
@dataclass
class PendingWords:
    code: Optional[str]  # Slurm's code, as it said it
    words: str  # what it means, in a sentence
    fix: Optional[str] = None
    source: str = ""
    nodes: list = field(default_factory=list)  # UnavailableNodes: expanded
    estimated_start: Optional[str] = None  # Slurm's estimate, when it has one
    wait: bool = True  # waiting is enough (Resources, Priority): nothing for the user to change

    def line(self) -> str:
        text = f"pending ({self.code}): {self.words}" if self.code else f"pending: {self.words}"
        if self.estimated_start:
            text += f"; Slurm's estimated start: {self.estimated_start}"
        return text


def load_reasons(project_dir=None) -> dict:
    """playbooks/slurm_reasons.yaml (the project's copy wins over the shipped one)."""
    from ..knowledge import load_playbook

    return load_playbook("slurm_reasons", project_dir)


def _fill(text: Optional[str], values: dict) -> Optional[str]:
    if text is None:
        return None
    text = re.sub(r"\{(\w+)\}", lambda m: str(values[m.group(1)]) if values.get(m.group(1)) not in (None, "")
                  else "", text)
    return re.sub(r"  +", " ", text).replace(" )", ")").replace(" ,", ",").strip()


def _norm(code: str) -> str:
    return re.sub(r"[\s_]+", "", code or "").lower()


def reason_row(code: Optional[str], table: dict) -> Optional[dict]:
    """The table's row for a reason code: its `code` (Slurm's spelling; scontrol's underscores and the case aside),
    else the first row whose `match` (a regular expression over the code) holds."""
    if not code:
        return None
    rows = table.get("reasons") or []
    for row in rows:
        if row.get("code") and _norm(row["code"]) == _norm(code):
            return row
    for row in rows:
        if row.get("match") and re.search(row["match"], code):
            return row
    return None


# Slurm plans no further than its scheduling window: a pending job it cannot place gets a start a year away
# (22.05 on the local cluster: StartTime = submit + 365 days), which is no estimate at all
FAR_S = 180 * 86400


def estimated_start(job: QueueJob, now: Optional[float] = None) -> Optional[str]:
    """Slurm's expected start of a pending job as it printed it (squeue's %S, scontrol's StartTime) or, from its
    JSON, in UTC; None without one, or when it lies past FAR_S from `now` (epoch), Slurm's placeholder."""
    epoch = job.start_epoch
    if epoch is None and job.start:
        import time as _t

        try:
            epoch = _t.mktime(_t.strptime(job.start, "%Y-%m-%dT%H:%M:%S"))  # the cluster's time read as ours: hours off
        except ValueError:
            epoch = None
    if now is not None and epoch is not None and epoch - now > FAR_S:
        return None
    return job.start or (epoch_text(job.start_epoch) if job.start_epoch else None)


def explain_pending(job: QueueJob, table: dict, *, partition: Optional[str] = None, qos: Optional[str] = None,
                    account: Optional[str] = None, now: Optional[float] = None) -> PendingWords:
    """A pending job's reason in words, with its fix where there is one, and Slurm's estimated start (see
    estimated_start; `now` is this moment's epoch, to leave out Slurm's far-away placeholder)."""
    start = estimated_start(job, now)
    nodes = []
    if job.reason_detail and "UnavailableNodes:" in job.reason_detail:
        nodes = expand_hostlist(job.reason_detail.split("UnavailableNodes:", 1)[1].strip())
    values = {"code": job.reason, "detail": job.reason_detail, "nodes": ",".join(nodes) or None,
              "partition": job.partition or partition, "qos": qos, "account": account,
              "description": job.description}
    code = job.reason or "None"
    if code in ("JobHeldUser", "JobHeldAdmin") and job.description and "launch failed" in job.description:
        code = job.description  # `launch failed requeued held` says more than the hold it led to
    row = reason_row(code, table)
    if row is None:
        fallback = (table.get("unknown") or {})
        return PendingWords(code, _fill(fallback.get("words", "Slurm's reason: {code}"), {**values, "code": code})
                            or str(code), _fill(fallback.get("fix"), values), fallback.get("source", ""), nodes,
                            start, wait=False)
    words = _fill(row.get("words"), values) or ""
    if nodes and "{nodes}" not in (row.get("words") or ""):
        words += f" (unavailable: {', '.join(nodes)})"
    return PendingWords(code, words, _fill(row.get("fix"), values), row.get("source", ""), nodes, start,
                        wait=bool(row.get("wait", False)))
