"""The local record of every launch: the source of truth for "what might be billing".

A record is written BEFORE the launch request (state `launching`: a request may be in flight), under an exclusive file
lock, with the profile name, the TTL deadline and the idle limit, and the instance id is added after (`launched`).
`terminated` closes it; `failed` means the API said no and nothing was created. Writes are atomic and private (0600).
The first record of a bring-up reserves its profile name (`reserve`): under the same lock, a name with an open record
of another bring-up is refused. Each record names the process that wrote it (pid, host), so `gpuops ls` tells a launch
in progress from one whose process is gone. The lock also carries the time of the last launch request, so that
several gpuops processes together stay under Lambda's one launch per 12 s.
"""
from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

from ..paths import state_dir, write_private

LAUNCHING, LAUNCHED, TERMINATED, FAILED = "launching", "launched", "terminated", "failed"
OPEN_STATES = (LAUNCHING, LAUNCHED)


@dataclass
class Record:
    launch_id: str
    profile: str
    instance_type: str
    region: str
    price_cents_per_hour: int
    created_at: float  # epoch seconds, when the record was written (before the request)
    state: str = LAUNCHING
    instance_id: Optional[str] = None
    launched_at: Optional[float] = None  # when the instance id was known
    ttl_deadline: Optional[float] = None  # epoch seconds
    idle_limit_s: Optional[float] = None
    last_active: Optional[float] = None  # last time gpuops saw a run or GPU work on it
    ended_at: Optional[float] = None
    regions_tried: list = field(default_factory=list)
    note: str = ""
    node: Optional[int] = None  # a fleet's node rank (`up --nodes N`)
    bringup: Optional[str] = None  # one `gpuops up` (every node of a fleet): the owner of the profile name
    pid: Optional[int] = None  # the gpuops process that launches it, on `host`
    host: Optional[str] = None

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


_REQUIRED = tuple(n for n, f in Record.__dataclass_fields__.items()
                  if f.default is MISSING and f.default_factory is MISSING)


def _parse(text: str) -> tuple[dict, Optional[str]]:
    """(the ledger's document, None), or ({}, why it is not one)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return {}, f"not JSON: {exc}" if text.strip() else "empty"
    if not isinstance(doc, dict):
        return {}, f"a JSON {type(doc).__name__ if doc is not None else 'null'}, not the ledger's object"
    recs = doc.get("records", {})
    if not isinstance(recs, dict):
        return {}, "its records are not a map of launch ids"
    bad = [k for k, r in recs.items() if not isinstance(r, dict) or any(f not in r for f in _REQUIRED)]
    if bad:
        return {}, f"record {bad[0]!r} is incomplete"
    if not isinstance(doc.get("last_launch_at", 0.0), (int, float)):
        return {}, "last_launch_at is not a time"
    return doc, None


def _aside(path: Path) -> Path:
    """Move `path` to path.corrupt-<time> (a name no earlier one holds: never overwritten). Returns the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        aside = path.with_name(f"{path.name}.corrupt-{stamp}" + (f"-{n}" if n else ""))
        try:
            os.link(path, aside)  # fails if the name is taken: nothing is overwritten
        except FileExistsError:
            continue
        os.unlink(path)
        return aside
    raise OSError(f"no free name beside {path} to keep it aside")


def _stderr(message: str) -> None:
    import sys

    print(f"warning: {message}", file=sys.stderr)


def ledger_path() -> Path:
    return state_dir() / "cloud" / "ledger.json"


class Ledger:
    def __init__(self, path: Path | None = None, on_passed_over: Optional[Callable[[str], None]] = None):
        self.path = path or ledger_path()
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.on_passed_over = on_passed_over or _stderr
        self.passed_over: Optional[Path] = None  # where an unreadable ledger was kept aside

    @contextmanager
    def transaction(self) -> Iterator[dict]:
        """Exclusive lock; yields the document {"records": {launch_id: dict}, "last_launch_at": float}; saved on exit."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            doc = self._read()
            before = json.dumps(doc, sort_keys=True)
            yield doc
            if json.dumps(doc, sort_keys=True) != before:
                write_private(self.path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _read(self) -> dict:
        """The document, or an empty one: a ledger that is empty, truncated or not the ledger's shape (`null`,
        `{"records": []}`) never blocks the way out (ls, down, reap find instances by their tags): it is kept aside as
        ledger.json.corrupt-<time> (never lost, never overwritten) and passed over, said once (`on_passed_over`)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            text = None
        except OSError as exc:
            from ..errors import GpuopsError

            raise GpuopsError(f"the launch ledger {self.path} is unreadable ({exc}); it records what may be billing, "
                              "so gpuops stops rather than guess", hint="inspect or restore the file, then try again")
        doc, why = ({}, None) if text is None else _parse(text)
        if why is not None:
            doc = {}
            aside = _aside(self.path)
            self.passed_over = aside
            self.on_passed_over(f"the launch ledger {self.path} was unreadable ({why}), so it was passed over: "
                                f"instances are found by their gpuops tags through the API; the file is kept as "
                                f"{aside}")
        doc.setdefault("records", {})
        doc.setdefault("last_launch_at", 0.0)
        return doc

    # -- reads -------------------------------------------------------------------------------------------------------
    def records(self) -> list[Record]:
        with self.transaction() as doc:
            return [Record.from_dict(r) for r in doc["records"].values()]

    def get(self, launch_id: str) -> Optional[Record]:
        with self.transaction() as doc:
            r = doc["records"].get(launch_id)
            return Record.from_dict(r) if r else None

    def by_instance(self, instance_id: str) -> Optional[Record]:
        return next((r for r in self.records() if r.instance_id == instance_id), None)

    def open_for_profile(self, profile: str) -> list[Record]:
        return [r for r in self.records() if r.profile == profile and r.open]

    # -- writes ------------------------------------------------------------------------------------------------------
    def add(self, rec: Record) -> None:
        with self.transaction() as doc:
            doc["records"][rec.launch_id] = asdict(rec)

    def update(self, launch_id: str, **changes) -> Record:
        with self.transaction() as doc:
            r = doc["records"][launch_id]
            r.update(changes)
            return Record.from_dict(r)

    def reserve(self, rec: Record, taken) -> Optional[str]:
        """Add `rec` unless its profile name is taken: `taken(open records of that name from other bring-ups)` returns
        why (then nothing is added) or None. Checked and written under one lock, so of two `gpuops up NAME` at once
        exactly one gets the name."""
        with self.transaction() as doc:
            others = [Record.from_dict(r) for r in doc["records"].values()
                      if r.get("profile") == rec.profile and r.get("state") in OPEN_STATES
                      and (r.get("bringup") is None or r.get("bringup") != rec.bringup)]
            why = taken(others)
            if why:
                return why
            doc["records"][rec.launch_id] = asdict(rec)
            return None

    def claim_launch_slot(self, now: float, interval: float) -> float:
        """0 and the slot is taken (last_launch_at = now) if `interval` has passed since the last launch request by any
        gpuops process; else the seconds still to wait (nothing taken)."""
        with self.transaction() as doc:
            wait = float(doc.get("last_launch_at") or 0.0) + interval - now
            if wait > 0:
                return wait
            doc["last_launch_at"] = now
            return 0.0

    def launch_answered(self, now: float) -> None:
        """The launch request's answer came at `now`: the next slot counts from here, not from the claim (the service
        counts from when it received the request, which may be later than the claim), so the next request is not
        refused (429) on the boundary."""
        with self.transaction() as doc:
            doc["last_launch_at"] = max(float(doc.get("last_launch_at") or 0.0), now)

    def note_activity(self, instance_id: str, when: float) -> None:
        with self.transaction() as doc:
            for r in doc["records"].values():
                if r.get("instance_id") == instance_id and (r.get("last_active") or 0) < when:
                    r["last_active"] = when
