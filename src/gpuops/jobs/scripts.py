"""The remote side of the run lifecycle: preflight, launch, state, tail and stop, each ONE remote execution.

Everything interpolated into a remote shell goes through shlex.quote (profiles.shell_path for paths that may
start with ~). Secrets never appear on a command line: the launch bundle is a shell script sent on stdin to
`sh -s`; it creates the secrets file under `umask 077` (mode 0600 before a byte is written) and fills it from a
quoted here-document; the launcher sources it and deletes it before starting the job.

The job is started with `setsid -f nohup sh launch.sh` (its own session and process group, all three streams
redirected), so it survives the SSH connection closing; SIGINT/SIGQUIT are not ignored in it (an `&` job of a
non-interactive shell would ignore them). The launcher records its pid (= process group id), start and end time
and the job's exit code.
"""
from __future__ import annotations

import json
import secrets as _random
import shlex
import time
from typing import Callable, Iterable, Optional

from ..errors import RemoteError, UsageError
from ..remote.shell import heredoc as _heredoc
from ..remote.shell import shell_command, shell_path
from .endfacts import LAUNCHER_AFTER, LAUNCHER_BEFORE
from .gate import Preflight, parse_preflight
from .plan import RunInfo, parse_state_line

RUNS_SUBDIR = ".gpuops/runs"
ACTIVE_DIR = '"$HOME"/.gpuops/active'
LAUNCH_LOCK = '"$HOME"/.gpuops/launch.lock'

# sh functions shared by every remote script: is a run's launcher alive, and one RUN line describing a run
STATE_FN = r"""
gpuops_alive() {
  p=$(cat "$1/pid" 2>/dev/null) || return 1
  [ -n "$p" ] || return 1
  if [ -r "/proc/$p/cmdline" ]; then
    tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -qF -- "$2" || return 1
    return 0
  fi
  kill -0 "$p" 2>/dev/null
}
gpuops_state() {
  g_alive=0; g_rc=; g_stop=-; g_size=0; g_pid=; g_st=; g_en=
  if [ ! -d "$1" ]; then g_line="RUN id=$2 exists=0"; echo "$g_line"; return; fi
  g_pid=$(cat "$1/pid" 2>/dev/null)
  gpuops_alive "$1" "$2" && g_alive=1
  g_rc=$(cat "$1/exit_code" 2>/dev/null)
  g_st=$(cat "$1/started" 2>/dev/null)
  g_en=$(cat "$1/ended" 2>/dev/null)
  [ -f "$1/log" ] && g_size=$(wc -c < "$1/log" | tr -d ' ')
  [ -f "$1/stop.json" ] && g_stop=$(tr -d '\n' < "$1/stop.json")
  g_line="RUN id=$2 exists=1 pid=$g_pid alive=$g_alive rc=$g_rc started=$g_st ended=$g_en size=$g_size stop=$g_stop"
  echo "$g_line"
}
"""


def run_dir_of(remote_dir: str, run_id: str) -> str:
    return f"{remote_dir.rstrip('/')}/{RUNS_SUBDIR}/{run_id}"


# -- preflight ------------------------------------------------------------------------------------
# `python -m py_compile` without writing a .pyc into the project: compile() is what py_compile runs
COMPILE_CHECK = ("import sys\ntry:\n    compile(open(sys.argv[1], 'rb').read(), sys.argv[1], 'exec')\n"
                 "except SyntaxError as e:\n    print('%s: %s (line %s)' % (type(e).__name__, e.msg, e.lineno))\n"
                 "except Exception as e:\n    print('%s: %s' % (type(e).__name__, e))\nelse:\n    print('ok')\n")


def gate_lines(remote_dir: str, script: Optional[str], python: str, probe_params: Optional[dict]) -> str:
    """The launch gate's part of the preflight (same execution): the script compiles (.py) or is readable, and the
    verify probe's stack facts (torch build, CUDA, GPU count, flash-attn import) under `@facts`."""
    P = shell_path(remote_dir)
    first = shell_path((shlex.split(python) or ["python3"])[0])
    out = f'if command -v {first} >/dev/null 2>&1; then echo "@python 1"; else echo "@python 0"; fi\n'
    if script:
        f = f"{P}/{shlex.quote(script)}"
        if script.endswith(".py"):
            out += (f'if [ -e {f} ]; then echo "@compile $(cd {P} && {shell_command(python)} -c '
                    f'{shlex.quote(COMPILE_CHECK)} {shlex.quote(script)} 2>&1 | tail -n 1)"; fi\n')
        else:
            out += f'if [ -e {f} ] && [ ! -r {f} ]; then echo "@compile not readable by $(id -un)"; fi\n'
    if probe_params is not None:
        from ..remote.gather import probe_source

        tag = "GPUOPS_PROBE_" + _random.token_hex(8)
        out += (f"if command -v {first} >/dev/null 2>&1; then echo @facts; {shell_command(python)} - <<'{tag}'\n"
                f"{probe_source(probe_params)}\n{tag}\nfi\n")
    return out


def venv_lines(python: str) -> list[str]:
    """launch.sh lines: when the profile's Python lives in a virtual environment (its bin/ holds pyvenv.cfg one level
    up), that bin/ goes first on PATH and VIRTUAL_ENV is set, so `python`/`pip` in a .sh job are the profile's; a
    launcher command the environment's bin/ lacks (its torch is the image's, seen through --system-site-packages:
    torchrun, accelerate, deepspeed of launchers.LAUNCHER_COMMANDS) is a shim in the run folder's bin/, next on PATH,
    that runs it with the environment's python (`python -m torch.distributed.run`), never the system python's copy;
    and `uv run` in the job uses that environment as it is (UV_PROJECT_ENVIRONMENT, UV_NO_SYNC): the one setup built,
    extras included, with nothing installed while the instance bills. The profile's env: may set either otherwise."""
    from .launchers import LAUNCHER_COMMANDS

    first = (shlex.split(python) or ["python3"])[0]
    if "/" not in first:
        return []
    shims = " ".join(f"{cmd}:{mod}" for cmd, mod in LAUNCHER_COMMANDS)
    return [f"gpuops_py={shell_path(first)}",
            'gpuops_bin=$(dirname "$gpuops_py")',
            'if [ -f "$gpuops_bin/../pyvenv.cfg" ]; then',
            '  VIRTUAL_ENV=$(cd "$gpuops_bin/.." && pwd); export VIRTUAL_ENV',
            '  mkdir -p "$D/bin"',
            f"  for gpuops_l in {shims}; do",
            '    gpuops_c=${gpuops_l%%:*}',
            '    [ -e "$VIRTUAL_ENV/bin/$gpuops_c" ] || printf \'#!/bin/sh\\nexec "%s" -m %s "$@"\\n\' '
            '"$VIRTUAL_ENV/bin/$(basename "$gpuops_py")" "${gpuops_l#*:}" > "$D/bin/$gpuops_c"',
            '    [ -e "$VIRTUAL_ENV/bin/$gpuops_c" ] || chmod 755 "$D/bin/$gpuops_c"',
            "  done",
            '  PATH="$VIRTUAL_ENV/bin:$D/bin:$PATH"; export PATH; unset PYTHONHOME',
            '  UV_PROJECT_ENVIRONMENT=${UV_PROJECT_ENVIRONMENT:-$VIRTUAL_ENV}; export UV_PROJECT_ENVIRONMENT',
            '  UV_NO_SYNC=${UV_NO_SYNC:-1}; export UV_NO_SYNC',
            "fi"]


def preflight_script(remote_dir: str, script: Optional[str], python: str, packages: Iterable[str],
                     probe_params: Optional[dict] = None) -> str:
    P = shell_path(remote_dir)
    pkgs = " ".join(shlex.quote(p) for p in packages)
    check_script = ""
    if script:
        check_script = f'echo "@script $( [ -e {P}/{shlex.quote(script)} ] && echo 1 || echo 0 )"\n'
    check_script += gate_lines(remote_dir, script, python, probe_params)
    pkg = ""
    if pkgs:
        pkg = ("echo @pkg\n"
               f"{shell_command(python)} -c 'import sys\n"
               "try:\n    import importlib.metadata as m\nexcept Exception:\n    sys.exit(0)\n"
               "for n in sys.argv[1:]:\n    try:\n        print(n + \"=\" + m.version(n))\n"
               "    except Exception:\n        print(n + \"=\")\n' " + pkgs + " 2>/dev/null\n")
    gpu = ('echo @gpu\n$T nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>&1\n'
           'echo "@gpu_rc $?"')
    if probe_params is not None:  # the probe's nvidia-smi facts stand for these lines (one nvidia-smi run less)
        first = shell_path((shlex.split(python) or ["python3"])[0])
        gpu = f"if ! command -v {first} >/dev/null 2>&1; then\n{gpu}\nfi"
    return STATE_FN + f"""
T=; command -v timeout >/dev/null 2>&1 && T="timeout 20"
{gpu}
echo @df
d={P}; [ -d "$d" ] || d="$HOME"
df -Pk "$d" 2>/dev/null | tail -n 1
{check_script}{pkg}{ACTIVE_LISTING}echo @end
"""


# The host's gpuops runs still running, one line each (`id pid`, or `id` for one being launched), for a preflight
# (after the probe: its gpu_apps; a run registers before its process starts, so a gpuops run's process seen there is
# listed here). A run being launched (registered, no pid yet, the launch lock held) is running, never removed: only an
# ended one (exit_code) or a dead one is, as a concurrent `train`'s preflight could otherwise unlist a launch. Dead is
# judged twice, before and after the lock is looked at: a launch that ends between the two (its pid written, the lock
# released) was not running at the first look and is not launching at the second, and the fresh-clone CI saw that
# instant unlist it (two `train`s at the same moment both launched, the second's check under the lock finding none).
ACTIVE_LISTING = f"""echo @active
for f in {ACTIVE_DIR}/*; do
  [ -f "$f" ] || continue
  rd=$(cat "$f"); id=$(basename "$f")
  if [ -f "$rd/exit_code" ]; then rm -f "$f"
  elif gpuops_alive "$rd" "$id"; then echo "$id $(cat "$rd/pid" 2>/dev/null)"
  elif [ ! -s "$rd/pid" ] && [ -d {LAUNCH_LOCK} ]; then echo "$id"
  elif gpuops_alive "$rd" "$id"; then echo "$id $(cat "$rd/pid" 2>/dev/null)"
  else rm -f "$f"
  fi
done
"""


def preflight(remote, remote_dir: str, script: Optional[str], python: str, packages: Iterable[str] = (),
              probe_params: Optional[dict] = None) -> tuple[Preflight, bool]:
    res = remote.run("sh -s", stdin=preflight_script(remote_dir, script, python, packages, probe_params),
                     timeout=180 if probe_params is not None else 60)
    pf = parse_preflight(res.stdout)
    if pf.facts is not None and "@gpu_rc" not in res.stdout:
        from ..verify.facts import from_probe
        from ..knowledge import knowledge

        f = from_probe(pf.facts, failures=knowledge().get("nvidia_smi_failures", []))
        if f.smi.state == "ok" and f.gpus:
            pf.gpus, pf.gpu_error = [f"{g.index}, {g.name}, {g.memory_total_mib}" for g in f.gpus], None
        else:
            pf.gpus, pf.gpu_error = [], (f.smi.message or f.smi.title or "nvidia-smi listed no GPU")
    script_found = "@script 1" in res.stdout if script else True
    return pf, script_found


# -- launch ---------------------------------------------------------------------------------------------
def argv_command(argv: list[str], python: str) -> str:
    """A job's argv as one shell command line, the profile's Python (which may start with ~) kept runnable."""
    py = shlex.split(python or "python3") or ["python3"]
    if argv[:len(py)] == py:
        return " ".join([shell_command(python)] + [shlex.quote(w) for w in argv[len(py):]])
    return " ".join(shlex.quote(w) for w in argv)


def launcher_script(*, run_id: str, remote_dir: str, argv: list[str], python: str, env: dict[str, str],
                    unset: Iterable[str], command: Optional[str] = None, prelude: str = "") -> str:
    """launch.sh: runs in its own session; the job runs in the foreground so the shell survives SIGINT/SIGTERM
    (trapped, deferred until the job ends) and records the job's exit status. `command` (shell text, every value
    in it already quoted) replaces the argv's command line, and `prelude` runs before it: a fleet's launchers."""
    cmd = command or argv_command(argv, python)
    from ..profiles.model import ENV_NAME

    bad = [k for k in [*env, *unset] if not ENV_NAME.fullmatch(k)]
    if bad:  # validated when profiles and presets load; never let a name run as a command
        raise UsageError(f"not a variable name: {bad[0]!r}")
    lines = [
        "#!/bin/sh",
        f"# gpuops launcher for run {run_id} (generated)",
        'D=$(cd "$(dirname "$0")" && pwd) || exit 127',
        'echo $$ > "$D/pid.tmp" && mv "$D/pid.tmp" "$D/pid"',
        'date +%s > "$D/started"',
        "trap 'gpuops_signal=INT' INT",
        "trap 'gpuops_signal=TERM' TERM",
        "trap 'gpuops_signal=HUP' HUP",
        'if [ -f "$D/secrets.env" ]; then . "$D/secrets.env"; rm -f "$D/secrets.env"; fi',
        *venv_lines(python),
    ]
    for k in unset:
        lines.append(f"unset {k}")
    for k, v in env.items():
        lines.append(f"{k}={shlex.quote(v)}; export {k}")
    lines += [
        f"GPUOPS_RUN_ID={shlex.quote(run_id)}; export GPUOPS_RUN_ID",
        'GPUOPS_RUN_DIR="$D"; export GPUOPS_RUN_DIR',
        *([prelude.rstrip("\n")] if prelude else []),
        LAUNCHER_BEFORE,  # what its death is judged by (jobs/endfacts.py): the cgroup's OOM kills so far
        f"if cd {shell_path(remote_dir)}; then",
        # the launch is reported only from here on; the mv runs without the run's mark: a command of the launcher
        # that carries GPUOPS_RUN_DIR is listed as the job's by its pid sampler (endfacts.LAUNCHER_BEFORE), and a
        # list holding only the mv's pid made the job's own OOM kill look like another process's
        '  echo $$ > "$D/job.tmp" && (unset GPUOPS_RUN_DIR GPUOPS_RUN_ID; exec mv "$D/job.tmp" "$D/job")',
        f"  {cmd}",
        "  gpuops_rc=$?",
        "else",
        f"  echo {shlex.quote('gpuops: cannot enter the project folder ' + remote_dir)} >&2",
        "  gpuops_rc=127",
        "fi",
        ': > "$D/job_ended"',  # the job's command returned: a stop from now on has nothing to stop (stop_script)
        LAUNCHER_AFTER.rstrip("\n"),  # end.facts (OOM kills, the signal received, df) before the exit code
        'date +%s > "$D/ended"',
        'echo "$gpuops_rc" > "$D/exit_code.tmp" && mv "$D/exit_code.tmp" "$D/exit_code"',
        f"rm -f {ACTIVE_DIR}/{shlex.quote(run_id)}",
        'exit "$gpuops_rc"',
    ]
    return "\n".join(lines) + "\n"




def launch_bundle(*, run_id: str, remote_dir: str, meta: dict, launcher: str, secrets: dict[str, str],
                  python: str, force: bool = False) -> str:
    """The script sent on stdin to `sh -s`: under the host's launch lock, check that no other gpuops run is running
    (unless force), create the run folder, write files, start the job detached, and release the lock only once the
    job has started: the check and the launch are one step, so two `train`s at the same moment cannot both launch."""
    D = shell_path(run_dir_of(remote_dir, run_id))
    secret_text = "".join(f"{k}={shlex.quote(v)}; export {k}\n" for k, v in secrets.items())
    busy = "" if force else (
        f"for f in {ACTIVE_DIR}/*; do\n"
        '  [ -f "$f" ] || continue\n'
        '  rd=$(cat "$f"); id=$(basename "$f")\n'
        f'  [ "$id" = {shlex.quote(run_id)} ] && continue\n'  # the same fleet run's other node on a shared host
        '  if [ ! -f "$rd/exit_code" ] && gpuops_alive "$rd" "$id"; then echo "@busy $id"; exit 0; fi\n'
        "done")
    parts = [
        STATE_FN,
        "set -e",
        "umask 077",
        'mkdir -p "$HOME/.gpuops"',
        f"L={LAUNCH_LOCK}; gpuops_i=0",
        # mkdir is atomic everywhere (flock(1) is not on every image); a lock older than 20 s is a crashed launch's
        'until mkdir "$L" 2>/dev/null; do gpuops_i=$((gpuops_i+1)); if [ $gpuops_i -gt 400 ]; then rmdir "$L" '
        '2>/dev/null || true; gpuops_i=0; fi; sleep 0.05; done',
        "trap 'rmdir \"$L\" 2>/dev/null' EXIT",
        busy,
        f"D={D}",
        'mkdir -p "$(dirname "$D")"',
        'mkdir "$D"',
        'D=$(cd "$D" && pwd -P)',
        _heredoc('"$D/meta.json"', json.dumps(meta, sort_keys=False)),
        _heredoc('"$D/launch.sh"', launcher),
    ]
    if secrets:
        parts += [
            ': > "$D/secrets.env"',  # created 0600 (umask 077) before anything is written to it
            'chmod 600 "$D/secrets.env"',
            _heredoc('"$D/secrets.env"', secret_text, append=True),
        ]
    parts += [
        "set +e",
        'if ! sh -n "$D/launch.sh" 2>"$D/launch.err"; then rm -f "$D/secrets.env"; '
        'echo "@launcherror $(head -c 300 "$D/launch.err")"; exit 0; fi',
        "set -e",
        f"mkdir -p {ACTIVE_DIR}",
        f"printf '%s\\n' \"$D\" > {ACTIVE_DIR}/{shlex.quote(run_id)}",
        ': > "$D/log"',
        "umask 022",
        "set +e",
        "if setsid -f true >/dev/null 2>&1; then",
        '  setsid -f nohup sh "$D/launch.sh" </dev/null >>"$D/log" 2>&1',
        "else",
        f"  {shell_command(python)} -c 'import os, signal, sys\n"
        "for s in (signal.SIGINT, signal.SIGQUIT):\n    signal.signal(s, signal.SIG_DFL)\n"
        "os.setsid()\nos.execvp(sys.argv[1], sys.argv[1:])' nohup sh \"$D/launch.sh\" </dev/null >>\"$D/log\" 2>&1 &",
        "fi",
        # launched = the launcher reached the job (it wrote `job`); a launcher that ended before it has failed
        'i=0; while [ ! -s "$D/job" ] && [ ! -f "$D/exit_code" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done',
        'if [ ! -s "$D/job" ]; then echo "@notstarted $(cat "$D/exit_code" 2>/dev/null)"; tail -c 400 "$D/log"; exit 0; fi',
        'echo "@launched $(cat "$D/pid" 2>/dev/null) $D"',
    ]
    return "\n".join(parts) + "\n"


def launch(remote, *, run_id: str, remote_dir: str, meta: dict, launcher: str, secrets: dict[str, str],
           python: str, force: bool = False) -> tuple[int, str]:
    """Start the job; returns (pid, absolute remote run folder)."""
    from ..errors import ConnectError

    bundle = launch_bundle(run_id=run_id, remote_dir=remote_dir, meta=meta, launcher=launcher, secrets=secrets,
                           python=python, force=force)
    before = remote.exec_count
    try:
        res = remote.run("sh -s", stdin=bundle, timeout=60)
    except ConnectError as exc:  # say whether anything was launched (issue #36: it said only "connection lost")
        host, name = remote.profile.host, getattr(remote.profile, "name", "")
        if remote.exec_count == before:  # the launch never started on the host
            raise ConnectError(f"connection to {host} was lost before the launch of {run_id}: nothing was launched "
                               "(the checks had passed)", hint="run the same command again once the host answers "
                               f"(`gpuops verify{' -p ' + name if name else ''}` checks it)") from exc
        raise ConnectError(f"connection to {host} was lost during the launch of {run_id}: whether the job started is "
                           "not known", hint=f"`gpuops status{' -p ' + name if name else ''}` lists the host's runs "
                           f"({run_id} among them if it started); nothing of it is recorded here") from exc
    lines = res.stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("@busy "):
            from ..errors import ChecksFailed

            other = line.split(" ", 1)[1].strip()
            raise ChecksFailed(f"another gpuops run is still running on the host: {other}; not launching",
                               hint=f"stop it first (gpuops stop {other}) or add --force to launch anyway")
        if line.startswith("@launcherror"):
            raise RemoteError(f"run {run_id} not launched: its launcher does not parse on the host: "
                              f"{line[len('@launcherror'):].strip()}")
        if line.startswith("@notstarted"):
            rc = line[len("@notstarted"):].strip() or "none"
            tail = " | ".join(x for x in lines[i + 1:] if x.strip())[-300:]
            raise RemoteError(f"run {run_id} did not start (launcher exit {rc}): {tail or 'no output'}",
                              hint=f"see {run_dir_of(remote_dir, run_id)}/log on the host")
        if line.startswith("@launched "):
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[1].isdigit():
                return int(parts[1]), parts[2]
            raise RemoteError(f"run {run_id} did not start: no process id recorded in its folder",
                              hint=f"see {run_dir_of(remote_dir, run_id)}/log on the host")
    detail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or [f"exit {res.rc}"]
    raise RemoteError(f"could not create the run folder for {run_id}: {detail[0]}")


# -- state, tail, stop ------------------------------------------------------------------------------
def state_lines(runs: Iterable[tuple[str, str]]) -> str:
    """Shell lines printing one RUN line per (run id, remote run dir)."""
    return "".join(f"gpuops_state {shell_path(d)} {shlex.quote(rid)}\n" for rid, d in runs)


def query_states(remote, runs: list[tuple[str, str]], *, gpu: bool = False, list_dir: Optional[str] = None,
                 log_tail: int = 0, endings: Iterable[str] = ()) -> dict:
    """One execution: RUN lines for the given runs, optionally the GPU utilisation and other runs' meta.json, the
    last `log_tail` log lines of each RUNNING run (for status's training signals), and for the runs named in
    `endings` that ended otherwise than with exit 0 the facts of their death (jobs/endfacts.py: "end_lines")."""
    from .endfacts import GATHER_FN

    script = STATE_FN + state_lines(runs)
    wanted = [(rid, d) for rid, d in runs if rid in set(endings)]
    if wanted:
        script += GATHER_FN + "gpuops_endhost\n" + "".join(
            f'gpuops_state {shell_path(d)} {shlex.quote(rid)} >/dev/null; [ "$g_alive" = 1 ] || [ "$g_rc" = 0 ] || '
            f"gpuops_endrun {shell_path(d)} {shlex.quote(rid)}\n" for rid, d in wanted)
    if list_dir:
        R = shell_path(f"{list_dir.rstrip('/')}/{RUNS_SUBDIR}")
        script += (f'for d in {R}/*/; do [ -f "$d/meta.json" ] || continue; id=$(basename "$d"); '
                   'echo "META $id $(tr -d \'\\n\' < "$d/meta.json")"; gpuops_state "${d%/}" "$id"; done\n')
    if log_tail:
        script += _tail_lines(runs, list_dir, log_tail)
    if gpu:  # the GPUs' health (HG, HX: watch's own lines) and the project's disk (DK, DI) while it trains (#35)
        from .trainhealth import HEALTH_FN, disk_command

        script += HEALTH_FN + "{ gpuops_health; } 2>&1\n"
        script += disk_command(shell_path(list_dir or "~")) + "\n"
    if gpu:
        from .plan import GPU_QUERY  # the same sample format watch parses

        script += ('echo @gpu\nT=; command -v timeout >/dev/null 2>&1 && T="timeout 20"\n'
                   f"$T nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits 2>&1\n")
    res = remote.run("sh -s", stdin=script, timeout=60)
    infos: dict[str, RunInfo] = {}
    metas: dict[str, dict] = {}
    gpu_lines: list[str] = []
    logs: dict[str, list[str]] = {}
    in_gpu = False
    end_lines: list[str] = []
    health_lines: list[str] = []
    for line in res.stdout.splitlines():
        if line.startswith("EN ") and not in_gpu:
            end_lines.append(line)
            continue
        if line.startswith(("HG ", "HX ", "DK ", "DI ")) and not in_gpu:
            health_lines.append(line)
            continue
        if line.startswith("LOG ") and not in_gpu:
            _, rid, text = (line.split(" ", 2) + [""])[:3]
            logs.setdefault(rid, []).append(text)
            continue
        if line == "@gpu":
            in_gpu = True
            continue
        if in_gpu:
            gpu_lines.append(line)
            continue
        info = parse_state_line(line)
        if info:
            infos[info.run_id] = info
        elif line.startswith("META "):
            _, rid, doc = (line.split(" ", 2) + [""])[:3]
            try:
                metas[rid] = json.loads(doc)
            except ValueError:
                pass
    return {"infos": infos, "metas": metas, "gpu_lines": gpu_lines, "logs": logs, "end_lines": end_lines,
            "health_lines": health_lines}


def _tail_lines(runs: list[tuple[str, str]], list_dir: Optional[str], n: int) -> str:
    """Shell: `LOG <run id> <line>` for the last n lines of each running run's log (state output discarded)."""
    body = ('gpuops_state "$d" "$id" >/dev/null; [ "$g_alive" = 1 ] && [ -f "$d/log" ] && '
            f'tail -n {int(n)} "$d/log" | tr -d \'\\r\' | sed "s/^/LOG $id /"\n')
    if not list_dir:
        return "".join(f"d={shell_path(run_dir)}; id={shlex.quote(rid)}\n" + body for rid, run_dir in runs)
    R = shell_path(f"{list_dir.rstrip('/')}/{RUNS_SUBDIR}")
    return f'for d in {R}/*/; do [ -f "$d/meta.json" ] || continue; d=${{d%/}}; id=$(basename "$d")\n' + body + "done\n"


def stream_from(remote, run_dir: str, offset: int, size: int, chunk: int = 1 << 16):
    """The log's bytes [offset, size), exactly, as chunks read from one remote stream (memory stays bounded)."""
    if size <= offset:
        return
    D = shell_path(run_dir)
    chan = remote.stream(f"[ -r {D}/log ] || exit 1; tail -c +{int(offset) + 1} {D}/log | head -c {int(size - offset)}")
    got = 0
    try:
        while True:
            data = chan.recv(chunk)
            if not data:
                break
            got += len(data)
            yield data
        rc = chan.recv_exit_status()
    finally:
        chan.close()
    if rc != 0 or got != size - offset:
        raise RemoteError(f"could not read the end of the log in {run_dir} (exit {rc}, {got} of {size - offset} "
                          "bytes)")


STATE_WAIT_S = 60.0  # tail_stream: how long past the exit status the run's state line may still come


def tail_stream(remote, run_id: str, run_dir: str, lines: int, write, chunk: int = 1 << 16) -> RunInfo:
    """`gpuops logs`: the run's state (first line of stderr), then the last N lines of its log written to `write`
    as raw bytes while they arrive: byte-exact, and memory stays bounded whatever the log's size."""
    D = shell_path(run_dir)
    script = STATE_FN + f"gpuops_state {D} {shlex.quote(run_id)} >&2\n[ -f {D}/log ] && tail -n {int(lines)} {D}/log\n"
    from ..remote.connection import output_complete

    chan = remote.stream("sh -c " + shlex.quote(script))
    err, seen, waited = bytearray(), {}, None
    try:
        while True:
            if chan.recv_ready():
                data = chan.recv(chunk)
                if data:
                    write(data)
                    seen.pop("exit_at", None)
                    continue
            if chan.recv_stderr_ready():
                err += chan.recv_stderr(chunk)
                seen.pop("exit_at", None)
                continue
            if output_complete(chan, seen):  # the exit status may come before the log's last bytes
                # the state line is always printed first: without it the output is not all here yet (a loaded
                # host's sshd may forward it seconds after the exit status), so wait for it or the channel's EOF
                if b"\nRUN " in b"\n" + err or chan.eof_received or chan.closed:
                    break
                waited = waited or time.monotonic()
                if time.monotonic() - waited > STATE_WAIT_S:
                    break
            import select

            select.select([chan], [], [], 0.1)
    finally:
        chan.close()
    said = err.decode("utf-8", "replace").splitlines()
    state = next((parse_state_line(x) for x in said if x.startswith("RUN ")), None)  # whatever the shell said first
    if state is None:  # no state line at all: not an answer that the run is not there
        raise RemoteError(f"could not read run {run_id}'s state on the host ({run_dir}): "
                          + (" / ".join(x.strip() for x in said if x.strip())[:300] or "no answer"))
    return state


def tail(remote, run_id: str, run_dir: str, lines: int) -> tuple[RunInfo, str]:
    D = shell_path(run_dir)
    script = STATE_FN + f"gpuops_state {D} {shlex.quote(run_id)}\n[ -f {D}/log ] && tail -n {int(lines)} {D}/log\n"
    res = remote.run("sh -s", stdin=script, timeout=60)
    first, _, rest = res.stdout.partition("\n")
    info = parse_state_line(first) or RunInfo(run_id=run_id, exists=False)
    return info, rest


def stop_script(run_id: str, run_dir: str, grace: float) -> str:
    """Stop every process of the run: its launcher's process group, and every process whose environment carries the
    run's marker (GPUOPS_RUN_DIR, the run folder, which launch.sh exports and children inherit), found in
    /proc/<pid>/environ: a child that started its own session (setsid, start_new_session=True) has left the group
    but still carries it. SIGINT, then SIGTERM, then SIGKILL, `grace` seconds apart. A run whose launcher has ended
    while such a process lives on is not `notrunning`: those processes are ended too."""
    D = shell_path(run_dir)
    ticks = max(1, int(round(grace * 10)))
    rid = shlex.quote(run_id)
    return STATE_FN + f"""
D={D}
p=$(cat "$D/pid" 2>/dev/null)
A=$(cd "$D" 2>/dev/null && pwd -P)
members() {{ [ -n "$A" ] || return 0; grep -lzxF -- "GPUOPS_RUN_DIR=$A" /proc/[0-9]*/environ 2>/dev/null | sed 's#^/proc/##; s#/environ$##' | grep -vx -- "$$"; }}
# the group alive: a process of it that is not a zombie (a launcher that ended but was not reaped yet, as under a
# container's init that does not reap, is gone); without ps, kill -0 says it
galive_group() {{
  [ -n "$p" ] && env kill -0 -- -"$p" 2>/dev/null || return 1
  gpuops_ps=$(ps -e -o pgid= -o stat= 2>/dev/null) || return 0
  printf '%s\n' "$gpuops_ps" | awk -v g="$p" '$1 == g && $2 !~ /^Z/ {{ found = 1 }} END {{ exit !found }}'
}}
galive() {{ galive_group || [ -n "$(members)" ]; }}
sendall() {{ [ -n "$p" ] && env kill -s "$1" -- -"$p" 2>/dev/null; m=$(members); [ -n "$m" ] && env kill -s "$1" $m 2>/dev/null; return 0; }}
if [ -z "$p" ] && [ -z "$(members)" ]; then echo "@stop nopid"; gpuops_state "$D" {rid}; exit 0; fi
# the job's command returned by itself (killed with its GPU, say) and its launcher is recording the end (end facts,
# up to 10 s of df, then the exit code): waited for, never signalled, so the stop does not claim an ending it did
# not cause; a process the job left behind is still stopped below
i=0; while [ -f "$D/job_ended" ] && [ ! -f "$D/exit_code" ] && galive_group && [ $i -lt 150 ]; do sleep 0.1; i=$((i+1)); done
i=0; while [ -f "$D/job_ended" ] && [ -f "$D/exit_code" ] && galive_group && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done
if ! galive; then echo "@stop notrunning"; gpuops_state "$D" {rid}; exit 0; fi
echo "@stopping"
had_rc=0; [ -f "$D/exit_code" ] && had_rc=1
gone() {{ i=0; while [ $i -lt $1 ]; do
  if galive_group; then :; elif [ -z "$(members)" ]; then return 0; fi
  sleep 0.1; i=$((i+1)); done; ! galive; }}
lm=$(stat -c %Y "$D/log" 2>/dev/null); lm=${{lm:-null}}  # when it last printed, before a signal makes it print
req=$(date +%s)
sig=INT
sendall INT
if ! gone {ticks}; then
  sig=TERM; sendall TERM
  if ! gone {ticks}; then
    sig=KILL; sendall KILL
    gone 50
  fi
fi
now=$(date +%s)
if [ ! -f "$D/exit_code" ]; then
  echo "$now" > "$D/ended"
  echo 137 > "$D/exit_code"
fi
rm -f {ACTIVE_DIR}/{rid}
if [ "$had_rc" = 0 ]; then
printf '{{"by": "gpuops stop", "signal": "%s", "requested": %s, "ended": %s, "grace": {float(grace)}, "log_mtime": %s}}\\n' "$sig" "$req" "$now" "$lm" > "$D/stop.json"
fi
echo "@stop $sig"
gpuops_state "$D" {rid}
"""


def stop(remote, run_id: str, run_dir: str, grace: float,
         on_stopping: Optional[Callable[[], None]] = None) -> tuple[str, RunInfo]:
    """Stop the run in one execution, read as it goes: on_stopping() is called once the host found the run alive
    and is about to signal it (so "stopping..." is said only for a run that runs)."""
    chan = remote.stream("sh -s")
    lines = []
    try:
        chan.sendall(stop_script(run_id, run_dir, grace).encode())
        chan.shutdown_write()
        for line in remote.iter_lines(chan, idle_timeout=3 * grace + 60):
            if line == "@stopping" and on_stopping is not None:
                on_stopping()
            lines.append(line)
        err = chan.recv_stderr(1 << 16).decode("utf-8", "replace") if chan.recv_stderr_ready() else ""
    finally:
        chan.close()
    how, info = "", None
    for line in lines:
        if line.startswith("@stop "):
            how = line.split(" ", 1)[1].strip()
        elif line.startswith("RUN "):
            info = parse_state_line(line)
    if not how:
        detail = (err.strip() or "\n".join(lines).strip()).splitlines()[-1:] or ["no answer"]
        raise RemoteError(f"stop of {run_id} failed: {detail[0]}")
    return how, info or RunInfo(run_id=run_id)
