"""An instance's lifecycle, what every step of it shares: the Context (the client, the ledger, the clock,
the output), UpSpec (what `up` launches), whose process a ledger record is (`owner_alive`), and terminating (a
request confirmed by reading the instances back, the records closed, `terminated_here`).

The sequences are one module each: up.py (`up`: preflight, launch, boot, SSH, verify), down.py (`down_target`,
`down`), reap.py (`listing` for ls, `reap`); launch.py holds the launch requests (a ledger record before each, the
launch slot, capacity, adopting a lost answer), keys.py the SSH keys, managed.py the profiles `up` writes, watchdog.py
the watchdog `--guard on-instance` installs. Money rule: anything that may leave a billable instance running is in
the ledger before the request that could create it.
"""
from __future__ import annotations

import os
import random
import re
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from ..errors import GpuopsError, ExitCode
from . import decisions as d
from .api import Client, Instance, LambdaError
from .ledger import TERMINATED, Ledger, Record

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
TERMINATE_CONFIRM_S = 120.0
MAX_TRANSIENT_LAUNCH_FAILURES = 6
MAX_NODES = 64  # a fleet bigger than this is a 1-Click Cluster, not `up --nodes`


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
    progress_s: float = 15.0  # a long wait (boot, SSH) says where it stands at least this often
    events: dict = field(default_factory=dict)  # timings for benchmarks: launched_at, active_at, ssh_at, verified_at


def make_context(out, *, with_key: bool = False, project_dir: Path | None = None) -> Context:
    """The Context every cloud command uses: the API key (credentials.py), the base URL, the ledger. Against anything but
    Lambda's own service (the emulator, tests), GPUOPS_CLOUD_POLL_S, GPUOPS_CLOUD_LAUNCH_INTERVAL_S,
    GPUOPS_CLOUD_CAPACITY_RECHECK_S, GPUOPS_CLOUD_BACKOFF_S and GPUOPS_CLOUD_PROGRESS_S may shorten the waits; against
    Lambda they are ignored.
    with_key: keep the key in the context (only --guard on-instance sends it anywhere but the API)."""
    from .credentials import base_url, is_production, load_api_key

    key, _source = load_api_key(project_dir)
    url = base_url()
    client = Client(key, url)
    client.on_retry = lambda exc, delay: out.step(f"{exc.message}; retrying in {delay:.1f}s")
    ctx = Context(client=client, out=out, api_key=key if with_key else None, ledger=Ledger(on_passed_over=out.warn))
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
        if env.get("GPUOPS_CLOUD_PROGRESS_S"):
            ctx.progress_s = float(env["GPUOPS_CLOUD_PROGRESS_S"])
    return ctx


@dataclass
class UpSpec:
    """What `up` launches. The type: `types` (tried in that order; `type_name` is one type, as before) or `gpu`
    (`--gpu H100:8`: every type with that GPU and count, cheapest first), each kept at or under `max_price` per hour
    and to the GPU a --from `template` expects; `gpuops run` and its recovery pass what the user asked the same way."""

    name: str
    type_name: str = ""
    key: Path = field(default_factory=lambda: Path("~/.ssh/id_ed25519").expanduser())
    types: list = field(default_factory=list)
    gpu: Optional[str] = None  # NAME[:COUNT], parsed against the GPU table (decisions.parse_gpu)
    max_price: Optional[float] = None  # USD per hour, per instance
    regions: list = field(default_factory=list)
    wait_for_capacity_s: float = 0.0
    ttl_s: Optional[float] = None
    idle_s: Optional[float] = None
    file_systems: list = field(default_factory=list)  # names: attached at launch, the launch kept to their region
    # a missing filesystem: asked "create it in REGION?" (True: created); None: refused (exit 2) with the command
    create_fs: Optional[Callable[[str], bool]] = None
    verify: bool = True
    keep_on_failure: bool = False
    timeout_s: Optional[float] = None
    trust_new: bool = False
    guard_on_instance: bool = False
    confirm: Optional[Callable[[str], bool]] = None  # asked with the price line; False: nothing is launched
    nodes: int = 1  # > 1: a fleet profile (hosts:), every instance in one region
    template: Optional[dict] = None  # --from PROFILE: its settings (template_settings), the host part from the launch
    # called while up waits (capacity, launch, boot, SSH) with {"phase", "price_per_hour", "nodes"}; an exception it
    # raises ends the bring-up like any failure (what was launched is terminated): `gpuops run --max-cost`
    tick: Optional[Callable[[dict], None]] = None


def _iso(ts: Optional[float]) -> Optional[str]:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds") if ts is not None else None


# -- whose a record is, and terminating --------------------------------------------------------------------------
def owner_alive(rec: Record) -> bool:
    """Is the gpuops process that wrote this launch record still running (on this machine)? A record of another
    machine, or of a process that is gone, is not: its launch was cut off."""
    if not rec.pid or rec.host != socket.gethostname():
        return False
    if rec.pid == os.getpid():
        return True
    try:
        os.kill(rec.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # the pid may have been reused since by another program
        return b"gpuops" in Path(f"/proc/{rec.pid}/cmdline").read_bytes()
    except OSError:
        return True


def _statuses(ctx: Context, ids: list[str]) -> list[str]:
    out = []
    for iid in ids:
        try:
            out.append(ctx.client.instance(iid).status)
        except LambdaError as exc:
            if not exc.not_found:
                raise
            out.append("terminated")
    return out


DOWN_NOTE = "gpuops down"  # the ledger's note on an instance `down` terminated (a run tells it from a loss)
ASKED_NOTES = (DOWN_NOTE, "reaped")  # terminations this machine's user asked for (down; reap at the TTL they set)


def terminated_here(ledger, instance_id: str) -> Optional[str]:
    """Was this instance terminated from this machine on purpose (`gpuops down`, `gpuops reap`)? The ledger's note
    ("gpuops down", "reaped": written before the termination is requested), or None (a loss: preempted, Lambda's console, another machine; or an unreadable
    ledger)."""
    try:
        rec = ledger.by_instance(instance_id)
    except Exception:  # noqa: BLE001 - an unreadable ledger proves nothing
        return None
    if rec is None or rec.note not in ASKED_NOTES:  # open: down/reap noted it before its request, still confirming
        return None
    return rec.note


def _note_asked(ctx: Context, ids: list[str], note: str) -> None:
    """Before a termination this machine's user asked for (down, reap) is requested: its open records carry the note,
    so a run that sees the instance terminating in the meantime tells it from a loss (terminated_here)."""
    for rec in ctx.ledger.records():
        if rec.open and rec.instance_id in ids:
            ctx.ledger.update(rec.launch_id, note=note)


def _close_records(ctx: Context, ids: list[str], note: str = "") -> list[str]:
    """Close the open ledger records of these instances (terminated); their launch ids."""
    closed = []
    for rec in ctx.ledger.records():
        if rec.open and rec.instance_id in ids:
            ctx.ledger.update(rec.launch_id, state=TERMINATED, ended_at=ctx.clock(), note=note)
            closed.append(rec.launch_id)
    return closed


def _terminate(ctx: Context, ids: list[str]) -> None:
    """One terminate request for them all; if the API says one does not exist (already gone), the others one by
    one, so a node that is gone never keeps the rest of a fleet billing."""
    try:
        ctx.client.terminate(ids)
    except LambdaError as exc:
        if not exc.not_found:
            raise
        if len(ids) > 1:
            for iid in ids:
                try:
                    ctx.client.terminate([iid])
                except LambdaError as exc1:
                    if not exc1.not_found:
                        raise


def _terminate_confirmed(ctx: Context, ids: list[str]) -> list[Optional[Instance]]:
    """Terminate (one request for them all) and read back until each is terminating/terminated (or gone from the
    API: None). A refusal (not a transient failure) for instances that have ended meanwhile is no failure."""
    try:
        _terminate(ctx, ids)
    except LambdaError as exc:
        if exc.transient:
            raise
        alive = [i for i, st in zip(ids, _statuses(ctx, ids)) if st not in d.OVER_STATUSES]
        if alive == list(ids):
            raise
        if alive:  # refused because some had ended meanwhile: the others on their own
            _terminate(ctx, alive)
    deadline = ctx.clock() + TERMINATE_CONFIRM_S
    done: dict[str, Optional[Instance]] = {}
    while True:
        for iid in ids:
            if iid in done:
                continue
            try:
                inst = ctx.client.instance(iid)
            except LambdaError as exc:
                if exc.not_found:
                    done[iid] = None
                    continue
                raise
            if inst.status in d.ENDING_STATUSES or inst.status in d.DEAD_STATUSES:  # preempted: ended, not billing
                done[iid] = inst
            elif ctx.clock() > deadline:
                raise GpuopsError(f"instance {iid} is still {inst.status} after the terminate request",
                                  hint="run gpuops down again, or terminate it in Lambda's console")
        if len(done) == len(ids):
            return [done[i] for i in ids]
        ctx.sleep(ctx.poll_s)
