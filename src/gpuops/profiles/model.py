"""Profiles: one YAML file per instance, validated by pydantic.

Lookup and selection (which file, this project's default) live in locate.py, without pydantic, and are imported
here too; memo.py keeps each profile validated here for a start that needs no pydantic (`gpuops sync`).
`shell_path` and `shell_command` live in remote/shell.py (below profiles); they are imported here too so that
`profiles.model.shell_path` keeps working for code that reads a profile and quotes its paths.
"""
from __future__ import annotations

import difflib
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from ..errors import ProfileError
from .envfile import dotenv_problems, environment, read_dotenv  # noqa: F401
from .memo import CloudDerived, ProfileDerived, store
from .locate import (PROFILE_SUFFIXES, available, last_used, locate, remember, search_dirs,  # noqa: F401
                     selected_how, terminated, use)
from ..remote.shell import remote_dir_spelling_problem, shell_command, shell_path  # noqa: F401

DEFAULT_EXCLUDES = [".git", "checkpoints", "outputs", "wandb", "__pycache__", "*.pyc", ".venv", "logs", "node_modules"]
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9_][A-Za-z0-9_-]{0,62}(\.[A-Za-z0-9_][A-Za-z0-9_-]{0,62})*\.?")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def valid_host(v: Any) -> Any:
    """An IP address or a DNS name, nothing else (no user@, no spaces, no leading '-' that ssh would read as an
    option). Shared by Profile.host, hosts: entries and `gpuops profiles new --host`."""
    import ipaddress

    if not isinstance(v, str):
        return v
    text = v.strip()
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    if not _HOSTNAME.fullmatch(text):
        why = "user@ belongs in 'user:'" if "@" in text else "port belongs in 'port:'" if ":" in text and \
            text.count(":") == 1 else "an IP address or a DNS name"
        raise ValueError(f"{text!r} is not a host ({why})")
    return text


def check_name(name: str) -> str:
    """A profile name is its file name: a file-safe word (letters, digits, '-', '_', '.'; 64 at most)."""
    from ..errors import UsageError

    if not NAME_RE.fullmatch(name or "") or name.endswith(PROFILE_SUFFIXES) or ".." in name:
        raise UsageError(f"profile name {name!r} is not a file-safe word",
                         hint="use letters, digits, '-', '_' and '.', starting with a letter or digit, without "
                              ".yaml (e.g. lambda-h100)")
    return name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Expect(_Strict):
    gpu: Optional[str] = Field(None, description="substring of the GPU name, e.g. 'H100'")
    gpu_count: Optional[int] = Field(None, ge=0)
    gpu_memory_mib: Optional[int] = Field(None, ge=0, description="minimum memory per GPU")
    driver: Optional[str] = None
    cuda: Optional[str] = None
    python: Optional[str] = None
    packages: Dict[str, str] = Field(default_factory=dict)
    imports: List[str] = Field(default_factory=list, description="modules that must import")
    min_disk_gb: Optional[float] = Field(None, ge=0)
    min_memory_gib: Optional[float] = Field(None, ge=0)
    mig: Optional[bool] = Field(None, description="MIG mode expected on (true) or off (false); unset: off, warned when on")

    @field_validator("driver", "cuda", "python", mode="before")
    @classmethod
    def _as_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, (int, float)) else v

    @field_validator("packages", mode="before")
    @classmethod
    def _spec_text(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): ("*" if val is None else str(val)) for k, val in v.items()}
        return v


class SyncSettings(_Strict):
    exclude: List[str] = Field(default_factory=lambda: list(DEFAULT_EXCLUDES))
    copy_links: bool = Field(False, description="a symlink pointing outside the project is sent as the file or "
                                                "folder it points to (rsync --copy-unsafe-links), not as a link")


class SetupSettings(_Strict):
    """`setup:`: how `gpuops setup` brings the host to this profile (docs/setup.md)."""
    torch_index: Optional[str] = Field(None, description="index for torch/torchvision/torchaudio (a mirror, a CPU "
                                                         "index); default: the PyTorch index of the driver's CUDA")
    index_url: Optional[str] = Field(None, description="index for the project's own dependencies (a mirror); "
                                                       "default: the host's pip configuration, else PyPI")
    extra_index_url: List[str] = Field(default_factory=list, description="more indexes for the project's "
                                       "dependencies (a private package), besides the host's pip configuration's")
    extras: Union[Literal["all"], List[str]] = Field(default_factory=list, description="optional dependency groups "
                                                     "of the project to install, or `all`")
    requirements: List[str] = Field(default_factory=lambda: ["requirements.txt"],
                                    description="requirements files to install (their -r includes are followed)")
    system_site_packages: bool = Field(True, description="an environment setup creates sees the base python's "
                                       "packages (an image's CUDA torch)")
    base_python: Optional[str] = Field(None, description="the interpreter setup makes the environment from "
                                                         "(default: python3)")
    disk_check: bool = Field(True, description="refuse a plan whose estimate does not fit the free disk")
    sudo: bool = Field(False, description="may setup use sudo (it installs nothing system-wide either way)")
    cache_dir: Optional[str] = Field(None, description="uv/pip download cache on the host (default: a folder on the "
                                                       "largest free disk when the home disk is short)")
    install_uv: bool = Field(True, description="install uv with `pip install --user uv` when the host has none")
    flash_attn_wheel: Optional[str] = Field(None, description="URL or path of a prebuilt flash-attn wheel")
    max_jobs: int = Field(4, ge=1, description="MAX_JOBS for a flash-attn build (each job can take 5+ GB of RAM)")

    @field_validator("extra_index_url", "requirements", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("extras", mode="before")
    @classmethod
    def _extras(cls, v: Any) -> Any:
        if v == ["all"]:
            return "all"
        return [v] if isinstance(v, str) and v != "all" else v


class HostEntry(_Strict):
    """One host of a fleet profile (`hosts:`); unset keys take the profile's shared value."""
    host: str
    port: Optional[int] = Field(None, ge=1, le=65535)
    user: Optional[str] = None
    key: Optional[Path] = None
    remote_dir: Optional[str] = None
    python: Optional[str] = None
    private_ip: Optional[str] = Field(None, description="address the nodes use to reach this one (default: host)")
    host_key: Optional[str] = Field(None, description="this host's key as pinned at its launch (an OpenSSH public "
                                    "line): the host is judged by it alone")

    _host = field_validator("host", mode="before")(classmethod(lambda cls, v: valid_host(v)))
    _pin = field_validator("host_key", mode="before")(classmethod(lambda cls, v: valid_host_key(v)))

    @field_validator("key", mode="before")
    @classmethod
    def _expand_key(cls, v: Any) -> Any:
        return Path(os.path.expanduser(str(v))) if v not in (None, "") else None

    @field_validator("remote_dir", mode="before")
    @classmethod
    def _remote_dir_given(cls, v: Any) -> Any:
        return _explicit_remote_dir(v)


def _explicit_remote_dir(v: Any) -> Any:
    """Runs only when the key is written: an empty value (YAML reads a lone `~` as empty) is an error, never a silent
    fall-back to the default folder."""
    if v is None or (isinstance(v, str) and not v.strip()):
        raise ValueError("is empty (YAML reads a lone ~ as empty): write the folder, e.g. ~/my-project, or leave "
                         "the key out for the default ~/<project folder>")
    if isinstance(v, str):
        why = remote_dir_spelling_problem(v)
        if why:
            raise ValueError(why)
    return v



_NODE_KEYS = ("host", "port", "user", "key", "remote_dir", "python", "private_ip", "host_key")


def valid_host_key(v: Any) -> Any:
    """`host_key:`, an OpenSSH public line (`ssh-ed25519 AAAA...`, a comment allowed): what `gpuops up` pinned."""
    if v in (None, ""):
        return None
    import base64
    import binascii

    parts = str(v).split()
    try:
        ok = len(parts) >= 2 and base64.b64decode(parts[1], validate=True)[4:4 + len(parts[0])] == parts[0].encode()
    except (binascii.Error, ValueError):
        ok = False
    if not ok:
        raise ValueError("is not an OpenSSH public key line (type and base64, e.g. ssh-ed25519 AAAA...)")
    return " ".join(parts[:2])


class CloudNode(_Strict):
    """One instance of a fleet written by `gpuops up --nodes N` (rank order, as `hosts:`)."""

    instance_id: str
    launch_id: str


class CloudFilesystem(_Strict):
    """A Lambda filesystem the instance mounts (`gpuops up --fs` / `run --fs`), where the API says it is mounted."""

    name: str
    id: str
    mount_point: str


class SlurmSettings(_Strict):
    """`slurm:`: the profile's host is a Slurm cluster's login node (docs/slurm.md). Slurm is the engine: gpuops
    verifies the nodes through `srun`, submits with `sbatch`, follows with `squeue`/`sacct`/`scontrol`, stops with
    `scancel`. `remote_dir` is on the filesystem every node shares."""
    partition: Optional[str] = Field(None, description="the partition (default: the cluster's default partition)")
    account: Optional[str] = None
    qos: Optional[str] = None
    nodes: int = Field(1, ge=1, le=4096, description="nodes per job (and verified by `gpuops verify`)")
    gpus_per_node: int = Field(0, ge=0, le=64, description="GPUs per node asked for (--gres=gpu:N; 0: none)")
    gpu_type: Optional[str] = Field(None, description="a gres type (--gres=gpu:TYPE:N), if the cluster names them")
    gpu_option: Literal["gres", "gpus-per-node"] = "gres"
    cpus_per_task: Optional[int] = Field(None, ge=1)
    time: Optional[str] = Field(None, description="the job's time limit, Slurm's form (minutes, [D-]HH:MM:SS)")
    exclude: List[str] = Field(default_factory=list, description="nodes to keep jobs off (a node verify failed)")
    nodelist: List[str] = Field(default_factory=list)
    signal_before_s: Optional[int] = Field(120, ge=0, description="USR1 to the batch shell this long before the "
                                           "time limit (--signal=B:USR1@N); null: none")
    extra_sbatch: List[str] = Field(default_factory=list, description="more #SBATCH options (--constraint=ib ...)")
    price_per_gpu_hour: Optional[float] = Field(None, ge=0, description="for the cost beside the GPU-hours")
    launcher: Literal["torchrun", "none"] = Field("torchrun", description="torchrun with c10d on the allocation's "
                                                  "first node, or the command once per node (none)")
    checkpoints: Optional[str] = Field("checkpoints", description="the folder the job writes its checkpoints in "
                                       "(relative to remote_dir, or absolute; the job's GPUOPS_CHECKPOINT_DIR): a "
                                       "requeued attempt resumes from the newest complete one of this run; null: none")


class CloudInfo(CloudDerived, _Strict):
    """Written by `gpuops up`: the instance behind this profile and its cost guard (docs/cloud.md). A fleet
    (`up --nodes N`) lists every instance under `nodes:`; instance_id and launch_id are then rank 0's."""

    provider: Literal["lambda"] = "lambda"
    instance_id: str
    launch_id: str
    launched_at: Optional[datetime] = None
    ttl_deadline: Optional[datetime] = None
    idle_limit_s: Optional[float] = Field(None, gt=0)
    state: Literal["active", "gone"] = "active"
    nodes: List[CloudNode] = Field(default_factory=list, description="every instance of a fleet, rank order")
    filesystems: List[CloudFilesystem] = Field(default_factory=list, description="the filesystems attached at launch")



class Profile(ProfileDerived, _Strict):
    name: str = ""
    source: Optional[Path] = Field(None, exclude=True)
    host: str
    hosts: List[HostEntry] = Field(default_factory=list, description="several hosts (a fleet); the first is rank 0")
    private_ip: Optional[str] = None
    user: str = "ubuntu"
    port: int = Field(22, ge=1, le=65535)
    key: Optional[Path] = None
    remote_dir: Optional[str] = None
    python: str = "python3"
    region: Optional[str] = None
    instance_type: Optional[str] = None
    price_per_hour: Optional[float] = Field(None, ge=0)
    notify_url: Optional[str] = Field(None, description="a Slack or Discord webhook for --notify (write it as "
                                      "${VAR}: the URL is a secret)")
    host_key_policy: Literal["accept-new", "strict"] = "accept-new"
    host_key: Optional[str] = Field(None, description="the host's key as pinned at its launch (`gpuops up` writes "
                                    "it): the host is judged by it alone, whatever known_hosts holds for its address")
    connect_timeout: float = Field(10.0, gt=0)
    expect: Expect = Field(default_factory=Expect)
    sync: SyncSettings = Field(default_factory=SyncSettings)
    env_preset: Optional[str] = None
    env: Dict[str, str] = Field(default_factory=dict)
    secrets: List[str] = Field(default_factory=list, description="names of environment variables sent as secrets")
    fetch: Dict[str, str] = Field(default_factory=lambda: {"checkpoints": "checkpoints"})
    cloud: Optional[CloudInfo] = None
    slurm: Optional[SlurmSettings] = Field(None, description="the host is a Slurm cluster's login node "
                                           "(docs/slurm.md)")
    setup: SetupSettings = Field(default_factory=SetupSettings)
    checks: List[str] = Field(default_factory=list, description="opt-in verify checks by name (playbooks/rules.yaml "
                              "optional_checks: uv, vllm, packaging, mbridge, apex, flash-attn)")

    _host = field_validator("host", mode="before")(classmethod(lambda cls, v: valid_host(v)))
    _pin = field_validator("host_key", mode="before")(classmethod(lambda cls, v: valid_host_key(v)))

    @field_validator("key", mode="before")
    @classmethod
    def _expand_key(cls, v: Any) -> Any:
        return Path(os.path.expanduser(str(v))) if v not in (None, "") else None

    _shared: Dict[str, Any] = PrivateAttr(default_factory=dict)
    _rank: int = PrivateAttr(default=0)

    @model_validator(mode="before")
    @classmethod
    def _fleet(cls, data: Any) -> Any:
        """`hosts:` instead of `host:`: each entry a string or a mapping; rank 0's host fills `host`."""
        if not isinstance(data, dict) or "hosts" not in data:
            return data
        hosts = data.get("hosts")
        if "host" in data:
            raise ValueError("give either host: (one host) or hosts: (a fleet), not both")
        if not isinstance(hosts, list) or not hosts:
            raise ValueError("hosts: must be a non-empty list of hosts (each a string or a mapping with host:)")
        entries = [{"host": h} if isinstance(h, str) else h for h in hosts]
        first = entries[0] if isinstance(entries[0], dict) else {}
        return dict(data, hosts=entries, host=first.get("host", ""))

    @model_validator(mode="after")
    def _rank0(self) -> "Profile":
        """A fleet profile stands for its rank 0 (so every one-host command acts on rank 0); the shared values are
        kept for nodes()."""
        if self.hosts:
            self._shared = {k: getattr(self, k) for k in _NODE_KEYS}
            for k in _NODE_KEYS:
                v = getattr(self.hosts[0], k)
                if v is not None:
                    setattr(self, k, v)
        return self

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def is_fleet(self) -> bool:
        return len(self.hosts) > 1

    def nodes(self) -> list["Profile"]:
        """One profile per host, rank order (a one-host profile: itself)."""
        if not self.hosts:
            return [self]
        out = []
        for i, h in enumerate(self.hosts):
            over = {k: getattr(h, k) for k in _NODE_KEYS if getattr(h, k) is not None}
            node = self.model_copy(update={**self._shared, **over, "hosts": []})
            node.source = self.source
            node._rank = i
            out.append(node)
        return out

    # node(index): ProfileDerived's (memo.py), over nodes()

    @field_validator("remote_dir", mode="before")
    @classmethod
    def _remote_dir_given(cls, v: Any) -> Any:
        return _explicit_remote_dir(v)

    @field_validator("env", mode="before")
    @classmethod
    def _env_text(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for k in v:
                check_env_name(str(k), "env")
            return {str(k): str(val) for k, val in v.items()}
        return v

    @field_validator("secrets", mode="before")
    @classmethod
    def _secret_names(cls, v: Any) -> Any:
        if isinstance(v, list):
            for k in v:
                check_env_name(str(k), "secrets")
        return v

    # address, remote_dir_for(), destination: ProfileDerived (memo.py), shared with the kept form


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env_name(name: str, where: str) -> str:
    """An environment variable name that can go into a shell script as it is (it is never quoted: `NAME=value`)."""
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a variable name (letters, digits and _, not starting with a digit)")
    return name


# -- ${VAR} (the .env reading is envfile.py's) --------------------------------------------------
def _interpolate(node: Any, env: dict[str, str], where: str, source: Path, used: list | None = None) -> Any:
    """`node` with every ${VAR} / ${VAR:-default} replaced; `used` gets (where, VAR) for each (memo.py's key)."""
    if isinstance(node, dict):
        return {k: _interpolate(v, env, f"{where}.{k}" if where else str(k), source, used) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, env, f"{where}[{i}]", source, used) for i, v in enumerate(node)]
    if isinstance(node, str) and "${" in node:
        def sub(m: re.Match) -> str:
            name, default = m.group(1), m.group(2)
            if used is not None:
                used.append((where, name))
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ProfileError(f"{source}: {where}: ${{{name}}} is not set in the environment or .env",
                               hint=f"export {name}=... or add it to .env, or write ${{{name}:-default}}")
        return _VAR.sub(sub, node)
    return node


# -- loading -----------------------------------------------------------------------------
def _describe_error(err: dict, model: type[BaseModel]) -> str:
    loc = [str(p) for p in err["loc"]]
    key = ".".join(loc)
    if err["type"] == "extra_forbidden":
        parent: Any = model
        for part in loc[:-1]:
            field = getattr(parent, "model_fields", {}).get(part)
            parent = getattr(field, "annotation", None) if field else None
        known = list(getattr(parent, "model_fields", {}).keys()) if parent else []
        known = [k for k in known if k not in ("name", "source")]
        close = difflib.get_close_matches(loc[-1], known, n=1)
        tip = f"; did you mean '{close[0]}'?" if close else (f"; expected one of: {', '.join(known)}" if known else "")
        return f"{key}: unknown key{tip}"
    if err["type"] == "missing":
        return f"{key}: required key is missing"
    got = err.get("input")
    shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
    if err["type"] == "value_error":  # our own validators: their message says it all
        msg = str(err.get("ctx", {}).get("error") or err["msg"])
        return f"{key}: {msg}" if key else msg
    return f"{key}: {err['msg'].lower()} (got {shown})"


def load_profile(path: Path, project_dir: Path | None = None) -> Profile:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read profile: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise ProfileError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at line {line})",
                           hint="save the profile as UTF-8") from None
    used: list = []
    prof = profile_from_text(text, path, project_dir, used=used)
    store(prof, path, text, used, project_dir)  # for a start without pydantic (memo.py)
    return prof


def profile_from_text(text: str, path: Path, project_dir: Path | None = None, *, used: list | None = None) -> Profile:
    """The one gate every profile passes, read from a file or about to be written (`profiles new`, `pin`)."""
    import yaml

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ProfileError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: a profile must be a mapping of keys (host:, user:, ...), got {type(raw).__name__}")
    raw = _interpolate(raw, environment(project_dir), "", path, used)
    if "name" in raw:
        raise ProfileError(f"{path}: name: unknown key; a profile is named by its file name")
    raw["name"] = path.stem
    try:
        prof = Profile.model_validate(raw)
    except ValidationError as exc:
        problems = [_describe_error(e, Profile) for e in exc.errors()]
        msg = f"{path}: " + problems[0] if len(problems) == 1 else f"{path}: " + "; ".join(problems)
        raise ProfileError(msg, hint="see docs/profiles.md for every key") from None
    prof.source = path
    return prof


def resolve(name: str | None = None, project_dir: Path | None = None) -> Profile:
    """Pick and load a profile: name (a name or a path), else $GPUOPS_PROFILE, else last used, else the only one
    (locate.py chooses the file, without pydantic; this validates it)."""
    project_dir = project_dir or Path.cwd()
    return load_profile(locate(name, project_dir), project_dir)
