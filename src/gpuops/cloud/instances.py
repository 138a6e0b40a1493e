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
from dataclasses import dataclass, field, replace
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


def profile_file(name: str) -> Path:
    from ..paths import config_dir

    return config_dir() / "profiles" / f"{name}.yaml"


def _iso(ts: Optional[float]) -> Optional[str]:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds") if ts is not None else None


# -- keys --------------------------------------------------------------------------------------------------------
def require_key(key: Path, *, given: bool = True) -> None:
    """The private key `up` and `run` register with the account must exist; the hint says how to make one (no
    profile exists yet to point elsewhere)."""
    if key.exists():
        return
    import shlex

    raise UsageError(f"key file not found: {key}" if given else f"no SSH key given and {key} does not exist",
                     hint=f"create one: mkdir -p -m 700 {shlex.quote(str(key.parent))} && "
                          f"ssh-keygen -t ed25519 -f {shlex.quote(str(key))} -N ''   (or --key PATH to a private key "
                          "you have)")


def public_key_of(key: Path) -> str:
    """The OpenSSH public line of a private key file (its .pub if present, else derived): the key `up`/`run` launch
    with, given by --key (no profile names it yet)."""
    from ..remote.connection import check_key_file

    require_key(key)
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
    try:
        client.add_ssh_key(name, " ".join(public_line.split()[:2]) + " gpuops")
    except LambdaError as exc:  # another gpuops (a second first `up`) may have registered it a moment ago
        if exc.transient:
            raise
        for k in client.ssh_keys():
            if d.same_key(k.public_key, public_line):
                return k.name
        raise
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
    prof = write_profile(spec.name, insts, spec.key, itype, cloud, user=ctx.ssh_user, template=spec.template)
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


# what `up` writes itself: the host part of a profile; every other key of a --from template is carried over
HOST_KEYS = ("name", "host", "hosts", "port", "user", "key", "private_ip", "region", "instance_type", "price_per_hour",
             "host_key_policy", "cloud")


def template_settings(prof) -> dict:
    """--from PROFILE: the profile file's own settings (python, remote_dir, expect, setup, sync, env_preset, env,
    secrets, fetch, checks, ...) without its host part, which the launch replaces. Read from the file as written, so
    defaults stay defaults; the profile was validated by loading it."""
    import yaml

    if prof.source is None or not Path(prof.source).is_file():
        raise UsageError(f"--from {prof.name}: the profile has no file to take settings from")
    doc = yaml.safe_load(Path(prof.source).read_text()) or {}
    return {k: v for k, v in doc.items() if k not in HOST_KEYS}


def template_for(name: Optional[str], project_dir: Path) -> Optional[dict]:
    """--from PROFILE (None: no template), read and validated before anything is launched."""
    if not name:
        return None
    from ..profiles.model import resolve

    return template_settings(resolve(name, project_dir))


def write_profile(name: str, insts: list[Instance], key: Path, itype, cloud: dict, *, user: str = "ubuntu",
                  template: Optional[dict] = None):
    """The profile NAME in the user config folder, validated by the same loader as a hand-written one. Several
    instances (a fleet, rank order): `hosts:` with each one's public and private address."""
    import yaml

    from ..paths import write_atomic
    from ..profiles.model import load_profile

    first = insts[0]
    if len(insts) > 1:
        doc = {"hosts": [{"host": i.ip, "private_ip": i.private_ip or i.ip} for i in insts]}
    else:
        doc = {"host": first.ip}
    doc.update({"user": user, "port": 22, "key": str(key.expanduser().resolve()),
                "region": first.region, "instance_type": itype.name, "price_per_hour": itype.price_per_hour,
                "host_key_policy": "strict"})
    settings = dict(template or {})
    fss = cloud.get("filesystems") or []
    if fss:  # the job sees the first filesystem's mount point; setup's caches live on it (a replacement's setup is fast)
        mount = fss[0]["mount_point"]
        settings["env"] = {**(settings.get("env") or {}), "GPUOPS_FS": mount}
        setup = dict(settings.get("setup") or {})
        setup.setdefault("cache_dir", f"{mount.rstrip('/')}/gpuops/cache")
        settings["setup"] = setup
    # what was launched (its GPU, count and memory), over the template's other expectations
    expect = d.launched_expect(itype, settings.pop("expect", None))
    doc.update(settings)
    if expect:
        doc["expect"] = expect
    doc["cloud"] = {k: v for k, v in cloud.items() if v is not None}
    what = (f"Lambda instance {first.id}" if len(insts) == 1 else
            f"a fleet of {len(insts)} Lambda instances ({', '.join(i.id for i in insts)})")
    text = (f"# written by `gpuops up` for {what} ({itype.name}, ${itype.price_per_hour:.2f}/h"
            + (" each" if len(insts) > 1 else "") + ").\n"
            f"# `gpuops down {name}` terminates {'it' if len(insts) == 1 else 'them all'}; the host key"
            f"{'' if len(insts) == 1 else 's'} pinned before the first connection.\n"
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
            prof = prof.model_copy(update={"host_key_policy": "accept-new"})
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


def _forget_profile(name: str, insts: list) -> None:
    from ..remote import hostkeys

    for inst in insts:
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
@dataclass
class DownTarget:
    """What `gpuops down X` ends: the managed profile X (every instance it names, and any other open launch of that
    name), or, without a profile, the open launches and gpuops-tagged instances of name X, or the gpuops-launched
    instance whose id is X (one node of a fleet: that node only)."""

    name: str
    profile: object = None  # the managed profile, when there is one
    ids: list = field(default_factory=list)  # instances to end, rank order first
    launches: list = field(default_factory=list)  # open launch records no listed instance carries (cut off in flight)
    ips: dict = field(default_factory=dict)  # instance id -> IP, for instances without a profile (pins to forget)
    price_per_hour: float = 0.0  # all of them together
    whole_profile: bool = True  # False: one node of the profile, by its id

    def describe(self) -> str:
        what = (f"instance {self.ids[0]}" if len(self.ids) == 1 else
                f"{len(self.ids)} instances ({', '.join(self.ids)})" if self.ids else "no instance")
        return what + (f" and {len(self.launches)} launch record(s) cut off in flight" if self.launches else "")


def managed_profile(name: str):
    """The profile `gpuops up` wrote for NAME (the user config folder, never a project's profiles/), or None."""
    from ..profiles.model import load_profile

    if not NAME_RE.match(name):
        return None
    f = profile_file(name)
    if not f.is_file():
        return None
    try:
        prof = load_profile(f)
    except GpuopsError:
        return None
    return prof if prof.cloud is not None else None


def _profile_of_instance(instance_id: str):
    """The managed profile (user config folder) that names this instance as one it runs, or None."""
    for name, cloud in local_cloud_profiles().items():
        if d.profile_names_instance(cloud, instance_id):
            return managed_profile(name)
    return None


def down_target(target: str, ctx: Context, project_dir: Path | None = None) -> DownTarget:
    """Resolve `gpuops down TARGET` (a profile name, a profile path, or an instance id) to what it ends."""
    from ..profiles.model import resolve

    prof = managed_profile(target)
    plain = None
    if prof is None:
        try:
            found = resolve(target, project_dir)
        except GpuopsError:
            found = None
        if found is not None and found.cloud is not None:
            prof = found
        elif found is not None:
            plain = found
    name = prof.name if prof is not None else target
    recs = [r for r in ctx.ledger.records() if r.open and (r.profile == name or r.instance_id == target)]
    tgt = DownTarget(name=name, profile=prof)
    if prof is not None:
        tgt.ids = list(prof.cloud.instance_ids)
        tgt.price_per_hour = (prof.price_per_hour or 0.0) * len(tgt.ids)
    if prof is not None and all(r.instance_id in tgt.ids for r in recs):
        return tgt  # the usual case: the profile and its own records, no listing needed
    if plain is not None and not recs:
        raise UsageError(f"profile '{plain.name}' was not created by `gpuops up`; gpuops will not terminate what it "
                         "did not launch", hint="gpuops ls shows the instances it manages")
    listed = ctx.client.instances()
    by_id = {i.id: i for i in listed}
    if prof is None and target in by_id:  # an instance id
        inst = by_id[target]
        rec = next((r for r in ctx.ledger.records() if r.instance_id == target), None)
        if rec is None and d.TAG_LAUNCH not in inst.tags:
            raise UsageError(f"instance {target} was not launched by gpuops (no launch record here, no gpuops tag); "
                             "gpuops does not terminate what it did not launch",
                             hint="terminate it in Lambda's console if it is yours")
        owner = _profile_of_instance(target)
        tgt = DownTarget(name=(owner.name if owner else inst.tags.get(d.TAG_PROFILE) or (rec.profile if rec else target)),
                         profile=owner, ids=[target], whole_profile=owner is None or owner.cloud.instance_ids == [target],
                         price_per_hour=inst.type.price_per_hour if inst.type else 0.0)
        if owner is None and inst.ip:
            tgt.ips[target] = inst.ip
        return tgt
    tagged = [i for i in listed if i.tags.get(d.TAG_PROFILE) == name and i.status not in d.OVER_STATUSES
              and i.id not in tgt.ids]
    for rec in recs:  # open launches of the name: their instance by id, or by the launch tag
        iid = rec.instance_id or next((i.id for i in listed if i.tags.get(d.TAG_LAUNCH) == rec.launch_id
                                       and i.status not in d.GONE_STATUSES), None)
        if iid is None:
            tgt.launches.append(rec)
        elif iid not in tgt.ids:
            tgt.ids.append(iid)
    for inst in tagged:
        if inst.id not in tgt.ids:
            tgt.ids.append(inst.id)
    for iid in tgt.ids:
        inst = by_id.get(iid)
        if inst is not None and prof is None:
            tgt.price_per_hour += inst.type.price_per_hour if inst.type else 0.0
            if inst.ip:
                tgt.ips[iid] = inst.ip
    if not tgt.ids and not tgt.launches:
        from ..errors import ProfileError

        raise ProfileError(f"nothing named '{target}': no profile written by `gpuops up`, no open launch and no "
                           "gpuops instance of that name, and no instance with that id",
                           hint="gpuops ls shows every instance and launch gpuops knows")
    return tgt


def down(target, ctx: Context, *, fetch_first: bool = False, project_dir: Path | None = None) -> dict:
    """Terminate what `gpuops down TARGET` names (`down_target`: a managed profile's instances, every one of a fleet
    in one request; or, without a profile, the open launches and tagged instances of that name, or one instance by
    id), confirm by reading them back, close their ledger records, forget their host keys, mark the profile gone.
    `fetch_first` pulls every fetch: entry (verified, from rank 0) before, since termination wipes the disk."""
    from ..remote import hostkeys

    tgt = target if isinstance(target, DownTarget) else down_target(target, ctx, project_dir)
    prof, ids = tgt.profile, tgt.ids
    base = {"profile": tgt.name, "instance_id": ids[0] if ids else None, "instance_ids": ids, "fetched": []}
    if prof is not None and prof.cloud.state == "gone" and tgt.whole_profile and not tgt.launches:
        statuses = _statuses(ctx, ids)
        if all(st in d.OVER_STATUSES for st in statuses):
            return {**base, "status": statuses[0], "statuses": statuses, "host_keys_forgotten": 0, "already": True,
                    "records_closed": _close_records(ctx, ids, note="seen ended")}
    fetched = []
    if fetch_first and prof is not None and prof.cloud.state == "active" and tgt.whole_profile:
        fetched = _fetch_all(prof, ctx.out, project_dir or Path.cwd())
    _note_asked(ctx, ids, DOWN_NOTE)  # before the request: a run watching it reads the termination as asked for
    insts = _terminate_confirmed(ctx, ids) if ids else []
    statuses = [i.status if i else "terminated" for i in insts]
    closed = _close_records(ctx, ids, note=DOWN_NOTE)
    for rec in tgt.launches:  # cut off in flight and nothing carries its launch id
        if owner_alive(rec):
            ctx.out.warn(f"launch {rec.launch_id} of '{rec.profile}' is still in flight (gpuops process {rec.pid}): "
                         f"run `gpuops down {rec.profile}` again once it has landed")
            continue
        ctx.ledger.update(rec.launch_id, state=FAILED, ended_at=ctx.clock(),
                          note="closed by down: no instance carries its launch id")
        closed.append(rec.launch_id)
    removed = 0
    if prof is not None:
        nodes = prof.nodes()
        removed += sum(hostkeys.forget(n.host, n.port) for n, iid in zip(nodes, prof.cloud.instance_ids) if iid in ids)
        if prof.source and Path(prof.source).is_file() and (tgt.whole_profile or all(
                (r := ctx.ledger.by_instance(i)) is not None and not r.open for i in prof.cloud.instance_ids)):
            mark_profile_gone(Path(prof.source))
    removed += sum(hostkeys.forget(ip, 22) for ip in tgt.ips.values())
    return {**base, "status": statuses[0] if statuses else None, "statuses": statuses, "host_keys_forgotten": removed,
            "fetched": fetched, "records_closed": closed}


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


def _fetch_all(prof, out, project_dir: Path) -> list[str]:
    from ..remote.connection import connect
    from ..transfer.fetch import fetch, list_remote

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


def listing(ctx: Context, *, filesystems: bool = False, project_dir: Path | None = None) -> dict:
    """`gpuops ls`: every instance of the account judged by its tags and the ledger (decisions.ls_rows). The ledger is
    brought up to date with what the listing shows (no further request): a launch cut off in flight gets the instance
    that carries its launch id, a record whose instance the API shows terminated is closed. `filesystems`: the
    account's filesystems too (one more request; its failure is said, the instances still shown), with their cost
    per month where a price is known. Nothing here ever deletes a filesystem (reap uses this listing)."""
    instances = ctx.client.instances()
    records = ctx.ledger.records()
    live_owners = {r.launch_id for r in records if r.open and owner_alive(r)}
    rows, alerts = d.ls_rows(instances, records, local_cloud_profiles(), ctx.clock(), live_owners)
    _reconcile(ctx, rows, live_owners)
    doc = {"instances": rows, "alerts": alerts}
    if filesystems:
        from . import filesystems as fsd

        try:
            price = fsd.prices(project_dir)
            doc["filesystems"] = fsd.rows(ctx.client.filesystems(), instances, price)
            doc["filesystems_per_month"] = fsd.total_per_month(doc["filesystems"])
        except LambdaError as exc:
            doc["filesystems"], doc["filesystems_per_month"] = None, None
            alerts.append(f"filesystems not listed: {exc.message}")
    doc["api_calls"] = ctx.client.total_calls
    return doc


def _reconcile(ctx: Context, rows: list[dict], live_owners: set) -> None:
    by_launch = {r["launch_id"]: r for r in rows if r["id"] and r.get("launch_id")}
    for rec in ctx.ledger.records():
        if not rec.open:
            continue
        row = by_launch.get(rec.launch_id)
        if rec.state == LAUNCHING and rec.launch_id in live_owners:
            continue  # its `gpuops up` is still waiting for the answer and records the id itself
        if rec.state == LAUNCHING and row is not None and row["status"] not in d.GONE_STATUSES:
            ctx.ledger.update(rec.launch_id, instance_id=row["id"], state=LAUNCHED,
                              launched_at=rec.launched_at or rec.created_at, note="adopted by its launch tag")
        elif row is not None and row["id"] == rec.instance_id and row["status"] in d.DEAD_STATUSES:
            ctx.ledger.update(rec.launch_id, state=TERMINATED, ended_at=ctx.clock(), note=f"seen {row['status']}")


def idle_sample_script() -> str:
    """One remote execution: GPU utilisations, then the ids of gpuops runs alive on this host (its registry of active
    runs, as `gpuops train` keeps it)."""
    from ..jobs.scripts import ACTIVE_DIR, STATE_FN

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
    """Terminate managed instances past their TTL or idle limit, judged by the ledger and the instances' gpuops tags
    (an instance launched from another machine or HOME by its TTL tag; one with no profile too). Idle is confirmed by
    one sample on the host, through the profile `gpuops up` wrote for it (the user config folder, never a project's
    profile of the same name): without one, an idle-only instance is kept. `project_dir` is not used to find
    profiles."""
    doc = listing(ctx)
    done, skipped = [], []
    for row in d.reap_candidates(doc["instances"]):
        only_idle = all(r.startswith("idle") for r in row["reasons"])
        prof = _profile_of_instance(row["id"])
        node = _node_of(prof, row)
        if only_idle:
            if node is None or not idle_confirmed(node):
                skipped.append({**row, "why": "idle not confirmed by a sample on the host" if node is not None else
                                "idle, but no profile here to sample it with"})
                if node is not None:
                    ctx.ledger.note_activity(row["id"], ctx.clock())
                continue
        text = (f"terminate {row['id']} (profile {row['profile']}, {row['type']}, ${row['price_per_hour'] or 0:.2f}/h): "
                + "; ".join(row["reasons"]))
        if confirm is not None and not confirm(text + "?"):
            skipped.append({**row, "why": "not confirmed"})
            continue
        _note_asked(ctx, [row["id"]], "reaped")  # before the request, as down does
        _terminate_confirmed(ctx, [row["id"]])
        for rec in ctx.ledger.records():
            if rec.open and (rec.instance_id == row["id"] or (rec.instance_id is None and rec.launch_id == row["launch_id"])):
                ctx.ledger.update(rec.launch_id, instance_id=row["id"], state=TERMINATED, ended_at=ctx.clock(),
                                  note="reaped")
        from ..remote import hostkeys

        if node is not None:
            hostkeys.forget(node.host, node.port)
            ended = {r["id"] for r in done} | {row["id"]} | {r["id"] for r in doc["instances"]
                                                             if r["status"] in d.OVER_STATUSES}
            if prof.source and set(prof.cloud.instance_ids) <= ended:  # a fleet: once its last node is gone
                mark_profile_gone(Path(prof.source))
        elif row["ip"]:
            hostkeys.forget(row["ip"], 22)  # pinned by an `up` cut off before it wrote the profile
        ctx.out.info(f"terminated {row['id']} ({'; '.join(row['reasons'])})")
        done.append(row)
    closed = _close_gone_records(ctx, doc["instances"])
    return {"terminated": done, "skipped": skipped, "records_closed": closed}


def _node_of(prof, row: dict):
    """The host of managed profile `prof` that is instance row["id"] (a fleet's node by its rank), or None."""
    if prof is None or prof.cloud is None or row["id"] not in prof.cloud.instance_ids:
        return None
    nodes = prof.nodes()
    rank = prof.cloud.instance_ids.index(row["id"])
    return nodes[rank] if rank < len(nodes) else None


def _close_gone_records(ctx: Context, rows: list[dict], *, stale_launch_s: float = d.STALE_LAUNCH_S) -> list[str]:
    """Reconcile the ledger with the API: records whose instance the API shows terminated (or no longer knows) are
    closed; a `launching` record whose instance appeared (by tag) gets its id; one that never appeared within
    `stale_launch_s` is closed as failed."""
    closed = []
    listed = {r["id"]: r for r in rows if r["id"] and r["status"] not in ("unseen", "launching?")}
    by_launch = {r["launch_id"]: r for r in listed.values() if r.get("launch_id")}
    for rec in ctx.ledger.records():
        if rec.state == LAUNCHING:
            if owner_alive(rec):
                continue  # its `gpuops up` is still waiting for the launch answer
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
        if seen in d.DEAD_STATUSES:
            ctx.ledger.update(rec.launch_id, state=TERMINATED, ended_at=ctx.clock(), note=f"seen {seen}")
            closed.append(rec.launch_id)
    return closed
