"""`gpuops setup`, the deciding part: host facts + profile + project files + knowledge -> an ordered plan of steps,
and the shell script that runs it (setup/render.py). Pure (no I/O): unit-tested on recorded facts. What the project's
files say is read by setup/project.py; the talking half is setup/apply.py (one execution gathers the facts, one starts
the script detached, one streams its log), the remote scripts are in setup/scripts.py.

A step is shell text whose every value is quoted; the script runs them in order under `set -e` semantics (a failed
step ends the script with its exit code), then records a stamp (.gpuops/setup/done.json) that lets the next setup see
that nothing the install reads has changed since it ran.

What users bring, and what the plan does with it:
- an image whose system Python already has a CUDA torch (Lambda Stack): the environment setup creates sees the
  system's packages (`--system-site-packages`), and the project's requirements are installed with pip, which counts
  the image's torch as installed (uv would install a second copy of several GB); a torch the project pins that the
  image's does not match is installed for the driver's CUDA first;
- a uv project with its lock (`uv sync --locked`, extras by name or all), a pyproject project without a lock
  (installed editable: the job runs the synced source), a requirements.txt with `-r`/`-c` includes (every included
  file is part of the no-op check), a pyproject that only configures tools next to a requirements.txt;
- the host's pip configuration (index-url, extra-index-url, find-links, cert, trusted-host): pip reads it itself, and
  setup.sh gives it to uv as uv's own settings (PIP_TO_ENV), with pip's way of choosing among several indexes
  (UV_INDEX_STRATEGY=unsafe-best-match) when pip's configuration names extra indexes.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Optional

from ..verify.results import TORCH_INDEX, cuda_tag, local_tag, major_minor, spec_matches
from ..errors import ProfileError
from ..remote.shell import shell_command, shell_path
from .project import (Project, Req, _norm, installs_itself, marker_env, names_extra_index,  # noqa: F401
                      parse_pyproject, parse_requirements, python_meets, read_project, requires_python, tool_project,
                      tool_refusal)
from .render import PIP_TO_ENV, PIPCONF, render_script  # noqa: F401  (setup's script: setup/render.py)
from . import pinned
from .failure import telling_line  # noqa: F401  (setup's failure summary: setup/failure.py)
from .facts import HostFacts, parse_facts  # noqa: F401  (the host's facts, parsed: setup/facts.py)

SETUP_SUBDIR = ".gpuops/setup"
PIP_KINDS = ("requirements", "pyproject", "script")  # installed with pip or uv pip, constrained by the plan's pins
TORCH_FAMILY = ("torch", "torchvision", "torchaudio")
TORCH_CUDA_DEPS = ("nvidia-*", "triton")  # what a CUDA torch pulls in: inside setup_disk_mb.torch_cuda's figure
FLASH = ("flash-attn", "flash_attn")
DEFAULT_ENV_PYTHON = "~/.venvs/gpuops/bin/python"  # the environment setup makes for a profile that names none
SYSTEM_PREFIXES = ("/", "/usr", "/usr/local", "/bin", "/opt/conda")  # a python here is the system's, not an env's


# -- the environment --------------------------------------------------------------------------------------------------
def env_dir_or_none(python: str) -> Optional[str]:
    """The virtual environment the profile's python lives in (`~/venv/bin/python` -> `~/venv`), or None for a python
    that is not inside one (`python3`, `/usr/bin/python3`)."""
    first = (shlex.split(python) or ["python3"])[0]
    parts = first.rstrip("/").split("/")
    if len(parts) >= 3 and parts[-2] == "bin" and re.match(r"python[0-9.]*$", parts[-1]):
        env = "/".join(parts[:-2]) or "/"
        return None if env in SYSTEM_PREFIXES else env
    return None


def env_dir_of(python: str) -> str:
    """env_dir_or_none, or a profile error (setup installs nothing into a system Python)."""
    env = env_dir_or_none(python)
    if env is None:
        first = (shlex.split(python) or ["python3"])[0]
        raise ProfileError(f"setup installs nothing into a system Python, and the profile's python: is {first!r}",
                           hint=f"use python: {DEFAULT_ENV_PYTHON} (setup makes it with --system-site-packages, so "
                                f"{first}'s packages, the image's CUDA torch among them, stay in use), or leave "
                                "python: out of the profile and setup uses that one")
    return env


# -- the disk a plan needs -------------------------------------------------------------------------------------------
def lock_estimate_mb(lock_text: Optional[str], arch: Optional[str], *, skip: frozenset = frozenset(),
                     expand: float = 2.0) -> Optional[int]:
    """Installed size of what a uv.lock installs on this platform: per package the wheel for Linux on the host's
    architecture (else a pure-Python one, else the sdist), times `expand` (a wheel is compressed). None when the lock
    cannot be read here."""
    if not lock_text:
        return None
    try:
        import tomllib
    except ImportError:
        return None
    try:
        doc = tomllib.loads(lock_text)
    except ValueError:
        return None
    machine = arch or "x86_64"
    total = 0
    for pkg in doc.get("package") or []:
        if _skipped(_norm(str(pkg.get("name", ""))), skip):
            continue
        wheels = [w for w in pkg.get("wheels") or [] if isinstance(w, dict)]
        names = [(str(w.get("url") or w.get("filename") or w.get("path") or ""), int(w.get("size") or 0))
                 for w in wheels]
        linux = [s for n, s in names if "linux" in n and machine in n]
        anyw = [s for n, s in names if n.endswith("-none-any.whl")]
        sdist = int((pkg.get("sdist") or {}).get("size") or 0)
        size = max(linux) if linux else max(anyw) if anyw else sdist
        total += size
    return int(total * expand / 2**20)


def _skipped(name: str, skip: frozenset) -> bool:
    """`name` is in `skip`, by name or by a `prefix*` entry (nvidia-*)."""
    return name in skip or any(x.endswith("*") and name.startswith(x[:-1]) for x in skip)


def names_estimate_mb(names: list[str], knowledge: dict, *, torch_mb: int) -> int:
    """Installed size of requirements known only by name: torch's family from the torch figure, known large packages
    from setup_package_mb, anything else a flat `package` figure (itself and what it pulls in)."""
    table = {_norm(k): int(v) for k, v in (knowledge.get("setup_package_mb") or {}).items()}
    each = int((knowledge.get("setup_disk_mb") or {}).get("package", 30))
    total = 0
    for n in {_norm(x) for x in names}:
        total += torch_mb if n == "torch" else table.get(n, each)
    return total


# -- the plan -------------------------------------------------------------------------------
@dataclass
class Step:
    id: str
    title: str
    reason: str
    command: str  # shell text, every value quoted
    long: bool = False  # minutes, not seconds (a download of GBs, a build)
    disk_mb: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Plan:
    python: str
    env_dir: str
    base_python: str = "python3"
    system_site: bool = True  # the environment sees the base python's packages
    installer: str = "uv"  # uv | pip: what installs the project's requirements
    installer_reason: Optional[str] = None
    steps: list[Step] = field(default_factory=list)
    torch_index: Optional[str] = None
    torch_source: Optional[str] = None  # which torch the job will import, and where it comes from
    index_url: Optional[str] = None
    extra_index_urls: list[str] = field(default_factory=list)
    pip_config: dict = field(default_factory=dict)  # the host's pip configuration (credentials removed)
    cache_dir: Optional[str] = None
    disk_mb: int = 0
    free_mb: Optional[int] = None
    refusal: Optional[str] = None  # the plan cannot fit: setup refuses before it starts
    cannot: Optional[str] = None  # the plan cannot start (no interpreter to make the environment from)
    cannot_hint: Optional[str] = None  # what to do about it, when not the base python's fix
    blocked: Optional[str] = None  # the project cannot be installed or run here (a tool's lock, requires-python)
    blocked_hint: Optional[str] = None  # what to do about it (never "run setup again": nothing it can change)
    notes: list[str] = field(default_factory=list)
    stamp: dict = field(default_factory=dict)
    pins: str = ""  # the local plan's resolution, as setup installs with it (-c, setup/pinned.py)

    @property
    def nothing_to_do(self) -> bool:
        return not self.steps and not self.blocked and not self.cannot

    def lines(self) -> list[str]:
        """The plan as plain lines: each step with its reason, which torch the job will import, the installer, the
        indexes (credentials hidden), the disk it needs."""
        if self.nothing_to_do:
            return [f"nothing to do: the environment {self.env_dir} matches the profile",
                    f"  torch: {self.torch_source}"]
        if self.blocked:
            return [f"CANNOT INSTALL the project: {self.blocked}", f"  {self.blocked_hint}"]
        lines = [f"plan for {self.python} ({len(self.steps)} step(s)):"]
        for i, s in enumerate(self.steps, 1):
            lines.append(f"  {i}. {s.title}{'  [long]' if s.long else ''}")
            lines.append(f"     why: {s.reason}")
        lines.append(f"  torch: {self.torch_source}")
        lines.append(f"  installer: {self.installer}" + (f" ({self.installer_reason})" if self.installer_reason else ""))
        if self.torch_index:
            lines.append(f"  torch index: {redact_url(self.torch_index)}")
        if self.index_url:
            lines.append(f"  project index: {redact_url(self.index_url)}")
        if self.extra_index_urls:
            lines.append(f"  extra indexes: {', '.join(redact_url(u) for u in self.extra_index_urls)}")
        cfg = self.pip_config or {}
        shown = [f"{k} {' '.join(v) if isinstance(v, list) else v}" for k, v in sorted(cfg.items()) if k != "sources"]
        if shown:
            lines.append(f"  the host's pip configuration ({', '.join(cfg.get('sources') or [])}): {'; '.join(shown)}")
        free = f", {self.free_mb / 1024:.1f} GB free in home" if self.free_mb is not None else ""
        lines.append(f"  disk: about {self.disk_mb / 1024:.1f} GB{free}")
        if self.cache_dir:
            lines.append(f"  cache: {self.cache_dir}")
        if self.refusal:
            lines.append(f"  DOES NOT FIT: {self.refusal}")
        if self.cannot:
            lines.append(f"  CANNOT START: {self.cannot}")
        return lines

    def to_dict(self) -> dict:
        return {"python": self.python, "env_dir": self.env_dir, "base_python": self.base_python,
                "system_site_packages": self.system_site, "installer": self.installer,
                "installer_reason": self.installer_reason, "steps": [s.to_dict() for s in self.steps],
                "torch_index": redact_url(self.torch_index), "torch_source": self.torch_source,
                "index_url": redact_url(self.index_url),
                "extra_index_urls": [redact_url(u) for u in self.extra_index_urls],
                "pip_config": self.pip_config, "cache_dir": self.cache_dir, "disk_mb": self.disk_mb,
                "free_mb": self.free_mb, "refusal": self.refusal, "cannot": self.cannot, "blocked": self.blocked,
                "blocked_hint": self.blocked_hint, "notes": self.notes,
                "nothing_to_do": self.nothing_to_do, "pins": self.pins.splitlines()}


def redact_url(url: Optional[str]) -> Optional[str]:
    """An index URL as it may be shown: any user:password (a private index's token) replaced by ***."""
    return re.sub(r"^(\w[\w+.-]*://)[^/@\s]*@", r"\1***@", url) if url else url


def pin(name: str, spec: str) -> str:
    """A requirement from an expect.packages spec: "2.9.0" -> torch==2.9.0, ">=2.8" -> torch>=2.8, "*" -> torch."""
    spec = (spec or "*").strip()
    if spec in ("*", ""):
        return name
    if spec[0].isdigit():
        return f"{name}=={spec}"
    return f"{name}{spec}"


def torch_index_for(profile, facts: HostFacts, knowledge: dict, spec: str = "") -> str:
    """The profile's setup.torch_index, else the index of the build the torch spec names (`==2.3.0+cu121` -> cu121),
    else the PyTorch index of the CUDA the profile expects, else of the CUDA the driver supports (nvidia-smi's
    header), else the CPU index on a host without a driver."""
    if profile.setup.torch_index:
        return profile.setup.torch_index
    build = re.search(r"\+(cu\d+|cpu|rocm[\d.]+)\b", spec or "")
    tag = (build.group(1) if build else None) or cuda_tag(profile.expect.cuda) or cuda_tag(facts.cuda_driver) or "cpu"
    return (knowledge.get("torch_index") or TORCH_INDEX).format(tag=tag)


def _cpu_index(url: str) -> bool:
    return bool(re.search(r"(^|[/_-])cpu($|[/_-])", url.rstrip("/")))


def _torch_wants(profile, facts: HostFacts, knowledge: dict) -> dict[str, str]:
    """torch-family packages to pin: those the profile expects, and companions that are installed (their version
    follows torch's row in knowledge.yaml)."""
    exp = profile.expect.packages
    wants = {n: exp[n] for n in TORCH_FAMILY if n in exp}
    if "torch" in wants:
        tmm = major_minor(wants["torch"].lstrip("=<>~!")) if wants["torch"] != "*" else None
        row = next((r for r in knowledge.get("torch_companions", []) if str(r.get("torch")) == tmm), None)
        for comp in ("torchvision", "torchaudio"):
            if comp not in wants and facts.packages.get(comp) and row:
                wants[comp] = f"=={row[comp]}.*"
    return wants


def _sha_key(facts: HostFacts, profile, pins: str = "", blocks: Optional[dict] = None) -> dict:
    """What the last install read: every dependency file (includes too), the extras, the indexes, the host's pip
    configuration, the python and how its environment was made. A change in any of them installs again."""
    S = profile.setup
    cfg = hashlib_hex(json.dumps(facts.pipconf, sort_keys=True)) if facts.pipconf else None
    blocks = {k: v for k, v in (blocks or {}).items() if v}
    return {"files": dict(sorted(facts.files.items())), "extras": S.extras if S.extras == "all" else sorted(S.extras),
            "index_url": hashlib_hex(S.index_url) if S.index_url else None,
            "extra_index_url": hashlib_hex(" ".join(S.extra_index_url)) if S.extra_index_url else None,
            "pip_config": cfg, "python": profile.python, "requirements": list(S.requirements),
            **({"pins": hashlib_hex(pins)} if pins else {}),
            **({"script_blocks": hashlib_hex(json.dumps(blocks, sort_keys=True))} if blocks else {})}


def hashlib_hex(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cache_dir(profile, facts: HostFacts, need_mb: int, knowledge: dict) -> tuple[Optional[str], Optional[str]]:
    """(cache folder, note): the profile's cache_dir; else, when the home disk is short, a folder on the writable disk
    with the most room (another filesystem than home's)."""
    if profile.setup.cache_dir:
        return profile.setup.cache_dir, None
    floor = max(int(knowledge.get("setup_min_home_free_mb", 20000)), need_mb)
    if facts.home_free_mb is None or facts.home_free_mb >= floor:
        return None, None
    others = [d for d in facts.disks if d[1] != facts.home_fs and d[2] > facts.home_free_mb]
    if not others:
        return None, None
    folder, _, free = max(others, key=lambda d: d[2])
    cache = f"{folder.rstrip('/')}/gpuops-cache-{facts.user or 'user'}"
    return cache, (f"home has {facts.home_free_mb / 1024:.1f} GB free: the uv/pip cache goes to {cache} "
                   f"({free / 1024:.1f} GB free)")


@dataclass
class _Ctx:
    """What the plan's steps share while it is made."""
    facts: HostFacts
    profile: object
    knowledge: dict
    remote_dir: str
    plan: Plan
    project: Project
    created: bool = False
    sees_system: bool = False
    uv_planned: bool = False
    force: bool = False
    lock_text: Optional[str] = None
    repin: bool = False  # expect.packages pins torch: pinned again if the project's install runs
    resolution: dict = field(default_factory=dict)  # the local plan's, as a document

    @property
    def disk(self) -> dict:
        return self.knowledge.get("setup_disk_mb") or {}

    def torch_mb(self, index: Optional[str] = None) -> int:
        cpu = (index and _cpu_index(index)) or (not index and self.facts.gpu_count == 0)
        return int(self.disk.get("torch_cpu" if cpu else "torch_cuda", 5600))


def make_plan(facts: HostFacts, profile, knowledge: dict, *, remote_dir: str, force: bool = False,
              lock_text: Optional[str] = None, tools: Optional[list] = None,
              resolution: Optional[dict] = None, scripts: tuple[str, ...] = ()) -> Plan:
    """The ordered steps that bring the host to the profile; none when it already matches (unless `force`).
    lock_text: the project's uv.lock when this machine has the same file (for the disk estimate); tools: the project
    tools setup does not drive (images.yaml project_tools). A project it cannot install or run is `blocked`: no step.
    resolution: the local plan's (project/resolution.py Resolution.to_dict()): installed exactly (setup/pinned.py).
    scripts: the job's scripts whose `# /// script` block the local plan read (their texts in facts.texts): installed
    too, as project/read.py's read_project decides for the plan and for setup alike."""
    S = profile.setup
    plan = Plan(python=profile.python, env_dir=env_dir_of(profile.python), base_python=S.base_python or "python3",
                index_url=S.index_url, extra_index_urls=list(S.extra_index_url), pip_config=dict(facts.pipconf))
    c = _Ctx(facts, profile, knowledge, remote_dir, plan, read_project(facts, S, scripts), force=force,
             lock_text=lock_text, resolution=resolution or {})
    plan.notes += c.project.notes
    if c.project.kind in PIP_KINDS:  # a uv.lock decides by itself
        plan.pins = pinned.pins_text(resolution, skip=tuple(_torch_wants(profile, facts, knowledge)))
    if _plan_blocked(c, tools or []):
        return plan
    _plan_uv(c)
    _plan_environment(c)
    _choose_installer(c)
    early_torch, late_torch = _plan_torch(c)
    if early_torch:
        plan.steps.append(early_torch)
    deps_ran = _plan_deps(c)
    if deps_ran and facts.missing and not plan.cannot:  # pip and uv stop at an include that is not there
        plan.cannot = (f"a requirements file includes {', '.join(facts.missing)}, which is not on the host (sync it, "
                       "or fix the -r/-c line)")
    if late_torch or (deps_ran and c.repin):
        plan.steps.append(late_torch or _pin_step(c, "pinned again after the project's dependencies"))
    _plan_flash_attn(c)
    _plan_disk(c)
    plan.stamp = {"deps": _sha_key(facts, profile, plan.pins, c.project.blocks)}
    return plan


def _plan_blocked(c: _Ctx, tools: list) -> bool:
    """A project setup cannot install (a poetry/pdm/conda project with nothing setup installs) or whose
    requires-python the environment's python does not meet: blocked, before any step (uv, pip and the job would
    each fail after minutes of installing)."""
    f, S, plan = c.facts, c.profile.setup, c.plan
    tp = tool_project(set(f.files), f.texts.get("pyproject.toml"), list(S.requirements), tools)
    if tp is not None and not tp.installable:
        plan.blocked, plan.blocked_hint = tool_refusal(tp, list(S.requirements))
        return True
    if tp is not None:
        plan.notes.append(f"{tp.marker}: setup does not install from {tp.tool}'s files; it installs "
                          + (", ".join(r for r in S.requirements if r in f.files) or "the [project] table")
                          + f" (for {tp.tool}'s versions: {tp.export})")
    spec = requires_python(f.texts.get("pyproject.toml")) if c.project.kind in ("uv-lock", "pyproject") else None
    version = f.env_python_version if f.env_python else f.base_python_version
    if spec and version and python_meets(spec, version) is False:
        which = (f"the environment's python ({plan.python})" if f.env_python else
                 f"the python the environment is made from ({plan.base_python})")
        mm = ".".join(version.split(".")[:2])
        plan.blocked = (f"pyproject.toml says requires-python = \"{spec}\", and {which} is {version}")
        plan.blocked_hint = (f"nothing was installed. Lower requires-python if the code runs on Python {mm}, or name "
                             f"in setup.base_python a python of the host that meets it (a python that is not the "
                             f"image's has no CUDA torch: torch is then installed from the index, several GB). The "
                             f"python of each Lambda Stack image is in playbooks/images.yaml; `gpuops run` refuses "
                             f"such a project before it launches when no image's python meets it (it warns when "
                             f"only some do)")
        return True
    return False


def _plan_uv(c: _Ctx) -> None:
    """uv for the user, with pip, when the host has none (nothing system-wide)."""
    f, S = c.facts, c.profile.setup
    if f.env_python or f.uv or not S.install_uv or not f.pip_user_ok:
        return
    c.uv_planned = True
    c.plan.steps.append(Step("uv", "install uv for the user", "the host has no uv; pip can install it for this user "
                             "(nothing system-wide)", "python3 -m pip install --user --disable-pip-version-check uv",
                             disk_mb=100))


def _plan_environment(c: _Ctx) -> None:
    """The environment the profile's python lives in, seeing the base python's packages unless told not to."""
    f, S, plan = c.facts, c.profile.setup, c.plan
    plan.system_site = f.env_system_site if f.env_python else S.system_site_packages
    c.sees_system = plan.system_site
    if f.env_python:
        if f.base_torch and not f.env_system_site and f.env_venv and not f.packages.get("torch"):
            plan.notes.append(f"the environment {plan.env_dir} does not see the image's torch {f.base_torch} (it was "
                              "made without --system-site-packages); remove it and run setup again to use the image's")
        return
    if f.env_stale and not _removable(plan.env_dir):
        plan.cannot = f"{plan.env_dir} exists on the host and its python does not run"
        plan.cannot_hint = ("setup does not remove a folder this close to / or the home: name another python: in the "
                            f"profile (setup makes {DEFAULT_ENV_PYTHON} when it names none)")
        return
    if f.env_stale == "other":
        plan.cannot = f"{plan.env_dir} exists on the host and is not a virtual environment (no pyvenv.cfg)"
        plan.cannot_hint = ("setup never removes such a folder: move it away on the host, or name another python: in "
                            "the profile")
        return
    c.created = True
    uv = f.uv or c.uv_planned
    how = "uv venv" if uv else "python3 -m venv"
    if not uv:
        plan.notes.append("no uv on the host" + ("" if S.install_uv and f.pip_user_ok else
                                                 " and pip cannot install it for the user")
                          + ": the environment is made with python3 -m venv and filled with pip")
    if f.python3 is None:  # uv would make it from any python it finds, pip has none to run
        plan.cannot = (f"{plan.base_python} is not on the host, and the environment {plan.env_dir} is made from it "
                       f"({'setup.base_python' if c.profile.setup.base_python else 'the default base python'})")
    E, B = shell_path(plan.env_dir), shell_command(plan.base_python)
    site = " --system-site-packages" if plan.system_site else ""
    sees = (f"; it sees {plan.base_python}'s packages" + (f" (the image's torch {f.base_torch})" if f.base_torch else "")
            if plan.system_site else "")
    make = (f'if [ -n "$UV" ]; then "$UV" venv{site} --python "$(command -v {B})" {E}; '
            f"else {B} -m venv{site} {E}; fi")
    if f.env_stale == "venv":  # made again on top, it failed in ensurepip (uv: "already exists"): issue #36
        plan.steps.append(Step("environment", f"make the environment {plan.env_dir} anew",
                               f"it exists, but its python does not run (another python made it, since removed or "
                               f"changed): removed and made again ({how}{site}){sees}",
                               f"rm -rf {E} && {make}", disk_mb=int(c.disk.get("environment", 100))))
        return
    plan.steps.append(Step("environment", f"create the environment {plan.env_dir}",
                           f"{plan.python} does not exist ({how}{site}){sees}", make,
                           disk_mb=int(c.disk.get("environment", 100))))


def _removable(env_dir: str) -> bool:
    """May setup remove this environment folder to make it anew? Never the home, / or a folder right under /."""
    parts = [p for p in env_dir.split("/") if p not in ("", ".")]
    if env_dir.startswith("~"):
        return len(parts) >= 2 and parts[0] in ("~", "$HOME") and ".." not in parts
    return len(parts) >= 2 and ".." not in parts


def _choose_installer(c: _Ctx) -> None:
    """pip when the environment sees an image's torch and pip can run in it (pip counts the image's packages as
    installed; uv does not look past the environment and would install torch again), else uv, else pip."""
    f, plan = c.facts, c.plan
    uv = bool(f.uv or c.uv_planned)
    image_torch = c.sees_system and f.base_torch
    pip_here = f.env_pip or (c.sees_system and f.base_pip) or (c.created and not uv)
    if image_torch and pip_here and c.project.kind in PIP_KINDS:
        plan.installer = "pip"
        plan.installer_reason = (f"pip counts the image's torch {f.base_torch} as installed (uv would install "
                                 "another copy into the environment)")
    elif uv:
        plan.installer = "uv"
    else:
        plan.installer = "pip"
        plan.installer_reason = "no uv on the host"
    if image_torch and plan.installer == "uv" and c.project.kind in PIP_KINDS \
            and c.project.req("torch"):
        plan.notes.append(f"no pip to run in the environment: uv installs the project's torch into it, beside the "
                          f"image's {f.base_torch}")


def _visible_torch(c: _Ctx) -> tuple[Optional[str], Optional[str]]:
    """(version, where) of the torch the job's python imports today (before any step)."""
    f = c.facts
    if f.env_python and f.packages.get("torch"):
        system = f.env_torch_path and f.base_torch_path and f.env_torch_path == f.base_torch_path
        where = f"the image's python ({f.base_torch_path})" if system else "the environment"
        return f.packages["torch"], where
    if c.created and c.sees_system and f.base_torch:
        return f.base_torch, f"the image's python ({f.base_torch_path or f.python3})"
    return None, None


def _plan_torch(c: _Ctx) -> tuple[Optional[Step], Optional[Step]]:
    """(a step before the project's install, a step after it), and the plan's torch_source. A torch that
    expect.packages pins goes before the project's install when the project's own torch requirement (if any) accepts
    it, so the install finds it present and fetches no other torch; after it (it wins) when the project asks for
    another torch or uv.lock decides. A torch the project pins that the image's does not satisfy comes before (so the
    install takes nothing from PyPI's default build)."""
    f, prof, plan = c.facts, c.profile, c.plan
    wants = _torch_wants(prof, f, c.knowledge)
    have, where = _visible_torch(c)
    r = c.project.req("torch")
    hidden = plan.installer == "uv" and bool(where and where.startswith("the image"))  # uv does not look past the env
    if wants:
        plan.torch_index = torch_index_for(prof, f, c.knowledge, wants.get("torch", ""))
        cpu_index = _cpu_index(plan.torch_index)
        wrong = [n for n, spec in wants.items() if not spec_matches(f.packages.get(n) if f.env_python else
                                                                   (have if n == "torch" else None), spec)]
        cpu_build = f.gpu_count > 0 and not cpu_index and local_tag(have) == "cpu"
        pinned = _exact(wants.get("torch", "*"))
        first = c.project.kind in PIP_KINDS and (
            r is None or not r.spec or (pinned is not None and bool(spec_matches(pinned, r.spec))))
        if not (wrong or cpu_build):
            plan.torch_source = f"torch {have} from {where}, as expect.packages asks"
            if r is not None and hidden and first:
                return _pin_step(c, f"uv does not see the image's torch {have}: the pin goes into the environment "
                                    f"before the project's install, which would fetch another torch for "
                                    f"{r.source}'s torch{r.spec}"), None
            # the project's install may replace it: uv.lock decides, or the project asks for another torch
            c.repin = c.project.kind == "uv-lock" or (r is not None and not spec_matches(have, r.spec or "*"))
            return None, None
        why = []
        if wrong:
            why.append(", ".join(f"{n} {(f.packages.get(n) if f.env_python else (have if n == 'torch' else None)) or 'missing'}"
                                 f" (expected {wants[n]})" for n in wrong))
        if cpu_build:
            why.append(f"torch {have} is a CPU-only build on a GPU host")
        plan.torch_source = f"{pin('torch', wants.get('torch', '*'))} from {plan.torch_index} (expect.packages)"
        step = _pin_step(c, "; ".join(why))
        return (step, None) if first else (None, step)
    if c.project.kind == "uv-lock":
        plan.torch_source = "torch as uv.lock pins it (uv sync installs it into the environment)" \
            if c.project.req("torch") or (c.lock_text and re.search(r'(?m)^name = "torch"$', c.lock_text)) else \
            (f"torch {have} from {where}" if have else "no torch (the project does not need one)")
        return None, None
    if r is None:
        plan.torch_source = f"torch {have} from {where}" if have else "no torch (the project does not name one)"
        return None, None
    spec = r.spec or "*"
    plan.torch_index = torch_index_for(prof, f, c.knowledge, r.spec)
    cpu_index = _cpu_index(plan.torch_index)
    usable = have and spec_matches(have, spec) and not (f.gpu_count > 0 and not cpu_index and local_tag(have) == "cpu")
    if usable and not hidden:
        plan.torch_source = f"torch {have} from {where} (satisfies {r.source}'s torch{r.spec})"
        return None, None
    family = [x for x in c.project.reqs if x.name in TORCH_FAMILY]
    reqs = [f"{x.name}{x.spec}" for x in family]
    why = (f"{r.source} asks for torch{r.spec}" + (f"; the image's {have} does not match" if have else
                                                   "; none installed")
           + (f"; the {local_tag(r.spec)} build it names" if local_tag(r.spec) else "; built for the driver's CUDA")
           + f", from {plan.torch_index}")
    plan.torch_source = f"torch{r.spec} from {plan.torch_index} ({r.source} pins it)"
    for_what = f"(its {local_tag(r.spec)} build)" if local_tag(r.spec) else "for the driver's CUDA"
    return Step("torch", f"install {' '.join(reqs)} {for_what}", why,
                f"gpuops_install --reinstall-torch {' '.join(shlex.quote(x) for x in reqs)} "
                f"--index-url {shlex.quote(plan.torch_index)}", long=True,
                disk_mb=c.torch_mb(plan.torch_index)), None


def _exact(spec: str) -> Optional[str]:
    """The version an expect.packages spec names exactly ("2.9.0", "==2.9.0"), else None (">=2.8", "*")."""
    spec = (spec or "").strip()
    v = spec[2:].strip() if spec.startswith("==") else spec
    return v if re.match(r"\d+(\.\d+)*([+.-]?\w+)*$", v) and "*" not in v else None


def _pin_step(c: _Ctx, why: str) -> Step:
    """torch and its companions pinned by expect.packages, from the torch index."""
    wants = _torch_wants(c.profile, c.facts, c.knowledge)
    index = c.plan.torch_index or torch_index_for(c.profile, c.facts, c.knowledge)
    reqs = " ".join(shlex.quote(pin(n, s)) for n, s in wants.items())
    return Step("torch", f"install {' '.join(pin(n, s) for n, s in wants.items())}", why + f"; from {index}",
                f"gpuops_install --reinstall-torch {reqs} --index-url {shlex.quote(index)}", long=True,
                disk_mb=c.torch_mb(index))


def _plan_deps(c: _Ctx) -> bool:
    """The project's own dependencies, from the synced project; True when that step is planned."""
    f, p, plan = c.facts, c.project, c.plan
    P = shell_path(c.remote_dir)
    changed = c.created or c.force or not f.stamp or f.stamp.get("deps") != _sha_key(f, c.profile, plan.pins,
                                                                                         p.blocks)
    why = ("--force" if c.force else "the environment is new" if c.created else
           "not installed yet" if not f.stamp else "the files it installs from changed since the last setup")
    if p.kind == "none":
        if not f.files and (f.python3 or f.env_python):  # else no python could read them
            plan.notes.append(f"no uv.lock, pyproject.toml or {', '.join(c.profile.setup.requirements)} in "
                              f"{c.remote_dir}: setup installs no project dependencies (the job imports what the "
                              "environment's python has; setup reads these files in the synced project)")
        return False
    if not changed:
        return False
    with_pins = f' -c "$D/{pinned.PINS_FILE}"' if plan.pins else ""
    blocks = [f"gpuops_install {' '.join(shlex.quote(d) for d in deps)}{with_pins}" for deps in p.blocks.values()]
    block_titles = [f"{script}'s script block ({', '.join(deps)})" for script, deps in p.blocks.items()]
    if p.kind == "uv-lock":
        ex = " --all-extras" if p.all_extras else "".join(f" --extra {shlex.quote(e)}" for e in p.extras)
        cmd = (f'if [ -z "$UV" ]; then echo "gpuops: uv.lock needs uv, and the host has none" >&2; exit 3; fi; '
               f'cd {P} && UV_PROJECT_ENVIRONMENT="$GPUOPS_ENV" "$UV" sync --locked{ex}')
        plan.steps.append(Step("deps", "install the project's dependencies (uv sync --locked" + ex + ")"
                               + "".join(f" and {t}" for t in block_titles), why,
                               " && ".join([cmd, *blocks]), long=True))
        return True
    parts = [f"gpuops_install -r {shlex.quote(r)}{with_pins}" for r in p.requirements]
    titles = [f"-r {r}" for r in p.requirements]
    itself = next((x for x in (installs_itself(f.texts, r) for r in p.requirements) if x), None)
    if p.kind == "pyproject" and itself:  # `-e .` in a requirements file installs the project: once is enough
        plan.notes.append(f"{itself} installs the project folder itself (-e .): setup does not install it a second "
                          "time" + (f", except with setup.extras ({', '.join(p.extras)}) that line does not name: "
                                    f"-e {p.editable}" if p.editable else ""))
    if p.editable:
        parts.append(f"gpuops_install -e {shlex.quote(p.editable)}{with_pins}")
        titles.append(f"-e {p.editable} (editable: the job runs the synced source)")
    parts += blocks
    titles += block_titles
    # --extra-index-url in a requirements file is pip's setting: pip searches every index for the best version, uv
    # only up to the first index that has the package; give uv pip's semantics (unless the host chose otherwise)
    several = next((x for x in (names_extra_index(f.texts, r) for r in p.requirements) if x), None)
    strategy = 'export UV_INDEX_STRATEGY="${UV_INDEX_STRATEGY:-unsafe-best-match}" && ' if several else ""
    _plan_builds(c)
    plan.steps.append(Step("deps", f"install {' and '.join(titles)} ({plan.installer})", why,
                           f"cd {P} && {strategy}" + " && ".join(parts), long=True))
    return True


def _plan_flash_attn(c: _Ctx) -> None:
    """flash-attn, when expected: a prebuilt wheel matching torch, Python and the C++ ABI, else a throttled build."""
    prof, f, plan = c.profile, c.facts, c.plan
    fa_spec = next((prof.expect.packages[n] for n in FLASH if n in prof.expect.packages), None)
    if fa_spec is None and "flash_attn" in prof.expect.imports:
        fa_spec = "*"
    if fa_spec is None:
        return
    torch_step = any(s.id == "torch" for s in plan.steps)
    have = f.packages.get("flash-attn")
    ok = have and spec_matches(have, fa_spec) and f.flash_attn_import == "ok"
    if ok and not torch_step:
        return
    reason = ("not installed" if not have else f"{have} does not match {fa_spec}"
              if not spec_matches(have, fa_spec) else "does not import: " + (f.flash_attn_import or "?")[:120]
              if f.flash_attn_import != "ok" else "torch is reinstalled: flash-attn must match it")
    plan.steps.append(_flash_step(prof, f, c.knowledge, fa_spec, reason, c.disk))


def _plan_disk(c: _Ctx) -> None:
    """The disk the steps need (from what they install), where the cache goes, and a refusal when it cannot fit."""
    f, plan, p = c.facts, c.plan, c.project
    deps = next((s for s in plan.steps if s.id == "deps"), None)
    if deps is not None:
        skip = set()
        if any(s.id == "torch" for s in plan.steps) or (plan.installer == "pip" and _visible_torch(c)[0]):
            skip |= set(TORCH_FAMILY) | set(TORCH_CUDA_DEPS)  # counted in the torch step, or already there
        est = lock_estimate_mb(c.lock_text, f.arch, skip=frozenset(skip)) if p.kind == "uv-lock" else None
        if est is None and plan.pins and c.resolution.get("install_bytes") is not None:  # the wheels it resolved
            est = int(int(c.resolution["install_bytes"]) * 2 / 2**20)  # installed: about twice the wheels
        if est is None:
            names = [r.name for r in p.reqs if not _skipped(r.name, frozenset(skip))]
            est = names_estimate_mb(names, c.knowledge, torch_mb=c.torch_mb(plan.torch_index))
            if p.kind == "pyproject":
                est += int(c.disk.get("package", 30))
        deps.disk_mb = est
    plan.disk_mb = sum(s.disk_mb for s in plan.steps)
    plan.free_mb = f.home_free_mb
    plan.cache_dir, note = _cache_dir(c.profile, f, plan.disk_mb, c.knowledge)
    if note:
        plan.notes.append(note)
    if not plan.steps or f.home_free_mb is None:
        return
    cache_share = 0 if plan.cache_dir else plan.disk_mb // 2  # downloads are kept in the cache, compressed
    need = plan.disk_mb + cache_share
    if need > f.home_free_mb:
        text = (f"needs about {need / 1024:.1f} GB ({plan.disk_mb / 1024:.1f} GB installed"
                + (f" + {cache_share / 1024:.1f} GB of download cache" if cache_share else "")
                + f") but home has {f.home_free_mb / 1024:.1f} GB free")
        if c.profile.setup.disk_check:
            plan.refusal = text
        else:
            plan.notes.append(text + " (setup.disk_check: false: going on)")


def _flash_step(profile, facts: HostFacts, knowledge: dict, spec: str, reason: str, disk: dict) -> Step:
    S = profile.setup
    if S.flash_attn_wheel:
        return Step("flash-attn", "install flash-attn from the profile's wheel", reason + f"; setup.flash_attn_wheel",
                    f"gpuops_install {shlex.quote(S.flash_attn_wheel)}", long=True,
                    disk_mb=int(disk.get("flash_attn_wheel", 800)))
    version = spec if spec[:1].isdigit() else str(knowledge.get("flash_attn_version") or "2.8.3")
    template = str(knowledge.get("flash_attn_wheel") or "").replace("{version}", version)
    arch = ";".join(sorted(set(facts.capabilities))) or "8.0;9.0"
    cmd = pinned.wheel_or_build(requirement=f"flash-attn=={version}", template=template,
                                build_requires=["packaging", "ninja", "psutil", "wheel", "setuptools"],
                                env={"NVCC_APPEND_FLAGS": "--threads 2", "FLASH_ATTENTION_FORCE_BUILD": "TRUE"},
                                arch_list=arch, max_jobs=S.max_jobs)
    return Step("flash-attn", f"install flash-attn {version}", reason + "; a prebuilt wheel when one matches torch, "
                f"Python and the C++ ABI, else built with MAX_JOBS={S.max_jobs}, --no-build-isolation, "
                f"TORCH_CUDA_ARCH_LIST={arch}", cmd, long=True, disk_mb=int(disk.get("flash_attn_build", 3000)))


def _plan_builds(c: _Ctx) -> None:
    """The packages the local plan says build against torch, before the project's files (which then find them)."""
    expected = tuple(n for n in ("flash-attn",) if _flash_wanted(c.profile))  # _plan_flash_attn installs that one
    arch = ";".join(sorted(set(c.facts.capabilities))) or "8.0;9.0"
    for b in pinned.builds(c.resolution, skip=expected):
        sid, title, why, cmd = pinned.build_step(b, resolution=c.resolution, arch_list=arch,
                                                 max_jobs=c.profile.setup.max_jobs)
        c.plan.steps.append(Step(sid, title, why, cmd, long=True,
                                 disk_mb=int(c.disk.get("flash_attn_build" if b["how"] != "wheel" else
                                                        "flash_attn_wheel", 800))))


def _flash_wanted(profile) -> bool:
    return any(n in profile.expect.packages for n in FLASH) or "flash_attn" in profile.expect.imports
