"""A run's page as data (pure): the layout of its GPU charts (a line per GPU, per host, or the fleet's min / mean /
max), the live feed a follower records (RunFeed: a journal with sequence numbers every viewer reads from its own
cursor), and the history kept in the project's metrics database (history.store) merged under it, so a page shows the
run from its first step whoever followed it when.
"""
from __future__ import annotations

import math
import re
from collections import deque
from typing import Iterable, Optional

from ..jobs.watch import classify

HISTORY_S = 3600.0  # the feed's own GPU rows cover the last hour (older ones come from the database)
BUCKET_S = 2.0  # one chart row per 2 s (the watch stream's default sample interval)
LOG_LINES = 200  # the log tail a page shows
JOURNAL = 4000  # entries a slow viewer may lag behind before it is sent a fresh snapshot
MAX_POINTS = 3000  # loss / throughput points the feed holds (the database holds them all)
PER_GPU_MAX = 8  # more GPUs than this: a line per host (mean over its GPUs)
PER_HOST_MAX = 8  # more hosts than this: the fleet's min, mean and max across hosts
METRICS = ("util", "mem", "power", "temp")
LINE_MAX = 2000  # characters of a log line a page shows (cut after secrets are scrubbed, never before)
LAG_S = 4.0  # the stream's heartbeat this late: the page says how far behind it is, not "live"
LAG_BYTES = 512 * 1024  # or this much of the log written and not yet read (a log faster than it is read)
CHECKING = "connected: checking that the stream keeps up"  # until a heartbeat shows it does: never "live" before
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
ENDED = ("succeeded", "failed", "stopped", "lost")


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
    v = g.get(metric)
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


def row_values(latest: dict, lay: dict) -> dict:
    return {m: [None if v is None else round(v, 1) for v in chart_values(latest, lay, m)] for m in METRICS}


def mem_totals(latest: dict, lay: dict) -> list[Optional[float]]:
    """Each series' GPU memory in MiB (a host's or the fleet's: its largest GPU's), for the page's GiB."""
    if lay["mode"] == "gpu":
        return [(latest.get(k) or {}).get("mem_total") for k in lay["keys"]]
    tot = [g.get("mem_total") for g in latest.values() if g.get("mem_total")]
    return [max(tot) if tot else None] * len(lay["series"])


def grid_rows(latest: dict[tuple[int, int], dict]) -> list[dict]:
    """Every host's GPUs at their latest sample, a row per host in rank order: the fleet at a glance."""
    rows: dict[int, list] = {}
    for (h, i), g in sorted(latest.items()):
        util = _metric(g, "util")
        rows.setdefault(h, []).append({"gpu": i, "util": util, "mem": _metric(g, "mem"), "temp": _metric(g, "temp"),
                                       "power": _metric(g, "power"),
                                       "level": "idle" if not util else "low" if util < 40 else "busy"})
    return [{"host": h, "gpus": cells, "util": _mean([c["util"] for c in cells])} for h, cells in sorted(rows.items())]


def finite(obj):
    """`obj` with every NaN or infinite float made None: JSON has no NaN (a browser's JSON.parse refuses it), and a
    training that goes wrong prints `loss nan`."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def safe_line(text: str, redact=lambda s: s) -> str:
    """A log line as a page shows it: secrets scrubbed FIRST (a key cut in two would escape the scrubber), then a
    progress bar's last carriage-return state, control characters as \\xNN (the page puts it in as text, never as
    markup), cut to LINE_MAX characters."""
    text = redact(text)
    if "\r" in text:
        parts = [p for p in text.split("\r") if p]
        text = parts[-1] if parts else ""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)[:LINE_MAX]


def js_number(v) -> object:
    """A float as the page can say it: NaN and infinities as JavaScript spells them (JSON has none)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return v


# -- the database's history under the feed ----------------------------------------------------------------------------
def history_rows(db: dict, lay: dict, bucket_s: float = BUCKET_S) -> list[list]:
    """The database's GPU rows (history.store.Reader.gpu_rows) as chart rows of this layout: a row per bucket; when
    buckets are wider than a sample (a long run thinned), two: its lows then its highs (no peak thinned away)."""
    buckets: dict[float, dict] = {}
    for t, h, g, _name, total, vals in db.get("rows") or []:
        buckets.setdefault(t, {})[(h, g)] = (total, vals)
    wide = db.get("width", bucket_s) > bucket_s * 1.01
    out = []
    for t in sorted(buckets):
        for side in ((0, 1) if wide else (1,)):
            latest = {k: {"util": v["util"][side], "mem_used": v["mem"][side], "mem_total": total,
                          "power": v["power"][side], "temp": v["temp"][side]}
                      for k, (total, v) in buckets[t].items()}
            out.append([t + (db["width"] / 2 if wide and side else 0), row_values(latest, lay)])
    return out


def merge_rows(old: list[list], live: list[list]) -> list[list]:
    """The database's rows before the feed's first one, then the feed's."""
    if not live:
        return list(old)
    first = live[0][0]
    return [r for r in old if r[0] < first] + [list(r) for r in live]


def merge_points(old: list[list], live: Iterable[list]) -> list[list]:
    """Points by step ([step, value, t]): the database's, with the feed's newer ones over them (one per step)."""
    by_step = {p[0]: p for p in old}
    for t, step, value in live:
        if step is not None:
            by_step[step] = [step, value, t if t is not None else (by_step.get(step) or [None, None, None])[2]]
    return [by_step[k] for k in sorted(by_step)]


class RunFeed:
    """One run's page, fed by the watch stream's events (after jobs.watch.Dashboard.apply, which adds the parsed
    signals and progress to them). `record(ev, now)` appends what changed to the journal; `since(seq)` is what a
    viewer has not seen (None: it fell too far behind, send `snapshot()`)."""

    def __init__(self, run_id: str, *, profile: Optional[str] = None, hosts: int = 1, bucket_s: float = BUCKET_S,
                 history_s: float = HISTORY_S, redact=lambda s: s, recorded: Optional[dict] = None):
        self.run_id, self.profile, self.hosts = run_id, profile, hosts
        self.bucket_s = bucket_s
        self.redact = redact
        self.latest: dict[tuple[int, int], dict] = {}
        self.lay = layout([])
        self.rows: deque = deque(maxlen=int(history_s / bucket_s) + 1)  # [t, {metric: [values]}]
        self.log: deque = deque(maxlen=LOG_LINES)
        self.loss: deque = deque(maxlen=MAX_POINTS)  # [t or None (read back), step, loss or None (NaN)]
        self.rate: deque = deque(maxlen=MAX_POINTS)  # [t or None, step, value]
        self.rate_unit = ""
        self.marks: list[dict] = []
        self.state = "connecting"
        self.exit_code: Optional[int] = None
        self.detail = ""  # elapsed and cost: not a live region (it changes at every sample)
        self.link = "connecting"
        self.progress: Optional[dict] = None
        self.gpu_error: Optional[str] = None
        self.ended = False
        self.seen_at: Optional[float] = None  # the last time the host was heard from
        self.unreachable = False  # its host does not answer (reconnecting, or given up on)
        self.seq = 0
        self.journal: deque = deque(maxlen=JOURNAL)
        self._seen = 0  # GPUs the layout was made for
        self._pending: Optional[float] = None  # the time of the newest sample not yet in a chart row
        self._grid_at = float("-inf")
        self._skew: Optional[float] = None  # the smallest (our clock - the host's heartbeat) seen: clock offset
        self._x = 0
        self._offset: Optional[int] = None  # the log's bytes delivered so far (its last line's end)
        if recorded and recorded.get("state") in ENDED:  # the record says it ended: nothing live to wait for
            self.state, self.exit_code, self.ended, self.link = recorded["state"], recorded.get("exit_code"), True, "ended"

    # -- in ---------------------------------------------------------------------------------------------------------
    def _emit(self, entry: dict) -> None:
        self.seq += 1
        entry["seq"] = self.seq
        self.journal.append(entry)

    def _set_link(self, text: str) -> None:
        if text != self.link:
            self.link = text
            self._emit({"k": "link", "text": text})

    def _heartbeat(self, at: float, now: float, size: Optional[int]) -> None:
        """The only thing that says "live": a heartbeat judged in time. The first one is the baseline of the host's
        clock (how late it is cannot be told from it), so "live" waits for the next one (5 s on) that is in time."""
        first = self._skew is None
        skew = now - at
        self._skew = skew if self._skew is None else min(self._skew, skew)
        lag = skew - self._skew
        unread = size - self._offset if size is not None and self._offset is not None else 0
        if unread > LAG_BYTES:
            self._set_link(f"behind: {unread / 1e6:.1f} MB of the log not read yet (it comes faster than it is read)")
        elif lag > LAG_S:
            self._set_link(f"behind by {lag:.0f} s (the host's stream arrives late)")
        elif first:
            self._set_link(CHECKING)
        else:
            self._set_link("live")

    def record(self, ev: dict, now: float, dash=None) -> None:
        t = ev.get("type")
        if t in ("sample", "heartbeat", "log", "state"):
            self.seen_at = now
        if t == "sample":
            if self.ended:
                return  # the run has ended: a GPU sample now is another job's
            g = ev["gpu"]
            key = (ev.get("host", 0), g["index"])
            self.latest[key] = g
            if len(self.latest) != self._seen:
                self._relayout()
            if self._pending is not None and math.floor(now / self.bucket_s) != math.floor(self._pending / self.bucket_s):
                self.flush()  # the bucket before ends: its row as it last stood
            self._pending = now
            self.gpu_error = None
        elif t == "heartbeat" and isinstance(ev.get("at"), (int, float)) and "host" not in ev:  # the run's stream:
            # another host's clock (a fleet's sample streams) is no measure of this stream's lag
            self._heartbeat(float(ev["at"]), now, ev.get("size") if isinstance(ev.get("size"), int) else None)
        elif t == "gpu_error":
            self.gpu_error = safe_line(ev.get("message") or "", self.redact)
            self._emit({"k": "gpu_error", "text": self.gpu_error})
        elif t == "log":
            if isinstance(ev.get("offset"), int):
                self._offset = ev["offset"]
            text = safe_line(ev.get("line") or "", self.redact)
            kind = ev["kind"] if "kind" in ev else classify(text)  # watch's Dashboard said it of the line
            self.log.append([text, kind])
            self._emit({"k": "log", "text": text, "kind": kind})
        elif t == "end":
            self.ended = True
        elif t in ("reconnecting", "connected", "connecting", "lost"):
            was, self.unreachable = self.unreachable, t == "reconnecting" or bool(t == "lost" and ev.get("unreachable"))
            if was != self.unreachable:  # the page's state says it: not "running" while its host does not answer
                self._emit({"k": "reach", "unreachable": self.unreachable, "seen_at": self.seen_at})
            self._set_link({"reconnecting": f"reconnecting (attempt {ev.get('attempt')}): "
                                            f"{safe_line(str(ev.get('error')), self.redact)}",
                            "lost": f"not followed: {safe_line(str(ev.get('error')), self.redact)}",
                            "connecting": "connecting"}.get(t, CHECKING))
        for sig in ev.get("signals") or []:
            mark = {"t": None if ev.get("replay") else now, "id": sig["id"], "title": sig["title"],
                    "hint": sig.get("hint", "")}
            self.marks.append(mark)
            self._emit({"k": "mark", **mark})
        if ev.get("progress"):
            self._progress(ev["progress"], None if ev.get("replay") else now)
        if dash is not None and t in ("state", "sample", "end"):
            self._state(dash)
        if t == "end":  # the follower has written the run's record (exit code, cause): the page reads it now
            self._emit({"k": "recorded"})

    def note(self, text: str) -> None:
        """A line of the dashboard's own in the page's log (shown apart from the job's lines)."""
        text = safe_line(text, self.redact)
        self.log.append([text, "note"])
        self._emit({"k": "log", "text": text, "kind": "note"})

    def _progress(self, p: dict, when: Optional[float]) -> None:
        prev = self.progress or {}
        self.progress = {k: js_number(v) for k, v in p.items() if k not in ("losses", "sparkline")}
        step = p.get("step")
        x = step if step is not None else self._x + 1
        self._x = x if isinstance(x, int) else self._x
        loss, rate = p.get("loss"), p.get("throughput")
        if loss is not None and (step, loss) != (prev.get("step"), prev.get("loss")):
            value = loss if math.isfinite(loss) else None
            self._point(self.loss, [when, x, value], "loss")
        if rate is not None and (step, rate) != (prev.get("step"), prev.get("throughput")):
            self.rate_unit = p.get("throughput_unit") or ""
            self._point(self.rate, [when, x, rate], "rate", unit=self.rate_unit)
        self._emit({"k": "progress", "progress": self.progress})

    def _point(self, series: deque, p: list, key: str, **extra) -> None:
        if series and series[-1][1] == p[1]:
            series[-1] = p  # a step printed twice (a trainer's line and a logger's dict): its last value
        else:
            series.append(p)
        self._emit({"k": key, "p": p, **extra})

    def _state(self, dash) -> None:
        state = dash.state
        code = dash.info.exit_code if dash.info is not None else None
        if state in ENDED:
            self.ended = True
        el, cost = dash.elapsed(), dash.cost()
        from ..jobs.plan import fmt_duration

        detail = f"elapsed {fmt_duration(el)}" + (f", cost ${cost:.2f}" if cost is not None else "")
        if (state, code) != (self.state, self.exit_code):
            self.state, self.exit_code = state, code
            self._emit({"k": "state", "state": state, "exit_code": code})
        if detail != self.detail:
            self.detail = detail
            self._emit({"k": "detail", "text": detail})

    def _relayout(self) -> None:
        self._seen = len(self.latest)
        lay = layout(self.latest)
        if lay["series"] != self.lay["series"]:
            self.lay = lay
            self.rows.clear()  # a row's values follow the series: a new layout starts its charts afresh
            self._emit({"k": "layout", "series": lay["series"], "mode": lay["mode"],
                        "mem_total": mem_totals(self.latest, lay)})

    def flush(self) -> None:
        """The chart row (and the fleet's grid, at most once a second) for the samples recorded since the last flush:
        computed when a viewer reads, or when a 2 s bucket ends, not at every sample of every host."""
        now, self._pending = self._pending, None
        if now is None:
            return
        b = math.floor(now / self.bucket_s) * self.bucket_s
        vals = row_values(self.latest, self.lay)
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
                "exit_code": self.exit_code, "detail": self.detail, "link": self.link, "series": self.lay["series"],
                "mode": self.lay["mode"], "keys": [list(k) if isinstance(k, tuple) else k for k in self.lay["keys"]],
                "mem_total": mem_totals(self.latest, self.lay), "rows": [[t, v] for t, v in self.rows],
                "grid": grid_rows(self.latest), "log": list(self.log), "loss": list(self.loss),
                "rate": list(self.rate), "rate_unit": self.rate_unit, "marks": list(self.marks),
                "progress": self.progress, "gpu_error": self.gpu_error, "ended": self.ended, "seen_at": self.seen_at,
                "unreachable": self.unreachable}

    def summary(self) -> dict:
        """What the runs table shows of a followed run: its state, progress, signals, each host's mean utilisation,
        whether its host answers (reachable) and when it was last heard from."""
        self.flush()
        reachable = self.seen_at is not None and (self.link in ("live", CHECKING, "connecting")
                                                  or self.link.startswith("behind"))  # heard from, still followed
        return {"state": self.state if self.state != "connecting" else None, "progress": self.progress,
                "signals": [m["title"] for m in self.marks], "reachable": reachable, "seen_at": self.seen_at,
                "unreachable": self.unreachable,
                "link": self.link, "hosts": {r["host"]: r["util"] for r in grid_rows(self.latest)} if reachable else {}}
