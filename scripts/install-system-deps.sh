#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks for gpuops development and its tests:
# OpenSSH server (the sandbox host; its daemon is not enabled, gpuops starts its own), ssh client, rsync, uv.
set -euo pipefail
need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
if [ "${#need[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! command -v uv >/dev/null 2>&1; then
  echo "installing: uv"
  python3 -m pip install --quiet --user uv 2>/dev/null || python3 -m pip install --quiet uv
fi
command -v uv >/dev/null 2>&1 || { echo "uv is installed but not on PATH (add ~/.local/bin)"; exit 1; }
