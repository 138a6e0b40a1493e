"""Training signals: a run that is "running" can be doing nothing. A pure model over the run's log lines and GPU
samples (patterns are data: playbooks/signals.yaml) that raises each signal ONCE with its hint, and reads the
progress (step, loss, total) from common trainer log formats: loss sparkline, steps per minute, time left and the
cost at the end. Used by `gpuops watch` (through watch.Dashboard) and `gpuops status` (over the log's tail)."""
from __future__ import annotations

import math
import re
import time
from collections import deque
from typing import Optional

SPARK = "▁▂▃▄▅▆▇█"
_NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf)"


def load_spec(project_dir=None) -> dict:
    """playbooks/signals.yaml (the project's copy wins over the shipped one)."""
    from ..knowledge import load_playbook

    return load_playbook("signals", project_dir)


def _rx(pattern: str, ignore_case: bool = False):
    from ..errors import UsageError

    try:
        return re.compile(pattern, re.I if ignore_case else 0)
    except re.error as exc:
        raise UsageError(f"playbooks/signals.yaml: /{pattern}/ is not a valid regular expression: {exc}") from None


def _float(text: str) -> Optional[float]:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def loss_sparkline(values) -> str:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    top = len(SPARK) - 1
    return "".join([SPARK[int((v - lo) / span * top + 0.5)] for v in vals])  # a list: per line in a flood of them


class SignalModel:
    """Feed it log lines (`line`) and GPU samples (`sample`) with their time; each returns the signals newly raised
    (dicts: id, title, hint, source, line). `progress(now)` is the parsed progress."""

    def __init__(self, spec: dict, *, started: Optional[float] = None, price_per_hour: Optional[float] = None,
                 total_steps: Optional[int] = None):
        self.started = started
        self.price = price_per_hour
        self.raised: dict[str, dict] = {}
        self.signals: list[dict] = []
        self._line_rules = []
        for s in spec.get("signals") or []:
            pats = s.get("match") or []
            pats = [pats] if isinstance(pats, str) else pats
            self._line_rules.append((s, [_rx(p, bool(s.get("ignore_case"))) for p in pats]))
        self.zero = spec.get("zero_loss") or {}
        self.idle = spec.get("gpu_idle") or {}
        prog = spec.get("progress") or {}
        self.loss_keys = list(prog.get("loss_keys") or ["loss"])
        self._progress = [(p, _rx(p["match"], bool(p.get("ignore_case")))) for p in prog.get("patterns") or []]
        self._total = [_rx(p, True) for p in prog.get("total_patterns") or []]
        self._rates = [(p, _rx(p["match"], bool(p.get("ignore_case")))) for p in prog.get("throughput_patterns") or []]
        self.throughput: Optional[tuple[float, str]] = None  # the last (value, unit) a line gave
        # progress state
        self.step: Optional[int] = None
        self.loss: Optional[float] = None
        self.total: Optional[int] = total_steps
        self.losses: deque = deque(maxlen=40)
        self.first: Optional[tuple[float, int]] = None  # (time, step) of the first parsed step
        self.last: Optional[tuple[float, int]] = None
        self.format: Optional[str] = None
        self._zero_run = 0
        # GPU idle state
        self._idle_since: Optional[float] = None
        self._gpu_used = False
        # while it trains (issue #35): throughput against the run's own median, utilisation over the whole run
        self.went_idle = spec.get("gpu_went_idle") or {}
        self.low = spec.get("gpu_low") or {}
        self.drop = spec.get("throughput_drop") or {}
        self._rates_seen: deque = deque(maxlen=max(5, int(self.drop.get("window", 20))))
        self._slow = 0  # readings in a row under the median / factor
        self._util_sum, self._util_n, self._util_first = 0.0, 0, None
        self._quiet_since: Optional[float] = None  # the GPU at 0 % since, after it worked
        self._working: set = set()  # the GPUs seen above 0 %

    # -- raising --------------------------------------------------------------------------------------------
    def _raise(self, sid: str, title: str, hint: str, source: str, line: Optional[str]) -> list[dict]:
        if sid in self.raised:
            return []
        sig = {"id": sid, "title": title, "hint": hint, "source": source, "line": (line or "")[:300] or None}
        self.raised[sid] = sig
        self.signals.append(sig)
        return [sig]

    # -- log lines ------------------------------------------------------------------------------------------
    def line(self, text: str, ts: float) -> list[dict]:
        if "\r" in text:  # a progress bar redrawn in place: its last state is the line
            text = next((part for part in reversed(text.split("\r")) if part.strip()), "")
        new: list[dict] = []
        for s, rxs in self._line_rules:
            if s["id"] not in self.raised and any(rx.search(text) for rx in rxs):
                new += self._raise(s["id"], s.get("title", s["id"]), s.get("hint", ""), s.get("source", ""), text)
        if self.total is None:
            for rx in self._total:
                m = rx.search(text)
                if m:
                    self.total = int(m.group("total").replace(",", ""))
                    break
        new += self._parse_throughput(text)
        got = self._parse_progress(text)
        if got is not None:
            step, loss, total = got
            new += self._advance(step, loss, total, ts, text)
        return new

    def _parse_progress(self, text: str) -> Optional[tuple[Optional[int], Optional[float], Optional[int]]]:
        for p, rx in self._progress:
            m = rx.search(text)
            if not m:
                continue
            g = m.groupdict()
            step = int(g["step"]) if g.get("step") else None
            loss = _float(g["loss"]) if g.get("loss") else None
            total = int(g["total"]) if g.get("total") else None
            if p.get("kv"):
                pairs = dict(re.findall(r"([\w/@.\-]+):(" + _NUM + r")(?=\s+-\s+|\s*$)", text[m.start():]))
                loss = next((_float(pairs[k]) for k in self.loss_keys if k in pairs), None)
            elif p.get("dict"):
                lm = re.search(r"['\"]loss['\"]\s*:\s*(" + _NUM + r")", text)
                sm = re.search(r"['\"](?:global_)?step['\"]\s*:\s*(\d+)", text)
                loss = _float(lm.group(1)) if lm else None
                step = int(sm.group(1)) if sm else (self.step or 0) + 1
            if step is None and loss is None:
                continue
            self.format = p.get("name")
            return step, loss, total
        return None

    def _parse_throughput(self, text: str) -> list[dict]:
        for p, rx in self._rates:
            m = rx.search(text)
            value = _float(m.group("value")) if m else None
            if value is not None:
                unit = str(p.get("unit") or "{unit}").format(unit=(m.groupdict().get("unit") or "").lower())
                self.throughput = (value, unit)
                return self._pace(value, unit, text)
        return []

    def _pace(self, value: float, unit: str, text: str) -> list[dict]:
        """A throughput reading against the run's own recent median (throughput_drop): readings in a row below
        median / factor raise the signal once, saying how far it fell."""
        if not self.drop or value is None or not math.isfinite(value):
            return []
        seen = sorted(self._rates_seen)
        median = seen[len(seen) // 2] if len(seen) >= 5 else None
        factor = float(self.drop.get("factor", 3))
        if median and value < median / factor:
            self._slow += 1
        else:
            self._slow = 0
            self._rates_seen.append(value)  # the pace it holds: slow readings never pull the median down
        if median and self._slow >= int(self.drop.get("readings", 3)):
            fold = median / value if value > 0 else float("inf")
            return self._raise("throughput-drop", f"throughput fell to {value:.3g} {unit} from this run's median "
                               f"{median:.3g} ({fold:.0f}x slower)" if math.isfinite(fold) else
                               f"throughput fell to 0 {unit} from this run's median {median:.3g}",
                               self.drop.get("hint", ""), self.drop.get("source", ""), text)
        return []

    def _advance(self, step, loss, total, ts, text) -> list[dict]:
        new: list[dict] = []
        if total:
            self.total = total
        if step is not None:
            self.step = step
            self.first = self.first or (ts, step)
            self.last = (ts, step)
        if loss is not None:
            self.loss = loss
            self.losses.append(loss)
            if loss == 0.0:
                self._zero_run += 1
                if self.zero and self._zero_run >= int(self.zero.get("steps", 3)):
                    new += self._raise("zero-loss", f"loss stuck at exactly 0.0000 for {self._zero_run} steps",
                                       self.zero.get("hint", ""), self.zero.get("source", ""), text)
            else:
                self._zero_run = 0
        return new

    # -- GPU samples ------------------------------------------------------------------------------------------
    def sample(self, gpu: dict, ts: float) -> list[dict]:
        """One GPU sample (watch.parse_gpu's dict). GPU idle: every sample 0 % for the first N minutes; after it
        worked: 0 % for N minutes (gpu_went_idle), or a low mean over the whole run (gpu_low)."""
        util = gpu.get("util")
        if util is None:
            return []
        if self._gpu_used or util > 0:
            return self._while_used(gpu.get("index", 0), util, ts)
        if not self.idle:
            return []
        if self._idle_since is None:
            self._idle_since = ts
        minutes = float(self.idle.get("minutes", 3))
        if ts - self._idle_since >= minutes * 60:
            return self._raise("gpu-idle", f"GPU utilisation 0 % for the first {minutes:g} minutes",
                               self.idle.get("hint", ""), self.idle.get("source", ""), None)
        return []

    def _while_used(self, index: int, util: float, ts: float) -> list[dict]:
        """Once a GPU has worked: the mean of the samples of the GPUs that work (gpu_low: a GPU the job does not
        use is not counted), and every GPU at 0 % for N minutes (gpu_went_idle)."""
        new: list[dict] = []
        self._gpu_used, self._idle_since = True, None
        if util > 0:
            self._working.add(index)
        if index in self._working:
            self._util_first = self._util_first if self._util_first is not None else ts
            self._util_sum, self._util_n = self._util_sum + util, self._util_n + 1
        minutes = float(self.idle.get("minutes", 3))
        if util > 0:
            self._quiet_since = None
        elif self.went_idle:
            self._quiet_since = self._quiet_since if self._quiet_since is not None else ts
            if ts - self._quiet_since >= minutes * 60:
                since = time.strftime("%H:%M:%S", time.localtime(self._quiet_since))
                new += self._raise("gpu-went-idle", f"GPU utilisation 0 % for {minutes:g} minutes since {since}, "
                                   "after it worked", self.went_idle.get("hint", ""),
                                   self.went_idle.get("source", ""), None)
        if self.low and self._util_n and ts - self._util_first >= float(self.low.get("minutes", 10)) * 60:
            mean = self._util_sum / self._util_n
            if mean < float(self.low.get("percent", 30)):
                new += self._raise("gpu-low", f"GPU utilisation averaged {mean:.0f} % over the "
                                   f"{(ts - self._util_first) / 60:.0f} minutes watched",
                                   self.low.get("hint", ""), self.low.get("source", ""), None)
        return new

    # -- derived ------------------------------------------------------------------------------------------------
    def steps_per_min(self) -> Optional[float]:
        if self.last is None:
            return None
        t_last, s_last = self.last
        if self.started is not None and t_last > self.started and s_last > 0:
            return s_last / ((t_last - self.started) / 60.0)
        if self.first and t_last > self.first[0] and s_last > self.first[1]:
            return (s_last - self.first[1]) / ((t_last - self.first[0]) / 60.0)
        return None

    def progress(self, now: float) -> Optional[dict]:
        """{step, total, loss, losses, sparkline, steps_per_min, seconds_left, cost_at_end, format, throughput,
        throughput_unit}; None before any."""
        if self.step is None and self.loss is None and self.throughput is None:
            return None
        rate = self.steps_per_min()
        left = None
        if rate and self.total and self.step is not None:
            left = max(0.0, (self.total - self.step) / rate * 60.0)
        cost_end = None
        if left is not None and self.price is not None and self.started is not None:
            cost_end = round((max(0.0, now - self.started) + left) / 3600.0 * self.price, 2)
        return {"step": self.step, "total": self.total, "loss": self.loss, "losses": list(self.losses),
                "sparkline": loss_sparkline(self.losses), "steps_per_min": round(rate, 2) if rate else None,
                "seconds_left": round(left) if left is not None else None, "cost_at_end": cost_end,
                "format": self.format, "throughput": self.throughput[0] if self.throughput else None,
                "throughput_unit": self.throughput[1] if self.throughput else None}


def progress_text(p: Optional[dict]) -> Optional[str]:
    """`step 40/200  loss 0.512 ▇▅▃▂  12.0 steps/min  13m20s left  $2.10 at the end`"""
    from .plan import fmt_duration

    if not p:
        return None
    parts = []
    if p["step"] is not None:
        parts.append(f"step {p['step']}" + (f"/{p['total']}" if p["total"] else ""))
    if p["loss"] is not None:
        parts.append(f"loss {p['loss']:.4g} {p['sparkline']}".rstrip())
    if p["steps_per_min"]:
        parts.append(f"{p['steps_per_min']:.3g} steps/min")
    if p.get("throughput") is not None:
        parts.append(f"{p['throughput']:.4g} {p['throughput_unit']}".rstrip())
    if p["seconds_left"] is not None:
        parts.append(f"{fmt_duration(p['seconds_left'])} left")
    if p["cost_at_end"] is not None:
        parts.append(f"${p['cost_at_end']:.2f} at the end")
    return "  ".join(parts)


def signal_text(sig: dict) -> str:
    return f"signal: {sig['title']}: {sig['hint']}"


def scan(lines, spec: dict, *, started: Optional[float] = None, price_per_hour: Optional[float] = None,
         now: float = 0.0) -> tuple[list[dict], Optional[dict]]:
    """Signals and progress of a log's lines (status: the tail of each running run's log)."""
    m = SignalModel(spec, started=started, price_per_hour=price_per_hour)
    for ln in lines:
        m.line(ln, now)
    return m.signals, m.progress(now)


def idle_now(spec: dict, gpus: list[dict], elapsed: Optional[float]) -> list[dict]:
    """status's one sample: the GPU-idle signal when every GPU reads 0 % and the run is past the first N minutes."""
    idle = spec.get("gpu_idle") or {}
    minutes = float(idle.get("minutes", 3))
    if not idle or not gpus or elapsed is None or elapsed < minutes * 60:
        return []
    if any(g.get("util") is None or g["util"] > 0 for g in gpus):
        return []
    return [{"id": "gpu-idle", "title": f"GPU utilisation 0 % after {minutes:g} minutes", "hint": idle.get("hint", ""),
             "source": idle.get("source", ""), "line": None}]
