"""Run lifecycle, the deciding part: run ids, the job's environment, meta.json, run state and the local registry.

Pure (no network): the remote side lives in jobs/scripts.py, the sequencing of each command in jobs/actions.py, the
commands (parse, render) in cli/jobs.py.

Layout of a run
  remote   <remote_dir>/.gpuops/runs/<run id>/  meta.json, launch.sh, log, pid, started, ended, exit_code, stop.json
           ~/.gpuops/active/<run id>           host-wide index of launched runs (holds the run folder's path)
  local    ./runs/<run id>/meta.json            the same meta.json, plus remote location; state.json once ended
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Optional

from ..errors import ChecksFailed, GpuopsError, UsageError

RUNNING, SUCCEEDED, FAILED, STOPPED, LOST = "running", "succeeded", "failed", "stopped", "lost"
ENDED = (SUCCEEDED, FAILED, STOPPED, LOST)
ALWAYS_SECRET = ("WANDB_API_KEY",)
RESERVED = ("GPUOPS_RUN_ID", "GPUOPS_RUN_DIR")
# a variable whose name holds one of these words is a secret wherever it is given (--env, the profile's env:, .env)
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL")
# .env variables that are gpuops' own, never sent to the job: the Lambda API key and GPUOPS_* settings
OWN_VARIABLES = ("LAMBDA_API_KEY",)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# the GPU sample format watch parses and the launch scripts ask nvidia-smi for
GPU_QUERY = "index,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"


# -- run ids ------------------------------------------------------------------------------
def run_id(name: Optional[str], script: str, *, clock: Callable[[], datetime] = datetime.now,
           taken: Iterable[str] = (), token: Optional[Callable[[], str]] = None) -> str:
    """`<name or script stem>-<YYYYmmdd-HHMMSS>-<4 random hex digits>`: two runs whose jobs start in the same second
    (two `gpuops run`s of one project, each on its own instance) never share an id, although neither sees the
    other's yet; a suffix -2, -3 ... if the id is already taken here all the same. token: the random part (a seam)."""
    import secrets

    base = name or Path(script).stem or "run"
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", base).strip("._-") or "run"
    rid = f"{base}-{clock().strftime('%Y%m%d-%H%M%S')}-{(token or (lambda: secrets.token_hex(2)))()}"
    taken = set(taken)
    n, out = 2, rid
    while out in taken:
        out, n = f"{rid}-{n}", n + 1
    return out


# -- environment --------------------------------------------------------------------------
@dataclass
class EnvVar:
    name: str
    value: Optional[str]  # None: unset in the job's environment
    origin: str  # "preset h100", "profile", "--env", "gpuops", "--seed"
    reason: str = ""


@dataclass
class EnvPlan:
    vars: dict[str, EnvVar] = field(default_factory=dict)  # plain variables, in order
    secrets: dict[str, str] = field(default_factory=dict)  # name -> value (never printed or recorded)
    secret_origin: dict[str, str] = field(default_factory=dict)
    missing_secrets: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def exported(self) -> dict[str, str]:
        return {k: v.value for k, v in self.vars.items() if v.value is not None}

    @property
    def unset(self) -> list[str]:
        return [k for k, v in self.vars.items() if v.value is None]

    def lines(self) -> list[str]:
        """What is printed before launch: names and values of plain variables, names only of secrets."""
        out = []
        for v in self.vars.values():
            shown = "(unset)" if v.value is None else f"={v.value}"
            why = f"  [{v.origin}{': ' + v.reason if v.reason else ''}]"
            out.append(f"{v.name}{shown}{why}")
        for name in self.secrets:
            out.append(f"{name}=<secret, from {self.secret_origin.get(name, 'local environment')}>")
        return out


def looks_secret(name: str) -> bool:
    """A variable whose value must never be printed or recorded: its name holds TOKEN, KEY, SECRET, PASSWORD or
    CREDENTIAL (any case), or it is WANDB_API_KEY."""
    up = name.upper()
    return name in ALWAYS_SECRET or any(w in up for w in SECRET_WORDS)


def own_variable(name: str) -> bool:
    """gpuops' own settings, read on this machine and never sent to a job (LAMBDA_API_KEY, GPUOPS_*)."""
    return name in OWN_VARIABLES or name.startswith("GPUOPS_")


def recordable_env(env: dict[str, str]) -> dict[str, str]:
    """--env values that may be written to a record or printed: those whose names look secret are left out (a
    record that must relaunch keeps them elsewhere, or asks again)."""
    return {k: v for k, v in env.items() if not looks_secret(k)}


def parse_env_args(items: Iterable[str]) -> dict[str, str]:
    """--env K=V (repeatable). `K=` (empty) unsets K for the job."""
    env: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not _NAME.match(key):
            raise UsageError(f"--env {item!r}: expected NAME=VALUE (NAME of letters, digits, _)",
                             hint="use --env NAME= to unset a variable the preset or profile sets")
        env[key] = value
    return env


def load_presets(project_dir: Path | None = None) -> dict:
    """playbooks/presets.yaml: ./playbooks/ of the project overrides the built-in one."""
    try:
        from .. import knowledge

        if hasattr(knowledge, "presets"):
            return knowledge.presets(project_dir) or {}
    except ImportError:
        pass
    import yaml

    from ..paths import data_dir

    local = (project_dir or Path.cwd()) / "playbooks" / "presets.yaml"
    path = local if local.is_file() else data_dir("playbooks") / "presets.yaml"
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        return {}
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {exc}") from None


def plan_env(*, preset: Optional[str], presets_doc: dict, profile_env: dict[str, str], cli_env: dict[str, str],
             secret_names: Iterable[str], local_env: dict[str, str], run_id: str, profile_name: str,
             seed: Optional[int] = None, dotenv_names: Iterable[str] = ()) -> EnvPlan:
    """Layer the job's environment: gpuops defaults < preset < profile env < --env < --seed; secrets aside.

    Secrets (sent in a 0600 file, never printed, never in meta.json or launch.sh): WANDB_API_KEY, the profile's
    secrets: names, every variable whose name looks secret (looks_secret) wherever it is given, and every variable
    of the project's .env (dotenv_names: their values from local_env, the real environment winning) but gpuops' own
    (own_variable). A .env variable that the preset, profile env: or --env also sets takes their value (as a plain
    variable unless its name looks secret); over gpuops' defaults (WANDB_RUN_NAME...) the .env value wins."""
    plan = EnvPlan()
    layers: list[tuple[str, str, Optional[str], str]] = [
        ("WANDB_RUN_NAME", run_id, "gpuops", "default: the run id"),
        ("WANDB_RUN_GROUP", profile_name, "gpuops", "default: the profile"),
        ("PYTHONUNBUFFERED", "1", "gpuops", "log lines reach the log as they are printed"),
    ]
    if preset:
        table = (presets_doc or {}).get("presets", {}) or {}
        if preset not in table:
            raise UsageError(f"unknown env_preset '{preset}'; known presets: {', '.join(table) or 'none'}",
                             hint="fix env_preset in the profile, or add the preset to playbooks/presets.yaml")
        for k, spec in ((table[preset] or {}).get("env") or {}).items():
            if isinstance(spec, dict):
                layers.append((k, str(spec.get("value", "")), f"preset {preset}", str(spec.get("reason", ""))))
            else:
                layers.append((k, str(spec), f"preset {preset}", ""))
    for k, v in (profile_env or {}).items():
        layers.append((k, v, "profile", ""))
    for k, v in (cli_env or {}).items():
        layers.append((k, v if v != "" else None, "--env", ""))
    if seed is not None:
        layers.append(("GPUOPS_SEED", str(seed), "--seed", ""))
        layers.append(("PYTHONHASHSEED", str(seed), "--seed", ""))
        if "PYTHONHASHSEED" in (cli_env or {}) or "PYTHONHASHSEED" in (profile_env or {}):
            plan.warnings.append("--seed overrides PYTHONHASHSEED from the profile or --env")

    secrets = list(dict.fromkeys([*ALWAYS_SECRET, *secret_names]))
    dotenv = [n for n in dict.fromkeys(dotenv_names) if not own_variable(n) and n not in RESERVED]
    given = {name for name, _, origin, _ in layers if origin != "gpuops"}
    for name, value, origin, reason in layers:
        if name in RESERVED:
            plan.warnings.append(f"{name} is set by gpuops; the value from {origin} is ignored")
            continue
        if origin == "gpuops" and name in dotenv:
            continue  # the project's .env says otherwise: its value, as a secret
        if name in secrets or looks_secret(name):
            if value:  # a secret given in the profile or --env: still a secret
                plan.secrets[name] = value
                plan.secret_origin[name] = origin
            continue
        plan.vars.pop(name, None)  # later wins, and keeps the later position
        plan.vars[name] = EnvVar(name, value, origin, reason)
    for name in secrets + [n for n in dotenv if n not in given and n not in secrets]:
        if name in plan.secrets:
            continue
        val = local_env.get(name)
        if val is not None and (val or name in dotenv):
            plan.secrets[name] = val
            plan.secret_origin[name] = ".env" if name in dotenv else "local environment"
        elif name not in ALWAYS_SECRET:
            plan.missing_secrets.append(name)
    for name in plan.missing_secrets:
        plan.warnings.append(f"secret {name} is not set in the local environment or .env; the job will not have it")
    return plan


def conflict_warnings(env: dict[str, str], presets_doc: dict, packages: Optional[dict[str, Optional[str]]] = None) -> list[str]:
    """Known conflicts (presets.yaml `conflicts`) that this environment triggers.

    packages: remote package versions (None = not installed); when unknown (None), env alone decides."""
    out = []
    for c in (presets_doc or {}).get("conflicts", []) or []:
        when = c.get("when") or {}
        cond_env = when.get("env") or {}
        if not cond_env or any(env.get(k) != str(v) for k, v in cond_env.items()):
            continue
        note = ""
        for pkg, spec in (when.get("package") or {}).items():
            if packages is None:
                note = f" (if the job uses {pkg} {spec})"
                continue
            ver = packages.get(pkg)
            if not ver or not _version_matches(ver, str(spec)):
                break
            note = f" ({pkg} {ver} is installed)"
        else:
            msg = f"{c.get('message', c.get('id', 'known conflict'))}{note}"
            if c.get("remediation"):
                msg += f"; {c['remediation']}"
            out.append(msg)
    return out


def conflict_packages(presets_doc: dict) -> list[str]:
    names: list[str] = []
    for c in (presets_doc or {}).get("conflicts", []) or []:
        for pkg in ((c.get("when") or {}).get("package") or {}):
            if pkg not in names:
                names.append(pkg)
    return names


def _version_matches(version: str, spec: str) -> bool:
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        return Version(version) in SpecifierSet(spec)
    except Exception:
        return True


# -- the job's command line ---------------------------------------------------------------
def script_path(script: str, project: Path, *, must_exist: bool) -> str:
    """--script as a POSIX path relative to the project folder (the script is synced with the project)."""
    p = Path(script)
    if p.is_absolute():
        try:
            p = p.resolve().relative_to(project.resolve())
        except ValueError:
            raise UsageError(f"--script {script}: not inside the project folder {project}",
                             hint="the script must be synced with the project; give a path relative to it") from None
    if must_exist and not (project / p).is_file():
        raise UsageError(f"--script {script}: no such file in {project}")
    text = p.as_posix()
    if text.startswith("../"):
        raise UsageError(f"--script {script}: not inside the project folder")
    return text


def read_shebang(path: Path) -> Optional[str]:
    """The interpreter line of a local script ("/usr/bin/env bash"), or None."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    return first[2:].decode("utf-8", "replace").strip() or None


def job_argv(script: str, args: Iterable[str], python: str = "python3", shebang: Optional[str] = None) -> list[str]:
    """How the script is started in the remote project folder, as `./script` would run it by hand:
    .py by the profile's Python; a script with a #! line by that interpreter (no exec bit needed); a .sh without one
    by bash (the runbooks' scripts are bash, and sh is dash on Ubuntu); anything else executed directly."""
    args = list(args)
    if script.endswith(".py"):
        return [*shlex.split(python), "-u", script, *args]
    if shebang:
        return [*shlex.split(shebang), script, *args]
    if script.endswith(".sh"):
        return ["bash", script, *args]
    return [script if "/" in script else "./" + script, *args]


# -- meta.json ------------------------------------------------------------------------------
def git_info(project_dir: Path) -> dict:
    def git(*a: str) -> Optional[str]:
        try:
            p = subprocess.run(["git", *a], cwd=project_dir, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return p.stdout if p.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit.strip(), "dirty": bool(status and status.strip())}


def build_meta(*, run_id: str, script: str, args: list[str], argv: list[str], profile, plan: EnvPlan,
               remote_dir: str, remote_run_dir: str, git: dict, seed: Optional[int], started: datetime,
               name: Optional[str] = None) -> dict:
    """meta.json: everything about the launch except secret values (their names only)."""
    from .. import __version__ as version

    return {
        "run_id": run_id,
        "name": name,
        "script": script,
        "args": list(args),
        "command": list(argv),
        "profile": profile.name,
        "host": profile.host,
        "port": profile.port,
        "user": profile.user,
        "remote_dir": remote_dir,
        "remote_run_dir": remote_run_dir,
        "git_commit": git.get("commit"),
        "git_dirty": git.get("dirty"),
        "started_at": started.astimezone(timezone.utc).isoformat(timespec="seconds"),
        "started_ts": started.timestamp(),
        "env": plan.exported,
        "env_unset": plan.unset,
        "env_preset": profile.env_preset,
        "secrets": sorted(plan.secrets),
        "seed": seed,
        "price_per_hour": profile.price_per_hour,
        "gpuops_version": version,
    }


# -- state ----------------------------------------------------------------------------------
@dataclass
class RunInfo:
    """What the remote side reports about one run (see launch.STATE_FN)."""
    run_id: str
    exists: bool = True
    pid: Optional[int] = None
    alive: bool = False
    exit_code: Optional[int] = None
    stopped: Optional[dict] = None
    started: Optional[float] = None
    ended: Optional[float] = None
    log_size: int = 0

    @property
    def state(self) -> str:
        return state_of(self)

    def elapsed(self, now: Optional[float] = None) -> Optional[float]:
        if self.started is None:
            return None
        end = self.ended if self.ended is not None else (now if now is not None else time.time())
        return max(0.0, end - self.started)

    def to_json(self, now: Optional[float] = None) -> dict:
        return {"run_id": self.run_id, "state": self.state, "exit_code": self.exit_code, "pid": self.pid,
                "started": self.started, "ended": self.ended, "elapsed": self.elapsed(now),
                "stopped": self.stopped, "log_size": self.log_size}


def state_of(info: RunInfo) -> str:
    if not info.exists:
        return LOST
    if info.stopped and not info.alive:
        return STOPPED
    if info.exit_code is not None:
        return SUCCEEDED if info.exit_code == 0 else FAILED
    if info.alive:
        return RUNNING
    return LOST


def parse_state_line(line: str) -> Optional[RunInfo]:
    """`RUN id=<id> exists=1 pid=.. alive=1 rc=.. started=.. ended=.. size=.. stop=<json or ->`."""
    if not line.startswith("RUN "):
        return None
    fields: dict[str, str] = {}
    rest = line[4:]
    stop_txt = None
    if " stop=" in rest:
        rest, _, stop_txt = rest.partition(" stop=")
    for tok in rest.split():
        k, _, v = tok.partition("=")
        fields[k] = v

    def num(key: str, cast=int):
        try:
            return cast(fields.get(key, "").strip())
        except ValueError:
            return None

    stopped = None
    if stop_txt and stop_txt.strip() not in ("", "-"):
        try:
            stopped = json.loads(stop_txt)
        except ValueError:
            stopped = {"raw": stop_txt.strip()}
    return RunInfo(run_id=fields.get("id", ""), exists=fields.get("exists") == "1", pid=num("pid"),
                   alive=fields.get("alive") == "1", exit_code=num("rc"), stopped=stopped,
                   started=num("started", float), ended=num("ended", float), log_size=num("size") or 0)


def exit_for_state(info: RunInfo) -> int:
    """watch's and logs -f's exit code: 0 when the job succeeded, 1 when it failed, was stopped or is lost."""
    return 0 if info.state == SUCCEEDED else 1



def cost(elapsed_s: Optional[float], price_per_hour: Optional[float]) -> Optional[float]:
    if elapsed_s is None or price_per_hour is None:
        return None
    return round(elapsed_s / 3600.0 * price_per_hour, 2)


def fmt_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


# -- preflight --------------------------------------------------------------------------------
@dataclass
class Preflight:
    gpus: list[str] = field(default_factory=list)
    gpu_error: Optional[str] = None
    free_gb: Optional[float] = None
    active: list[str] = field(default_factory=list)  # ids of gpuops runs still running on the host
    active_pids: list[int] = field(default_factory=list)  # their launchers' pids (= process group and session ids)
    packages: Optional[dict[str, Optional[str]]] = None
    has_setsid_fork: bool = True
    job_gpus: int = 0  # the GPUs the job is given: all listed, or those its CUDA_VISIBLE_DEVICES names (job_gpu_count)
    compile_error: Optional[str] = None  # the launch gate: the script does not compile (.py) or is unreadable
    python_found: Optional[bool] = None  # the launch gate: the profile's python exists on the host (None: not asked)
    facts: Optional[dict] = None  # the launch gate: the verify probe's document (stack facts), when gathered


def parse_preflight(text: str) -> Preflight:
    """Sections written by launch.PREFLIGHT: `@gpu rc=N`, `@df`, `@active`, `@pkg`, `@setsid`."""
    pf = Preflight()
    section, gpu_lines, gpu_rc = None, [], 0
    for line in text.splitlines():
        if line.startswith("@"):
            head = line[1:].split()
            section = head[0] if head else None
            if section == "gpu_rc":
                gpu_rc = int(head[1]) if len(head) > 1 and head[1].lstrip("-").isdigit() else 1
            elif section == "setsid":
                pf.has_setsid_fork = len(head) > 1 and head[1] == "1"
            elif section == "python":
                pf.python_found = len(head) > 1 and head[1] == "1"
            elif section == "compile":
                msg = line[len("@compile"):].strip()
                pf.compile_error = None if msg == "ok" else (msg or "the script could not be compiled")
            continue
        if section == "facts":
            if line.startswith("{"):
                try:
                    pf.facts = json.loads(line)
                except ValueError:
                    pass
            continue
        if section == "gpu":
            if line.strip():
                gpu_lines.append(line.strip())
        elif section == "df":
            parts = line.split()
            if len(parts) >= 4 and parts[3].isdigit():
                pf.free_gb = int(parts[3]) / 1024 / 1024
        elif section == "active":
            parts = line.split()
            if parts:
                pf.active.append(parts[0])
                if len(parts) > 1 and parts[1].isdigit():
                    pf.active_pids.append(int(parts[1]))
        elif section == "pkg":
            if pf.packages is None:
                pf.packages = {}
            name, _, ver = line.partition("=")
            if name.strip():
                pf.packages[name.strip()] = ver.strip() or None
    if gpu_rc != 0 or not gpu_lines:
        pf.gpu_error = (gpu_lines[0] if gpu_lines else "") or f"nvidia-smi exited {gpu_rc} and listed no GPU"
    else:
        pf.gpus = gpu_lines
    return pf


@dataclass
class PreflightVerdict:
    warnings: list[str] = field(default_factory=list)  # shown in this order, before the error if there is one
    error: Optional[GpuopsError] = None  # the launch is refused with this
    forced: list[str] = field(default_factory=list)  # problems --force launched past (recorded in meta.json)


# -- the launch gate: a stack that makes the run worthless ------------------------------------------
GATE_PACKAGES = ("torch", "torchvision", "torchaudio", "flash-attn")
GATE_SKIP = ("os", "cpus", "memory", "disk", "nvcc")  # facts the gate does not judge


def flash_attn_expected(profile) -> bool:
    e = profile.expect
    return "flash-attn" in e.packages or "flash_attn" in e.packages or "flash_attn" in e.imports


CVD = "CUDA_VISIBLE_DEVICES"


def job_env(plan: EnvPlan) -> dict[str, Optional[str]]:
    """The job's plain variables as the launcher sets them (None: unset); the gate's checks run with them."""
    return {k: v.value for k, v in plan.vars.items()}


def gate_params(profile, remote_dir: str, *, env: Optional[dict[str, Optional[str]]] = None,
                modules: Optional[dict[str, list[str]]] = None) -> dict:
    """The verify probe's parameters for the launch gate: only the facts it judges (it runs inside the preflight).
    env: the job's variables (job_env): the CUDA test and the module check run with them, as the job will.
    modules: job_imports.probe_groups (sys.path[0] -> names the job's python must find)."""
    return {"remote_dir": remote_dir, "packages": sorted(set(GATE_PACKAGES) | set(profile.expect.packages)),
            "imports": ["flash_attn"] if flash_attn_expected(profile) else [], "cuda_check": True,
            "skip": list(GATE_SKIP), "timeouts": {"cuda_check": 60, "imports": 60}, "env": [CVD],
            "job_env": env or {}, "gpu_apps": True, "find_modules": {"cwd": remote_dir, "groups": modules or {}}}


def job_cvd(facts, env: Optional[dict[str, Optional[str]]]) -> Optional[str]:
    """CUDA_VISIBLE_DEVICES as the job will have it: the run's environment plan, else the host's (None: not set)."""
    if env and CVD in env:
        return env[CVD]
    return facts.env.get(CVD)


def _given(facts, env: Optional[dict[str, Optional[str]]]) -> tuple[Optional[str], Optional[set[int]]]:
    """The job's CUDA_VISIBLE_DEVICES and the host's GPUs it names (None: not set, every GPU)."""
    from ..verify.checks import visible_gpus

    cvd = job_cvd(facts, env)
    given = visible_gpus(cvd, facts.gpus)
    return cvd, None if given is None else given & {g.index for g in facts.gpus}


def job_gpu_count(facts_doc: Optional[dict], env: Optional[dict[str, Optional[str]]], listed: int) -> int:
    """How many GPUs the job is given: those its CUDA_VISIBLE_DEVICES names, else all `listed` (nvidia-smi)."""
    from ..verify.facts import from_probe

    given = _given(from_probe(facts_doc), env)[1] if facts_doc else None
    return listed if given is None else len(given)


def gate_results(facts_doc: Optional[dict], profile, knowledge: dict,
                 env: Optional[dict[str, Optional[str]]] = None) -> list:
    """The failed checks that make a run worthless, as verify words them (title, measured, fix): a CPU-only torch
    on a GPU host, torch.cuda.is_available() False, fewer GPUs than expected (nvidia-smi; torch: the GPUs the job's
    CUDA_VISIBLE_DEVICES gives it, else expect.gpu_count), flash-attn not importing when expected, torch or
    flash-attn expected and not installed. env: the job's variables (job_env). Pure."""
    from ..verify import checks as ck
    from ..verify.facts import from_probe

    if not facts_doc:
        return []
    facts = from_probe(facts_doc, host=profile.host, failures=knowledge.get("nvidia_smi_failures", []))
    c = ck.Context(facts, profile, {}, knowledge, {}, {})
    out: list = []
    for r in ck.check_packages(c):
        if r.status == ck.FAIL and r.id.split(".", 1)[1] in ("torch", "flash-attn", "flash_attn") \
                and not c.installed(r.title):
            out.append(r)
    if facts.python_ok:
        out += [r for r in ck.check_torch_cuda_build(c) if r.status == ck.FAIL]
        if c.installed("torch"):
            out += [r for r in ck.check_cuda_runtime(c) if r.status == ck.FAIL and r.id == "cuda.runtime"]
        out += [r for r in ck.check_imports(c) if r.status == ck.FAIL and r.id == "packages.flash_attn"]
    out += [r for r in ck.check_gpu_count(c) if r.status == ck.FAIL]
    rt = facts.cuda_runtime or {}
    cvd, given = _given(facts, env)
    if given is None:
        want, expected = profile.expect.gpu_count, str(profile.expect.gpu_count)
    else:  # the job is given these GPUs: torch must see each of them, whatever the host has
        want, expected = len(given), f"{len(given)}: CUDA_VISIBLE_DEVICES={cvd}"
    if want and rt.get("available") and (rt.get("device_count") or 0) < want and c.gpu_host \
            and len(facts.gpus) >= want:
        out.append(ck.CheckResult("cuda.device_count", "GPUs visible to torch", ck.FAIL,
                                  f"torch sees {rt.get('device_count')} GPU(s)", expected,
                                  remediation="CUDA_VISIBLE_DEVICES hides some GPUs (check the profile's env: and "
                                              "--env), or a GPU is unusable"))
    return out


APPS_COMMAND = "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"


def gpu_holders(facts_doc: Optional[dict], active_pids: Iterable[int],
                env: Optional[dict[str, Optional[str]]] = None,
                active_ids: Optional[Iterable[str]] = None) -> list[tuple[str, list[str]]]:
    """The GPUs the job will see (CUDA_VISIBLE_DEVICES of `env`, else the host's) holding memory of a process that is
    not a running gpuops run: one (problem, fix lines) per process. A running gpuops run's process: its process group
    or session is an active run's launcher (active_pids), or its environment names GPUOPS_RUN_ID of an active run
    (active_ids; None: any run id). A process of a run that has ended or was stopped (a child that left the run's
    session) holds the GPU as any other process does. Pure: the probe's gpu_apps fact (nvidia-smi's compute
    processes, raw, and /proc facts per pid)."""
    from ..verify.facts import fact_value, from_probe

    apps = fact_value(facts_doc or {}, "gpu_apps")
    if not isinstance(apps, dict) or apps.get("rc") != 0:
        return []
    facts = from_probe(facts_doc)
    index = {g.uuid: g.index for g in facts.gpus if g.uuid}
    seen = _given(facts, env)[1]
    ours = set(active_pids)
    out = []
    for line in (apps.get("stdout") or "").splitlines():
        parts = [p.strip() for p in line.split(",", 3)]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        pid, mem, uuid, name = int(parts[0]), parts[1], parts[2], parts[3]
        gpu = index.get(uuid)
        if seen is not None and gpu not in seen:
            continue
        who = (apps.get("procs") or {}).get(str(pid)) or {}
        rid = who.get("run_id")
        if (rid and (active_ids is None or rid in active_ids)) or who.get("pgid") in ours or who.get("sid") in ours:
            continue
        held = f"{mem} MiB" if mem.isdigit() else f"memory ({mem})"
        owner = f", user {who['user']}" if who.get("user") else ""
        what = (f"a process left over from gpuops run {rid}, which is not running (stop it: gpuops stop {rid})"
                if rid else "which is not a gpuops run")
        out.append((f"GPU {gpu if gpu is not None else uuid} holds {held} of process {pid} ({name}{owner}), " + what,
                    [f"fix (process {pid}): see it with `{APPS_COMMAND}` and `ps -o pid,user,etime,cmd -p {pid}`; "
                     "stop it, or give the job another GPU (CUDA_VISIBLE_DEVICES in the profile's env: or --env)"]))
    return out


def found_modules(facts_doc: Optional[dict]) -> Optional[dict]:
    """The probe's find_modules answer: {sys.path[0]: {module: found}}, or None when it was not gathered."""
    from ..verify.facts import fact_value

    value = fact_value(facts_doc or {}, "find_modules")
    return value.get("result") if isinstance(value, dict) else None


def gate_line(r) -> str:
    """One gate problem as verify prints it: `title: measured (expected X)`; the fix goes in the hint."""
    text = f"{r.title}: {r.measured or '-'}"
    return text + (f" (expected {r.expected})" if r.expected else "")


def judge_preflight(pf: Preflight, *, script_found: bool, script: str, remote_dir: str, min_disk_gb: Optional[float],
                    force: bool, synced: bool, stack: Iterable = (), launcher: str = "none",
                    python: str = "python3", extra: Iterable[tuple[str, list[str]]] = ()) -> PreflightVerdict:
    """Launch or not: no GPU, less disk than the profile expects, another run still running, a broken stack
    (`stack`: gate_results), a script that does not compile, a launcher whose package the profile's python lacks
    (torchrun: torch, ray: ray), and `extra` (problem, fix lines) other judges found (a module the script imports
    that the job's python cannot find: job_imports.problems; a GPU held by another process: gpu_holders) are
    problems (--force turns them into warnings, recorded in verdict.forced); a missing script is a usage error;
    under 1 GB free is a warning."""
    from .launchers import NEEDS

    verdict = PreflightVerdict()
    problems = []
    fixes = []
    need = NEEDS.get(launcher)
    if pf.python_found is False:  # nothing it would run can be judged: said once, with what makes it
        problems.append(f"the profile's python {python} does not exist on the host yet")
        fixes.append("fix: run `gpuops setup` (it creates the environment that the profile's python: names and "
                     "installs the project into it), or correct python: in the profile")
    elif need and pf.packages is not None and not pf.packages.get(need):
        problems.append(f"--launcher {launcher} needs {need}, and {python} has no {need} installed")
        fixes.append(f"fix: put {need} in the project's dependencies (or expect.packages) and run gpuops setup")
    for r in stack:
        problems.append(gate_line(r))
        if r.remediation:
            fixes.append(f"fix ({r.title}): {r.remediation}")
    if script_found and pf.compile_error and pf.python_found is not False:
        problems.append(f"script {script} does not compile: {pf.compile_error}")
        fixes.append(f"fix: correct {script} (python -m py_compile {script} shows the error locally)")
    for problem, fix in extra:
        problems.append(problem)
        fixes += fix
    if pf.gpu_error:
        problems.append(f"no GPU visible: {pf.gpu_error}")
    if pf.free_gb is not None and min_disk_gb is not None and pf.free_gb < min_disk_gb:
        problems.append(f"only {pf.free_gb:.1f} GB free in {remote_dir} (the profile expects {min_disk_gb:g} GB)")
    elif pf.free_gb is not None and pf.free_gb < 1:
        verdict.warnings.append(f"only {pf.free_gb:.2f} GB free on the host; checkpoints may not fit")
    if pf.active:
        problems.append(f"another gpuops run is still running on the host: {', '.join(pf.active)}")
    if not script_found:
        verdict.error = UsageError(f"script not found on the host: {remote_dir}/{script}",
                                   hint="check the path; is it excluded from sync?" if synced else
                                   "sync first (drop --no-sync) or check the path")
    elif problems and not force:
        verdict.error = ChecksFailed("; ".join(problems) + "; not launching",
                                     hint="\n".join(fixes + [(f"stop it first (gpuops stop {pf.active[0]}) or "
                                                              if pf.active else "") + "add --force to launch anyway"]))
    elif problems:
        verdict.warnings += [p + " (--force: launching anyway)" for p in problems]
        verdict.forced = list(problems)
    return verdict


# -- status ---------------------------------------------------------------------------------
def status_rows(metas: dict[str, dict], infos: dict[str, RunInfo], now: float) -> list[dict]:
    """One row per run (newest first): what `gpuops status` shows, from local or remote meta and the remote state."""
    rows = []
    for rid, m in metas.items():
        info = infos.get(rid) or RunInfo(run_id=rid, exists=False)
        started = info.started or m.get("started_ts")
        elapsed = info.elapsed(now) if info.started else None
        rows.append({"run_id": rid, "script": m.get("script"), "state": info.state, "exit_code": info.exit_code,
                     "started": started, "elapsed": elapsed, "pid": info.pid, "stopped": info.stopped,
                     "cost": cost(elapsed, m.get("price_per_hour"))})  # USD, from the profile's price_per_hour
    rows.sort(key=lambda r: (r["started"] or 0, r["run_id"]), reverse=True)
    return rows


# -- local registry -----------------------------------------------------------------------------
def registry_dir(project_dir: Path | None = None) -> Path:
    return (project_dir or Path.cwd()) / "runs"


def save_local(meta: dict, project_dir: Path | None = None) -> Path:
    from ..paths import write_atomic

    path = registry_dir(project_dir) / meta["run_id"] / "meta.json"
    write_atomic(path, json.dumps(meta, indent=1, sort_keys=False) + "\n")
    return path


def save_local_state(run_id: str, info: RunInfo, project_dir: Path | None = None) -> None:
    from ..paths import write_atomic

    d = registry_dir(project_dir) / run_id
    if d.is_dir():
        try:
            write_atomic(d / "state.json", json.dumps(info.to_json(), indent=1) + "\n")
        except OSError:
            pass


def local_runs(profile_name: Optional[str] = None, project_dir: Path | None = None) -> list[dict]:
    """Runs recorded here (newest first), optionally of one profile."""
    out = []
    d = registry_dir(project_dir)
    if not d.is_dir():
        return out
    for f in d.glob("*/meta.json"):
        try:
            meta = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict) or "run_id" not in meta:
            continue
        if profile_name and meta.get("profile") != profile_name:
            continue
        out.append(meta)
    out.sort(key=lambda m: (m["started_ts"] if isinstance(m.get("started_ts"), (int, float)) else 0, str(m["run_id"])),
             reverse=True)  # a record edited by hand (a start that is not a number) sorts last, never an error
    return out


def resolve_run(run: Optional[str], profile_name: str, project_dir: Path | None = None) -> dict:
    """The meta of RUN (an id or a unique prefix), or the profile's latest run."""
    runs = local_runs(profile_name, project_dir)
    if not run:
        if not runs:
            raise UsageError(f"no runs of profile '{profile_name}' recorded in {registry_dir(project_dir)}",
                             hint="start one with: gpuops train --script train.py")
        return runs[0]
    exact = [m for m in runs if m["run_id"] == run]
    if exact:
        return exact[0]
    pref = [m for m in runs if m["run_id"].startswith(run)]
    if len(pref) == 1:
        return pref[0]
    if len(pref) > 1:
        raise UsageError(f"'{run}' matches {len(pref)} runs: {', '.join(m['run_id'] for m in pref[:5])}")
    others = [m for m in local_runs(None, project_dir) if m["run_id"] == run]
    if others:
        raise UsageError(f"run '{run}' belongs to profile '{others[0].get('profile')}'",
                         hint=f"add -p {others[0].get('profile')}")
    known = ", ".join(m["run_id"] for m in runs[:5]) or "none"
    raise UsageError(f"no run '{run}' of profile '{profile_name}' here; recent: {known}")


# -- fleets ---------------------------------------------------------------------------------
def node_meta(meta: dict, rank: Optional[int]) -> dict:
    """A fleet run's meta seen from one node (its run folder and pid); a one-host run: itself (rank 0 or None)."""
    nodes = meta.get("nodes") or []
    if rank is None or not nodes:
        if rank not in (None, 0) and not nodes:
            raise UsageError(f"run {meta['run_id']} ran on one host; there is no host {rank}")
        return meta
    if not 0 <= rank < len(nodes):
        raise UsageError(f"run {meta['run_id']} ran on {len(nodes)} hosts, numbered 0 to {len(nodes) - 1}")
    n = nodes[rank]
    return {**meta, "remote_run_dir": n["remote_run_dir"], "remote_run_path": n.get("remote_run_path"),
            "pid": n.get("pid"), "node_rank": rank}


def run_dir_on(meta: dict, rank: int) -> str:
    """Where a run's folder is on host `rank` (a one-host run's, or a fleet run's node's)."""
    nodes = meta.get("nodes") or []
    return nodes[rank]["remote_run_dir"] if rank < len(nodes) else meta["remote_run_dir"]


def fleet_exit(infos: list[Optional["RunInfo"]]) -> int:
    """A fleet run's exit code: 0 only if every node's job succeeded."""
    return 0 if infos and all(i is not None and exit_for_state(i) == 0 for i in infos) else 1
