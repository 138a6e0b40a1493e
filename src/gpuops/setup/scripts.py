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
from ..remote.shell import heredoc as _heredoc
from ..remote.shell import shell_command, shell_path
from .plan import SETUP_SUBDIR, env_dir_or_none, parse_facts
from .render import PIPCONF

FA_IMPORT = "import flash_attn"


def setup_dir_of(remote_dir: str) -> str:
    return f"{remote_dir.rstrip('/')}/{SETUP_SUBDIR}"


# Run by the host's base python3 (stdlib only): the dependency files setup would install from (their SHA-256, the
# text of the small ones, every `-r`/`-c` include followed), the base Python itself (version, pip, its torch) and pip's
# configuration as pip itself would read it (files and PIP_* variables). On a host without the base python, the
# profile's python runs it with `files` as its 5th argument: the files and pip's configuration, no base facts. Index URLs are printed with any user:password
# removed; setup.sh reads the real values again on the host (PIP_CONFIG_TO_ENV), so they never leave it.
HOST_FACTS = r"""
import base64, hashlib, json, os, re, sys
P, REQS, ENV, SCRIPTS = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
TEXT_MAX = 262144
seen = set()

def add(rel, text):
    path = os.path.normpath(os.path.join(P, rel))
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    print("@file %s %s" % (rel.replace(" ", "%20"), hashlib.sha256(data).hexdigest()))
    if text and len(data) <= TEXT_MAX:
        print("@text %s %s" % (rel.replace(" ", "%20"), base64.b64encode(data).decode()))
    return data

INCLUDE = re.compile(r"^\s*(?:-r|--requirement|-c|--constraint)(?:\s*=\s*|\s+)(\S+)")

def walk(rel, depth=0):
    rel = os.path.normpath(rel)
    if rel in seen or depth > 20:
        return
    seen.add(rel)
    data = add(rel, True)
    if data is None:
        if depth:
            print("@missing %s" % rel.replace(" ", "%20"))
        return
    text = data.decode("utf-8", "replace").replace("\\\n", " ")
    for line in text.splitlines():
        m = INCLUDE.match(line.split(" #", 1)[0])
        if m:
            walk(os.path.join(os.path.dirname(rel), m.group(1)), depth + 1)

for r in REQS:
    walk(r)
add("uv.lock", False)
add("pyproject.toml", True)
add("setup.py", True)  # its install_requires: what `-e .` installs (project/read.py reads it with ast, never runs it)
for rel in SCRIPTS:  # the scripts whose `# /// script` block setup installs: their text, no hash (an edit of the code
    try:             # is no change of what setup installs; the block's dependencies are in the stamp)
        with open(os.path.normpath(os.path.join(P, rel)), "rb") as fh:
            print("@script %s %s" % (rel.replace(" ", "%20"), base64.b64encode(fh.read(TEXT_MAX)).decode()))
    except OSError:
        pass
add("setup.cfg", False)
for other in ("poetry.lock", "pdm.lock", "environment.yml", "environment.yaml"):  # tools setup does not drive
    add(other, False)

print("arch=%s" % os.uname().machine)
if sys.argv[5:] != ["files"]:  # not run by the environment's python for want of a base python
    print("base_python_version=%d.%d.%d" % sys.version_info[:3])
    try:
        import importlib.util, sysconfig
        em = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
        print("pip_user_ok=%d" % (importlib.util.find_spec("pip") is not None and not em))
    except Exception:
        print("pip_user_ok=0")
    print("base_prefix=%s" % sys.prefix)
    try:
        import importlib.util as u
        print("base_pip=%d" % (u.find_spec("pip") is not None))
    except Exception:
        print("base_pip=0")
    try:
        from importlib import metadata as m
        d = m.distribution("torch")
        print("base_torch=%s" % d.version)
        print("base_torch_path=%s" % os.path.dirname(str(d.locate_file("torch"))))
    except Exception:
        pass

print("@pipconf " + json.dumps(pip_config(ENV, strip=True), sort_keys=True))
"""
HOST_FACTS = PIPCONF + HOST_FACTS  # PIPCONF: setup/render.py, which renders setup.sh with it

def facts_script(remote_dir: str, python: str, packages: list[str], check_flash: bool, *,
                 base_python: str = "python3", requirements: Optional[list[str]] = None,
                 scripts: tuple[str, ...] = ()) -> str:
    P = shell_path(remote_dir)
    D = shell_path(setup_dir_of(remote_dir))
    py = shell_command(python)
    base = shell_command(base_python)
    pkgs = " ".join(shlex.quote(p) for p in packages)
    pkg_code = ("import os, sys\nfrom importlib import metadata as m\nimport importlib.util as u\n"
                "for n in sys.argv[1:]:\n    try:\n"
                "        print('@pkg %s=%s' % (n, m.version(n)))\n    except Exception:\n        print('@pkg %s=' % n)\n"
                "print('env_python_version=%d.%d.%d' % sys.version_info[:3])\n"
                "print('env_pip=%d' % (u.find_spec('pip') is not None))\n"
                "cfg = os.path.join(sys.prefix, 'pyvenv.cfg')\n"
                "site = 0\n"
                "try:\n    for line in open(cfg):\n"
                "        k, _, v = line.partition('=')\n"
                "        if k.strip() == 'include-system-site-packages':\n"
                "            site = int(v.strip().lower() == 'true')\n"
                "except OSError:\n    pass\n"
                "print('env_venv=%d' % os.path.exists(cfg))\n"
                "print('env_system_site=%d' % site)\n"
                "try:\n    d = m.distribution('torch')\n"
                "    print('env_torch_path=%s' % os.path.dirname(str(d.locate_file('torch'))))\n"
                "except Exception:\n    pass\n")
    reqs = json.dumps(list(requirements if requirements is not None else ["requirements.txt"]))
    blocks = shlex.quote(json.dumps(list(scripts)))
    env = env_dir_or_none(python) or ""
    E = shell_path(env) if env else ""
    stale = (f'  if [ -f {E}/pyvenv.cfg ]; then echo env_stale=venv; '
             f'elif [ -n "$(ls -A {E} 2>/dev/null)" ]; then echo env_stale=other; fi\n') if env else ""
    flash = ""
    if check_flash:
        flash = (f'  if o=$({py} -c {shlex.quote(FA_IMPORT)} 2>&1); then echo flash_attn=ok; '
                 'else echo "flash_attn=$(printf \'%s\\n\' "$o" | tail -n 1)"; fi\n')
    return f"""T=; command -v timeout >/dev/null 2>&1 && T="timeout 20"
echo "home=$HOME"
echo "user=$(id -un)"
u=$(command -v uv 2>/dev/null || {{ [ -x "$HOME/.local/bin/uv" ] && echo "$HOME/.local/bin/uv"; }})
echo "uv=$u"
echo "python3=$(command -v {base} 2>/dev/null)"
if command -v {base} >/dev/null 2>&1; then
  {base} -c {shlex.quote(HOST_FACTS)} {P} {shlex.quote(reqs)} {shlex.quote(env)} {blocks} 2>/dev/null
elif {py} -c 'import sys' >/dev/null 2>&1; then
  {py} -c {shlex.quote(HOST_FACTS)} {P} {shlex.quote(reqs)} {shlex.quote(env)} {blocks} files 2>/dev/null
fi
if {py} -c 'import sys' >/dev/null 2>&1; then
  echo env_python=1
  {py} -c {shlex.quote(pkg_code)} {pkgs} 2>/dev/null
{flash}else
  echo env_python=0
{stale}fi
D={D}
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


def gather(remote, remote_dir: str, python: str, packages: list[str], check_flash: bool, *,
           base_python: str = "python3", requirements: Optional[list[str]] = None, scripts: tuple[str, ...] = ()):
    res = remote.run("sh -s", stdin=facts_script(remote_dir, python, packages, check_flash, base_python=base_python,
                                                 requirements=requirements, scripts=scripts), timeout=120)
    if "home=" not in res.stdout:
        detail = (res.stderr.strip().splitlines() or [f"exit {res.rc}"])[-1]
        raise RemoteError(f"could not gather the host's facts for setup: {detail}")
    return parse_facts(res.stdout)


def start(remote, *, remote_dir: str, script: str, plan_doc: dict) -> int:
    """Write setup.sh and plan.json, start setup.sh in its own session; returns its pid. Refuses if one runs."""
    D = shell_path(setup_dir_of(remote_dir))
    bundle = "\n".join([
        "umask 077",  # setup.sh may carry the profile's index URLs (a private index's token)
        f"D={D}",
        'mkdir -p "$D" || exit 1',
        'p=$(cat "$D/pid" 2>/dev/null)',
        'if [ -n "$p" ] && [ ! -f "$D/exit_code" ] && kill -0 "$p" 2>/dev/null; then echo "@running $p"; exit 0; fi',
        'rm -f "$D/pid" "$D/exit_code"',
        _heredoc('"$D/setup.sh"', script),
        _heredoc('"$D/plan.json"', json.dumps(plan_doc, indent=1)),
        ': > "$D/log"',
        "umask 022",  # what setup installs is as readable as any installed package
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
