"""`--guard on-instance`: a watchdog installed on the instance that terminates it at its TTL or idle limit, even with
this machine asleep (it carries the account's API key, in a 0600 file)."""
from __future__ import annotations

from typing import Optional

from ..errors import UsageError
from .instances import Context


# -- guard on the instance ----------------------------------------------------------------------------------------
GUARD_SCRIPT = r'''#!/usr/bin/env python3
"""gpuops guard: terminates THIS instance through the Lambda API at its TTL or idle limit (even with the laptop closed).
Idle = no gpuops run alive (~/.gpuops/active) and every GPU under 5 % utilisation for the idle limit."""
import glob, json, os, subprocess, sys, time, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
cfg = json.load(open(os.path.join(HERE, "config.json")))
key = open(os.path.join(HERE, "api_key")).read().strip()


def log(msg):
    print(time.strftime("%Y-%m-%dT%H:%M:%S") + " " + msg, flush=True)


def run_alive():
    """gpuops' registry of active runs on this host (~/.gpuops/active/<run id> -> run folder)."""
    for f in glob.glob(os.path.expanduser("~/.gpuops/active/*")):
        try:
            rd = open(f).read().strip()
            if os.path.exists(os.path.join(rd, "exit_code")):
                continue
            os.kill(int(open(os.path.join(rd, "pid")).read().strip()), 0)
            return True
        except (OSError, ValueError):
            pass
    return False


def busy():
    if run_alive():
        return True
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return any(float(x) >= 5 for x in out.split() if x.replace(".", "", 1).isdigit())
    except Exception:
        return False


def terminate():
    req = urllib.request.Request(cfg["api"] + "/instance-operations/terminate", method="POST",
                                 data=json.dumps({"instance_ids": [cfg["instance_id"]]}).encode(),
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status


last_active = time.time()
log("guarding instance %s: ttl_deadline=%s idle_limit_s=%s" % (cfg["instance_id"], cfg.get("ttl_deadline"), cfg.get("idle_limit_s")))
while True:
    now = time.time()
    if busy():
        last_active = now
    why = None
    if cfg.get("ttl_deadline") and now >= cfg["ttl_deadline"]:
        why = "TTL reached"
    elif cfg.get("idle_limit_s") and now - last_active >= cfg["idle_limit_s"]:
        why = "idle limit reached"
    if why:
        try:
            log("%s: terminating (HTTP %s)" % (why, terminate()))
            sys.exit(0)
        except Exception as exc:
            log("%s: terminate failed (%s); retrying" % (why, type(exc).__name__))
    time.sleep(cfg["interval_s"])
'''


def install_guard(prof, ctx: Context, instance_id: str, ttl_deadline: Optional[float], idle_s: Optional[float]) -> None:
    """--guard on-instance: the API key in a 0600 file on the instance, and a detached loop that terminates it."""
    import json

    from ..remote.connection import connect
    from .credentials import base_url

    if ctx.api_key is None:
        raise UsageError("--guard on-instance needs the API key")
    if not ttl_deadline and not idle_s:
        raise UsageError("--guard on-instance needs --ttl or --idle")
    limits = [x for x in (idle_s, (ttl_deadline - ctx.clock()) if ttl_deadline else None) if x]
    cfg = {"api": base_url(), "instance_id": instance_id, "ttl_deadline": ttl_deadline, "idle_limit_s": idle_s,
           "interval_s": max(1.0, min(60.0, min(limits) / 4))}
    d_ = "$HOME/.gpuops-guard"
    with connect(prof, announce=ctx.out.info) as remote:
        remote.run(f'umask 077 && mkdir -p "{d_}" && cat > "{d_}/api_key"', stdin=ctx.api_key.reveal(), check=True)
        remote.run(f'umask 077 && cat > "{d_}/config.json"', stdin=json.dumps(cfg), check=True)
        remote.run(f'umask 077 && cat > "{d_}/guard.py"', stdin=GUARD_SCRIPT, check=True)
        remote.run(f'cd "{d_}" && (nohup setsid python3 guard.py > guard.log 2>&1 < /dev/null &) ; echo started',
                   check=True, timeout=30)
    ctx.out.info("guard installed on the instance: it terminates itself at the TTL / idle limit "
                 "(the account-wide API key is in ~/.gpuops-guard/api_key, mode 0600)")
