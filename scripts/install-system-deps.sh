#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks for gpuops development and its tests:
# OpenSSH server (the sandbox host; its daemon is not enabled, gpuops starts its own), ssh client, rsync, uv,
# Chromium (the dashboard's browser tests drive Debian's /usr/bin/chromium through Playwright; Playwright's own browser
# download is not used), and Slurm: slurmctld, slurmd, slurm-client and munge, with slurmdbd and mariadb-server for
# accounting (the local Slurm cluster of `gpuops sandbox up --slurm N` and the Slurm tests; gpuops starts its own
# munged, slurmctld, slurmds, slurmdbd and MariaDB, each cluster in its own folder with its own key, config and ports:
# the system's /etc/munge, /etc/slurm and /var/lib/mysql are not used; on a machine with systemd, Debian's own munge
# and mariadb services may start with their packages, which is harmless).
#
# uv comes from PyPI into its own virtual environment, and its command is linked into a directory that is already on
# the PATH of the shell that runs this script, so the README's next command (`uv run ...`) works in that same shell:
#   root or sudo:  venv /opt/gpuops-uv, links in /usr/local/bin (on every user's default PATH)
#   otherwise:     venv ~/.local/share/gpuops-uv, links in ~/.local/bin (this script says so if that is not on PATH)
# A venv, not `pip install --user` / `--break-system-packages`: Debian 12 and Ubuntu 24.04 mark their python3 as
# externally managed (PEP 668), and a venv leaves the system's Python untouched. Remove with: rm -r VENV and the links.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
[ -x /usr/sbin/slurmd ] || need+=(slurmd)
command -v sbatch >/dev/null 2>&1 || need+=(slurm-client)
[ -x /usr/sbin/munged ] || need+=(munge)
[ -x /usr/sbin/slurmdbd ] || need+=(slurmdbd)
[ -x /usr/sbin/mariadbd ] || need+=(mariadb-server)
if ! command -v uv >/dev/null 2>&1; then
  command -v python3 >/dev/null 2>&1 || need+=(python3)
  # Debian/Ubuntu ship venv's pip bootstrap (ensurepip) separately, in python3-venv
  python3 -m ensurepip --version >/dev/null 2>&1 || need+=(python3-venv)
fi
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
    echo "error: need root or sudo to install: ${need[*]}" >&2; exit 1
  fi
  echo "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! command -v uv >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; then
    venv="${GPUOPS_UV_VENV:-/opt/gpuops-uv}" bin="${GPUOPS_BIN_DIR:-/usr/local/bin}"
  else
    venv="${GPUOPS_UV_VENV:-$HOME/.local/share/gpuops-uv}" bin="${GPUOPS_BIN_DIR:-$HOME/.local/bin}"
    SUDO=""
  fi
  echo "installing: uv (from PyPI into $venv, linked in $bin)"
  # An environment left by an earlier run is reused when its python works and is this python3; one made by another
  # python (a pyenv python, then a shell whose python3 is the system's) or whose python is gone is made anew:
  # `python3 -m venv` over it kept the old python and failed in ensurepip with Python's own error. A folder there
  # that is not a virtual environment is never touched.
  if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ] && [ -n "$(ls -A "$venv" 2>/dev/null)" ]; then
    echo "error: $venv exists and is not a virtual environment (no pyvenv.cfg); move it away, or choose another" \
         "folder: GPUOPS_UV_VENV=DIR $0" >&2
    exit 1
  fi
  same_python() {  # does the environment's python run, as the python3 of this shell (the same installation)?
    local mine theirs
    mine=$(python3 -c 'import sys; print(sys.base_prefix, sys.version)' 2>/dev/null) || return 1
    theirs=$("$venv/bin/python" -c 'import sys; print(sys.base_prefix, sys.version)' 2>/dev/null) || return 1
    [ "$mine" = "$theirs" ] && "$venv/bin/python" -m pip --version >/dev/null 2>&1
  }
  if [ -f "$venv/pyvenv.cfg" ] && ! same_python; then
    echo "note: $venv does not work with this python3 ($(command -v python3)): another python made it, or its" \
         "python is gone; making it anew"
    $SUDO python3 -m venv --clear "$venv"
  else
    $SUDO python3 -m venv "$venv"
  fi
  $SUDO "$venv/bin/python" -m pip install --quiet --disable-pip-version-check uv
  $SUDO mkdir -p "$bin"
  $SUDO ln -sf "$venv/bin/uv" "$bin/uv"
  $SUDO ln -sf "$venv/bin/uvx" "$bin/uvx"
  if ! command -v uv >/dev/null 2>&1; then
    echo "error: uv is installed in $bin, which is not on your PATH; run: export PATH=\"$bin:\$PATH\"" >&2
    exit 1
  fi
fi
