"""The cost guard as every command sees it, with no network call: a managed profile's cost so far, time left before
its TTL and idle limit, and the warnings printed by each command that touches it. Light imports only (no httpx)."""
from __future__ import annotations

import time
from typing import Iterable, Optional

from . import decisions as d


def _epoch(dt) -> Optional[float]:
    return dt.timestamp() if dt is not None else None


def _records(prof) -> dict:
    """The ledger's records of the profile's instances, by instance id ({} when unreadable: `ls` reports that)."""
    from .ledger import Ledger

    try:
        ids = set(prof.cloud.instance_ids)
        return {r.instance_id: r for r in Ledger().records() if r.instance_id in ids}
    except Exception:  # an unreadable ledger must not break `status`; `ls` reports it loudly
        return {}


def billing_nodes(prof, records: dict) -> list[str]:
    """The profile's instances still billing as far as this machine knows: a fleet node whose record is closed (ended
    by `down <id>`, `reap`, or seen terminated or preempted by `ls`/`reap`) no longer counts."""
    return [i for i in prof.cloud.instance_ids if i not in records or records[i].open]


def summary(prof, now: float | None = None) -> Optional[dict]:
    """{instance_id, price_per_hour, uptime_s, cost_so_far, ttl_left_s, idle_left_s, expired, reasons} or None."""
    c = getattr(prof, "cloud", None)
    if c is None:
        return None
    now = time.time() if now is None else now
    records = _records(prof)
    rec = records.get(c.instance_id)
    launched = _epoch(c.launched_at)
    g = d.guard(now, ttl_deadline=_epoch(c.ttl_deadline), idle_limit_s=c.idle_limit_s,
                last_active=rec.last_active if rec else None, launched_at=launched)
    alive = c.state == "active"
    billing = billing_nodes(prof, records) or c.instance_ids
    n = len(billing) if alive else len(c.instance_ids)  # a fleet bills every node still running
    price = prof.price_per_hour * n if prof.price_per_hour is not None else None
    return {"instance_id": billing[0] if alive else c.instance_id, "instances": n, "state": c.state,
            "price_per_hour": price,
            "uptime_s": (now - launched) if launched and alive else None,
            "cost_so_far": d.cost_so_far(price, launched, now) if alive else None,
            "ttl_left_s": g.ttl_left if alive else None, "idle_left_s": g.idle_left if alive else None,
            "expired": alive and g.expired, "reasons": g.reasons() if alive else []}


def line(s: dict) -> str:
    n = s.get("instances") or 1
    parts = [f"instance {s['instance_id']}" if n == 1 else f"{n} instances (host #0: {s['instance_id']})"]
    if s["cost_so_far"] is not None:
        parts.append(f"cost so far ${s['cost_so_far']:.2f} (${s['price_per_hour'] or 0:.2f}/h for "
                     f"{d.format_duration(s['uptime_s'])})")
    if s["ttl_left_s"] is not None:
        parts.append(f"TTL left {d.format_duration(s['ttl_left_s'])}")
    if s["idle_left_s"] is not None:
        parts.append(f"idle limit in {d.format_duration(s['idle_left_s'])}")
    return ", ".join(parts)


def warnings(prof, now: float | None = None) -> list[str]:
    s = summary(prof, now)
    if s is None:
        return []
    if s["state"] == "gone":
        what = (f"its instance {s['instance_id']} was" if s.get("instances", 1) == 1 else
                f"its {s['instances']} instances were")
        return [f"profile '{prof.name}' is marked gone: {what} terminated (gpuops up {prof.name} launches a new one)"]
    if s["expired"]:
        return [f"profile '{prof.name}': instance {s['instance_id']} is past its limit ({'; '.join(s['reasons'])}) and "
                f"still billing ${s['price_per_hour'] or 0:.2f}/h: gpuops down {prof.name}, or gpuops reap"]
    return []


def note_sample(prof, run_running: bool, utilisations: Iterable[float], now: float | None = None) -> None:
    """Record activity seen by a sample gpuops took anyway (status, watch): the idle clock restarts."""
    c = getattr(prof, "cloud", None)
    if c is None or not d.busy(run_running, list(utilisations)):
        return
    from .ledger import Ledger

    try:
        ledger = Ledger()
        for iid in c.instance_ids:  # a fleet's job runs on every node
            ledger.note_activity(iid, time.time() if now is None else now)
    except Exception:
        pass


class ActivityNoter:
    """A long watch's samples, noted as activity at most every `every_s` (the idle clock of `--idle` restarts while
    the job runs, not only when the watch started), so `gpuops ls` does not count down the idle limit of a busy
    instance. One ledger write a minute at most."""

    def __init__(self, prof, every_s: float = 60.0, clock=time.monotonic):
        self.prof, self.every_s, self.clock = prof, every_s, clock
        self.last = clock()

    def seen(self, run_running: bool, utilisations: Iterable[float]) -> bool:
        if getattr(self.prof, "cloud", None) is None or self.clock() - self.last < self.every_s:
            return False
        self.last = self.clock()
        note_sample(self.prof, run_running, utilisations)
        return True
