"""`gpuops setup`, the deciding part: host facts + profile + project files + knowledge -> an ordered plan of steps,
and the shell script that runs it. Pure (no I/O): unit-tested on recorded facts. The talking half is setup_ops.py
(one execution gathers the facts, one starts the script detached, one streams its log), the remote scripts are in
remote/setup.py.

A step is shell text whose every value is quoted; the script runs them in order under `set -e` semantics (a failed
step ends the script with its exit code), then records a stamp (.gpuops/setup/done.json) that lets the next setup see
that the project's dependency files have not changed since they were installed.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Optional

from .checks import TORCH_INDEX, _cuda_tag, _local_tag, _major_minor, spec_matches
from .errors import ProfileError
from .profiles import shell_path

SETUP_SUBDIR = ".gpuops/setup"
DEP_FILES = ("uv.lock", "pyproject.toml", "requirements.txt")
TORCH_FAMILY = ("torch", "torchvision", "torchaudio")
FLASH = ("flash-attn", "flash_attn")


# -- facts ----------------------------------------------------------------------------------
@dataclass
class HostFacts:
    """What the facts script (remote/setup.py) reports, parsed."""
    home: str = "~"
    user: str = ""
    uv: Optional[str] = None
    python3: Optional[str] = None
    pip_user_ok: bool = False  # python3 has pip and is not an externally managed (PEP 668) interpreter
    env_python: bool = False  # the profile's python exists
    env_python_version: Optional[str] = None
    packages: dict[str, Optional[str]] = field(default_factory=dict)  # in the profile's python
    flash_attn_import: Optional[str] = None  # "ok" or the import error; None when not checked
    files: dict[str, str] = field(default_factory=dict)  # dependency file -> sha256, in the remote project
    stamp: Optional[dict] = None  # done.json of the last successful setup
    running: bool = False  # a setup is running on the host now
    last_rc: Optional[int] = None
    driver: Optional[str] = None
    cuda_driver: Optional[str] = None  # "CUDA Version" of nvidia-smi's header: the newest CUDA the driver runs
    capabilities: list[str] = field(default_factory=list)
    gpu_count: int = 0
    home_free_mb: Optional[int] = None
    home_fs: Optional[str] = None
    disks: list[tuple[str, str, int]] = field(default_factory=list)  # (writable folder, filesystem, free MB)


def parse_facts(text: str) -> HostFacts:
    """Lines `key=value`, `@pkg name=version`, `@file name sha256`, `@disk folder fs free_kb`, `@stamp {json}`."""
    f = HostFacts()
    for line in text.splitlines():
        if line.startswith("@pkg "):
            name, _, ver = line[5:].partition("=")
            f.packages[name.strip()] = ver.strip() or None
        elif line.startswith("@file "):
            parts = line.split()
            if len(parts) >= 3:
                f.files[parts[1]] = parts[2]
        elif line.startswith("@disk "):
            parts = line.split()
            if len(parts) >= 4 and parts[3].isdigit():
                f.disks.append((parts[1], parts[2], int(parts[3]) // 1024))
        elif line.startswith("@stamp "):
            try:
                f.stamp = json.loads(line[7:])
            except ValueError:
                f.stamp = None
        elif line.startswith("@gpu "):
            parts = [p.strip() for p in line[5:].split(",")]
            if parts and parts[0]:
                f.gpu_count += 1
                if len(parts) > 1 and parts[1] and not f.driver:
                    f.driver = parts[1]
                if len(parts) > 2 and re.match(r"\d+\.\d+$", parts[2]):
                    f.capabilities.append(parts[2])
        elif "=" in line:
            k, _, v = line.partition("=")
            v = v.strip()
            if k == "home":
                f.home = v
            elif k == "user":
                f.user = v
            elif k == "uv":
                f.uv = v or None
            elif k == "python3":
                f.python3 = v or None
            elif k == "pip_user_ok":
                f.pip_user_ok = v == "1"
            elif k == "env_python":
                f.env_python = v == "1"
            elif k == "env_python_version":
                f.env_python_version = v or None
            elif k == "flash_attn":
                f.flash_attn_import = v or None
            elif k == "running":
                f.running = v == "1"
            elif k == "last_rc":
                f.last_rc = int(v) if v.lstrip("-").isdigit() else None
            elif k == "cuda_driver":
                f.cuda_driver = v or None
            elif k == "home_disk":
                parts = v.split()
                if len(parts) == 2 and parts[1].isdigit():
                    f.home_fs, f.home_free_mb = parts[0], int(parts[1]) // 1024
    return f


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
    steps: list[Step] = field(default_factory=list)
    torch_index: Optional[str] = None
    index_url: Optional[str] = None
    cache_dir: Optional[str] = None
    disk_mb: int = 0
    free_mb: Optional[int] = None
    notes: list[str] = field(default_factory=list)
    stamp: dict = field(default_factory=dict)

    @property
    def nothing_to_do(self) -> bool:
        return not self.steps

    def to_dict(self) -> dict:
        return {"python": self.python, "env_dir": self.env_dir, "steps": [s.to_dict() for s in self.steps],
                "torch_index": self.torch_index, "index_url": self.index_url, "cache_dir": self.cache_dir,
                "disk_mb": self.disk_mb, "free_mb": self.free_mb, "notes": self.notes,
                "nothing_to_do": self.nothing_to_do}


def env_dir_of(python: str) -> str:
    """The virtual environment the profile's python lives in (`~/venv/bin/python` -> `~/venv`); a profile error for a
    python that is not inside one (setup installs nothing system-wide)."""
    first = (shlex.split(python) or ["python3"])[0]
    parts = first.rstrip("/").split("/")
    if len(parts) >= 3 and parts[-2] == "bin" and re.match(r"python[0-9.]*$", parts[-1]):
        return "/".join(parts[:-2]) or "/"
    raise ProfileError(f"setup needs the profile's python: to be inside a virtual environment, not {first!r}",
                       hint="e.g. python: ~/venv/bin/python (or <remote_dir>/.venv/bin/python for a uv project); "
                            "setup creates it and installs nothing system-wide")


def pin(name: str, spec: str) -> str:
    """A requirement from an expect.packages spec: "2.9.0" -> torch==2.9.0, ">=2.8" -> torch>=2.8, "*" -> torch."""
    spec = (spec or "*").strip()
    if spec in ("*", ""):
        return name
    if spec[0].isdigit():
        return f"{name}=={spec}"
    return f"{name}{spec}"


def torch_index_for(profile, facts: HostFacts, knowledge: dict) -> str:
    """The profile's setup.torch_index, else the PyTorch index of the CUDA the profile expects, else of the CUDA the
    driver supports (nvidia-smi's header), else the CPU index on a host without a driver."""
    if profile.setup.torch_index:
        return profile.setup.torch_index
    tag = _cuda_tag(profile.expect.cuda) or _cuda_tag(facts.cuda_driver) or "cpu"
    return (knowledge.get("torch_index") or TORCH_INDEX).format(tag=tag)


def _cpu_index(url: str) -> bool:
    return bool(re.search(r"(^|[/_-])cpu($|[/_-])", url.rstrip("/")))


def _torch_wants(profile, facts: HostFacts, knowledge: dict) -> dict[str, str]:
    """torch-family packages to pin: those the profile expects, and companions that are installed (their version
    follows torch's row in knowledge.yaml)."""
    exp = profile.expect.packages
    wants = {n: exp[n] for n in TORCH_FAMILY if n in exp}
    if "torch" in wants:
        tmm = _major_minor(wants["torch"].lstrip("=<>~!")) if wants["torch"] != "*" else None
        row = next((r for r in knowledge.get("torch_companions", []) if str(r.get("torch")) == tmm), None)
        for comp in ("torchvision", "torchaudio"):
            if comp not in wants and facts.packages.get(comp) and row:
                wants[comp] = f"=={row[comp]}.*"
    return wants


def _sha_key(facts: HostFacts, profile) -> dict:
    return {"files": {k: facts.files[k] for k in DEP_FILES if k in facts.files}, "extras": sorted(profile.setup.extras),
            "index_url": profile.setup.index_url, "python": profile.python}


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


def make_plan(facts: HostFacts, profile, knowledge: dict, *, remote_dir: str) -> Plan:
    """The ordered steps that bring the host to the profile; none when it already matches."""
    env = env_dir_of(profile.python)
    py = profile.python
    S = profile.setup
    plan = Plan(python=py, env_dir=env, index_url=S.index_url)
    disk = knowledge.get("setup_disk_mb") or {}
    P = shell_path(remote_dir)
    idx = f" --index-url {shlex.quote(S.index_url)}" if S.index_url else ""
    created = False

    # 1. the environment: uv if the host has it, else uv installed for the user with pip, else python3 -m venv
    if not facts.env_python:
        created = True
        if not facts.uv and S.install_uv and facts.pip_user_ok:
            plan.steps.append(Step("uv", "install uv for the user", "the host has no uv; pip can install it for "
                                   "this user (nothing system-wide)",
                                   f"python3 -m pip install --user --disable-pip-version-check{idx} uv",
                                   disk_mb=100))
            how = "uv venv"
        else:
            how = "uv venv" if facts.uv else "python3 -m venv"
            if not facts.uv:
                plan.notes.append("no uv on the host" + ("" if S.install_uv and facts.pip_user_ok else
                                                         " and pip cannot install it for the user")
                                  + ": the environment is made with python3 -m venv and filled with pip")
        E = shell_path(env)
        plan.steps.append(Step("environment", f"create the environment {env}", f"{py} does not exist ({how})",
                               f'if [ -n "$UV" ]; then "$UV" venv --python "$(command -v python3)" {E}; '
                               f"else python3 -m venv {E}; fi", disk_mb=int(disk.get("environment", 100))))
        if facts.home_free_mb is not None:
            plan.free_mb = facts.home_free_mb

    # 2. the project's own dependencies, from the synced project
    key = _sha_key(facts, profile)
    deps_changed = created or not facts.stamp or facts.stamp.get("deps") != key
    deps_step = None
    extras = list(S.extras)
    if "uv.lock" in facts.files and "pyproject.toml" in facts.files:
        ex = "".join(f" --extra {shlex.quote(e)}" for e in extras)
        cmd = (f'if [ -z "$UV" ]; then echo "gpuops: uv.lock needs uv, and the host has none" >&2; exit 3; fi; '
               f'cd {P} && UV_PROJECT_ENVIRONMENT="$GPUOPS_ENV" "$UV" sync --locked{ex}{idx}')
        deps_step = Step("deps", "install the project's dependencies (uv sync --locked)",
                         "uv.lock " + ("changed since the last setup" if facts.stamp else "not installed yet"), cmd,
                         long=True)
    elif "pyproject.toml" in facts.files:
        spec = "." + (f"[{','.join(extras)}]" if extras else "")
        deps_step = Step("deps", f"install the project ({spec})", "pyproject.toml " +
                         ("changed since the last setup" if facts.stamp else "not installed yet"),
                         f"cd {P} && gpuops_install {shlex.quote(spec)}{idx}", long=True)
    elif "requirements.txt" in facts.files:
        deps_step = Step("deps", "install requirements.txt", "requirements.txt " +
                         ("changed since the last setup" if facts.stamp else "not installed yet"),
                         f"cd {P} && gpuops_install -r requirements.txt{idx}", long=True)
    elif not facts.files:
        plan.notes.append(f"no uv.lock, pyproject.toml or requirements.txt in {remote_dir}: no project dependencies "
                          "(sync the project first: gpuops sync)")
    if deps_step and deps_changed:
        deps_step.disk_mb = int(disk.get("project", 1000))
        plan.steps.append(deps_step)

    # 3. torch, torchvision, torchaudio pinned by expect.packages, from the index of the driver's CUDA
    wants = _torch_wants(profile, facts, knowledge)
    if wants:
        index = torch_index_for(profile, facts, knowledge)
        plan.torch_index = index
        cpu_index = _cpu_index(index)
        wrong = [n for n, spec in wants.items() if not spec_matches(facts.packages.get(n), spec)]
        cpu_build = (facts.gpu_count > 0 and not cpu_index and _local_tag(facts.packages.get("torch")) == "cpu")
        if wrong or cpu_build or (deps_step and deps_changed):
            why = []
            if wrong:
                why.append(", ".join(f"{n} {facts.packages.get(n) or 'missing'} (expected {wants[n]})" for n in wrong))
            if cpu_build:
                why.append(f"torch {facts.packages.get('torch')} is a CPU-only build on a GPU host")
            if not why:
                why.append("pinned again after the project's dependencies")
            reqs = " ".join(shlex.quote(pin(n, s)) for n, s in wants.items())
            plan.steps.append(Step("torch", f"install {' '.join(pin(n, s) for n, s in wants.items())}",
                                   "; ".join(why) + f"; from {index}",
                                   f"gpuops_install --reinstall-torch {reqs} --index-url {shlex.quote(index)}",
                                   long=True, disk_mb=int(disk.get("torch_cpu" if cpu_index else "torch_cuda", 8000))))

    # 4. flash-attn, when expected: a prebuilt wheel matching torch, Python and the C++ ABI, else a throttled build
    fa_spec = next((profile.expect.packages[n] for n in FLASH if n in profile.expect.packages), None)
    if fa_spec is None and "flash_attn" in profile.expect.imports:
        fa_spec = "*"
    torch_step = any(s.id == "torch" for s in plan.steps)
    if fa_spec is not None:
        have = facts.packages.get("flash-attn")
        ok = have and spec_matches(have, fa_spec) and facts.flash_attn_import == "ok"
        if not ok or torch_step:
            reason = ("not installed" if not have else f"{have} does not match {fa_spec}"
                      if not spec_matches(have, fa_spec) else "does not import: " + (facts.flash_attn_import or "?")[:120]
                      if facts.flash_attn_import != "ok" else "torch is reinstalled: flash-attn must match it")
            plan.steps.append(_flash_step(profile, facts, knowledge, fa_spec, reason, disk))

    plan.disk_mb = sum(s.disk_mb for s in plan.steps)
    plan.free_mb = facts.home_free_mb
    plan.cache_dir, note = _cache_dir(profile, facts, plan.disk_mb, knowledge)
    if note:
        plan.notes.append(note)
    if plan.steps and facts.home_free_mb is not None and plan.disk_mb > facts.home_free_mb:
        plan.notes.append(f"needs about {plan.disk_mb / 1024:.1f} GB but home has {facts.home_free_mb / 1024:.1f} GB "
                          "free: set setup.cache_dir, or free space")
    plan.stamp = {"deps": key}
    return plan


def _flash_step(profile, facts: HostFacts, knowledge: dict, spec: str, reason: str, disk: dict) -> Step:
    S = profile.setup
    if S.flash_attn_wheel:
        return Step("flash-attn", "install flash-attn from the profile's wheel", reason + f"; setup.flash_attn_wheel",
                    f"gpuops_install {shlex.quote(S.flash_attn_wheel)}", long=True,
                    disk_mb=int(disk.get("flash_attn_wheel", 800)))
    version = spec if spec[:1].isdigit() else str(knowledge.get("flash_attn_version") or "2.8.3")
    template = knowledge.get("flash_attn_wheel") or ""
    arch = ";".join(sorted(set(facts.capabilities))) or "8.0;9.0"
    url = (template.replace("{version}", version).replace("{cuda_major}", "$cu").replace("{torch_mm}", "$tmm")
           .replace("{abi}", "$abi").replace("{py}", "$py"))
    req = shlex.quote(f"flash-attn=={version}")
    probe = ("import sys, torch; print('cp%d%d' % sys.version_info[:2], '.'.join(torch.__version__.split('.')[:2]), "
             "(torch.version.cuda or '').split('.')[0], str(torch._C._GLIBCXX_USE_CXX11_ABI).upper())")
    cmd = (f'set -- $("$GPUOPS_PY" -c {shlex.quote(probe)}); py=$1; tmm=$2; cu=$3; abi=$4\n'
           f'url="{url}"\n'
           'if [ -n "$cu" ] && [ -n "$abi" ] && echo "trying the prebuilt wheel $url" && gpuops_install "$url"; then :\n'
           "else\n"
           f'  echo "no prebuilt wheel for torch $tmm cu$cu $py abi=$abi: building (MAX_JOBS={S.max_jobs}, '
           f'TORCH_CUDA_ARCH_LIST={arch})"\n'
           "  gpuops_install packaging ninja psutil wheel setuptools\n"
           f"  MAX_JOBS={S.max_jobs} NVCC_APPEND_FLAGS='--threads 2' TORCH_CUDA_ARCH_LIST={shlex.quote(arch)} "
           f"FLASH_ATTENTION_FORCE_BUILD=TRUE gpuops_install --no-build-isolation {req}\n"
           "fi")
    return Step("flash-attn", f"install flash-attn {version}", reason + "; a prebuilt wheel when one matches torch, "
                f"Python and the C++ ABI, else built with MAX_JOBS={S.max_jobs}, --no-build-isolation, "
                f"TORCH_CUDA_ARCH_LIST={arch}", cmd, long=True, disk_mb=int(disk.get("flash_attn_build", 3000)))


# -- the script ------------------------------------------------------------------------------
def render_script(plan: Plan, *, setup_dir: str) -> str:
    """setup.sh: run in its own session (setsid nohup) with its output in setup_dir/log; `@@step N/M id title` before
    each step, `@@failed id rc` and exit rc on a failed step, `@@done` after writing the stamp."""
    D = shell_path(setup_dir)
    lines = [
        "#!/bin/sh",
        "# gpuops setup (generated)",
        f"D={D}",
        'echo $$ > "$D/pid.tmp" && mv "$D/pid.tmp" "$D/pid"',
        'rm -f "$D/exit_code"',
        'PATH="$HOME/.local/bin:$PATH"; export PATH',
        "UV_PYTHON_DOWNLOADS=never; export UV_PYTHON_DOWNLOADS",
        f"GPUOPS_ENV={shell_path(plan.env_dir)}; export GPUOPS_ENV",
        f"GPUOPS_PY={shell_path((shlex.split(plan.python) or ['python3'])[0])}",
        'gpuops_uv() { command -v uv 2>/dev/null || { [ -x "$HOME/.local/bin/uv" ] && echo "$HOME/.local/bin/uv"; }; }',
        "UV=$(gpuops_uv)",
        # install into the profile's environment: uv pip when uv is there, else the environment's pip;
        # --reinstall-torch: replace an installed torch (another build of the same version) with the pinned one
        "gpuops_install() {",
        '  r=; if [ "$1" = --reinstall-torch ]; then shift; r=1; fi',
        '  if [ -n "$UV" ]; then "$UV" pip install --python "$GPUOPS_PY" ${r:+--reinstall-package torch} "$@"',
        '  else [ -n "$r" ] && "$GPUOPS_PY" -m pip uninstall -y -q torch torchvision torchaudio >/dev/null 2>&1',
        '    "$GPUOPS_PY" -m pip install --disable-pip-version-check "$@"; fi',
        "}",
        "gpuops_end() {",
        '  echo "$1" > "$D/exit_code.tmp" && mv "$D/exit_code.tmp" "$D/exit_code"',
        '  exit "$1"',
        "}",
    ]
    if plan.cache_dir:
        C = shell_path(plan.cache_dir)
        lines += [f"mkdir -p {C}/uv {C}/pip",
                  f"UV_CACHE_DIR={C}/uv; export UV_CACHE_DIR", f"PIP_CACHE_DIR={C}/pip; export PIP_CACHE_DIR"]
    n = len(plan.steps)
    for i, s in enumerate(plan.steps, 1):
        lines += [f"echo {shlex.quote(f'@@step {i}/{n} {s.id} {s.title}')}",
                  f"( {s.command.strip()}\n)",
                  'rc=$?; UV=$(gpuops_uv)',
                  f'if [ $rc -ne 0 ]; then echo "@@failed {s.id} $rc"; gpuops_end $rc; fi']
    stamp = json.dumps(plan.stamp, sort_keys=True)
    lines += [f"printf '%s\\n' {shlex.quote(stamp)} > \"$D/done.json.tmp\" && mv \"$D/done.json.tmp\" \"$D/done.json\"",
              "echo @@done", "gpuops_end 0"]
    return "\n".join(lines) + "\n"
