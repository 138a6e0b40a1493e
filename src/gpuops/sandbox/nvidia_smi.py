#!/usr/bin/env python3
"""Emulated nvidia-smi for the gpuops sandbox host (stdlib only).

It answers the forms gpuops uses, in nvidia-smi's own formats, exit codes and failure messages:
  nvidia-smi                                  the summary table (legacy or R610+ "KMD Version" header)
  nvidia-smi -L                               the GPU list
  nvidia-smi --version
  nvidia-smi --query-gpu=F,... --format=csv[,noheader][,nounits] [-l N | -lms N]
  nvidia-smi --query-compute-apps=F,... --format=csv[,noheader][,nounits]
State comes from $GPUOPS_SANDBOX_DIR/gpu.json (written by `gpuops sandbox up`). It says it is emulated:
in the table, in -L, and in every UUID ("GPU-e3e3e3e3-...": e3 for emulated).
A process whose environment holds GPUOPS_RUN_ID (and this host's GPUOPS_SANDBOX_DIR), or a descendant of one (a
job's bash script's python child, even one started with a cleared environment), counts as a GPU process and drives
utilisation. Any other process of this host holds emulated GPU memory when its environment says so:
GPUOPS_SANDBOX_HOLD=GPU:MiB[,GPU:MiB...] (e.g. `GPUOPS_SANDBOX_HOLD=0:61440 sleep 600`, a process of another user
or a notebook holding 60 GiB of GPU 0); it is listed by --query-compute-apps and the table under its argv[0], and
its MiB count in memory.used (utilisation stays idle).
"""
import json
import os
import sys
import time

CATALOG = {
    "h100-pcie": {"name": "NVIDIA H100 PCIe", "memory": 81559, "cc": "9.0", "power_limit": 350.0, "bus": "00000000:08:00.0",
                  "max_sm": 1755, "pcie_gen": 5},
    "h100-sxm": {"name": "NVIDIA H100 80GB HBM3", "memory": 81559, "cc": "9.0", "power_limit": 700.0, "bus": "00000000:18:00.0",
                 "max_sm": 1980, "pcie_gen": 5},
    "h100-sxm5": {"name": "NVIDIA H100 80GB HBM3", "memory": 81559, "cc": "9.0", "power_limit": 700.0,
                  "bus": "00000000:18:00.0", "max_sm": 1980, "pcie_gen": 5},
    "h200": {"name": "NVIDIA H200", "memory": 143771, "cc": "9.0", "power_limit": 700.0, "bus": "00000000:19:00.0",
             "max_sm": 1980, "pcie_gen": 5},
    "a100": {"name": "NVIDIA A100-SXM4-80GB", "memory": 81920, "cc": "8.0", "power_limit": 400.0, "bus": "00000000:07:00.0",
             "max_sm": 1410, "pcie_gen": 4},
    "rtx6000ada": {"name": "NVIDIA RTX 6000 Ada Generation", "memory": 49140, "cc": "8.9", "power_limit": 300.0,
                   "bus": "00000000:01:00.0", "max_sm": 2505, "pcie_gen": 4, "no_mig": True},
    "b200": {"name": "NVIDIA B200", "memory": 183359, "cc": "10.0", "power_limit": 1000.0, "bus": "00000000:1B:00.0",
             "max_sm": 1965, "pcie_gen": 5},
    "rtxpro6000": {"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "memory": 97887, "cc": "12.0",
                   "power_limit": 600.0, "bus": "00000000:01:00.0", "max_sm": 2617, "pcie_gen": 5},
    "a10": {"name": "NVIDIA A10", "memory": 23028, "cc": "8.6", "power_limit": 150.0, "bus": "00000000:06:00.0",
            "max_sm": 1695, "pcie_gen": 4, "no_mig": True},
    "gh200": {"name": "NVIDIA GH200 480GB", "memory": 97871, "cc": "9.0", "power_limit": 900.0, "bus": "00000009:01:00.0",
              "max_sm": 1980, "pcie_gen": 5, "arch": "aarch64"},
}

# Fields a driver older than this major version does not know (it fails the whole query on them, exit 2).
# clocks_event_reasons.* was called clocks_throttle_reasons.* before R535 (newer drivers accept both names);
# gpu_recovery_action is recent (the emulator's cut-off, R550, is an approximation).
FIELD_SINCE = {"clocks_event_reasons.": 535, "gpu_recovery_action": 550}
OLD_NAMES = {"clocks_throttle_reasons.": "clocks_event_reasons."}

# Injectable faults (`gpuops sandbox up --fault NAME[=VALUE][@GPU]`): data, applied to one GPU's fields or to the
# kernel log. "{value}" takes the given VALUE, else "default".
FAULTS = {
    "ecc": {"help": "uncorrectable ECC errors since boot", "default": 2,
            "fields": {"ecc.errors.uncorrected.volatile.total": "{value}", "ecc.errors.uncorrected.aggregate.total": "{value}"}},
    "correctable-ecc": {"help": "correctable ECC errors (INFO only)", "default": 12,
                        "fields": {"ecc.errors.corrected.volatile.total": "{value}"}},
    "remap-pending": {"help": "rows waiting for remapping (reset needed)", "fields": {"remapped_rows.pending": "Yes"}},
    "remap-failure": {"help": "a row remapping failed", "fields": {"remapped_rows.failure": "Yes"}},
    "recovery-action": {"help": "gpu_recovery_action other than None", "default": "Reset",
                        "fields": {"gpu_recovery_action": "{value}"}},
    "thermal": {"help": "thermal slowdown active, 92 C", "fields": {
        "clocks_event_reasons.active": "0x0000000000000060", "clocks_event_reasons.gpu_idle": "Not Active",
        "clocks_event_reasons.hw_thermal_slowdown": "Active", "clocks_event_reasons.sw_thermal_slowdown": "Active",
        "temperature.gpu": 92, "clocks.sm": 1095}},
    "power-brake": {"help": "hardware power brake slowdown active", "fields": {
        "clocks_event_reasons.active": "0x0000000000000088", "clocks_event_reasons.gpu_idle": "Not Active",
        "clocks_event_reasons.hw_slowdown": "Active", "clocks_event_reasons.hw_power_brake_slowdown": "Active"}},
    "pcie-x8": {"help": "PCIe link trained narrower than its maximum", "default": 8,
                "fields": {"pcie.link.width.current": "{value}"}},
    "persistence-off": {"help": "persistence mode disabled", "fields": {"persistence_mode": "Disabled"}},
    "mig": {"help": "MIG mode enabled", "fields": {"mig.mode.current": "Enabled"}},
    "xid": {"help": "an Xid line in the kernel log (VALUE: the code)", "default": 79, "kernel": "xid"},
    "kernel-log-unreadable": {"help": "dmesg not permitted, journalctl shows no kernel messages", "kernel": "unreadable"},
    "disk-full": {"help": "the host's disk is full (its df: no block free)", "disk": "full"},
    "inodes-full": {"help": "the host's disk has no inode left (its df -i)", "disk": "inodes"},
    "disk-low": {"help": "the host's disk is VALUE % used (its df)", "default": 97, "disk": "low"},
    "slow-smi": {"help": "every nvidia-smi call takes VALUE ms longer (eight GPUs with persistence off: seconds)",
                 "default": 300, "latency_ms": "{value}"},
}

FAILURES = {
    "driver-not-loaded": (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                             "Make sure that the latest NVIDIA driver is installed and running.\n"),
    "version-mismatch": (18, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.172\n"),
    "no-devices": (6, "No devices were found\n"),
    "gpu-lost": (15, "Unable to determine the device handle for GPU0000:08:00.0: GPU is lost.  "
                     "Reboot the system to recover this GPU\n"),
}

GPU_FIELDS = [
    "timestamp", "count", "index", "name", "uuid", "serial", "pci.bus_id", "driver_version", "compute_cap",
    "memory.total", "memory.used", "memory.free", "memory.reserved", "utilization.gpu", "utilization.memory",
    "temperature.gpu", "temperature.memory", "power.draw", "power.limit", "power.max_limit", "fan.speed",
    "pstate", "clocks.sm", "clocks.max.sm", "persistence_mode", "ecc.errors.uncorrected.volatile.total",
    "vbios_version", "name", "gpu_name", "gpu_uuid", "gpu_bus_id",
    # health fields, as the real H100 SXM5 / H200 answer them (../shared/reference/*/health-fields.txt)
    "ecc.errors.uncorrected.aggregate.total", "ecc.errors.corrected.volatile.total", "remapped_rows.pending",
    "remapped_rows.failure", "remapped_rows.uncorrectable", "retired_pages.pending", "clocks_event_reasons.active",
    "clocks_event_reasons.gpu_idle", "clocks_event_reasons.hw_slowdown", "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.hw_power_brake_slowdown", "clocks_event_reasons.sw_thermal_slowdown",
    "clocks_event_reasons.sw_power_cap", "clocks_event_reasons.applications_clocks_setting",
    "clocks_event_reasons.sync_boost", "pcie.link.gen.gpucurrent", "pcie.link.gen.max", "pcie.link.width.current",
    "pcie.link.width.max", "mig.mode.current", "gpu_recovery_action", "fabric.state", "fabric.status", "compute_mode",
]
UNITS = {"memory.total": " MiB", "memory.used": " MiB", "memory.free": " MiB", "memory.reserved": " MiB",
         "utilization.gpu": " %", "utilization.memory": " %", "power.draw": " W", "power.limit": " W",
         "power.max_limit": " W", "fan.speed": " %", "clocks.sm": " MHz", "clocks.max.sm": " MHz"}
HEADERS = {"memory.total": "memory.total [MiB]", "memory.used": "memory.used [MiB]", "memory.free": "memory.free [MiB]",
           "utilization.gpu": "utilization.gpu [%]", "utilization.memory": "utilization.memory [%]",
           "power.draw": "power.draw [W]", "power.limit": "power.limit [W]", "fan.speed": "fan.speed [%]",
           "power.max_limit": "power.max_limit [W]", "clocks.sm": "clocks.current.sm [MHz]",
           "clocks.max.sm": "clocks.max.sm [MHz]", "memory.reserved": "memory.reserved [MiB]"}
APP_FIELDS = ["pid", "process_name", "used_memory", "used_gpu_memory", "gpu_uuid", "gpu_bus_id", "gpu_name"]


def load_state():
    d = os.environ.get("GPUOPS_SANDBOX_DIR")
    state = {"gpu": "h100-pcie", "count": 1, "driver": "570.148.08", "cuda": "12.8", "fail": None,
             "header": "legacy", "na_fields": [], "unsupported_fields": [], "faults": []}
    if d:
        try:
            with open(os.path.join(d, "gpu.json")) as fh:
                state.update(json.load(fh))
        except (OSError, ValueError):
            pass
    return state


SHELLS = ("bash", "sh", "dash", "nohup", "setsid", "tail", "timeout", "env", "slurm_script", "srun", "slurmstepd")


def parse_hold(text):
    """GPUOPS_SANDBOX_HOLD's value 'GPU:MiB[,GPU:MiB...]' -> [(gpu, mib)] (malformed items are ignored)."""
    out = []
    for item in text.split(","):
        gpu, _, mib = item.strip().partition(":")
        if gpu.isdigit() and mib.isdigit():
            out.append((int(gpu), int(mib)))
    return out


def read_procs():
    """{pid: (ppid, comm, environ entries)} of every process this user may read."""
    table = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as fh:
                env = fh.read().split(b"\0")
            with open("/proc/%s/stat" % pid, "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # /proc/PID/stat: "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ")"
        head, _, rest = stat.rpartition(b")")
        comm = head.split(b"(", 1)[1].decode("utf-8", "replace")
        fields = rest.split()
        table[int(pid)] = (int(fields[1]) if len(fields) > 1 else 0, comm, env)
    return table


def job_env(table, pid):
    """The environment that makes pid part of a gpuops job: its own when it names GPUOPS_RUN_ID, else its nearest
    ancestor's that does (a job's descendants are the job even when one cleared its environment: `env -i python`,
    a script that starts its trainer under sudo or a clean shell); None when no ancestor is a job."""
    seen = set()
    while pid in table and pid not in seen:
        seen.add(pid)
        ppid, _, env = table[pid]
        if any(e.startswith(b"GPUOPS_RUN_ID=") for e in env):
            return env
        pid = ppid
    return None


def gpu_processes():
    """Processes of this host on the emulated GPUs: gpuops jobs and their descendants (GPUOPS_RUN_ID in their
    environment or an ancestor's; "mem" None: the GPU's busy share) and processes holding memory
    (GPUOPS_SANDBOX_HOLD; "mem": their MiB)."""
    procs = []
    here = os.environ.get("GPUOPS_SANDBOX_DIR")
    mine = ("GPUOPS_SANDBOX_DIR=" + here).encode() if here else None
    table = read_procs()
    for pid in sorted(table):
        _, comm, env = table[pid]
        if comm in SHELLS:
            continue  # a shell around the real process
        hold = [e.split(b"=", 1)[1].decode("utf-8", "replace") for e in env if e.startswith(b"GPUOPS_SANDBOX_HOLD=")]
        if hold:
            if mine and mine not in env:
                continue  # a process of another sandbox host on this machine
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as fh:
                    name = fh.read().split(b"\0")[0].decode("utf-8", "replace") or comm
            except OSError:
                name = comm
            procs += [{"pid": pid, "name": name, "gpu": gpu, "mem": mib} for gpu, mib in parse_hold(hold[0])]
            continue
        jenv = job_env(table, pid)
        if jenv is None or comm == "sleep" or (mine and mine not in jenv):
            continue  # not a gpuops job of this host (or a job's sleep, not its GPU process)
        vis = [e.split(b"=", 1)[1].decode() for e in env + jenv if e.startswith(b"CUDA_VISIBLE_DEVICES=")]
        gpu = int(vis[0].split(",")[0]) if vis and vis[0].split(",")[0].isdigit() else 0
        procs.append({"pid": pid, "name": comm, "gpu": gpu, "mem": None})
    return procs


def gpus(state, procs):
    spec = CATALOG.get(state["gpu"], CATALOG["h100-pcie"])
    out = []
    for i in range(int(state["count"])):
        mine = [p for p in procs if p["gpu"] == i]
        busy = any(p["mem"] is None for p in mine)  # a gpuops job computes; a holder only holds memory
        wobble = int(time.time()) % 7
        share = (spec["memory"] * 6 // 10 + 13 * wobble) if busy else 0  # the gpuops jobs' memory
        held = sum(p["mem"] for p in mine if p["mem"] is not None)
        used = min(spec["memory"], share + held) if mine else 1
        mine = [dict(p, mem=share if p["mem"] is None else p["mem"]) for p in mine]
        bus = spec["bus"][:-7] + "%02X" % (int(spec["bus"][-7:-5], 16) + i) + spec["bus"][-5:]
        out.append({
            "index": i, "name": spec["name"], "uuid": "GPU-e3e3e3e3-%04d-4000-8000-%012d" % (i, i),
            "serial": "EMULATED%05d" % i, "pci.bus_id": bus, "driver_version": state["driver"],
            "compute_cap": spec["cc"], "memory.total": spec["memory"], "memory.used": used,
            "memory.free": spec["memory"] - used, "memory.reserved": 0,
            "utilization.gpu": (93 + wobble) if busy else 0, "utilization.memory": (41 + wobble) if busy else 0,
            "temperature.gpu": (61 + wobble) if busy else 31 + i, "temperature.memory": "N/A",
            "power.draw": round(spec["power_limit"] * (0.82 if busy else 0.14) + wobble, 2),
            "power.limit": spec["power_limit"], "power.max_limit": spec["power_limit"], "fan.speed": "[N/A]",
            "pstate": "P0", "clocks.sm": 1755 if busy else 345, "clocks.max.sm": 1755, "persistence_mode": "Enabled",
            "ecc.errors.uncorrected.volatile.total": 0, "vbios_version": "96.00.99.00.01",
            "procs": mine,
        })
        out[-1].update(health_fields(spec, busy))
        if busy:
            out[-1]["clocks.sm"] = spec.get("max_sm", 1755)
    apply_faults(out, state)
    return out


def health_fields(spec, busy):
    """A healthy GPU's health fields, in the forms the real H100 SXM5 printed (idle: clocks event reason gpu_idle)."""
    gen = spec.get("pcie_gen", 5)
    d = {"ecc.errors.uncorrected.aggregate.total": 0, "ecc.errors.corrected.volatile.total": 0,
         "remapped_rows.pending": "No", "remapped_rows.failure": "No", "remapped_rows.uncorrectable": 0,
         "retired_pages.pending": "[N/A]",
         "clocks_event_reasons.active": "0x0000000000000000" if busy else "0x0000000000000001",
         "clocks_event_reasons.gpu_idle": "Not Active" if busy else "Active",
         "pcie.link.gen.gpucurrent": gen, "pcie.link.gen.max": gen, "pcie.link.width.current": 16,
         "pcie.link.width.max": 16, "mig.mode.current": "[N/A]" if spec.get("no_mig") else "Disabled",
         "gpu_recovery_action": "None", "fabric.state": "N/A", "fabric.status": "N/A", "compute_mode": "Default",
         "clocks.max.sm": spec.get("max_sm", 1755)}
    for r in ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown", "sw_power_cap",
              "applications_clocks_setting", "sync_boost"):
        d["clocks_event_reasons." + r] = "Not Active"
    return d


def parse_fault(text):
    """'xid=48@1' -> ('xid', '48', 1)."""
    text, _, gpu = text.partition("@")
    name, _, value = text.partition("=")
    return name, value or None, int(gpu) if gpu.isdigit() else 0


def fault_problem(text, count):
    """Why `--fault TEXT` cannot be injected on a host of `count` GPUs, or None."""
    name, value, idx = parse_fault(text)
    if name not in FAULTS:
        return "unknown --fault %r; choose from: %s" % (name, ", ".join(FAULTS))
    if idx >= max(count, 1) or ("@" in text and not text.rsplit("@", 1)[1].isdigit()):
        return "--fault %r: the GPU index must be below --gpus (%d)" % (text, count)
    default = FAULTS[name].get("default")
    if value is not None and default is None:
        return "--fault %s takes no value" % name
    if value is not None and isinstance(default, int) and not value.isdigit():
        return "--fault %s=%s: the value must be a whole number" % (name, value)
    return None


def apply_faults(glist, state):
    for text in state.get("faults") or []:
        name, value, idx = parse_fault(text)
        fault = FAULTS.get(name)
        if not fault or idx >= len(glist):
            continue
        val = value if value is not None else fault.get("default")
        for field, v in (fault.get("fields") or {}).items():
            v = val if v == "{value}" else v
            glist[idx][field] = int(v) if isinstance(v, str) and v.isdigit() else v


def latency(state):
    """Seconds every call waits before answering (the slow-smi fault): what a slow driver costs each nvidia-smi."""
    total = 0.0
    for text in state.get("faults") or []:
        name, value, _ = parse_fault(text)
        ms = (FAULTS.get(name) or {}).get("latency_ms")
        if ms:
            total += float(value if ms == "{value}" and value is not None else FAULTS[name]["default"]) / 1000.0
    return total


def field_known(field, state):
    """Whether this emulated driver knows the field (older drivers fail the whole query on an unknown one)."""
    base = field
    for old, new in OLD_NAMES.items():
        if field.startswith(old):
            base = new + field[len(old):]
    if base not in GPU_FIELDS or field in state.get("unknown_fields", []):
        return False
    try:
        major = int(str(state.get("driver", "0")).split(".")[0])
    except ValueError:
        return True
    return not any(field.startswith(prefix) and major < since for prefix, since in FIELD_SINCE.items())


def field_value(g, field):
    for old, new in OLD_NAMES.items():
        if field.startswith(old):
            field = new + field[len(old):]
    return g[{"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}.get(field, field)]


def fmt_value(field, value, nounits, state):
    if field in state.get("unsupported_fields", []):
        return "[Not Supported]"
    if field in state.get("na_fields", []):
        return "[N/A]"
    if isinstance(value, float):
        value = "%.2f" % value
    value = str(value)
    if not nounits and field in UNITS and not value.startswith("["):
        value += UNITS[field]
    return value


def query_gpu(fields, fmt, state):
    for f in fields:
        if not field_known(f, state):
            sys.stdout.write('Field "%s" is not a valid field to query.\n\n' % f)
            return 2
    nounits = "nounits" in fmt
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join(HEADERS.get(f, f) for f in fields))
    glist = gpus(state, gpu_processes())
    for g in glist:
        row = []
        for f in fields:
            if f == "timestamp":
                row.append(time.strftime("%Y/%m/%d %H:%M:%S.000"))
            elif f == "count":
                row.append(str(len(glist)))
            else:
                row.append(fmt_value(f, field_value(g, f), nounits, state))
        lines.append(", ".join(row))
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def query_apps(fields, fmt, state):
    for f in fields:
        if f not in APP_FIELDS:
            sys.stdout.write('Field "%s" is not a valid field to query.\n\n' % f)
            return 2
    nounits = "nounits" in fmt
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join("used_gpu_memory [MiB]" if f in ("used_memory", "used_gpu_memory") else f for f in fields))
    for g in gpus(state, gpu_processes()):
        for p in g["procs"]:
            vals = {"pid": p["pid"], "process_name": p["name"], "used_memory": p["mem"],
                    "used_gpu_memory": p["mem"], "gpu_uuid": g["uuid"], "gpu_bus_id": g["pci.bus_id"],
                    "gpu_name": g["name"]}
            row = []
            for f in fields:
                v = str(vals[f])
                if f in ("used_memory", "used_gpu_memory") and not nounits:
                    v += " MiB"
                row.append(v)
            lines.append(", ".join(row))
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    return 0


def table(state):
    """The summary table, laid out as driver 580 prints it (../shared/reference/nvidia-smi-h100-sxm5/nvidia-smi.txt),
    plus one line that says the GPUs are emulated."""
    glist = gpus(state, gpu_processes())
    w = 91
    sep = "+-----------------------------------------+------------------------+----------------------+"
    out = [time.strftime("%a %b %d %H:%M:%S %Y") + "       ", "+" + "-" * (w - 2) + "+"]
    if state.get("header") == "kmd":
        head = " NVIDIA-SMI %-22s KMD Version: %-14s CUDA UMD Version: %s" % (state["driver"], state["driver"], state["cuda"])
    else:
        head = " NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %s" % (state["driver"], state["driver"], state["cuda"])
    out.append("|" + head.ljust(w - 2) + "|")
    out.append("| gpuops sandbox: these GPUs are EMULATED (no real GPU on this host)".ljust(w - 1) + "|")
    out.append(sep)
    out.append("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |")
    out.append("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |")
    out.append("|                                         |                        |               MIG M. |")
    out.append("|=========================================+========================+======================|")
    for g in glist:
        pm = "On" if g["persistence_mode"] == "Enabled" else "Off"
        mig = "N/A" if str(g["mig.mode.current"]).startswith("[") else g["mig.mode.current"]
        out.append("|%4d  %-30s%3s  |%19s Off | %20s |" % (g["index"], g["name"][:30], pm, g["pci.bus_id"],
                                                          g["ecc.errors.uncorrected.volatile.total"]))
        out.append("| N/A   %2dC    %s%24s |%8sMiB / %6sMiB |%7d%%      Default |" % (
            g["temperature.gpu"], g["pstate"], "%dW / %5s" % (g["power.draw"], "%dW" % g["power.limit"]),
            g["memory.used"], g["memory.total"], g["utilization.gpu"]))
        out.append("|                                         |                        | %20s |" % mig)
        out.append(sep)
    out.append("")
    out.append("+" + "-" * (w - 2) + "+")
    out.append("| Processes:".ljust(w - 1) + "|")
    out.append("|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |")
    out.append("|        ID   ID                                                               Usage      |")
    out.append("|" + "=" * (w - 2) + "|")
    procs = [(g, p) for g in glist for p in g["procs"]]
    if not procs:
        out.append("|  No running processes found".ljust(w - 1) + "|")
    for g, p in procs:
        out.append("|  %3d   N/A  N/A  %15d      C   %-32s %8sMiB |" % (g["index"], p["pid"], p["name"][:32], p["mem"]))
    out.append("+" + "-" * (w - 2) + "+")
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def main(argv):
    state = load_state()
    if latency(state):
        time.sleep(latency(state))
    fail = state.get("fail")
    if fail == "hang":
        time.sleep(3600)
    if fail in FAILURES:
        code, msg = FAILURES[fail]
        sys.stdout.write(msg)
        return code
    if "--version" in argv:
        sys.stdout.write("NVIDIA-SMI version  : %s\nNVML version        : %s\nDRIVER version      : %s\nCUDA Version        : %s\n"
                         % (state["driver"], state["driver"].rsplit(".", 1)[0], state["driver"], state["cuda"]))
        return 0
    if "-L" in argv or "--list-gpus" in argv:
        for g in gpus(state, []):
            sys.stdout.write("GPU %d: %s (UUID: %s) [emulated by gpuops sandbox]\n" % (g["index"], g["name"], g["uuid"]))
        return 0
    opts = {}
    loop = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            opts[k] = v
        elif a in ("-l", "--loop", "-lms", "--loop-ms") and i + 1 < len(argv):
            loop = float(argv[i + 1]) / (1000.0 if "ms" in a else 1.0)
            i += 1
        elif a.startswith("--loop="):
            loop = float(a.split("=", 1)[1])
        else:
            sys.stdout.write("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n")
            return 2
        i += 1
    if not opts:
        return table(state)
    fmt = [x.strip() for x in opts.get("--format", "").split(",") if x.strip()]
    if "csv" not in fmt:
        sys.stdout.write("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n")
        return 2
    if "--query-gpu" in opts:
        fields = [f.strip() for f in opts["--query-gpu"].split(",") if f.strip()]
        fn = query_gpu
    elif "--query-compute-apps" in opts:
        fields = [f.strip() for f in opts["--query-compute-apps"].split(",") if f.strip()]
        fn = query_apps
    else:
        sys.stdout.write("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n")
        return 2
    while True:
        rc = fn(fields, fmt, state)
        sys.stdout.flush()
        if loop is None or rc != 0:
            return rc
        time.sleep(loop)
        state = load_state()


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (KeyboardInterrupt, BrokenPipeError):
        sys.exit(0)
