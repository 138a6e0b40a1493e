"""Pure decisions over the API's records, the ledger and the clock (no network, no files): tested without a server.

Which instance type and region next (any GPU that fits: `choose`, `next_attempt`), how long to wait, is this
instance past its TTL or idle limit, what has it cost so far, what `gpuops ls` shows and what `gpuops reap`
terminates. The GPU table (verify/gpus.py, playbooks/gpus.yaml) is read, never written.
"""
from __future__ import annotations

import base64
import hashlib
import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from ..errors import UsageError

ONE_GPU_READY_S = 20 * 60
EIGHT_GPU_READY_S = 35 * 60
CAPACITY_RECHECK_S = (30.0, 60.0)  # --wait-for-capacity: the first re-read of capacity, jittered
CAPACITY_BACKOFF = 1.5  # each further re-read waits this much longer ...
CAPACITY_BACKOFF_CAP = 4.0  # ... up to this many times the longest first wait (4 min against Lambda)
LAUNCH_INTERVAL_S = 12.0  # Lambda: one launch request per 12 s
MIN_POLL_S = 5.0  # readiness polling, no more often than this against the real API
IDLE_UTIL_PCT = 5.0
TAG_LAUNCH, TAG_PROFILE = "gpuops-launch-id", "gpuops-profile"
TAG_TTL = "gpuops-ttl-deadline"  # epoch seconds: any gpuops of the account judges the instance's TTL by it
GONE_STATUSES = ("terminated",)
ENDING_STATUSES = ("terminating", "terminated")
DEAD_STATUSES = ("terminated", "preempted")
OVER_STATUSES = ("terminating", "terminated", "preempted")  # not billing any more (or about to stop)
MAX_LIMIT_S = 365 * 86400.0  # --ttl / --idle / --timeout: above a year is a typo, not a plan
STALE_LAUNCH_S = 900.0  # a launch request unanswered this long (its process gone) is not in flight any more

_DUR = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])")


def parse_duration(text: str) -> float:
    """'90m', '2h', '1h30m', '45s', '1d', or plain seconds -> seconds."""
    t = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return float(t)
    parts = _DUR.findall(t)
    if not parts or _DUR.sub("", t).strip():
        raise UsageError(f"not a duration: {text!r}", hint="write e.g. 45s, 30m, 2h, 1h30m or 1d")
    mult = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    return sum(float(n) * mult[u] for n, u in parts)


def parse_limit(text: str, flag: str, *, most: float = MAX_LIMIT_S) -> float:
    """A limit such as --ttl: a duration above 0 and at most `most` (a year): 0 would silently mean "no limit" and a
    huge one overflows every date."""
    s = parse_duration(text)
    if not 0 < s <= most:
        raise UsageError(f"{flag} {text}: give a duration above 0 and at most {format_duration(most)}",
                         hint="no limit at all: leave the option out")
    return s


def format_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    neg = seconds < 0
    s = int(abs(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    text = f"{d}d{h}h" if d else f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"
    return ("-" if neg else "") + text


def launch_order(listed: Iterable[str], requested: Iterable[str] = ()) -> list[str]:
    """Regions to try: the requested ones that are listed with capacity, in the user's order; all listed ones (the
    API's order) when none was requested. Regions not listed are skipped: a launch there spends the 12 s budget on a
    certain refusal."""
    listed = list(dict.fromkeys(listed))
    requested = list(dict.fromkeys(requested))
    if not requested:
        return listed
    return [r for r in requested if r in listed]


def find_type(types: dict, name: str):
    """The type named `name` in the API's map, whatever its case (Lambda's names are lower case: GPU_1X_A10 is
    gpu_1x_a10), or None."""
    if name in types:
        return types[name]
    same = [v for k, v in types.items() if k.lower() == name.strip().lower()]
    return same[0] if len(same) == 1 else None


def type_suggestion(types: dict, name: str) -> str:
    """'; did you mean a, b?' for an unknown type name (compared in lower case), or ''."""
    import difflib

    lower = {k.lower(): k for k in types}
    close = [lower[c] for c in difflib.get_close_matches(name.strip().lower(), list(lower), n=3)]
    return f"; did you mean {', '.join(close)}?" if close else ""


def next_region(order: list[str], cold: set[str]) -> Optional[str]:
    return next((r for r in order if r not in cold), None)


def capacity_recheck_delay(rng: Callable[[], float], bounds: tuple[float, float] = CAPACITY_RECHECK_S) -> float:
    lo, hi = bounds
    return lo + (hi - lo) * rng()


def capacity_backoff(round_: int, rng: Callable[[], float], bounds: tuple[float, float] = CAPACITY_RECHECK_S) -> float:
    """The wait before re-read number `round_` (0 first) of capacity: jittered within `bounds`, growing by half each
    round, at most 4 x the longest first wait (30-60 s, 45-90 s, ... up to 4 min against Lambda)."""
    return min(capacity_recheck_delay(rng, bounds) * CAPACITY_BACKOFF ** max(0, round_),
               bounds[1] * CAPACITY_BACKOFF_CAP)


# -- which type: any GPU that fits ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuAsk:
    """`--gpu NAME[:COUNT]`: the GPU table's rows NAME covers (verify/gpus.family) and the GPUs per instance."""

    text: str
    name: str
    count: int
    rows: tuple = ()  # GPU table row ids

    def __str__(self) -> str:
        return f"{self.name}:{self.count}"


def parse_gpu(text: str, project_dir=None) -> GpuAsk:
    """'H100:8' -> 8 GPUs of any H100 row; 'A100 80GB' -> one GPU of either 80 GB A100 (COUNT defaults to 1)."""
    from ..verify import gpus

    raw = str(text).strip()
    name, sep, count = raw.rpartition(":")
    if not sep:
        name, count = raw, "1"
    name = name.strip()
    if not count.strip().isdigit() or int(count) < 1:
        raise UsageError(f"--gpu {text}: the count after ':' is a whole number above 0",
                         hint="e.g. --gpu H100:8 (eight H100s on one instance) or --gpu A100 (one)")
    rows = gpus.family(name, project_dir) if name else []
    if not rows:
        names = sorted({n for r in gpus.load(project_dir) for n in r.aliases + (r.id,)})
        import difflib

        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        raise UsageError(f"--gpu {text}: no GPU named {name!r} in the GPU table"
                         + (f"; did you mean {', '.join(close)}?" if close else ""),
                         hint="gpuops cloud types lists Lambda's types and their GPUs; playbooks/gpus.yaml the names")
    return GpuAsk(text=raw, name=name, count=int(count), rows=tuple(r.id for r in rows))


@dataclass(frozen=True)
class Want:
    """What a launch may use: the types the user named (in order) or the GPU they need, a price limit, a --from
    template's GPU (`expect.gpu`, and `expect.gpu_memory_mib` as a minimum), the regions. Nothing given: every type."""

    types: tuple = ()
    gpu: Optional[GpuAsk] = None
    max_price: Optional[float] = None  # USD per hour, per instance
    expect_gpu: Optional[str] = None
    min_gpu_memory_mib: Optional[int] = None
    regions: tuple = ()
    template: Optional[str] = None  # the template's name, for messages

    def describe(self) -> str:
        what = (str(self.gpu) if self.gpu else " or ".join(self.types) if self.types else "any type")
        return what + (f" at most ${self.max_price:.2f}/h" if self.max_price is not None else "")


@dataclass(frozen=True)
class Candidate:
    """A type a launch may use, with the regions to try it in (in order; empty: no capacity listed now)."""

    name: str
    price_cents_per_hour: int
    gpus: int
    gpu: Optional[str]  # the GPU table's row id
    gpu_name: str
    regions: tuple = ()

    @property
    def price_per_hour(self) -> float:
        return self.price_cents_per_hour / 100.0

    def label(self) -> str:
        return f"{self.name} (${self.price_per_hour:.2f}/h)"


@dataclass(frozen=True)
class Choice:
    """The types to try, in order (the user's, or cheapest first), and the ones left out with why."""

    candidates: tuple = ()
    excluded: tuple = ()  # (type name, price per hour, why)

    @property
    def most_per_hour(self) -> float:
        return max((c.price_per_hour for c in self.candidates), default=0.0)


def want_from(*, types: Iterable[str] = (), gpu: Optional[str] = None, max_price: Optional[float] = None,
              regions: Iterable[str] = (), template: Optional[dict] = None, need_one: bool = True,
              project_dir=None) -> Want:
    """The user's options as a Want, checked: `--type` (several: tried in that order) or `--gpu NAME[:COUNT]`, not
    both, and one of them unless `need_one` is False (`cloud types` lists every type); `--max-price` above 0; a --from
    template's expect.gpu and expect.gpu_memory_mib kept as constraints."""
    types = tuple(t.strip() for t in types if t and t.strip())
    if types and gpu:
        raise UsageError("--type and --gpu: give one of them",
                         hint="--type names instance types (tried in the order given); --gpu H100:8 takes any type "
                              "with that GPU and count, cheapest first")
    if need_one and not types and not gpu:
        raise UsageError("what to launch: give --type TYPE (repeatable: tried in that order) or --gpu NAME[:COUNT]",
                         hint="gpuops cloud types lists the types, their GPUs and prices")
    if max_price is not None and not max_price > 0:
        raise UsageError(f"--max-price {max_price:g}: a price per hour above 0 (USD)")
    expect = (template or {}).get("expect") or {}
    mem = expect.get("gpu_memory_mib")
    return Want(types=types, gpu=parse_gpu(gpu, project_dir) if gpu else None, max_price=max_price,
                expect_gpu=str(expect["gpu"]) if expect.get("gpu") else None,
                min_gpu_memory_mib=int(mem) if isinstance(mem, (int, float)) and mem > 0 else None,
                regions=tuple(dict.fromkeys(regions)))


def choose(types: dict, want: Want, project_dir=None) -> Choice:
    """The types a launch tries, in order, from the API's map (name -> TypeAvailability): the `--type`s in the order
    given (an unknown name is a usage error), else every type (with `--gpu`: whose GPU the ask covers, that many per
    instance) cheapest first; each left out, with its reason, when it has no price, costs more than --max-price, or
    has another GPU than the template expects. Regions per type: `launch_order` (requested ones, or every one listing
    capacity)."""
    from ..verify import gpus

    if want.types:
        ordered = []
        for name in want.types:
            a = find_type(types, name)
            if a is None:
                raise UsageError(f"unknown instance type {name!r}" + type_suggestion(types, name),
                                 hint="gpuops cloud types lists them")
            if a not in ordered:
                ordered.append(a)
    else:
        ordered = sorted(types.values(), key=lambda a: (a.type.price_cents_per_hour, a.type.name))
    cands, excluded = [], []
    for a in ordered:
        t = a.type
        hit = gpus.for_lambda_type(t.gpu_description, t.name, t.gpus, project_dir)
        row, count = hit if hit else (None, t.gpus)
        if want.gpu is not None and (row is None or row.id not in want.gpu.rows or count != want.gpu.count):
            continue  # not the GPU asked for: not a candidate at all
        why = _left_out(t, row, want, project_dir)
        if why:
            excluded.append((t.name, t.price_per_hour, why))
            continue
        cands.append(Candidate(name=t.name, price_cents_per_hour=t.price_cents_per_hour, gpus=count,
                               gpu=row.id if row else None, gpu_name=row.name if row else t.gpu_description,
                               regions=tuple(launch_order(a.regions, want.regions))))
    return Choice(tuple(cands), tuple(excluded))


def _left_out(t, row, want: Want, project_dir=None) -> Optional[str]:
    from ..verify import gpus

    if t.price_cents_per_hour <= 0:
        return "the API gives no price for it"
    if want.max_price is not None and t.price_per_hour > want.max_price + 1e-9:
        return f"${t.price_per_hour:.2f}/h is over --max-price ${want.max_price:.2f}"
    src = f"--from {want.template}" if want.template else "the template"
    if want.expect_gpu and (row is None or not gpus.satisfies(row, want.expect_gpu, project_dir)):
        return f"its GPU ({row.name if row else t.gpu_description or '?'}) is not {src}'s expect.gpu {want.expect_gpu!r}"
    if want.min_gpu_memory_mib and row is not None and row.memory_mib and row.memory_mib < want.min_gpu_memory_mib:
        return (f"{row.memory_mib:,} MiB per GPU is under {src}'s expect.gpu_memory_mib "
                f"{want.min_gpu_memory_mib:,}")
    return None


def no_candidate(choice: Choice, want: Want):
    """Why nothing can be launched whatever the capacity (a gpuops error to raise), or None when a type is left."""
    from ..errors import ExitCode, GpuopsError

    if choice.candidates:
        return None
    if not choice.excluded:
        return UsageError(f"--gpu {want.gpu.text}: no instance type has {want.gpu.count} x {want.gpu.name}"
                          if want.gpu else "the Lambda API lists no instance type to choose from",
                          hint=f"gpuops cloud types --gpu {want.gpu.name} lists the types with that GPU"
                          if want.gpu else "gpuops cloud types lists them")
    if all(why.startswith("the API gives no price") for _, _, why in choice.excluded):
        names = ", ".join(n for n, _, _ in choice.excluded)
        return GpuopsError(f"the Lambda API gives no price for {names}: gpuops does not launch what it cannot price "
                           "(the cost guard, `gpuops ls` and --max-cost need it), so nothing was launched",
                           hint="try again later; `gpuops cloud types` shows the prices the API lists",
                           code=ExitCode.FAILED)
    lines = "; ".join(f"{n}: {why}" for n, _, why in choice.excluded)
    return UsageError(f"no instance type fits {want.describe()} ({lines}); nothing was launched",
                      hint="`gpuops cloud types` with the same --gpu/--type/--max-price shows what would be tried")


def next_attempt(candidates, cold: set) -> Optional[tuple]:
    """The next (candidate, region) to launch: the first type in order with a region not yet found without capacity
    (`cold` holds (type, region) pairs); None when every listed one was tried."""
    for c in candidates:
        for r in c.regions:
            if (c.name, r) not in cold:
                return c, r
    return None


def no_capacity_text(want: Want, candidates, excluded, attempts) -> str:
    """Why a launch found nothing: what was asked, where, what was tried (type in region) and what was left out."""
    where = ", ".join(want.regions) if want.regions else "any region"
    cands = list(candidates)
    if len(cands) == 1 and not want.gpu:
        what = cands[0].name
        regions = [r for _, r in attempts]
        text = f"no capacity for {what} in {where}" + (f" (tried {', '.join(regions)})" if regions else " (none listed)")
    else:
        names = " or ".join(c.name for c in cands)
        text = (f"no capacity for {want.describe()} ({names}) in {where}"
                + (f" (tried {', '.join(f'{t} in {r}' for t, r in attempts)})" if attempts else " (none listed)"))
    if excluded:
        text += "; not tried: " + "; ".join(f"{n} ({why})" for n, _, why in excluded)
    return text


def waiting_line(want: Want, candidates, since: str, waited_s: float, next_s: float, left_s: float) -> str:
    """The one line `--wait-for-capacity` prints per re-read: what it waits for, since when, and what next."""
    shown = ", ".join(c.label() for c in list(candidates)[:4])
    more = len(candidates) - 4
    what = want.describe() + (f": {shown}" + (f" and {more} more" if more > 0 else "") if
                              (want.gpu or len(candidates) > 1) else "")
    where = ", ".join(want.regions) if want.regions else "any region"
    nxt = f"{next_s:.0f}s" if next_s >= 1 else f"{next_s:.1f}s"
    return (f"waiting for capacity since {since} ({format_duration(waited_s)}): {what} in {where}; "
            f"checking again in {nxt} ({format_duration(left_s)} left)")


def launched_expect(itype, template_expect: Optional[dict] = None, project_dir=None) -> dict:
    """The profile's expect: for the type that was launched: its GPU (as nvidia-smi names it), count and memory per
    GPU from the GPU table, over a --from template's own expect: (driver, cuda, packages, ... stay; its GPU words
    were a constraint on the choice, met by this type). A type the table does not know: its GPU count only."""
    from ..profiles.text import from_gpu_row
    from ..verify import gpus

    expect = dict(template_expect or {})
    hit = gpus.for_lambda_type(itype.gpu_description, itype.name, itype.gpus, project_dir)
    if hit is not None:
        expect.update(from_gpu_row(hit[0], hit[1], itype.name).values)
    elif itype.gpus:
        expect["gpu_count"] = itype.gpus
    return expect


def launched_preset(itype, project_dir=None) -> Optional[str]:
    """The env preset of the type's GPU (gpus.yaml `preset`), the one `sandbox up --gpu` gives its profile for the same
    GPU: what a profile `up` or `run` writes names (issue #36: a rehearsal ran with another environment). None when
    the table knows no preset for it."""
    from ..verify import gpus

    hit = gpus.for_lambda_type(itype.gpu_description, itype.name, itype.gpus, project_dir)
    return hit[0].preset if hit is not None else None


def readiness_deadline(gpus: int) -> float:
    return EIGHT_GPU_READY_S if gpus >= 8 else ONE_GPU_READY_S


def cost_so_far(price_per_hour: Optional[float], since: Optional[float], now: float) -> Optional[float]:
    if price_per_hour is None or since is None:
        return None
    return round(max(0.0, now - since) / 3600.0 * price_per_hour, 2)


@dataclass(frozen=True)
class Guard:
    """Where an instance stands against its TTL and idle limit (seconds; None when no limit)."""

    ttl_left: Optional[float]
    idle_left: Optional[float]

    @property
    def ttl_passed(self) -> bool:
        return self.ttl_left is not None and self.ttl_left <= 0

    @property
    def idle_passed(self) -> bool:
        return self.idle_left is not None and self.idle_left <= 0

    @property
    def expired(self) -> bool:
        return self.ttl_passed or self.idle_passed

    def reasons(self) -> list[str]:
        out = []
        if self.ttl_passed:
            out.append(f"TTL passed {format_duration(-self.ttl_left)} ago")
        if self.idle_passed:
            out.append(f"idle limit passed {format_duration(-self.idle_left)} ago")
        return out


def guard(now: float, *, ttl_deadline: Optional[float], idle_limit_s: Optional[float],
          last_active: Optional[float], launched_at: Optional[float]) -> Guard:
    """TTL: a fixed deadline. Idle: no gpuops run and GPU utilisation under 5 % since `last_active` (the last time gpuops
    saw work; the launch itself counts as activity)."""
    ttl_left = None if ttl_deadline is None else ttl_deadline - now
    idle_left = None
    if idle_limit_s is not None:
        since = max(x for x in (last_active, launched_at, 0.0) if x is not None)
        idle_left = since + idle_limit_s - now
    return Guard(ttl_left, idle_left)


def busy(run_running: bool, utilisations: Iterable[float]) -> bool:
    """One sample: is the instance doing work (a gpuops run running, or any GPU at or above 5 %)?"""
    return run_running or any(u >= IDLE_UTIL_PCT for u in utilisations)


# -- keys ------------------------------------------------------------------------------------------------------------
def key_blob(public_key_line: str) -> tuple[str, str]:
    parts = public_key_line.split()
    if len(parts) < 2:
        raise UsageError("not an OpenSSH public key line (expected 'TYPE BASE64 [comment]')")
    return parts[0], parts[1]


def same_key(a: str, b: str) -> bool:
    """Same key material (type and base64), whatever the comments."""
    try:
        return key_blob(a) == key_blob(b)
    except UsageError:
        return False


def fingerprint(public_key_line: str) -> str:
    _, blob = key_blob(public_key_line)
    digest = hashlib.sha256(base64.b64decode(blob)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def ssh_key_name(public_key_line: str) -> str:
    """gpuops-<first 12 characters of the SHA256 fingerprint> ('+' and '/' written '-' and '_' for a plain name)."""
    fp = fingerprint(public_key_line)[len("SHA256:"):]
    return "gpuops-" + fp[:12].replace("+", "-").replace("/", "_")


def cloud_config(host_private: str, host_public: str) -> str:
    """cloud-init user_data that replaces the instance's host keys with ours, so the first connection is checked."""
    indented = "\n".join("    " + line for line in host_private.strip().splitlines())
    return ("#cloud-config\n"
            "ssh_deletekeys: true\n"
            "ssh_genkeytypes: []\n"
            "ssh_keys:\n"
            "  ed25519_private: |\n"
            f"{indented}\n"
            f"  ed25519_public: {host_public.strip()}\n")


def launch_tags(launch_id: str, profile: str, ttl_deadline: Optional[float] = None) -> dict[str, str]:
    tags = {TAG_LAUNCH: launch_id, TAG_PROFILE: profile[:128]}
    if ttl_deadline is not None:
        tags[TAG_TTL] = str(int(ttl_deadline))
    return tags


LAST_TIME = 253402300799.0  # 9999-12-31T23:59:59Z: a deadline past it is not a time any clock here can show


def tag_deadline(tags: dict) -> Optional[float]:
    """The TTL deadline an instance carries in its tags (set by the gpuops that launched it), or None. A tag is
    untrusted input (anyone with the account's key writes tags): a value that is not a finite epoch time between
    1970 and 9999 (`inf`, `1e400`, `nan`, garbage) is None, as no tag; `bad_tag_deadline` says why."""
    try:
        value = float(tags[TAG_TTL])
    except (KeyError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) and 0 < value <= LAST_TIME else None


def shown_tag(value: object, limit: int = 40) -> str:
    """A tag's value as a message may quote it: printable (repr's escapes), cut to `limit` characters."""
    text = repr(str(value))
    return text if len(text) <= limit else text[:limit - 4] + "...'"


TAG_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # profiles.model.NAME_RE: a profile's file name


def tag_profile(tags: dict) -> Optional[str]:
    """The profile name an instance's tag gives, when it is one a profile can have (it is pasted into `gpuops down
    NAME` hints and looked up as a file), else None."""
    value = tags.get(TAG_PROFILE)
    return value if isinstance(value, str) and TAG_NAME_RE.fullmatch(value) and ".." not in value else None


def bad_tag_deadline(tags: dict) -> Optional[str]:
    """Why the instance's TTL tag is ignored (it is there and tag_deadline found no time in it), or None."""
    if TAG_TTL not in tags or tag_deadline(tags) is not None:
        return None
    return f"its tag {TAG_TTL}={shown_tag(tags[TAG_TTL])} is not a time (epoch seconds); ignored"


def adopt(instances: Iterable, launch_id: str) -> list:
    """The instances a launch created, by tag (never by name), not counting terminated ones."""
    return [i for i in instances if i.tags.get(TAG_LAUNCH) == launch_id and i.status not in GONE_STATUSES]


# -- ls and reap -----------------------------------------------------------------------------------------------------
def profile_names_instance(cloud: Optional[dict], instance_id: str) -> bool:
    """Does a managed profile's `cloud:` block name this instance as one it runs (state active)?"""
    if not isinstance(cloud, dict) or cloud.get("state", "active") != "active":
        return False
    ids = [n.get("instance_id") for n in cloud.get("nodes") or [] if isinstance(n, dict)] or [cloud.get("instance_id")]
    return instance_id in ids


def ls_rows(instances: list, records: list, profiles: dict[str, dict], now: float,
            live_owners: Iterable[str] = ()) -> tuple[list[dict], list[str]]:
    """Every instance on the account (managed ones marked: a ledger record or gpuops' launch tag) plus ledger records
    whose instance the API does not show (a launch in flight or lost): rows, and the loud lines.

    An instance is judged by its ledger record and its tags, never by a profile file: its TTL is the record's or, with
    no record here (launched from another machine or HOME), its tag's. Flagged (a loud line) when it may bill with
    nothing here using it: no profile names it, its launch was cut off (the process that launched it is gone), the
    ledger says it ended while the API shows it alive, or it is past a limit.

    `profiles`: profile name -> its `cloud:` block (the managed profiles of the user config folder).
    `live_owners`: launch ids whose launching gpuops process is still running (a bring-up in progress)."""
    live_owners = set(live_owners)
    by_instance = {r.instance_id: r for r in records if r.instance_id}
    by_launch = {r.launch_id: r for r in records}
    rows, alerts = [], []
    seen, seen_launches = set(), set()
    for inst in instances:
        tagged = inst.tags.get(TAG_LAUNCH)
        rec = by_instance.get(inst.id) or (by_launch.get(tagged) if tagged else None)
        if rec is not None and rec.instance_id not in (None, inst.id):
            rec = None  # the launch id names another instance (a duplicate the launch created): judged by its tags
        managed = rec is not None or bool(tagged)
        profile = rec.profile if rec else tag_profile(inst.tags)
        price = inst.type.price_per_hour if inst.type else (rec.price_cents_per_hour / 100 if rec else None)
        since = (rec.launched_at or rec.created_at) if rec else None
        ttl = rec.ttl_deadline if rec and rec.ttl_deadline is not None else tag_deadline(inst.tags)
        g = guard(now, ttl_deadline=ttl, idle_limit_s=rec.idle_limit_s if rec else None,
                  last_active=rec.last_active if rec else None, launched_at=since)
        live = inst.status not in GONE_STATUSES
        over = inst.status in OVER_STATUSES  # ended or ending: nothing left to warn about
        owner_alive = rec is not None and rec.launch_id in live_owners
        named = profile is not None and profile_names_instance(profiles.get(profile), inst.id)
        flags = []
        if managed and not over:
            if rec is None:
                flags.append("no launch record on this machine (launched from another machine or HOME)")
            elif not rec.open:
                flags.append(f"the ledger has it {rec.state} but the API shows it {inst.status}: still billing")
            elif not named and not owner_alive:
                flags.append(f"its bring-up was cut off before writing profile '{profile}'"
                             if rec.state == "launching" or profile not in profiles else
                             f"profile '{profile}' does not name it (it names another instance or is marked gone)")
        row = {"id": inst.id, "managed": managed, "profile": profile, "status": inst.status, "ip": inst.ip,
               "type": inst.type_name, "region": inst.region, "price_per_hour": price,
               "uptime_s": (now - since) if since and live else None,
               "cost_so_far": cost_so_far(price, since, now) if live and not over else None,
               "ttl_left_s": g.ttl_left if live and not over else None,
               "idle_left_s": g.idle_left if live and not over else None,
               "expired": managed and not over and g.expired, "reasons": g.reasons() if managed and not over else [],
               "launch_id": rec.launch_id if rec else tagged, "node": rec.node if rec else None,
               "has_profile": named, "flags": flags}
        seen.add(inst.id)
        if rec is not None:
            seen_launches.add(rec.launch_id)
        rows.append(row)
        if not managed or over:
            continue
        end = f"gpuops down {profile}" if named else f"gpuops down {inst.id}"
        ttl_note = ("" if ttl is None else
                    f"; its TTL passed {format_duration(now - ttl)} ago" if ttl <= now else
                    f"; `gpuops reap` ends it at its TTL (in {format_duration(ttl - now)})")
        for f in flags:
            alerts.append(f"instance {inst.id} ({inst.type_name}, ${price or 0:.2f}/h, profile {profile or '-'}): {f}"
                          f"{ttl_note}: `{end}` ends it")
        if rec is None and TAG_PROFILE in inst.tags and profile is None:
            alerts.append(f"instance {inst.id}: its tag {TAG_PROFILE}={shown_tag(inst.tags[TAG_PROFILE])} is not a "
                          f"profile name; ignored: `{end}` ends it")
        bad_ttl = bad_tag_deadline(inst.tags) if rec is None or rec.ttl_deadline is None else None
        if bad_ttl:
            alerts.append(f"instance {inst.id} (profile {profile or '-'}): {bad_ttl}, so no TTL ends it here: "
                          f"`{end}` ends it")
        if g.expired:
            alerts.append(f"instance {inst.id} (profile {profile}) is past its limit: {'; '.join(g.reasons())} — "
                          f"`{end}` or `gpuops reap`")
    for rec in records:
        if not rec.open or (rec.instance_id and rec.instance_id in seen) or rec.launch_id in seen_launches:
            continue
        status = "launching?" if rec.state == "launching" else "unseen"
        stale = now - rec.created_at > STALE_LAUNCH_S
        rows.append({"id": rec.instance_id, "managed": True, "profile": rec.profile, "status": status, "ip": None,
                     "type": rec.instance_type, "region": rec.region, "price_per_hour": rec.price_cents_per_hour / 100,
                     "uptime_s": None, "cost_so_far": None, "ttl_left_s": None, "idle_left_s": None, "expired": False,
                     "reasons": [], "launch_id": rec.launch_id, "node": rec.node, "has_profile": False,
                     "flags": ["recorded as launching, no instance listed"]})
        if rec.launch_id in live_owners and not stale:
            why = "its gpuops process is still launching it"
        elif rec.state == "launching":
            why = ("its gpuops process ended while the launch request was in flight" +
                   (" and no instance has appeared since" if stale else ""))
        else:
            why = "the API lists no such instance"
        alerts.append(f"launch {rec.launch_id} (profile {rec.profile}, {rec.instance_type}) is recorded as "
                      f"{rec.state}: {why}; an instance it creates carries its launch id, and `gpuops ls` shows it "
                      f"then; `gpuops down {rec.profile}` ends it, `gpuops reap` closes records the API confirms gone")
    return rows, alerts


def reap_candidates(rows: list[dict]) -> list[dict]:
    """Managed, alive, and past a limit."""
    return [r for r in rows if r["managed"] and r["id"] and r["expired"] and r["status"] not in OVER_STATUSES]
