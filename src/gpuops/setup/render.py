"""`gpuops setup`'s script text (pure): setup.sh rendered from a plan (setup/plan.py), and the pip configuration read
as pip reads it (PIPCONF: the facts script of setup/scripts.py reports it; PIP_TO_ENV: setup.sh gives it to uv)."""
from __future__ import annotations

import json
import shlex

from ..remote.shell import shell_command, shell_path
from .pinned import PINS_FILE

# pip's configuration as pip reads it for `pip install`: the global files, the user's (unless PIP_CONFIG_FILE names
# a file), the environment's own pip.conf, PIP_CONFIG_FILE (os.devnull: no file at all), then PIP_* variables. pip
# merges the files first, then takes [global], then [install] (from any file) over it, then the variables.
PIPCONF = r"""
import os, re

def strip_auth(url):
    return re.sub(r"^(\w[\w+.-]*://)[^/@\s]*@", r"\1***@", url)

def pip_config(env_dir, strip):
    import configparser
    sections = {"global": {}, "install": {}}
    sources = []
    home = os.path.expanduser("~")
    xdg_dirs = [d for d in os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":") if d]
    files = [os.path.join(d, "pip", "pip.conf") for d in xdg_dirs] + ["/etc/pip.conf"]
    env_file = os.environ.get("PIP_CONFIG_FILE")
    if not (env_file and os.path.exists(env_file)):
        files += [os.path.join(home, ".pip", "pip.conf"),
                  os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "pip", "pip.conf")]
    if env_dir:
        files.append(os.path.join(os.path.expanduser(env_dir), "pip.conf"))
    if env_file == os.devnull:
        files = []
    elif env_file:
        files.append(env_file)
    for f in files:
        if not os.path.isfile(f):
            continue
        cp = configparser.RawConfigParser()
        try:
            cp.read(f)
        except Exception:
            continue
        used = False
        for section in ("global", "install"):
            if cp.has_section(section):
                for k, v in cp.items(section):
                    sections[section][k.replace("_", "-")] = v
                    used = True
        if used:
            sources.append(f)
    over = dict(sections["global"], **sections["install"])
    for k, v in os.environ.items():
        if k.startswith("PIP_") and k != "PIP_CONFIG_FILE":
            over[k[4:].lower().replace("_", "-")] = v
            if "environment" not in sources:
                sources.append("environment")
    out = {"sources": sources}
    for key in ("index-url", "cert", "client-cert"):
        if over.get(key):
            out[key] = os.path.expanduser(over[key].strip()) if key != "index-url" else over[key].strip()
    for key in ("extra-index-url", "find-links", "trusted-host", "constraint"):
        if over.get(key):
            out[key] = over[key].split()
    if "constraint" in out:
        out["constraint"] = [os.path.expanduser(c) for c in out["constraint"]]
    if over.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        out["no-index"] = True
    if strip and "index-url" in out:
        out["index-url"] = strip_auth(out["index-url"])
    for key in ("extra-index-url", "find-links"):
        if strip and key in out:
            out[key] = [strip_auth(u) for u in out[key]]
    return out

"""

# Run on the host by setup.sh (the base python3): export lines that give uv what pip's configuration says, and give
# both installers the profile's setup.index_url / extra_index_url (GPUOPS_INDEX, GPUOPS_EXTRA_INDEX in the
# environment). A variable the host's environment already sets is left as it is; extra indexes are merged.
PIP_TO_ENV = PIPCONF + r"""
import shlex, sys
cfg = pip_config(sys.argv[1], strip=False)

def put(name, value, force=False):
    if value and (force or not os.environ.get(name)):
        print("%s=%s; export %s" % (name, shlex.quote(value), name))

mine = os.environ.get("GPUOPS_INDEX", "")
put("UV_INDEX_URL", mine or cfg.get("index-url"))
put("PIP_INDEX_URL", mine)
extra = os.environ.get("GPUOPS_EXTRA_INDEX", "").split()
merged = extra + [u for u in os.environ.get("UV_EXTRA_INDEX_URL", "").split() + cfg.get("extra-index-url", [])
                  if u not in extra]
put("UV_EXTRA_INDEX_URL", " ".join(merged), force=True)
if cfg.get("extra-index-url"):  # pip's semantics for pip's settings: the best version across every index (uv's
    put("UV_INDEX_STRATEGY", "unsafe-best-match")  # default takes the first index that has the package at all)
if extra:
    put("PIP_EXTRA_INDEX_URL", " ".join(extra + [u for u in cfg.get("extra-index-url", []) if u not in extra]),
        force=True)
put("UV_FIND_LINKS", ",".join(cfg.get("find-links", [])))
put("SSL_CERT_FILE", cfg.get("cert"))
put("UV_INSECURE_HOST", " ".join(cfg.get("trusted-host", [])))
put("UV_CONSTRAINT", " ".join(cfg.get("constraint", [])))
"""


def render_script(plan: Plan, *, setup_dir: str) -> str:
    """setup.sh: run in its own session (setsid nohup) with its output in setup_dir/log; `@@step N/M id title` before
    each step, `@@failed id rc` and exit rc on a failed step, `@@done` after writing the stamp. The indexes reach
    both installers through the environment (never a command line): the profile's as GPUOPS_INDEX/GPUOPS_EXTRA_INDEX,
    the host's pip configuration read again here and given to uv (setup/scripts.py PIP_TO_ENV)."""
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
        f"GPUOPS_INSTALLER={plan.installer}",
    ]
    if plan.index_url:
        lines.append(f"GPUOPS_INDEX={shlex.quote(plan.index_url)}; export GPUOPS_INDEX")
    if plan.extra_index_urls:
        lines.append(f"GPUOPS_EXTRA_INDEX={shlex.quote(' '.join(plan.extra_index_urls))}; export GPUOPS_EXTRA_INDEX")
    lines += [
        f"if command -v {shell_command(plan.base_python)} >/dev/null 2>&1; then",
        f"  eval \"$({shell_command(plan.base_python)} -c {shlex.quote(PIP_TO_ENV)} \"$GPUOPS_ENV\")\"",
        "fi",
        'gpuops_uv() { command -v uv 2>/dev/null || { [ -x "$HOME/.local/bin/uv" ] && echo "$HOME/.local/bin/uv"; }; }',
        "UV=$(gpuops_uv)",
        # install into the profile's environment: uv pip, or pip run by the environment's python (GPUOPS_INSTALLER);
        # --reinstall-torch: replace an installed torch (another build of the same version) with the pinned one
        "gpuops_install() {",
        '  r=; if [ "$1" = --reinstall-torch ]; then shift; r=1; fi',
        '  if [ "$GPUOPS_INSTALLER" = uv ] && [ -n "$UV" ]; then',
        '    "$UV" pip install --python "$GPUOPS_PY" ${r:+--reinstall-package torch} "$@"',
        '  else [ -n "$r" ] && "$GPUOPS_PY" -m pip uninstall -y -q torch torchvision torchaudio >/dev/null 2>&1',
        '    "$GPUOPS_PY" -m pip install --disable-pip-version-check "$@"; fi',
        "}",
        "gpuops_end() {",
        '  echo "$1" > "$D/exit_code.tmp" && mv "$D/exit_code.tmp" "$D/exit_code"',
        '  exit "$1"',
        "}",
    ]
    if plan.pins:  # the local plan's resolution: every install of the project's files is constrained by it
        pins = " ".join(shlex.quote(p) for p in plan.pins.splitlines())
        lines.append(f"printf '%s\\n' {pins} > \"$D/{PINS_FILE}\"")
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
