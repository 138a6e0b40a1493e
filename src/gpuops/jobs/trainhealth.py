"""While it trains (issue #35), the instance's side: the GPUs' health read from the samples watch's stream and
`status` already take (the health fields and the kernel log's Xid lines: verify's FAIL rules, clocks slowed down by
heat or power) and the disk the job writes running low (df and df -i of the project folder), as training signals:
each raised once, with its hint and source (playbooks/signals.yaml: gpu_health, gpu_throttled, disk_low). Pure."""
from __future__ import annotations

from typing import Optional

from .endfacts import parse_df

# The health fields a running job's stream samples: what verify's FAIL rules read (verify/checks_health.health_failures)
# and the clocks' slowdown reasons (throttling, #35). An older driver refuses a field it does not know (the whole query
# fails): the next set, without it, is tried (gpu_recovery_action is R550+, clocks_event_reasons.* R535+).
_BASE = "index,ecc.errors.uncorrected.volatile.total,remapped_rows.pending,remapped_rows.failure,retired_pages.pending"
_SLOW = ("clocks_event_reasons.hw_slowdown,clocks_event_reasons.hw_thermal_slowdown,"
         "clocks_event_reasons.sw_thermal_slowdown,clocks_event_reasons.hw_power_brake_slowdown")
HEALTH_FIELD_SETS = (f"{_BASE},gpu_recovery_action,{_SLOW}", f"{_BASE},{_SLOW}", _BASE,
                     "index,ecc.errors.uncorrected.volatile.total")

# gpuops_health: the health fields (HG, the first field set the driver accepts) and the kernel log's Xid lines when
# they change (HX), written to stderr; watch's stream runs it with its heartbeat, status once
HEALTH_FN = ("HF=; lastx=\n"
             "gpuops_health() {\n"
             f"  for f in ${{HF:-{' '.join(HEALTH_FIELD_SETS)}}}; do\n"
             "    o=$(nvidia-smi --query-gpu=$f --format=csv,noheader,nounits 2>/dev/null) || continue\n"
             "    HF=$f; printf '%s\\n' \"$o\" | sed \"s/^/HG $f /\" >&2; break\n"
             "  done\n"
             "  x=$({ dmesg 2>/dev/null || journalctl -k -b -q --no-pager 2>/dev/null; } | grep -F 'NVRM: Xid' "
             "| tail -n 50)\n"
             "  if [ \"$x\" != \"$lastx\" ]; then printf '%s\\n' \"$x\" | sed 's/^/HX /' >&2; lastx=$x; fi\n"
             "}\n")


def disk_command(folder_shell: str) -> str:
    """Shell: `DK` (df -Pk) and `DI` (df -Pi) rows of the folder (already quoted), bounded by `timeout`."""
    return (f"T=; command -v timeout >/dev/null 2>&1 && T='timeout 5'; d={folder_shell}; [ -d \"$d\" ] || d=\"$HOME\"; "
            "$T df -Pk \"$d\" 2>/dev/null | sed '1d; s/^/DK /'; $T df -Pi \"$d\" 2>/dev/null | sed '1d; s/^/DI /'")


FATAL_SMI_FAILURES = ("gpu-lost",)  # nvidia-smi failures (knowledge.yaml ids) that end a GPU's usefulness


class HealthWatch:
    """The stream's health lines (HG: the health fields, HX: the kernel log's Xid lines) and nvidia-smi's own failure
    on the GPU line, judged by verify's rules (verify.checks_health.health_failures; playbooks/xid.yaml, knowledge.yaml):
    apply(ev) returns the facts that end a GPU's usefulness not returned before, a line each. Judged since boot, as
    verify judges: a host that passed verify had none."""

    def __init__(self, xid_table: Optional[dict] = None, smi_failures: Optional[list] = None):
        self.xid_table = xid_table
        self.smi_failures = smi_failures or []
        self.health: dict = {}  # GPU index -> GpuHealth (the newest sample)
        self.xids: dict = {}  # kernel log line -> parsed Xid
        self.said: set = set()

    def apply(self, ev: dict) -> list[str]:
        from ..verify.checks_health import health_failures
        from ..verify.facts import classify_smi_failure, parse_health, parse_xids

        t = ev.get("type")
        found = []
        if t == "health":
            for h in parse_health(ev["line"], ev["fields"]):
                self.health[h.index] = h
        elif t == "xid":
            for x in parse_xids([ev["line"]]):
                self.xids[x["line"]] = x
        elif t == "gpu_error":
            st = classify_smi_failure(None, ev["message"], self.smi_failures)
            if st.failure in FATAL_SMI_FAILURES:
                found.append(f"nvidia-smi: {st.title}: {st.message}")
        else:
            return []
        if t != "gpu_error":
            for r in health_failures(list(self.health.values()), list(self.xids.values()), xid_table=self.xid_table):
                found.append(f"{r.title}: {r.measured}" + (f" ({r.detail})" if r.detail and r.id == "gpu.xid" else ""))
        new = [f for f in found if f not in self.said]
        self.said.update(new)
        return new


def _gb(kib: int) -> str:
    return f"{kib / (1 << 20):.1f} GB"


class TrainingHealth:
    """Events in (health, xid, gpu_error, disk), signals out (watch's signal dicts: id, title, hint, source, line)."""

    def __init__(self, spec: dict, xid_table: Optional[dict] = None, smi_failures: Optional[list] = None):
        self.spec = spec
        self.watch = HealthWatch(xid_table, smi_failures)
        self.raised: set = set()

    def _raise(self, sid: str, key: str, title: str, line: Optional[str] = None) -> list[dict]:
        if (sid, key) in self.raised:
            return []
        self.raised.add((sid, key))
        row = self.spec.get(sid.replace("-", "_")) or {}
        return [{"id": sid, "title": title, "hint": row.get("hint", ""), "source": row.get("source", ""),
                 "line": (line or "")[:300] or None}]

    def apply(self, ev: dict) -> list[dict]:
        t = ev.get("type")
        if t in ("health", "xid", "gpu_error"):
            new = []
            for finding in self.watch.apply(ev):
                new += self._raise("gpu-health", finding, f"GPU failing: {finding}", ev.get("line"))
            if t == "health":
                new += self._throttled()
            return new
        if t == "disk":
            return self._disk(ev)
        return []

    def _throttled(self) -> list[dict]:
        from ..verify.checks_health import SLOWDOWNS

        new = []
        for h in self.watch.health.values():
            active = [label for f, label in SLOWDOWNS.items() if h.get(f) is True]
            if active:
                new += self._raise("gpu-throttled", f"gpu{h.index}",
                                   f"GPU {h.index} throttled: {', '.join(active)}")
        return new

    def _disk(self, ev: dict) -> list[dict]:
        row = parse_df(ev["row"], ev["inodes"])
        low = self.spec.get("disk_low") or {}
        if row is None or not low or row.size <= 0 or row.use_pct is None:
            return []
        if row.inodes:
            if row.use_pct >= float(low.get("inodes_percent", 90)):
                return self._raise("disk-low", f"inodes {row.mount}", f"inodes running low on {row.mount}: "
                                   f"{row.use_pct}% used ({row.avail} left)", ev["row"])
            return []
        if row.use_pct >= float(low.get("percent", 90)) or row.avail < float(low.get("free_gb", 20)) * (1 << 20):
            return self._raise("disk-low", f"disk {row.mount}", f"disk running low on {row.mount}: {row.use_pct}% "
                               f"used, {_gb(row.avail)} free of {_gb(row.size)}", ev["row"])
        return []
