"""The cloud sequences: up, down, reap, as named steps over the API client and the ledger.

`up(spec, ctx)` and `down(name, ctx)` are the entry points other commands call (a future `gpuops run` too): they
print progress through `ctx.out`, return plain dicts for rendering, and raise gpuops errors. Money rule: anything that
may leave a billable instance running is in the ledger before the request that could create it.
"""
from __future__ import annotations

import os
import random
import re
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from ..errors import GpuopsError, HostKeyError, AuthError, ConnectError, ExitCode, UsageError
from . import decisions as d
from .api import Client, Instance, LambdaError
from .ledger import FAILED, LAUNCHED, LAUNCHING, TERMINATED, Ledger, Record

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
TERMINATE_CONFIRM_S = 120.0
MAX_TRANSIENT_LAUNCH_FAILURES = 6


class BringUpFailed(GpuopsError):
    code = ExitCode.FAILED


@dataclass
class Context:
    """The seams: the client, the ledger, the clock and the output. Timing knobs default to Lambda's limits."""

    client: Client
    out: object
    ledger: Ledger = field(default_factory=Ledger)
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    rng: Callable[[], float] = random.random
    poll_s: float = d.MIN_POLL_S
    launch_interval_s: float = d.LAUNCH_INTERVAL_S
    capacity_recheck_s: tuple = d.CAPACITY_RECHECK_S
    api_key: object = None  # Secret, only for --guard on-instance
    ssh_user: str = "ubuntu"  # Lambda's images; an emulator may log in as another user
    events: dict = field(default_factory=dict)  # timings for benchmarks: launched_at, active_at, ssh_at, verified_at


def make_context(out, *, with_key: bool = False, project_dir: Path | None = None) -> Context:
    """The Context every cloud command uses: the API key (credentials.py), the base URL, the ledger. Against anything but
    Lambda's own service (the emulator, tests), GPUOPS_CLOUD_POLL_S, GPUOPS_CLOUD_LAUNCH_INTERVAL_S,
    GPUOPS_CLOUD_CAPACITY_RECHECK_S and GPUOPS_CLOUD_BACKOFF_S may shorten the waits; against Lambda they are ignored.
    with_key: keep the key in the context (only --guard on-instance sends it anywhere but the API)."""
    from .credentials import base_url, is_production, load_api_key

    key, _source = load_api_key(project_dir)
    url = base_url()
    client = Client(key, url)
    client.on_retry = lambda exc, delay: out.step(f"{exc.message}; retrying in {delay:.1f}s")
    ctx = Context(client=client, out=out, api_key=key if with_key else None)
    if not is_production(url):
        env = os.environ
        if env.get("GPUOPS_CLOUD_POLL_S"):
            ctx.poll_s = float(env["GPUOPS_CLOUD_POLL_S"])
        if env.get("GPUOPS_CLOUD_LAUNCH_INTERVAL_S"):
            ctx.launch_interval_s = float(env["GPUOPS_CLOUD_LAUNCH_INTERVAL_S"])
        if env.get("GPUOPS_CLOUD_CAPACITY_RECHECK_S"):
            v = float(env["GPUOPS_CLOUD_CAPACITY_RECHECK_S"])
            ctx.capacity_recheck_s = (v, v)
        if env.get("GPUOPS_CLOUD_SSH_USER"):
            ctx.ssh_user = env["GPUOPS_CLOUD_SSH_USER"]
        if env.get("GPUOPS_CLOUD_BACKOFF_S"):
            client.backoff_base = float(env["GPUOPS_CLOUD_BACKOFF_S"])
    return ctx


@dataclass
class UpSpec:
    name: str
    type_name: str
    key: Path
    regions: list = field(default_factory=list)
    wait_for_capacity_s: float = 0.0
    ttl_s: Optional[float] = None
    idle_s: Optional[float] = None
    file_systems: list = field(default_factory=list)
    verify: bool = True
    keep_on_failure: bool = False
    timeout_s: Optional[float] = None
    trust_new: bool = False
    guard_on_instance: bool = False
    confirm: Optional[Callable[[str], bool]] = None  # asked with the price line; False: nothing is launched


def profile_file(name: str) -> Path:
    from ..paths import config_dir

    return config_dir() / "profiles" / f"{name}.yaml"


def _iso(ts: Optional[float]) -> Optional[str]:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds") if ts is not None else None


# -- keys --------------------------------------------------------------------------------------------------------
def public_key_of(key: Path) -> str:
    """The OpenSSH public line of a private key file (its .pub if present, else derived)."""
    from ..remote.connection import check_key_file

    check_key_file(key)
    pub = Path(str(key) + ".pub")
    if pub.is_file():
        line = pub.read_text().strip()
        if line:
            return line
    import paramiko

    try:
        k = paramiko.PKey.from_path(str(key))
    except Exception as exc:
        raise AuthError(f"cannot read the key {key}: {exc}") from exc
    return f"{k.get_name()} {k.get_base64()}"


def ensure_ssh_key(client: Client, public_line: str, out) -> str:
    """The account's name for this key, registering it as gpuops-<fingerprint> when its content is not there."""
    for k in client.ssh_keys():
        if d.same_key(k.public_key, public_line):
            return k.name
    name = d.ssh_key_name(public_line)
    client.add_ssh_key(name, " ".join(public_line.split()[:2]) + " gpuops")
    out.info(f"registered SSH key {name} ({d.fingerprint(public_line)}) on the Lambda account")
    return name


def make_host_key() -> tuple[str, str]:
    """A fresh ed25519 host key for the instance: (OpenSSH private PEM, public line)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    k = Ed25519PrivateKey.generate()
    priv = k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                           serialization.NoEncryption()).decode()
    pub = k.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return priv, pub


class _PubKey:
    """What hostkeys.record needs of a key."""

    def __init__(self, line: str):
        self._type, self._b64 = d.key_blob(line)

    def get_name(self) -> str:
        return self._type

    def get_base64(self) -> str:
        return self._b64


def pin_host_key(ip: str, port: int, public_line: str) -> None:
    from ..remote import hostkeys

    hostkeys.forget(ip, port)  # Lambda recycles IPs: an old pin for this address belongs to another machine
    hostkeys.record(ip, port, _PubKey(public_line))


# -- up ----------------------------------------------------------------------------------------------------------
def up(spec: UpSpec, ctx: Context) -> dict:
    """Launch, wait for active, pin the host key, write the profile, wait for SSH, verify. Returns a summary dict."""
    out, client = ctx.out, ctx.client
    public_line, avail = _preflight(spec, ctx)
    itype = avail.type
    price = itype.price_per_hour
    key_name = ensure_ssh_key(client, public_line, out)
    host_priv, host_pub = make_host_key()
    launch_id = uuid.uuid4().hex[:16]
    now = ctx.clock()
    rec = Record(launch_id=launch_id, profile=spec.name, instance_type=itype.name, region=(spec.regions or ["?"])[0],
                 price_cents_per_hour=itype.price_cents_per_hour, created_at=now,
                 ttl_deadline=None, idle_limit_s=spec.idle_s)
    ctx.ledger.add(rec)  # before any request that could create an instance
    state = {"instance_id": None, "in_flight": False, "instance": None}
    try:
        state["instance_id"] = _launch(spec, ctx, avail, key_name, launch_id, d.cloud_config(host_priv, host_pub), state)
        launched_at = ctx.clock()
        ttl_deadline = launched_at + spec.ttl_s if spec.ttl_s else None
        ctx.ledger.update(launch_id, instance_id=state["instance_id"], state=LAUNCHED, launched_at=launched_at,
                          ttl_deadline=ttl_deadline)
        ctx.events["launched_at"] = launched_at
        out.info(f"launched instance {state['instance_id']} (launch {launch_id}); waiting until it is active")
        inst = _wait_active(spec, ctx, state["instance_id"], itype.gpus)
        state["instance"] = inst
        ctx.events["active_at"] = ctx.clock()
        pin_host_key(inst.ip, 22, host_pub)
        cloud = {"provider": "lambda", "instance_id": inst.id, "launch_id": launch_id, "launched_at": _iso(launched_at),
                 "ttl_deadline": _iso(ttl_deadline), "idle_limit_s": spec.idle_s, "state": "active"}
        prof = write_profile(spec.name, inst, spec.key, itype, cloud, user=ctx.ssh_user)
        out.info(f"instance {inst.id} is active at {inst.ip}; host key pinned ({d.fingerprint(host_pub)}); "
                 f"profile '{spec.name}' written")
        _wait_ssh(spec, ctx, prof, inst.ip, deadline=ctx.clock() + (spec.timeout_s or d.readiness_deadline(itype.gpus)))
        ctx.events["ssh_at"] = ctx.clock()
        if spec.guard_on_instance:
            install_guard(prof, ctx, inst.id, ttl_deadline, spec.idle_s)
        verified = verify_report = None
        if spec.verify:
            verified, verify_report = _verify(prof, out)
            ctx.events["verified_at"] = ctx.clock()
            if not verified:
                raise BringUpFailed(f"verify failed on the new instance {inst.id}",
                                    hint="the report above says what is wrong; --keep-on-failure keeps such an "
                                         "instance for inspection, --no-verify skips the check")
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        keep = spec.keep_on_failure and not interrupted
        _after_failure(ctx, spec, launch_id, state, price, keep=keep, interrupted=interrupted)
        raise
    return {"profile": spec.name, "profile_file": str(prof.source), "instance_id": inst.id, "launch_id": launch_id,
            "ip": inst.ip, "region": inst.region, "instance_type": itype.name, "price_per_hour": price,
            "ttl_deadline": _iso(ttl_deadline), "idle_limit_s": spec.idle_s, "verified": verified,
            "host_key": d.fingerprint(host_pub), "api_calls": ctx.client.total_calls,
            **({"verify": verify_report} if verify_report is not None else {})}


def _preflight(spec: UpSpec, ctx: Context):
    """Before anything is recorded or launched: the name, the key, the type, the price (and the user's yes)."""
    if not NAME_RE.match(spec.name):
        raise UsageError(f"not a usable profile name: {spec.name!r}", hint="letters, digits, '-', '_' and '.'")
    _check_name_free(spec.name)
    public_line = public_key_of(spec.key)
    types = ctx.client.instance_types()
    avail = types.get(spec.type_name)
    if avail is None:
        import difflib

        close = difflib.get_close_matches(spec.type_name, list(types), n=3)
        raise UsageError(f"unknown instance type {spec.type_name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""),
                         hint="gpuops cloud types lists them")
    itype = avail.type
    where = ", ".join(spec.regions) if spec.regions else "any region"
    question = (f"launch {itype.name} ({itype.description or itype.gpu_description}) in {where} at "
                f"${itype.price_per_hour:.2f}/hour")
    if spec.ttl_s:
        question += f", terminated by `gpuops reap` after {d.format_duration(spec.ttl_s)}"
    ctx.out.info(question)
    if spec.confirm is not None and not spec.confirm(question + "?"):
        raise GpuopsError("not launched", code=ExitCode.FAILED)
    return public_line, avail


def _verify(prof, out) -> tuple[bool, Optional[dict]]:
    """gpuops verify on the new host, CUDA error 802 retried for 5 minutes. Under --json the report goes inside up's
    document (one JSON document on stdout)."""
    from ..verify import run_verify

    if not out.json_mode:
        return run_verify(prof, out, save=True, retry_802_s=300.0) == 0, None
    import io
    import json

    from ..console import Output

    buf = io.StringIO()
    code = run_verify(prof, Output(json_mode=True, stdout=buf, stderr=out.stderr), save=True, retry_802_s=300.0)
    try:
        return code == 0, json.loads(buf.getvalue())
    except ValueError:
        return code == 0, None


def _check_name_free(name: str) -> None:
    from ..profiles import available

    f = profile_file(name)
    other = available(Path.cwd()).get(name)
    if other is not None and other.resolve() != f.resolve():
        raise UsageError(f"a profile named '{name}' already exists ({other}); gpuops up writes {f}, which it would "
                         "shadow", hint="pick another NAME")
    if not f.is_file():
        return
    from ..profiles import load_profile

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


def _launch(spec: UpSpec, ctx: Context, avail, key_name: str, launch_id: str, user_data: str, state: dict) -> str:
    client, out = ctx.client, ctx.out
    deadline = ctx.clock() + spec.wait_for_capacity_s
    cold: set[str] = set()
    transient = 0
    tried: list[str] = []
    while True:
        order = d.launch_order(avail.regions, spec.regions)
        region = d.next_region(order, cold)
        if region is None:
            remaining = deadline - ctx.clock()
            want = ", ".join(spec.regions) if spec.regions else "any region"
            if remaining <= 0:
                ctx.ledger.update(launch_id, state=FAILED, ended_at=ctx.clock(), regions_tried=tried,
                                  note="no capacity")
                raise GpuopsError(f"no capacity for {avail.type.name} in {want}"
                                  + (f" (tried {', '.join(tried)})" if tried else " (none listed)"),
                                  hint="--wait-for-capacity 30m waits for it; gpuops cloud types --available shows "
                                       "what is free now", code=ExitCode.FAILED)
            delay = min(remaining, d.capacity_recheck_delay(ctx.rng, ctx.capacity_recheck_s))
            out.info(f"waiting for capacity: {avail.type.name} in {want}; checking again in {delay:.0f}s "
                     f"({d.format_duration(remaining)} left)")
            ctx.sleep(delay)
            fresh = client.instance_types().get(avail.type.name)
            avail = fresh or avail
            cold.clear()
            continue
        _wait_launch_slot(ctx)
        ctx.ledger.update(launch_id, region=region, state=LAUNCHING, regions_tried=tried + [region])
        tried.append(region)
        out.step(f"launching {avail.type.name} in {region}")
        state["in_flight"] = True
        try:
            ids = client.launch(region=region, type_name=avail.type.name, ssh_key=key_name,
                                name=f"gpuops-{spec.name}", tags=d.launch_tags(launch_id, spec.name),
                                user_data=user_data, file_systems=spec.file_systems or None)
        except LambdaError as exc:
            if exc.capacity:
                state["in_flight"] = False
                cold.add(region)
                out.info(f"no capacity in {region} ({exc.api_message}); trying the next region")
                continue
            if exc.rate_limited:
                state["in_flight"] = False
                delay = max(exc.retry_after or 0.0, ctx.launch_interval_s, 1.0)
                out.info(f"rate limited by the API (HTTP 429); retrying in {delay:.0f}s")
                ctx.sleep(delay)
                continue
            if exc.ambiguous:
                out.warn(f"the launch request failed ambiguously ({exc.message}); looking for the instance by its tag")
                inst = adopt_launch(ctx, launch_id)
                if inst is not None:
                    out.info(f"adopted instance {inst.id}: the launch had succeeded")
                    return inst.id
                state["in_flight"] = False
            elif exc.transient:
                state["in_flight"] = False
            else:
                state["in_flight"] = False
                ctx.ledger.update(launch_id, state=FAILED, ended_at=ctx.clock(), note=exc.api_code or exc.message)
                raise
            transient += 1
            if transient >= MAX_TRANSIENT_LAUNCH_FAILURES:
                ctx.ledger.update(launch_id, state=FAILED, ended_at=ctx.clock(), note="transient failures")
                raise
            delay = max(exc.retry_after or 0.0, 2.0 ** transient)
            out.info(f"retrying the launch in {delay:.0f}s")
            ctx.sleep(delay)
            continue
        if not ids:
            inst = adopt_launch(ctx, launch_id)
            if inst is None:
                raise LambdaError("the launch answer named no instance and none carries our tag")
            return inst.id
        if len(ids) > 1:
            out.warn(f"the API launched {len(ids)} instances; terminating all but {ids[0]}")
            client.terminate(ids[1:])
        return ids[0]


def _wait_active(spec: UpSpec, ctx: Context, instance_id: str, gpus: int) -> Instance:
    deadline = ctx.clock() + (spec.timeout_s or d.readiness_deadline(gpus))
    shown = None
    while True:
        inst = ctx.client.instance(instance_id)
        if inst.status != shown:
            ctx.out.step(f"instance {instance_id}: {inst.status}")
            shown = inst.status
        if inst.status == "active" and inst.ip:
            return inst
        if inst.status in d.DEAD_STATUSES or inst.status == "terminating":
            raise BringUpFailed(f"instance {instance_id} became {inst.status} while booting")
        if ctx.clock() + ctx.poll_s > deadline:
            raise BringUpFailed(f"instance {instance_id} is not active after "
                                f"{d.format_duration(deadline - ctx.events.get('launched_at', deadline))} "
                                f"(status {inst.status})", hint="--timeout raises the limit")
        ctx.sleep(ctx.poll_s)


def write_profile(name: str, inst: Instance, key: Path, itype, cloud: dict, *, user: str = "ubuntu"):
    """The profile NAME in the user config folder, validated by the same loader as a hand-written one."""
    import yaml

    from ..paths import write_atomic
    from ..profiles import load_profile

    doc = {"host": inst.ip, "user": user, "port": 22, "key": str(key.expanduser().resolve()),
           "region": inst.region, "instance_type": itype.name, "price_per_hour": itype.price_per_hour,
           "host_key_policy": "strict"}
    if itype.gpus:
        doc["expect"] = {"gpu_count": itype.gpus}
    doc["cloud"] = {k: v for k, v in cloud.items() if v is not None}
    text = (f"# written by `gpuops up` for Lambda instance {inst.id} ({itype.name}, ${itype.price_per_hour:.2f}/h).\n"
            f"# `gpuops down {name}` terminates it; the host key was pinned before the first connection.\n"
            + yaml.safe_dump(doc, sort_keys=False))
    f = profile_file(name)
    write_atomic(f, text)
    return load_profile(f)


def _banner(ip: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def _wait_ssh(spec: UpSpec, ctx: Context, prof, ip: str, *, deadline: float) -> None:
    """The SSH banner, then a key login with the pinned host key (cloud-init may still be installing the key)."""
    from ..remote import hostkeys
    from ..remote.connection import connect

    out = ctx.out
    while not _banner(ip, prof.port, 5.0):
        if ctx.clock() > deadline:
            raise BringUpFailed(f"{ip}:{prof.port} does not answer SSH", hint="--timeout raises the limit")
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
            prof = prof.model_copy(update={"host_key_policy": "accept-new"})
            out.warn(f"--trust-new: {ip} did not present the pinned host key; trusting the key it presents now "
                     "(fingerprint below)")
            spec = UpSpec(**{**spec.__dict__, "trust_new": False})
        except (AuthError, ConnectError) as exc:
            if ctx.clock() > deadline:
                raise
            out.step(f"waiting for SSH login on {ip} ({exc.message})")
            ctx.sleep(min(3.0, ctx.poll_s))


def _after_failure(ctx: Context, spec: UpSpec, launch_id: str, state: dict, price: float, *, keep: bool,
                   interrupted: bool) -> None:
    """A failed or interrupted bring-up: terminate what was launched (or keep it recorded and say so)."""
    out = ctx.out
    why = "interrupted" if interrupted else "bring-up failed"
    try:
        iid = state["instance_id"]
        if iid is None and state["in_flight"]:
            inst = adopt_launch(ctx, launch_id, attempts=2)
            if inst is not None:
                iid = inst.id
                ctx.ledger.update(launch_id, instance_id=iid, state=LAUNCHED, launched_at=ctx.clock())
        if iid is None:
            rec = ctx.ledger.get(launch_id)
            if rec and rec.state == LAUNCHING:
                if state["in_flight"]:
                    out.warn(f"{why}: launch {launch_id} may still create an instance; it stays in `gpuops ls` "
                             "until the API shows it gone")
                else:
                    ctx.ledger.update(launch_id, state=FAILED, ended_at=ctx.clock(), note=why)
            return
        if keep:
            out.warn(f"{why}; --keep-on-failure: instance {iid} keeps running at ${price:.2f}/h "
                     f"(gpuops down {spec.name} terminates it)")
            return
        out.info(f"{why}: terminating instance {iid}")
        ctx.client.terminate([iid])
        ctx.ledger.update(launch_id, state=TERMINATED, ended_at=ctx.clock())
        _forget_profile(spec.name, state.get("instance"))
        out.info(f"terminated instance {iid}")
    except KeyboardInterrupt:
        out.warn(f"instance {state.get('instance_id') or '(launch ' + launch_id + ')'} may be running at "
                 f"${price:.2f}/h; it stays recorded in `gpuops ls`")
    except Exception as exc:
        iid = state.get("instance_id")
        out.error(f"could not terminate instance {iid or '(launch ' + launch_id + ')'}: {getattr(exc, 'message', exc)}",
                  f"it may be billing ${price:.2f}/h and stays recorded: `gpuops ls` shows it, "
                  f"`gpuops down {spec.name}` or `gpuops reap` terminates it")


def _forget_profile(name: str, inst: Optional[Instance]) -> None:
    from ..remote import hostkeys

    if inst is not None and inst.ip:
        hostkeys.forget(inst.ip, 22)
    f = profile_file(name)
    if f.is_file():
        mark_profile_gone(f)


def mark_profile_gone(f: Path) -> None:
    import yaml

    from ..paths import write_atomic

    text = f.read_text()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return
    if isinstance(doc, dict) and isinstance(doc.get("cloud"), dict):
        doc["cloud"]["state"] = "gone"
        note = "# the instance was terminated: this profile is kept for its history.\n"
        head = "".join(line + "\n" for line in text.splitlines() if line.startswith("#") and line + "\n" != note)
        write_atomic(f, head + note + yaml.safe_dump(doc, sort_keys=False))


# -- guard on the instance ----------------------------------------------------------------------------------------
GUARD_SCRIPT = r'''#!/usr/bin/env python3
"""gpuops guard: terminates THIS instance through the Lambda API at its TTL or idle limit (even with the laptop closed).
Idle = no gpuops run alive (~/.gpuops/active) and every GPU under 5 % utilisation for the idle limit."""
import glob, json, os, subprocess, sys, time, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
cfg = json.load(open(os.path.join(HERE, "config.json")))
key = open(os.path.join(HERE, "api_key")).read().strip()


def log(msg):
    print(time.strftime("%Y-%m-%dT%H:%M:%S") + " " + msg, flush=True)


def run_alive():
    """gpuops' registry of active runs on this host (~/.gpuops/active/<run id> -> run folder)."""
    for f in glob.glob(os.path.expanduser("~/.gpuops/active/*")):
        try:
            rd = open(f).read().strip()
            if os.path.exists(os.path.join(rd, "exit_code")):
                continue
            os.kill(int(open(os.path.join(rd, "pid")).read().strip()), 0)
            return True
        except (OSError, ValueError):
            pass
    return False


def busy():
    if run_alive():
        return True
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return any(float(x) >= 5 for x in out.split() if x.replace(".", "", 1).isdigit())
    except Exception:
        return False


def terminate():
    req = urllib.request.Request(cfg["api"] + "/instance-operations/terminate", method="POST",
                                 data=json.dumps({"instance_ids": [cfg["instance_id"]]}).encode(),
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status


last_active = time.time()
log("guarding instance %s: ttl_deadline=%s idle_limit_s=%s" % (cfg["instance_id"], cfg.get("ttl_deadline"), cfg.get("idle_limit_s")))
while True:
    now = time.time()
    if busy():
        last_active = now
    why = None
    if cfg.get("ttl_deadline") and now >= cfg["ttl_deadline"]:
        why = "TTL reached"
    elif cfg.get("idle_limit_s") and now - last_active >= cfg["idle_limit_s"]:
        why = "idle limit reached"
    if why:
        try:
            log("%s: terminating (HTTP %s)" % (why, terminate()))
            sys.exit(0)
        except Exception as exc:
            log("%s: terminate failed (%s); retrying" % (why, type(exc).__name__))
    time.sleep(cfg["interval_s"])
'''


def install_guard(prof, ctx: Context, instance_id: str, ttl_deadline: Optional[float], idle_s: Optional[float]) -> None:
    """--guard on-instance: the API key in a 0600 file on the instance, and a detached loop that terminates it."""
    import json

    from ..remote.connection import connect
    from .credentials import base_url

    if ctx.api_key is None:
        raise UsageError("--guard on-instance needs the API key")
    if not ttl_deadline and not idle_s:
        raise UsageError("--guard on-instance needs --ttl or --idle")
    limits = [x for x in (idle_s, (ttl_deadline - ctx.clock()) if ttl_deadline else None) if x]
    cfg = {"api": base_url(), "instance_id": instance_id, "ttl_deadline": ttl_deadline, "idle_limit_s": idle_s,
           "interval_s": max(1.0, min(60.0, min(limits) / 4))}
    d_ = "$HOME/.gpuops-guard"
    with connect(prof, announce=ctx.out.info) as remote:
        remote.run(f'umask 077 && mkdir -p "{d_}" && cat > "{d_}/api_key"', stdin=ctx.api_key.reveal(), check=True)
        remote.run(f'umask 077 && cat > "{d_}/config.json"', stdin=json.dumps(cfg), check=True)
        remote.run(f'umask 077 && cat > "{d_}/guard.py"', stdin=GUARD_SCRIPT, check=True)
        remote.run(f'cd "{d_}" && (nohup setsid python3 guard.py > guard.log 2>&1 < /dev/null &) ; echo started',
                   check=True, timeout=30)
    ctx.out.info("guard installed on the instance: it terminates itself at the TTL / idle limit "
                 "(the account-wide API key is in ~/.gpuops-guard/api_key, mode 0600)")


# -- down ----------------------------------------------------------------------------------------------------------
def down(name: str, ctx: Context, *, fetch_first: bool = False, project_dir: Path | None = None) -> dict:
    """Terminate the instance of managed profile NAME, confirm by reading it back, forget its host key, mark the
    profile gone. `fetch_first` pulls every fetch: entry (verified) before, since termination wipes the disk."""
    from ..profiles import resolve
    from ..remote import hostkeys

    prof = resolve(name, project_dir)
    if prof.cloud is None:
        raise UsageError(f"profile '{prof.name}' was not created by `gpuops up`; gpuops will not terminate what it "
                         "did not launch", hint="gpuops ls shows the instances it manages")
    iid = prof.cloud.instance_id
    if prof.cloud.state == "gone":
        try:
            status = ctx.client.instance(iid).status
        except LambdaError as exc:
            if not exc.not_found:
                raise
            status = "terminated"
        if status in d.ENDING_STATUSES:
            return {"profile": prof.name, "instance_id": iid, "status": status, "host_keys_forgotten": 0,
                    "fetched": [], "already": True}
    fetched = []
    if fetch_first and prof.cloud.state == "active":
        fetched = _fetch_all(prof, ctx.out, project_dir or Path.cwd())
    inst = _terminate_confirmed(ctx, iid)
    rec = ctx.ledger.by_instance(iid)
    if rec is not None and rec.open:
        ctx.ledger.update(rec.launch_id, state=TERMINATED, ended_at=ctx.clock())
    removed = hostkeys.forget(prof.host, prof.port)
    if prof.source and prof.source.is_file():
        mark_profile_gone(prof.source)
    return {"profile": prof.name, "instance_id": iid, "status": inst.status if inst else "terminated",
            "host_keys_forgotten": removed, "fetched": fetched}


def _fetch_all(prof, out, project_dir: Path) -> list[str]:
    from ..remote.connection import connect
    from ..transfer_ops import fetch, list_remote

    done = []
    with connect(prof, announce=out.info) as remote:
        listing = list_remote(prof, remote, project_dir)
        for fname in prof.fetch:
            if not listing.get(fname, {}).get("exists"):
                out.info(f"--fetch-first: nothing at {fname} on the instance")
                continue
            fetch(prof, remote, out, fname, project_dir=project_dir)
            done.append(fname)
    return done


def _terminate_confirmed(ctx: Context, iid: str) -> Optional[Instance]:
    """Terminate and read back until terminating/terminated (or gone from the API)."""
    try:
        ctx.client.terminate([iid])
    except LambdaError as exc:
        if not exc.not_found:
            raise
    deadline = ctx.clock() + TERMINATE_CONFIRM_S
    while True:
        try:
            inst = ctx.client.instance(iid)
        except LambdaError as exc:
            if exc.not_found:
                return None
            raise
        if inst.status in d.ENDING_STATUSES:
            return inst
        if ctx.clock() > deadline:
            raise GpuopsError(f"instance {iid} is still {inst.status} after the terminate request",
                              hint="run gpuops down again, or terminate it in Lambda's console")
        ctx.sleep(ctx.poll_s)


# -- ls and reap --------------------------------------------------------------------------------------------------
def local_cloud_profiles() -> dict[str, dict]:
    """Managed profiles in the user config folder: name -> cloud block."""
    import yaml

    out = {}
    d_ = profile_file("x").parent
    if not d_.is_dir():
        return out
    for f in sorted(d_.glob("*.yaml")):
        try:
            doc = yaml.safe_load(f.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("cloud"), dict):
            out[f.stem] = doc["cloud"]
    return out


def listing(ctx: Context) -> dict:
    instances = ctx.client.instances()
    records = ctx.ledger.records()
    rows, alerts = d.ls_rows(instances, records, local_cloud_profiles(), ctx.clock())
    return {"instances": rows, "alerts": alerts, "api_calls": ctx.client.total_calls}


def idle_sample_script() -> str:
    """One remote execution: GPU utilisations, then the ids of gpuops runs alive on this host (its registry of active
    runs, as `gpuops train` keeps it)."""
    from ..remote.launch import ACTIVE_DIR, STATE_FN

    return (STATE_FN + "\nnvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits 2>/dev/null\necho ---\n"
            f"for f in {ACTIVE_DIR}/*; do\n"
            '  [ -f "$f" ] || continue\n'
            '  rd=$(cat "$f"); id=$(basename "$f")\n'
            '  if [ ! -f "$rd/exit_code" ] && gpuops_alive "$rd" "$id"; then echo "$id"; fi\n'
            "done\n")


def idle_confirmed(prof) -> bool:
    """Sample the instance once: no gpuops run alive and every GPU under 5 %? (An unreachable host is not judged idle.)"""
    from ..remote.connection import connect

    try:
        with connect(prof, announce=lambda s: None, attempts=1) as remote:
            res = remote.run(idle_sample_script(), timeout=30)
    except GpuopsError:
        return False
    gpu, _, runs = res.stdout.partition("---")
    utils = []
    for x in gpu.split():
        try:
            utils.append(float(x))
        except ValueError:
            pass
    return not d.busy(bool(runs.strip()), utils)


def reap(ctx: Context, *, confirm: Optional[Callable[[str], bool]] = None, project_dir: Path | None = None) -> dict:
    """Terminate managed instances past their TTL or idle limit (idle is confirmed by one sample on the host)."""
    from ..profiles import resolve

    doc = listing(ctx)
    done, skipped = [], []
    for row in d.reap_candidates(doc["instances"]):
        only_idle = all(r.startswith("idle") for r in row["reasons"])
        prof = None
        try:
            prof = resolve(row["profile"], project_dir) if row["profile"] else None
        except GpuopsError:
            prof = None
        if only_idle:
            if prof is None or not idle_confirmed(prof):
                skipped.append({**row, "why": "idle not confirmed by a sample on the host"})
                if prof is not None:
                    ctx.ledger.note_activity(row["id"], ctx.clock())
                continue
        text = (f"terminate {row['id']} (profile {row['profile']}, {row['type']}, ${row['price_per_hour'] or 0:.2f}/h): "
                + "; ".join(row["reasons"]))
        if confirm is not None and not confirm(text + "?"):
            skipped.append({**row, "why": "not confirmed"})
            continue
        _terminate_confirmed(ctx, row["id"])
        rec = ctx.ledger.by_instance(row["id"])
        if rec is not None:
            ctx.ledger.update(rec.launch_id, state=TERMINATED, ended_at=ctx.clock())
        if prof is not None and prof.cloud and prof.cloud.instance_id == row["id"]:
            from ..remote import hostkeys

            hostkeys.forget(prof.host, prof.port)
            if prof.source:
                mark_profile_gone(prof.source)
        ctx.out.info(f"terminated {row['id']} ({'; '.join(row['reasons'])})")
        done.append(row)
    closed = _close_gone_records(ctx, doc["instances"])
    return {"terminated": done, "skipped": skipped, "records_closed": closed}


def _close_gone_records(ctx: Context, rows: list[dict], *, stale_launch_s: float = 900.0) -> list[str]:
    """Reconcile the ledger with the API: records whose instance the API shows terminated (or no longer knows) are
    closed; a `launching` record whose instance appeared (by tag) gets its id; one that never appeared within
    `stale_launch_s` is closed as failed."""
    closed = []
    listed = {r["id"]: r for r in rows if r["id"] and r["status"] not in ("unseen", "launching?")}
    by_launch = {r["launch_id"]: r for r in listed.values() if r.get("launch_id")}
    for rec in ctx.ledger.records():
        if rec.state == LAUNCHING:
            row = by_launch.get(rec.launch_id)
            if row is not None:
                ctx.ledger.update(rec.launch_id, instance_id=row["id"], state=LAUNCHED,
                                  launched_at=rec.launched_at or rec.created_at)
            elif ctx.clock() - rec.created_at > stale_launch_s:
                ctx.ledger.update(rec.launch_id, state=FAILED, ended_at=ctx.clock(),
                                  note="no instance carries its launch id")
                closed.append(rec.launch_id)
            continue
        if rec.state != LAUNCHED or not rec.instance_id:
            continue
        seen = listed[rec.instance_id]["status"] if rec.instance_id in listed else None
        if seen is None:  # not listed: ask for it by id; only a definite "does not exist" closes the record
            try:
                seen = ctx.client.instance(rec.instance_id).status
            except LambdaError as exc:
                seen = "terminated" if exc.not_found else None
        if seen == "terminated":
            ctx.ledger.update(rec.launch_id, state=TERMINATED, ended_at=ctx.clock(), note="seen terminated")
            closed.append(rec.launch_id)
    return closed
