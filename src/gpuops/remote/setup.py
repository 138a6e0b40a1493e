"""The remote side of `gpuops setup`: the facts script (ONE execution), the start bundle (setup.sh written and started
detached with setsid nohup, like train's launcher) and the attach stream (the log from the start until the script
ends). Every interpolated value is quoted (shlex.quote, profiles.shell_path for paths that may start with ~).

Files on the host, under <remote_dir>/.gpuops/setup/: setup.sh, log, pid, exit_code, plan.json, done.json (the stamp
of the last successful setup).
"""
from __future__ import annotations

import json
import shlex
from typing import Iterator, Optional

from ..errors import RemoteError
from ..profiles import shell_command, shell_path
from .launch import _heredoc

FA_IMPORT = "import flash_attn"


def setup_dir_of(remote_dir: str) -> str:
    from ..setup_plan import SETUP_SUBDIR

    return f"{remote_dir.rstrip('/')}/{SETUP_SUBDIR}"


def facts_script(remote_dir: str, python: str, packages: list[str], check_flash: bool) -> str:
    from ..setup_plan import DEP_FILES

    P = shell_path(remote_dir)
    D = shell_path(setup_dir_of(remote_dir))
    py = shell_command(python)
    pkgs = " ".join(shlex.quote(p) for p in packages)
    pkg_code = ("import sys\nfrom importlib import metadata as m\nfor n in sys.argv[1:]:\n    try:\n"
                "        print('@pkg %s=%s' % (n, m.version(n)))\n    except Exception:\n        print('@pkg %s=' % n)\n"
                "print('env_python_version=%d.%d.%d' % sys.version_info[:3])\n")
    pip_ok = ("import os, sysconfig, importlib.util\n"
              "em = os.path.exists(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED'))\n"
              "print('pip_user_ok=%d' % (importlib.util.find_spec('pip') is not None and not em))\n")
    files = "".join(f'[ -f {P}/{f} ] && echo "@file {f} $(sha256sum < {P}/{f} | cut -d" " -f1)"\n' for f in DEP_FILES)
    flash = ""
    if check_flash:
        flash = (f'  if o=$({py} -c {shlex.quote(FA_IMPORT)} 2>&1); then echo flash_attn=ok; '
                 'else echo "flash_attn=$(printf \'%s\\n\' "$o" | tail -n 1)"; fi\n')
    return f"""T=; command -v timeout >/dev/null 2>&1 && T="timeout 20"
echo "home=$HOME"
echo "user=$(id -un)"
u=$(command -v uv 2>/dev/null || {{ [ -x "$HOME/.local/bin/uv" ] && echo "$HOME/.local/bin/uv"; }})
echo "uv=$u"
echo "python3=$(command -v python3 2>/dev/null)"
command -v python3 >/dev/null 2>&1 && python3 -c {shlex.quote(pip_ok)} 2>/dev/null
if {py} -c 'import sys' >/dev/null 2>&1; then
  echo env_python=1
  {py} -c {shlex.quote(pkg_code)} {pkgs} 2>/dev/null
{flash}else
  echo env_python=0
fi
{files}D={D}
[ -f "$D/done.json" ] && echo "@stamp $(tr -d '\\n' < "$D/done.json")"
p=$(cat "$D/pid" 2>/dev/null)
if [ -n "$p" ] && [ ! -f "$D/exit_code" ] && kill -0 "$p" 2>/dev/null; then echo running=1; else echo running=0; fi
[ -f "$D/exit_code" ] && echo "last_rc=$(cat "$D/exit_code")"
if command -v nvidia-smi >/dev/null 2>&1; then
  $T nvidia-smi --query-gpu=index,driver_version,compute_cap --format=csv,noheader 2>/dev/null | sed 's/^/@gpu /'
  echo "cuda_driver=$($T nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\\([0-9.]*\\).*/\\1/p' | head -n 1)"
fi
echo "home_disk=$(df -Pk "$HOME" 2>/dev/null | tail -n 1 | awk '{{print $1, $4}}')"
for d in "${{TMPDIR:-/tmp}}" /tmp /mnt /mnt/* /data /data* /scratch /lambda /ephemeral /workspace; do
  [ -d "$d" ] && [ -w "$d" ] || continue
  echo "@disk $d $(df -Pk "$d" 2>/dev/null | tail -n 1 | awk '{{print $1, $4}}')"
done
"""


def gather(remote, remote_dir: str, python: str, packages: list[str], check_flash: bool):
    from ..setup_plan import parse_facts

    res = remote.run("sh -s", stdin=facts_script(remote_dir, python, packages, check_flash), timeout=120)
    if "home=" not in res.stdout:
        detail = (res.stderr.strip().splitlines() or [f"exit {res.rc}"])[-1]
        raise RemoteError(f"could not gather the host's facts for setup: {detail}")
    return parse_facts(res.stdout)


def start(remote, *, remote_dir: str, script: str, plan_doc: dict) -> int:
    """Write setup.sh and plan.json, start setup.sh in its own session; returns its pid. Refuses if one runs."""
    D = shell_path(setup_dir_of(remote_dir))
    bundle = "\n".join([
        "umask 022",
        f"D={D}",
        'mkdir -p "$D" || exit 1',
        'p=$(cat "$D/pid" 2>/dev/null)',
        'if [ -n "$p" ] && [ ! -f "$D/exit_code" ] && kill -0 "$p" 2>/dev/null; then echo "@running $p"; exit 0; fi',
        'rm -f "$D/pid" "$D/exit_code"',
        _heredoc('"$D/setup.sh"', script),
        _heredoc('"$D/plan.json"', json.dumps(plan_doc, indent=1)),
        ': > "$D/log"',
        "if setsid -f true >/dev/null 2>&1; then",
        '  setsid -f nohup sh "$D/setup.sh" </dev/null >>"$D/log" 2>&1',
        "else",
        '  nohup sh "$D/setup.sh" </dev/null >>"$D/log" 2>&1 &',
        "fi",
        'i=0; while [ ! -s "$D/pid" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done',
        'echo "@started $(cat "$D/pid" 2>/dev/null)"',
    ]) + "\n"
    res = remote.run("sh -s", stdin=bundle, timeout=60)
    for line in res.stdout.splitlines():
        if line.startswith(("@started ", "@running ")):
            pid = line.split(" ", 1)[1].strip()
            if pid.isdigit():
                return int(pid)
    detail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or [f"exit {res.rc}"]
    raise RemoteError(f"could not start setup on the host: {detail[0]}")


def attach_command(remote_dir: str) -> str:
    """The log from its first byte until setup.sh ends, then `@@exit N`."""
    D = shell_path(setup_dir_of(remote_dir))
    return (f"D={D}; p=$(cat \"$D/pid\" 2>/dev/null); "
            'if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then tail -c +1 --pid="$p" -f "$D/log"; '
            'else cat "$D/log" 2>/dev/null; fi; '
            'i=0; while [ ! -f "$D/exit_code" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; '
            'echo "@@exit $(cat "$D/exit_code" 2>/dev/null)"')


def attach(remote, remote_dir: str) -> Iterator[str]:
    chan = remote.stream(attach_command(remote_dir))
    try:
        yield from remote.iter_lines(chan)
    finally:
        chan.close()


def exit_of(line: str) -> Optional[int]:
    if line.startswith("@@exit"):
        v = line[6:].strip()
        return int(v) if v.lstrip("-").isdigit() else -1
    return None
