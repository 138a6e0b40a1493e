"""The dashboard's views as data: pure functions over what `gpuops ls` (cloud.decisions.ls_rows), the run registry
(runs/, runs/pipelines/) and the watch stream already produce. Nothing here talks to a host, the API or the page:
hub.py feeds it, app.py serves what it returns as JSON. A run's own page is feed.py.

- instance_rows: the account's instances with their filesystems, marked "billing, unwatched" when no run follows them;
- run_rows: the project's runs (a row per host of a fleet), pipeline_rows: its `gpuops run` pipelines;
- run_info: what a run is (its GPUs, instance type, host, script and arguments, start, $/h, exit code, cause).
A record is read as data from a file anyone may have edited: a field of the wrong type is left out (or its row says
it cannot be read), never an error for the whole page.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional

from .feed import ENDED

LIVE_STATUSES = ("booting", "active", "unhealthy")  # billing


def num(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def text(v: Any) -> Optional[str]:
    return v if isinstance(v, str) else None


def as_dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def ending_of(*records: Any) -> Optional[dict]:
    """The cause of a run's end (issue 35's `ending`: cause, title, evidence, fix, source) from the first record that
    has one, each field checked; None when none says."""
    for rec in records:
        e = as_dict(as_dict(rec).get("ending"))
        if text(e.get("title")) or text(e.get("cause")):
            return {"cause": text(e.get("cause")), "title": text(e.get("title")) or text(e.get("cause")),
                    "evidence": [x for x in e.get("evidence") or [] if isinstance(x, str)]
                    if isinstance(e.get("evidence"), list) else [],
                    "fix": text(e.get("fix")), "source": text(e.get("source"))}
    return None


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


def instance_rows(ls_rows: list[dict], file_systems: dict[str, list[str]], watched: set[str], *,
                  names: Optional[dict[str, str]] = None, first_seen: Optional[dict[str, float]] = None,
                  now: Optional[float] = None) -> list[dict]:
    """ls_rows (decisions.ls_rows) with each instance's filesystems and whether it bills with no run following it.
    names: the API's name of each instance (shown where gpuops did not launch it); first_seen: when a dashboard of
    this project first saw each one, its uptime and cost where gpuops has no launch time (`since_seen`: at least)."""
    names, first_seen = names or {}, first_seen or {}
    out = []
    for r in ls_rows:
        iid = r.get("id")
        billing = r.get("status") in LIVE_STATUSES
        follows = bool(iid) and (iid in watched)
        uptime, cost, since_seen = r.get("uptime_s"), r.get("cost_so_far"), False
        if billing and uptime is None and now is not None and first_seen.get(iid) is not None:
            uptime, since_seen = max(0.0, now - first_seen[iid]), True
            price = num(r.get("price_per_hour"))
            cost = round(uptime / 3600.0 * price, 2) if price is not None else None
        out.append({"id": iid, "name": r.get("profile") or names.get(iid), "type": r.get("type"),
                    "region": r.get("region"), "status": r.get("status"), "uptime_s": uptime,
                    "since_seen": since_seen, "price_per_hour": r.get("price_per_hour"), "cost_so_far": cost,
                    "ttl_left_s": r.get("ttl_left_s"), "idle_left_s": r.get("idle_left_s"),
                    "managed": bool(r.get("managed")), "file_systems": list(file_systems.get(iid) or []) if iid else [],
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
             live: Optional[dict[str, dict]] = None, *, seen: Optional[dict[str, float]] = None,
             endings: Optional[dict[str, dict]] = None) -> list[dict]:
    """The project's runs, newest first, a row per host of a fleet (`host`: its rank; None for a one-host run).
    states: run id -> the last known state (runs/<id>/state.json, a RunInfo's to_json); live: run id -> what a
    stream following it knows now (views' RunFeed.summary()), which wins while its host answers; seen: run id -> the
    last time any follower heard from it (the metrics database); endings: run id -> why it ended.

    Elapsed time and cost grow only while a follower sees the run alive: a run with no recorded end that nothing
    follows is "unknown", its elapsed time up to when it was last seen (a 5-day-old record is not 5 days of cost);
    one whose follower cannot reach its host is "unreachable", with no GPU figure (no stale 99 %)."""
    live, seen, endings = live or {}, seen or {}, endings or {}
    rows = []
    for m in metas:
        try:
            rows.extend(_run_rows(m, as_dict(states.get(m.get("run_id"))), now, prices, as_dict(live.get(m["run_id"])),
                                  seen.get(m["run_id"]), endings.get(m["run_id"])))
        except Exception as exc:  # a record of the wrong shape: its row says so, the page goes on
            rows.append({"run_id": str(m.get("run_id")), "profile": None, "script": None, "state": "unreadable",
                         "error": f"its record cannot be read ({type(exc).__name__}: {exc})", "exit_code": None,
                         "cause": None, "started": None, "elapsed_s": None, "cost": None, "progress": None,
                         "signals": [], "followed": False, "host": None, "address": None, "util": None,
                         "seen_at": None})
    return rows


def _run_rows(m: dict, st: dict, now: float, prices: dict, lv: dict, seen: Optional[float],
              ending: Optional[dict]) -> list[dict]:
    rid = m["run_id"]
    started = num(st.get("started")) or num(m.get("started_ts"))
    recorded = text(st.get("state"))
    live_state = text(lv.get("state"))
    reachable = bool(lv) and lv.get("reachable", True)
    last = max([x for x in (num(seen), num(lv.get("seen_at"))) if x is not None], default=None)
    if recorded in ENDED or live_state in ENDED:
        state = live_state if live_state in ENDED else recorded
        end = num(st.get("ended")) or last
    elif reachable and live_state:
        state, end = live_state, now
    else:
        state, end = ("unreachable" if lv.get("unreachable") else "unknown"), last
    elapsed = max(0.0, end - started) if started is not None and end is not None else None
    nodes = [n for n in m.get("nodes") or [] if isinstance(n, dict)] if isinstance(m.get("nodes"), list) else []
    price = num(prices.get(text(m.get("profile")) or ""))
    price = price if price is not None else num(m.get("price_per_hour"))  # the profile gone: the price at launch
    cost = round(elapsed / 3600.0 * price * max(1, len(nodes)), 2) if elapsed is not None and price is not None else None
    code = st.get("exit_code") if isinstance(st.get("exit_code"), int) else None
    base = {"run_id": rid, "profile": text(m.get("profile")), "script": text(m.get("script")), "state": state,
            "exit_code": code, "cause": (ending or {}).get("title"), "started": started, "elapsed_s": elapsed,
            "cost": cost, "progress": lv.get("progress") if reachable or state in ENDED else None,
            "signals": [x for x in lv.get("signals") or [] if isinstance(x, str)], "followed": bool(lv),
            "seen_at": last, "link": lv.get("link")}
    hosts = as_dict(lv.get("hosts")) if reachable else {}
    if len(nodes) < 2:
        return [{**base, "host": None, "address": text(m.get("host")), "util": hosts.get(0)}]
    return [{**base, "host": rank, "address": text(node.get("host")), "util": hosts.get(rank)}
            for rank, node in enumerate(nodes)]


def pipeline_rows(records: list, now: float) -> list[dict]:
    """`gpuops run` records (pipeline.stages.Record): stage, elapsed, cost, last checkpoint, outcome."""
    from ..pipeline import stages as ps

    out = []
    for rec in records:
        try:
            out.append(_pipeline_row(rec, now, ps))
        except Exception as exc:  # a record of the wrong shape: its row says so
            out.append({"id": str(getattr(rec, "id", "?")), "profile": None, "run_id": None, "outcome": "unreadable",
                        "stage": None, "stage_label": f"its record cannot be read ({type(exc).__name__})",
                        "nodes": 1, "elapsed_s": None, "cost": None, "checkpoint": None, "checkpoint_step": None,
                        "instance_ids": [], "prep": None, "job_state": None, "stop_reason": None, "lost": None})
    return out


def _pipeline_end(rec, now: float, ps) -> float:
    """Now while the pipeline runs; once it is over, when its last stage ended (its elapsed time stops growing)."""
    if rec.outcome == ps.RUNNING:
        return now
    ends = [num(s.ended) for s in rec.stages.values() if num(s.ended) is not None]
    ends += [e for e in [num(as_dict(as_dict(rec.prep).get("stage")).get("ended"))] if e is not None]
    return max(ends) if ends else rec.created


def prep_cell(rec, now: float) -> Optional[dict]:
    """`gpuops run --prep`: the preparation as the pipelines table shows it (state, its instances' cost, the type its
    instance had, what it said), and its instances still billing; None without one."""
    from ..pipeline import prepplan as pp

    prep = as_dict(rec.prep)
    if not prep:
        return None
    st = as_dict(prep.get("stage"))
    running = st.get("started") is not None and st.get("ended") is None
    state = "preparing" if running else (text(prep.get("state")) or ("interrupted" if prep.get("interrupted") else
                                                                     "to do"))
    live = [i for inst in prep.get("instances") or [] if isinstance(inst, dict) and inst.get("ended") is None
            for i in inst.get("ids") or []]
    return {"state": state, "cost": round(pp.spend(prep, now), 2), "type": text(prep.get("type_used")),
            "detail": text(st.get("detail")), "instance_ids": live}


def _pipeline_row(rec, now: float, ps) -> dict:
    prep = prep_cell(rec, now)
    current = "prep" if prep and prep["state"] == "preparing" else next(
        (name for name in ps.STAGES + ("recover",)
         if (s := rec.stages.get(name)) is not None and s.started is not None and s.ended is None), None)
    stage = current or (None if rec.outcome != ps.RUNNING else ps.next_stage(rec))
    ck = as_dict(rec.checkpoint)
    return {"id": rec.id, "profile": rec.profile, "run_id": rec.run_id, "outcome": rec.outcome,
            "stage": stage, "stage_label": "preparation" if stage == "prep" else ps.LABELS.get(stage or "", stage),
            "nodes": rec.nodes,
            "elapsed_s": max(0.0, _pipeline_end(rec, now, ps) - rec.created) if num(rec.created) else None,
            "cost": round(ps.spend(rec, now), 2),
            "checkpoint": (ck.get("local") or ck.get("name")) if ck else None,
            "checkpoint_step": ck.get("step") if ck else None,
            "instance_ids": list(as_dict(rec.instance).get("ids") or []) + (prep["instance_ids"] if prep else []),
            "prep": prep, "job_state": rec.job_state, "stop_reason": rec.stop_reason, "lost": rec.lost}


# -- what a run is -----------------------------------------------------------------------------------------------------
def run_info(meta: dict, state: dict, *, profile: Optional[dict] = None, pipeline: Optional[dict] = None,
             ending: Optional[dict] = None, gpus: Optional[list[str]] = None, log_local: bool = False) -> dict:
    """The run page's header: its GPUs (the names its samples gave, or the instance type), instance type, host,
    script and arguments, start, $/h (per host, and the run's), exit code, cause of its end, its pipeline."""
    profile, pipeline = as_dict(profile), as_dict(pipeline)
    nodes = [n for n in meta.get("nodes") or [] if isinstance(n, dict)] if isinstance(meta.get("nodes"), list) else []
    price = num(meta.get("price_per_hour"))
    price = price if price is not None else num(profile.get("price_per_hour"))
    names = sorted({g for g in gpus or [] if g})
    counts = {g: (gpus or []).count(g) for g in names}
    args = meta.get("args") if isinstance(meta.get("args"), list) else []
    return {"run_id": meta.get("run_id"), "name": text(meta.get("name")), "profile": text(meta.get("profile")),
            "script": text(meta.get("script")), "args": [str(a) for a in args],
            "host": text(meta.get("host")), "hosts": [text(n.get("host")) for n in nodes],
            "instance_type": text(profile.get("instance_type")) or text(pipeline.get("instance_type")) or None,
            "gpus": [f"{counts[g]} × {g}" for g in names],
            "started": num(state.get("started")) or num(meta.get("started_ts")), "ended": num(state.get("ended")),
            "price_per_hour": price, "price_total": price * max(1, len(nodes)) if price is not None else None,
            "state": text(state.get("state")),
            "exit_code": state.get("exit_code") if isinstance(state.get("exit_code"), int) else None,
            "ending": ending, "pipeline": text(pipeline.get("id")), "log_local": log_local,
            "preparation": text(as_dict(as_dict(pipeline.get("prep")).get("stage")).get("detail")),
            "git_commit": text(meta.get("git_commit"))}
