"""The dashboard's talking half: what feeds the views, shared by every viewer.

- One follower thread per run: the same stream `gpuops watch` reads (jobs.actions.follow, with jobs.actions.FleetSampler
  for a fleet's other hosts), into the same model (jobs.watch.Dashboard), recorded in a views.RunFeed. However many
  tabs show a run, it is followed once: a viewer only reads the feed's journal, nothing runs on a host per viewer.
- The account's instances: one thread asks the API (as `gpuops ls` does, without writing the ledger) every
  `api_every` seconds; the page gets the last answer.
- The project's runs and pipelines: its registry (runs/, runs/pipelines/) read at most every `runs_every` seconds.
A run not known to have ended (no final state recorded) started in the last FOLLOW_DAYS is followed from the first
overview on, so the runs table shows its live state and what it costs.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from . import views

FOLLOW_DAYS = 3
MAX_FOLLOWED = 16
RETRY_S = 30.0  # a follower that failed (host unreachable) is started again by the next viewer after this long


def _quiet_output():
    from ..console import Output

    sink = open(os.devnull, "w")
    return Output(json_mode=True, stdout=sink, stderr=sink, quiet=True)


def _redact(text: str) -> str:
    from ..cloud.api import redact

    return redact(text)


class _Follower:
    def __init__(self, feed: views.RunFeed):
        self.feed = feed
        self.thread: Optional[threading.Thread] = None
        self.failed_at: Optional[float] = None
        self.done = False


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
        self.followers: dict[str, _Follower] = {}
        self._stop = threading.Event()
        self._instances: dict = {"rows": [], "error": None, "loaded": False, "at": None}
        self._runs_cache: Optional[tuple[float, dict]] = None
        self._prices: dict[str, Optional[float]] = {}
        self._api_thread = threading.Thread(target=self._poll_api, name="gpuops-dashboard-api", daemon=True)
        self.out = _quiet_output()
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
                    f.feed.seq == 0 and f.failed_at is None and not f.done for f in self.followers.values())
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
                    rows, _alerts = d.ls_rows(instances, records, profiles, ctx.clock(), live_owners)
                    fs = {i.id: list(i.file_system_names) for i in instances}
                    self._set_instances(rows, None, fs=fs, by_profile=views.instances_by_profile(profiles))
                except GpuopsError as exc:
                    self._set_instances(self._instances["rows"], _redact(exc.message))
                except Exception as exc:  # the page says it; the dashboard goes on
                    self._set_instances(self._instances["rows"], _redact(f"{type(exc).__name__}: {exc}"))
                self._stop.wait(self.api_every)

    def _set_instances(self, rows, error, fs=None, by_profile=None) -> None:
        with self.lock:
            self._instances = {"rows": rows, "error": error, "loaded": True, "at": self.clock(),
                               "fs": fs if fs is not None else self._instances.get("fs", {}),
                               "by_profile": by_profile if by_profile is not None else
                               self._instances.get("by_profile", {})}

    # -- the project's runs --------------------------------------------------------------------------------------------
    def _price(self, name: Optional[str]) -> Optional[float]:
        if not name:
            return None
        if name not in self._prices:
            from ..errors import GpuopsError
            from ..profiles.model import resolve

            try:
                self._prices[name] = resolve(name, self.project).price_per_hour
            except (GpuopsError, Exception):
                self._prices[name] = None
        return self._prices[name]

    def _read_runs(self) -> dict:
        from ..jobs import plan as core
        from ..pipeline import stages as ps

        now = self.clock()
        metas = core.local_runs(None, self.project)[:200]
        states = {}
        for m in metas:
            try:
                states[m["run_id"]] = json.loads((core.registry_dir(self.project) / m["run_id"] / "state.json").read_text())
            except (OSError, ValueError):
                pass
        if self.follow_runs:
            for m in metas:
                st = states.get(m["run_id"]) or {}
                recent = (m.get("started_ts") or 0) > now - FOLLOW_DAYS * 86400
                if recent and st.get("state") in (None, "running", "unknown") and len(self.followers) < MAX_FOLLOWED:
                    self._ensure(m)
        with self.lock:
            live = {rid: f.feed.summary() for rid, f in self.followers.items()}
        prices = {m.get("profile"): self._price(m.get("profile")) for m in metas}
        return {"runs": views.run_rows(metas, states, now, prices, live),
                "pipelines": views.pipeline_rows(ps.load_all(self.project), now)}

    def overview(self) -> dict:
        now = self.clock()
        if self._runs_cache is None or now - self._runs_cache[0] >= self.runs_every:
            self._runs_cache = (now, self._read_runs())
        runs = self._runs_cache[1]
        with self.lock:
            inst = dict(self._instances)
        running = {r["profile"] for r in runs["runs"] if r["state"] == "running"}
        watched = views.watched_instances(inst.get("by_profile") or {}, running, runs["pipelines"])
        return {"project": self.project.name, "now": now, "runs": runs["runs"], "pipelines": runs["pipelines"],
                "instances": views.instance_rows(inst["rows"], inst.get("fs") or {}, watched),
                "instances_error": inst["error"], "instances_loaded": inst["loaded"]}

    # -- one run's live feed -----------------------------------------------------------------------------------------
    def feed(self, run_id: str) -> Optional[views.RunFeed]:
        """The run's feed, its follower started (or restarted after a failure) if need be; None for no such run."""
        with self.lock:
            f = self.followers.get(run_id)
        if f is not None and not (f.failed_at and self.clock() - f.failed_at > RETRY_S):
            return f.feed
        from ..jobs import plan as core

        meta = next((m for m in core.local_runs(None, self.project) if m["run_id"] == run_id), None)
        if meta is None:
            return f.feed if f else None
        return self._ensure(meta, restart=f is not None).feed

    def _ensure(self, meta: dict, restart: bool = False) -> _Follower:
        rid = meta["run_id"]
        with self.lock:
            f = self.followers.get(rid)
            if f is not None and not restart:
                return f
            if f is None:
                f = self.followers[rid] = _Follower(views.RunFeed(rid, profile=meta.get("profile"),
                                                                  hosts=max(1, len(meta.get("nodes") or [])),
                                                                  redact=_redact))
            f.failed_at = None
            f.thread = threading.Thread(target=self._follow, args=(meta, f), name=f"gpuops-dashboard-{rid}",
                                        daemon=True)
            self.streams_started += 1
        f.thread.start()
        return f

    def _record(self, feed: views.RunFeed, ev: dict, dash=None) -> None:
        with self.lock:
            feed.record(ev, self.clock(), dash)

    def _follow(self, meta: dict, f: _Follower) -> None:
        """`gpuops watch` of the run, into its feed: one stream on its host (a fleet: host 0's stream and a GPU sample
        stream on each other host), reconnecting as watch does."""
        from ..cloud.guardrail import ActivityNoter
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
            dash = w.Dashboard(meta, price_per_hour=price, log_lines=views.LOG_LINES, host=prof.rank)
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
                actions.follow(prof, self.out, self.project, meta, dash, lines=views.LOG_LINES, samples=True,
                               interval=self.interval, on_event=handler)
            self._record(feed, {"type": "end"}, dash)
            f.done = True
        except GpuopsError as exc:
            f.failed_at = self.clock()
            self._record(feed, {"type": "lost", "error": exc.message})
        except Exception as exc:  # a follower's failure is shown on its page, never a crashed dashboard
            f.failed_at = self.clock()
            self._record(feed, {"type": "lost", "error": f"{type(exc).__name__}: {exc}"})
