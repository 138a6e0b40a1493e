"""A profile as model.py validated it, kept so that a command can start without pydantic (`gpuops sync`, the command
run again and again: pydantic's and typer's imports were 0.3 s of a 0.4 s no-change re-sync, issue 42).

model.load_profile() keeps each profile it validated (store); a later start reads it back (recall) only when it
was validated from the very same text by the very same model: the key is the profile file's path and text, the
home directory (`key: ~/...` is expanded), the values of the variables its `${VAR}`s read (from the environment
and .env, as validation reads them), gpuops' version and model.py itself. Anything else gets None, and the command
validates as always (which keeps it again). Never kept: a profile whose `${VAR}` lands where a secret may (env:,
notify_url, secrets, setup's index URLs: no secret reaches a file of gpuops'), a fleet (hosts:), anything not plain
data. The file is the owner's only (0600), one per profile file, replaced when the profile changes.

What recall gives is a View: the same attribute names and values as the model (Path, datetime, nested models,
`model_fields_set`), and the derived values both share (ProfileDerived, CloudDerived). No pydantic here.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, List, Optional

from ..errors import ProfileError
from ..paths import state_dir, write_private


class ProfileDerived:
    """What Profile and its kept View derive the same way from their fields (and nodes())."""

    @property
    def address(self) -> str:
        """The address other nodes use to reach this one."""
        return self.private_ip or self.host

    def remote_dir_for(self, project_dir: Path | None = None) -> str:
        """The remote project directory; defaults to ~/<local project folder name>."""
        if self.remote_dir:
            return self.remote_dir
        return "~/" + (project_dir or Path.cwd()).resolve().name

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def node(self, index: Optional[int], flag: str = "--host"):
        """The host numbered `index` (--host N, or `flag` N where the command calls it otherwise), or rank 0."""
        nodes = self.nodes()
        if index is None:
            return nodes[0]
        if not 0 <= index < len(nodes):
            raise ProfileError(f"{flag} {index}: profile '{self.name}' has {len(nodes)} host(s), numbered 0 to "
                               f"{len(nodes) - 1}")
        return nodes[index]


class CloudDerived:
    @property
    def instance_ids(self) -> List[str]:
        """Every instance behind the profile (one, or a fleet's in rank order)."""
        return [n.instance_id for n in self.nodes] or [self.instance_id]


class View:
    """A kept model: its fields as attributes, read only by convention (a command that changes a profile validates
    it: profiles new/pin, up)."""

    def __init__(self, kind: str, fields: dict, given: list) -> None:
        self.__dict__.update(fields)
        self.model_fields_set = set(given)
        self.kept_kind = kind

    def __repr__(self) -> str:
        return f"<kept {self.kept_kind} {getattr(self, 'name', '')}>".replace(" >", ">")


class ProfileView(ProfileDerived, View):
    """A one-host profile (a fleet is never kept): rank 0, its own only node."""

    rank = 0
    is_fleet = False

    def nodes(self) -> list:
        return [self]


class CloudInfoView(CloudDerived, View):
    pass


_VIEWS = {"Profile": ProfileView, "CloudInfo": CloudInfoView}


class _NotPlain(Exception):
    pass


def _memo_file(path: Path) -> Path:
    return state_dir() / "profile-memo" / (hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32] + ".json")


# where a ${VAR} may land for the profile to be kept: none of these holds a secret (env:, notify_url, secrets and
# setup's index URLs may: a profile reading the environment there is never kept)
KEPT_WHERE = ("host", "hosts", "user", "port", "key", "remote_dir", "python", "region", "private_ip",
              "instance_type", "price_per_hour", "connect_timeout", "host_key", "host_key_policy", "expect", "sync",
              "fetch", "slurm", "checks")


def _key(path: Path, text: str, names: list, project_dir: Path | None) -> str:
    """The key a kept profile is found by: what validation read (the text, the variables named, the home directory
    for `~`) and what validated it (gpuops' version, model.py)."""
    from .. import __version__
    from .envfile import environment

    st = Path(__file__).with_name("model.py").stat()
    env = environment(project_dir) if names else {}
    parts = [__version__, str(path.resolve()), text, os.path.expanduser("~"), st.st_size, st.st_mtime_ns,
             [[n, env.get(n)] for n in names]]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _kept_where(where: str) -> bool:
    return where.replace("[", ".").split(".")[0] in KEPT_WHERE


def _encode(v: Any) -> Any:
    from datetime import datetime  # here and in _decode only: a start that reads a kept profile may not need it

    fields = getattr(type(v), "model_fields", None)
    if isinstance(fields, dict):  # a pydantic model: its fields, and which of them the file gave
        return {"__model__": type(v).__name__, "given": sorted(v.model_fields_set),
                "fields": {k: _encode(getattr(v, k)) for k in fields}}
    if isinstance(v, Path):
        return {"__path__": str(v)}
    if isinstance(v, datetime):
        return {"__datetime__": v.isoformat()}
    if isinstance(v, dict):
        return {"__dict__": {str(k): _encode(x) for k, x in v.items()}}
    if isinstance(v, list):
        return [_encode(x) for x in v]
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    raise _NotPlain(type(v).__name__)


def _decode(v: Any) -> Any:
    if isinstance(v, list):
        return [_decode(x) for x in v]
    if not isinstance(v, dict):
        return v
    if "__model__" in v:
        cls = _VIEWS.get(v["__model__"], View)
        return cls(v["__model__"], {k: _decode(x) for k, x in v["fields"].items()}, v["given"])
    if "__path__" in v:
        return Path(v["__path__"])
    if "__datetime__" in v:
        from datetime import datetime

        return datetime.fromisoformat(v["__datetime__"])
    return {k: _decode(x) for k, x in v["__dict__"].items()}


def store(profile: Any, path: Path, text: str, used: list, project_dir: Path | None = None) -> None:
    """Keep `profile`, just validated from `text` (the file at `path`); used: the (where, VAR) its ${VAR}s were read
    at. Best effort: a state folder that cannot be written costs only the next start's speed."""
    if getattr(profile, "hosts", None) or not all(_kept_where(w) for w, _ in used):
        return
    names = sorted({n for _, n in used})
    try:
        key = _key(path, text, names, project_dir)
        memo = _memo_file(path)
        try:
            if json.loads(memo.read_text())["key"] == key:
                return  # kept already: no write on every start
        except (OSError, ValueError, KeyError, TypeError):
            pass
        write_private(memo, json.dumps({"key": key, "reads": names, "profile": _encode(profile)}))
    except (_NotPlain, OSError):
        return


def recall(path: Path, project_dir: Path | None = None) -> Optional[ProfileView]:
    """The profile kept for the file at `path` as it reads now (its variables' values too), or None: not kept,
    changed, or gpuops changed. Then the command validates it as always."""
    try:
        doc = json.loads(_memo_file(path).read_text())
        text = path.read_text(encoding="utf-8")
        if doc.get("key") != _key(path, text, list(doc["reads"]), project_dir):
            return None
        prof = _decode(doc["profile"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return prof if isinstance(prof, ProfileView) else None
