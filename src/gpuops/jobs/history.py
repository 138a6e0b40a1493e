"""What a follower keeps of a run in the project's metrics database (history.store): the loss and throughput its log's
lines give (with their step, and the time they were seen live: None for a line read back from the log), its GPU
samples and its training signals. Written on the one follow path every follower takes (jobs.actions.follow: `gpuops
run`'s watch stage, `gpuops watch`, the dashboard), one writer per run.

A stretch of the log no follower saw (the run started before anything followed it, a dashboard restarted while it
trained) is read back and parsed (`fill`: from the host on the follower's connection, or from the log `gpuops run`
fetched), so a run's history is whole whoever watched it when. The database failing (a full disk, a locked file)
never stops a follower: it says so once and goes on without it.
"""
from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

from ..history import store

SAMPLE_EVERY_S = 2.0  # at most one stored sample per GPU this often (more GPUs: less often, see sample_every)
RECLAIM_S = 10.0  # a writer that found its run held by another asks again this often


def sample_every(gpus: int) -> float:
    """A GPU's samples are stored every 2 s up to 16 GPUs, less often beyond: a 64-host fleet's 512 GPUs write about
    8 rows a second, not 256."""
    return SAMPLE_EVERY_S * max(1.0, gpus / 16.0)


class Metrics:
    """The points a sequence of parsed log lines gives: a loss when the step or the loss changed, a throughput when
    it or the step changed (a line printing the same step in a second format is no new point)."""

    def __init__(self) -> None:
        self.last: tuple = (None, None, None)

    def points(self, progress: Optional[dict]) -> list[tuple[str, Optional[int], float]]:
        if not progress:
            return []
        step, loss, rate = progress.get("step"), progress.get("loss"), progress.get("throughput")
        out = []
        if loss is not None and (step, loss) != self.last[:2]:
            out.append(("loss", step, loss))
        if rate is not None and (step, rate) != (self.last[0], self.last[2]):
            out.append(("rate", step, rate))
        self.last = (step, loss, rate)
        return out


class Recorder:
    """One run's writer on the follow path: event(ev) after the watch model saw it (ev["progress"] and ev["signals"]
    are its parse), fill(...) for the log's stretches not seen, close() at the end."""

    def __init__(self, project: Path, run_id: str, *, live_from: int = 0, clock: Callable[[], float] = time.time,
                 warn: Callable[[str], None] = lambda s: None, spec: Optional[dict] = None):
        self.project, self.run_id, self.clock, self.warn = Path(project), run_id, clock, warn
        self.live_from = live_from
        self.spec = spec
        self.metrics = Metrics()
        self.writer = store.Writer(store.db_path(project), run_id, clock=clock)
        self.ok = True
        self._asked = clock()
        self._sampled: dict = {}
        self._every = SAMPLE_EVERY_S
        self._threads: list[threading.Thread] = []
        self._guard(self.writer.claim)

    def _guard(self, fn, *args):
        if not self.ok:
            return None
        try:
            return fn(*args)
        except (sqlite3.Error, OSError) as exc:
            self.ok = False
            self.warn(f"the run's metrics are not kept ({store.db_path(self.project)}: {exc}); following goes on")
            return None

    @property
    def writing(self) -> bool:
        if self.ok and not self.writer.claimed and self.clock() - self._asked >= RECLAIM_S:
            self._asked = self.clock()
            self._guard(self.writer.claim)
        return self.ok and self.writer.claimed

    def event(self, ev: dict) -> None:
        if not self.writing:
            return
        self._guard(self._event, ev)

    def _event(self, ev: dict) -> None:
        t = ev.get("type")
        if t == "log" and ev.get("offset") is not None:
            pos = ev["offset"]
            raw = ev.get("raw")
            if raw is not None:
                self.writer.span(pos - len(raw) - (1 if ev.get("nl", True) else 0), pos)
            when = None if ev.get("replay") else self.clock()
            self._line_points(ev.get("progress"), ev.get("signals"), pos, when, self.metrics)
        elif t == "sample":
            g, host = ev.get("gpu") or {}, ev.get("host", 0)
            key = (host, g.get("index", 0))
            now = self.clock()
            if key not in self._sampled:
                self._every = sample_every(len(self._sampled) + 1)
            if now - self._sampled.get(key, float("-inf")) >= self._every:
                self._sampled[key] = now
                self.writer.sample(now, host, g)
        if t != "log" and ev.get("signals"):  # a signal a GPU sample raised (the GPU idle for minutes)
            for sig in ev["signals"]:
                self.writer.mark(sig["id"], self.clock(), None, sig.get("title", sig["id"]), sig.get("hint", ""))
        self.writer.flush()

    def _line_points(self, progress, signals, pos: int, when: Optional[float], metrics: Metrics) -> None:
        for metric, step, value in metrics.points(progress):
            self.writer.point(metric, pos, step, when, value)
        if progress and progress.get("throughput_unit") and progress.get("throughput") is not None:
            self.writer.unit("rate", progress["throughput_unit"])
        for sig in signals or []:
            self.writer.mark(sig["id"], when, pos, sig.get("title", sig["id"]), sig.get("hint", ""))

    # -- the log's stretches no follower saw ----------------------------------------------------------------------
    def gaps(self, upto: int) -> list[tuple[int, int]]:
        if not self.writing:
            return []
        got = self._guard(self.writer.spans)
        return store.gaps(got or [], upto) if got is not None else []

    def parse(self, chunks: Iterable[bytes], lo: int, *, last: bool) -> int:
        """Parse the log's bytes from offset `lo` (chunks, in order) for its points; `last`: the final line may have
        no newline. Returns the offset after the last line parsed."""
        from . import signals as sg
        from .watch import LineSplitter

        if self.spec is None:
            self.spec = sg.load_spec(self.project)
        model = sg.SignalModel(self.spec)
        metrics = Metrics()
        split = LineSplitter()
        pos = lo

        def line(raw: bytes, nl: bool) -> None:
            nonlocal pos
            pos += len(raw) + (1 if nl else 0)
            before = (model.step, len(model.losses), model.throughput)
            new = model.line(raw.decode("utf-8", "replace"), 0.0)
            moved = (model.step, len(model.losses), model.throughput) != before
            self._line_points(model.progress(0.0) if moved else None, new, pos, None, metrics)

        for chunk in chunks:
            for raw, nl in split.feed_pieces(chunk):
                line(raw, nl)
            self.writer.span(lo, pos)
            self._guard(self.writer.flush)
            if not self.ok:
                return pos
        if last and split.pending:
            line(bytes(split.pending), False)
            self.writer.span(lo, pos)
        self._guard(self.writer.flush, True)
        return pos

    def fill(self, read: Callable[[int, int], Iterable[bytes]], upto: int, *, last: bool = False,
             background: bool = False) -> list[tuple[int, int]]:
        """Read back and parse each stretch of [0, upto) not yet kept: read(lo, hi) yields its bytes. In a thread of
        its own with background (a follower goes on meanwhile). Returns the stretches."""
        todo = self.gaps(upto)
        if not todo:
            return []

        def work() -> None:
            for lo, hi in todo:
                try:
                    self.parse(read(lo, hi), lo, last=last and hi == upto)
                except (sqlite3.Error, OSError) as exc:
                    self.ok = False
                    self.warn(f"the run's metrics are not kept ({store.db_path(self.project)}: {exc})")
                    return
                except Exception as exc:  # the host went away meanwhile: the stretch is read the next time
                    self.warn(f"could not read back the log of {self.run_id} ({getattr(exc, 'message', exc)})")
                    return

        if background:
            th = threading.Thread(target=work, name=f"gpuops-history-{self.run_id}", daemon=True)
            self._threads.append(th)
            th.start()
        else:
            work()
        return todo

    def close(self, wait: float = 10.0) -> None:
        for th in self._threads:
            th.join(timeout=wait)
        self._guard(self.writer.close)


def fill_from_file(project: Path, run_id: str, log: Path) -> list[tuple[int, int]]:
    """Parse the stretches of a local copy of the run's whole log (`gpuops run` fetches it at the end) that the
    database does not have yet. Nothing when another writer holds the run."""
    size = log.stat().st_size
    rec = Recorder(project, run_id)
    try:
        def read(lo: int, hi: int):
            with open(log, "rb") as fh:
                fh.seek(lo)
                left = hi - lo
                while left > 0:
                    chunk = fh.read(min(1 << 16, left))
                    if not chunk:
                        return
                    left -= len(chunk)
                    yield chunk
        return rec.fill(read, size, last=True)
    finally:
        rec.close()
