"""The dashboard's views as data: pure functions over what `gpuops ls` (cloud.decisions.ls_rows), the run registry
(runs/, runs/pipelines/) and the watch stream (jobs.watch: its events and its Dashboard model) already produce.
Nothing here talks to a host, the API or the page: hub.py feeds it, app.py serves what it returns as JSON.

- instance_rows: the account's instances with their filesystems, marked "billing, unwatched" when no run follows them;
- run_rows: the project's runs (a row per host of a fleet) and its `gpuops run` pipelines;
- RunFeed: one run's live page: GPU series on a shared time axis (laid out by `layout` so a 64-host fleet stays
  readable), the log's tail, loss and throughput points, training signals as marks. Every change is a journal entry
  with a sequence number: each viewer reads what it has not seen, so one stream feeds any number of tabs.
"""
from __future__ import annotations

import math
import re
from collections import deque
from typing import Iterable, Optional

from ..jobs.watch import classify

HISTORY_S = 3600.0  # the GPU charts cover the last hour
BUCKET_S = 2.0  # one chart row per 2 s (the watch stream's default sample interval)
LOG_LINES = 200  # the log tail a page shows
JOURNAL = 4000  # entries a slow viewer may lag behind before it is sent a fresh snapshot
MAX_POINTS = 3000  # loss / throughput points kept (older ones are thinned, never the newest)
PER_GPU_MAX = 8  # more GPUs than this: a line per host (mean over its GPUs)
PER_HOST_MAX = 8  # more hosts than this: the fleet's min, mean and max across hosts
METRICS = ("util", "mem", "power", "temp")
LIVE_STATUSES = ("booting", "active", "unhealthy")  # billing
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


# -- instances ----------------------------------------------------------------------------------------------------
def watched_instances(instances_by_profile: dict[str, list[str]], running_profiles: Iterable[str],
                      pipelines: Iterable[dict]) -> set[str]:
    """Instance ids some run follows: those of a profile with a run running (its registry or its live stream), and
    the instances of a `gpuops run` pipeline still going (its own process watches them)."""
    ids: set[str] = set()
    for name in running_profiles:
        ids.update(instances_by_profile.get(name) or [])
    for p in pipelines:
        if p.get("outcome") == "running":
            ids.update(p.get("instance_ids") or [])
    return ids


def instance_rows(ls_rows: list[dict], file_systems: dict[str, list[str]], watched: set[str]) -> list[dict]:
    """ls_rows (decisions.ls_rows) with each instance's filesystems and whether it bills with no run following it."""
    out = []
    for r in ls_rows:
        iid = r.get("id")
        billing = r.get("status") in LIVE_STATUSES
        follows = bool(iid) and (iid in watched)
        out.append({"id": iid, "name": r.get("profile"), "type": r.get("type"), "region": r.get("region"),
                    "status": r.get("status"), "uptime_s": r.get("uptime_s"), "price_per_hour": r.get("price_per_hour"),
                    "cost_so_far": r.get("cost_so_far"), "ttl_left_s": r.get("ttl_left_s"),
                    "idle_left_s": r.get("idle_left_s"), "managed": bool(r.get("managed")),
                    "file_systems": list(file_systems.get(iid) or []) if iid else [],
                    "unwatched": billing and not follows, "flags": list(r.get("flags") or []),
                    "expired": bool(r.get("expired"))})
    out.sort(key=lambda x: (not x["unwatched"], x["status"] not in LIVE_STATUSES, str(x["name"] or ""), str(x["id"])))
    return out


def instances_by_profile(profiles: dict[str, dict]) -> dict[str, list[str]]:
    """Managed profiles' `cloud:` blocks -> profile name -> the instance ids it names (every node of a fleet)."""
    out = {}
    for name, cloud in profiles.items():
        if not isinstance(cloud, dict) or cloud.get("state", "active") != "active":
            continue
        ids = [n.get("instance_id") for n in cloud.get("nodes") or [] if isinstance(n, dict)]
        out[name] = [i for i in ids or [cloud.get("instance_id")] if i]
    return out


# -- runs ---------------------------------------------------------------------------------------------------------
def run_rows(metas: list[dict], states: dict[str, dict], now: float, prices: dict[str, Optional[float]],
             live: Optional[dict[str, dict]] = None) -> list[dict]:
    """The project's runs, newest first, a row per host of a fleet (`host`: its rank; None for a one-host run).
    states: run id -> the last known state (runs/<id>/state.json, a RunInfo's to_json); live: run id -> what a
    stream following it knows now ({state, elapsed, hosts: rank -> mean utilisation}), which wins."""
    live = live or {}
    rows = []
    for m in metas:
        rid = m["run_id"]
        st = states.get(rid) or {}
        lv = live.get(rid) or {}
        state = lv.get("state") or st.get("state") or "unknown"
        started = st.get("started") or m.get("started_ts")
        elapsed = lv.get("elapsed")
        if elapsed is None and started:
            elapsed = max(0.0, (st.get("ended") or now) - started)
        nodes = m.get("nodes") or []
        n = max(1, len(nodes))
        price = prices.get(m.get("profile") or "")
        cost = round(elapsed / 3600.0 * price * n, 2) if elapsed is not None and price is not None else None
        base = {"run_id": rid, "profile": m.get("profile"), "script": m.get("script"), "state": state,
                "exit_code": st.get("exit_code"), "started": started, "elapsed_s": elapsed, "cost": cost,
                "progress": lv.get("progress"), "signals": lv.get("signals") or [], "followed": bool(lv)}
        if len(nodes) < 2:
            rows.append({**base, "host": None, "address": m.get("host"), "util": (lv.get("hosts") or {}).get(0)})
            continue
        for rank, node in enumerate(nodes):
            rows.append({**base, "host": rank, "address": node.get("host"),
                         "util": (lv.get("hosts") or {}).get(rank)})
    return rows


def pipeline_rows(records: list, now: float) -> list[dict]:
    """`gpuops run` records (pipeline.stages.Record): stage, elapsed, cost, last checkpoint, outcome."""
    from ..pipeline import stages as ps

    out = []
    for rec in records:
        current = next((name for name in ps.STAGES + ("recover",)
                        if (s := rec.stages.get(name)) is not None and s.started is not None and s.ended is None), None)
        stage = current or (None if rec.outcome != ps.RUNNING else ps.next_stage(rec))
        ck = rec.checkpoint or {}
        out.append({"id": rec.id, "profile": rec.profile, "run_id": rec.run_id, "outcome": rec.outcome,
                    "stage": stage, "stage_label": ps.LABELS.get(stage or "", stage), "nodes": rec.nodes,
                    "elapsed_s": max(0.0, now - rec.created) if rec.created else None,
                    "cost": round(ps.spend(rec, now), 2),
                    "checkpoint": (ck.get("local") or ck.get("name")) if ck else None,
                    "checkpoint_step": ck.get("step") if ck else None,
                    "instance_ids": list((rec.instance or {}).get("ids") or []),
                    "job_state": rec.job_state, "stop_reason": rec.stop_reason, "lost": rec.lost})
    return out


# -- a run's live page ----------------------------------------------------------------------------------------------
def layout(gpus: Iterable[tuple[int, int]]) -> dict:
    """How a run's GPU charts are drawn for these (host rank, GPU index) pairs: a line per GPU while there are few,
    a line per host (the mean of its GPUs) for a small fleet, the fleet's min / mean / max across hosts beyond that.
    Every GPU's latest values stay in the grid (`grid_rows`) whatever the mode. Returns {mode, series: [labels]}."""
    keys = sorted(set(gpus))
    hosts = sorted({h for h, _ in keys})
    if len(keys) <= PER_GPU_MAX:
        one_host = len(hosts) <= 1
        return {"mode": "gpu", "series": [f"GPU {i}" if one_host else f"host {h} GPU {i}" for h, i in keys],
                "keys": keys}
    if len(hosts) <= PER_HOST_MAX:
        return {"mode": "host", "series": [f"host {h} (mean of {sum(1 for k in keys if k[0] == h)} GPUs)" for h in hosts],
                "keys": hosts}
    return {"mode": "fleet", "series": [f"min of {len(hosts)} hosts", "mean", "max"], "keys": ["min", "mean", "max"]}


def _metric(g: dict, metric: str) -> Optional[float]:
    if metric == "mem":
        return 100.0 * (g.get("mem_used") or 0) / g["mem_total"] if g.get("mem_total") else None
    v = g.get({"util": "util", "power": "power", "temp": "temp"}[metric])
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def _mean(vals: list) -> Optional[float]:
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def chart_values(latest: dict[tuple[int, int], dict], lay: dict, metric: str) -> list[Optional[float]]:
    """One chart row: the metric for each series of the layout, from each GPU's latest sample."""
    if lay["mode"] == "gpu":
        return [_metric(latest[k], metric) if k in latest else None for k in lay["keys"]]
    per_host: dict[int, list] = {}
    for (h, _), g in latest.items():
        per_host.setdefault(h, []).append(_metric(g, metric))
    means = {h: _mean(v) for h, v in per_host.items()}
    if lay["mode"] == "host":
        return [means.get(h) for h in lay["keys"]]
    vals = [v for v in means.values() if v is not None]
    return [min(vals), sum(vals) / len(vals), max(vals)] if vals else [None, None, None]


def grid_rows(latest: dict[tuple[int, int], dict]) -> list[dict]:
    """Every host's GPUs at their latest sample, a row per host in rank order: the fleet at a glance."""
    rows: dict[int, list] = {}
    for (h, i), g in sorted(latest.items()):
        util = _metric(g, "util")
        rows.setdefault(h, []).append({"gpu": i, "util": util, "mem": _metric(g, "mem"), "temp": _metric(g, "temp"),
                                       "power": _metric(g, "power"),
                                       "level": "idle" if not util else "low" if util < 40 else "busy"})
    return [{"host": h, "gpus": cells, "util": _mean([c["util"] for c in cells])} for h, cells in sorted(rows.items())]


def safe_line(text: str) -> str:
    """A log line as a page shows it: a progress bar's last carriage-return state, control characters as \\xNN (the
    page puts it in as text, never as markup)."""
    if "\r" in text:
        parts = [p for p in text.split("\r") if p]
        text = parts[-1] if parts else ""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)[:2000]


class RunFeed:
    """One run's page, fed by the watch stream's events (after jobs.watch.Dashboard.apply, which adds the parsed
    signals and progress to them). `record(ev, now)` appends what changed to the journal; `since(seq)` is what a
    viewer has not seen (None: it fell too far behind, send `snapshot()`)."""

    def __init__(self, run_id: str, *, profile: Optional[str] = None, hosts: int = 1, bucket_s: float = BUCKET_S,
                 history_s: float = HISTORY_S, redact=lambda s: s):
        self.run_id, self.profile, self.hosts = run_id, profile, hosts
        self.bucket_s = bucket_s
        self.redact = redact
        self.latest: dict[tuple[int, int], dict] = {}
        self.lay = layout([])
        self.rows: deque = deque(maxlen=int(history_s / bucket_s) + 1)  # [t, {metric: [values]}]
        self.log: deque = deque(maxlen=LOG_LINES)
        self.loss: deque = deque(maxlen=MAX_POINTS)  # [t, step, loss]
        self.rate: deque = deque(maxlen=MAX_POINTS)  # [t, value]
        self.rate_unit = ""
        self.marks: list[dict] = []
        self.state = "connecting"
        self.state_text = ""
        self.link = "connecting"
        self.progress: Optional[dict] = None
        self.gpu_error: Optional[str] = None
        self.ended = False
        self.seq = 0
        self.journal: deque = deque(maxlen=JOURNAL)
        self._seen = 0  # GPUs the layout was made for
        self._pending: Optional[float] = None  # the time of the newest sample not yet in a chart row
        self._grid_at = float("-inf")

    # -- in ---------------------------------------------------------------------------------------------------------
    def _emit(self, entry: dict) -> None:
        self.seq += 1
        entry["seq"] = self.seq
        self.journal.append(entry)

    def record(self, ev: dict, now: float, dash=None) -> None:
        t = ev.get("type")
        if t == "sample":
            g = ev["gpu"]
            key = (ev.get("host", 0), g["index"])
            self.latest[key] = g
            if len(self.latest) != self._seen:
                self._relayout()
            if self._pending is not None and math.floor(now / self.bucket_s) != math.floor(self._pending / self.bucket_s):
                self.flush()  # the bucket before ends: its row as it last stood
            self._pending = now
            self.gpu_error = None
        elif t == "gpu_error":
            self.gpu_error = self.redact(ev.get("message") or "")
            self._emit({"k": "gpu_error", "text": self.gpu_error})
        elif t == "log":
            text = self.redact(safe_line(ev.get("line") or ""))
            kind = classify(text)
            self.log.append([text, kind])
            self._emit({"k": "log", "text": text, "kind": kind})
        elif t == "state":
            self.state = ev["info"].state
        elif t == "end":
            self.ended = True
        elif t in ("reconnecting", "connected", "connecting", "lost"):
            self.link = ({"reconnecting": f"reconnecting (attempt {ev.get('attempt')}): {self.redact(str(ev.get('error')))}",
                          "lost": f"not followed: {self.redact(str(ev.get('error')))}"}).get(t, "live")
            self._emit({"k": "link", "text": self.link})
        for sig in ev.get("signals") or []:
            mark = {"t": now, "id": sig["id"], "title": sig["title"], "hint": sig.get("hint", "")}
            self.marks.append(mark)
            self._emit({"k": "mark", **mark})
        p = ev.get("progress")
        if p:
            self.progress = {k: v for k, v in p.items() if k not in ("losses", "sparkline")}
            if p.get("loss") is not None and math.isfinite(p["loss"]):
                self.loss.append([now, p.get("step"), p["loss"]])
                self._emit({"k": "loss", "p": self.loss[-1]})
            if p.get("throughput") is not None:
                self.rate.append([now, p["throughput"]])
                self.rate_unit = p.get("throughput_unit") or ""
                self._emit({"k": "rate", "p": self.rate[-1], "unit": self.rate_unit})
            self._emit({"k": "progress", "progress": self.progress})
        if dash is not None and t in ("state", "sample", "end"):
            self.state = dash.state
            text = dash.state_text()  # state, elapsed and cost: changes with each sample
            if text != self.state_text:
                self.state_text = text
                self._emit({"k": "state", "state": self.state, "text": text})
        if t == "sample" and self.link != "live":
            self.link = "live"
            self._emit({"k": "link", "text": "live"})

    def _relayout(self) -> None:
        self._seen = len(self.latest)
        lay = layout(self.latest)
        if lay["series"] != self.lay["series"]:
            self.lay = lay
            self.rows.clear()  # a row's values follow the series: a new layout starts its charts afresh
            self._emit({"k": "layout", "series": lay["series"], "mode": lay["mode"]})

    def flush(self) -> None:
        """The chart row (and the fleet's grid, at most once a second) for the samples recorded since the last flush:
        computed when a viewer reads, or when a 2 s bucket ends, not at every sample of every host."""
        now, self._pending = self._pending, None
        if now is None:
            return
        b = math.floor(now / self.bucket_s) * self.bucket_s
        vals = {m: [None if v is None else round(v, 1) for v in chart_values(self.latest, self.lay, m)]
                for m in METRICS}
        if self.rows and self.rows[-1][0] == b:
            self.rows[-1][1] = vals
        else:
            self.rows.append([b, vals])
        self._emit({"k": "row", "t": b, "v": vals})
        if len(self.latest) > 1 and now - self._grid_at >= 1.0:
            self._grid_at = now
            self._emit({"k": "grid", "grid": grid_rows(self.latest)})

    # -- out ----------------------------------------------------------------------------------------------------------
    def since(self, seq: int) -> Optional[list[dict]]:
        self.flush()
        if seq >= self.seq:
            return []
        if not self.journal or self.journal[0]["seq"] > seq + 1:
            return None
        return [e for e in self.journal if e["seq"] > seq]

    def snapshot(self) -> dict:
        self.flush()
        return {"run_id": self.run_id, "profile": self.profile, "seq": self.seq, "state": self.state,
                "state_text": self.state_text, "link": self.link, "series": self.lay["series"], "mode": self.lay["mode"],
                "rows": [[t, v] for t, v in self.rows], "grid": grid_rows(self.latest), "log": list(self.log),
                "loss": list(self.loss), "rate": list(self.rate), "rate_unit": self.rate_unit, "marks": list(self.marks),
                "progress": self.progress, "gpu_error": self.gpu_error, "ended": self.ended}

    def summary(self) -> dict:
        """What the runs table shows of a followed run: its state, progress, signals, each host's mean utilisation."""
        self.flush()
        return {"state": self.state if self.state != "connecting" else None, "progress": self.progress,
                "signals": [m["title"] for m in self.marks],
                "hosts": {r["host"]: r["util"] for r in grid_rows(self.latest)}}
