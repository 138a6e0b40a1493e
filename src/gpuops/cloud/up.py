"""`gpuops up`: `up(spec, ctx)` brings instances up: preflight (names, key, the price asked), launch (launch.py),
active, the profile written, SSH, the guard, verify; on any failure what was launched is terminated (unless
keep_on_failure). Returns a plain dict for rendering; `ctx.events` has the timings for benchmarks."""
from __future__ import annotations

import os
import socket
import uuid
from dataclasses import replace
from typing import Optional

from ..errors import GpuopsError, HostKeyError, AuthError, ConnectError, ExitCode, UsageError
from . import decisions as d
from .ledger import FAILED, LAUNCHED, LAUNCHING, TERMINATED, Record
from .watchdog import install_guard
from .instances import BringUpFailed, Context, MAX_NODES, NAME_RE, UpSpec, _iso, _terminate
from .keys import ensure_ssh_key, make_host_key, pin_host_key, public_key_of
from .launch import _check_launches_free, _check_name_free, _launch, _name_taken, _tick, _wait_active, adopt_launch
from .managed import _forget_profile, unpin, write_profile


# -- up ----------------------------------------------------------------------------------------------------------
def up(spec: UpSpec, ctx: Context) -> dict:
    """Launch, wait for active, pin the host key, write the profile, wait for SSH, verify. Returns a summary dict.

    `spec.nodes` > 1: a fleet. Lambda launches one instance per request (quantity above 1 is refused) and one
    request per 12 s, so the nodes are launched one after another, the first wherever there is capacity and the others
    in the same region (their private addresses must reach each other); each has its own launch record (written
    before its request, with the profile name, TTL deadline and idle limit; node 0's reserves the name), launch tag
    (with the TTL deadline) and host key. Any node failing ends the bring-up and terminates them all.

    The type: node 0 tries the candidates (decisions.choose: the `--type`s in order, or every type with the `--gpu`
    asked cheapest first, none over `max_price`) across their regions, one launch request per slot of the ledger;
    the other nodes take node 0's type and region."""
    public_line, want, types, choice, attached = _preflight(spec, ctx)
    nodes: list[dict] = []  # per node: launch_id, instance_id, in_flight, region, itype, instance, host_pub, ttl...
    try:  # `nodes` grows as each is recorded, so a failure anywhere below ends every one launched so far
        itype, launched_at0 = _launch_nodes(spec, ctx, want, types, public_line, nodes)
        prof = _activate(spec, ctx, itype, nodes, launched_at0, attached)
        verified, verify_report = _make_ready(spec, ctx, prof, nodes, itype)
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        keep = spec.keep_on_failure and not interrupted
        why = getattr(exc, "reason", None) or ("interrupted" if interrupted else "bring-up failed")
        got = next((st["itype"] for st in nodes if st.get("itype") is not None), None)
        _after_failure(ctx, spec, nodes, got.price_per_hour if got else choice.most_per_hour, keep=keep, why=why)
        raise
    return _up_summary(spec, ctx, itype, nodes, prof, verified, verify_report)


def _launch_nodes(spec: UpSpec, ctx: Context, want: d.Want, types: dict, public_line: str,
                  nodes: list[dict]) -> tuple:
    """Each node recorded (node 0's record reserving the name) before its launch request, then launched; `nodes`
    holds their state as they go. Returns the type launched (the API's InstanceType) and when node 0 was launched."""
    out, n = ctx.out, spec.nodes
    bringup = uuid.uuid4().hex[:16]
    key_name = None
    node_want = want
    first = d.choose(types, want).candidates[0]  # what the record says until a request names another
    launched_at0 = 0.0
    itype = None
    for i in range(n):
        host_priv, host_pub = make_host_key()
        launch_id = uuid.uuid4().hex[:16]
        # the TTL counts from node 0's launch request (set again just before it); the fleet ends together
        ttl_deadline = nodes[0]["ttl_deadline"] if nodes else (ctx.clock() + spec.ttl_s if spec.ttl_s else None)
        st = {"launch_id": launch_id, "instance_id": None, "in_flight": False, "instance": None, "itype": None,
              "host_pub": host_pub, "region": None, "ttl_deadline": ttl_deadline, "ttl_from_request": i == 0}
        rec = Record(launch_id=launch_id, profile=spec.name, instance_type=itype.name if itype else first.name,
                     region=(node_want.regions or ("?",))[0],
                     price_cents_per_hour=itype.price_cents_per_hour if itype else first.price_cents_per_hour,
                     created_at=ctx.clock(), ttl_deadline=ttl_deadline, idle_limit_s=spec.idle_s,
                     node=i if n > 1 else None, bringup=bringup, pid=os.getpid(), host=socket.gethostname())
        nodes.append(st)  # first: an interrupt right after the write below finds (and closes) the record
        if i == 0:  # before any request that could create it, and the name is ours from here
            why = ctx.ledger.reserve(rec, lambda others: _name_taken(spec.name, others))
            if why:
                raise UsageError(why, hint=f"`gpuops ls` shows it; `gpuops down {spec.name}` ends it, or pick "
                                           "another NAME")
        else:
            ctx.ledger.add(rec)
        if key_name is None:
            key_name = ensure_ssh_key(ctx.client, public_line, out)
        label = f"gpuops-{spec.name}" + (f"-{i}" if n > 1 else "")
        st["instance_id"] = _launch(spec, ctx, node_want, types, key_name, launch_id,
                                    d.cloud_config(host_priv, host_pub), st, label=label)
        launched_at = ctx.clock()
        ctx.ledger.update(launch_id, instance_id=st["instance_id"], state=LAUNCHED, launched_at=launched_at)
        _tick(spec, "launched", st["itype"].price_per_hour)
        if i == 0:
            ctx.events["launched_at"] = launched_at
            launched_at0 = launched_at
            itype, types = st["itype"], st["types"]
            # the other nodes: node 0's type, in node 0's region (their private addresses reach each other there)
            node_want = replace(want, types=(itype.name,), gpu=None, regions=(st["region"],))
        out.info(f"launched instance {st['instance_id']} ({itype.name}, {st['region']}; launch {launch_id})"
                 + (f", node {i} of {n}" if n > 1 else "") + "; waiting until it is active")
    return itype, launched_at0


def _activate(spec: UpSpec, ctx: Context, itype, nodes: list[dict], launched_at0: float, attached: dict):
    """Every node active, its host key pinned, the profile written (with the filesystems attached: where node 0's
    record says each is mounted). Returns the profile."""
    out, n = ctx.out, spec.nodes
    ttl_deadline = nodes[0]["ttl_deadline"]
    for st in nodes:
        st["instance"] = _wait_active(spec, ctx, st["instance_id"], itype.gpus, itype.price_per_hour)
    ctx.events["active_at"] = ctx.clock()
    insts = [st["instance"] for st in nodes]
    for st in nodes:
        pin_host_key(st["instance"].ip, 22, st["host_pub"])
    cloud = {"provider": "lambda", "instance_id": insts[0].id, "launch_id": nodes[0]["launch_id"],
             "launched_at": _iso(launched_at0), "ttl_deadline": _iso(ttl_deadline), "idle_limit_s": spec.idle_s,
             "state": "active"}
    if n > 1:
        cloud["nodes"] = [{"instance_id": st["instance"].id, "launch_id": st["launch_id"]} for st in nodes]
    if attached:
        from .filesystems import mount_point

        cloud["filesystems"] = [{"name": name, "id": fs.id, "mount_point": mount_point(fs, insts[0])}
                                for name, fs in attached.items()]
    prof = write_profile(spec.name, insts, spec.key, itype, cloud, user=ctx.ssh_user, template=spec.template,
                         host_keys=[st["host_pub"] for st in nodes])
    for st in nodes:
        out.info(f"instance {st['instance'].id} is active at {st['instance'].ip}; host key pinned "
                 f"({d.fingerprint(st['host_pub'])})")
    out.info(f"profile '{spec.name}' written" + (f" ({n} hosts)" if n > 1 else ""))
    return prof


def _make_ready(spec: UpSpec, ctx: Context, prof, nodes: list[dict], itype) -> tuple[Optional[bool], Optional[dict]]:
    """SSH answering on every node, the on-instance guard if asked, verify unless skipped: (verified, report)."""
    deadline = ctx.clock() + (spec.timeout_s or d.readiness_deadline(itype.gpus))
    for node in prof.nodes():
        _wait_ssh(spec, ctx, node, node.host, deadline=deadline, price=itype.price_per_hour)
    ctx.events["ssh_at"] = ctx.clock()
    if spec.guard_on_instance:
        for node, st in zip(prof.nodes(), nodes):
            install_guard(node, ctx, st["instance"].id, nodes[0]["ttl_deadline"], spec.idle_s)
    if not spec.verify:
        return None, None
    verified, verify_report = _verify(prof, ctx.out)
    ctx.events["verified_at"] = ctx.clock()
    if not verified:
        raise BringUpFailed(f"verify failed on the new instance{'s' if spec.nodes > 1 else ''} "
                            f"{', '.join(st['instance'].id for st in nodes)}",
                            hint="the report above says what is wrong; --keep-on-failure keeps such an "
                                 "instance for inspection, --no-verify skips the check")
    return verified, verify_report


def _up_summary(spec: UpSpec, ctx: Context, itype, nodes: list[dict], prof, verified, verify_report) -> dict:
    price = itype.price_per_hour
    inst = nodes[0]["instance"]
    res = {"profile": spec.name, "profile_file": str(prof.source), "instance_id": inst.id,
           "launch_id": nodes[0]["launch_id"], "ip": inst.ip, "region": inst.region, "instance_type": itype.name,
           "price_per_hour": price, "ttl_deadline": _iso(nodes[0]["ttl_deadline"]), "idle_limit_s": spec.idle_s,
           "verified": verified, "host_key": d.fingerprint(nodes[0]["host_pub"]), "api_calls": ctx.client.total_calls,
           **({"verify": verify_report} if verify_report is not None else {})}
    if spec.nodes > 1:
        res["nodes"] = [{"rank": i, "instance_id": st["instance"].id, "launch_id": st["launch_id"],
                         "ip": st["instance"].ip, "private_ip": st["instance"].private_ip or st["instance"].ip,
                         "host_key": d.fingerprint(st["host_pub"])} for i, st in enumerate(nodes)]
        res["price_per_hour_total"] = round(price * spec.nodes, 4)
    return res


def _preflight(spec: UpSpec, ctx: Context):
    """Before anything is recorded or launched: the name, what may be launched (the types, their prices, the GPU
    asked), the filesystems (the launch kept to their region; a missing one created after asking), the key, and the
    user's yes. Returns (public key line, the Want, the API's types, the Choice, {filesystem name: Filesystem})."""
    if not NAME_RE.match(spec.name):
        raise UsageError(f"not a usable profile name: {spec.name!r}", hint="letters, digits, '-', '_' and '.'")
    if not 1 <= spec.nodes <= MAX_NODES:
        raise UsageError(f"--nodes {spec.nodes}: between 1 and {MAX_NODES}")
    want = d.want_from(types=list(spec.types) or ([spec.type_name] if spec.type_name else []), gpu=spec.gpu,
                       max_price=spec.max_price, regions=spec.regions, template=spec.template)
    _check_name_free(spec.name)
    _check_launches_free(spec.name, ctx.ledger)
    public_line = public_key_of(spec.key)
    types = ctx.client.instance_types()
    if not types:  # `data: null` or an empty map: nothing to check the type or its price against
        raise GpuopsError("the Lambda API listed no instance types at all (GET /instance-types answered no data): "
                          f"gpuops cannot check {want.describe()} or its price, so nothing was launched",
                          hint="try again in a minute; `gpuops cloud types` shows what the API lists")
    attached: dict = {}
    if spec.file_systems:
        from .fs_actions import attach

        region, attached = attach(spec, ctx, types, want)
        want = replace(want, regions=(region,))
    choice = d.choose(types, want)
    problem = d.no_candidate(choice, want)
    if problem is not None:
        raise problem
    if attached and not spec.wait_for_capacity_s and not any(c.regions for c in choice.candidates):
        raise GpuopsError(f"no capacity for {want.describe()} in {want.regions[0]}, the region of filesystem "
                          f"{', '.join(attached)}; nothing was launched",
                          hint="--wait-for-capacity 30m waits for capacity there; `gpuops cloud types --available` "
                               "shows where there is capacity now", code=ExitCode.FAILED)
    question = _launch_question(spec, want, types, choice)
    ctx.out.info(question)
    for name, price, why in choice.excluded:
        ctx.out.info(f"not tried: {name} (${price:.2f}/h): {why}")
    if spec.confirm is not None and not spec.confirm(question + "?"):
        raise GpuopsError("not launched", code=ExitCode.FAILED)
    return public_line, want, types, choice, attached


def _launch_question(spec: UpSpec, want: d.Want, types: dict, choice: d.Choice) -> str:
    """The price line asked before launching: the one type, or the candidates in the order they are tried and the
    most it may cost."""
    where = ", ".join(want.regions) if want.regions else "any region"  # --fs keeps it to the filesystem's region
    n, cands = spec.nodes, choice.candidates
    if len(cands) == 1 and not want.gpu:
        itype = d.find_type(types, cands[0].name).type
        what, price = f"{itype.name} ({itype.description or itype.gpu_description})", itype.price_per_hour
        if n > 1:
            question = (f"launch {n} x {what}, all in one region ({where}), at {n} x ${price:.2f} = "
                        f"${price * n:.2f}/hour")
        else:
            question = f"launch {what} in {where} at ${price:.2f}/hour"
    else:
        order = "in the order given" if want.types else "cheapest first"
        what = (f"{want.describe()}: the first with capacity of {', '.join(c.label() for c in cands)} ({order})")
        most = choice.most_per_hour
        question = (f"launch {n} instances of {what}, all in one region ({where}), at most {n} x ${most:.2f} = "
                    f"${most * n:.2f}/hour" if n > 1 else f"launch {what} in {where}, at most ${most:.2f}/hour")
    if spec.ttl_s:
        question += f", terminated by `gpuops reap` after {d.format_duration(spec.ttl_s)}"
    return question


def _verify(prof, out) -> tuple[bool, Optional[dict]]:
    """gpuops verify on the new host, CUDA error 802 retried for 5 minutes. Under --json the report goes inside up's
    document (one JSON document on stdout)."""
    from ..verify.host import run_fleet_verify, run_verify

    check = run_fleet_verify if prof.is_fleet else run_verify  # a fleet: every host, and the fleet as a whole
    if not out.json_mode:
        return check(prof, out, save=True, retry_802_s=300.0) == 0, None
    import io
    import json

    from ..console import Output

    buf = io.StringIO()
    code = check(prof, Output(json_mode=True, stdout=buf, stderr=out.stderr), save=True, retry_802_s=300.0)
    try:
        return code == 0, json.loads(buf.getvalue())
    except ValueError:
        return code == 0, None


def _banner(ip: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def _wait_ssh(spec: UpSpec, ctx: Context, prof, ip: str, *, deadline: float, price: float = 0.0) -> None:
    """The SSH banner, then a key login with the pinned host key (cloud-init may still be installing the key)."""
    from ..remote import hostkeys
    from ..remote.connection import connect

    out = ctx.out
    start = said = ctx.clock()
    while not _banner(ip, prof.port, 5.0):
        if ctx.clock() > deadline:
            raise BringUpFailed(f"{ip}:{prof.port} does not answer SSH", hint="--timeout raises the limit")
        if ctx.clock() - said >= ctx.progress_s:
            said = ctx.clock()
            out.step(f"waiting for SSH on {ip} for {d.format_duration(said - start)} (giving up in "
                     f"{d.format_duration(deadline - said)})")
        _tick(spec, "ssh", price)
        ctx.sleep(min(2.0, ctx.poll_s))
    while True:
        try:
            with connect(prof, announce=out.info, attempts=1) as remote:
                remote.run("true", timeout=30, check=True)
            return
        except HostKeyError as exc:
            if not spec.trust_new:
                raise HostKeyError(f"{ip} presented a host key other than the one gpuops generated and pinned for "
                                   f"this instance; refusing to connect ({exc.message})",
                                   hint=f"if you trust this host anyway: gpuops up ... --trust-new, or gpuops trust "
                                        f"{prof.name} --reset") from None
            hostkeys.forget(ip, prof.port)
            unpin(spec.name, ip)
            prof = prof.model_copy(update={"host_key_policy": "accept-new", "host_key": None})
            out.warn(f"--trust-new: {ip} did not present the pinned host key; trusting the key it presents now "
                     "(fingerprint below)")
            spec = UpSpec(**{**spec.__dict__, "trust_new": False})
        except (AuthError, ConnectError) as exc:
            if ctx.clock() > deadline:
                raise
            out.step(f"waiting for SSH login on {ip} ({exc.message})")
            _tick(spec, "ssh", price)
            ctx.sleep(min(3.0, ctx.poll_s))


def _after_failure(ctx: Context, spec: UpSpec, nodes: list[dict], price: float, *, keep: bool, why: str) -> None:
    """A failed or interrupted bring-up: terminate what was launched, every node of a fleet in one request (or keep
    it recorded and say so)."""
    out = ctx.out
    ids = []
    try:
        for st in nodes:
            launch_id = st["launch_id"]
            if st["instance_id"] is None and st["in_flight"]:
                inst = adopt_launch(ctx, launch_id, attempts=2)
                if inst is not None:
                    st["instance_id"] = inst.id
                    ctx.ledger.update(launch_id, instance_id=inst.id, state=LAUNCHED, launched_at=ctx.clock())
            if st["instance_id"] is None:
                rec = ctx.ledger.get(launch_id)
                if rec and rec.state == LAUNCHING:
                    if st["in_flight"]:
                        out.warn(f"{why}: launch {launch_id} may still create an instance; it stays in `gpuops ls` "
                                 "until the API shows it gone")
                    else:
                        ctx.ledger.update(launch_id, state=FAILED, ended_at=ctx.clock(), note=why)
                continue
            ids.append(st["instance_id"])
        if not ids:
            return
        if keep:
            out.warn(f"{why}; --keep-on-failure: instance{'s' if len(ids) > 1 else ''} {', '.join(ids)} keep"
                     f"{'' if len(ids) > 1 else 's'} running at ${price:.2f}/h{' each' if len(ids) > 1 else ''} "
                     f"(gpuops down {spec.name} terminates {'them' if len(ids) > 1 else 'it'})")
            return
        out.info(f"{why}: terminating instance{'s' if len(ids) > 1 else ''} {', '.join(ids)}")
        _terminate(ctx, ids)
        for st in nodes:
            if st["instance_id"] is not None:
                ctx.ledger.update(st["launch_id"], state=TERMINATED, ended_at=ctx.clock())
        _forget_profile(spec.name, [st.get("instance") for st in nodes])
        out.info(f"terminated instance{'s' if len(ids) > 1 else ''} {', '.join(ids)}")
    except KeyboardInterrupt:
        out.warn(f"instance(s) {', '.join(ids) or '(launching)'} may be running at ${price:.2f}/h; they stay "
                 "recorded in `gpuops ls`")
    except Exception as exc:
        out.error(f"could not terminate instance(s) {', '.join(ids) or '(launching)'}: {getattr(exc, 'message', exc)}",
                  f"they may be billing ${price:.2f}/h each and stay recorded: `gpuops ls` shows them, "
                  f"`gpuops down {spec.name}` or `gpuops reap` terminates them")
