"""The project's metrics database (runs/metrics.sqlite): schema, versions, one writer per run, queries, thinning.

- Schema: a `schema_version` table and MIGRATIONS, a list of scripts applied in order (version N has run the first N).
  A new version appends a script (new tables, new nullable columns); an old gpuops reading a newer file reads the
  tables it knows. WAL, so the dashboard reads while a run is written.
- One writer per run: a writer holds a lease on its run (`runs.writer`, renewed at each commit, stale after LEASE_S)
  so the dashboard, `gpuops watch` and `gpuops run` following the same run do not all write it. Rows are keyed by
  the log's byte offset (`pos`), so a line written twice (the live stream, then the log read again to fill a gap)
  is one row.
- Every point is kept; a reader asks for a series thinned to a size a chart can draw (`thin`: the newest points as
  they are, older ones in buckets that keep their first, lowest, highest and last point: a spike is never thinned
  away).
Stdlib only; nothing here talks to a host.
"""
from __future__ import annotations

import json
import math
import os
import socket
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

FILE = "metrics.sqlite"
LEASE_S = 30.0  # a writer not heard from this long has gone: another may take its run
MIGRATIONS = [
    # 1: points (loss, throughput, ... by the log's byte offset), GPU samples, training signals, the log bytes parsed
    """
    CREATE TABLE runs (run_id TEXT PRIMARY KEY, writer TEXT, writer_seen REAL, units TEXT NOT NULL DEFAULT '{}');
    CREATE TABLE spans (run_id TEXT NOT NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL, PRIMARY KEY (run_id, lo));
    CREATE TABLE points (run_id TEXT NOT NULL, metric TEXT NOT NULL, pos INTEGER NOT NULL, step INTEGER, t REAL,
                         value REAL, PRIMARY KEY (run_id, metric, pos)) WITHOUT ROWID;
    CREATE INDEX points_by_step ON points (run_id, metric, step);
    CREATE TABLE gpu (run_id TEXT NOT NULL, t REAL NOT NULL, host INTEGER NOT NULL, gpu INTEGER NOT NULL, name TEXT,
                      util REAL, mem_used REAL, mem_total REAL, power REAL, temp REAL,
                      PRIMARY KEY (run_id, t, host, gpu)) WITHOUT ROWID;
    CREATE TABLE marks (run_id TEXT NOT NULL, id TEXT NOT NULL, t REAL, pos INTEGER, title TEXT, hint TEXT,
                        PRIMARY KEY (run_id, id));
    CREATE TABLE instances_seen (id TEXT PRIMARY KEY, first_seen REAL NOT NULL);
    """,
]
VERSION = len(MIGRATIONS)
GPU_METRICS = ("util", "mem", "power", "temp")


def db_path(project: Path) -> Path:
    return Path(project) / "runs" / FILE


def _connect(path: Path, *, create: bool) -> sqlite3.Connection:
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), timeout=10.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 10000")
    if create:
        if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
            raise sqlite3.OperationalError(f"{path}: cannot use write-ahead logging")
        conn.execute("PRAGMA synchronous = NORMAL")
        migrate(conn)
    return conn


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the file to VERSION (each missing migration in one transaction); returns the version it has."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        have = row[0] if row else 0
        if row is None:
            conn.execute("INSERT INTO schema_version (version) VALUES (0)")
        for n in range(have, VERSION):
            for stmt in (s.strip() for s in MIGRATIONS[n].split(";")):
                if stmt:
                    conn.execute(stmt)
            conn.execute("UPDATE schema_version SET version = ?", (n + 1,))
        conn.execute("COMMIT")
        return max(have, VERSION)
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def merge_spans(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for lo, hi in sorted(s for s in spans if s[1] > s[0]):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(a, b) for a, b in out]


def gaps(spans: Iterable[tuple[int, int]], upto: int) -> list[tuple[int, int]]:
    """The byte ranges of [0, upto) no span covers: what the log must still be read for."""
    out, at = [], 0
    for lo, hi in merge_spans(spans):
        if lo >= upto:
            break
        if lo > at:
            out.append((at, lo))
        at = max(at, hi)
    if at < upto:
        out.append((at, upto))
    return out


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


class Writer:
    """One run's writer. Rows wait in memory and are committed together, at most every `every` seconds (flush()),
    renewing the lease. claim() is False while another live writer holds the run: write nothing then."""

    def __init__(self, path: Path, run_id: str, *, clock: Callable[[], float] = time.time, every: float = 1.0,
                 owner: Optional[str] = None):
        self.path, self.run_id, self.clock, self.every = Path(path), run_id, clock, every
        self.owner = owner or owner_id()
        self.lock = threading.RLock()
        self.conn: Optional[sqlite3.Connection] = None
        self.claimed = False
        self._points: list = []
        self._samples: list = []
        self._marks: list = []
        self._spans: list = []
        self._units: dict = {}
        self._flushed = 0.0

    def claim(self) -> bool:
        with self.lock:
            if self.conn is None:
                self.conn = _connect(self.path, create=True)
            now = self.clock()
            c = self.conn
            c.execute("BEGIN IMMEDIATE")
            try:
                c.execute("INSERT OR IGNORE INTO runs (run_id) VALUES (?)", (self.run_id,))
                writer, seen = c.execute("SELECT writer, writer_seen FROM runs WHERE run_id = ?",
                                         (self.run_id,)).fetchone()
                free = writer is None or writer == self.owner or seen is None or now - seen > LEASE_S
                if free:
                    c.execute("UPDATE runs SET writer = ?, writer_seen = ? WHERE run_id = ?",
                              (self.owner, now, self.run_id))
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
            self.claimed = free
            return free

    def spans(self) -> list[tuple[int, int]]:
        with self.lock:
            rows = self.conn.execute("SELECT lo, hi FROM spans WHERE run_id = ?", (self.run_id,)).fetchall() \
                if self.conn else []
            return merge_spans([tuple(r) for r in rows] + self._spans)

    # -- rows in ---------------------------------------------------------------------------------------------------
    def point(self, metric: str, pos: int, step: Optional[int], t: Optional[float], value: Optional[float]) -> None:
        v = value if isinstance(value, (int, float)) and math.isfinite(value) else None
        with self.lock:
            self._points.append((self.run_id, metric, int(pos), step, t, v))

    def sample(self, t: float, host: int, gpu: dict) -> None:
        with self.lock:
            self._samples.append((self.run_id, t, int(host), int(gpu.get("index", 0)), gpu.get("name"),
                                  gpu.get("util"), gpu.get("mem_used"), gpu.get("mem_total"), gpu.get("power"),
                                  gpu.get("temp")))

    def mark(self, sid: str, t: Optional[float], pos: Optional[int], title: str, hint: str) -> None:
        with self.lock:
            self._marks.append((self.run_id, sid, t, pos, title, hint))

    def span(self, lo: int, hi: int) -> None:
        with self.lock:
            if self._spans and self._spans[-1][1] == lo:
                self._spans[-1] = (self._spans[-1][0], hi)
            elif hi > lo:
                self._spans.append((lo, hi))

    def unit(self, metric: str, unit: str) -> None:
        with self.lock:
            self._units[metric] = unit

    def flush(self, force: bool = False) -> None:
        with self.lock:
            now = self.clock()
            if not self.claimed or (not force and now - self._flushed < self.every):
                return
            self._flushed = now
            c = self.conn
            c.execute("BEGIN IMMEDIATE")
            try:
                c.executemany("INSERT INTO points VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, metric, pos) DO UPDATE "
                              "SET step = excluded.step, value = excluded.value, t = CASE WHEN points.t IS NULL "
                              "THEN excluded.t WHEN excluded.t IS NULL THEN points.t ELSE MIN(points.t, excluded.t) "
                              "END", self._points)  # a line seen twice: the first time it was seen live
                c.executemany("INSERT OR IGNORE INTO gpu VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", self._samples)
                c.executemany("INSERT OR IGNORE INTO marks VALUES (?, ?, ?, ?, ?, ?)", self._marks)
                if self._spans:
                    old = [tuple(r) for r in c.execute("SELECT lo, hi FROM spans WHERE run_id = ?", (self.run_id,))]
                    c.execute("DELETE FROM spans WHERE run_id = ?", (self.run_id,))
                    c.executemany("INSERT INTO spans VALUES (?, ?, ?)",
                                  [(self.run_id, lo, hi) for lo, hi in merge_spans(old + self._spans)])
                if self._units:
                    row = c.execute("SELECT units FROM runs WHERE run_id = ?", (self.run_id,)).fetchone()
                    units = {**json.loads(row[0] if row else "{}"), **self._units}
                    c.execute("UPDATE runs SET units = ? WHERE run_id = ?", (json.dumps(units), self.run_id))
                c.execute("UPDATE runs SET writer = ?, writer_seen = ? WHERE run_id = ?", (self.owner, now, self.run_id))
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
            self._points, self._samples, self._marks, self._units = [], [], [], {}
            self._spans = self._spans[-1:]  # the span still growing is extended, and merged again at the next flush

    def close(self) -> None:
        with self.lock:
            if self.conn is None:
                return
            try:
                if self.claimed:
                    self.flush(force=True)
                    self.conn.execute("UPDATE runs SET writer = NULL WHERE run_id = ? AND writer = ?",
                                      (self.run_id, self.owner))
            finally:
                self.conn.close()
                self.conn, self.claimed = None, False


def note_instances(path: Path, ids: Iterable[str], now: float) -> dict[str, float]:
    """Remember when each instance id was first seen (an instance gpuops did not launch has no launch time in the
    API): id -> the first time any dashboard of this project saw it."""
    ids = [i for i in ids if i]
    if not ids:
        return {}
    conn = _connect(Path(path), create=True)
    try:
        conn.executemany("INSERT OR IGNORE INTO instances_seen VALUES (?, ?)", [(i, now) for i in ids])
        marks = ",".join("?" * len(ids))
        return dict(conn.execute(f"SELECT id, first_seen FROM instances_seen WHERE id IN ({marks})", ids).fetchall())
    finally:
        conn.close()


# -- reading ----------------------------------------------------------------------------------------------------------
class Reader:
    """Queries for the dashboard (one connection, opened when the file exists; safe across threads)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lock = threading.Lock()
        self.conn: Optional[sqlite3.Connection] = None

    def _q(self, sql: str, args: tuple = ()) -> list:
        with self.lock:
            if self.conn is None:
                if not self.path.is_file():
                    return []
                self.conn = _connect(self.path, create=False)
            try:
                return self.conn.execute(sql, args).fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):  # a file created, its first migration not yet committed
                    return []
                raise

    def close(self) -> None:
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None

    def spans(self, run_id: str) -> list[tuple[int, int]]:
        return merge_spans(tuple(r) for r in self._q("SELECT lo, hi FROM spans WHERE run_id = ?", (run_id,)))

    def units(self, run_id: str) -> dict:
        rows = self._q("SELECT units FROM runs WHERE run_id = ?", (run_id,))
        return json.loads(rows[0][0]) if rows else {}

    def marks(self, run_id: str) -> list[dict]:
        return [{"id": i, "t": t, "pos": p, "title": ti, "hint": h} for i, t, p, ti, h in
                self._q("SELECT id, t, pos, title, hint FROM marks WHERE run_id = ? ORDER BY pos, t", (run_id,))]

    def last(self, run_id: str, metric: str) -> Optional[dict]:
        rows = self._q("SELECT step, value, t FROM points WHERE run_id = ? AND metric = ? ORDER BY pos DESC LIMIT 1",
                       (run_id, metric))
        return {"step": rows[0][0], "value": rows[0][1], "t": rows[0][2]} if rows else None

    def series(self, run_id: str, metric: str, *, lo: Optional[float] = None, hi: Optional[float] = None,
               limit: int = 2000) -> dict:
        """{points: [[step, value, t]] by step (thinned to about `limit`, extremes kept), total: points in range,
        thinned}. A log without steps: its points are numbered in order (1, 2, ...)."""
        rows = self._q("SELECT step, value, t FROM points WHERE run_id = ? AND metric = ? ORDER BY pos",
                       (run_id, metric))
        if rows and all(r[0] is None for r in rows):
            rows = [(n, v, t) for n, (_, v, t) in enumerate(rows, 1)]
        pts = sorted(([s, v, t] for s, v, t in rows if s is not None), key=lambda p: p[0])
        pts = dedupe_steps(pts)
        if lo is not None:
            pts = [p for p in pts if p[0] >= lo]
        if hi is not None:
            pts = [p for p in pts if p[0] <= hi]
        out = thin(pts, limit)
        return {"points": out, "total": len(pts), "thinned": len(out) < len(pts)}

    def gpu_rows(self, run_id: str, *, lo: Optional[float] = None, hi: Optional[float] = None, buckets: int = 600,
                 bucket_s: float = 2.0) -> dict:
        """GPU samples in buckets of time (at least bucket_s wide, more when the range holds more than `buckets`):
        {width, rows: [[t, host, gpu, name, mem_total, {metric: [low, high]}]]} (memory in MiB used)."""
        lim = self._q("SELECT MIN(t), MAX(t) FROM gpu WHERE run_id = ?", (run_id,))
        if not lim or lim[0][0] is None:
            return {"width": bucket_s, "rows": []}
        t0 = lim[0][0] if lo is None else max(lo, lim[0][0])
        t1 = lim[0][1] if hi is None else min(hi, lim[0][1])
        width = max(bucket_s, (t1 - t0) / max(1, buckets))
        t0 = math.floor(t0 / bucket_s) * bucket_s
        rows = self._q(
            "SELECT CAST((t - ?) / ? AS INTEGER) AS b, host, gpu, MAX(name), MAX(mem_total), "
            "MIN(util), MAX(util), MIN(mem_used), MAX(mem_used), MIN(power), MAX(power), MIN(temp), MAX(temp) "
            "FROM gpu WHERE run_id = ? AND t >= ? AND t <= ? GROUP BY b, host, gpu ORDER BY b, host, gpu",
            (t0, width, run_id, t0, t1))
        return {"width": width, "rows": [[t0 + b * width, h, g, name, total,
                                          {"util": [u0, u1], "mem": [m0, m1], "power": [p0, p1], "temp": [c0, c1]}]
                                         for b, h, g, name, total, u0, u1, m0, m1, p0, p1, c0, c1 in rows]}

    def seen(self) -> dict[str, float]:
        """run id -> the last time a writer committed for it (a follower heard from the run)."""
        return {r: t for r, t in self._q("SELECT run_id, writer_seen FROM runs") if t is not None}

    def has(self, run_id: str) -> bool:
        return bool(self._q("SELECT 1 FROM spans WHERE run_id = ? LIMIT 1", (run_id,)) or
                    self._q("SELECT 1 FROM gpu WHERE run_id = ? LIMIT 1", (run_id,)))

    def gpu_names(self, run_id: str) -> list[str]:
        """The name of each GPU the run's samples saw (one per host and index)."""
        return [n for _h, _g, n in self._q("SELECT host, gpu, MAX(name) FROM gpu WHERE run_id = ? GROUP BY host, gpu",
                                           (run_id,)) if n]

    def first_seen(self, ids: Iterable[str]) -> dict[str, float]:
        ids = [i for i in ids if i]
        if not ids:
            return {}
        return dict(self._q(f"SELECT id, first_seen FROM instances_seen WHERE id IN ({','.join('?' * len(ids))})",
                            tuple(ids)))


def dedupe_steps(pts: list) -> list:
    """One point per step: a step logged twice (a trainer's line and a logger's dict) keeps its last value."""
    out: list = []
    for p in pts:
        if out and out[-1][0] == p[0]:
            out[-1] = p
        else:
            out.append(p)
    return out


def thin(points: list, limit: int, recent: float = 0.25) -> list:
    """Points sorted by x ([x, value, ...]) brought to about `limit`: the newest `recent` share as they are; the older
    ones in buckets of equal x width, each keeping its first, lowest, highest and last point."""
    n = len(points)
    if n <= limit or limit < 8:
        return list(points)
    keep = max(1, int(limit * recent))
    old, new = points[:n - keep], points[n - keep:]
    buckets = max(1, (limit - keep) // 4)
    x0, x1 = old[0][0], old[-1][0]
    width = (x1 - x0) / buckets or 1.0
    out: list = []
    group: list = []
    cur = None
    for p in old:
        b = min(buckets - 1, int((p[0] - x0) / width))
        if b != cur and group:
            out.extend(_extremes(group))
            group = []
        cur = b
        group.append(p)
    if group:
        out.extend(_extremes(group))
    return out + new


def _extremes(group: list) -> list:
    idx = {0, len(group) - 1}
    vals = [(p[1], i) for i, p in enumerate(group) if p[1] is not None]
    if vals:
        idx.add(min(vals)[1])
        idx.add(max(vals)[1])
    idx.update(i for i, p in enumerate(group) if p[1] is None)  # a NaN stays a gap, never thinned into a line
    return [group[i] for i in sorted(idx)]
