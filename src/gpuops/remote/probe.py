"""gpuops environment probe: stdlib only, Python >= 3.8, runs on the remote host in ONE execution.

It is sent over the SSH channel to `python3 -` with a PARAMS line prepended, and prints one JSON document.
Every fact is gathered under its own time limit and its own error capture: a broken fact is reported,
never fatal. Raw tool output (nvidia-smi, nvcc) is returned as is and parsed locally (gpuops/verify/facts.py).
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

try:
    CUDA_CHECK  # noqa: F821 - remote/probe_scripts.py goes ahead of this file when it is sent (gather.probe_source)
except NameError:  # run or imported locally: the same file, read as it is sent (stdlib only, no package import)
    _scripts = {}
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_scripts.py")) as _fh:
        exec(_fh.read(), _scripts)  # noqa: S102 - our own file
    BENCH_CHECK, CUDA_CHECK, FIND_CHECK, GATE_WAIT, IMPORT_CHECK = (
        _scripts[k] for k in ("BENCH_CHECK", "CUDA_CHECK", "FIND_CHECK", "GATE_WAIT", "IMPORT_CHECK"))


class Gate(object):
    """A pipe a gated check (the CUDA test, the bench) reads one byte from before it touches a GPU: it imports torch
    meanwhile. Closed without the byte (the probe ending first), it tells the check not to run; `h` tells it not to
    run because the driver hung (nvidia-smi did not answer): CUDA's initialisation would hang for its whole limit."""

    def __init__(self):
        self.r, self.w = os.pipe()

    def open(self, go=True, hung=False):
        if self.w is not None:
            w, self.w = self.w, None
            try:
                if hung:
                    os.write(w, b"h")
                elif go:
                    os.write(w, b"g")
            except OSError:  # the check has ended already (torch missing): nobody reads
                pass
            finally:
                os.close(w)


def start_gated(argv, gate, env=None):
    """Start a python check now (the gate's read end as its last argument); `finish` collects it. An error starting
    it is kept for `finish` to raise, inside the fact's own error capture."""
    try:
        return subprocess.Popen(argv + [str(gate.r)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=(gate.r,), env=env)
    except OSError as e:
        return e
    finally:
        os.close(gate.r)


def finish(p, timeout):
    """A started check's raw rc/stdout/stderr within `timeout` seconds from now, or {"timeout": True} (killed)."""
    if isinstance(p, BaseException):
        raise p
    try:
        o, e = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return {"timeout": True}
    return {"rc": p.returncode, "stdout": o.decode("utf-8", "replace"), "stderr": e.decode("utf-8", "replace")}


def last_json(r, tail):
    """A python check's answer: its last stdout line as JSON, else its last stderr line as the error."""
    if r.get("timeout"):
        return {"timeout": True, "error": "timed out after %ss" % tail}
    try:
        return {"rc": r["rc"], "result": json.loads(r["stdout"].strip().splitlines()[-1]), "stderr": r["stderr"][-4000:]}
    except Exception:
        return {"rc": r["rc"], "error": (r["stderr"].strip().splitlines() or ["no output"])[-1][:2000],
                "stderr": r["stderr"][-4000:]}


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


def run(argv, timeout, cwd=None, shell=False, env=None):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, cwd=cwd, shell=shell,
                       env=env)
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
    import importlib.util
    import shutil

    uv = shutil.which("uv") or next((p for p in [os.path.expanduser("~/.local/bin/uv")] if os.access(p, os.X_OK)), None)
    return {"version": platform.python_version(), "full": sys.version, "executable": sys.executable,
            "implementation": platform.python_implementation(), "platform": platform.platform(),
            "pip": importlib.util.find_spec("pip") is not None, "uv": uv}


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


def sub_python(code, args, timeout, cwd=None, env=None):
    try:
        r = run([sys.executable, "-c", code] + list(args), timeout, cwd=cwd, env=env)
    except subprocess.TimeoutExpired:
        r = {"timeout": True}
    return last_json(r, timeout)


def job_environ(changes):
    """This environment with the job's variables (None: unset), or None (inherit) when there are none."""
    if not changes:
        return None
    env = dict(os.environ)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def proc_info(pid):
    """Who a GPU process is: process group, session, owner, and the gpuops run id in its environment (None when
    it has none; `environ` False when it cannot be read). Unknown fields are left out."""
    d = "/proc/%d" % pid
    info = {"exists": os.path.isdir(d)}
    try:
        with open(d + "/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        info["pgid"], info["sid"] = int(fields[2]), int(fields[3])
    except (OSError, ValueError, IndexError):
        pass
    try:
        import pwd
        uid = os.stat(d).st_uid
        try:
            info["user"] = pwd.getpwuid(uid).pw_name
        except KeyError:
            info["user"] = str(uid)
    except (OSError, ImportError):
        pass
    try:
        with open(d + "/environ", "rb") as fh:
            env = fh.read().split(b"\0")
        info["environ"] = True
        run = [e[len(b"GPUOPS_RUN_ID="):].decode("utf-8", "replace") for e in env if e.startswith(b"GPUOPS_RUN_ID=")]
        info["run_id"] = run[0] if run else None
    except OSError:
        info["environ"] = False
    return info


def gpu_apps(timeout):
    """The GPUs' compute processes as nvidia-smi lists them (raw), and who each process is (proc_info)."""
    r = tool("nvidia-smi", ["--query-compute-apps=pid,used_memory,gpu_uuid,process_name",
                            "--format=csv,noheader,nounits"], timeout)
    procs = {}
    if r.get("rc") == 0:
        for line in r.get("stdout", "").splitlines():
            pid = line.split(",", 1)[0].strip()
            if pid.isdigit():
                procs[pid] = proc_info(int(pid))
    r["procs"] = procs
    return r


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


# -- GPU health (issue #15): one more nvidia-smi query and the kernel log, each its own fact ----------------
HEALTH_FIELDS = (
    "index", "ecc.errors.uncorrected.volatile.total", "ecc.errors.corrected.volatile.total",
    "remapped_rows.pending", "remapped_rows.failure", "retired_pages.pending", "gpu_recovery_action",
    "clocks_event_reasons.active", "clocks_event_reasons.hw_slowdown", "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.hw_power_brake_slowdown", "clocks_event_reasons.sw_thermal_slowdown",
    "clocks_event_reasons.sw_power_cap", "pcie.link.gen.gpucurrent", "pcie.link.gen.max",
    "pcie.link.width.current", "pcie.link.width.max", "persistence_mode", "mig.mode.current", "power.limit",
    "clocks.sm", "clocks.max.sm")
OLD_FIELD_NAMES = {"clocks_event_reasons.": "clocks_throttle_reasons."}  # the name before driver R535


def _invalid_field(text):
    """nvidia-smi's answer to a field it does not know: 'Field "X" is not a valid field to query.' (exit 2)."""
    i = text.find('Field "')
    if i < 0 or "is not a valid field" not in text:
        return None
    return text[i + 7:text.find('"', i + 7)]


def gpu_health(fields, timeout):
    """nvidia-smi --query-gpu with the health fields. An older driver fails the whole query on one unknown field:
    retry under the field's older name, else without it; those fields are reported as unsupported."""
    fields = list(fields)
    unsupported, renamed, tries = [], {}, 0
    while fields and tries <= len(HEALTH_FIELDS):
        tries += 1
        r = tool("nvidia-smi", ["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"], timeout)
        if not r.get("found") or r.get("timeout") or r.get("rc") == 0:
            break
        bad = _invalid_field(r.get("stdout", "") + r.get("stderr", ""))
        if bad is None or bad not in fields:
            break
        prefix = next((new for new in OLD_FIELD_NAMES if bad.startswith(new)), None)
        if prefix:  # every field of that family at once: one retry, not one per field
            for i, f in enumerate(fields):
                if f.startswith(prefix):
                    fields[i] = OLD_FIELD_NAMES[prefix] + f[len(prefix):]
                    renamed[fields[i]] = f
        else:
            fields.remove(bad)
            unsupported.append(renamed.pop(bad, bad))
    r.update(fields=[renamed.get(f, f) for f in fields], unsupported=unsupported, renamed=renamed, tries=tries)
    return r


def kernel_log(timeout, limit=200):
    """NVRM lines of the kernel log (dmesg, else journalctl -k). Unreadable is a normal answer, not an error."""
    errors = []
    for name, args in (("dmesg", []), ("journalctl", ["-k", "-b", "--no-pager"])):
        r = tool(name, args, timeout)
        if not r.get("found"):
            errors.append("%s: not installed" % name)
            continue
        lines = [ln for ln in r.get("stdout", "").splitlines()
                 if ln.strip() and not ln.startswith("-- ") and not ln.startswith("Hint:")]
        if r.get("rc") == 0 and lines:
            nv = [ln for ln in lines if "NVRM" in ln or "Xid" in ln]
            return {"readable": True, "source": name, "lines": nv[-limit:], "total_lines": len(lines)}
        why = (r.get("stderr", "").strip().splitlines() or ["no kernel messages visible (exit %s)" % r.get("rc")])[0]
        errors.append("%s: %s" % (name, why[:200]))
    return {"readable": False, "error": "; ".join(errors)}


# -- InfiniBand, GPUDirect and NCCL's variables (issue 41): judged by verify/checks_ib.py ------------------------
IB_SYSFS = "/sys/class/infiniband"
IB_PORT_FILES = ("state", "phys_state", "rate", "link_layer")
NCCL_CONF = ("/etc/nccl.conf", "~/.nccl.conf")  # NCCL reads its variables from these files too
PEERMEM = ("/sys/kernel/mm/memory_peers/nv_mem/version", "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
           "/sys/module/nvidia_peermem/version")  # where NCCL looks for GPUDirect RDMA's module


def _read(path, limit=4096):
    try:
        with open(path) as fh:
            return fh.read(limit).strip()
    except (OSError, UnicodeDecodeError):
        return None


def ib_facts(job_env=None):
    """Every HCA port as sysfs shows it ({device: {port: {state, phys_state, rate, link_layer}}}), the loaded kernel
    modules (nvidia_peermem), the network interfaces and NCCL's variables (the environment, the job's, the NCCL
    config files). Reads a few small files: on a host without InfiniBand, one missing folder."""
    out = {"sysfs": {}, "env": {}, "conf": {}}
    if os.path.isdir(IB_SYSFS):
        for dev in sorted(os.listdir(IB_SYSFS)):
            pdir = os.path.join(IB_SYSFS, dev, "ports")
            ports = sorted(os.listdir(pdir)) if os.path.isdir(pdir) else []
            out["sysfs"][dev] = {p: {k: _read(os.path.join(pdir, p, k)) for k in IB_PORT_FILES} for p in ports}
    modules = _read("/proc/modules", 1 << 20)
    out["modules"] = [ln.split()[0] for ln in modules.splitlines() if ln.strip()] if modules is not None else None
    out["netdevs"] = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else None
    out["peermem_paths"] = [p for p in PEERMEM if os.path.exists(p)]
    out["env"] = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    for k, v in (job_env or {}).items():  # the job's own (the preset, the profile's env:, --env; None: unset)
        if k.startswith("NCCL_") and v is None:
            out["env"].pop(k, None)
        elif k.startswith("NCCL_"):
            out["env"][k] = str(v)
    for name in NCCL_CONF:
        text = _read(os.path.expanduser(name), 65536)
        if text is not None:
            out["conf"][name] = text
    return out


def together(jobs, facts):
    """Gather several facts at once, each under its own time limit: [(name, fn, limit)]."""
    threads = [threading.Thread(target=timed, args=(name, fn, limit, facts), daemon=True) for name, fn, limit in jobs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def gpu_facts(P, lim, facts, looked):
    """What nvidia-smi and the kernel log say about the GPUs; then `looked` opens. The GPU query first, alone: a hung
    nvidia-smi is found within the `nvidia_smi` budget and no other call is started on it (the table gets what is
    left of that budget), nor does the CUDA test touch a GPU (its gate says the driver hung: CUDA's initialisation
    would hang out its whole limit). Then the table, the health query, the GPU processes and the kernel log at once."""
    hung = False
    try:
        hung = _gpu_facts(P, lim, facts)
    finally:
        looked.open(hung=hung)


def _gpu_facts(P, lim, facts):
    budget = lim.get("nvidia_smi", 15)
    t0 = time.time()
    timed("nvidia_smi_query", lambda: tool("nvidia-smi", ["--query-gpu=" + SMI_FIELDS, "--format=csv,noheader,nounits"],
                                           budget), budget + 2, facts)
    q = facts.get("nvidia_smi_query") or {}
    hung = driver_hung(facts)
    jobs = []
    if hung:
        facts["nvidia_smi"] = dict(q)
    else:
        left = max(2.0, budget - (time.time() - t0))
        jobs.append(("nvidia_smi", lambda: tool("nvidia-smi", [], left), left + 2))
    v = q.get("value") or {}
    answered = v.get("found") and v.get("rc") == 0 and not hung  # not when nvidia-smi itself failed or hung
    if P.get("health") and answered:
        t = lim.get("gpu_health", 15)
        jobs.append(("gpu_health", lambda: gpu_health(HEALTH_FIELDS, t), t * 3 + 2))
    if P.get("gpu_apps") and answered:
        ta = lim.get("gpu_apps", 10)
        jobs.append(("gpu_apps", lambda: gpu_apps(ta), ta + 2))
    if P.get("kernel_log") and v.get("found"):  # an Xid explains a failing nvidia-smi too
        k = lim.get("kernel_log", 10)
        jobs.append(("kernel_log", lambda: kernel_log(k), k * 2 + 2))
    together(jobs, facts)
    return bool(hung)


def driver_hung(facts):
    q = facts.get("nvidia_smi_query") or {}
    return bool(q.get("timeout") or (q.get("value") or {}).get("timeout"))


def in_background(fn, *args):
    th = threading.Thread(target=fn, args=args, daemon=True)
    th.start()
    return th


def _skipping(fn, skip):
    def wrapped(name, *a, **kw):
        if name not in skip:
            fn(name, *a, **kw)
    return wrapped


def main():
    """Every fact in one run, at once where they do not disturb each other. The CUDA test and the bench start first
    (`import torch` takes seconds) and touch the GPUs only once nvidia-smi has looked at them (so neither their
    processes nor their memory are in what it saw); the bench only after everything else. Each keeps its own time
    limit, counted from its gate."""
    P = PARAMS
    t_all = time.time()
    facts = {"probe_version": 1, "python_ok": True}
    lim = P.get("timeouts", {})
    skip = set(P.get("skip") or ())  # facts a caller does not need (train's launch gate)
    if skip:
        global timed
        timed = _skipping(timed, skip)
    looked, rest_done = Gate(), Gate()  # nvidia-smi has looked at the GPUs / every other fact is in
    cuda = bench = None
    if P.get("cuda_check", True) and "cuda" not in skip:
        cuda = start_gated([sys.executable, "-c", CUDA_CHECK], looked, env=job_environ(P.get("job_env")))
    if P.get("bench") and "bench" not in skip:
        bench = start_gated([sys.executable, "-c", BENCH_CHECK, json.dumps(P["bench"])], rest_done,
                            env=dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID"))  # torch's GPU i is nvidia-smi's i
    try:
        gpu = in_background(gpu_facts, P, lim, facts, looked)
        host_facts(P, lim, facts)
        gpu.join()
        waits = []
        if cuda is not None:
            ct = lim.get("cuda_check", 90)
            waits.append(in_background(timed, "cuda", lambda: last_json(finish(cuda, ct), ct), ct + 5, facts))
        import_check(P, lim, facts)
        for th in waits:
            th.join()
        user_checks(P, lim, facts)
        rest_done.open(hung=driver_hung(facts))
        if bench is not None:
            bt = lim.get("bench", 180)
            timed("bench", lambda: last_json(finish(bench, bt), bt), bt + 5, facts)
    finally:
        looked.open(go=False)  # no-ops once opened; else the checks end without touching a GPU
        rest_done.open(go=False)
    facts["seconds"] = round(time.time() - t_all, 3)
    sys.stdout.write(json.dumps(facts) + "\n")
    sys.stdout.flush()
    os._exit(0)  # do not wait for a fact thread stuck in a hung filesystem


def host_facts(P, lim, facts):
    """The facts that do not look at the GPUs, gathered while nvidia-smi answers and torch imports."""
    timed("os", os_release, 5, facts)
    timed("cpus", cpus, 5, facts)
    timed("memory", memory, 5, facts)
    timed("disk", lambda: disk(P.get("remote_dir")), lim.get("disk", 10), facts)
    timed("python", python_info, 5, facts)
    timed("nvcc", lambda: tool("nvcc", ["--version"], 10), 12, facts)
    timed("packages", lambda: packages(sorted(set(P.get("packages", [])) | set(P.get("auto_imports") or {}))), 20, facts)
    if P.get("freeze") or P.get("distributions"):  # every installed distribution (importlib.metadata: fast)
        timed("freeze", pip_freeze, 30, facts)
    if P.get("freeze"):
        timed("pip_freeze", lambda: pip_freeze_raw(60), 65, facts)
    env_names = P.get("env", [])
    facts["env"] = {"ok": True, "value": {k: os.environ.get(k) for k in env_names if k in os.environ}}
    fm = P.get("find_modules") or {}
    fm_cwd = os.path.expanduser(fm.get("cwd") or "~")
    if fm.get("groups") and os.path.isdir(fm_cwd):  # the project folder: the job's cwd (not synced: not judged)
        ft = lim.get("find_modules", 30)
        timed("find_modules", lambda: sub_python(FIND_CHECK, [json.dumps(fm["groups"])], ft, cwd=fm_cwd,
                                                 env=job_environ(P.get("job_env"))), ft + 5, facts)
    if P.get("ib", True):
        timed("ib", lambda: ib_facts(P.get("job_env")), lim.get("ib", 5), facts)
    if P.get("reach"):
        r = P["reach"]
        timed("reach", lambda: reach(r["host"], r["port"], r.get("timeout", 5)), r.get("timeout", 5) + 2, facts)


def import_check(P, lim, facts):
    """The modules the profile expects, imported (flash-attn, vllm: seconds) beside the CUDA test."""
    mods = list(P.get("imports", []))
    installed = (facts.get("packages") or {}).get("value") or {}
    for pkg, mod in (P.get("auto_imports") or {}).items():
        if installed.get(pkg) and mod not in mods:
            mods.append(mod)
    if mods:
        it = lim.get("imports", 60)
        timed("imports", lambda: sub_python(IMPORT_CHECK, mods, it), it + 5, facts)


def user_checks(P, lim, facts):
    """The playbook's own commands, once the CUDA test is over (one may look at the GPUs) and before the bench."""
    checks = {}
    cwd = os.path.expanduser(P.get("remote_dir") or "~")
    for chk in P.get("user_checks", []):
        t = chk.get("timeout", 30)
        timed(chk["name"], lambda c=chk: user_check(c, cwd, t), t + 2, checks)
    facts["user_checks"] = {"ok": True, "value": checks}


if __name__ == "__main__":
    main()
