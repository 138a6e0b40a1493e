"""Run lifecycle, the deciding part: run ids, the job's command line, meta.json, run state and the local registry.

Pure (no network): the remote side lives in jobs/scripts.py, the sequencing of each command in jobs/actions.py, the
commands (parse, render) in cli/jobs.py. The job's environment is planned in jobs/envplan.py, the launch gate judged
in jobs/gate.py; their names are imported here too, so code that reads them as `jobs.plan.*` (the tests) keeps
working; new code imports them from their own modules.

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
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Optional

from ..errors import UsageError
# re-exported (see the docstring): the environment plan and the launch gate, read as jobs.plan.* by the tests
from .envplan import (ALWAYS_SECRET, OWN_VARIABLES, RESERVED, SECRET_WORDS, EnvPlan, EnvVar,  # noqa: F401
                      conflict_packages, conflict_warnings, job_env, load_presets, looks_secret, own_variable,
                      parse_env_args, plan_env, recordable_env)
from .gate import (APPS_COMMAND, CVD, GATE_PACKAGES, GATE_SKIP, Preflight, PreflightVerdict,  # noqa: F401
                   flash_attn_expected, found_modules, gate_line, gate_params, gate_results, gpu_holders, job_cvd,
                   job_gpu_count, judge_preflight, parse_preflight)


RUNNING, SUCCEEDED, FAILED, STOPPED, LOST = "running", "succeeded", "failed", "stopped", "lost"
ENDED = (SUCCEEDED, FAILED, STOPPED, LOST)
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


def _state_file(run_id: str, project_dir: Path | None, rank: Optional[int]) -> Path:
    """runs/<id>/state.json, or a fleet run's other host's: state.host<N>.json (each host's job ends its own way)."""
    return registry_dir(project_dir) / run_id / ("state.json" if not rank else f"state.host{int(rank)}.json")


def save_local_state(run_id: str, info: RunInfo, project_dir: Path | None = None,
                     ending: Optional[dict] = None, rank: Optional[int] = None) -> None:
    """runs/<id>/state.json (a fleet's host N: state.host<N>.json): the run's last known state, and what it died of
    (jobs/endings.py) once judged (kept when a later save does not know it)."""
    from ..paths import write_atomic

    d = registry_dir(project_dir) / run_id
    if d.is_dir():
        doc = info.to_json()
        known = ending or (local_state(run_id, project_dir, rank) or {}).get("ending")
        if known and info.state in ENDED:
            doc["ending"] = known
        try:
            write_atomic(_state_file(run_id, project_dir, rank), json.dumps(doc, indent=1) + "\n")
        except OSError:
            pass


def local_state(run_id: str, project_dir: Path | None = None, rank: Optional[int] = None) -> Optional[dict]:
    """runs/<id>/state.json (a fleet's host N: state.host<N>.json) as saved, or None."""
    try:
        doc = json.loads(_state_file(run_id, project_dir, rank).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


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
