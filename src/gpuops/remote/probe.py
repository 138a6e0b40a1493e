"""gpuops environment probe: stdlib only, Python >= 3.8, runs on the remote host in ONE execution.

It is sent over the SSH channel to `python3 -` with a PARAMS line prepended, and prints one JSON document.
Every fact is gathered under its own time limit and its own error capture: a broken fact is reported,
never fatal. Raw tool output (nvidia-smi, nvcc) is returned as is and parsed locally (gpuops/facts.py).
Run it locally for a look: python -m gpuops.remote.probe
"""
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time

try:
    PARAMS  # noqa: F821 - prepended by gpuops when sent
except NameError:
    PARAMS = {}

SMI_FIELDS = ("index,name,uuid,memory.total,memory.used,utilization.gpu,temperature.gpu,"
              "power.draw,power.limit,compute_cap,driver_version,pci.bus_id")

CUDA_CHECK = r'''
import json, sys, time
out = {"imported": False}
try:
    import torch
    out["imported"] = True
    out["version"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["available"] = bool(torch.cuda.is_available())
    n = torch.cuda.device_count() if out["available"] else 0
    out["device_count"] = n
    out["devices"] = []
    for i in range(n):
        d = {"index": i}
        try:
            d["name"] = torch.cuda.get_device_name(i)
            d["capability"] = ".".join(str(x) for x in torch.cuda.get_device_capability(i))
            t0 = time.time()
            a = torch.randn(256, 256, device="cuda:%d" % i)
            b = (a @ a).sum().item()
            torch.cuda.synchronize(i)
            d["matmul_ok"] = b == b
            d["matmul_ms"] = round((time.time() - t0) * 1000, 1)
        except Exception as e:
            d["error"] = "%s: %s" % (type(e).__name__, e)
        out["devices"].append(d)
    try:
        out["bf16"] = bool(torch.cuda.is_bf16_supported()) if out["available"] else None
    except Exception as e:
        out["bf16"] = None
    try:
        out["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        out["cudnn"] = None
    if not out["available"]:
        try:
            torch.cuda.init()
        except Exception as e:
            out["init_error"] = "%s: %s" % (type(e).__name__, e)
except Exception as e:
    out["error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))
'''

IMPORT_CHECK = r'''
import json, sys, importlib
res = {}
for name in sys.argv[1:]:
    try:
        m = importlib.import_module(name)
        res[name] = {"ok": True, "version": str(getattr(m, "__version__", ""))}
    except BaseException as e:
        res[name] = {"ok": False, "error": "%s: %s" % (type(e).__name__, str(e)[:2000])}
print(json.dumps(res))
'''


def timed(name, fn, timeout, facts):
    """Run fn in a thread with a time limit; record {"ok", "value"|"error", "seconds"}."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # a fact never crashes the probe
            box["error"] = "%s: %s" % (type(e).__name__, e)

    t0 = time.time()
    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout)
    entry = {"seconds": round(time.time() - t0, 3)}
    if th.is_alive():
        entry.update(ok=False, error="timed out after %ss" % timeout, timeout=True)
    elif "error" in box:
        entry.update(ok=False, error=box["error"])
    else:
        entry.update(ok=True, value=box.get("value"))
    facts[name] = entry


def run(argv, timeout, cwd=None, shell=False):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, cwd=cwd, shell=shell)
    return {"rc": p.returncode, "stdout": p.stdout.decode("utf-8", "replace")[-200000:],
            "stderr": p.stderr.decode("utf-8", "replace")[-20000:]}


def tool(name, args, timeout):
    path = shutil.which(name)
    if not path:
        return {"found": False}
    try:
        r = run([path] + args, timeout)
    except subprocess.TimeoutExpired:
        return {"found": True, "path": path, "timeout": True, "rc": None, "stdout": "", "stderr": "timed out"}
    r.update(found=True, path=path)
    return r


def os_release():
    info = {}
    for f in ("/etc/os-release", "/usr/lib/os-release"):
        if os.path.exists(f):
            with open(f) as fh:
                for line in fh:
                    k, _, v = line.strip().partition("=")
                    if k:
                        info[k] = v.strip('"')
            break
    return {"pretty": info.get("PRETTY_NAME"), "id": info.get("ID"), "version_id": info.get("VERSION_ID"),
            "kernel": platform.release(), "arch": platform.machine(), "hostname": platform.node()}


def cpus():
    return {"count": os.cpu_count()}


def memory():
    mem = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            k, _, v = line.partition(":")
            if k in ("MemTotal", "MemAvailable"):
                mem[k] = int(v.split()[0]) * 1024
    return {"total_bytes": mem.get("MemTotal"), "available_bytes": mem.get("MemAvailable")}


def disk(path):
    p = os.path.expanduser(path or "~")
    probe_path = p
    while not os.path.exists(probe_path):
        parent = os.path.dirname(probe_path)
        if parent == probe_path:
            break
        probe_path = parent
    u = shutil.disk_usage(probe_path)
    return {"path": p, "measured_at": probe_path, "exists": os.path.exists(p), "total_bytes": u.total,
            "free_bytes": u.free}


def python_info():
    return {"version": platform.python_version(), "full": sys.version, "executable": sys.executable,
            "implementation": platform.python_implementation(), "platform": platform.platform()}


def packages(names):
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        return {"error": "importlib.metadata unavailable"}
    found = {}
    for n in names:
        try:
            found[n] = metadata.version(n)
        except Exception:
            found[n] = None
    return found


def pip_freeze_raw(timeout):
    """`pip freeze` exactly as pip prints it (direct URLs, editables); None when pip is absent."""
    try:
        r = run([sys.executable, "-m", "pip", "freeze", "--all"], timeout)
    except subprocess.TimeoutExpired:
        return {"timeout": True}
    return {"rc": r["rc"], "stdout": r["stdout"], "stderr": r["stderr"][-2000:]}


def pip_freeze():
    from importlib import metadata

    dists = {}
    for d in metadata.distributions():
        name = d.metadata.get("Name")
        if name and name not in dists:
            dists[name] = d.version
    return dists


def sub_python(code, args, timeout):
    try:
        r = run([sys.executable, "-c", code] + list(args), timeout)
    except subprocess.TimeoutExpired:
        return {"timeout": True, "error": "timed out after %ss" % timeout}
    try:
        return {"rc": r["rc"], "result": json.loads(r["stdout"].strip().splitlines()[-1]), "stderr": r["stderr"][-4000:]}
    except Exception:
        return {"rc": r["rc"], "error": (r["stderr"].strip().splitlines() or ["no output"])[-1][:2000],
                "stderr": r["stderr"][-4000:]}


def user_check(chk, cwd, timeout):
    try:
        r = run(chk["command"], timeout, cwd=cwd if os.path.isdir(cwd) else None, shell=True)
    except subprocess.TimeoutExpired:
        return {"timeout": True}
    return r


def reach(host, port, timeout):
    """One TCP connect (a fleet node to rank 0's rendezvous address): connected, refused (the path works, nothing
    listens yet) or the error that says the path is blocked."""
    import socket
    t0 = time.time()
    try:
        s = socket.create_connection((host, int(port)), timeout)
        s.close()
        result = "connected"
    except ConnectionRefusedError:
        result = "refused"
    except socket.timeout:
        result = "timeout"
    except OSError as exc:
        result = "error: " + (exc.strerror or str(exc))
    return {"host": host, "port": int(port), "result": result, "ms": round((time.time() - t0) * 1000, 1)}


def _skipping(fn, skip):
    def wrapped(name, *a, **kw):
        if name not in skip:
            fn(name, *a, **kw)
    return wrapped


def main():
    P = PARAMS
    t_all = time.time()
    facts = {"probe_version": 1, "python_ok": True}
    lim = P.get("timeouts", {})
    skip = set(P.get("skip") or ())  # facts a caller does not need (train's launch gate)
    if skip:
        global timed
        timed = _skipping(timed, skip)
    timed("os", os_release, 5, facts)
    timed("cpus", cpus, 5, facts)
    timed("memory", memory, 5, facts)
    timed("disk", lambda: disk(P.get("remote_dir")), lim.get("disk", 10), facts)
    timed("python", python_info, 5, facts)
    timed("nvidia_smi_query", lambda: tool("nvidia-smi", ["--query-gpu=" + SMI_FIELDS, "--format=csv,noheader,nounits"],
                                           lim.get("nvidia_smi", 20)), lim.get("nvidia_smi", 20) + 2, facts)
    timed("nvidia_smi", lambda: tool("nvidia-smi", [], lim.get("nvidia_smi", 20)), lim.get("nvidia_smi", 20) + 2, facts)
    timed("nvcc", lambda: tool("nvcc", ["--version"], 10), 12, facts)
    timed("packages", lambda: packages(sorted(set(P.get("packages", [])) | set(P.get("auto_imports") or {}))), 20, facts)
    if P.get("freeze"):
        timed("freeze", pip_freeze, 30, facts)
        timed("pip_freeze", lambda: pip_freeze_raw(60), 65, facts)
    env_names = P.get("env", [])
    facts["env"] = {"ok": True, "value": {k: os.environ.get(k) for k in env_names if k in os.environ}}
    if P.get("cuda_check", True):
        ct = lim.get("cuda_check", 90)
        timed("cuda", lambda: sub_python(CUDA_CHECK, [], ct), ct + 5, facts)
    mods = list(P.get("imports", []))
    installed = (facts.get("packages") or {}).get("value") or {}
    for pkg, mod in (P.get("auto_imports") or {}).items():
        if installed.get(pkg) and mod not in mods:
            mods.append(mod)
    if mods:
        it = lim.get("imports", 60)
        timed("imports", lambda: sub_python(IMPORT_CHECK, mods, it), it + 5, facts)
    if P.get("reach"):
        r = P["reach"]
        timed("reach", lambda: reach(r["host"], r["port"], r.get("timeout", 5)), r.get("timeout", 5) + 2, facts)
    checks = {}
    cwd = os.path.expanduser(P.get("remote_dir") or "~")
    for chk in P.get("user_checks", []):
        t = chk.get("timeout", 30)
        timed(chk["name"], lambda c=chk: user_check(c, cwd, t), t + 2, checks)
    facts["user_checks"] = {"ok": True, "value": checks}
    facts["seconds"] = round(time.time() - t_all, 3)
    sys.stdout.write(json.dumps(facts) + "\n")
    sys.stdout.flush()
    os._exit(0)  # do not wait for a fact thread stuck in a hung filesystem


if __name__ == "__main__":
    main()
