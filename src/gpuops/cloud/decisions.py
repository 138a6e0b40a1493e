"""Pure decisions over the API's records, the ledger and the clock (no network, no files): tested without a server.

Which region next, how long to wait, is this instance past its TTL or idle limit, what has it cost so far, what
`gpuops ls` shows and what `gpuops reap` terminates.
"""
from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from ..errors import UsageError

ONE_GPU_READY_S = 20 * 60
EIGHT_GPU_READY_S = 35 * 60
CAPACITY_RECHECK_S = (30.0, 60.0)
LAUNCH_INTERVAL_S = 12.0  # Lambda: one launch request per 12 s
MIN_POLL_S = 5.0  # readiness polling, no more often than this against the real API
IDLE_UTIL_PCT = 5.0
TAG_LAUNCH, TAG_PROFILE = "gpuops-launch-id", "gpuops-profile"
GONE_STATUSES = ("terminated",)
ENDING_STATUSES = ("terminating", "terminated")
DEAD_STATUSES = ("terminated", "preempted")

_DUR = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])")


def parse_duration(text: str) -> float:
    """'90m', '2h', '1h30m', '45s', '1d', or plain seconds -> seconds."""
    t = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return float(t)
    parts = _DUR.findall(t)
    if not parts or _DUR.sub("", t).strip():
        raise UsageError(f"not a duration: {text!r}", hint="write e.g. 45s, 30m, 2h, 1h30m or 1d")
    mult = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    return sum(float(n) * mult[u] for n, u in parts)


def format_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    neg = seconds < 0
    s = int(abs(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    text = f"{d}d{h}h" if d else f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"
    return ("-" if neg else "") + text


def launch_order(listed: Iterable[str], requested: Iterable[str] = ()) -> list[str]:
    """Regions to try: the requested ones that are listed with capacity, in the user's order; all listed ones (the
    API's order) when none was requested. Regions not listed are skipped: a launch there spends the 12 s budget on a
    certain refusal."""
    listed = list(dict.fromkeys(listed))
    requested = list(dict.fromkeys(requested))
    if not requested:
        return listed
    return [r for r in requested if r in listed]


def next_region(order: list[str], cold: set[str]) -> Optional[str]:
    return next((r for r in order if r not in cold), None)


def capacity_recheck_delay(rng: Callable[[], float], bounds: tuple[float, float] = CAPACITY_RECHECK_S) -> float:
    lo, hi = bounds
    return lo + (hi - lo) * rng()


def readiness_deadline(gpus: int) -> float:
    return EIGHT_GPU_READY_S if gpus >= 8 else ONE_GPU_READY_S


def cost_so_far(price_per_hour: Optional[float], since: Optional[float], now: float) -> Optional[float]:
    if price_per_hour is None or since is None:
        return None
    return round(max(0.0, now - since) / 3600.0 * price_per_hour, 2)


@dataclass(frozen=True)
class Guard:
    """Where an instance stands against its TTL and idle limit (seconds; None when no limit)."""

    ttl_left: Optional[float]
    idle_left: Optional[float]

    @property
    def ttl_passed(self) -> bool:
        return self.ttl_left is not None and self.ttl_left <= 0

    @property
    def idle_passed(self) -> bool:
        return self.idle_left is not None and self.idle_left <= 0

    @property
    def expired(self) -> bool:
        return self.ttl_passed or self.idle_passed

    def reasons(self) -> list[str]:
        out = []
        if self.ttl_passed:
            out.append(f"TTL passed {format_duration(-self.ttl_left)} ago")
        if self.idle_passed:
            out.append(f"idle limit passed {format_duration(-self.idle_left)} ago")
        return out


def guard(now: float, *, ttl_deadline: Optional[float], idle_limit_s: Optional[float],
          last_active: Optional[float], launched_at: Optional[float]) -> Guard:
    """TTL: a fixed deadline. Idle: no gpuops run and GPU utilisation under 5 % since `last_active` (the last time gpuops
    saw work; the launch itself counts as activity)."""
    ttl_left = None if ttl_deadline is None else ttl_deadline - now
    idle_left = None
    if idle_limit_s is not None:
        since = max(x for x in (last_active, launched_at, 0.0) if x is not None)
        idle_left = since + idle_limit_s - now
    return Guard(ttl_left, idle_left)


def busy(run_running: bool, utilisations: Iterable[float]) -> bool:
    """One sample: is the instance doing work (a gpuops run running, or any GPU at or above 5 %)?"""
    return run_running or any(u >= IDLE_UTIL_PCT for u in utilisations)


# -- keys ------------------------------------------------------------------------------------------------------------
def key_blob(public_key_line: str) -> tuple[str, str]:
    parts = public_key_line.split()
    if len(parts) < 2:
        raise UsageError("not an OpenSSH public key line (expected 'TYPE BASE64 [comment]')")
    return parts[0], parts[1]


def same_key(a: str, b: str) -> bool:
    """Same key material (type and base64), whatever the comments."""
    try:
        return key_blob(a) == key_blob(b)
    except UsageError:
        return False


def fingerprint(public_key_line: str) -> str:
    _, blob = key_blob(public_key_line)
    digest = hashlib.sha256(base64.b64decode(blob)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def ssh_key_name(public_key_line: str) -> str:
    """gpuops-<first 12 characters of the SHA256 fingerprint> ('+' and '/' written '-' and '_' for a plain name)."""
    fp = fingerprint(public_key_line)[len("SHA256:"):]
    return "gpuops-" + fp[:12].replace("+", "-").replace("/", "_")


def cloud_config(host_private: str, host_public: str) -> str:
    """cloud-init user_data that replaces the instance's host keys with ours, so the first connection is checked."""
    indented = "\n".join("    " + line for line in host_private.strip().splitlines())
    return ("#cloud-config\n"
            "ssh_deletekeys: true\n"
            "ssh_genkeytypes: []\n"
            "ssh_keys:\n"
            "  ed25519_private: |\n"
            f"{indented}\n"
            f"  ed25519_public: {host_public.strip()}\n")


def launch_tags(launch_id: str, profile: str) -> dict[str, str]:
    return {TAG_LAUNCH: launch_id, TAG_PROFILE: profile[:128]}


def adopt(instances: Iterable, launch_id: str) -> list:
    """The instances a launch created, by tag (never by name), not counting terminated ones."""
    return [i for i in instances if i.tags.get(TAG_LAUNCH) == launch_id and i.status not in GONE_STATUSES]


# -- ls and reap -----------------------------------------------------------------------------------------------------
def ls_rows(instances: list, records: list, profiles: dict[str, dict], now: float) -> tuple[list[dict], list[str]]:
    """Every instance on the account (managed ones marked) plus ledger records whose instance the API does not show
    (a launch in flight or lost): rows, and the loud lines.

    `profiles`: profile name -> its `cloud:` block (for the profiles that exist locally)."""
    by_instance = {r.instance_id: r for r in records if r.instance_id}
    rows, alerts = [], []
    seen = set()
    for inst in instances:
        rec = by_instance.get(inst.id)
        tagged = inst.tags.get(TAG_LAUNCH)
        if rec is None and tagged:
            rec = next((r for r in records if r.launch_id == tagged), None)
        managed = rec is not None or bool(tagged)
        profile = rec.profile if rec else inst.tags.get(TAG_PROFILE)
        price = inst.type.price_per_hour if inst.type else (rec.price_cents_per_hour / 100 if rec else None)
        since = (rec.launched_at or rec.created_at) if rec else None
        g = guard(now, ttl_deadline=rec.ttl_deadline, idle_limit_s=rec.idle_limit_s, last_active=rec.last_active,
                  launched_at=since) if rec else Guard(None, None)
        live = inst.status not in GONE_STATUSES
        ending = inst.status in ENDING_STATUSES  # terminate requested: nothing left to warn about
        row = {"id": inst.id, "managed": managed, "profile": profile, "status": inst.status, "ip": inst.ip,
               "type": inst.type_name, "region": inst.region, "price_per_hour": price,
               "uptime_s": (now - since) if since and live else None,
               "cost_so_far": cost_so_far(price, since, now) if live else None,
               "ttl_left_s": g.ttl_left if live else None, "idle_left_s": g.idle_left if live else None,
               "expired": not ending and live and g.expired, "reasons": g.reasons() if live and not ending else [],
               "launch_id": rec.launch_id if rec else tagged, "node": rec.node if rec else None}
        seen.add(inst.id)
        rows.append(row)
        if managed and live and not ending:
            if profile and profile not in profiles:
                alerts.append(f"instance {inst.id} ({inst.type_name}, ${price or 0:.2f}/h) is managed by gpuops but has "
                              f"no profile '{profile}' here: gpuops reap or terminate it")
            if g.expired:
                alerts.append(f"instance {inst.id} (profile {profile}) is past its limit: {'; '.join(g.reasons())} — "
                              f"`gpuops down {profile}` or `gpuops reap`")
    for rec in records:
        if not rec.open or (rec.instance_id and rec.instance_id in seen):
            continue
        status = "launching?" if rec.state == "launching" else "unseen"
        rows.append({"id": rec.instance_id, "managed": True, "profile": rec.profile, "status": status, "ip": None,
                     "type": rec.instance_type, "region": rec.region, "price_per_hour": rec.price_cents_per_hour / 100,
                     "uptime_s": None, "cost_so_far": None, "ttl_left_s": None, "idle_left_s": None, "expired": False,
                     "reasons": [], "launch_id": rec.launch_id, "node": rec.node})
        alerts.append(f"launch {rec.launch_id} (profile {rec.profile}, {rec.instance_type}) is recorded as "
                      f"{rec.state} but the API lists no such instance: it may still appear and bill; "
                      "run `gpuops ls` again, `gpuops reap` closes records the API confirms gone")
    return rows, alerts


def reap_candidates(rows: list[dict]) -> list[dict]:
    """Managed, alive, and past a limit."""
    return [r for r in rows if r["managed"] and r["id"] and r["expired"] and r["status"] not in ENDING_STATUSES]
