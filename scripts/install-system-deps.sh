#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks for gpuops development and its tests:
# OpenSSH server (the sandbox host; its daemon is not enabled, gpuops starts its own), ssh client, rsync, uv, and
# Chromium (the dashboard's browser tests drive Debian's /usr/bin/chromium through Playwright; Playwright's own browser
# download is not used).
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
  $SUDO python3 -m venv "$venv"
  $SUDO "$venv/bin/python" -m pip install --quiet --disable-pip-version-check uv
  $SUDO mkdir -p "$bin"
  $SUDO ln -sf "$venv/bin/uv" "$bin/uv"
  $SUDO ln -sf "$venv/bin/uvx" "$bin/uvx"
  if ! command -v uv >/dev/null 2>&1; then
    echo "error: uv is installed in $bin, which is not on your PATH; run: export PATH=\"$bin:\$PATH\"" >&2
    exit 1
  fi
fi
