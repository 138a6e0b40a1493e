"""The metrics database a run's followers write and the dashboard reads (history.store, jobs.history): its schema
and versions, one writer per run, rows kept once however often a line is read, the log's unseen stretches read back,
every point kept and a thinned series that keeps extremes. A real SQLite file in the test's folder, no host."""
from __future__ import annotations

import sqlite3
import threading

from gpuops.history import store
from gpuops.jobs import history
from gpuops.jobs import watch as w

LOG = b"".join(f"step {i}/400 | loss {4.0 / i:.4f} | {900 + i} tokens/s\n".encode() for i in range(1, 401))


def events_of(data: bytes, start: int = 0, replay_upto: int = -1):
    """The follow path's log events for the log's bytes from `start`, through the watch model (as follow_to_end)."""
    fs = w.FollowState(offset=start)
    model = w.StreamModel(fs)
    dash = w.Dashboard({"run_id": "r"}, clock=lambda: 1000.0)
    for ev in model.log_bytes(data[start:]):
        if ev["offset"] <= replay_upto:
            ev["replay"] = True
        dash.apply(ev)
        yield ev


def test_schema_has_a_version_and_grows_by_appending(tmp_path):
    path = tmp_path / "runs" / store.FILE
    wr = store.Writer(path, "r1")
    assert wr.claim()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == store.VERSION == len(store.MIGRATIONS)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # a newer gpuops adds a migration: an older file is brought up to it, once, its rows kept
    wr.point("loss", 10, 1, 5.0, 2.5)
    wr.close()
    store.MIGRATIONS.append("CREATE TABLE extra (x INTEGER)")
    try:
        store.VERSION = len(store.MIGRATIONS)
        wr2 = store.Writer(path, "r1")
        wr2.claim()
        wr2.close()
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == store.VERSION
        assert conn.execute("SELECT COUNT(*) FROM extra").fetchone()[0] == 0
        assert store.Reader(path).series("r1", "loss")["points"] == [[1, 2.5, 5.0]]
    finally:
        store.MIGRATIONS.pop()
        store.VERSION = len(store.MIGRATIONS)


def test_one_writer_per_run_until_its_lease_lapses(tmp_path):
    path = tmp_path / store.FILE
    clock = [100.0]
    a = store.Writer(path, "r1", clock=lambda: clock[0], owner="a")
    b = store.Writer(path, "r1", clock=lambda: clock[0], owner="b")
    other = store.Writer(path, "r2", clock=lambda: clock[0], owner="b")
    assert a.claim() and not b.claim() and other.claim()  # another run: its own writer
    clock[0] += store.LEASE_S / 2
    a.flush(force=True)  # a commit renews the lease
    clock[0] += store.LEASE_S * 0.9
    assert not b.claim()
    clock[0] += store.LEASE_S + 1  # a writer gone quiet (its process killed): another takes the run
    assert b.claim()
    a.close(), b.close(), other.close()
    c = store.Writer(path, "r1", owner="c")
    assert c.claim()  # a writer that closed released the run at once
    c.close()


def test_a_run_followed_late_is_read_back_whole_and_each_line_is_kept_once(tmp_path):
    """A dashboard started when the run was at line 300: the stream replays the last lines (their time unknown: not
    the time they were read), the stretch before is read back from the log; a second follower later repeats lines."""
    start = LOG.index(b"step 301/")
    clock = [5000.0]
    rec = history.Recorder(tmp_path, "r1", live_from=LOG.index(b"step 351/"), clock=lambda: clock[0])
    for ev in events_of(LOG, start, replay_upto=LOG.index(b"step 351/")):
        clock[0] += 0.5
        rec.event(ev)
    assert rec.gaps(start) == [(0, start)]
    filled = rec.fill(lambda lo, hi: [LOG[lo:hi][i:i + 4096] for i in range(0, hi - lo, 4096)], start)
    assert filled == [(0, start)] and rec.gaps(len(LOG)) == []
    rec.close()
    again = history.Recorder(tmp_path, "r1", clock=lambda: 9000.0)  # a later follower reading lines already kept
    for ev in events_of(LOG, LOG.index(b"step 391/")):
        again.event(ev)
    again.close()
    got = store.Reader(store.db_path(tmp_path)).series("r1", "loss", limit=10_000)
    assert got["total"] == 400 and [p[0] for p in got["points"]] == list(range(1, 401))  # every step, once
    assert got["points"][0][1] == 4.0 and got["points"][-1][1] == round(4.0 / 400, 4)
    by_step = {p[0]: p[2] for p in got["points"]}
    assert by_step[10] is None and by_step[320] is None  # read back or replayed: no made-up time
    assert by_step[352] is not None and by_step[352] < by_step[353] and 5000 < by_step[395] < 9000  # seen live, first
    assert by_step[400] < 9000
    rate = store.Reader(store.db_path(tmp_path)).series("r1", "rate")
    assert rate["total"] == 400 and store.Reader(store.db_path(tmp_path)).units("r1") == {"rate": "tokens/s"}


def test_the_fetched_log_fills_what_no_follower_saw(tmp_path):
    (tmp_path / "runs" / "r9").mkdir(parents=True)
    log = tmp_path / "runs" / "r9" / "log"
    log.write_bytes(LOG + b"step 401/400 | loss 0.0001")  # the last line without its newline
    assert history.fill_from_file(tmp_path, "r9", log) == [(0, log.stat().st_size)]
    got = store.Reader(store.db_path(tmp_path)).series("r9", "loss", limit=10_000)
    assert got["total"] == 401 and got["points"][-1][:2] == [401, 0.0001]
    assert history.fill_from_file(tmp_path, "r9", log) == []  # nothing left to read


def test_thinning_keeps_every_extreme_and_the_newest_points():
    pts = [[i, 1.0 + (i % 7) * 0.01, None] for i in range(100_000)]
    pts[12_345][1] = 50.0  # a spike
    pts[54_321][1] = -3.0  # a dip
    out = store.thin(pts, 2000)
    assert len(out) <= 2100 and out[-500:] == pts[-500:]
    xs = [p[0] for p in out]
    assert 12_345 in xs and 54_321 in xs and xs == sorted(xs) and xs[0] == 0
    assert max(p[1] for p in out) == 50.0 and min(p[1] for p in out) == -3.0


def test_thousands_of_points_written_while_another_thread_reads(tmp_path):
    path = tmp_path / store.FILE
    wr = store.Writer(path, "r1", every=0.0)
    wr.claim()
    reader = store.Reader(path)
    seen = []

    def read():
        for _ in range(50):
            seen.append(reader.series("r1", "loss")["total"])

    th = threading.Thread(target=read)
    th.start()
    for i in range(5000):
        wr.point("loss", i * 10, i, float(i), 1.0 / (i + 1))
        if i % 100 == 0:
            wr.flush()
    wr.close()
    th.join()
    assert seen == sorted(seen) and reader.series("r1", "loss")["total"] == 5000


def test_gaps_between_spans():
    assert store.gaps([(10, 20), (15, 30), (40, 50)], 60) == [(0, 10), (30, 40), (50, 60)]
    assert store.gaps([], 5) == [(0, 5)] and store.gaps([(0, 5)], 5) == []
