"""The dashboard's talking half: what feeds the views, shared by every viewer.

- One follower thread per run: the same stream `gpuops watch` reads (jobs.actions.follow, with jobs.actions.FleetSampler
  for a fleet's other hosts), into the same model (jobs.watch.Dashboard), recorded in a feed.RunFeed. However many
  tabs show a run, it is followed once: a viewer only reads the feed's journal, nothing runs on a host per viewer.
  The follow path keeps the run's metrics in the project's database (jobs.history); a page shows them under the feed,
  so a run's history is whole after a restart, and a run whose record says it ended is shown from its record and
  the database, not followed (its log read back from the copy `gpuops run` fetched, when the database lacks it).
- The account's instances: one thread asks the API (as `gpuops ls` does, without writing the ledger) every
  `api_every` seconds; the page gets the last answer, and its age when the API fails.
- The project's runs and pipelines: its registry (runs/, runs/pipelines/) read at most every `runs_every` seconds.
A run not known to have ended started in the last FOLLOW_DAYS is followed from the first overview on (at most
MAX_FOLLOWED at once: a slot is free again when its run ends or its host cannot be reached).
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Optional

from ..history import store
from . import feed as fd
from . import views

FOLLOW_DAYS = 3
MAX_FOLLOWED = 16
MAX_FEEDS = 64  # feeds kept in memory (the oldest of runs no longer followed are dropped; the database keeps them)
RETRY_S = 30.0  # a follower that failed (host unreachable) is started again by the next viewer after this long


def _quiet_output():
    from ..console import Output

    sink = open(os.devnull, "w")
    return Output(json_mode=True, stdout=sink, stderr=sink, quiet=True)


def redact(text: str) -> str:
    from ..cloud.api import redact

    return redact(text)


def _read_json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def tail_lines(path: Path, n: int, chunk: int = 1 << 16) -> list[str]:
    """The last n lines of a (local) file, read from its end."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            end = pos = fh.tell()
            data = b""
            while pos > 0 and data.count(b"\n") <= n:
                pos = max(0, pos - chunk)
                fh.seek(pos)
                data = fh.read(end - pos)
    except OSError:
        return []
    return [ln.decode("utf-8", "replace") for ln in data.splitlines()[-n:]]


class _Follower:
    def __init__(self, feed: fd.RunFeed):
        self.feed = feed
        self.thread: Optional[threading.Thread] = None
        self.failed_at: Optional[float] = None
        self.done = False
        self.tail_pending = False  # an ended run's log to read from its host when its page first asks

    @property
    def active(self) -> bool:
        """Holding one of the MAX_FOLLOWED slots: following, not ended, not given up on."""
        return self.thread is not None and self.thread.is_alive() and not self.done and self.failed_at is None


class Hub:
    def __init__(self, project: Path, *, clock: Callable[[], float] = time.time, interval: float = 2.0,
                 api_every: float = 10.0, runs_every: float = 2.0, follow: bool = True):
        self.project = project
        self.clock = clock
        self.interval = interval
        self.api_every = api_every
        self.runs_every = runs_every
        self.follow_runs = follow
        self.lock = threading.Lock()
        self.followers: "OrderedDict[str, _Follower]" = OrderedDict()
        self._stop = threading.Event()
        self._instances: dict = {"rows": [], "error": None, "loaded": False, "at": None}
        self._runs_cache: Optional[tuple[float, dict]] = None
        self._prices: dict[str, Optional[float]] = {}
        self._api_thread = threading.Thread(target=self._poll_api, name="gpuops-dashboard-api", daemon=True)
        self.out = _quiet_output()
        self.db = store.Reader(store.db_path(project))
        self.streams_started = 0  # followers started (one stream each): what the tests count

    def start(self) -> "Hub":
        """The API poller, and the runs to follow started now, before the URL is printed: the libraries a follower
        loads (paramiko, fabric, pydantic) are loaded here, not while the first page is being served."""
        import fabric  # noqa: F401
        import paramiko  # noqa: F401

        from ..jobs import actions  # noqa: F401
        from ..profiles import model  # noqa: F401

        self._api_thread.start()
        self.overview()
        return self

    def settle(self, timeout: float = 5.0) -> None:
        """Wait (at most `timeout`) for the first answer of the API and of each run followed: the first page then
        shows them at once, and is not served while they are still being loaded and connected."""
        end = self.clock() + timeout
        while self.clock() < end:
            with self.lock:
                busy = not self._instances["loaded"] or any(
                    f.feed.seq == 0 and f.active for f in self.followers.values())
            if not busy:
                return
            time.sleep(0.05)

    @property
    def closing(self) -> threading.Event:
        return self._stop

    def close(self) -> None:
        self._stop.set()

    # -- the account's instances (API + ledger) ------------------------------------------------------------------
    def _poll_api(self) -> None:
        from ..cloud import decisions as d
        from ..errors import GpuopsError

        try:
            from ..cloud.managed import local_cloud_profiles
            from ..cloud.instances import make_context, owner_alive

            ctx = make_context(self.out)
        except GpuopsError as exc:
            self._set_instances([], exc.message + (f" ({exc.hint})" if exc.hint else ""))
            return
        with ctx.client:
            while not self._stop.is_set():
                try:
                    instances = ctx.client.instances()
                    records = ctx.ledger.records()
                    live_owners = {r.launch_id for r in records if r.open and owner_alive(r)}
                    profiles = local_cloud_profiles()
                    now = ctx.clock()
                    rows, _alerts = d.ls_rows(instances, records, profiles, now, live_owners)
                    unknown = [r["id"] for r in rows if r.get("uptime_s") is None and r.get("status") in
                               views.LIVE_STATUSES]
                    try:
                        seen = store.note_instances(self.db.path, unknown, now)
                    except Exception:  # the database is only a help here
                        seen = {}
                    self._set_instances(rows, None, fs={i.id: list(i.file_system_names) for i in instances},
                                        by_profile=views.instances_by_profile(profiles),
                                        names={i.id: i.name for i in instances if i.name}, seen=seen)
                except GpuopsError as exc:
                    self._set_instances(self._instances["rows"], redact(exc.message))
                except Exception as exc:  # the page says it; the dashboard goes on
                    self._set_instances(self._instances["rows"], redact(f"{type(exc).__name__}: {exc}"))
                self._stop.wait(self.api_every)

    def _set_instances(self, rows, error, fs=None, by_profile=None, names=None, seen=None) -> None:
        with self.lock:
            old = self._instances
            self._instances = {"rows": rows, "error": error, "loaded": True,
                               "at": self.clock() if error is None else old.get("at"),
                               "fs": fs if fs is not None else old.get("fs", {}),
                               "by_profile": by_profile if by_profile is not None else old.get("by_profile", {}),
                               "names": names if names is not None else old.get("names", {}),
                               "seen": seen if seen is not None else old.get("seen", {})}

    # -- the project's runs --------------------------------------------------------------------------------------------
    def _profile(self, name: Optional[str]) -> dict:
        """What the run page and the costs need of a profile: price per hour, instance type ({} when unknown)."""
        if not isinstance(name, str) or not name:
            return {}
        if name not in self._prices:
            from ..profiles.model import resolve

            try:
                prof = resolve(name, self.project)
                self._prices[name] = {"price_per_hour": prof.price_per_hour,
                                      "instance_type": getattr(prof, "instance_type", None)}
            except Exception:
                self._prices[name] = {}
        return self._prices[name]

    def _price(self, name: Optional[str]) -> Optional[float]:
        return self._profile(name).get("price_per_hour")

    def _records(self, rid: str) -> tuple[dict, dict]:
        d = self.project / "runs" / rid
        return _read_json(d / "state.json"), _read_json(d / "meta.json")

    def _pipelines_raw(self) -> dict[str, dict]:
        """run id -> its `gpuops run` record as written (the fields a newer gpuops adds, such as `ending`)."""
        out = {}
        for f in (self.project / "runs" / "pipelines").glob("*.json"):
            doc = _read_json(f)
            if isinstance(doc.get("run_id"), str):
                out[doc["run_id"]] = doc
        return out

    def _read_runs(self) -> dict:
        from ..jobs import plan as core
        from ..pipeline import stages as ps

        now = self.clock()
        metas = [m for m in core.local_runs(None, self.project)[:200] if isinstance(m.get("run_id"), str)]
        states, endings = {}, {}
        pipes = self._pipelines_raw()
        for m in metas:
            st, _ = self._records(m["run_id"])
            states[m["run_id"]] = st
            e = views.ending_of(st, m, pipes.get(m["run_id"]))  # issue 35's `ending`, where a record has one
            if e:
                endings[m["run_id"]] = e
        if self.follow_runs:
            for m in metas:
                st = states.get(m["run_id"]) or {}
                started = views.num(m.get("started_ts")) or 0
                if started > now - FOLLOW_DAYS * 86400 and st.get("state") in (None, "running", "unknown"):
                    with self.lock:
                        f = self.followers.get(m["run_id"])
                        free = sum(1 for x in self.followers.values() if x.active) < MAX_FOLLOWED
                    if f is None and free:
                        self._ensure(m)
        with self.lock:
            live = {rid: f.feed.summary() for rid, f in self.followers.items()}
        try:
            seen = self.db.seen()
        except Exception:
            seen = {}
        prices = {views.text(m.get("profile")): self._price(views.text(m.get("profile"))) for m in metas}
        return {"runs": views.run_rows(metas, states, now, prices, live, seen=seen, endings=endings),
                "pipelines": views.pipeline_rows(ps.load_all(self.project), now)}

    def overview(self) -> dict:
        now = self.clock()
        if self._runs_cache is None or now - self._runs_cache[0] >= self.runs_every:
            try:
                self._runs_cache = (now, self._read_runs())
            except Exception as exc:  # never a 500 every second: the page says what could not be read
                self._runs_cache = (now, {"runs": [], "pipelines": [],
                                          "error": f"the project's runs cannot be read: {type(exc).__name__}: {exc}"})
        runs = self._runs_cache[1]
        with self.lock:
            inst = dict(self._instances)
        running = {r["profile"] for r in runs["runs"] if r["state"] == "running"}
        watched = views.watched_instances(inst.get("by_profile") or {}, running, runs["pipelines"])
        return {"project": self.project.name, "now": now, "runs": runs["runs"], "pipelines": runs["pipelines"],
                "runs_error": runs.get("error"),
                "instances": views.instance_rows(inst["rows"], inst.get("fs") or {}, watched,
                                                 names=inst.get("names"), first_seen=inst.get("seen"), now=now),
                "instances_error": inst["error"], "instances_loaded": inst["loaded"], "instances_at": inst.get("at")}

    # -- one run's feed -----------------------------------------------------------------------------------------------
    def meta(self, run_id: str) -> Optional[dict]:
        from ..jobs import plan as core

        return next((m for m in core.local_runs(None, self.project) if m["run_id"] == run_id), None)

    def feed(self, run_id: str) -> Optional[fd.RunFeed]:
        """The run's feed, its follower started (or restarted after a failure) if need be; None for no such run.
        A run whose record says it ended is not followed: its page is its record, its history and its log."""
        with self.lock:
            f = self.followers.get(run_id)
            if f is not None:
                self.followers.move_to_end(run_id)
        if f is not None and not (f.failed_at and self.clock() - f.failed_at > RETRY_S):
            return f.feed
        meta = self.meta(run_id)
        if meta is None:
            return f.feed if f else None
        if f is None:
            st, _ = self._records(run_id)
            if st.get("state") in fd.ENDED:
                return self._ended(meta, st).feed
        return self._ensure(meta, restart=f is not None).feed

    def _new_feed(self, meta: dict, recorded: Optional[dict] = None) -> fd.RunFeed:
        return fd.RunFeed(meta["run_id"], profile=meta.get("profile"), hosts=max(1, len(meta.get("nodes") or [])),
                          redact=redact, recorded=recorded)

    def _keep(self, rid: str, f: _Follower) -> None:
        """Under the lock: the follower kept, the oldest feeds no longer followed dropped beyond MAX_FEEDS."""
        self.followers[rid] = f
        for old in [k for k, x in self.followers.items() if not x.active and k != rid]:
            if len(self.followers) <= MAX_FEEDS:
                break
            del self.followers[old]

    def _ended(self, meta: dict, st: dict) -> _Follower:
        """An ended run's page: its state from its record, its log's tail from the copy `gpuops run` fetched, its
        history from the database (filled from that copy first where the database lacks it)."""
        rid = meta["run_id"]
        feed = self._new_feed(meta, recorded=st)
        log = self.project / "runs" / rid / "log"
        for line in tail_lines(log, fd.LOG_LINES) if log.is_file() else []:
            feed.record({"type": "log", "line": line, "replay": True}, self.clock())
        if not log.is_file():  # `gpuops train`'s runs: the log is on the host only (its traceback is why one looks)
            feed.note("(no copy of the log here: reading its last lines from the host...)")
        f = _Follower(feed)
        f.done, f.tail_pending = True, not log.is_file()  # the host is asked only for the run's page (run_doc)
        with self.lock:
            if rid in self.followers:
                return self.followers[rid]
            self._keep(rid, f)
        if log.is_file():  # read in the background: a page asks for its history again a few seconds after loading
            threading.Thread(target=self._fill, args=(rid, log), name=f"gpuops-dashboard-fill-{rid}", daemon=True).start()
        return f

    def _host_tail(self, rid: str, meta: dict) -> None:
        """An ended run's last lines read from its host (one connection, as `gpuops logs` reads them), into its feed;
        what could not be read is said there, never an error."""
        from ..jobs import actions
        from ..profiles.model import resolve

        got = bytearray()
        try:
            prof = resolve(meta.get("profile"), self.project).node(None)
            actions.tail(prof, self.out, self.project, meta, fd.LOG_LINES, got.extend)
        except Exception as exc:
            msg = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            with self.lock:
                f = self.followers.get(rid)
                if f is not None:
                    f.feed.note(f"(the log could not be read from the host: {msg}; the full log link tries again)")
            return
        with self.lock:
            f = self.followers.get(rid)
            if f is None:
                return
            for line in got.decode("utf-8", "replace").splitlines()[-fd.LOG_LINES:]:
                f.feed.record({"type": "log", "line": line, "replay": True}, self.clock())
            f.feed.note("(the lines above: the log's end, read from the host)" if got else "(the log on the host is "
                                                                                        "empty)")

    def _fill(self, rid: str, log: Path) -> None:
        from ..jobs.history import fill_from_file

        try:
            fill_from_file(self.project, rid, log)
        except Exception:  # the page still shows what the database has
            pass

    def _ensure(self, meta: dict, restart: bool = False) -> _Follower:
        rid = meta["run_id"]
        with self.lock:
            f = self.followers.get(rid)
            if f is not None and not restart:
                return f
            if f is None:
                f = _Follower(self._new_feed(meta))
                self._keep(rid, f)
            f.failed_at = None
            f.thread = threading.Thread(target=self._follow, args=(meta, f), name=f"gpuops-dashboard-{rid}",
                                        daemon=True)
            self.streams_started += 1
        f.thread.start()
        return f

    def _record(self, feed: fd.RunFeed, ev: dict, dash=None) -> None:
        with self.lock:
            feed.record(ev, self.clock(), dash)

    def _follow(self, meta: dict, f: _Follower) -> None:
        """`gpuops watch` of the run, into its feed: one stream on its host (a fleet: host 0's stream and a GPU sample
        stream on each other host), reconnecting as watch does."""
        from ..cloud.meter import ActivityNoter
        from ..errors import GpuopsError
        from ..jobs import actions
        from ..jobs import watch as w
        from ..profiles.model import resolve

        feed = f.feed
        try:
            fleet_prof = resolve(meta.get("profile"), self.project)
            prof = fleet_prof.node(None)
            n_nodes = len(meta.get("nodes") or [])
            price = prof.price_per_hour * max(1, n_nodes) if prof.price_per_hour is not None else None
            dash = w.Dashboard(meta, price_per_hour=price, log_lines=fd.LOG_LINES, host=prof.rank)
            others = [n for n in fleet_prof.nodes()[:n_nodes] if n.rank != prof.rank] if n_nodes > 1 else []
            activity = ActivityNoter(prof)  # as watch: a managed instance's idle clock restarts while the job runs
            sampler = actions.FleetSampler(others, self.interval)

            def handler(ev: dict) -> None:
                for other in sampler.drain():
                    dash.apply(other)
                    self._record(feed, other, dash)
                if ev.get("type") == "sample":
                    activity.seen(dash.state == "running", [ev["gpu"].get("util") or 0])
                    ev.setdefault("host", prof.rank)
                self._record(feed, ev, dash)
                if self._stop.is_set():
                    raise KeyboardInterrupt

            with sampler:
                actions.follow(prof, self.out, self.project, meta, dash, lines=fd.LOG_LINES, samples=True,
                               interval=self.interval, on_event=handler)
            self._record(feed, {"type": "end"}, dash)
            f.done = True
        except GpuopsError as exc:
            from ..errors import ConnectError

            f.failed_at = self.clock()
            self._record(feed, {"type": "lost", "error": exc.message, "unreachable": isinstance(exc, ConnectError)})
        except Exception as exc:  # a follower's failure is shown on its page, never a crashed dashboard
            f.failed_at = self.clock()
            self._record(feed, {"type": "lost", "error": f"{type(exc).__name__}: {exc}"})

    # -- a run's page: its feed over its history --------------------------------------------------------------------------
    def run_doc(self, run_id: str) -> Optional[dict]:
        """The run's page: what it is, its feed's snapshot, and its whole history by step (thinned, extremes kept)
        and GPU rows from the database under the feed's."""
        feed = self.feed(run_id)
        if feed is None:
            return None
        with self.lock:
            f = self.followers.get(run_id)
            tail = f is not None and f.tail_pending
            if tail:
                f.tail_pending = False
            snap = feed.snapshot()
            lay = feed.lay
        meta = self.meta(run_id) or {"run_id": run_id}
        if tail:  # its lines come over the page's event stream
            threading.Thread(target=self._host_tail, args=(run_id, meta), name=f"gpuops-dashboard-tail-{run_id}",
                             daemon=True).start()
        st, _ = self._records(run_id)
        pipe = self._pipelines_raw().get(run_id)
        names = self.db.gpu_names(run_id) or [g.get("name") for g in feed.latest.values()]
        if not snap["series"]:  # nothing live: the layout of what the database has
            lay = fd.layout(self._gpu_keys(run_id))
            snap.update(series=lay["series"], mode=lay["mode"], keys=[list(k) for k in lay["keys"]]
                        if lay["mode"] == "gpu" else lay["keys"])
        snap["rows"] = fd.merge_rows(fd.history_rows(self.db.gpu_rows(run_id), lay), snap["rows"])
        if not any(snap["mem_total"] or []):
            snap["mem_total"] = self._mem_totals(run_id, lay)
        for key in ("loss", "rate"):
            hist = self.db.series(run_id, key, limit=4000)
            merged = fd.merge_points(hist["points"], snap[key])
            snap[key] = store.thin(merged, 4000)
            snap[key + "_total"] = len(merged)
        snap["rate_unit"] = snap["rate_unit"] or self.db.units(run_id).get("rate", "")
        if not snap["marks"]:
            snap["marks"] = [{k: m[k] for k in ("t", "id", "title", "hint")} for m in self.db.marks(run_id)]
        ending = views.ending_of(st, meta, pipe)
        snap["info"] = views.run_info(meta, st, profile=self._profile(meta.get("profile")), pipeline=pipe,
                                      ending=ending, gpus=names,
                                      log_local=(self.project / "runs" / run_id / "log").is_file())
        if snap["state"] == "connecting" and st.get("state") in fd.ENDED:
            snap["state"], snap["exit_code"] = st["state"], snap["info"]["exit_code"]
        return snap

    def _gpu_keys(self, run_id: str) -> list[tuple[int, int]]:
        return [(r[1], r[2]) for r in self.db.gpu_rows(run_id, buckets=1)["rows"]]

    def _mem_totals(self, run_id: str, lay: dict) -> list:
        latest = {(r[1], r[2]): {"mem_total": r[4]} for r in self.db.gpu_rows(run_id, buckets=1)["rows"]}
        return fd.mem_totals(latest, lay)

    def series(self, run_id: str, metric: str, lo: Optional[float], hi: Optional[float], limit: int = 2000) -> dict:
        """One metric by step between two steps, from the database (with what the feed holds, when it is newer)."""
        got = self.db.series(run_id, metric, lo=lo, hi=hi, limit=limit)
        with self.lock:
            f = self.followers.get(run_id)
            live = [p for p in (f.feed.loss if metric == "loss" else f.feed.rate)] if f and metric in ("loss", "rate") \
                else []
        live = [p for p in live if (lo is None or p[1] >= lo) and (hi is None or p[1] <= hi)]
        if live:
            merged = fd.merge_points(got["points"], live)
            got = {"points": store.thin(merged, limit), "total": max(got["total"], len(merged)),
                   "thinned": len(merged) > limit}
        return {"run_id": run_id, "metric": metric, "unit": self.db.units(run_id).get(metric, "") if metric == "rate"
                else "", **got}

    def gpu_range(self, run_id: str, lo: Optional[float], hi: Optional[float]) -> dict:
        with self.lock:
            f = self.followers.get(run_id)
            lay = f.feed.lay if f else fd.layout([])
        if not lay["series"]:
            lay = fd.layout(self._gpu_keys(run_id))
        return {"series": lay["series"], "rows": fd.history_rows(self.db.gpu_rows(run_id, lo=lo, hi=hi), lay)}
