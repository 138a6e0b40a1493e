"""Accounting for the local Slurm cluster (sandbox/slurm.py, start(d, accounting=True)): Debian's slurmdbd and a
private MariaDB (mariadb-server), both on 127.0.0.1, in the cluster's folder (db/). With it `sacct` answers as on a
cluster with accounting (State, ExitCode, Reason of ended jobs, every requeue with --duplicates); without it, as on a
user's cluster without slurmdbd, `sacct` says "Slurm accounting storage is disabled".

MariaDB starts in about a second and holds about 110 MB of memory: a cluster has it only when asked.
"""
from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from pathlib import Path

from ..errors import GpuopsError
from ..paths import write_private
from .slurm_conf import Layout, Spec, slurmdbd_conf
from .slurm_procs import pid_from_file, stop_daemon

HINT = "sudo apt-get install -y slurmdbd mariadb-server   (the local cluster's accounting)"


def find_tools() -> dict[str, str]:
    out = {}
    for name in ("mariadbd", "mariadb-install-db", "slurmdbd", "sacctmgr"):
        for cand in (f"/usr/sbin/{name}", f"/usr/bin/{name}"):
            if os.access(cand, os.X_OK):
                out[name] = cand
                break
        else:
            raise GpuopsError(f"{name} is not installed; the local Slurm cluster's accounting needs Debian's "
                              "slurmdbd and mariadb-server", hint=HINT)
    return out


def db_pid(lay: Layout) -> int | None:
    return pid_from_file(lay.db / "mariadbd.pid", str(lay.db / "data"))


def dbd_pid(lay: Layout) -> int | None:
    return pid_from_file(lay.db / "slurmdbd.pid", "slurmdbd")


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait(what: str, test, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-600:] if log.exists() else ""
            raise GpuopsError(f"{what} did not start within {timeout:.0f} s: {tail.strip()}", hint=f"see {log}")
        time.sleep(0.02)


def start(lay: Layout, spec: Spec, env: dict) -> None:
    """MariaDB (its data made once), then slurmdbd, then the cluster registered in it with an account `gpuops` holding
    this user (so its jobs are accounted). Before slurmctld starts: it registers with slurmdbd as it starts."""
    tools = find_tools()
    lay.db.mkdir(parents=True, exist_ok=True)
    user = getpass.getuser()
    tmp = lay.db / "tmp"  # the cluster's own: parallel workers' MariaDBs made temporary files in /tmp side by side
    tmp.mkdir(exist_ok=True)
    if not (lay.db / "data" / "mysql").is_dir():
        proc = subprocess.run([tools["mariadb-install-db"], "--no-defaults", f"--datadir={lay.db / 'data'}",
                               f"--user={user}", "--auth-root-authentication-method=normal", "--skip-test-db",
                               f"--tmpdir={tmp}"],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise GpuopsError(f"mariadb-install-db failed: {(proc.stderr or proc.stdout).strip()[-400:]}", hint=HINT)
    if not db_pid(lay):
        subprocess.Popen([tools["mariadbd"], "--no-defaults", f"--datadir={lay.db / 'data'}", f"--user={user}",
                          f"--socket={lay.db / 'mariadbd.sock'}", f"--port={spec.db_port}", "--bind-address=127.0.0.1",
                          f"--pid-file={lay.db / 'mariadbd.pid'}", f"--log-error={lay.db / 'mariadbd.log'}",
                          f"--tmpdir={tmp}",
                          "--skip-log-bin", "--skip-name-resolve", "--performance-schema=OFF",
                          "--innodb-buffer-pool-size=16M", "--innodb-log-file-size=8M"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
        _wait("MariaDB", lambda: db_pid(lay) and _answers(spec.db_port), lay.db / "mariadbd.log")
    write_private(lay.dbd_conf, slurmdbd_conf(spec, lay))
    if not dbd_pid(lay):
        proc = subprocess.run([tools["slurmdbd"]], env=env, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise GpuopsError(f"slurmdbd did not start: {(proc.stderr or proc.stdout).strip()}",
                              hint=f"see {lay.db / 'slurmdbd.log'}")
        _wait("slurmdbd", lambda: dbd_pid(lay) and _answers(spec.dbd_port), lay.db / "slurmdbd.log")
    for args in (["add", "cluster", spec.name], ["add", "account", "gpuops", f"Cluster={spec.name}"],
                 ["add", "user", user, "Account=gpuops", f"Cluster={spec.name}"]):
        proc = subprocess.run([tools["sacctmgr"], "-i", *args], env=env, capture_output=True, text=True, timeout=60)
        said = (proc.stdout + proc.stderr).lower()
        if proc.returncode != 0 and "already exist" not in said and "nothing new added" not in said:
            raise GpuopsError(f"sacctmgr {' '.join(args)} failed: {(proc.stderr or proc.stdout).strip()}")


def stop(lay: Layout) -> bool:
    """slurmdbd, then MariaDB. Returns whether either ran."""
    was = stop_daemon(dbd_pid(lay))
    return stop_daemon(db_pid(lay), wait=10) or was

