"""The launch requests of `up`: a ledger record before each (names checked against other bring-ups), one launch
per launch slot across processes, capacity waited for, a refused or lost answer judged (adopted by its launch id),
the instance waited for until active; `reclaim_unwritten` ends what a cut-off bring-up launched."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

from ..errors import GpuopsError, ExitCode, UsageError
from . import decisions as d
from .api import Instance, LambdaError
from .ledger import FAILED, LAUNCHED, LAUNCHING, TERMINATED, Ledger, Record
from .instances import BringUpFailed, Context, MAX_TRANSIENT_LAUNCH_FAILURES, UpSpec, _terminate_confirmed, owner_alive
from .managed import profile_file


def _name_taken(name: str, others: list[Record]) -> Optional[str]:
    """Why profile name NAME cannot be launched under (open launch records of another bring-up), or None."""
    if not others:
        return None
    r = others[0]
    what = f"instance {r.instance_id}" if r.instance_id else "its launch request may have created an instance"
    if owner_alive(r):
        return (f"profile name '{name}' is taken: gpuops process {r.pid} is launching it right now "
                f"(launch {r.launch_id}, {what})")
    return (f"profile name '{name}' still has an open launch {r.launch_id} ({r.state}, {what}) whose bring-up was cut "
            "off before it finished: it may be billing")


def _check_name_free(name: str) -> None:
    from ..profiles.model import available

    f = profile_file(name)
    other = available(Path.cwd()).get(name)
    if other is not None and other.resolve() != f.resolve():
        raise UsageError(f"a profile named '{name}' already exists ({other}); gpuops up writes {f}, which it would "
                         "shadow", hint="pick another NAME")
    if not f.is_file():
        return
    from ..profiles.model import load_profile

    try:
        prof = load_profile(f)
    except GpuopsError:
        raise UsageError(f"a profile named '{name}' already exists ({f}) and is not valid; gpuops up will not overwrite it")
    if prof.cloud is None:
        raise UsageError(f"a profile named '{name}' already exists ({f}) and is not managed by gpuops up",
                         hint="pick another NAME")
    if prof.cloud.state == "active":
        raise UsageError(f"profile '{name}' already has instance {prof.cloud.instance_id}",
                         hint=f"gpuops down {name} first, or pick another NAME")


def _check_launches_free(name: str, ledger: Ledger) -> None:
    why = _name_taken(name, [r for r in ledger.records() if r.profile == name and r.open])
    if why:
        raise UsageError(why, hint=f"`gpuops ls` shows it; `gpuops down {name}` ends it, or pick another NAME")


def reclaim_unwritten(ctx: Context, profile: str) -> list[str]:
    """Instances an earlier bring-up of `profile` launched but never wrote the profile for (its process died between
    the launch and the profile: a crash, a kill, a closed laptop), found by their open ledger records (and a launch
    still `launching`, by its tag): terminated, confirmed, and their records closed. Returns their ids. Only for a
    caller that owns the name (`gpuops run --resume`: the run's own profile)."""
    found = []
    for rec in ctx.ledger.open_for_profile(profile):
        if owner_alive(rec):
            raise UsageError(f"gpuops process {rec.pid} is bringing up '{profile}' right now (launch {rec.launch_id})",
                             hint="let it finish, or stop it first")
        iid = rec.instance_id
        if iid is None:
            inst = adopt_launch(ctx, rec.launch_id, attempts=1)
            if inst is None:  # nothing carries its tag: if an instance appears later, its tags name it and its TTL
                ctx.ledger.update(rec.launch_id, state=FAILED, ended_at=ctx.clock(),
                                  note="cut off in flight; no instance carries its launch id")
                continue
            iid = inst.id
            ctx.ledger.update(rec.launch_id, instance_id=iid, state=LAUNCHED, launched_at=ctx.clock())
        found.append((rec.launch_id, iid))
    if not found:
        return []
    ids = [iid for _, iid in found]
    ctx.out.warn(f"an earlier bring-up of '{profile}' was cut off before writing its profile: terminating "
                 f"instance{'s' if len(ids) > 1 else ''} {', '.join(ids)}")
    _terminate_confirmed(ctx, ids)
    for launch_id, _ in found:
        ctx.ledger.update(launch_id, state=TERMINATED, ended_at=ctx.clock(), note="reclaimed: no profile written")
    return ids


def _wait_launch_slot(ctx: Context) -> None:
    while True:
        wait = ctx.ledger.claim_launch_slot(ctx.clock(), ctx.launch_interval_s)
        if wait <= 0:
            return
        ctx.sleep(min(wait, ctx.launch_interval_s))


def adopt_launch(ctx: Context, launch_id: str, *, attempts: int = 2) -> Optional[Instance]:
    """After an ambiguous launch failure: the instance that carries our launch id, if the launch did happen.
    More than one (a retried request that both landed): keep the first, terminate the others."""
    for i in range(attempts):
        found = d.adopt(ctx.client.instances(), launch_id)
        if found:
            found.sort(key=lambda x: x.id)
            extra = [x.id for x in found[1:]]
            if extra:
                ctx.out.warn(f"launch {launch_id} created {len(found)} instances; terminating the extra: {', '.join(extra)}")
                ctx.client.terminate(extra)
            return found[0]
        if i + 1 < attempts:
            ctx.sleep(ctx.poll_s)
    return None


def _launch(spec: UpSpec, ctx: Context, want: d.Want, types: dict, key_name: str, launch_id: str, user_data: str,
            state: dict, *, label: str) -> str:
    """One instance: the candidates tried in order across their regions (decisions.next_attempt), each request in a
    launch slot of the ledger and preceded by the record's type, price and region; with --wait-for-capacity, capacity
    re-read with backoff until it runs out. Sets state's `itype` and `region`; returns the instance id."""
    client, out = ctx.client, ctx.out
    wait = {"started": ctx.clock(), "rounds": 0, "transient": 0}
    choice = d.choose(types, want)
    cands = choice.candidates
    cold: set = set()  # (type, region) pairs that answered insufficient-capacity since the last re-read
    tried: list[str] = []
    attempts: list[tuple] = []
    while True:
        nxt = d.next_attempt(cands, cold)
        if nxt is None:
            types, cands = _await_capacity(spec, ctx, want, types, cands, wait, launch_id,
                                           failed=lambda: (tried, d.no_capacity_text(want, cands, choice.excluded,
                                                                                     attempts)))
            cold.clear()
            continue
        cand, region = nxt
        _wait_launch_slot(ctx)
        if state.get("ttl_from_request") and spec.ttl_s:  # the TTL counts from this request (node 0's)
            state["ttl_deadline"] = ctx.clock() + spec.ttl_s
        ctx.ledger.update(launch_id, region=region, instance_type=cand.name,
                          price_cents_per_hour=cand.price_cents_per_hour, state=LAUNCHING,
                          regions_tried=tried + [region], ttl_deadline=state.get("ttl_deadline"))
        tried.append(region)
        attempts.append((cand.name, region))
        out.step(f"launching {cand.name} in {region} (${cand.price_per_hour:.2f}/h)")
        state["in_flight"], state["region"] = True, region
        state["itype"], state["types"] = d.find_type(types, cand.name).type, types  # types: as last read
        try:
            try:
                ids = client.launch(region=region, type_name=cand.name, ssh_key=key_name, name=label[:64],
                                    tags=d.launch_tags(launch_id, spec.name, state.get("ttl_deadline")),
                                    user_data=user_data, file_systems=spec.file_systems or None)
            finally:
                ctx.ledger.launch_answered(ctx.clock())
        except LambdaError as exc:
            if exc.capacity:
                state["in_flight"] = False
                cold.add((cand.name, region))
                after = d.next_attempt(cands, cold)
                out.info(f"no capacity in {region} for {cand.name} ({exc.api_message}); "
                         + (f"trying {after[0].name} in {after[1]}" if after else "no other type or region lists "
                                                                                   "capacity"))
                continue
            adopted = _launch_refused(ctx, exc, launch_id, state, wait)
            if adopted is None:
                continue
            return adopted
        return _launched_ids(ctx, launch_id, ids)


def _await_capacity(spec: UpSpec, ctx: Context, want: d.Want, types: dict, cands: tuple, wait: dict,
                    launch_id: str, *, failed: Callable[[], tuple]) -> tuple:
    """Nothing listed has capacity: fail (the record closed) when --wait-for-capacity has run out, else say on one
    line what is awaited and since when, wait (backing off), and read the types again: (types, candidates)."""
    remaining = wait["started"] + spec.wait_for_capacity_s - ctx.clock()
    if remaining <= 0:
        tried, text = failed()
        ctx.ledger.update(launch_id, state=FAILED, ended_at=ctx.clock(), regions_tried=tried, note="no capacity")
        raise GpuopsError(text, hint="--wait-for-capacity 30m waits for it; gpuops cloud types --available shows what "
                                     "is free now", code=ExitCode.FAILED)
    delay = min(remaining, d.capacity_backoff(wait["rounds"], ctx.rng, ctx.capacity_recheck_s))
    wait["rounds"] += 1
    ctx.out.info(d.waiting_line(want, cands, time.strftime("%H:%M:%S", time.localtime(wait["started"])),
                                ctx.clock() - wait["started"], delay, remaining))
    _tick(spec, "capacity", cands[0].price_per_hour if cands else 0.0)
    ctx.sleep(delay)
    return _reread(ctx, want, types, cands)


def _launch_refused(ctx: Context, exc: LambdaError, launch_id: str, state: dict, wait: dict) -> Optional[str]:
    """A launch request that failed other than for capacity: None to try again (after a 429's or a transient
    failure's wait), the instance id when an ambiguous failure had in fact launched it (found by its tag); raises
    when it cannot go on (the record closed as failed)."""
    out = ctx.out
    if exc.rate_limited:
        state["in_flight"] = False
        delay = max(exc.retry_after or 0.0, ctx.launch_interval_s, 1.0)
        out.info(f"rate limited by the API (HTTP 429); retrying in {delay:.0f}s")
        ctx.sleep(delay)
        return None
    if exc.ambiguous:
        out.warn(f"the launch request failed ambiguously ({exc.message}); looking for the instance by its tag")
        inst = adopt_launch(ctx, launch_id)
        if inst is not None:
            out.info(f"adopted instance {inst.id}: the launch had succeeded")
            return inst.id
    state["in_flight"] = False
    if not exc.ambiguous and not exc.transient:
        ctx.ledger.update(launch_id, state=FAILED, ended_at=ctx.clock(), note=exc.api_code or exc.message)
        if exc.api_code == "instance-operations/launch/file-system-in-wrong-region":
            from .filesystems import fs_error

            raise fs_error(exc) from None
        raise exc
    wait["transient"] += 1
    if wait["transient"] >= MAX_TRANSIENT_LAUNCH_FAILURES:
        ctx.ledger.update(launch_id, state=FAILED, ended_at=ctx.clock(), note="transient failures")
        raise exc
    delay = max(exc.retry_after or 0.0, 2.0 ** wait["transient"])
    out.info(f"retrying the launch in {delay:.0f}s")
    ctx.sleep(delay)
    return None


def _launched_ids(ctx: Context, launch_id: str, ids: list) -> str:
    """The launch answer's instance: none named (found by its tag), or more than one (the others terminated)."""
    if not ids:
        inst = adopt_launch(ctx, launch_id)
        if inst is None:
            raise LambdaError("the launch answer named no instance and none carries our tag")
        return inst.id
    if len(ids) > 1:
        ctx.out.warn(f"the API launched {len(ids)} instances; terminating all but {ids[0]}")
        ctx.client.terminate(ids[1:])
    return ids[0]


def _reread(ctx: Context, want: d.Want, types: dict, cands: tuple) -> tuple:
    """--wait-for-capacity: the instance types read again (their capacity and prices now) and the candidates chosen
    again from them; an empty answer, or one that no longer lists a type named, keeps what was known."""
    fresh = ctx.client.instance_types()
    if not fresh:
        return types, cands
    try:
        again = d.choose(fresh, want).candidates
    except GpuopsError:
        return types, cands
    return (fresh, again) if again else (types, cands)


def _tick(spec: UpSpec, phase: str, price: float) -> None:
    if spec.tick is not None:
        spec.tick({"phase": phase, "price_per_hour": price, "nodes": spec.nodes})


def _wait_active(spec: UpSpec, ctx: Context, instance_id: str, gpus: int, price: float = 0.0) -> Instance:
    start = ctx.clock()
    deadline = start + (spec.timeout_s or d.readiness_deadline(gpus))
    shown, said = None, start
    while True:
        inst = ctx.client.instance(instance_id)
        if inst.status != shown:
            ctx.out.step(f"instance {instance_id}: {inst.status}")
            shown, said = inst.status, ctx.clock()
        elif ctx.clock() - said >= ctx.progress_s:  # a boot takes minutes: never silent that long
            said = ctx.clock()
            ctx.out.step(f"instance {instance_id}: still {inst.status} after {d.format_duration(said - start)} "
                         f"(Lambda boots take a few minutes; giving up in {d.format_duration(deadline - said)}; "
                         f"${price:.2f}/h from the launch on)")
        _tick(spec, "boot", price)
        if inst.status == "active" and inst.ip:
            return inst
        if inst.status in d.DEAD_STATUSES or inst.status == "terminating":
            raise BringUpFailed(f"instance {instance_id} became {inst.status} while booting")
        if ctx.clock() + ctx.poll_s > deadline:
            raise BringUpFailed(f"instance {instance_id} is not active after "
                                f"{d.format_duration(deadline - ctx.events.get('launched_at', deadline))} "
                                f"(status {inst.status})", hint="--timeout raises the limit")
        ctx.sleep(ctx.poll_s)
